//! `python`: a user `grade(sample, item) -> float` run in the sandbox, with the grader image's
//! packages ([`crate::sandbox::packages`]).
//!
//! The grader's own failures (exception, non-number, time limit) are errors, not zero scores.

use serde_json::{json, Value};

use crate::code::{malformed, startup_failure, Limits};
use crate::result::{ErrorKind, GradeResult};
use crate::sample::Sample;
use crate::sandbox::{packages, run_harness, RunOutcome, SandboxConfig};

/// Runs the user's grader on one row.
pub fn grade(
    sandbox: &SandboxConfig,
    source: &str,
    item: &Value,
    sample: &Sample,
    limits: &Limits,
) -> GradeResult {
    let sandbox = packages::for_python_grader(sandbox, source);
    let outcome = match run(&sandbox, source, item, sample, limits) {
        Ok(outcome) => outcome,
        Err(failure) => return *failure,
    };
    if let Some(e) = outcome.of_kind("grade_error").next() {
        return GradeResult::failed(ErrorKind::GraderCode, error_message(&sandbox, e));
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

/// Runs the grader once on `item` and an empty sample, as OpenAI's validation does: an error
/// loading the source (a syntax error, a failed import, no `grade`) or an import failing in
/// `grade()` is the message returned. Anything else — `grade()` failing on the trial data, a
/// time-out, a sandbox that cannot start — is no verdict on the source and passes.
pub fn trial(
    sandbox: &SandboxConfig,
    source: &str,
    item: &Value,
    limits: &Limits,
) -> Result<(), String> {
    let sandbox = packages::for_python_grader(sandbox, source);
    let Ok(outcome) = run(&sandbox, source, item, &Sample::from_text(""), limits) else {
        return Ok(());
    };
    let Some(e) = outcome.of_kind("grade_error").next() else { return Ok(()) };
    let message = error_message(&sandbox, e);
    let import = message.starts_with("ModuleNotFoundError") || message.starts_with("ImportError");
    match e["phase"].as_str() {
        Some("load") => Err(format!("the source does not load: {message}")),
        _ if import => Err(format!("grade() fails to import: {message}")),
        _ => Ok(()),
    }
}

/// One harness run of the grader; a failure to run is the grading's result.
fn run(
    sandbox: &SandboxConfig,
    source: &str,
    item: &Value,
    sample: &Sample,
    limits: &Limits,
) -> Result<RunOutcome, Box<GradeResult>> {
    let request =
        json!({"mode": "grade", "program": source, "sample": sample.to_json(), "item": item});
    let outcome = run_harness(sandbox, &request, &limits.run_limits(1))
        .map_err(|e| GradeResult::failed(ErrorKind::Sandbox, e.to_string()))?;
    if let Some(failure) = startup_failure(&outcome) {
        return Err(Box::new(failure));
    }
    if let Err(why) = outcome.check_shape(&["grade", "grade_error"]) {
        return Err(Box::new(malformed(&why)));
    }
    if outcome.of_kind("grade").count() + outcome.of_kind("grade_error").count() > 1 {
        return Err(Box::new(malformed("more than one result")));
    }
    Ok(outcome)
}

/// A `grade_error` event's message, with how to get a missing module of the grader image.
fn error_message(sandbox: &SandboxConfig, event: &Value) -> String {
    let message = event["message"].as_str().unwrap_or("grade() failed").to_string();
    match packages::missing_module_hint(&message, sandbox.grader_packages.as_deref()) {
        Some(hint) => format!("{message} ({hint})"),
        None => message,
    }
}
