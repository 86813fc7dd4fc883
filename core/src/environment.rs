//! Verity extension: the `environment` block of `method.reinforcement`, which turns each rollout
//! into a multi-turn episode in which the model may call sandboxed tools (OpenAI's tool-call
//! format; docs/tools.md). Absent, a rollout is one completion, exactly as before.

use serde::{Deserialize, Serialize};

use crate::spec::HyperparameterError;
use crate::urls::{AllowList, OutboundUrl, UrlError};

/// Most assistant turns an episode may be given.
pub const MAX_TURNS: usize = 32;
/// Longest per-call time limit, in milliseconds.
const MAX_CALL_TIMEOUT_MS: u64 = 60_000;
/// Largest per-call memory limit, in MiB.
const MAX_CALL_MEMORY_MB: u64 = 4096;
/// Largest per-call output cap, in bytes.
const MAX_CALL_OUTPUT_BYTES: usize = 1 << 20;

/// Most retries of an HTTP tool call.
const MAX_HTTP_RETRIES: u32 = 5;
/// The operator's allow-list of HTTP tool endpoints: comma-separated URL prefixes.
pub const HTTP_ALLOW_ENV: &str = "VERITY_TOOL_HTTP_ALLOW";

/// What kind of tool the episode offers the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Arithmetic on numbers (`+ - * /`, parentheses, `min`, `max`, `abs`), evaluated in Rust.
    Calculator,
    /// Python code run in the bubblewrap sandbox; variables persist across the episode's calls.
    Python,
    /// A tool the job defines: a Python function run in the sandbox, or an HTTP endpoint the
    /// operator allows.
    Function,
}

impl ToolKind {
    /// The built-in tools.
    pub const BUILT_IN: [ToolKind; 2] = [ToolKind::Calculator, ToolKind::Python];

    /// The function name the model calls a built-in by (`calculator`, `python`; `function` for
    /// a user tool, whose own name is in its spec).
    pub fn name(self) -> &'static str {
        match self {
            ToolKind::Calculator => "calculator",
            ToolKind::Python => "python",
            ToolKind::Function => "function",
        }
    }
}

/// The function a user tool offers, in OpenAI's `tools[].function` shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSchema {
    /// The name the model calls it by (letters, digits, `_` and `-`, at most 64).
    pub name: String,
    /// What it does, as the prompt tells the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of its arguments (an object schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// OpenAI's strict flag; kept and echoed, not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// An HTTP endpoint that serves a user tool: each call POSTs the arguments as JSON and the
/// response body is the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTool {
    /// The endpoint; it must start with one of the operator's allowed prefixes
    /// ([`HTTP_ALLOW_ENV`]).
    pub url: String,
    /// Retries after a connection failure or a 5xx answer (default 2, at most 5), within the
    /// call's time limit.
    #[serde(default = "default_http_retries")]
    pub retries: u32,
}

fn default_http_retries() -> u32 {
    2
}

/// The operator's allow-list of HTTP tool endpoints: URL prefixes compared as parsed URLs
/// ([`crate::urls::AllowList`]: scheme, host and port exactly, whole decoded path segments, no
/// userinfo); empty allows none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpAllowList(AllowList);

impl HttpAllowList {
    /// The list in [`HTTP_ALLOW_ENV`] (unset: none allowed).
    pub fn from_env() -> Self {
        Self::parse(&std::env::var(HTTP_ALLOW_ENV).unwrap_or_default())
    }

    /// A list from comma-separated prefixes. A malformed list allows nothing (fail closed),
    /// and says why in the log.
    pub fn parse(list: &str) -> Self {
        match AllowList::parse(list) {
            Ok(list) => HttpAllowList(list),
            Err((entry, error)) => {
                tracing::error!(entry, %error, "{HTTP_ALLOW_ENV} is malformed; no HTTP tool is allowed");
                HttpAllowList::default()
            }
        }
    }

    /// `url` parsed and admitted by an entry, or why not.
    pub fn check(&self, url: &str) -> Result<OutboundUrl, UrlError> {
        self.0.check(url)
    }

    /// Whether `url` passes [`HttpAllowList::check`].
    pub fn allows(&self, url: &str) -> bool {
        self.0.allows(url)
    }
}

/// Limits of one call of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CallLimits {
    /// Wall-clock limit of one call, in milliseconds (default 5000).
    pub timeout_ms: u64,
    /// Address-space limit of the tool process, in MiB (default 256; python only).
    pub memory_mb: u64,
    /// Output kept from one call, in bytes (default 4096): more ends the episode.
    pub max_output_bytes: usize,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits { timeout_ms: 5000, memory_mb: 256, max_output_bytes: 4096 }
    }
}

/// One tool of the environment: a built-in or a user tool, and its per-call limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Which kind of tool.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// A user tool's function (name, description, parameters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionSchema>,
    /// A user tool's Python source, which defines the function (run in the sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// A user tool's HTTP endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpTool>,
    /// Per-call limits.
    #[serde(default)]
    pub limits: CallLimits,
}

impl ToolSpec {
    /// The name the model calls the tool by.
    pub fn name(&self) -> &str {
        match (&self.kind, &self.function) {
            (ToolKind::Function, Some(function)) => &function.name,
            (kind, _) => kind.name(),
        }
    }

    /// Checks a user tool's fields (or that a built-in has none); `at` is its JSON path.
    fn validate_kind(&self, at: &str, allow: &HttpAllowList) -> Result<(), HyperparameterError> {
        let err = |field: &str, message: String| {
            Err(HyperparameterError { param: format!("{at}.{field}"), message })
        };
        let Some(function) = &self.function else {
            if self.kind == ToolKind::Function {
                return err(
                    "function",
                    "a function tool needs its function (name, description, parameters)".into(),
                );
            }
            if self.python.is_some() || self.http.is_some() {
                let field = if self.python.is_some() { "python" } else { "http" };
                return err(field, format!("only function tools take {field}"));
            }
            return Ok(());
        };
        if self.kind != ToolKind::Function {
            return err(
                "function",
                format!("{} is built in; only function tools take function", self.kind.name()),
            );
        }
        let name = &function.name;
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return err("function.name", "must be 1-64 letters, digits, '_' or '-'".into());
        }
        if ToolKind::BUILT_IN.iter().any(|k| k.name() == name) {
            return err("function.name", format!("{name} is the name of a built-in tool"));
        }
        if let Some(parameters) = &function.parameters {
            if !parameters.is_object() {
                return err("function.parameters", "must be a JSON Schema object".into());
            }
        }
        match (&self.python, &self.http) {
            (Some(source), None) => {
                if !source.contains(&format!("def {name}")) {
                    return err(
                        "python",
                        format!("must define the function {name} (def {name}(...))"),
                    );
                }
            }
            (None, Some(http)) => {
                match allow.check(&http.url) {
                    Ok(_) => {}
                    Err(UrlError::NotAllowed) => {
                        return err(
                            "http.url",
                            format!("is not allowed by the operator ({HTTP_ALLOW_ENV})"),
                        )
                    }
                    Err(e) => return err("http.url", format!("must be an http(s) URL: {e}")),
                }
                if http.retries > MAX_HTTP_RETRIES {
                    return err("http.retries", format!("must be 0 to {MAX_HTTP_RETRIES}"));
                }
            }
            (None, None) => {
                return err(
                    "python",
                    "a function tool needs python (its source) or http (an endpoint)".into(),
                )
            }
            (Some(_), Some(_)) => return err("http", "give python or http, not both".into()),
        }
        Ok(())
    }
}

/// Limits over a whole episode (all tools together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EpisodeLimits {
    /// Most tool calls per episode (default 8); a call past it ends the episode.
    pub max_tool_calls: usize,
    /// Total tool wall time per episode, in milliseconds (default 20000).
    pub tool_time_ms: u64,
    /// Total tool output per episode, in bytes (default 16384).
    pub tool_output_bytes: usize,
}

impl Default for EpisodeLimits {
    fn default() -> Self {
        EpisodeLimits { max_tool_calls: 8, tool_time_ms: 20_000, tool_output_bytes: 16_384 }
    }
}

/// `method.reinforcement.environment`: multi-turn episodes with tools. An episode ends when the
/// model answers without a tool call, after `max_turns` assistant turns, when the trajectory
/// reaches `max_episode_tokens`, or when a tool limit is hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// Most assistant turns per episode (default 4).
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    /// The tools offered (at least one, each at most once).
    pub tools: Vec<ToolSpec>,
    /// Limits over the whole episode.
    #[serde(default)]
    pub episode_limits: EpisodeLimits,
    /// Token budget of the whole trajectory after the prompt, model and tool tokens together
    /// (default `max_turns × max_completion_tokens`); each assistant turn is also bounded by
    /// `max_completion_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_episode_tokens: Option<usize>,
    /// Whether one assistant turn may make several calls (OpenAI's `parallel_tool_calls`;
    /// default false): a Hermes-style turn then goes on after `</tool_call>` until the model
    /// ends it, and every call in it runs, in order. A Mistral call list always runs whole.
    #[serde(default)]
    pub parallel_tool_calls: bool,
}

fn default_max_turns() -> usize {
    4
}

impl Environment {
    /// The trajectory token budget, given the per-turn `max_completion_tokens`.
    pub fn max_episode_tokens(&self, max_completion_tokens: usize) -> usize {
        self.max_episode_tokens.unwrap_or(self.max_turns.saturating_mul(max_completion_tokens))
    }

    /// The tool the model calls by `name` (its index in `tools` and its spec), if the
    /// environment offers it.
    pub fn tool(&self, name: &str) -> Option<(usize, &ToolSpec)> {
        self.tools.iter().enumerate().find(|(_, t)| t.name() == name)
    }

    /// The environment with its defaults made explicit (what a job echoes).
    pub fn resolved(&self, max_completion_tokens: usize) -> Environment {
        Environment {
            max_episode_tokens: Some(self.max_episode_tokens(max_completion_tokens)),
            ..self.clone()
        }
    }

    /// Checks every field; `prefix` is this object's JSON path
    /// (`method.reinforcement.environment`).
    pub fn validate(
        &self,
        prefix: &str,
        max_completion_tokens: usize,
        allow: &HttpAllowList,
    ) -> Result<(), HyperparameterError> {
        let err = |field: &str, message: String| {
            Err(HyperparameterError { param: format!("{prefix}.{field}"), message })
        };
        if self.max_turns == 0 || self.max_turns > MAX_TURNS {
            return err("max_turns", format!("must be between 1 and {MAX_TURNS}"));
        }
        if self.tools.is_empty() {
            return err(
                "tools",
                "must offer at least one tool (calculator, python or a function)".into(),
            );
        }
        for (i, tool) in self.tools.iter().enumerate() {
            tool.validate_kind(&format!("{prefix}.tools[{i}]"), allow)?;
            if self.tools[..i].iter().any(|t| t.name() == tool.name()) {
                let field = if tool.kind == ToolKind::Function { "function.name" } else { "type" };
                return err(&format!("tools[{i}].{field}"), format!("{} twice", tool.name()));
            }
            let limits = &tool.limits;
            let at = |field: &str| format!("tools[{i}].limits.{field}");
            if limits.timeout_ms == 0 || limits.timeout_ms > MAX_CALL_TIMEOUT_MS {
                return err(&at("timeout_ms"), format!("must be 1 to {MAX_CALL_TIMEOUT_MS}"));
            }
            if limits.memory_mb < 16 || limits.memory_mb > MAX_CALL_MEMORY_MB {
                return err(&at("memory_mb"), format!("must be 16 to {MAX_CALL_MEMORY_MB}"));
            }
            if limits.max_output_bytes == 0 || limits.max_output_bytes > MAX_CALL_OUTPUT_BYTES {
                return err(
                    &at("max_output_bytes"),
                    format!("must be 1 to {MAX_CALL_OUTPUT_BYTES}"),
                );
            }
        }
        let episode = &self.episode_limits;
        if episode.max_tool_calls == 0 || episode.max_tool_calls > 256 {
            return err("episode_limits.max_tool_calls", "must be 1 to 256".into());
        }
        if episode.tool_time_ms == 0 {
            return err("episode_limits.tool_time_ms", "must be positive".into());
        }
        if episode.tool_output_bytes == 0 {
            return err("episode_limits.tool_output_bytes", "must be positive".into());
        }
        let budget = self.max_episode_tokens(max_completion_tokens);
        if budget < max_completion_tokens || budget > 131_072 {
            return err(
                "max_episode_tokens",
                format!(
                    "must be between max_completion_tokens ({max_completion_tokens}) and 131072"
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(value: serde_json::Value) -> Environment {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn defaults_resolve_and_validate() {
        let e = env(json!({"tools": [{"type": "calculator"}, {"type": "python"}]}));
        e.validate("env", 256, &HttpAllowList::default()).unwrap();
        assert_eq!(e.max_turns, 4);
        assert_eq!(e.max_episode_tokens(256), 1024);
        assert_eq!(e.tool("python").map(|(_, t)| t.limits), Some(CallLimits::default()));
        assert!(e.tool("shell").is_none());
        let resolved = e.resolved(256);
        assert_eq!(resolved.max_episode_tokens, Some(1024));
        assert_eq!(resolved.resolved(256), resolved, "idempotent");
        assert!(!e.parallel_tool_calls, "one call per Hermes turn unless asked");
        let echoed = serde_json::to_value(&resolved).unwrap();
        assert_eq!(echoed["parallel_tool_calls"], json!(false), "the job echoes the setting");
        let parallel = env(json!({"tools": [{"type": "calculator"}], "parallel_tool_calls": true}));
        assert!(parallel.parallel_tool_calls);
        assert!(serde_json::from_value::<Environment>(
            json!({"tools": [{"type": "calculator"}], "parallel_tool_calls": "yes"})
        )
        .is_err());
    }

    #[test]
    fn bad_values_name_their_json_path() {
        for (bad, field) in [
            (json!({"tools": []}), "tools"),
            (json!({"max_turns": 0, "tools": [{"type": "python"}]}), "max_turns"),
            (json!({"tools": [{"type": "python"}, {"type": "python"}]}), "tools[1].type"),
            (
                json!({"tools": [{"type": "python", "limits": {"timeout_ms": 0}}]}),
                "tools[0].limits.timeout_ms",
            ),
            (
                json!({"tools": [{"type": "calculator"}], "episode_limits": {"max_tool_calls": 0}}),
                "episode_limits.max_tool_calls",
            ),
            (
                json!({"tools": [{"type": "calculator"}], "max_episode_tokens": 10}),
                "max_episode_tokens",
            ),
            (
                json!({"tools": [{"type": "function", "python": "def f(): pass"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "calculator", "python": "def f(): pass"}]}),
                "tools[0].python",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "python"}, "python": "def python(): pass"}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}, "python": "def g(): pass"}]}),
                "tools[0].python",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
                "tools[0].python",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}, "http": {"url": "http://10.0.0.1/f"}}]}),
                "tools[0].http.url",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}, "python": "def f(): pass"},
                                 {"type": "function", "function": {"name": "f"}, "python": "def f(): pass"}]}),
                "tools[1].function.name",
            ),
        ] {
            let e = env(bad)
                .validate("method.reinforcement.environment", 64, &HttpAllowList::default())
                .unwrap_err();
            assert_eq!(e.param, format!("method.reinforcement.environment.{field}"), "{e}");
        }
        assert!(
            serde_json::from_value::<Environment>(json!({"tools": [{"type": "shell"}]})).is_err()
        );
        assert!(serde_json::from_value::<Environment>(json!({"tools": [], "turns": 3})).is_err());
    }

    #[test]
    fn user_tools_are_named_by_their_function_and_http_needs_the_allow_list() {
        let e = env(json!({"tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}},
             "python": "def lookup(key):\n    return key"},
            {"type": "function", "function": {"name": "weather"},
             "http": {"url": "http://127.0.0.1:9/weather"}}]}));
        assert_eq!(e.tool("lookup").map(|(i, t)| (i, t.name())), Some((0, "lookup")));
        assert_eq!(
            e.tool("weather").and_then(|(_, t)| t.http.as_ref()).map(|h| h.retries),
            Some(2)
        );
        let refused = e.validate("env", 64, &HttpAllowList::default()).unwrap_err();
        assert_eq!(refused.param, "env.tools[1].http.url");
        let allow = HttpAllowList::parse(" http://127.0.0.1:9/ , https://tools.internal/");
        assert!(allow.allows("https://tools.internal/x") && !allow.allows("http://127.0.0.2/"));
        e.validate("env", 64, &allow).unwrap();
    }

    #[test]
    fn http_tools_that_walk_out_of_the_allowed_prefix_are_refused() {
        let allow = HttpAllowList::parse("http://127.0.0.1:9/v1/");
        for url in [
            "http://127.0.0.1:9/v1/../internal",
            "http://127.0.0.1:9/v1/%2e%2e/internal2",
            "http://127.0.0.1:9@127.0.0.2:9/v1/",
        ] {
            let e = env(json!({"tools": [{"type": "function", "function": {"name": "t"},
                "http": {"url": url}}]}));
            let refused = e.validate("env", 64, &allow).unwrap_err();
            assert_eq!(refused.param, "env.tools[0].http.url", "{url}");
        }
        assert_eq!(
            HttpAllowList::parse("http://127.0.0.1:9/v1/, not a url"),
            HttpAllowList::default()
        );
    }
}
