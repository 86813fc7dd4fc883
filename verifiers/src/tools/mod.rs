//! Tools a model calls during a multi-turn episode: [`calculator`] (arithmetic in Rust,
//! reusing the [`crate::formula`] language), [`python`] (a stateful session run in the
//! [`crate::sandbox`]) and the job's own Python functions ([`function`]), both kept in a
//! [`session`] per episode. Each call returns a [`ToolReply`]; a call that breaks a limit
//! (hangs, floods output) says so in [`ToolReply::fatal`] and the episode ends.

pub mod calculator;
pub mod function;
pub mod python;
pub mod session;

use std::time::Duration;

/// Limits of one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolLimits {
    /// Wall-clock limit of the call.
    pub timeout: Duration,
    /// Address-space limit of the tool process, in MiB.
    pub memory_mb: u64,
    /// Output bytes kept; more is a fatal flood.
    pub max_output_bytes: usize,
}

/// What one call returned, as the model reads it in its `tool` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolReply {
    /// The text the model sees as the tool result.
    pub content: String,
    /// The call failed (bad arguments, an exception in the code, a limit): counted as a tool
    /// error.
    pub error: bool,
    /// Why the episode must end after this call (a time-out or an output flood), if it must.
    pub fatal: Option<String>,
}

impl ToolReply {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> Self {
        ToolReply { content: content.into(), error: false, fatal: None }
    }

    /// A failed call the model may recover from (the message is its result).
    pub fn error(message: impl Into<String>) -> Self {
        ToolReply { content: format!("Error: {}", message.into()), error: true, fatal: None }
    }

    /// A failed call that ends the episode.
    pub fn fatal(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        ToolReply { content: format!("Error: {reason}"), error: true, fatal: Some(reason) }
    }
}
