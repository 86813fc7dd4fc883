//! How tool calls and tool results look in the model's chat template.
//!
//! Supported: ChatML templates (SmolLM2, Qwen2/2.5 and others with `<|im_start|>`), with
//! Hermes/Qwen-style calls `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (several in
//! one turn with `parallel_tool_calls`) and results wrapped in `<tool_response>` inside a `tool`
//! message (a `user` message when the template itself renders `<tool_response>`, as Qwen2.5's
//! does); Llama 3.1/3.2/3.3 templates (`<|start_header_id|>`), whose calls are a whole assistant
//! turn of JSON `{"name": …, "parameters": {…}}` (optionally after `<|python_tag|>`) ended by
//! `<|eom_id|>` or `<|eot_id|>`, with results in an `ipython` message; Mistral templates
//! (`[TOOL_CALLS]`), whose calls are a whole turn `[TOOL_CALLS] [{"name": …, "arguments": {…}},
//! …]` ended by `</s>`, with each result in `[TOOL_RESULTS] {"content": …, "call_id": …}
//! [/TOOL_RESULTS]`; any other template gets the Hermes call syntax with results appended as
//! plain `<tool_response>` blocks (no role markers).

use serde::Serialize;
use serde_json::Value;

use crate::error::Result;
use crate::tokenizer::ChatTokenizer;

/// Opens a tool call in the model's text.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call: the sampler pauses the episode when its turn contains this.
pub const CALL_CLOSE: &str = "</tool_call>";

/// Opens Mistral's list of calls (a whole turn).
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

/// A tool call parsed from an assistant turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// The function name.
    pub name: String,
    /// Its arguments (an object).
    pub arguments: Value,
    /// The id the model gave the call (Mistral's calls carry one), if any.
    pub id: Option<String>,
}

/// A tool result to feed back: the id of its call (Mistral's results echo it) and the text the
/// model reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The call's id.
    pub call_id: String,
    /// The result text.
    pub content: String,
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

/// A Mistral-style turn's list of calls: the JSON after `[TOOL_CALLS]` (before `</s>`), if the
/// turn is one.
pub fn mistral_calls(turn: &str) -> Option<&str> {
    let (_, body) = turn.split_once(MISTRAL_CALLS)?;
    let body = body.trim();
    Some(body.strip_suffix("</s>").unwrap_or(body).trim_end())
}

/// Parses every tool call of an assistant turn, in order: each `<tool_call>…</tool_call>`, the
/// turn itself when it is a Llama-style call, or each element of a Mistral-style list; an error
/// is the message the model gets as that call's result. Never empty.
pub fn parse_tool_calls(turn: &str) -> Vec<std::result::Result<ToolCall, String>> {
    if let Some(body) = mistral_calls(turn) {
        return match serde_json::from_str::<Value>(body) {
            Ok(Value::Array(calls)) if !calls.is_empty() => {
                calls.into_iter().map(|call| call_of(call, "arguments")).collect()
            }
            Ok(call @ Value::Object(_)) => vec![call_of(call, "arguments")],
            Ok(_) => vec![Err(format!("{MISTRAL_CALLS} must be followed by a list of calls"))],
            Err(e) => vec![Err(format!(
                "the tool calls are not valid JSON ({e}); expected [{{\"name\": \"…\", \"arguments\": {{…}}}}]"
            ))],
        };
    }
    if !turn.contains(CALL_CLOSE) {
        return vec![match llama_call(turn) {
            Some(body) => parse_call_json(body, "parameters"),
            None => Err(format!("no {CALL_CLOSE} in the turn")),
        }];
    }
    let mut calls = Vec::new();
    let mut rest = turn;
    while let Some(end) = rest.find(CALL_CLOSE) {
        calls.push(match rest[..end].rfind(CALL_OPEN) {
            Some(start) => parse_call_json(rest[start + CALL_OPEN.len()..end].trim(), "arguments"),
            None => Err(format!("{CALL_CLOSE} without {CALL_OPEN}")),
        });
        rest = &rest[end + CALL_CLOSE.len()..];
    }
    calls
}

/// The well-formed tool calls of a single-turn completion in OpenAI's shape (what graders read
/// as `sample.output_tools`); a call without an id of its own gets `call_<i>`. Malformed calls
/// are left out: the grader sees the calls a client would receive.
pub fn openai_tool_calls(turn: &str) -> Vec<Value> {
    parse_tool_calls(turn)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, call)| {
            let id = call.id.clone().unwrap_or_else(|| format!("call_{i}"));
            verity_verifiers::sample::openai_tool_call(&id, &call.name, &call.arguments)
        })
        .collect()
}

/// A call's JSON body: `name` and the arguments (`arguments`, or Llama's `parameters`);
/// `expected` names the arguments field in the error message.
fn parse_call_json(body: &str, expected: &str) -> std::result::Result<ToolCall, String> {
    let value: Value = serde_json::from_str(body)
        .map_err(|e| format!("the tool call is not valid JSON ({e}); expected {{\"name\": \"…\", \"{expected}\": {{…}}}}"))?;
    call_of(value, expected)
}

/// A call from its JSON value (see [`parse_call_json`]).
fn call_of(value: Value, expected: &str) -> std::result::Result<ToolCall, String> {
    let Some(name) = value.get("name").and_then(Value::as_str) else {
        return Err("the tool call has no \"name\" string".into());
    };
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        // OpenAI's wire format carries arguments as a JSON string.
        Some(Value::String(text)) => serde_json::from_str(text)
            .map_err(|e| format!("\"{expected}\" is a string that is not JSON: {e}"))?,
        Some(other) => other.clone(),
    };
    if !arguments.is_object() {
        return Err(format!("\"{expected}\" must be an object"));
    }
    let id = value.get("id").and_then(Value::as_str).map(String::from);
    Ok(ToolCall { name: name.to_string(), arguments, id })
}

/// The assistant text before its tool calls (what the turn said besides calling; nothing for a
/// Llama- or Mistral-style call, which is the whole turn, even with its special tokens decoded
/// away).
pub fn text_before_call(turn: &str) -> &str {
    if let Some(start) = turn.find(CALL_OPEN) {
        return turn[..start].trim_end();
    }
    let body = turn.trim();
    let json_list = body.starts_with('[') && body.ends_with(']') && body.contains("\"name\"");
    if llama_call(turn).is_some() || mistral_calls(turn).is_some() || json_list {
        return "";
    }
    turn.trim_end()
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
    /// Mistral; a call is a whole turn `[TOOL_CALLS] [...]`, each result `[TOOL_RESULTS] …`.
    Mistral,
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
            Some(source) if source.contains(MISTRAL_CALLS) => ToolFormat::Mistral,
            _ => ToolFormat::Plain,
        }
    }

    /// Whether a call in this format is a whole turn, ended by an end-of-turn token as an
    /// answer is (Llama, Mistral), so a turn ending that way must be read to tell which it is.
    pub fn calls_by_whole_turns(self) -> bool {
        matches!(self, ToolFormat::Llama3 | ToolFormat::Mistral)
    }

    /// Whether a turn that ends with an end-of-turn token made calls rather than only answered,
    /// given the turn's text with its special tokens (Hermes-style turns are read this way with
    /// `parallel_tool_calls`, which lets them go on after a call).
    pub fn calls_at_end_of_turn(self, turn: &str) -> bool {
        match self {
            ToolFormat::Llama3 => llama_call(turn).is_some(),
            ToolFormat::Mistral => mistral_calls(turn).is_some(),
            ToolFormat::ChatMl { .. } | ToolFormat::Plain => turn.contains(CALL_CLOSE),
        }
    }

    /// The text fed after the model's calls: the end of its turn (unless the model's own
    /// end-of-turn token closed it: `turn_ended`), the tool results, and the opening of its next
    /// turn (all masked out of the loss).
    pub fn tool_turn(self, results: &[ToolResult], turn_ended: bool) -> String {
        let each = |f: &dyn Fn(&ToolResult) -> String| results.iter().map(f).collect::<Vec<_>>();
        match self {
            ToolFormat::ChatMl { result_role } => format!(
                "{}\n<|im_start|>{result_role}\n{}<|im_end|>\n<|im_start|>assistant\n",
                if turn_ended { "" } else { "<|im_end|>" },
                each(&|r| format!("<tool_response>\n{}\n</tool_response>", r.content)).join("\n")
            ),
            // the model's own end-of-turn token (sampled) already closes its call
            ToolFormat::Llama3 => format!(
                "{}<|start_header_id|>assistant<|end_header_id|>\n\n",
                each(&|r| format!(
                    "<|start_header_id|>ipython<|end_header_id|>\n\n{}<|eot_id|>",
                    r.content
                ))
                .concat()
            ),
            // the result text and the call id as JSON strings
            ToolFormat::Mistral => each(&|r| {
                format!(
                    "[TOOL_RESULTS] {{\"content\": {}, \"call_id\": {}}}[/TOOL_RESULTS]",
                    Value::String(r.content.clone()),
                    Value::String(r.call_id.clone())
                )
            })
            .concat(),
            ToolFormat::Plain => {
                each(&|r| format!("\n<tool_response>\n{}\n</tool_response>\n", r.content)).concat()
            }
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

    /// The one call of a turn.
    fn one(turn: &str) -> std::result::Result<ToolCall, String> {
        let mut calls = parse_tool_calls(turn);
        assert_eq!(calls.len(), 1, "{turn}");
        calls.remove(0)
    }

    fn result(content: &str) -> ToolResult {
        ToolResult { call_id: "call00000".into(), content: content.into() }
    }

    #[test]
    fn parses_hermes_calls_and_explains_malformed_ones() {
        let turn = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2*3\"}}\n</tool_call>";
        let call = one(turn).unwrap();
        assert_eq!(call.name, "calculator");
        assert_eq!(call.arguments, json!({"expression": "2*3"}));
        assert_eq!(text_before_call(turn), "Let me compute.");
        let stringly = "<tool_call>{\"name\": \"python\", \"arguments\": \"{\\\"code\\\": \\\"1\\\"}\"}</tool_call>";
        assert_eq!(one(stringly).unwrap().arguments, json!({"code": "1"}));
        for bad in [
            "<tool_call>{\"name\": calculator}</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>",
            "oops</tool_call>",
            "no call at all",
        ] {
            assert!(one(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn single_turn_calls_take_openais_shape_and_malformed_ones_are_left_out() {
        let turn = "Let me look.\n<tool_call>{\"name\": \"get_weather\", \"arguments\":                     {\"city\": \"Paris\"}}</tool_call><tool_call>{oops}</tool_call>";
        let calls = openai_tool_calls(turn);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["id"], "call_0");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let arguments: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({"city": "Paris"}));
        assert!(openai_tool_calls("just an answer").is_empty());
    }

    #[test]
    fn a_turn_may_hold_several_hermes_calls_each_parsed_on_its_own() {
        let turn = "Both.\n<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}</tool_call>\n<tool_call>{oops</tool_call>\n<tool_call>{\"name\": \"python\", \"arguments\": {\"code\": \"2\"}}</tool_call>";
        let calls = parse_tool_calls(turn);
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].as_ref().unwrap().name, "calculator");
        assert!(calls[1].as_ref().is_err_and(|e| e.contains("not valid JSON")));
        assert_eq!(calls[2].as_ref().unwrap().arguments, json!({"code": "2"}));
        assert_eq!(text_before_call(turn), "Both.");
        let chatml = ToolFormat::ChatMl { result_role: "user" };
        assert!(chatml.calls_at_end_of_turn(turn), "read at the end of a parallel turn");
        assert_eq!(
            chatml.tool_turn(&[result("2"), result("Error: x")], true),
            "\n<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\nError: x\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama_calls_are_whole_turns_of_json_and_answers_are_not_calls() {
        let tagged = "<|python_tag|>{\"name\": \"calculator\", \"parameters\": {\"expression\": \"7*8\"}}<|eom_id|>";
        let call = one(tagged).unwrap();
        assert_eq!(
            (call.name.as_str(), &call.arguments),
            ("calculator", &json!({"expression": "7*8"}))
        );
        let plain = " {\"name\": \"python\", \"parameters\": {\"code\": \"1+1\"}}<|eot_id|>";
        assert_eq!(one(plain).unwrap().name, "python");
        assert_eq!(text_before_call(plain), "");
        let llama = ToolFormat::of_template(Some("{{ '<|start_header_id|>' + role }}"));
        assert_eq!(llama, ToolFormat::Llama3);
        assert!(llama.calls_at_end_of_turn(tagged) && llama.calls_at_end_of_turn(plain));
        assert!(!llama.calls_at_end_of_turn("The answer is 56.<|eot_id|>"));
        assert!(!llama.calls_at_end_of_turn("{\"answer\": 56}<|eot_id|>"), "JSON without a name");
        assert!(one("<|python_tag|>{oops<|eom_id|>").is_err_and(|e| e.contains("not valid JSON")));
        assert!(!ToolFormat::ChatMl { result_role: "tool" }.calls_at_end_of_turn(tagged));
        assert_eq!(
            llama.tool_turn(&[result("56")], true),
            "<|start_header_id|>ipython<|end_header_id|>\n\n56<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn mistral_calls_are_a_whole_turn_list_and_results_echo_the_call_ids() {
        let turn = "[TOOL_CALLS] [{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}, \"id\": \"abc123def\"}, {\"name\": \"python\", \"arguments\": {\"code\": \"1\"}}]</s>";
        let calls = parse_tool_calls(turn);
        assert_eq!(calls.len(), 2);
        let first = calls[0].as_ref().unwrap();
        assert_eq!((first.name.as_str(), first.id.as_deref()), ("calculator", Some("abc123def")));
        assert_eq!(calls[1].as_ref().unwrap().id, None);
        let mistral =
            ToolFormat::of_template(Some("{%- if message.tool_calls %}[TOOL_CALLS] {%- endif %}"));
        assert_eq!(mistral, ToolFormat::Mistral);
        assert!(mistral.calls_by_whole_turns() && mistral.calls_at_end_of_turn(turn));
        assert!(!mistral.calls_at_end_of_turn("The answer is 42.</s>"));
        assert_eq!(text_before_call(turn), "");
        let bare = turn.trim_start_matches("[TOOL_CALLS] ").trim_end_matches("</s>");
        assert_eq!(text_before_call(bare), "", "decoded without its special tokens");
        assert!(one("[TOOL_CALLS] [{oops</s>").is_err_and(|e| e.contains("not valid JSON")));
        assert!(one("[TOOL_CALLS] 42</s>").is_err_and(|e| e.contains("a list of calls")));
        let results = [
            ToolResult { call_id: "abc123def".into(), content: "42".into() },
            ToolResult { call_id: "call00001".into(), content: "say \"hi\"".into() },
        ];
        assert_eq!(
            mistral.tool_turn(&results, true),
            "[TOOL_RESULTS] {\"content\": \"42\", \"call_id\": \"abc123def\"}[/TOOL_RESULTS][TOOL_RESULTS] {\"content\": \"say \\\"hi\\\"\", \"call_id\": \"call00001\"}[/TOOL_RESULTS]"
        );
    }

    #[test]
    fn tool_turns_follow_the_template() {
        let chatml = ToolFormat::ChatMl { result_role: "tool" };
        assert_eq!(
            chatml.tool_turn(&[result("6")], false),
            "<|im_end|>\n<|im_start|>tool\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(ToolFormat::Plain
            .tool_turn(&[result("6")], false)
            .contains("<tool_response>\n6\n"));
        assert!(tools_system_text(&[json!({"name": "calculator"})])
            .contains("<tools>\n{\"name\":\"calculator\"}\n</tools>"));
    }
}
