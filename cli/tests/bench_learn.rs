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

/// Writes a task folder (rows, grader, recipe and a calculator environment) for the tiny model.
fn write_tool_task(task: &Path) {
    std::fs::create_dir_all(task).unwrap();
    std::fs::write(task.join("train.jsonl"), target_token_jsonl(4)).unwrap();
    std::fs::write(task.join("validation.jsonl"), target_token_jsonl(2)).unwrap();
    std::fs::write(task.join("grader.json"), first_token_grader().to_string()).unwrap();
    let recipe = serde_json::json!({"batch_size": 2, "group_size": 2, "max_steps": 2,
        "max_completion_tokens": 4, "eval_samples": 1});
    std::fs::write(task.join("recipe.json"), recipe.to_string()).unwrap();
    let environment = serde_json::json!({"max_turns": 2, "tools": [{"type": "calculator"}]});
    std::fs::write(task.join("environment.json"), environment.to_string()).unwrap();
}

fn verity(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_verity")).args(args).output().unwrap()
}

#[test]
fn a_task_folder_supplies_every_input_and_its_environment_makes_the_rollouts_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_tiny_model_dir(&model, Family::Llama, 3).unwrap();
    let task = dir.path().join("task");
    write_tool_task(&task);
    let learn = ["bench", "learn", "--model"].map(std::ffi::OsStr::new);
    let run =
        verity(&[&learn[..], &[model.as_os_str(), "--task".as_ref(), task.as_os_str()]].concat());
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "step").collect();
    assert_eq!(steps.len(), 2, "{lines:?}");
    for step in steps {
        // Episodes with tools: every step line carries the tool metrics.
        let turns = step["turns_per_episode"].as_f64().expect("turns_per_episode");
        assert!((1.0..=2.0).contains(&turns), "{step}");
        assert!(step["tool_calls_per_episode"].is_number(), "{step}");
    }
    assert_eq!(lines.last().unwrap()["kind"], "summary");

    // --eval-only scores the model on the held-out rows once, and trains nothing.
    let eval_only = ["--task".as_ref(), task.as_os_str(), "--eval-only".as_ref()];
    let scored = verity(&[&learn[..], &[model.as_os_str()], &eval_only[..]].concat());
    assert!(scored.status.success(), "{}", String::from_utf8_lossy(&scored.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&scored.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["eval", "summary"], "{lines:?}");
    assert_eq!(lines[1]["steps"], 0);
    assert_eq!(lines[1]["generated_tokens"], 0);
    assert!(lines[1]["validation_pass_at_1_before"].is_number(), "{}", lines[1]);

    // A sweep records the environment: the same folder with another environment is refused.
    let out = dir.path().join("sweep");
    let sweep = |out: &std::path::Path, extra: &[&std::ffi::OsStr]| {
        let args = [
            model.as_os_str(),
            "--task".as_ref(),
            task.as_os_str(),
            "--seeds".as_ref(),
            "1".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ];
        verity(&[&learn[..], &args[..], extra].concat())
    };
    let first = sweep(&out, &[]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let other = dir.path().join("other-environment.json");
    std::fs::write(&other, r#"{"max_turns": 3, "tools": [{"type": "calculator"}]}"#).unwrap();
    let refused = sweep(&out, &["--environment".as_ref(), other.as_os_str()]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("another tool environment"), "{stderr}");

    // An environment a job would refuse is refused before the sweep's folder is created,
    // naming the file and the field.
    std::fs::write(&other, r#"{"max_turns": 0, "tools": [{"type": "calculator"}]}"#).unwrap();
    let fresh = dir.path().join("fresh-sweep");
    let invalid = sweep(&fresh, &["--environment".as_ref(), other.as_os_str()]);
    assert!(!invalid.status.success());
    let stderr = String::from_utf8_lossy(&invalid.stderr);
    assert!(
        stderr.contains("other-environment.json") && stderr.contains("environment.max_turns"),
        "{stderr}"
    );
    assert!(!fresh.exists());

    // A malformed environment is named before anything runs.
    std::fs::write(&other, r#"{"max_turns": "three"}"#).unwrap();
    let single = ["--environment".as_ref(), other.as_os_str()];
    let bad = verity(
        &[&learn[..], &[model.as_os_str(), "--task".as_ref(), task.as_os_str()], &single[..]]
            .concat(),
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("other-environment.json"), "{stderr}");
}
