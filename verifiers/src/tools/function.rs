//! User tools defined in the job as Python functions: the tool's source is loaded once per
//! episode into its own sandbox session ([`super::session`], separate from the model's
//! `python` session, so model code cannot redefine it), and each call is `name(**arguments)`.
//! A string result is the tool result as is; other plain data comes back as JSON.

use std::time::Duration;

use serde_json::{json, Value};

use super::session::ToolSession;
use super::{ToolLimits, ToolReply};
use crate::sandbox::SandboxConfig;

/// One user tool's session over an episode.
pub struct FunctionSession {
    session: ToolSession,
}

impl FunctionSession {
    /// A session that loads `source` (which defines the tool's function) at its first call.
    pub fn new(source: &str, cpu_budget: Duration) -> Self {
        FunctionSession { session: ToolSession::new(vec![source.to_string()], cpu_budget) }
    }

    /// Calls `name(**arguments)` under `limits`.
    pub fn call(
        &mut self,
        sandbox: &SandboxConfig,
        name: &str,
        arguments: &Value,
        limits: &ToolLimits,
    ) -> ToolReply {
        if !arguments.is_object() {
            return ToolReply::error(format!("{name} takes its arguments as a JSON object"));
        }
        self.session.call(sandbox, &json!({"function": name, "arguments": arguments}), limits)
    }
}
