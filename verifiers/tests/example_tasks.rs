//! The example tasks in `examples/` (the tasks `verity bench learn --task` runs): every row's
//! reference answer scores 1 with the task's own grader, and a wrong answer scores 0 — for the
//! code task through the real sandbox, with its reference solutions and with programs that
//! return a constant, so its tests cannot be passed without solving the task.

use serde_json::Value;
use std::path::{Path, PathBuf};
use verity_verifiers::{Grader, Sample};

fn task(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name)
}

fn grader(task: &Path) -> Grader {
    let text = std::fs::read_to_string(task.join("grader.json")).unwrap();
    Grader::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", task.display()))
}

fn rows(task: &Path, file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(task.join(file)).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// Every row of a `reference_answer` task: `\boxed{answer}` scores 1, `\boxed{answer + 1}` 0.
fn answers_grade_exactly(name: &str) {
    let task = task(name);
    let grader = grader(&task);
    for file in ["train.jsonl", "validation.jsonl"] {
        for (line, row) in rows(&task, file).iter().enumerate() {
            let answer: i64 = row["reference_answer"].as_str().unwrap().parse().unwrap();
            let right = grader.grade(row, &Sample::from_text(format!("So \\boxed{{{answer}}}.")));
            assert_eq!(right.score, 1.0, "{name}/{file}:{} {right:?}", line + 1);
            let wrong = grader.grade(row, &Sample::from_text(format!("\\boxed{{{}}}", answer + 1)));
            assert_eq!(wrong.score, 0.0, "{name}/{file}:{} {wrong:?}", line + 1);
        }
    }
}

#[test]
fn arithmetic_rows_grade_their_reference_answers() {
    answers_grade_exactly("arithmetic");
}

#[test]
fn multistep_rows_grade_their_reference_answers() {
    answers_grade_exactly("multistep");
}

#[test]
fn held_out_rows_are_never_training_rows() {
    for name in ["arithmetic", "multistep", "code-functions", "addition", "multiplication-tools"] {
        let task = task(name);
        let prompt = |row: &Value| row["messages"].to_string();
        let train: std::collections::HashSet<String> =
            rows(&task, "train.jsonl").iter().map(prompt).collect();
        for row in rows(&task, "validation.jsonl") {
            assert!(!train.contains(&prompt(&row)), "{name}: {row}");
        }
    }
}

#[test]
fn code_task_reference_solutions_pass_and_constant_programs_fail_in_the_sandbox() {
    let task = task("code-functions");
    let grader = grader(&task);
    for (line, row) in rows(&task, "validation.jsonl").iter().enumerate() {
        let solution = row["reference_solution"].as_str().unwrap();
        let right = grader.grade(row, &Sample::from_text(format!("```python\n{solution}\n```")));
        assert_eq!(right.score, 1.0, "validation.jsonl:{} {right:?}", line + 1);
        // The same function returning each value its tests expect fails at least one test.
        let header = solution.lines().next().unwrap();
        let tests = row["tests"].as_str().unwrap();
        for expected in tests.lines().filter_map(|t| t.split(" == ").nth(1)) {
            let constant = format!("{header}\n    return {expected}");
            let wrong = grader.grade(row, &Sample::from_text(constant.clone()));
            assert_eq!(wrong.score, 0.0, "validation.jsonl:{} {constant}: {wrong:?}", line + 1);
        }
    }
}
