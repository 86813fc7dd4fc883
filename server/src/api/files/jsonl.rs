//! Incremental validation of JSONL datasets: each non-blank line is an object with `messages`
//! (a list of `{role, content}`) or `prompt` (a non-empty string), the prompt the worker renders;
//! when a job names the file, also the `item` fields its grader reads. Fed chunk by chunk, while
//! uploading and when a job is created.

use serde::Serialize;
use serde_json::Value;
use verity_verifiers::template::item_has_path;

/// Longest line kept in memory for validation.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Most problems collected before a validator stops checking rows.
pub const MAX_LINE_ERRORS: usize = 5;

/// One problem, located by its line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// The field at fault, a JSON path inside the line (`""` for the whole line).
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
#[derive(Debug)]
pub struct JsonlValidator {
    partial: Vec<u8>,
    line: u64,
    records: u64,
    errors: Vec<LineError>,
    max_errors: usize,
    overlong: bool,
    required: Vec<Vec<String>>,
}

impl Default for JsonlValidator {
    /// The upload check: a prompt on every line, stopping at the first problem.
    fn default() -> Self {
        Self {
            partial: Vec::new(),
            line: 0,
            records: 0,
            errors: Vec::new(),
            max_errors: 1,
            overlong: false,
            required: Vec::new(),
        }
    }
}

impl JsonlValidator {
    /// The job check: a prompt and every `item` path of `required` (the fields a grader reads,
    /// see `Grader::item_fields`) on every line, collecting up to [`MAX_LINE_ERRORS`] problems.
    pub fn requiring(required: Vec<Vec<String>>) -> Self {
        Self { required, max_errors: MAX_LINE_ERRORS, ..Self::default() }
    }

    /// Whether the validator has all the problems it collects (feeding more is wasted work).
    pub fn is_full(&self) -> bool {
        self.errors.len() >= self.max_errors
    }

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
    pub fn finish(self) -> Result<u64, LineError> {
        self.finish_all().map_err(|mut errors| errors.swap_remove(0))
    }

    /// Ends the stream; the number of records, or the problems found (at least one, in line
    /// order, at most the validator's limit).
    pub fn finish_all(mut self) -> Result<u64, Vec<LineError>> {
        if !self.partial.is_empty() || self.overlong {
            self.end_line();
        }
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        if self.records == 0 {
            return Err(vec![LineError {
                line: 0,
                field: String::new(),
                reason: "the file holds no records".into(),
            }]);
        }
        Ok(self.records)
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.is_full() || self.overlong {
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
        if self.is_full() {
            return;
        }
        if overlong {
            self.fail("", format!("line longer than {MAX_LINE_BYTES} bytes"));
            return;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match check_record(&line, &self.required) {
            Ok(()) => self.records += 1,
            Err((field, reason)) => self.fail(&field, reason),
        }
    }

    fn fail(&mut self, field: &str, reason: String) {
        self.errors.push(LineError { line: self.line, field: field.to_string(), reason });
    }
}

/// Checks one record: its prompt, then each `item` path of `required`; on failure, the field
/// (a JSON path inside the record) and the reason.
pub fn check_record(line: &[u8], required: &[Vec<String>]) -> Result<(), (String, String)> {
    let value: Value =
        serde_json::from_slice(line).map_err(|e| (String::new(), format!("invalid JSON: {e}")))?;
    let Value::Object(record) = &value else {
        return Err((String::new(), "each line must be a JSON object".into()));
    };
    match (record.get("messages"), record.get("prompt")) {
        (None, None) => {
            return Err((
                "messages".into(),
                "each record needs `messages` (a chat list) or `prompt` (a string)".into(),
            ))
        }
        (Some(messages), _) => check_messages(messages)?,
        (None, Some(Value::String(prompt))) if !prompt.is_empty() => {}
        (None, Some(_)) => return Err(("prompt".into(), "must be a non-empty string".into())),
    }
    for path in required {
        if !item_has_path(&value, path) {
            let field = path.join(".");
            return Err((
                field.clone(),
                format!("missing or null; the grader reads {{{{item.{field}}}}}"),
            ));
        }
    }
    Ok(())
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
            Some(Value::String(_)) => {}
            Some(_) => return Err((format!("messages[{i}].content"), "must be a string".into())),
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

    fn required(text: &str, paths: &[&str], chunk: usize) -> Result<u64, Vec<LineError>> {
        let paths = paths.iter().map(|p| p.split('.').map(str::to_string).collect()).collect();
        let mut v = JsonlValidator::requiring(paths);
        for piece in text.as_bytes().chunks(chunk.max(1)) {
            v.feed(piece);
        }
        v.finish_all()
    }

    #[test]
    fn requires_the_fields_a_grader_reads() {
        let good = "{\"prompt\":\"a\",\"reference_answer\":\"4\",\"meta\":{\"tests\":[\"t\"]}}\n";
        assert_eq!(required(good, &["reference_answer", "meta.tests.0"], 7), Ok(1));
        let text = "{\"prompt\":\"a\",\"reference_answer\":\"4\"}\n\n{\"prompt\":\"b\"}\n{\"prompt\":\"c\",\"reference_answer\":null}\n";
        let errors = required(text, &["reference_answer"], 4).unwrap_err();
        let lines: Vec<(u64, &str)> = errors.iter().map(|e| (e.line, e.field.as_str())).collect();
        assert_eq!(lines, vec![(3, "reference_answer"), (4, "reference_answer")]);
        assert!(errors[0].reason.contains("{{item.reference_answer}}"), "{}", errors[0].reason);
        let nested = required("{\"prompt\":\"a\",\"meta\":{}}", &["meta.tests"], 3).unwrap_err();
        assert_eq!(nested[0].field, "meta.tests");
        // the prompt is checked first, and an empty prompt is refused as the worker refuses it
        let empty = required("{\"prompt\":\"\"}", &["reference_answer"], 3).unwrap_err();
        assert_eq!(empty[0].field, "prompt");
    }

    #[test]
    fn stops_after_the_first_few_problems() {
        let text = "{\"prompt\":\"a\"}\n".repeat(100);
        let errors = required(&text, &["x"], 64).unwrap_err();
        assert_eq!(errors.len(), MAX_LINE_ERRORS);
        assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        // the upload check stops at the first
        assert_eq!(validate("[1]\n[2]\n", 1).unwrap_err().line, 1);
    }
}
