//! Incremental validation of JSONL datasets: each non-blank line is an object with `messages`
//! (a list of `{role, content}`) or `prompt` (a string). Fed chunk by chunk while uploading.

use serde::Serialize;
use serde_json::Value;

/// Longest line kept in memory for validation.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// The first problem found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// The field at fault (`""` for the whole line).
    pub field: String,
    /// Why.
    pub reason: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "line {}: {}", self.line, self.reason)
        } else {
            write!(f, "line {}: field `{}`: {}", self.line, self.field, self.reason)
        }
    }
}

/// Validates a stream of bytes line by line.
#[derive(Debug, Default)]
pub struct JsonlValidator {
    partial: Vec<u8>,
    line: u64,
    records: u64,
    error: Option<LineError>,
    overlong: bool,
}

impl JsonlValidator {
    /// Consumes the next chunk.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while let Some(pos) = chunk.iter().position(|&b| b == b'\n') {
            self.push(&chunk[..pos]);
            self.end_line();
            chunk = &chunk[pos + 1..];
        }
        self.push(chunk);
    }

    /// Ends the stream; the number of records, or the first error.
    pub fn finish(mut self) -> Result<u64, LineError> {
        if !self.partial.is_empty() || self.overlong {
            self.end_line();
        }
        if let Some(error) = self.error {
            return Err(error);
        }
        if self.records == 0 {
            return Err(LineError {
                line: 0,
                field: String::new(),
                reason: "the file holds no records".into(),
            });
        }
        Ok(self.records)
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.error.is_some() || self.overlong {
            return;
        }
        if self.partial.len() + bytes.len() > MAX_LINE_BYTES {
            self.overlong = true;
            self.partial.clear();
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    fn end_line(&mut self) {
        self.line += 1;
        let line = std::mem::take(&mut self.partial);
        let overlong = std::mem::replace(&mut self.overlong, false);
        if self.error.is_some() {
            return;
        }
        if overlong {
            self.fail("", format!("line longer than {MAX_LINE_BYTES} bytes"));
            return;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match check_record(&line) {
            Ok(()) => self.records += 1,
            Err((field, reason)) => self.fail(&field, reason),
        }
    }

    fn fail(&mut self, field: &str, reason: String) {
        self.error = Some(LineError { line: self.line, field: field.to_string(), reason });
    }
}

/// Checks one record; on failure, the field and the reason.
pub fn check_record(line: &[u8]) -> Result<(), (String, String)> {
    let value: Value =
        serde_json::from_slice(line).map_err(|e| (String::new(), format!("invalid JSON: {e}")))?;
    let Value::Object(record) = value else {
        return Err((String::new(), "each line must be a JSON object".into()));
    };
    match (record.get("messages"), record.get("prompt")) {
        (None, None) => Err((
            "messages".into(),
            "each record needs `messages` (a chat list) or `prompt` (a string)".into(),
        )),
        (Some(messages), _) => check_messages(messages),
        (None, Some(Value::String(_))) => Ok(()),
        (None, Some(_)) => Err(("prompt".into(), "must be a string".into())),
    }
}

fn check_messages(messages: &Value) -> Result<(), (String, String)> {
    let Value::Array(list) = messages else {
        return Err(("messages".into(), "must be a list of {role, content} objects".into()));
    };
    if list.is_empty() {
        return Err(("messages".into(), "must not be empty".into()));
    }
    for (i, message) in list.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err((
                format!("messages[{i}]"),
                "must be an object with role and content".into(),
            ));
        };
        match message.get("role") {
            Some(Value::String(role))
                if matches!(
                    role.as_str(),
                    "system" | "developer" | "user" | "assistant" | "tool"
                ) => {}
            Some(Value::String(role)) => {
                return Err((
                    format!("messages[{i}].role"),
                    format!("unknown role {role:?} (system, developer, user, assistant or tool)"),
                ))
            }
            Some(_) => return Err((format!("messages[{i}].role"), "must be a string".into())),
            None => return Err((format!("messages[{i}].role"), "missing".into())),
        }
        match message.get("content") {
            Some(Value::String(_)) | Some(Value::Array(_)) => {}
            Some(_) => {
                return Err((
                    format!("messages[{i}].content"),
                    "must be a string or a list of content parts".into(),
                ))
            }
            None => return Err((format!("messages[{i}].content"), "missing".into())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(text: &str, chunk: usize) -> Result<u64, LineError> {
        let mut v = JsonlValidator::default();
        for piece in text.as_bytes().chunks(chunk.max(1)) {
            v.feed(piece);
        }
        v.finish()
    }

    #[test]
    fn accepts_messages_and_prompts_in_any_chunking() {
        let text = "{\"prompt\":\"2+2?\",\"reference_answer\":\"4\"}\n\n{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
        for chunk in [1, 3, 7, 1000] {
            assert_eq!(validate(text, chunk), Ok(2));
        }
    }

    #[test]
    fn reports_line_field_and_reason() {
        let err =
            validate("{\"prompt\":\"a\"}\n{\"messages\":[{\"role\":\"user\"}]}\n", 5).unwrap_err();
        assert_eq!((err.line, err.field.as_str()), (2, "messages[0].content"));
        assert_eq!(validate("{\"prompt\":1}", 4).unwrap_err().field, "prompt");
        assert_eq!(validate("[1]", 4).unwrap_err().reason, "each line must be a JSON object");
        assert!(validate("not json\n", 2).unwrap_err().reason.starts_with("invalid JSON"));
        assert_eq!(validate("{\"x\":1}", 2).unwrap_err().field, "messages");
        assert_eq!(validate("\n \n", 2).unwrap_err().line, 0);
        let bad_role =
            validate("{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 9).unwrap_err();
        assert_eq!(bad_role.field, "messages[0].role");
    }
}
