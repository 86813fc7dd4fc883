//! Verity extension: the `environment` block of `method.reinforcement`, which turns each rollout
//! into a multi-turn episode in which the model may call sandboxed tools (OpenAI's tool-call
//! format; docs/tools.md). Absent, a rollout is one completion, exactly as before.

use serde::{Deserialize, Serialize};

use crate::spec::HyperparameterError;

/// Most assistant turns an episode may be given.
pub const MAX_TURNS: usize = 32;
/// Longest per-call time limit, in milliseconds.
const MAX_CALL_TIMEOUT_MS: u64 = 60_000;
/// Largest per-call memory limit, in MiB.
const MAX_CALL_MEMORY_MB: u64 = 4096;
/// Largest per-call output cap, in bytes.
const MAX_CALL_OUTPUT_BYTES: usize = 1 << 20;

/// A built-in tool the episode offers the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Arithmetic on numbers (`+ - * /`, parentheses, `min`, `max`, `abs`), evaluated in Rust.
    Calculator,
    /// Python code run in the bubblewrap sandbox; variables persist across the episode's calls.
    Python,
}

impl ToolKind {
    /// Every built-in tool.
    pub const ALL: [ToolKind; 2] = [ToolKind::Calculator, ToolKind::Python];

    /// The function name the model calls (`calculator`, `python`).
    pub fn name(self) -> &'static str {
        match self {
            ToolKind::Calculator => "calculator",
            ToolKind::Python => "python",
        }
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

/// One tool of the environment: a built-in and its per-call limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Which built-in tool.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// Per-call limits.
    #[serde(default)]
    pub limits: CallLimits,
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
}

fn default_max_turns() -> usize {
    4
}

impl Environment {
    /// The trajectory token budget, given the per-turn `max_completion_tokens`.
    pub fn max_episode_tokens(&self, max_completion_tokens: usize) -> usize {
        self.max_episode_tokens.unwrap_or(self.max_turns.saturating_mul(max_completion_tokens))
    }

    /// The spec of the tool the model calls by `name`, if the environment offers it.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.kind.name() == name)
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
    ) -> Result<(), HyperparameterError> {
        let err = |field: &str, message: String| {
            Err(HyperparameterError { param: format!("{prefix}.{field}"), message })
        };
        if self.max_turns == 0 || self.max_turns > MAX_TURNS {
            return err("max_turns", format!("must be between 1 and {MAX_TURNS}"));
        }
        if self.tools.is_empty() {
            return err("tools", "must offer at least one tool (calculator or python)".into());
        }
        for (i, tool) in self.tools.iter().enumerate() {
            if self.tools[..i].iter().any(|t| t.kind == tool.kind) {
                return err(&format!("tools[{i}].type"), format!("{} twice", tool.kind.name()));
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
        e.validate("env", 256).unwrap();
        assert_eq!(e.max_turns, 4);
        assert_eq!(e.max_episode_tokens(256), 1024);
        assert_eq!(e.tool("python").map(|t| t.limits), Some(CallLimits::default()));
        assert!(e.tool("shell").is_none());
        let resolved = e.resolved(256);
        assert_eq!(resolved.max_episode_tokens, Some(1024));
        assert_eq!(resolved.resolved(256), resolved, "idempotent");
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
        ] {
            let e = env(bad).validate("method.reinforcement.environment", 64).unwrap_err();
            assert_eq!(e.param, format!("method.reinforcement.environment.{field}"), "{e}");
        }
        assert!(
            serde_json::from_value::<Environment>(json!({"tools": [{"type": "shell"}]})).is_err()
        );
        assert!(serde_json::from_value::<Environment>(json!({"tools": [], "turns": 3})).is_err());
    }
}
