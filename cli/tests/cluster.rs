//! Cluster mode with processes instead of containers: one Postgres (a private cluster in a temp
//! dir, so that restarting it disturbs nobody), the S3 test server (moto) behind a TCP proxy
//! that can be cut, `verity migrate`, two `verity serve` replicas on different ports (the client
//! alternates between them) and three `verity worker` processes — each started with exactly the
//! env and args its Kubernetes manifest gives it (`scripts/manifest-env.py` reads them from
//! `deploy/k8s`), replacing only the addresses and secrets of this site.
//!
//! It runs six small jobs to completion and checks attempt fencing, checkpoints through either
//! replica, complete events and metrics, key revocation across replicas and cancel through the
//! other replica; then the faults: a SIGKILLed worker holding a job, a replica SIGKILLed
//! mid-upload, a Postgres restart, and S3 unreachable for 30 s.
//!
//! The same test runs twice: once with the roles as processes, and once with each `verity`
//! process in its image's container (podman, the `runtime` stages of `deploy/Dockerfile.server`
//! and `deploy/Dockerfile.worker-cpu` with the test step's own binary mounted in, on the host's
//! network; each with its manifest's security settings and scratch volumes as `manifest-env.py`
//! translates them — user, capabilities, no new privileges, the Localhost seccomp profile,
//! AppArmor, unmasked /proc, read-only root), killed with `podman kill` where the processes are
//! SIGKILLed. Postgres and the S3
//! server stay host processes in both, so that the faults can be injected alike.

use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use verity_cli::commands::postgres_cluster::PrivateCluster;
use verity_core::storage::{ObjectStore, S3Store};
use verity_testkit::images;
use verity_testkit::proxy::FaultProxy;

const JWT_SECRET: &str = "cluster-test-secret-cluster-test-secret-0123";
/// The lease of this site (the manifest's 60 s would make the kill scenario wait a minute).
const LEASE_SECONDS: &str = "3";
const MODEL: &str = "tiny-llama";
/// How long S3 is cut off in the outage scenario.
const S3_OUTAGE: Duration = Duration::from_secs(30);

/// Each role's `args` and `env` as its manifest sets them.
fn manifest_roles() -> Value {
    let python = std::env::var("VERITY_DEPLOY_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/manifest-env.py");
    let output = Command::new(&python).arg(&script).output().expect("running manifest-env.py");
    assert!(
        output.status.success(),
        "{python} {}: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// How the roles run.
#[derive(Clone)]
enum Launcher {
    /// `verity` processes on this machine.
    Processes,
    /// Each `verity` in its image's container; the podman command.
    Containers(String),
}

/// One started role: its command, and its container's name when it runs in one.
struct Launch {
    command: Command,
    container: Option<String>,
}

/// The site: what replaces the manifests' placeholders here, and how roles run.
struct Site {
    roles: Value,
    database_url: String,
    storage: String,
    s3_endpoint: String,
    launcher: Launcher,
    /// Folders a container sees at the same path (the private Postgres's socket folder).
    shared_dirs: Vec<PathBuf>,
}

impl Site {
    /// A command for `role` with exactly the manifest's env (site values replacing the
    /// placeholders, each of which the manifest must set) and args; nothing else of the test's
    /// environment but PATH and HOME (a container gets its image's).
    fn command(&self, role: &str, extra_env: &[(&str, &str)]) -> Command {
        self.launch(role, extra_env, None, None).command
    }

    /// As [`Site::command`] for the instance `name` of `role` if given (its pod name:
    /// `HOSTNAME`, and its container's name), working in `workdir` (the image's
    /// `/var/lib/verity`) if given.
    fn launch(
        &self,
        role: &str,
        extra_env: &[(&str, &str)],
        name: Option<&str>,
        workdir: Option<&Path>,
    ) -> Launch {
        let spec = &self.roles[role];
        let mut env: BTreeMap<String, String> = spec["env"]
            .as_object()
            .unwrap_or_else(|| panic!("no manifest role {role}"))
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let site = [
            ("DATABASE_URL", self.database_url.as_str()),
            ("VERITY_STORAGE", self.storage.as_str()),
            ("AWS_ENDPOINT_URL", self.s3_endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("VERITY_JWT_SECRET", JWT_SECRET),
            ("VERITY_BIND", "127.0.0.1:0"),
            ("VERITY_LEASE_SECONDS", LEASE_SECONDS),
            ("RUST_LOG", "warn"),
        ];
        for (name, value) in site {
            if let Some(slot) = env.get_mut(name) {
                *slot = value.to_string();
            }
        }
        for (name, value) in extra_env {
            assert!(env.contains_key(*name), "{role}: the manifest sets no {name}");
            env.insert(name.to_string(), value.to_string());
        }
        if let Some(name) = name {
            env.insert("HOSTNAME".to_string(), name.to_string());
        }
        let args = spec["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string());
        match &self.launcher {
            Launcher::Processes => {
                let mut command = Command::new(env!("CARGO_BIN_EXE_verity"));
                command.env_clear().envs(&env).args(args);
                for var in ["PATH", "HOME"] {
                    if let Ok(value) = std::env::var(var) {
                        command.env(var, value);
                    }
                }
                if let Some(workdir) = workdir {
                    command.current_dir(workdir);
                }
                Launch { command, container: None }
            }
            Launcher::Containers(podman) => {
                let dockerfile =
                    if role == "worker-cpu" { images::WORKER_CPU } else { images::SERVER };
                let container =
                    format!("verity-cluster-{}-{}", std::process::id(), name.unwrap_or(role));
                let mut command = Command::new(podman);
                command.args(["run", "--rm", "--network", "host", "--name", &container]);
                command.arg("-v").arg(images::binary_mount(env!("CARGO_BIN_EXE_verity")));
                for dir in &self.shared_dirs {
                    command.arg("-v").arg(format!("{0}:{0}", dir.display()));
                }
                // The manifest's security settings and scratch volumes (manifest-env.py); the
                // working directory given stands for the emptyDir of the image's cache folder.
                let options: Vec<&str> = spec["podman"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_str().unwrap())
                    .collect();
                let mut options = options.iter().peekable();
                while let Some(option) = options.next() {
                    if *option == "--tmpfs"
                        && workdir.is_some()
                        && options.peek().is_some_and(|p| p.starts_with("/var/lib/verity:"))
                    {
                        options.next();
                        continue;
                    }
                    command.arg(option);
                }
                if let Some(name) = name {
                    command.args(["--hostname", name]);
                }
                if let Some(workdir) = workdir {
                    // The image runs as uid 10001, which must own its working directory.
                    std::os::unix::fs::chown(workdir, Some(10001), Some(10001)).unwrap();
                    command.arg("-v").arg(format!("{}:/var/lib/verity", workdir.display()));
                }
                for (key, value) in &env {
                    command.arg("-e").arg(format!("{key}={value}"));
                }
                command.arg(images::runtime_image(podman, dockerfile)).args(args);
                Launch { command, container: Some(container) }
            }
        }
    }
}

/// A started process (or `podman run` attached to its container), SIGKILLed on drop.
struct Process {
    child: Child,
    /// The podman command and the container's name, when it runs in one.
    container: Option<(String, String)>,
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some((podman, name)) = &self.container {
            let _ = Command::new(podman).args(["rm", "-f", "-t", "0", name]).output();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// Starts `launch`, its output as given.
    fn spawn(site: &Site, launch: Launch, stdout: Stdio) -> Process {
        let Launch { mut command, container } = launch;
        let child =
            command.stdout(stdout).stderr(Stdio::inherit()).spawn().expect("spawning verity");
        let container = container.map(|name| match &site.launcher {
            Launcher::Containers(podman) => (podman.clone(), name),
            Launcher::Processes => unreachable!("a container name without podman"),
        });
        Process { child, container }
    }

    /// SIGKILLs the process (in a container: its main process, through podman).
    fn sigkill(&mut self) {
        match &self.container {
            Some((podman, name)) => {
                let killed = Command::new(podman).args(["kill", "--signal", "KILL", name]).output();
                assert!(killed.expect("podman kill").status.success(), "podman kill {name}");
            }
            None => self.child.kill().expect("SIGKILL"), // Child::kill sends SIGKILL on Unix.
        }
        self.child.wait().unwrap();
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// Starts a `verity serve` replica; returns it and its base URL.
async fn start_replica(site: &Site, n: usize) -> (Process, String) {
    let name = format!("replica-{n}");
    let mut replica =
        Process::spawn(site, site.launch("server", &[], Some(&name), None), Stdio::piped());
    let stdout = replica.child.stdout.take().unwrap();
    let base = verity_testkit::serve::listening_address(stdout).await.unwrap();
    (replica, base)
}

/// Starts worker `n` (its pod name, and so `HOSTNAME`, is `worker-n`) in its own working
/// directory (the image's `/var/lib/verity`, holding its cache).
fn start_worker(site: &Site, root: &Path, n: usize) -> Process {
    let dir = root.join(format!("worker-{n}"));
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("worker-{n}");
    Process::spawn(site, site.launch("worker-cpu", &[], Some(&name), Some(&dir)), Stdio::null())
}

/// The API client: alternates between the replicas.
struct Client {
    http: reqwest::Client,
    replicas: Vec<String>,
    next: std::sync::atomic::AtomicUsize,
    key: String,
}

impl Client {
    /// The next replica's base URL.
    fn base(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.replicas[n % self.replicas.len()].clone()
    }

    /// GET `path` on the next replica; the status and JSON body.
    async fn get(&self, path: &str) -> (u16, Value) {
        self.get_on(&self.base(), path, &self.key).await
    }

    async fn get_on(&self, base: &str, path: &str, key: &str) -> (u16, Value) {
        let reply = self.http.get(format!("{base}{path}")).bearer_auth(key).send().await.unwrap();
        let status = reply.status().as_u16();
        (status, reply.json().await.unwrap_or(Value::Null))
    }

    /// POST `body` to `path` on `base`; the status and JSON body.
    async fn post_on(&self, base: &str, path: &str, body: &Value) -> (u16, Value) {
        let reply = self
            .http
            .post(format!("{base}{path}"))
            .bearer_auth(&self.key)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = reply.status().as_u16();
        (status, reply.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_on(&self.base(), path, body).await
    }

    /// Uploads `data` as a fine-tune file through the next replica; its id.
    async fn upload(&self, name: &str, data: Vec<u8>) -> String {
        let form = reqwest::multipart::Form::new()
            .text("purpose", "fine-tune")
            .part("file", reqwest::multipart::Part::bytes(data).file_name(name.to_string()));
        let reply = self
            .http
            .post(format!("{}/v1/files", self.base()))
            .bearer_auth(&self.key)
            .multipart(form)
            .send()
            .await
            .unwrap();
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["status"], "processed", "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    /// Creates a job through the next replica; its id.
    async fn create_job(&self, files: &(String, String), hyperparameters: Value) -> String {
        let grader = verity_worker::trainer::testing::first_token_grader();
        let body = json!({"model": MODEL, "training_file": files.0, "validation_file": files.1,
            "seed": 42, "method": {"type": "reinforcement",
            "reinforcement": {"grader": grader, "hyperparameters": hyperparameters}}});
        let (status, job) = self.post("/v1/fine_tuning/jobs", &body).await;
        assert_eq!(status, 200, "{job}");
        job["id"].as_str().unwrap().to_string()
    }

    /// A job's status, read through the next replica (retried while a replica is down).
    async fn status(&self, job: &str) -> String {
        loop {
            let base = self.base();
            let reply = self
                .http
                .get(format!("{base}/v1/fine_tuning/jobs/{job}"))
                .bearer_auth(&self.key)
                .send()
                .await;
            if let Ok(reply) = reply {
                if reply.status().is_success() {
                    let body: Value = reply.json().await.unwrap();
                    return body["status"].as_str().unwrap().to_string();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every job in `jobs` has `status`.
    async fn wait_all(&self, jobs: &[String], status: &str, limit: Duration) {
        let started = Instant::now();
        for job in jobs {
            loop {
                let now = self.status(job).await;
                if now == status {
                    break;
                }
                assert!(
                    !["failed", "cancelled", "succeeded"].contains(&now.as_str()),
                    "{job} ended {now}, not {status}"
                );
                assert!(started.elapsed() < limit, "{job} still {now} after {limit:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Small job: the synthetic task, `steps` steps, a checkpoint every 2.
fn hyperparameters(steps: usize) -> Value {
    json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.01, "max_steps": steps,
           "max_completion_tokens": 8, "checkpoint_interval": 2, "micro_batch_size": 8,
           "eval_on_start": false})
}

async fn scalar(pool: &sqlx::PgPool, sql: &str, job: &str) -> i64 {
    sqlx::query_scalar(sql).bind(job).fetch_one(pool).await.unwrap()
}

async fn metric_rows(pool: &sqlx::PgPool, job: &str) -> i64 {
    scalar(pool, "SELECT count(*) FROM job_metrics WHERE job_id = $1", job).await
}

async fn wait_for(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The hostname (`worker-n`) of the worker holding `job` now.
async fn holder(pool: &sqlx::PgPool, job: &str) -> String {
    sqlx::query_scalar(
        "SELECT w.hostname FROM jobs j JOIN workers w ON w.id = j.worker_id WHERE j.id = $1",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Attempt fencing, from the database's own record of every state change: the job was claimed
/// by one worker per attempt, each claim ended before the next began, and every metrics row
/// and checkpoint was written by an attempt while it held the job — each step exactly once.
/// Returns the hostnames of the workers that ran it, by attempt.
async fn assert_fenced(pool: &sqlx::PgPool, job: &str, steps: i32) -> Vec<String> {
    let transitions: Vec<(Value, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT data, created_at FROM job_events WHERE job_id = $1 AND kind = 'state' ORDER BY id",
    )
    .bind(job)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut running: Option<i64> = None;
    let mut workers = Vec::new();
    for (data, _) in &transitions {
        let attempt = data["attempt"].as_i64().unwrap();
        if data["to"] == "running" {
            assert!(running.is_none(), "{job}: attempt {attempt} claimed while {running:?} ran");
            assert_eq!(attempt as usize, workers.len() + 1, "{job}: attempts count up by one");
            running = Some(attempt);
            let id = data["worker_id"].as_str().unwrap().to_string();
            let host: String = sqlx::query_scalar("SELECT hostname FROM workers WHERE id = $1")
                .bind(&id)
                .fetch_one(pool)
                .await
                .unwrap();
            workers.push(host);
        } else if data["from"] == "running" {
            assert_eq!(running, Some(attempt), "{job}: the running attempt ended");
            running = None;
        }
    }
    let rows: Vec<(i32, i32)> =
        sqlx::query_as("SELECT step, attempt FROM job_metrics WHERE job_id = $1 ORDER BY step")
            .bind(job)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=steps).collect::<Vec<_>>(),
        "{job}: each step exactly once"
    );
    for (step, attempt) in &rows {
        assert!(
            *attempt >= 1 && (*attempt as usize) <= workers.len(),
            "{job}: step {step} written by attempt {attempt}, never claimed"
        );
    }
    workers
}

/// Every checkpoint of `job` through both replicas: listed alike, and its archive downloads
/// byte for byte the same through each.
async fn assert_checkpoints_on_both(client: &Client, job: &str) -> usize {
    let path = format!("/v1/fine_tuning/jobs/{job}/checkpoints?limit=100");
    let mut listings = Vec::new();
    for base in &client.replicas {
        let (status, page) = client.get_on(base, &path, &client.key).await;
        assert_eq!(status, 200, "{page}");
        listings.push(page["data"].clone());
    }
    assert_eq!(listings[0], listings[1], "both replicas list the same checkpoints");
    let checkpoints = listings[0].as_array().unwrap();
    assert!(!checkpoints.is_empty(), "{job} has checkpoints");
    for checkpoint in checkpoints {
        let id = checkpoint["id"].as_str().unwrap();
        let mut archives = Vec::new();
        for base in &client.replicas {
            let url = format!("{base}/v1/fine_tuning/jobs/{job}/checkpoints/{id}/content");
            let reply = client.http.get(url).bearer_auth(&client.key).send().await.unwrap();
            assert_eq!(reply.status().as_u16(), 200, "{job} {id} through {base}");
            archives.push(reply.bytes().await.unwrap());
        }
        assert!(archives[0].len() > 1024, "{job} {id}: an archive with the weights");
        assert_eq!(archives[0], archives[1], "{job} {id}: the same archive through both");
    }
    checkpoints.len()
}

/// The API's events and metrics of a succeeded job are complete.
async fn assert_events_and_metrics(client: &Client, job: &str, steps: usize) {
    let (_, events) = client.get(&format!("/v1/fine_tuning/jobs/{job}/events?limit=1000")).await;
    let messages: Vec<&str> =
        events["data"].as_array().unwrap().iter().map(|e| e["message"].as_str().unwrap()).collect();
    assert_eq!(messages.last(), Some(&"job created in state queued"), "{messages:?}");
    assert!(messages.contains(&"queued -> running"), "{messages:?}");
    assert!(messages.contains(&"running -> succeeded"), "{messages:?}");
    let (_, metrics) = client.get(&format!("/v1/fine_tuning/jobs/{job}/metrics")).await;
    let got: Vec<i64> =
        metrics["data"].as_array().unwrap().iter().map(|m| m["step"].as_i64().unwrap()).collect();
    assert_eq!(got, (1..=steps as i64).collect::<Vec<_>>(), "{job}: metrics of every step");
}

/// Every `files/` object of the store belongs to a file record, and no record lacks its object.
async fn assert_no_half_files(pool: &sqlx::PgPool, store: &dyn ObjectStore) {
    let objects: BTreeSet<String> =
        store.list("files/").await.unwrap().into_iter().map(|o| o.key).collect();
    let records: BTreeSet<String> =
        sqlx::query_scalar::<_, String>("SELECT storage_key FROM files")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .filter(|k| k.starts_with("files/"))
            .collect();
    assert_eq!(objects, records, "file objects and file records match");
}

/// One cluster at a time: the two tests below would share two cores.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_processes_runs_jobs_and_survives_faults() {
    let _one = ONE_CLUSTER.lock().await;
    run_cluster(Launcher::Processes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_containers_from_the_deploy_images_runs_jobs_and_survives_faults() {
    let test = "a_cluster_of_containers_from_the_deploy_images_runs_jobs_and_survives_faults";
    let Some(podman) = images::podman(test) else { return };
    let _one = ONE_CLUSTER.lock().await;
    run_cluster(Launcher::Containers(podman)).await;
}

/// Starts the cluster with `launcher` and runs the jobs and faults.
async fn run_cluster(launcher: Launcher) {
    let started = Instant::now();
    let Some(moto) = verity_core::testing::s3_test_endpoint("the cluster topology test") else {
        return;
    };
    let roles = manifest_roles();
    let root = tempfile::tempdir().unwrap();
    let pg_dir = root.path().join("pg");
    let start_pg = |dir: PathBuf| async move {
        tokio::task::spawn_blocking(move || PrivateCluster::start(&dir)).await.unwrap().unwrap()
    };
    let mut postgres = start_pg(pg_dir.clone()).await;
    postgres.ensure_database().await.unwrap();
    let database_url = postgres.database_url();

    let mut proxy =
        FaultProxy::start(moto.trim_start_matches("http://").trim_end_matches('/')).await.unwrap();
    let s3_endpoint = format!("http://127.0.0.1:{}", proxy.port());
    let options = verity_core::testing::s3_test_options(&moto, "cluster", "verity");
    let store = S3Store::connect(options.clone()).await.unwrap();
    store.create_bucket_if_missing().await.unwrap();
    let site = Site {
        roles,
        database_url: database_url.clone(),
        storage: format!("s3://{}/verity", options.bucket),
        s3_endpoint,
        launcher,
        shared_dirs: vec![pg_dir.join("run")],
    };

    // The migration Job, then the rest.
    let migrate = site.command("migrate", &[]).output().unwrap();
    assert!(migrate.status.success(), "{}", String::from_utf8_lossy(&migrate.stderr));
    let pool = verity_core::db::connect(&database_url, 4).await.unwrap();
    let model_dir = root.path().join("tiny-model");
    verity_worker::trainer::testing::write_tiny_model_dir(
        &model_dir,
        verity_worker::Family::Llama,
        3,
    )
    .unwrap();
    verity_core::storage::publish_folder(&store, &model_dir, "models/tiny-llama").await.unwrap();
    verity_core::models::insert_base_model(
        &pool,
        None,
        MODEL,
        "models/tiny-llama",
        "hf",
        &json!({}),
    )
    .await
    .unwrap();
    verity_cli::commands::admin::create_user(&pool, "ops@x.io", "ops", "admin", None)
        .await
        .unwrap();
    let key = verity_cli::commands::admin::create_key(&pool, "ops@x.io", "ops").await.unwrap();

    let (mut replica_a, base_a) = start_replica(&site, 0).await;
    let (mut replica_b, base_b) = start_replica(&site, 1).await;
    let mut workers: Vec<Process> = (0..3).map(|n| start_worker(&site, root.path(), n)).collect();
    let client = Client {
        http: reqwest::Client::new(),
        replicas: vec![base_a.clone(), base_b.clone()],
        next: Default::default(),
        key,
    };
    use verity_worker::trainer::testing::target_token_jsonl;
    let files = (
        client.upload("train.jsonl", target_token_jsonl(6).into_bytes()).await,
        client.upload("valid.jsonl", target_token_jsonl(3).into_bytes()).await,
    );

    // Six small jobs, created through alternating replicas, run to completion.
    const STEPS: usize = 4;
    let mut jobs = Vec::new();
    for _ in 0..6 {
        jobs.push(client.create_job(&files, hyperparameters(STEPS)).await);
    }
    client.wait_all(&jobs, "succeeded", Duration::from_secs(180)).await;
    let mut ran_on = BTreeSet::new();
    for job in &jobs {
        let hosts = assert_fenced(&pool, job, STEPS as i32).await;
        assert_eq!(hosts.len(), 1, "{job}: one attempt");
        ran_on.extend(hosts);
        assert_checkpoints_on_both(&client, job).await;
        assert_events_and_metrics(&client, job, STEPS).await;
    }
    eprintln!("six jobs ran on {ran_on:?} in {:.1?}", started.elapsed());

    // The API grades code itself (graders/run, and graders/validate's trial of a python grader):
    // in its own sandbox, so the server's container must run it too.
    let code = json!({"type": "code", "name": "double", "language": "python",
                      "tests": "assert double(2) == 4", "scoring": "all_pass"});
    for _ in 0..2 {
        let body = json!({"grader": code, "item": {},
                          "model_sample": "```python\ndef double(x):\n    return 2 * x\n```"});
        let (status, run) = client.post("/v1/fine_tuning/alpha/graders/run", &body).await;
        assert_eq!((status, run["reward"].as_f64()), (200, Some(1.0)), "graders/run: {run}");
        let python = json!({"grader": {"type": "python", "name": "p",
                            "source": "def grade(sample, item):\n    return 1.0\n"}});
        let (status, valid) = client.post("/v1/fine_tuning/alpha/graders/validate", &python).await;
        assert_eq!(status, 200, "graders/validate of a python grader: {valid}");
    }

    // A key made and revoked on replica A is refused on replica B at once.
    let (status, created) = client.post_on(&base_a, "/v1/api_keys", &json!({"name": "t"})).await;
    assert_eq!(status, 200, "{created}");
    let (secret, key_id) =
        (created["secret"].as_str().unwrap(), created["id"].as_str().unwrap().to_string());
    assert_eq!(client.get_on(&base_b, "/v1/fine_tuning/jobs", secret).await.0, 200);
    let (status, _) =
        client.post_on(&base_a, &format!("/v1/api_keys/{key_id}/revoke"), &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(client.get_on(&base_b, "/v1/fine_tuning/jobs", secret).await.0, 401);
    assert_eq!(client.get_on(&base_a, "/v1/fine_tuning/jobs", secret).await.0, 401);

    // A job cancelled through replica B stops on whichever worker holds it.
    let long = client.create_job(&files, hyperparameters(400)).await;
    wait_for("the long job's progress", Duration::from_secs(60), async || {
        metric_rows(&pool, &long).await >= 2
    })
    .await;
    let host = holder(&pool, &long).await;
    let (status, body) =
        client.post_on(&base_b, &format!("/v1/fine_tuning/jobs/{long}/cancel"), &json!({})).await;
    // A running job's cancel is a request its worker acts on at its next heartbeat.
    assert_eq!(status, 200, "{body}");
    assert!(body["status"] == "cancelled" || body["pending_control"] == "cancel", "{body}");
    client.wait_all(std::slice::from_ref(&long), "cancelled", Duration::from_secs(30)).await;
    let after_cancel = metric_rows(&pool, &long).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(metric_rows(&pool, &long).await, after_cancel, "{host} stopped the job");
    assert_eq!(client.status(&long).await, "cancelled");
    // That worker is free again: the next job may run on any of the three.
    let next = client.create_job(&files, hyperparameters(STEPS)).await;
    client.wait_all(std::slice::from_ref(&next), "succeeded", Duration::from_secs(60)).await;

    // Fault: the worker holding a job is SIGKILLed; another resumes it from its checkpoint.
    const KILL_STEPS: usize = 60;
    let victim_job = client.create_job(&files, hyperparameters(KILL_STEPS)).await;
    wait_for("a checkpoint of the job", Duration::from_secs(60), async || {
        scalar(&pool, "SELECT count(*) FROM checkpoints WHERE job_id = $1", &victim_job).await >= 1
    })
    .await;
    let host = holder(&pool, &victim_job).await;
    let n: usize = host.trim_start_matches("worker-").parse().unwrap();
    workers[n].sigkill();
    assert!((metric_rows(&pool, &victim_job).await as usize) < KILL_STEPS, "killed mid-job");
    workers[n] = start_worker(&site, root.path(), n + 3); // The Deployment replaces the pod.
    client.wait_all(std::slice::from_ref(&victim_job), "succeeded", Duration::from_secs(120)).await;
    let hosts = assert_fenced(&pool, &victim_job, KILL_STEPS as i32).await;
    assert_eq!(hosts.len(), 2, "two attempts: {hosts:?}");
    assert_eq!(hosts[0], host);
    let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM job_events WHERE job_id = $1")
        .bind(&victim_job)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(kinds.contains(&"resumed".to_string()), "resumed from a checkpoint: {kinds:?}");

    // Fault: a replica is SIGKILLed mid-upload; no half file, and the retry on the other works.
    let big: Vec<u8> = target_token_jsonl(6).into_bytes().repeat(40_000); // ~ 9 MiB
    let chunks: Vec<bytes::Bytes> =
        big.chunks(256 * 1024).map(bytes::Bytes::copy_from_slice).collect();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = sent.clone();
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks).then(move |chunk| {
        let counter = counter.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(chunk)
        }
    }));
    let form = reqwest::multipart::Form::new().text("purpose", "fine-tune").part(
        "file",
        reqwest::multipart::Part::stream_with_length(body, big.len() as u64).file_name("big.jsonl"),
    );
    let upload = client
        .http
        .post(format!("{base_a}/v1/files"))
        .bearer_auth(&client.key)
        .multipart(form)
        .send();
    let upload = tokio::spawn(upload);
    wait_for("a third of the upload", Duration::from_secs(30), async || {
        sent.load(std::sync::atomic::Ordering::SeqCst) >= 12
    })
    .await;
    replica_a.sigkill();
    let failed = upload.await.unwrap();
    assert!(failed.is_err(), "the upload to the killed replica fails: {failed:?}");
    let big_records = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM files WHERE filename = 'big.jsonl'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(big_records().await, 0, "no record of the half upload");
    assert_no_half_files(&pool, &store).await;
    let form = reqwest::multipart::Form::new()
        .text("purpose", "fine-tune")
        .part("file", reqwest::multipart::Part::bytes(big.clone()).file_name("big.jsonl"));
    let retried: Value = client
        .http
        .post(format!("{base_b}/v1/files"))
        .bearer_auth(&client.key)
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (retried["status"].as_str(), retried["bytes"].as_u64()),
        (Some("processed"), Some(big.len() as u64)),
        "{retried}"
    );
    assert_eq!(big_records().await, 1);
    assert_no_half_files(&pool, &store).await;
    let (replacement, base_a) = start_replica(&site, 2).await;
    replica_a = replacement;
    let client = Client { replicas: vec![base_a.clone(), base_b.clone()], ..client };

    // Fault: Postgres restarts (crash stop) mid-job; every process reconnects by itself.
    const FAULT_STEPS: usize = 40;
    let pg_job = client.create_job(&files, hyperparameters(FAULT_STEPS)).await;
    wait_for("progress before the restart", Duration::from_secs(60), async || {
        metric_rows(&pool, &pg_job).await >= 2
    })
    .await;
    let at_stop = metric_rows(&pool, &pg_job).await;
    assert!((at_stop as usize) < FAULT_STEPS, "Postgres stops mid-job");
    postgres = tokio::task::spawn_blocking(move || {
        postgres.stop_immediately();
        postgres
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(postgres);
    let _postgres = start_pg(pg_dir).await;
    client.wait_all(std::slice::from_ref(&pg_job), "succeeded", Duration::from_secs(120)).await;
    assert_fenced(&pool, &pg_job, FAULT_STEPS as i32).await;
    for base in &client.replicas {
        let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
        assert_eq!(ready.status().as_u16(), 200, "{base} ready again");
    }
    for (n, worker) in workers.iter_mut().enumerate() {
        assert!(worker.alive(), "worker {n} lived through the restart");
    }
    assert!(replica_a.alive() && replica_b.alive(), "replicas lived through the restart");

    // Fault: S3 is unreachable for 30 s mid-job; the job waits and then goes on.
    let s3_job = client.create_job(&files, hyperparameters(FAULT_STEPS)).await;
    wait_for("progress before the S3 outage", Duration::from_secs(60), async || {
        metric_rows(&pool, &s3_job).await >= 2
    })
    .await;
    proxy.stop();
    let before = metric_rows(&pool, &s3_job).await;
    tokio::time::sleep(S3_OUTAGE).await;
    let during = metric_rows(&pool, &s3_job).await;
    assert!((during as usize) < FAULT_STEPS, "S3 went away mid-job");
    assert!(during <= before + 1, "steps went on without the store: {before} then {during}");
    let (status, _) = client.get(&format!("/v1/fine_tuning/jobs/{s3_job}")).await;
    assert_eq!(status, 200, "the API answers job reads without S3");
    proxy.restart().await.unwrap();
    client.wait_all(std::slice::from_ref(&s3_job), "succeeded", Duration::from_secs(180)).await;
    assert_fenced(&pool, &s3_job, FAULT_STEPS as i32).await;
    assert_checkpoints_on_both(&client, &s3_job).await;
    eprintln!("the cluster test took {:.1?}", started.elapsed());
    // Processes first, then Postgres (so that nothing logs its loss).
    drop((workers, replica_a, replica_b));
}
