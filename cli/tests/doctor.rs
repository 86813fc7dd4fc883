//! `verity doctor` reports each thing Verity needs from the machine, with a fix for what is
//! missing, and fails when something is missing: here the real sandbox works, the grader
//! image's packages missing are a warning naming the install command, and a sandbox pointed at
//! a bubblewrap that does not exist is reported missing with the command to fix it.

use serde_json::Value;
use std::process::Command;

fn doctor(envs: &[(&str, &str)]) -> (bool, Vec<Value>) {
    let data = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_verity"))
        .args(["doctor", "--json", "--data-dir"])
        .arg(data.path())
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let checks = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (output.status.success(), checks)
}

fn check<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} in {checks:?}"))
}

#[test]
fn doctor_reports_every_check_and_names_the_fix_for_a_missing_sandbox() {
    let (ok, checks) = doctor(&[]);
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "blas",
            "sandbox",
            "grader_packages",
            "postgres",
            "memory",
            "disk",
            "demo_model",
            "embedding_model"
        ]
    );
    assert_eq!(check(&checks, "sandbox")["status"], "ok", "{checks:?}");
    assert_eq!(check(&checks, "postgres")["status"], "ok", "DATABASE_URL is set");
    assert!(ok, "nothing is missing: {checks:?}");
    for c in &checks {
        assert!(c["detail"].as_str().is_some_and(|d| !d.is_empty()), "{c}");
        assert_eq!(c["status"] == "ok", c["fix"].is_null(), "a problem comes with its fix: {c}");
    }

    // the grader image's packages: a layer folder that holds none is a warning with the command
    let empty = tempfile::tempdir().unwrap();
    let (_, checks) = doctor(&[("VERITY_GRADER_PACKAGES", empty.path().to_str().unwrap())]);
    let packages = check(&checks, "grader_packages");
    assert_eq!(packages["status"], "warn", "{packages}");
    assert!(packages["fix"].as_str().unwrap().contains("verity graders install-packages"));

    let (ok, checks) = doctor(&[("VERITY_SANDBOX_BWRAP", "/nonexistent/bwrap")]);
    let sandbox = check(&checks, "sandbox");
    assert_eq!(sandbox["status"], "missing", "{sandbox}");
    assert!(sandbox["fix"].as_str().unwrap().contains("apt install bubblewrap"), "{sandbox}");
    assert!(!ok, "doctor fails when something is missing");
}
