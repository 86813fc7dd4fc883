//! `verity bench cluster`: the queue's overhead with real processes. Jobs per hour and claim
//! latency with N `verity worker` processes on tiny one-step jobs (a tiny random model, so the
//! time is the queue's and the job set-up's, not training), the Postgres connections each
//! process holds, and API requests per second through 1 and 2 `verity serve` replicas. It runs
//! in a scratch database on the server of DATABASE_URL and a scratch local store, both removed.

use anyhow::Context;
use clap::Args;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use verity_core::queue::{NewJob, Queue, QueueSettings};
use verity_core::storage::{LocalStore, ObjectStore};

/// Options of the cluster benchmark.
#[derive(Debug, Args)]
pub struct ClusterBenchArgs {
    /// Postgres server to create the scratch database on.
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub database_url: String,
    /// Worker process counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub workers: Vec<usize>,
    /// Tiny jobs run per worker count.
    #[arg(long, default_value_t = 24)]
    pub jobs: usize,
    /// Concurrent API clients of the replica measurement.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Seconds of API load per replica count.
    #[arg(long, default_value_t = 5)]
    pub api_seconds: u64,
}

/// Kills the processes on drop.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the benchmark and prints one JSON line per measurement.
pub async fn run(args: &ClusterBenchArgs) -> anyhow::Result<()> {
    super::queue::with_scratch_database(&args.database_url, |options| async move {
        let url = options.to_url_lossy().to_string();
        let dir = tempfile_dir()?;
        let result = measure_all(args, options, &url, &dir).await;
        let _ = std::fs::remove_dir_all(&dir);
        result
    })
    .await
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("verity-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A `verity` command of this binary over the scratch database and store.
fn verity(url: &str, dir: &Path, args: &[&str]) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(args)
        .env("DATABASE_URL", url)
        .env("VERITY_STORAGE", dir.join("objects"))
        .env("VERITY_RATE_LIMIT_RPS", "0")
        .env("VERITY_GRADER_WORKERS", "1")
        .env("VERITY_JWT_SECRET", "bench-secret-bench-secret-bench-secret-0")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null());
    Ok(command)
}

async fn measure_all(
    args: &ClusterBenchArgs,
    options: PgConnectOptions,
    url: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new().max_connections(4).connect_with(options).await?;
    verity_core::db::migrate(&pool).await?;
    let store = LocalStore::open(dir.join("objects"), None).await?;
    let model_dir = dir.join("tiny-model");
    verity_worker::synthetic::write_tiny_model_dir(&model_dir, verity_worker::Family::Llama, 3)?;
    verity_core::storage::publish_folder(&store, &model_dir, "models/tiny").await?;
    verity_core::models::insert_base_model(&pool, None, "tiny", "models/tiny", "hf", &json!({}))
        .await?;
    let rows = verity_worker::synthetic::target_token_jsonl(4);
    store.put_bytes("files/file-bench.jsonl", rows.into()).await?;
    let org = verity_core::tenancy::ensure_org(&pool, "bench").await?;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    for &n in &args.workers {
        measure_workers(&pool, &queue, org, url, dir, n, args.jobs).await?;
    }
    crate::commands::admin::create_user(&pool, "bench@x.io", "bench", "member", None).await?;
    let key = crate::commands::admin::create_key(&pool, "bench@x.io", "bench").await?;
    for replicas in [1, 2] {
        measure_api(&pool, url, dir, replicas, &key, args).await?;
    }
    pool.close().await;
    Ok(())
}

fn tiny_job(org: uuid::Uuid) -> NewJob {
    let grader = verity_worker::synthetic::first_token_grader();
    let hp = json!({"batch_size": 1, "group_size": 2, "max_steps": 1, "max_completion_tokens": 2,
                    "checkpoint_interval": 1, "eval_on_start": false});
    let method = json!({"type": "reinforcement",
                        "reinforcement": {"grader": grader, "hyperparameters": hp}});
    let mut job = NewJob::new(org, "tiny", method);
    job.training_file = Some("file-bench".into());
    job
}

/// Connections the database's server has open to it (less this benchmark's own pool).
async fn connections(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?)
}

async fn wait_until_done(pool: &PgPool, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .fetch_one(pool)
        .await?;
        if open == 0 {
            return Ok(());
        }
        anyhow::ensure!(started.elapsed() < limit, "{open} jobs still open after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn measure_workers(
    pool: &PgPool,
    queue: &Queue,
    org: uuid::Uuid,
    url: &str,
    dir: &Path,
    n: usize,
    jobs: usize,
) -> anyhow::Result<()> {
    let idle = connections(pool).await?;
    let mut children = Processes(Vec::new());
    for i in 0..n {
        let cache = dir.join(format!("cache-{i}"));
        let cache = cache.to_string_lossy().into_owned();
        let mut command = verity(url, dir, &["worker", "--device", "cpu", "--cache-dir", &cache])?;
        children.0.push(command.stdout(Stdio::null()).spawn()?);
    }
    // Warm-up: one job per worker loads the model into each cache; then all are idle.
    for _ in 0..n {
        queue.enqueue(&tiny_job(org)).await?;
    }
    wait_until_done(pool, Duration::from_secs(300)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = connections(pool).await? - idle;
    // Claim latency: one job at a time into an idle fleet, from enqueue to claim.
    let mut latencies = Vec::new();
    for _ in 0..5 {
        let id = queue.enqueue(&tiny_job(org)).await?;
        wait_until_done(pool, Duration::from_secs(60)).await?;
        let ms: f64 = sqlx::query_scalar(
            "SELECT (extract(epoch FROM started_at - created_at) * 1000)::float8 FROM jobs WHERE id = $1",
        )
        .bind(&id)
        .fetch_one(pool)
        .await?;
        latencies.push(ms);
    }
    latencies.sort_by(f64::total_cmp);
    // Throughput: a burst of jobs.
    let started = Instant::now();
    for _ in 0..jobs {
        queue.enqueue(&tiny_job(org)).await?;
    }
    wait_until_done(pool, Duration::from_secs(600)).await?;
    let seconds = started.elapsed().as_secs_f64();
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state <> 'succeeded'")
        .fetch_one(pool)
        .await?;
    println!(
        "{}",
        json!({"bench": "cluster-workers", "worker_processes": n, "jobs": jobs,
               "jobs_per_hour": jobs as f64 / seconds * 3600.0, "seconds": seconds,
               "claim_latency_ms_p50": latencies[2], "claim_latency_ms_max": latencies[4],
               "pg_connections_per_worker": held as f64 / n as f64, "failed_jobs": failed})
    );
    Ok(())
}

async fn measure_api(
    pool: &PgPool,
    url: &str,
    dir: &Path,
    replicas: usize,
    key: &str,
    args: &ClusterBenchArgs,
) -> anyhow::Result<()> {
    let idle = connections(pool).await?;
    let mut children = Processes(Vec::new());
    let mut bases = Vec::new();
    for _ in 0..replicas {
        let mut child = verity(url, dir, &["serve"])?
            .env("VERITY_BIND", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        children.0.push(child);
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        })
        .await??;
        let listening: serde_json::Value = serde_json::from_str(&line)?;
        bases.push(listening["listening"].as_str().context("no address")?.to_string());
    }
    let http = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(args.api_seconds);
    let tasks: Vec<_> = (0..args.clients)
        .map(|c| {
            let (http, key) = (http.clone(), key.to_string());
            let base = bases[c % bases.len()].clone();
            tokio::spawn(async move {
                let mut ok = 0u64;
                while Instant::now() < until {
                    let reply = http
                        .get(format!("{base}/v1/fine_tuning/jobs?limit=20"))
                        .bearer_auth(&key)
                        .send()
                        .await;
                    if reply.is_ok_and(|r| r.status().is_success()) {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += task.await?;
    }
    let held = connections(pool).await? - idle;
    println!(
        "{}",
        json!({"bench": "cluster-api", "replicas": replicas, "clients": args.clients,
               "requests_per_s": ok as f64 / args.api_seconds as f64,
               "request": "GET /v1/fine_tuning/jobs?limit=20",
               "pg_connections_per_replica": held as f64 / replicas as f64})
    );
    Ok(())
}
