//! `python`: a stateful Python session in the bubblewrap sandbox.
//!
//! One sandbox per episode (started at the first call, [`super::session`]) keeps an interpreter
//! whose variables, functions and imports persist across the episode's calls. Each call is a
//! notebook cell: its stdout and stderr, and the `repr` of a final expression, are the result;
//! an exception's last line ends a failed call's result (a tool error the model may recover
//! from). Running past the per-call time limit or printing more than the output cap ends the
//! episode.

use std::time::Duration;

use serde_json::{json, Value};

use super::session::ToolSession;
use super::{ToolLimits, ToolReply};
use crate::sandbox::SandboxConfig;

/// The python tool's function schema, in OpenAI's `tools` format.
pub fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": "python",
        "description": "Runs Python code; variables persist between calls. Prints stdout and the value of the last expression.",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "Python source"}},
            "required": ["code"]}}})
}

/// One episode's Python session.
pub struct PythonSession {
    session: ToolSession,
}

impl PythonSession {
    /// A session with nothing run yet; its processes may use `cpu_budget` of CPU in all.
    pub fn new(cpu_budget: Duration) -> Self {
        PythonSession { session: ToolSession::new(Vec::new(), cpu_budget) }
    }

    /// Runs one call (`{"code": "..."}`) under `limits`.
    pub fn call(
        &mut self,
        sandbox: &SandboxConfig,
        arguments: &Value,
        limits: &ToolLimits,
    ) -> ToolReply {
        let Some(code) = arguments.get("code").and_then(Value::as_str) else {
            return ToolReply::error("python takes {\"code\": \"...\"}");
        };
        self.session.call(sandbox, &json!({ "code": code }), limits)
    }

    /// Cells run so far.
    pub fn cells(&self) -> usize {
        self.session.calls()
    }
}
