//! Multi-turn episodes with tools (Verity extension; docs/tools.md): the rollout engine
//! ([`engine`]), the chat-template format of calls and results ([`format`]), each episode's
//! tools and limits ([`tools`]), the loss mask of trajectories ([`mask`]), and what graders and
//! metrics see of an episode (here).

pub mod engine;
pub mod format;
pub mod http;
pub mod mask;
pub mod tools;

pub use engine::{Episode, EpisodeEnd, EpisodeRunner, Turn};
pub use mask::mask_tool_tokens;
pub use tools::ToolCallRecord;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use verity_verifiers::Sample;

use crate::error::Result;
use crate::tokenizer::ChatTokenizer;
use format::text_before_call;

/// An episode's turns as OpenAI chat messages (assistant messages with `tool_calls`, `tool`
/// messages with the results), and its final answer (the last assistant turn's text).
pub fn episode_messages(
    tokenizer: &ChatTokenizer,
    episode: &Episode,
) -> Result<(Vec<Value>, String)> {
    let mut messages = Vec::new();
    let mut last = String::new();
    for turn in &episode.turns {
        let text = tokenizer.decode(&episode.token_ids[turn.start..turn.end], true)?;
        let calls = episode.tool_calls.get(turn.calls()).unwrap_or_default();
        if calls.is_empty() {
            last = text.clone();
            messages.push(json!({"role": "assistant", "content": text}));
            continue;
        }
        last = text_before_call(&text).to_string();
        let id = |k: usize| format!("call_{}", turn.first_call + k);
        let tool_calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(k, call)| {
                let arguments = if call.arguments.is_null() {
                    String::new()
                } else {
                    call.arguments.to_string()
                };
                json!({"id": id(k), "type": "function",
                    "function": {"name": call.name, "arguments": arguments}})
            })
            .collect();
        messages.push(json!({"role": "assistant", "content": last, "tool_calls": tool_calls}));
        for (k, call) in calls.iter().enumerate() {
            messages.push(json!({"role": "tool", "tool_call_id": id(k), "content": call.output}));
        }
    }
    Ok((messages, last))
}

/// An episode as the samples of a step keep it (the completions explorer shows it turn by
/// turn): its messages after the prompt, its calls with their timing, and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// The turns after the prompt as OpenAI chat messages.
    pub messages: Vec<Value>,
    /// Every call with its arguments, result, error flag and wall time.
    pub tool_calls: Vec<ToolCallRecord>,
    /// Why the episode ended.
    pub end: EpisodeEnd,
    /// The tool limit that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_limit: Option<String>,
}

impl EpisodeRecord {
    /// The record of `episode`.
    pub fn of(tokenizer: &ChatTokenizer, episode: &Episode) -> Result<Self> {
        Ok(EpisodeRecord {
            messages: episode_messages(tokenizer, episode)?.0,
            tool_calls: episode.tool_calls.clone(),
            end: episode.end,
            tool_limit: episode.tool_limit.clone(),
        })
    }
}

/// What a grader sees of an episode: `output_text` is the final answer, `messages` the turns
/// after the prompt and `tool_calls` every call with its result.
pub fn grader_sample(tokenizer: &ChatTokenizer, episode: &Episode) -> Result<Sample> {
    let (messages, answer) = episode_messages(tokenizer, episode)?;
    let mut sample = Sample::from_text(answer);
    sample.extra.insert("messages".into(), Value::Array(messages));
    sample.extra.insert(
        "tool_calls".into(),
        serde_json::to_value(&episode.tool_calls).unwrap_or(Value::Array(Vec::new())),
    );
    Ok(sample)
}

/// What a grader sees of a single-turn completion of row `item` (OpenAI's RFT sample):
/// `output_text`; `output_json`, the text parsed as JSON when it is JSON (graders read it only
/// with a JSON `response_format`, which creation checks); and, when the row offers `tools`,
/// `output_tools`, its calls in OpenAI's shape, with `output_text` the text before them.
pub fn completion_sample(text: &str, item: &Value) -> Sample {
    let offers_tools = item.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
    if !offers_tools {
        return Sample::from_text(text).with_output_json();
    }
    let calls = format::openai_tool_calls(text);
    let answer = if calls.is_empty() { text } else { text_before_call(text) };
    Sample::from_text(answer).with_output_json().with_output_tools(calls)
}

/// Tool-use metrics of a step's episodes (fields of its metrics row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeMetrics {
    /// Mean assistant turns per episode.
    pub turns_per_episode: f64,
    /// Mean tool calls per episode.
    pub tool_calls_per_episode: f64,
    /// Mean failed tool calls (malformed, unknown tool, exception, limit) per episode.
    pub tool_errors_per_episode: f64,
    /// Seconds spent in tool calls (summed over episodes).
    pub tool_seconds: f64,
    /// Fraction of episodes cut off (turn limit, token budget, tool limit).
    pub truncated_episode_fraction: f64,
}

impl EpisodeMetrics {
    /// The metrics of `episodes` (`None` when there are none).
    pub fn of<'a>(episodes: impl IntoIterator<Item = &'a Episode>) -> Option<EpisodeMetrics> {
        let episodes: Vec<&Episode> = episodes.into_iter().collect();
        if episodes.is_empty() {
            return None;
        }
        let n = episodes.len() as f64;
        let mean =
            |f: &dyn Fn(&Episode) -> usize| episodes.iter().map(|e| f(e)).sum::<usize>() as f64 / n;
        Some(EpisodeMetrics {
            turns_per_episode: mean(&|e| e.turns.len()),
            tool_calls_per_episode: mean(&|e| e.tool_calls.len()),
            tool_errors_per_episode: mean(&|e| e.tool_calls.iter().filter(|c| c.error).count()),
            tool_seconds: episodes.iter().flat_map(|e| &e.tool_calls).map(|c| c.seconds).sum(),
            truncated_episode_fraction: mean(&|e| usize::from(e.end.truncated())),
        })
    }
}

#[cfg(test)]
mod sample_tests {
    use super::*;

    #[test]
    fn a_single_turn_sample_has_output_json_and_with_tools_output_tools() {
        let json = completion_sample("{\"email\": \"a@b.c\"}", &json!({"prompt": "x"}));
        assert_eq!(json.extra["output_json"], json!({"email": "a@b.c"}));
        assert!(!json.extra.contains_key("output_tools"));
        let row =
            json!({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]});
        let text = "Calling.<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
        let called = completion_sample(text, &row);
        assert_eq!(called.output_text, "Calling.");
        assert_eq!(called.extra["output_tools"][0]["function"]["name"], "f");
        assert!(called.output_json_error.is_some());
        let plain = completion_sample("no call", &row);
        assert_eq!(plain.extra["output_tools"], json!([]));
    }
}
