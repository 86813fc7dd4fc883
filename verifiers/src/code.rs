//! `code`: the completion's program run against tests or stdin/stdout cases in the sandbox.

use serde_json::Value;

use crate::result::{ErrorKind, GradeResult};
use crate::sandbox::SandboxConfig;
use crate::spec::CodeScoring;

/// Resource limits of one sandboxed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock limit in milliseconds.
    pub timeout_ms: u64,
    /// Address-space limit in MiB.
    pub memory_mb: u64,
}

impl Limits {
    /// Limits from optional spec values (defaults: 10 s, 512 MiB).
    pub fn from_spec(timeout_ms: Option<u64>, memory_mb: Option<u64>) -> Self {
        Self { timeout_ms: timeout_ms.unwrap_or(10_000), memory_mb: memory_mb.unwrap_or(512) }
    }
}

/// Grades a completion's program.
pub fn grade(
    _sandbox: &SandboxConfig,
    _completion: &str,
    _tests: Option<&str>,
    _cases: Option<&Value>,
    _scoring: CodeScoring,
    _limits: &Limits,
) -> GradeResult {
    GradeResult::failed(ErrorKind::Sandbox, "not implemented yet")
}
