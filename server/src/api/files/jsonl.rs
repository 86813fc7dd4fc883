//! Incremental validation of JSONL datasets: each non-blank line is an object with `messages`
//! (a list of `{role, content}`) or `prompt` (a non-empty string), the prompt the worker renders,
//! or a DPO preference row (`input.messages`, `preferred_output`, `non_preferred_output`); when a
//! job names the file, the rows its method needs ([`RowFormat`]) and the `item` fields its grader
//! reads. Fed chunk by chunk, while uploading and when a job is created.

use serde::Serialize;
use serde_json::{Map, Value};
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

/// The rows a file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowFormat {
    /// Any row some method can train on (the upload check): a prompt row or a preference row.
    #[default]
    Any,
    /// A prompt to sample from (`messages` or `prompt`): reinforcement jobs.
    Prompt,
    /// A chat with at least one assistant message of weight 1: supervised jobs.
    Supervised,
    /// A preference pair: DPO jobs.
    Preference,
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
    format: RowFormat,
    /// The grader reading `sample.output_tools`, when one does (rows must offer `tools`).
    tools_reader: Option<String>,
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
            format: RowFormat::Any,
            tools_reader: None,
        }
    }
}

impl JsonlValidator {
    /// The job check: a prompt and every `item` path of `required` (the fields a grader reads,
    /// see `Grader::item_fields`) on every line, collecting up to [`MAX_LINE_ERRORS`] problems.
    pub fn requiring(required: Vec<Vec<String>>) -> Self {
        Self { required, max_errors: MAX_LINE_ERRORS, format: RowFormat::Prompt, ..Self::default() }
    }

    /// Also requires a non-empty `tools` list on every row, because grader `reader` (when set)
    /// reads `sample.output_tools`.
    pub fn with_tools_for(mut self, reader: Option<String>) -> Self {
        self.tools_reader = reader;
        self
    }

    /// The job check of a supervised or DPO file: rows of `format` on every line, collecting up
    /// to [`MAX_LINE_ERRORS`] problems.
    pub fn for_format(format: RowFormat) -> Self {
        Self { format, max_errors: MAX_LINE_ERRORS, ..Self::default() }
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
        let checked = check_record(&line, &self.required, self.format)
            .and_then(|()| check_tools_offered(&line, self.tools_reader.as_deref()));
        match checked {
            Ok(()) => self.records += 1,
            Err((field, reason)) => self.fail(&field, reason),
        }
    }

    fn fail(&mut self, field: &str, reason: String) {
        self.errors.push(LineError { line: self.line, field: field.to_string(), reason });
    }
}

/// Checks one record as `format` says: its prompt, chat or preference pair, then each `item`
/// path of `required`; on failure, the field (a JSON path inside the record) and the reason.
pub fn check_record(
    line: &[u8],
    required: &[Vec<String>],
    format: RowFormat,
) -> Result<(), (String, String)> {
    let value: Value =
        serde_json::from_slice(line).map_err(|e| (String::new(), format!("invalid JSON: {e}")))?;
    let Value::Object(record) = &value else {
        return Err((String::new(), "each line must be a JSON object".into()));
    };
    match format {
        RowFormat::Preference => return check_preference(record),
        RowFormat::Any if is_preference(record) => return check_preference(record),
        RowFormat::Supervised => return check_supervised(record),
        RowFormat::Any | RowFormat::Prompt => {}
    }
    match (record.get("messages"), record.get("prompt")) {
        (None, None) => {
            return Err((
                "messages".into(),
                "each record needs `messages` (a chat list) or `prompt` (a string)".into(),
            ))
        }
        (Some(messages), _) => check_messages("messages", messages)?,
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

/// When grader `reader` reads `sample.output_tools`, the row must offer a non-empty `tools`
/// list (single-turn completions call tools only when their row offers some).
fn check_tools_offered(line: &[u8], reader: Option<&str>) -> Result<(), (String, String)> {
    let Some(reader) = reader else { return Ok(()) };
    let value: Value =
        serde_json::from_slice(line).map_err(|e| (String::new(), format!("invalid JSON: {e}")))?;
    match value.get("tools") {
        Some(Value::Array(tools)) if !tools.is_empty() => Ok(()),
        _ => Err((
            "tools".into(),
            format!(
                "missing or empty; grader {reader:?} reads sample.output_tools, the tool calls of \
                 a completion, and only rows with `tools` offer the model functions to call"
            ),
        )),
    }
}

/// Whether a row is meant as a preference pair: it has an output, or an `input` and no prompt
/// (a prompt row may carry an `input` field for its grader).
fn is_preference(record: &Map<String, Value>) -> bool {
    record.contains_key("preferred_output")
        || record.contains_key("non_preferred_output")
        || (record.contains_key("input")
            && !record.contains_key("messages")
            && !record.contains_key("prompt"))
}

/// A supervised row: a chat (`messages`, optional `tools`) with an assistant message to train on.
fn check_supervised(record: &Map<String, Value>) -> Result<(), (String, String)> {
    let Some(messages) = record.get("messages") else {
        return Err((
            "messages".into(),
            "missing; a supervised row is a chat: {\"messages\": [{role, content}, …]}".into(),
        ));
    };
    check_messages("messages", messages)?;
    check_tools(record, "tools")?;
    let list = messages.as_array().map(Vec::as_slice).unwrap_or_default();
    let assistants: Vec<&Value> = list
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .collect();
    if assistants.is_empty() {
        return Err((
            "messages".into(),
            "no assistant message; supervised training learns the assistant's replies".into(),
        ));
    }
    if assistants.iter().all(|m| m.get("weight").and_then(Value::as_f64) == Some(0.0)) {
        return Err(("messages".into(), "every assistant message has weight 0".into()));
    }
    Ok(())
}

/// A DPO row: `input` (`messages`, optional `tools`), `preferred_output` and
/// `non_preferred_output` (non-empty lists of assistant messages).
fn check_preference(record: &Map<String, Value>) -> Result<(), (String, String)> {
    let Some(Value::Object(input)) = record.get("input") else {
        return Err((
            "input".into(),
            "missing or not an object; a DPO row is {\"input\": {\"messages\": […]}, \
             \"preferred_output\": […], \"non_preferred_output\": […]}"
                .into(),
        ));
    };
    let messages = input
        .get("messages")
        .ok_or_else(|| ("input.messages".to_string(), "missing".to_string()))?;
    check_messages("input.messages", messages)?;
    check_tools(input, "input.tools")?;
    for field in ["preferred_output", "non_preferred_output"] {
        let output = record.get(field).ok_or_else(|| {
            (
                field.to_string(),
                "missing; a DPO row needs both outputs (lists of assistant messages)".to_string(),
            )
        })?;
        check_messages(field, output)?;
        let list = output.as_array().map(Vec::as_slice).unwrap_or_default();
        if let Some(i) =
            list.iter().position(|m| m.get("role").and_then(Value::as_str) != Some("assistant"))
        {
            return Err((format!("{field}[{i}].role"), "must be \"assistant\"".into()));
        }
    }
    Ok(())
}

/// `tools`, when present, is a list.
fn check_tools(record: &Map<String, Value>, field: &str) -> Result<(), (String, String)> {
    match record.get(field.rsplit('.').next().unwrap_or(field)) {
        None | Some(Value::Null) | Some(Value::Array(_)) => Ok(()),
        Some(_) => Err((field.into(), "must be a list of tool definitions".into())),
    }
}

/// A chat at `field`: a non-empty list of `{role, content}` objects; an assistant message may
/// have a `weight` of 0 or 1 and, when it calls tools (`tool_calls`), no content.
fn check_messages(field: &str, messages: &Value) -> Result<(), (String, String)> {
    let Value::Array(list) = messages else {
        return Err((field.into(), "must be a list of {role, content} objects".into()));
    };
    if list.is_empty() {
        return Err((field.into(), "must not be empty".into()));
    }
    for (i, message) in list.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err((
                format!("{field}[{i}]"),
                "must be an object with role and content".into(),
            ));
        };
        let role = match message.get("role") {
            Some(Value::String(role))
                if matches!(
                    role.as_str(),
                    "system" | "developer" | "user" | "assistant" | "tool"
                ) =>
            {
                role.as_str()
            }
            Some(Value::String(role)) => {
                return Err((
                    format!("{field}[{i}].role"),
                    format!("unknown role {role:?} (system, developer, user, assistant or tool)"),
                ))
            }
            Some(_) => return Err((format!("{field}[{i}].role"), "must be a string".into())),
            None => return Err((format!("{field}[{i}].role"), "missing".into())),
        };
        let calls_tools = role == "assistant" && message.contains_key("tool_calls");
        match message.get("content") {
            Some(Value::String(_)) | Some(Value::Array(_)) => {}
            None | Some(Value::Null) if calls_tools => {}
            Some(_) => return Err((format!("{field}[{i}].content"), "must be a string".into())),
            None => return Err((format!("{field}[{i}].content"), "missing".into())),
        }
        match message.get("weight") {
            None => {}
            Some(_) if role != "assistant" => {
                return Err((
                    format!("{field}[{i}].weight"),
                    "only assistant messages have a weight".into(),
                ))
            }
            Some(w) if w.as_f64() == Some(0.0) || w.as_f64() == Some(1.0) => {}
            Some(w) => {
                return Err((format!("{field}[{i}].weight"), format!("must be 0 or 1, got {w}")))
            }
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

    fn format(text: &str, format: RowFormat) -> Result<u64, Vec<LineError>> {
        let mut v = JsonlValidator::for_format(format);
        v.feed(text.as_bytes());
        v.finish_all()
    }

    #[test]
    fn supervised_and_preference_rows_name_line_and_field() {
        let chat = r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo","weight":1}]}"#;
        let pair = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"preferred_output":[{"role":"assistant","content":"a"}],"non_preferred_output":[{"role":"assistant","content":"b"}]}"#;
        assert_eq!(format(&format!("{chat}\n"), RowFormat::Supervised), Ok(1));
        assert_eq!(format(&format!("{pair}\n"), RowFormat::Preference), Ok(1));
        // the upload check accepts both kinds
        assert_eq!(validate(&format!("{chat}\n{pair}\n"), 7), Ok(2));
        let at = |text: &str, f: RowFormat| {
            let first = if f == RowFormat::Preference { pair } else { chat };
            let errors = format(&format!("{first}\n{text}\n"), f).unwrap_err();
            (errors[0].line, errors[0].field.clone())
        };
        let no_assistant = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(at(no_assistant, RowFormat::Supervised), (2, "messages".into()));
        let weight = r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a","weight":0.5}]}"#;
        assert_eq!(at(weight, RowFormat::Supervised), (2, "messages[1].weight".into()));
        assert_eq!(validate(weight, 3).unwrap_err().field, "messages[1].weight");
        let all_zero = r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a","weight":0}]}"#;
        assert_eq!(at(all_zero, RowFormat::Supervised), (2, "messages".into()));
        let no_preferred = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"non_preferred_output":[{"role":"assistant","content":"b"}]}"#;
        assert_eq!(at(no_preferred, RowFormat::Preference), (2, "preferred_output".into()));
        let no_rejected = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"preferred_output":[{"role":"assistant","content":"b"}]}"#;
        assert_eq!(at(no_rejected, RowFormat::Preference), (2, "non_preferred_output".into()));
        let user_output = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"preferred_output":[{"role":"user","content":"a"}],"non_preferred_output":[{"role":"assistant","content":"b"}]}"#;
        assert_eq!(at(user_output, RowFormat::Preference), (2, "preferred_output[0].role".into()));
        assert_eq!(at(chat, RowFormat::Preference), (2, "input".into()));
        assert_eq!(at(pair, RowFormat::Supervised), (2, "messages".into()));
    }
}
