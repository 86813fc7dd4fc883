//! Grading local files: `graders run`, `graders validate` and `bench graders`.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;

use verity_verifiers::grader::Grader;
use verity_verifiers::math;
use verity_verifiers::pool::GraderPool;
use verity_verifiers::result::{ErrorKind, GradeResult};
use verity_verifiers::sample::Sample;
use verity_verifiers::spec::MathExtract;
use verity_verifiers::template::item_has_path;

/// Rows read and graded per batch by [`run_jsonl`] (per worker).
const ROWS_PER_WORKER: usize = 16;
/// Most dataset problems listed by [`validate`].
const MAX_REPORTED: usize = 100;

/// `graders run` could not read its input or write its output.
#[derive(Debug, Error)]
pub enum RunError {
    /// Reading input or writing output failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A result could not be serialised.
    #[error("cannot write a result: {0}")]
    Json(#[from] serde_json::Error),
}

/// One input line of `graders run`.
#[derive(Debug, Deserialize)]
struct InputRow {
    #[serde(default)]
    item: Value,
    sample: Sample,
}

/// Totals of a `graders run`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunSummary {
    /// Result lines written.
    pub rows: usize,
    /// Mean score over rows without an error.
    pub mean_score: f64,
    /// Rows whose grading failed, by error kind (infrastructure failures are never scores).
    pub errors: BTreeMap<ErrorKind, usize>,
    /// Wall time in seconds.
    pub elapsed_s: f64,
}

/// Grades each JSONL line `{"item": {...}, "sample": {"output_text": "..."}}` and writes one
/// JSON result per line, in input order, with up to `jobs` gradings in parallel (0 = cores).
/// A malformed line yields a `bad_item` error result for that line; blank lines are skipped.
pub fn run_jsonl(
    grader: &Grader,
    input: impl BufRead,
    mut out: impl Write,
    jobs: usize,
) -> Result<RunSummary, RunError> {
    let started = Instant::now();
    let pool = GraderPool::new(jobs);
    let chunk = pool.workers() * ROWS_PER_WORKER;
    let mut summary = RunSummary::default();
    let mut score_sum = 0.0;
    let mut scored = 0usize;
    let mut lines = input.lines().enumerate();
    loop {
        // each entry: Ok(row) to grade or Err(result) already decided
        let mut batch: Vec<Result<(Value, Sample), GradeResult>> = Vec::with_capacity(chunk);
        for (index, line) in lines.by_ref() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            batch.push(match serde_json::from_str::<InputRow>(&line) {
                Ok(row) => Ok((row.item, row.sample)),
                Err(e) => {
                    Err(GradeResult::failed(ErrorKind::BadItem, format!("line {}: {e}", index + 1)))
                }
            });
            if batch.len() == chunk {
                break;
            }
        }
        if batch.is_empty() {
            break;
        }
        let rows: Vec<(Value, Sample)> =
            batch.iter().filter_map(|r| r.as_ref().ok().cloned()).collect();
        let mut graded = pool.grade_batch_blocking(grader, &rows).into_iter();
        for entry in batch {
            let result = match entry {
                Ok(_) => graded
                    .next()
                    .unwrap_or_else(|| GradeResult::failed(ErrorKind::Internal, "missing result")),
                Err(result) => result,
            };
            match &result.error {
                Some(e) => *summary.errors.entry(e.kind).or_insert(0) += 1,
                None => {
                    score_sum += result.score;
                    scored += 1;
                }
            }
            serde_json::to_writer(&mut out, &result)?;
            out.write_all(b"\n")?;
            summary.rows += 1;
        }
        out.flush()?;
    }
    summary.mean_score = if scored == 0 { 0.0 } else { score_sum / scored as f64 };
    summary.elapsed_s = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// One problem found by [`validate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidationIssue {
    /// JSON path inside the grader (`graders.acc.reference`) or the dataset field (`item.answer`).
    pub path: String,
    /// Dataset line (1-based) for dataset problems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// The outcome of `graders validate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidationReport {
    /// No problem found.
    pub valid: bool,
    /// The problems (dataset problems are capped at 100).
    pub errors: Vec<ValidationIssue>,
    /// Dataset rows checked.
    pub rows_checked: usize,
}

/// Checks a grader spec and, optionally, that every dataset row has the fields it reads.
pub fn validate(grader_json: &str, dataset: Option<&Path>) -> ValidationReport {
    let mut report = ValidationReport { valid: true, errors: Vec::new(), rows_checked: 0 };
    let grader = match Grader::from_json(grader_json) {
        Ok(g) => g,
        Err(invalid) => {
            report.errors = invalid
                .0
                .into_iter()
                .map(|e| ValidationIssue { path: e.path, line: None, message: e.message })
                .collect();
            report.valid = false;
            return report;
        }
    };
    if let Some(path) = dataset {
        check_dataset(&grader, path, &mut report);
    }
    // As the API's validate (and OpenAI's): every python grader runs once in the sandbox, so a
    // source that does not load or fails an import is reported here, not at the first grading.
    if let Err((path, message)) = grader.python_trial(&Value::Object(Default::default())) {
        report.errors.push(ValidationIssue { path, line: None, message });
    }
    report.valid = report.errors.is_empty();
    report
}

fn check_dataset(grader: &Grader, path: &Path, report: &mut ValidationReport) {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => {
            report.errors.push(ValidationIssue {
                path: "dataset".into(),
                line: None,
                message: format!("{}: {e}", path.display()),
            });
            return;
        }
    };
    let fields = grader.item_fields();
    let push = |report: &mut ValidationReport, issue: ValidationIssue| {
        if report.errors.len() < MAX_REPORTED {
            report.errors.push(issue);
        }
    };
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line_no = index + 1;
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                push(
                    report,
                    ValidationIssue {
                        path: "dataset".into(),
                        line: Some(line_no),
                        message: e.to_string(),
                    },
                );
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        report.rows_checked += 1;
        let item: Value = match serde_json::from_str(&line) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                push(
                    report,
                    ValidationIssue {
                        path: "item".into(),
                        line: Some(line_no),
                        message: "a row must be a JSON object".into(),
                    },
                );
                continue;
            }
            Err(e) => {
                push(
                    report,
                    ValidationIssue {
                        path: "item".into(),
                        line: Some(line_no),
                        message: format!("invalid JSON: {e}"),
                    },
                );
                continue;
            }
        };
        for field in &fields {
            if !item_has_path(&item, field) {
                let dotted = format!("item.{}", field.join("."));
                push(
                    report,
                    ValidationIssue {
                        path: dotted.clone(),
                        line: Some(line_no),
                        message: format!("missing field '{dotted}'"),
                    },
                );
            }
        }
    }
}

/// Sizes of `verity bench graders`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchOptions {
    /// Parallel gradings (0 = cores).
    pub jobs: usize,
    /// Passes over the math case table.
    pub math_rounds: usize,
    /// Sandboxed gradings per code workload.
    pub code_gradings: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { jobs: 0, math_rounds: 20, code_gradings: 40 }
    }
}

/// A trivial program and its test.
const TRIVIAL_PROGRAM: &str = "def f():\n    return 1\n";
const TRIVIAL_TESTS: &str = "assert f() == 1\n";

/// A HumanEval-sized task (HumanEval/0-like): a completion with prose and a fenced block, 7 asserts.
const HUMANEVAL_PROGRAM: &str = "Here is my solution.\n\n```python\nfrom typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    \"\"\"Check if in given list of numbers, are any two numbers closer to each other than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    \"\"\"\n    ordered = sorted(numbers)\n    for left, right in zip(ordered, ordered[1:]):\n        if abs(left - right) < threshold:\n            return True\n    return False\n```\n";
const HUMANEVAL_TESTS: &str = "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False\n    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True\n    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True\n    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False\n\ncheck(has_close_elements)\n";

fn bench_code(pool: &GraderPool, program: &str, tests: &str, gradings: usize) -> Value {
    let grader =
        match Grader::from_json(&json!({"type": "code", "tests": "{{item.tests}}"}).to_string()) {
            Ok(g) => g,
            Err(e) => return json!({"error": e.to_string()}),
        };
    let rows: Vec<(Value, Sample)> = (0..gradings.max(1))
        .map(|_| (json!({"tests": tests}), Sample::from_text(program)))
        .collect();
    let started = Instant::now();
    let results = pool.grade_batch_blocking(&grader, &rows);
    let elapsed = started.elapsed().as_secs_f64();
    let passed = results.iter().filter(|r| r.score == 1.0).count();
    let errors = results.iter().filter(|r| r.error.is_some()).count();
    json!({
        "gradings": rows.len(), "passed": passed, "errors": errors, "seconds": elapsed,
        "gradings_per_s": rows.len() as f64 / elapsed, "first_reason": results.first().map(|r| r.reason.clone()),
    })
}

/// Measures math gradings/s (the case table, one thread and the pool) and sandboxed code
/// gradings/s (a trivial program and a HumanEval-sized one) on this machine.
pub fn bench(options: &BenchOptions) -> Value {
    let pool = GraderPool::new(options.jobs);
    let cases = math::cases::table();
    let completions: Vec<(String, String)> =
        cases.iter().map(|c| (c.completion(), c.reference.clone())).collect();
    let rounds = options.math_rounds.max(1);
    let started = Instant::now();
    let mut agree = 0;
    for round in 0..rounds {
        for (case, (completion, reference)) in cases.iter().zip(&completions) {
            let r = math::grade(completion, reference, MathExtract::Auto);
            if round == 0 && (r.score == 1.0) == case.expected {
                agree += 1;
            }
        }
    }
    let single = started.elapsed().as_secs_f64();
    let math_grader = Grader::from_json(r#"{"type":"math","reference":"{{item.reference}}"}"#);
    let pool_rate = math_grader.map(|grader| {
        let rows: Vec<(Value, Sample)> = (0..rounds)
            .flat_map(|_| {
                completions
                    .iter()
                    .map(|(c, r)| (json!({"reference": r}), Sample::from_text(c.clone())))
            })
            .collect();
        let started = Instant::now();
        let results = pool.grade_batch_blocking(&grader, &rows);
        results.len() as f64 / started.elapsed().as_secs_f64()
    });
    json!({
        "jobs": pool.workers(),
        "math": {
            "cases": cases.len(), "rounds": rounds, "table_agreement": agree as f64 / cases.len().max(1) as f64,
            "single_thread_gradings_per_s": (cases.len() * rounds) as f64 / single,
            "pool_gradings_per_s": pool_rate.ok(),
        },
        "code_trivial": bench_code(&pool, TRIVIAL_PROGRAM, TRIVIAL_TESTS, options.code_gradings),
        "code_humaneval": bench_code(&pool, HUMANEVAL_PROGRAM, HUMANEVAL_TESTS, options.code_gradings),
    })
}
