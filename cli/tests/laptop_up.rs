//! Laptop mode end to end with real processes: `verity up` with no DATABASE_URL (a private
//! Postgres cluster in a temp data dir), then the real CLI client against it — uploads,
//! `models import`, a job watched to success, checkpoint download, pause/resume/cancel — then
//! SIGTERM (the cluster stops) and a restart on the same dir that still has the job and the key
//! and limits failed sign-ins per client address.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use verity_worker::trainer::testing::{
    first_token_grader, target_token_jsonl, write_tiny_model_dir,
};
use verity_worker::Family;

/// A running `verity up`, killed on drop.
struct Up {
    child: Child,
    base: String,
    lines: Vec<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn verity() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_verity"));
    command
        .env_remove("DATABASE_URL")
        .env_remove("VERITY_API_KEY")
        .env_remove("VERITY_STORAGE")
        .env("RUST_LOG", "warn");
    command
}

/// Starts `verity up` on `data` and waits for its banner and for `/readyz`.
async fn start_up(data: &Path) -> Up {
    start_up_with(data, Stdio::inherit()).await
}

/// [`start_up`] with the process's stderr sent to `stderr`.
async fn start_up_with(data: &Path, stderr: Stdio) -> Up {
    let up = launch(data, &[], stderr).await;
    let http = reqwest::Client::new();
    let started = Instant::now();
    // Ready means the database, the store and the embedded worker's claim loop.
    loop {
        if let Ok(reply) = http.get(format!("{}/readyz", up.base)).send().await {
            if reply.status().is_success() {
                let body: Value = reply.json().await.unwrap();
                assert_eq!(body["checks"]["worker"]["status"], "running", "{body}");
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "/readyz never answered 200");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    up
}

/// Starts `verity up` on `data` with `extra` flags and waits for its banner.
async fn launch(data: &Path, extra: &[&str], stderr: Stdio) -> Up {
    let mut child = verity()
        .args(["up", "--port", "0", "--data-dir"])
        .arg(data)
        .args(extra)
        .env("VERITY_LEASE_SECONDS", "4")
        .env("VERITY_POLL_MS", "500")
        .env("VERITY_GRADER_WORKERS", "1")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawning verity up");
    let stdout = child.stdout.take().unwrap();
    let (lines, base) = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut base = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if let Some(url) = line.trim().strip_prefix("Verity is up: ") {
                base = Some(url.to_string());
            }
            let done = line.contains("(stop with ctrl-c)");
            lines.push(line.trim_end().to_string());
            if done {
                break;
            }
        }
        // Keep draining stdout so the process never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        (lines, base)
    })
    .await
    .unwrap();
    let base = base.unwrap_or_else(|| panic!("verity up printed no address: {lines:?}"));
    Up { child, base, lines }
}

/// Runs a client command against `up` (the key comes from the data dir).
async fn cli(up: &Up, data: &Path, args: &[&str]) -> Output {
    let mut command = verity();
    command.args(args).env("VERITY_URL", &up.base).env("VERITY_DATA_DIR", data);
    tokio::task::spawn_blocking(move || command.output().expect("running the verity CLI"))
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn ok(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        stdout(&output)
    );
    stdout(&output)
}

async fn job_json(up: &Up, data: &Path, id: &str) -> Value {
    serde_json::from_str(&ok(cli(up, data, &["jobs", "show", id, "--json"]).await, "jobs show"))
        .unwrap()
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "verity up did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn verity_up_runs_a_private_cluster_and_the_cli_drives_a_job() {
    let data_dir = tempfile::tempdir().unwrap();
    let data = data_dir.path().to_path_buf();
    let work = tempfile::tempdir().unwrap();
    let mut up = start_up(&data).await;
    assert!(up.lines.iter().any(|l| l.contains("admin API key (shown once")), "{:?}", up.lines);
    let key_file = data.join("admin-key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    let key = std::fs::read_to_string(&key_file).unwrap();
    assert!(up.lines.iter().any(|l| l.contains(key.trim())), "the key is printed once");

    // Files: a good upload prints the id; a bad one exits non-zero naming the line.
    let train = write(work.path(), "train.jsonl", &target_token_jsonl(6));
    let valid = write(work.path(), "valid.jsonl", &target_token_jsonl(3));
    let bad = write(work.path(), "bad.jsonl", "{\"prompt\": 3}\n");
    let train_id =
        ok(cli(&up, &data, &["files", "upload", train.to_str().unwrap()]).await, "upload");
    let valid_id =
        ok(cli(&up, &data, &["files", "upload", valid.to_str().unwrap()]).await, "upload");
    assert!(train_id.starts_with("file-"), "{train_id}");
    let rejected = cli(&up, &data, &["files", "upload", bad.to_str().unwrap()]).await;
    assert!(!rejected.status.success());
    let message = String::from_utf8_lossy(&rejected.stderr);
    assert!(
        message.contains("rejected") && message.contains("line 1") && message.contains("prompt"),
        "{message}"
    );
    let listed = ok(cli(&up, &data, &["files", "list"]).await, "files list");
    assert!(listed.contains(&train_id) && listed.contains("processed"), "{listed}");

    // models import into the private cluster and local store of `up`.
    let model_dir = work.path().join("tiny");
    write_tiny_model_dir(&model_dir, Family::Llama, 3).unwrap();
    let database_url = verity_cli::commands::postgres_cluster::database_url_for(&data.join("pg"));
    let import = |args: Vec<String>| {
        let mut command = verity();
        command
            .arg("models")
            .arg("import")
            .args(args)
            .env("DATABASE_URL", &database_url)
            .env("VERITY_STORAGE", data.join("objects"));
        command
    };
    let empty = work.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let refused =
        import(vec!["--name".into(), "broken".into(), "--hf".into(), empty.display().to_string()])
            .output()
            .unwrap();
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("does not load"),
        "{refused:?}"
    );
    ok(
        import(vec![
            "--name".into(),
            "tiny".into(),
            "--hf".into(),
            model_dir.display().to_string(),
            "--hub-id".into(),
            "acme/Tiny-1".into(),
        ])
        .output()
        .unwrap(),
        "models import",
    );
    assert!(data.join("objects/models/tiny/manifest.json").is_file());
    // `models hub-id`: again for the same model is fine; a model that does not exist gets none
    // (that another model of the scope cannot take it is tested in api_router.rs).
    let hub_id = |name: &str| {
        let mut command = verity();
        command.args(["models", "hub-id", name, "acme/Tiny-1"]).env("DATABASE_URL", &database_url);
        command.output().unwrap()
    };
    ok(hub_id("tiny"), "models hub-id");
    let missing = hub_id("other");
    assert!(
        !missing.status.success()
            && String::from_utf8_lossy(&missing.stderr).contains("no model named \"other\""),
        "{missing:?}"
    );
    let again = import(vec![
        "--name".into(),
        "tiny".into(),
        "--hf".into(),
        model_dir.display().to_string(),
    ])
    .output()
    .unwrap();
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("already exists")
    );

    // A short job (the model named by its hub id), watched to success.
    let method = |steps: u32| {
        serde_json::json!({"model": "acme/Tiny-1", "method": {"type": "reinforcement", "reinforcement": {
            "grader": first_token_grader(),
            "hyperparameters": {"batch_size": 2, "group_size": 4, "max_steps": steps, "max_completion_tokens": 8,
                                "checkpoint_interval": 2, "learning_rate": 0.01}}}})
        .to_string()
    };
    let spec = write(work.path(), "job.json", &method(4));
    let spec = spec.to_str().unwrap();
    let create = [
        "jobs",
        "create",
        "--file",
        spec,
        "--training-file",
        &train_id,
        "--validation-file",
        &valid_id,
    ];
    let job = ok(cli(&up, &data, &create).await, "jobs create");
    assert!(job.starts_with("ftjob-"), "{job}");
    let watched = ok(cli(&up, &data, &["jobs", "watch", &job]).await, "jobs watch");
    assert!(watched.contains("training finished after 4 steps"), "{watched}");
    let listed = ok(cli(&up, &data, &["jobs", "list"]).await, "jobs list");
    assert!(listed.lines().any(|l| l.starts_with(&job) && l.contains("succeeded")), "{listed}");
    assert_eq!(job_json(&up, &data, &job).await["status"], "succeeded");
    let missing = cli(&up, &data, &["jobs", "show", "ftjob-nope"]).await;
    assert!(
        !missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("404"),
        "{missing:?}"
    );

    // Checkpoint downloads, verified against the stored manifest: weights only by default,
    // the optimizer state with --with-trainer-state.
    for (step, out, trainer_state) in [(None, "latest", false), (Some("2"), "step2", true)] {
        let out = work.path().join(out);
        let mut args = vec!["checkpoints", "download", &job, "--out", out.to_str().unwrap()];
        if let Some(step) = step {
            args.extend(["--step", step]);
        }
        if trainer_state {
            args.push("--with-trainer-state");
        }
        ok(cli(&up, &data, &args).await, "checkpoints download");
        let n = step.unwrap_or("4");
        let stored: Value = serde_json::from_slice(
            &std::fs::read(
                data.join(format!("objects/jobs/{job}/checkpoints/step-{n}/manifest.json")),
            )
            .unwrap(),
        )
        .unwrap();
        let files = stored["files"].as_array().unwrap();
        assert!(files.iter().any(|f| f["path"] == "model.safetensors"), "{stored}");
        for file in files {
            let path = file["path"].as_str().unwrap();
            if path == "trainer_state.safetensors" && !trainer_state {
                assert!(!out.join(path).exists(), "weights-only download has the optimizer state");
                continue;
            }
            let bytes = std::fs::read(out.join(path)).unwrap();
            assert_eq!(bytes.len() as u64, file["size"].as_u64().unwrap(), "{path}");
            let stored_bytes =
                std::fs::read(data.join(format!("objects/jobs/{job}/checkpoints/step-{n}/{path}")))
                    .unwrap();
            assert!(bytes == stored_bytes, "{path} differs from the stored file");
        }
    }
    let no_step = cli(
        &up,
        &data,
        &[
            "checkpoints",
            "download",
            &job,
            "--step",
            "3",
            "--out",
            work.path().join("x").to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        !no_step.status.success()
            && String::from_utf8_lossy(&no_step.stderr).contains("no checkpoint at step 3")
    );
    // A GGUF export asks the server; this tiny model's word-level tokenizer has no llama.cpp
    // counterpart, which the command says, leaving no file (SmolLM2's: gguf_export_api.rs).
    let gguf = work.path().join("tiny.gguf");
    let refused = cli(
        &up,
        &data,
        &["checkpoints", "export", &job, "--quant", "f16", "--out", gguf.to_str().unwrap()],
    )
    .await;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("byte-level BPE"), "{said}");
    assert!(!gguf.exists() && !work.path().join("tiny.gguf.part").exists());

    // A second, long job: pause, resume, cancel; watch exits non-zero for a cancelled job.
    let long = write(work.path(), "long.json", &method(100_000));
    let second = ok(
        cli(
            &up,
            &data,
            &["jobs", "create", "--file", long.to_str().unwrap(), "--training-file", &train_id],
        )
        .await,
        "create",
    );
    ok(cli(&up, &data, &["jobs", "pause", &second]).await, "pause");
    let started = Instant::now();
    while job_json(&up, &data, &second).await["status"] != "paused" {
        assert!(started.elapsed() < Duration::from_secs(60), "the job never paused");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    ok(cli(&up, &data, &["jobs", "resume", &second]).await, "resume");
    ok(cli(&up, &data, &["jobs", "cancel", &second]).await, "cancel");
    let cancelled = cli(&up, &data, &["jobs", "watch", &second]).await;
    assert!(!cancelled.status.success(), "watch of a cancelled job exits non-zero");
    assert!(String::from_utf8_lossy(&cancelled.stderr).contains("cancelled"));

    // SIGTERM stops `up` and its private cluster.
    let status = sigterm(&mut up.child);
    assert!(status.success(), "verity up exited {status}");
    let pid_file = data.join("pg/data/postmaster.pid");
    assert!(!pid_file.exists(), "the private Postgres is still running");
    drop(up);

    // A restart reuses the cluster, the data and the key, and gets past a stale postmaster.pid
    // (as left by a crash or a reboot).
    std::fs::write(&pid_file, "999999\n/nowhere\n").unwrap();
    let mut up = start_up_with(&data, Stdio::piped()).await;
    assert!(up.lines.iter().any(|l| l.contains("admin API key: in")), "{:?}", up.lines);
    assert!(!up.lines.iter().any(|l| l.contains(key.trim())), "the key is not printed again");
    assert_eq!(job_json(&up, &data, &job).await["status"], "succeeded");

    // `verity up` records client addresses, so its sign-in limits hold as `verity serve`'s do:
    // failed sign-ins with ever new e-mails from one address are checked until the address's
    // allowance (VERITY_AUTH_FAILURES_PER_ADDRESS, 20) is spent, then refused with 429.
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for i in 0..25 {
        let body =
            serde_json::json!({"email": format!("nobody{i}@x.io"), "password": "not-it-1234"});
        let reply =
            http.post(format!("{}/v1/auth/token", up.base)).json(&body).send().await.unwrap();
        statuses.push(reply.status().as_u16());
    }
    assert!(statuses[..20].iter().all(|&s| s == 401), "{statuses:?}");
    assert!(statuses[20..].iter().all(|&s| s == 429), "{statuses:?}");
    assert!(sigterm(&mut up.child).success());
    assert!(!pid_file.exists());
    // A quiet exit: the listeners stop before the private cluster does, so no warning says
    // they lost their connection.
    use std::io::Read;
    let mut stderr = String::new();
    up.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(!stderr.contains("listener"), "{stderr}");
}

#[tokio::test]
async fn verity_up_without_postgres_binaries_says_how_to_get_them() {
    let data = tempfile::tempdir().unwrap();
    let output = verity()
        .args(["up", "--port", "0", "--data-dir"])
        .arg(data.path())
        .env("PATH", "")
        .env("VERITY_PG_BIN_DIRS", data.path().join("none"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("initdb")
            && message.contains("apt install postgresql")
            && message.contains("DATABASE_URL"),
        "{message}"
    );
}

/// A `verity up` whose worker cannot run (a device this build lacks) says so on `/readyz` while
/// it restarts the worker, then gives up and exits non-zero with the reason: never an API
/// without its worker.
#[tokio::test(flavor = "multi_thread")]
async fn verity_up_exits_with_the_reason_when_its_worker_cannot_run() {
    let data = tempfile::tempdir().unwrap();
    let mut up = launch(data.path(), &["--device", "cuda:7"], Stdio::piped()).await;
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut seen = None;
    while seen.is_none() && started.elapsed() < Duration::from_secs(60) {
        if let Ok(reply) = http.get(format!("{}/readyz", up.base)).send().await {
            let status = reply.status();
            let body: Value = reply.json().await.unwrap_or_default();
            if body["checks"]["worker"]["status"] == "dead" {
                assert_eq!(status, 503, "{body}");
                seen = Some(body);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = seen.expect("/readyz reported the dead worker");
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("worker dead") && reason.contains("cuda:7"), "{reason}");

    let status = loop {
        if let Some(status) = up.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "verity up kept running");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!status.success(), "{status}");
    let mut stderr = String::new();
    use std::io::Read;
    up.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(
        stderr.contains("the embedded worker died")
            && stderr.contains("5 times in a row")
            && stderr.contains("cuda:7"),
        "{stderr}"
    );
}
