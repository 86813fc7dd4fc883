//! `python`: a user `grade(sample, item) -> float` run in the sandbox.

use serde_json::Value;

use crate::code::Limits;
use crate::result::{ErrorKind, GradeResult};
use crate::sample::Sample;
use crate::sandbox::SandboxConfig;

/// Runs the user's grader on one row.
pub fn grade(_sandbox: &SandboxConfig, _source: &str, _item: &Value, _sample: &Sample, _limits: &Limits) -> GradeResult {
    GradeResult::failed(ErrorKind::Sandbox, "not implemented yet")
}
