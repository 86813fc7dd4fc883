//! `verity bench learn` as a sweep: a grid of real learning runs on a tiny random model,
//! recorded run by run, reported as a table and plots, and resumed without running a finished
//! run again.

use std::path::Path;
use std::process::{Command, Output};
use verity_worker::config::Family;
use verity_worker::trainer::testing::{
    first_token_grader, target_token_jsonl, write_tiny_model_dir,
};

fn bench_learn(dir: &Path, extra: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_verity"))
        .args(["bench", "learn", "--model"])
        .arg(dir.join("model"))
        .arg("--train")
        .arg(dir.join("train.jsonl"))
        .arg("--validation")
        .arg(dir.join("validation.jsonl"))
        .arg("--grader")
        .arg(dir.join("grader.json"))
        .arg("--hyperparameters")
        .arg(dir.join("recipe.json"))
        .arg("--out")
        .arg(dir.join("sweep"))
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output
}

#[test]
fn a_sweep_runs_the_grid_reports_it_and_resumes_without_running_finished_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_dir(&dir.path().join("model"), Family::Llama, 3).unwrap();
    std::fs::write(dir.path().join("train.jsonl"), target_token_jsonl(4)).unwrap();
    std::fs::write(dir.path().join("validation.jsonl"), target_token_jsonl(2)).unwrap();
    std::fs::write(dir.path().join("grader.json"), first_token_grader().to_string()).unwrap();
    let recipe = serde_json::json!({"batch_size": 2, "group_size": 2, "max_steps": 2,
        "max_completion_tokens": 4, "eval_interval": 1, "eval_samples": 2});
    std::fs::write(dir.path().join("recipe.json"), recipe.to_string()).unwrap();

    let grid = ["--set", "loss=grpo,dapo", "--seeds", "2"];
    let first = bench_learn(dir.path(), &grid);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(stderr.contains("4 runs in the grid, 0 finished before, 4 to run"), "{stderr}");
    let table = String::from_utf8_lossy(&first.stdout);
    for setting in ["loss=grpo", "loss=dapo"] {
        assert!(table.contains(&format!("| {setting} | 2/2 |")), "{table}");
    }
    let sweep = dir.path().join("sweep");
    for file in ["table.md", "table.json", "pass_at_1_vs_tokens.svg", "pass_at_1_vs_seconds.svg"] {
        assert!(sweep.join(file).is_file(), "{file}");
    }
    // Each run's file: its setting and seed, evaluations before and after each step with the
    // tokens generated so far, then the summary.
    let run = std::fs::read_to_string(sweep.join("runs/loss=dapo__seed=2.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> =
        run.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines[0]["kind"], "run");
    assert_eq!(lines[0]["seed"], 2);
    let evals: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "eval").collect();
    assert_eq!(evals.len(), 3, "{run}");
    let tokens: Vec<u64> = evals.iter().map(|e| e["generated_tokens"].as_u64().unwrap()).collect();
    assert!(tokens[0] == 0 && tokens[1] > 0 && tokens[2] > tokens[1], "{tokens:?}");
    let summary = lines.last().unwrap();
    assert_eq!(summary["kind"], "summary");
    assert_eq!(summary["generated_tokens"], tokens[2]);
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sweep.join("table.json")).unwrap()).unwrap();
    assert_eq!(rows[1]["curve"].as_array().unwrap().len(), 3);

    // Grown by a seed: only the new runs run; the finished ones are kept as they are.
    let before = std::fs::metadata(sweep.join("runs/loss=grpo__seed=1.jsonl")).unwrap().modified();
    let grown = bench_learn(dir.path(), &["--set", "loss=grpo,dapo", "--seed-list", "1,2,3"]);
    let stderr = String::from_utf8_lossy(&grown.stderr);
    assert!(stderr.contains("6 runs in the grid, 4 finished before, 2 to run"), "{stderr}");
    let after = std::fs::metadata(sweep.join("runs/loss=grpo__seed=1.jsonl")).unwrap().modified();
    assert_eq!(before.unwrap(), after.unwrap());
    assert!(String::from_utf8_lossy(&grown.stdout).contains("| loss=grpo | 3/3 |"));
}
