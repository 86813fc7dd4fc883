//! `code`: the completion's program run against Python tests or stdin/stdout cases in the sandbox.
//!
//! With `tests`, `timeout_ms` bounds the whole run; with `cases`, it bounds each case (the run
//! gets `cases × timeout_ms`). Expected outputs never enter the sandbox: the host compares them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::result::{ErrorKind, GradeResult};
use crate::sandbox::{run_harness, RunLimits, RunOutcome, SandboxConfig};
use crate::spec::CodeScoring;

/// Time allowed on top of the limit for starting the sandbox and the interpreter.
pub const STARTUP_GRACE: Duration = Duration::from_millis(3000);
/// Stdout bytes kept per case.
const MAX_CASE_OUTPUT: usize = 1 << 20;
/// Most stdin/stdout cases per item.
const MAX_CASES: usize = 1000;

/// Longest whole sandboxed run, in milliseconds, however many cases it has: `timeout_ms` ×
/// cases is capped here (10 minutes, the longest `timeout_ms` itself).
pub const MAX_RUN_MS: u64 = 600_000;

/// Resource limits of one sandboxed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock limit in milliseconds.
    pub timeout_ms: u64,
    /// Address-space limit in MiB.
    pub memory_mb: u64,
    /// Cap on the whole run's wall-clock budget (`timeout_ms` × cases), in milliseconds.
    pub max_run_ms: u64,
}

impl Limits {
    /// Limits from optional spec values (defaults: 10 s, 512 MiB; a run at most
    /// [`MAX_RUN_MS`]).
    pub fn from_spec(timeout_ms: Option<u64>, memory_mb: Option<u64>) -> Self {
        Self {
            timeout_ms: timeout_ms.unwrap_or(10_000),
            memory_mb: memory_mb.unwrap_or(512),
            max_run_ms: MAX_RUN_MS,
        }
    }

    /// These limits with every run (and so every case) capped at `max_run_ms`.
    pub fn capped(self, max_run_ms: u64) -> Self {
        let max_run_ms = self.max_run_ms.min(max_run_ms.max(1));
        Self { timeout_ms: self.timeout_ms.min(max_run_ms), max_run_ms, ..self }
    }

    /// Run limits for a run that does `units` timed pieces of work (at most
    /// `max_run_ms` in all).
    pub fn run_limits(&self, units: u64) -> RunLimits {
        let total = self.timeout_ms.saturating_mul(units.max(1)).min(self.max_run_ms);
        let budget = Duration::from_millis(total);
        let wall = budget + STARTUP_GRACE;
        // CPU time above the wall limit: a single-threaded spin hits the wall kill (reported as
        // a time limit); the CPU limit catches only multi-threaded burners.
        RunLimits { wall, cpu_seconds: wall.as_secs() + 1, memory_bytes: self.memory_mb << 20 }
    }
}

/// The program in a completion: its last fenced code block, or the whole text when it has none.
pub fn extract_program(completion: &str) -> String {
    let fences: Vec<usize> = completion.match_indices("```").map(|(i, _)| i).collect();
    if fences.len() < 2 {
        return completion.to_string();
    }
    let pairs = fences.len() / 2;
    let (open, close) = (fences[2 * (pairs - 1)], fences[2 * (pairs - 1) + 1]);
    let block = &completion[open + 3..close];
    // drop the language tag line (```python)
    match block.split_once('\n') {
        Some((tag, body)) if !tag.trim().contains(' ') => body.to_string(),
        _ => block.to_string(),
    }
}

/// Turns a run that never got going into an infrastructure error.
pub fn startup_failure(outcome: &RunOutcome) -> Option<GradeResult> {
    if outcome.ready() {
        return None;
    }
    let stderr: String = outcome.stderr.chars().take(500).collect();
    Some(GradeResult::failed(
        ErrorKind::Sandbox,
        if outcome.timed_out {
            "the sandbox did not start before the time limit".to_string()
        } else {
            format!(
                "the sandbox did not start (exit code {:?}): {}",
                outcome.exit_code,
                stderr.trim()
            )
        },
    ))
}

/// Grades a completion's program.
pub fn grade(
    sandbox: &SandboxConfig,
    completion: &str,
    tests: Option<&str>,
    cases: Option<&Value>,
    scoring: CodeScoring,
    limits: &Limits,
) -> GradeResult {
    let program = extract_program(completion);
    match (tests, cases) {
        (Some(tests), _) => grade_tests(sandbox, &program, tests, scoring, limits),
        (None, Some(cases)) => match parse_cases(cases) {
            Ok(cases) => grade_cases(sandbox, &program, &cases, scoring, limits),
            Err(message) => GradeResult::failed(ErrorKind::BadItem, message),
        },
        (None, None) => GradeResult::failed(ErrorKind::BadItem, "no tests and no cases"),
    }
}

fn score_of(passed: usize, total: usize, scoring: CodeScoring) -> f64 {
    match scoring {
        _ if total == 0 => 0.0,
        CodeScoring::AllPass => f64::from(u8::from(passed == total)),
        CodeScoring::Fraction => passed as f64 / total as f64,
    }
}

fn ending(outcome: &RunOutcome) -> &'static str {
    if outcome.finished() {
        ""
    } else if outcome.timed_out {
        "; the run hit its time limit"
    } else {
        "; the run ended before the tests finished (exit, crash or a resource limit)"
    }
}

/// What a well-formed `tests` verdict stream says.
#[derive(Debug, Default)]
struct TestTally {
    total: usize,
    reported: usize,
    passed: usize,
    first_failure: Option<String>,
    program_error: Option<String>,
}

/// A verdict stream that breaks the harness's protocol: never a score.
pub fn malformed(why: &str) -> GradeResult {
    GradeResult::failed(
        ErrorKind::Sandbox,
        format!("the harness's verdict stream is malformed: {why}"),
    )
}

/// Reads the `tests` stream: one plan, then the tests in order (`index` 0, 1, …), each once,
/// and `done` only after all of them. `None` when no plan arrived.
fn tally_tests(outcome: &RunOutcome) -> Result<Option<TestTally>, String> {
    outcome.check_shape(&["plan", "program_error", "test"])?;
    let mut tally: Option<TestTally> = None;
    for event in outcome.events.iter().skip(1) {
        match event["event"].as_str() {
            Some("plan") => {
                if tally.is_some() {
                    return Err("a second plan".into());
                }
                let total = event["total"].as_u64().ok_or("a plan without a total")?;
                tally = Some(TestTally { total: total as usize, ..TestTally::default() });
            }
            Some("program_error") => {
                let t = tally.as_mut().ok_or("a program error before the plan")?;
                if t.reported > 0 || t.program_error.is_some() {
                    return Err("a program error after the tests began".into());
                }
                t.program_error = Some(event["message"].as_str().unwrap_or("").to_string());
            }
            Some("test") => {
                let t = tally.as_mut().ok_or("a test before the plan")?;
                if event["index"].as_u64() != Some(t.reported as u64) || t.reported >= t.total {
                    return Err("tests reported out of order, twice or beyond the plan".into());
                }
                let passed = event["passed"].as_bool().ok_or("a test without a verdict")?;
                if passed && t.program_error.is_some() {
                    return Err("a test passed although the program did not load".into());
                }
                t.reported += 1;
                if passed {
                    t.passed += 1;
                } else if t.first_failure.is_none() {
                    t.first_failure = event["message"].as_str().map(str::to_string);
                }
            }
            Some("done") if tally.as_ref().is_some_and(|t| t.reported != t.total) => {
                return Err("done before every planned test was reported".into());
            }
            _ => {}
        }
    }
    Ok(tally)
}

fn grade_tests(
    sandbox: &SandboxConfig,
    program: &str,
    tests: &str,
    scoring: CodeScoring,
    limits: &Limits,
) -> GradeResult {
    let request = json!({"mode": "tests", "program": program, "tests": tests});
    let outcome = match run_harness(sandbox, &request, &limits.run_limits(1)) {
        Ok(outcome) => outcome,
        Err(e) => return GradeResult::failed(ErrorKind::Sandbox, e.to_string()),
    };
    if let Some(failure) = startup_failure(&outcome) {
        return failure;
    }
    if let Some(e) = outcome.of_kind("tests_invalid").next() {
        return GradeResult::failed(
            ErrorKind::BadItem,
            format!("the tests do not parse: {}", e["message"]),
        );
    }
    let tally = match tally_tests(&outcome) {
        Ok(Some(tally)) => tally,
        Ok(None) => {
            return GradeResult::pass_fail(false, format!("no test ran{}", ending(&outcome)))
        }
        Err(why) => return malformed(&why),
    };
    let TestTally { total, passed, first_failure, program_error, .. } = tally;
    if total == 0 {
        return GradeResult::failed(ErrorKind::BadItem, "the tests hold no test statement");
    }
    let mut reason = format!("{passed}/{total} tests passed{}", ending(&outcome));
    if let Some(e) = program_error {
        reason.push_str(&format!("; the program failed to load: {e}"));
    } else if let Some(f) = first_failure {
        reason.push_str(&format!("; first failure: {f}"));
    }
    let score = if outcome.finished() || scoring == CodeScoring::Fraction {
        score_of(passed, total, scoring)
    } else {
        0.0
    };
    GradeResult::scored(score, reason)
        .with_sub_scores(BTreeMap::from([("pass_rate".into(), passed as f64 / total as f64)]))
}

/// One stdin/stdout case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// Text fed on stdin.
    pub input: String,
    /// Expected stdout.
    pub output: String,
}

/// Accepts an array of `{"input", "output"}` (or `stdin`/`stdout`) objects, or its JSON text.
pub fn parse_cases(value: &Value) -> Result<Vec<Case>, String> {
    let parsed;
    let value = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| format!("cases are not JSON: {e}"))?;
            &parsed
        }
        other => other,
    };
    let items = value.as_array().ok_or("cases must be a JSON array")?;
    if items.is_empty() || items.len() > MAX_CASES {
        return Err(format!("cases must hold 1..={MAX_CASES} items"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |a: &str, b: &str| {
                item.get(a).or_else(|| item.get(b)).and_then(Value::as_str).map(str::to_string)
            };
            match (field("input", "stdin"), field("output", "stdout")) {
                (Some(input), Some(output)) => Ok(Case { input, output }),
                _ => Err(format!("case {i} needs string 'input' and 'output'")),
            }
        })
        .collect()
}

/// Output compared line by line, ignoring trailing spaces and trailing blank lines.
fn normalize_output(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

fn grade_cases(
    sandbox: &SandboxConfig,
    program: &str,
    cases: &[Case],
    scoring: CodeScoring,
    limits: &Limits,
) -> GradeResult {
    let inputs: Vec<&str> = cases.iter().map(|c| c.input.as_str()).collect();
    let request = json!({
        "mode": "cases", "program": program, "inputs": inputs,
        "case_timeout_s": limits.timeout_ms as f64 / 1000.0, "max_case_output": MAX_CASE_OUTPUT,
    });
    let outcome = match run_harness(sandbox, &request, &limits.run_limits(cases.len() as u64)) {
        Ok(outcome) => outcome,
        Err(e) => return GradeResult::failed(ErrorKind::Sandbox, e.to_string()),
    };
    if let Some(failure) = startup_failure(&outcome) {
        return failure;
    }
    if let Err(why) = outcome.check_shape(&["case"]) {
        return malformed(&why);
    }
    let mut passed = 0;
    let mut first_failure = None;
    for (seen, event) in outcome.of_kind("case").enumerate() {
        let index = event["index"].as_u64();
        let Some(case) = index.filter(|&i| i == seen as u64).and_then(|i| cases.get(i as usize))
        else {
            return malformed("cases reported out of order, twice or beyond the input");
        };
        let got = event["stdout"].as_str().unwrap_or("");
        let ok =
            event["timed_out"] == false && normalize_output(got) == normalize_output(&case.output);
        if ok {
            passed += 1;
        } else if first_failure.is_none() {
            first_failure = Some(if event["timed_out"] == true {
                format!("case {seen} timed out")
            } else {
                format!("case {seen} printed the wrong output (exit code {})", event["returncode"])
            });
        }
    }
    if outcome.finished() && outcome.of_kind("case").count() != cases.len() {
        return malformed("done before every case was reported");
    }
    let total = cases.len();
    let mut reason = format!("{passed}/{total} cases passed{}", ending(&outcome));
    if let Some(f) = first_failure {
        reason.push_str(&format!("; first failure: {f}"));
    }
    GradeResult::scored(score_of(passed, total, scoring), reason)
        .with_sub_scores(BTreeMap::from([("pass_rate".into(), passed as f64 / total as f64)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_capped_whatever_its_cases_and_timeout() {
        let most = Limits::from_spec(Some(600_000), None);
        let wall = |l: Limits, units| l.run_limits(units).wall - STARTUP_GRACE;
        assert_eq!(wall(most, 1000), Duration::from_millis(MAX_RUN_MS));
        let capped = most.capped(30_000);
        assert_eq!(wall(capped, 1000), Duration::from_millis(30_000));
        assert_eq!(wall(capped, 1), Duration::from_millis(30_000));
        let small = Limits::from_spec(Some(100), None).capped(30_000);
        assert_eq!(wall(small, 3), Duration::from_millis(300));
    }

    #[test]
    fn program_is_the_last_fenced_block() {
        assert_eq!(extract_program("x = 1"), "x = 1");
        assert_eq!(
            extract_program("a\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```"),
            "print(2)\n"
        );
        assert_eq!(extract_program("```\nprint(3)\n```"), "print(3)\n");
    }

    #[test]
    fn cases_parse_from_array_or_text() {
        let v = json!([{"input": "1\n", "output": "2\n"}]);
        assert_eq!(parse_cases(&v).unwrap().len(), 1);
        assert_eq!(parse_cases(&Value::String(v.to_string())).unwrap().len(), 1);
        assert!(parse_cases(&json!([{"input": 1}])).is_err());
        assert!(parse_cases(&json!({})).is_err());
    }
}
