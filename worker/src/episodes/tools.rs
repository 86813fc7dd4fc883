//! One episode's tools: dispatches a parsed call to its tool, keeps the episode's sandbox
//! sessions (the python tool's and each Python user tool's), and enforces the per-call and
//! per-episode limits of the environment.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use verity_core::environment::{Environment, HttpAllowList, ToolKind, ToolSpec};
use verity_verifiers::tools::function::FunctionSession;
use verity_verifiers::tools::python::{self, PythonSession};
use verity_verifiers::tools::{calculator, ToolLimits, ToolReply};
use verity_verifiers::SandboxConfig;

use super::format::ToolCall;
use super::http;

/// One tool call of an episode, as graders and the explorer see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The function called (empty when the call could not be parsed).
    pub name: String,
    /// Its arguments (`null` when the call could not be parsed).
    pub arguments: Value,
    /// The result the model read.
    pub output: String,
    /// Whether the call failed (malformed, unknown tool, an exception, a limit).
    pub error: bool,
    /// Wall time of the call, in seconds.
    pub seconds: f64,
}

/// What a call did to its episode.
pub struct CallOutcome {
    /// The call.
    pub record: ToolCallRecord,
    /// Why the episode ends after it, if it does.
    pub fatal: Option<String>,
}

/// The function schemas (OpenAI `tools` format) of the environment's tools.
pub fn schemas(environment: &Environment) -> Vec<Value> {
    environment
        .tools
        .iter()
        .map(|tool| match (tool.kind, &tool.function) {
            (ToolKind::Calculator, _) => calculator::schema(),
            (ToolKind::Python, _) => python::schema(),
            (ToolKind::Function, function) => json!({"type": "function", "function": function}),
        })
        .collect()
}

/// Where an episode's tools run: the sandbox and the operator's HTTP allow-list.
#[derive(Clone, Copy)]
pub struct ToolHost<'a> {
    /// The sandbox the python tool and Python user tools run in.
    pub sandbox: &'a SandboxConfig,
    /// The HTTP endpoints user tools may call.
    pub http_allow: &'a HttpAllowList,
}

/// The tools of one episode.
pub struct EpisodeTools<'a> {
    environment: &'a Environment,
    host: ToolHost<'a>,
    /// The python tool's session, started at its first call.
    python: Option<PythonSession>,
    /// Python user tools' sessions by tool index, each started at the tool's first call.
    functions: HashMap<usize, FunctionSession>,
    calls: usize,
    time: Duration,
    output_bytes: usize,
}

impl<'a> EpisodeTools<'a> {
    /// Fresh tools (no session started) for one episode.
    pub fn new(environment: &'a Environment, host: ToolHost<'a>) -> Self {
        EpisodeTools {
            environment,
            host,
            python: None,
            functions: HashMap::new(),
            calls: 0,
            time: Duration::ZERO,
            output_bytes: 0,
        }
    }

    /// Runs one parsed call of a turn (a parse error is answered as a failed call).
    pub fn call(&mut self, parsed: std::result::Result<ToolCall, String>) -> CallOutcome {
        let started = Instant::now();
        let limits = self.environment.episode_limits;
        let (name, arguments) = match &parsed {
            Ok(call) => (call.name.clone(), call.arguments.clone()),
            Err(_) => (String::new(), Value::Null),
        };
        let episode_time = Duration::from_millis(limits.tool_time_ms);
        let reply = if self.calls >= limits.max_tool_calls {
            ToolReply::fatal(format!(
                "more than {} tool calls in the episode",
                limits.max_tool_calls
            ))
        } else {
            self.calls += 1;
            match parsed {
                Err(message) => ToolReply::error(message),
                Ok(call) => self.run(&call.name, &call.arguments, episode_time),
            }
        };
        let elapsed = started.elapsed();
        self.time += elapsed;
        self.output_bytes += reply.content.len();
        let fatal = reply.fatal.clone().or_else(|| {
            if self.time > episode_time {
                Some(format!("the episode's tools ran past {} ms", limits.tool_time_ms))
            } else if self.output_bytes > limits.tool_output_bytes {
                Some(format!(
                    "the episode's tools printed more than {} bytes",
                    limits.tool_output_bytes
                ))
            } else {
                None
            }
        });
        let record = ToolCallRecord {
            name,
            arguments,
            output: reply.content,
            error: reply.error || fatal.is_some(),
            seconds: elapsed.as_secs_f64(),
        };
        CallOutcome { record, fatal }
    }

    fn run(&mut self, name: &str, arguments: &Value, episode_time: Duration) -> ToolReply {
        let environment = self.environment;
        let Some((index, spec)) = environment.tool(name) else {
            let offered: Vec<&str> = environment.tools.iter().map(ToolSpec::name).collect();
            return ToolReply::error(format!(
                "unknown tool {name:?}; the tools are {}",
                offered.join(", ")
            ));
        };
        // A call may use what is left of the episode's tool time, never more than its own limit.
        let left = episode_time.saturating_sub(self.time);
        let limits = ToolLimits {
            timeout: Duration::from_millis(spec.limits.timeout_ms)
                .min(left)
                .max(Duration::from_millis(1)),
            memory_mb: spec.limits.memory_mb,
            max_output_bytes: spec.limits.max_output_bytes,
        };
        let sandbox = self.host.sandbox;
        let mut reply = match (spec.kind, &spec.python, &spec.http) {
            (ToolKind::Calculator, _, _) => calculator::call(arguments),
            (ToolKind::Python, _, _) => self
                .python
                .get_or_insert_with(|| PythonSession::new(episode_time))
                .call(sandbox, arguments, &limits),
            (ToolKind::Function, Some(source), _) => self
                .functions
                .entry(index)
                .or_insert_with(|| FunctionSession::new(source, episode_time))
                .call(sandbox, name, arguments, &limits),
            (ToolKind::Function, None, Some(endpoint)) => {
                http::call(self.host.http_allow, endpoint, arguments, &limits)
            }
            (ToolKind::Function, None, None) => ToolReply::fatal("the tool has no python or http"),
        };
        if reply.content.len() > limits.max_output_bytes && reply.fatal.is_none() {
            reply = ToolReply::fatal(format!(
                "the tool printed more than {} bytes",
                limits.max_output_bytes
            ));
        }
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episodes::format::parse_tool_calls;
    use serde_json::json;

    /// Runs the (first) call of `turn`.
    fn call(tools: &mut EpisodeTools, turn: &str) -> CallOutcome {
        tools.call(parse_tool_calls(turn).remove(0))
    }

    fn environment(value: Value) -> Environment {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn malformed_and_unknown_calls_are_counted_errors_and_the_call_limit_ends_the_episode() {
        let env = environment(
            json!({"tools": [{"type": "calculator"}], "episode_limits": {"max_tool_calls": 2}}),
        );
        let sandbox = SandboxConfig::not_needed();
        let allow = HttpAllowList::default();
        let host = ToolHost { sandbox: &sandbox, http_allow: &allow };
        let mut tools = EpisodeTools::new(&env, host);
        let ok = call(&mut tools, "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*12\"}}</tool_call>");
        assert_eq!(
            (ok.record.output.as_str(), ok.record.error, ok.fatal.is_none()),
            ("144", false, true)
        );
        let bad =
            call(&mut tools, "<tool_call>{\"name\": \"python\", \"arguments\": {}}</tool_call>");
        assert!(
            bad.record.error && bad.fatal.is_none() && bad.record.output.contains("unknown tool")
        );
        let over = call(&mut tools, "<tool_call>{oops</tool_call>");
        assert!(over.fatal.is_some_and(|f| f.contains("more than 2 tool calls")));
        let mut fresh = EpisodeTools::new(&env, host);
        let malformed = call(&mut fresh, "<tool_call>{oops</tool_call>");
        assert!(malformed.record.error && malformed.fatal.is_none(), "the model may retry");
        assert!(malformed.record.output.starts_with("Error: the tool call is not valid JSON"));
    }
}
