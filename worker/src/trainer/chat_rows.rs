//! OpenAI-shaped chat rows of supervised and DPO files: messages checked and normalised for the
//! chat template, and a conversation rendered into text segments that say which characters
//! belong to trained assistant messages (found by rendering the chat incrementally).

use super::error::{Result, TrainerError};
use crate::tokenizer::ChatTokenizer;
use serde_json::{Map, Value};

/// Roles a chat message may have.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// One message of a chat, ready for the template.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The message as the template sees it: `content` a string, `weight` removed.
    pub message: Value,
    /// Whether it is an assistant message.
    pub assistant: bool,
    /// Whether its tokens are trained on (an assistant message whose `weight` is not 0).
    pub trained: bool,
}

impl Turn {
    /// The message's text.
    pub fn content(&self) -> &str {
        self.message.get("content").and_then(Value::as_str).unwrap_or("")
    }
}

/// A message's text: a string, a list of text parts (joined), or nothing (`null` / absent,
/// allowed for an assistant message that calls tools).
fn content_text(message: &Map<String, Value>, field: &str) -> std::result::Result<String, String> {
    match message.get("content") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, part)| match part.get("text").and_then(Value::as_str) {
                Some(text) if part.get("type").and_then(Value::as_str) == Some("text") => {
                    Ok(text.to_string())
                }
                _ => Err(format!("`{field}.content[{j}]`: only text parts are supported")),
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
        None | Some(Value::Null) if message.contains_key("tool_calls") => Ok(String::new()),
        None => Err(format!("`{field}.content` is missing")),
        Some(_) => Err(format!("`{field}.content` must be a string or a list of text parts")),
    }
}

/// Parses the chat at JSON path `field` (a non-empty list of `{role, content}` messages with
/// an optional `weight` of 0 or 1 on assistant messages).
pub fn parse_turns(list: Option<&Value>, field: &str) -> std::result::Result<Vec<Turn>, String> {
    let Some(list) = list else { return Err(format!("`{field}` is missing")) };
    let Value::Array(list) = list else {
        return Err(format!("`{field}` must be a list of messages"));
    };
    if list.is_empty() {
        return Err(format!("`{field}` is empty"));
    }
    list.iter()
        .enumerate()
        .map(|(i, message)| {
            let path = format!("{field}[{i}]");
            let Value::Object(message) = message else {
                return Err(format!("`{path}` must be an object with role and content"));
            };
            let role = match message.get("role") {
                Some(Value::String(role)) if ROLES.contains(&role.as_str()) => role.as_str(),
                Some(Value::String(role)) => {
                    return Err(format!("`{path}.role`: unknown role {role:?}"));
                }
                _ => return Err(format!("`{path}.role` must be a string")),
            };
            let assistant = role == "assistant";
            let trained = match message.get("weight") {
                None => assistant,
                Some(_) if !assistant => {
                    return Err(format!("`{path}.weight`: only assistant messages have a weight"))
                }
                Some(w) if w.as_f64() == Some(1.0) => true,
                Some(w) if w.as_f64() == Some(0.0) => false,
                Some(w) => return Err(format!("`{path}.weight` must be 0 or 1, got {w}")),
            };
            let mut normalised = message.clone();
            normalised.remove("weight");
            normalised.insert("content".into(), Value::String(content_text(message, &path)?));
            Ok(Turn { message: Value::Object(normalised), assistant, trained })
        })
        .collect()
}

/// The messages of `turns` as the template takes them.
pub fn messages(turns: &[Turn]) -> Vec<Value> {
    turns.iter().map(|t| t.message.clone()).collect()
}

/// The row's `tools`, if any (a list).
pub fn tools(row: &Value, field: &str) -> std::result::Result<Option<Value>, String> {
    match row.get("tools") {
        None | Some(Value::Null) => Ok(None),
        Some(tools @ Value::Array(_)) => Ok(Some(tools.clone())),
        Some(_) => Err(format!("`{field}` must be a list of tool definitions")),
    }
}

/// A span of a rendered conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Its text.
    pub text: String,
    /// Whether it is a trained assistant message (its content and the template's end of turn).
    pub trained: bool,
}

/// Renders `turns` and cuts the text into segments: each assistant message `i` is the text
/// that rendering `turns[..=i]` adds to rendering `turns[..i]` with the generation prompt (its
/// content and end-of-turn tokens); everything else (system, user and tool messages, the
/// template's role headers) is untrained. Fails when the template does not render a chat as
/// the prefix of its continuations.
pub fn segments(
    tokenizer: &ChatTokenizer,
    turns: &[Turn],
    tools: Option<&Value>,
) -> std::result::Result<Vec<Segment>, String> {
    let render = |upto: usize, generation: bool| {
        tokenizer
            .render_chat(&messages(&turns[..upto]), tools, generation)
            .map_err(|e| format!("chat template failed: {e}"))
    };
    let full = render(turns.len(), false)?;
    let mut out = Vec::new();
    let mut done = 0usize;
    for (i, turn) in turns.iter().enumerate().filter(|(_, t)| t.assistant) {
        let before = match render(i, true) {
            Err(_) if i == 0 => String::new(),
            before => before?,
        };
        let after = render(i + 1, false)?;
        if !(after.starts_with(&before) && full.starts_with(&after) && before.len() >= done) {
            return Err(format!(
                "the chat template does not render messages[{i}] as a continuation of the \
                 messages before it, so its tokens cannot be located"
            ));
        }
        out.push(Segment { text: full[done..before.len()].to_string(), trained: false });
        out.push(Segment {
            text: full[before.len()..after.len()].to_string(),
            trained: turn.trained,
        });
        done = after.len();
    }
    out.push(Segment { text: full[done..].to_string(), trained: false });
    out.retain(|s| !s.text.is_empty());
    Ok(out)
}

/// Tokens of `segments` (each tokenized on its own, so a prompt's tokens are exactly those a
/// prompt rendered with the generation prompt has at inference) and whether each is trained.
pub fn tokenize(tokenizer: &ChatTokenizer, segments: &[Segment]) -> Result<(Vec<u32>, Vec<bool>)> {
    let mut ids = Vec::new();
    let mut labels = Vec::new();
    for segment in segments {
        let tokens = tokenizer.encode(&segment.text)?;
        labels.extend(std::iter::repeat_n(segment.trained, tokens.len()));
        ids.extend(tokens);
    }
    Ok((ids, labels))
}

/// The non-blank lines of a JSONL file, parsed as objects, with their 1-based line numbers.
pub fn objects<'a>(
    text: &'a str,
    file: &'a str,
) -> impl Iterator<Item = Result<(usize, Value)>> + 'a {
    text.lines().enumerate().filter(|(_, raw)| !raw.trim().is_empty()).map(move |(i, raw)| {
        let line = i + 1;
        let error = |message: String| TrainerError::Data { file: file.into(), line, message };
        let item: Value =
            serde_json::from_str(raw).map_err(|e| error(format!("not valid JSON: {e}")))?;
        if !item.is_object() {
            return Err(error("each line must be a JSON object".into()));
        }
        Ok((line, item))
    })
}
