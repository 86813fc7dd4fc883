//! How tool calls and tool results look in the model's chat template.
//!
//! Supported: ChatML templates (SmolLM2, Qwen2/2.5 and others with `<|im_start|>`), with
//! Hermes/Qwen-style calls `<tool_call>{"name": …, "arguments": {…}}</tool_call>` and results
//! wrapped in `<tool_response>` inside a `tool` message (a `user` message when the template
//! itself renders `<tool_response>`, as Qwen2.5's does); Llama 3.1/3.2/3.3 templates
//! (`<|start_header_id|>`), whose calls are a whole assistant turn of JSON
//! `{"name": …, "parameters": {…}}` (optionally after `<|python_tag|>`) ended by `<|eom_id|>` or
//! `<|eot_id|>`, with results in an `ipython` message; any other template gets the Hermes call
//! syntax with results appended as plain `<tool_response>` blocks (no role markers).

use serde::Serialize;
use serde_json::Value;

use crate::error::Result;
use crate::tokenizer::ChatTokenizer;

/// Opens a tool call in the model's text.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call: the sampler pauses the episode when its turn contains this.
pub const CALL_CLOSE: &str = "</tool_call>";

/// A tool call parsed from an assistant turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// The function name.
    pub name: String,
    /// Its arguments (an object).
    pub arguments: Value,
}

/// Llama 3.1's marker before a tool call.
pub const PYTHON_TAG: &str = "<|python_tag|>";
/// Llama 3's end-of-turn tokens (`<|eom_id|>`: a message that expects a tool result).
const LLAMA_TURN_ENDS: [&str; 2] = ["<|eom_id|>", "<|eot_id|>"];

/// A Llama-style call: the JSON body of a turn that is a call as a whole (after an optional
/// `<|python_tag|>`, before its end-of-turn token), if the turn is one.
pub fn llama_call(turn: &str) -> Option<&str> {
    let mut body = turn.trim();
    while let Some(end) = LLAMA_TURN_ENDS.iter().find_map(|e| body.strip_suffix(e)) {
        body = end.trim_end();
    }
    if let Some(tagged) = body.strip_prefix(PYTHON_TAG) {
        return Some(tagged.trim());
    }
    (body.starts_with('{') && body.ends_with('}') && body.contains("\"name\"")).then_some(body)
}

/// Parses the tool call of an assistant turn: its last `<tool_call>…</tool_call>`, or the
/// turn itself when it is a Llama-style call; the error is the message the model gets as the
/// tool result.
pub fn parse_tool_call(turn: &str) -> std::result::Result<ToolCall, String> {
    let Some(end) = turn.rfind(CALL_CLOSE) else {
        return match llama_call(turn) {
            Some(body) => parse_call_json(body, "parameters"),
            None => Err(format!("no {CALL_CLOSE} in the turn")),
        };
    };
    let Some(start) = turn[..end].rfind(CALL_OPEN) else {
        return Err(format!("{CALL_CLOSE} without {CALL_OPEN}"));
    };
    parse_call_json(turn[start + CALL_OPEN.len()..end].trim(), "arguments")
}

/// A call's JSON body: `name` and the arguments (`arguments`, or Llama's `parameters`);
/// `expected` names the arguments field in the error message.
fn parse_call_json(body: &str, expected: &str) -> std::result::Result<ToolCall, String> {
    let value: Value = serde_json::from_str(body)
        .map_err(|e| format!("the tool call is not valid JSON ({e}); expected {{\"name\": \"…\", \"{expected}\": {{…}}}}"))?;
    let Some(name) = value.get("name").and_then(Value::as_str) else {
        return Err("the tool call has no \"name\" string".into());
    };
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        // OpenAI's wire format carries arguments as a JSON string.
        Some(Value::String(text)) => serde_json::from_str(text)
            .map_err(|e| format!("\"arguments\" is a string that is not JSON: {e}"))?,
        Some(other) => other.clone(),
    };
    if !arguments.is_object() {
        return Err("\"arguments\" must be an object".into());
    }
    Ok(ToolCall { name: name.to_string(), arguments })
}

/// The assistant text before its tool call (what the turn said besides calling; nothing for a
/// Llama-style call, which is the whole turn).
pub fn text_before_call(turn: &str) -> &str {
    match turn.rfind(CALL_OPEN) {
        Some(start) => turn[..start].trim_end(),
        None if llama_call(turn).is_some() => "",
        None => turn.trim_end(),
    }
}

/// Which family of template the episode's text follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// ChatML; tool results in a message of this role (`tool` or `user`).
    ChatMl {
        /// Role of the message that carries a tool result.
        result_role: &'static str,
    },
    /// Llama 3.x headers; a call is a whole turn of JSON, its result an `ipython` message.
    Llama3,
    /// No role markers: results follow the call as `<tool_response>` blocks.
    Plain,
}

impl ToolFormat {
    /// The format for a tokenizer's chat template.
    pub fn of(tokenizer: &ChatTokenizer) -> ToolFormat {
        Self::of_template(tokenizer.chat_template_source.as_deref())
    }

    /// The format for a chat template's source.
    pub fn of_template(source: Option<&str>) -> ToolFormat {
        match source {
            Some(source) if source.contains("<|im_start|>") => ToolFormat::ChatMl {
                result_role: if source.contains("<tool_response>") { "user" } else { "tool" },
            },
            Some(source) if source.contains("<|start_header_id|>") => ToolFormat::Llama3,
            _ => ToolFormat::Plain,
        }
    }

    /// Whether a call in this format is a whole turn, ended by an end-of-turn token as an
    /// answer is (Llama), so a turn ending that way must be read to tell which it is.
    pub fn calls_by_whole_turns(self) -> bool {
        self == ToolFormat::Llama3
    }

    /// Whether a turn that ends with an end-of-turn token is a call rather than an answer,
    /// given the turn's text with its special tokens.
    pub fn calls_at_end_of_turn(self, turn: &str) -> bool {
        self.calls_by_whole_turns() && llama_call(turn).is_some()
    }

    /// The text appended after the model's `</tool_call>`: the end of its turn, the tool
    /// result, and the opening of its next turn (all masked out of the loss).
    pub fn tool_turn(self, content: &str) -> String {
        match self {
            ToolFormat::ChatMl { result_role } => format!(
                "<|im_end|>\n<|im_start|>{result_role}\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            ),
            // the model's own end-of-turn token (sampled) already closes its call
            ToolFormat::Llama3 => format!(
                "<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            ),
            ToolFormat::Plain => format!("\n<tool_response>\n{content}\n</tool_response>\n"),
        }
    }
}

/// The Hermes system text that tells the model its tools (what Qwen2.5's template renders),
/// for templates that do not render `tools` themselves.
pub fn tools_system_text(tools: &[Value]) -> String {
    let lines: Vec<String> = tools.iter().map(Value::to_string).collect();
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        lines.join("\n")
    )
}

/// Renders a row's prompt for an episode: its `messages` (or `prompt`) with its own `tools`
/// (OpenAI function schemas) or else `default_tools`, passed to a template that renders
/// `tools`, or described in the system message otherwise.
pub fn render_prompt(
    tokenizer: &ChatTokenizer,
    item: &Value,
    default_tools: &[Value],
) -> Result<String> {
    let mut messages: Vec<Value> = match (item.get("messages"), item.get("prompt")) {
        (Some(Value::Array(messages)), _) => messages.clone(),
        (_, Some(Value::String(prompt))) => {
            vec![serde_json::json!({"role": "user", "content": prompt})]
        }
        _ => {
            return Err(crate::error::WorkerError::InvalidArgument(
                "the row has neither `messages` nor `prompt`".into(),
            ))
        }
    };
    let tools: Vec<Value> = match item.get("tools") {
        Some(Value::Array(tools)) => tools.clone(),
        _ => default_tools.to_vec(),
    };
    let renders_tools =
        tokenizer.chat_template_source.as_deref().is_some_and(|source| source.contains("tools"));
    if renders_tools {
        return tokenizer.render_chat(&messages, Some(&Value::Array(tools)), true);
    }
    let text = tools_system_text(&tools);
    match messages.first_mut() {
        Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
            let content = first.get("content").and_then(Value::as_str).unwrap_or("");
            first["content"] = Value::String(format!("{content}\n\n{text}"));
        }
        _ => messages.insert(0, serde_json::json!({"role": "system", "content": text})),
    }
    tokenizer.render_chat(&messages, None, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_hermes_calls_and_explains_malformed_ones() {
        let turn = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2*3\"}}\n</tool_call>";
        let call = parse_tool_call(turn).unwrap();
        assert_eq!(call.name, "calculator");
        assert_eq!(call.arguments, json!({"expression": "2*3"}));
        assert_eq!(text_before_call(turn), "Let me compute.");
        let stringly = "<tool_call>{\"name\": \"python\", \"arguments\": \"{\\\"code\\\": \\\"1\\\"}\"}</tool_call>";
        assert_eq!(parse_tool_call(stringly).unwrap().arguments, json!({"code": "1"}));
        for bad in [
            "<tool_call>{\"name\": calculator}</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>",
            "oops</tool_call>",
        ] {
            assert!(parse_tool_call(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn llama_calls_are_whole_turns_of_json_and_answers_are_not_calls() {
        let tagged = "<|python_tag|>{\"name\": \"calculator\", \"parameters\": {\"expression\": \"7*8\"}}<|eom_id|>";
        let call = parse_tool_call(tagged).unwrap();
        assert_eq!(
            (call.name.as_str(), &call.arguments),
            ("calculator", &json!({"expression": "7*8"}))
        );
        let plain = " {\"name\": \"python\", \"parameters\": {\"code\": \"1+1\"}}<|eot_id|>";
        assert_eq!(parse_tool_call(plain).unwrap().name, "python");
        assert_eq!(text_before_call(plain), "");
        let llama = ToolFormat::of_template(Some("{{ '<|start_header_id|>' + role }}"));
        assert_eq!(llama, ToolFormat::Llama3);
        assert!(llama.calls_at_end_of_turn(tagged) && llama.calls_at_end_of_turn(plain));
        assert!(!llama.calls_at_end_of_turn("The answer is 56.<|eot_id|>"));
        assert!(!llama.calls_at_end_of_turn("{\"answer\": 56}<|eot_id|>"), "JSON without a name");
        assert!(parse_tool_call("<|python_tag|>{oops<|eom_id|>")
            .is_err_and(|e| e.contains("not valid JSON")));
        assert!(!ToolFormat::ChatMl { result_role: "tool" }.calls_at_end_of_turn(tagged));
        assert_eq!(
            llama.tool_turn("56"),
            "<|start_header_id|>ipython<|end_header_id|>\n\n56<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn tool_turns_follow_the_template() {
        let chatml = ToolFormat::ChatMl { result_role: "tool" };
        assert_eq!(
            chatml.tool_turn("6"),
            "<|im_end|>\n<|im_start|>tool\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(ToolFormat::Plain.tool_turn("6").contains("<tool_response>\n6\n"));
        assert!(tools_system_text(&[json!({"name": "calculator"})])
            .contains("<tools>\n{\"name\":\"calculator\"}\n</tools>"));
    }
}
