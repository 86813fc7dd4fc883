//! `python`: a user `grade(sample, item) -> float` run in the sandbox.
//!
//! The grader's own failures (exception, non-number, time limit) are errors, not zero scores.

use serde_json::{json, Value};

use crate::code::{malformed, startup_failure, Limits};
use crate::result::{ErrorKind, GradeResult};
use crate::sample::Sample;
use crate::sandbox::{run_harness, SandboxConfig};

/// Runs the user's grader on one row.
pub fn grade(
    sandbox: &SandboxConfig,
    source: &str,
    item: &Value,
    sample: &Sample,
    limits: &Limits,
) -> GradeResult {
    let request =
        json!({"mode": "grade", "program": source, "sample": sample.to_json(), "item": item});
    let outcome = match run_harness(sandbox, &request, &limits.run_limits(1)) {
        Ok(outcome) => outcome,
        Err(e) => return GradeResult::failed(ErrorKind::Sandbox, e.to_string()),
    };
    if let Some(failure) = startup_failure(&outcome) {
        return failure;
    }
    if let Err(why) = outcome.check_shape(&["grade", "grade_error"]) {
        return malformed(&why);
    }
    if outcome.of_kind("grade").count() + outcome.of_kind("grade_error").count() > 1 {
        return malformed("more than one result");
    }
    if let Some(e) = outcome.of_kind("grade_error").next() {
        return GradeResult::failed(
            ErrorKind::GraderCode,
            e["message"].as_str().unwrap_or("grade() failed").to_string(),
        );
    }
    let score = outcome.of_kind("grade").next().and_then(|e| e["score"].as_f64());
    match score {
        Some(score) if score.is_finite() => {
            let note = if (0.0..=1.0).contains(&score) { "" } else { " (clamped to [0, 1])" };
            GradeResult::scored(score, format!("grade() returned {score}{note}"))
        }
        Some(_) => {
            GradeResult::failed(ErrorKind::GraderCode, "grade() returned a non-finite number")
        }
        None if outcome.timed_out => {
            GradeResult::failed(ErrorKind::Timeout, "grade() ran past its time limit")
        }
        None => GradeResult::failed(
            ErrorKind::GraderCode,
            format!("grade() ended without a result (exit code {:?})", outcome.exit_code),
        ),
    }
}
