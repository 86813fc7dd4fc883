//! A training job survives outages of its dependencies within one attempt: a private Postgres
//! cluster stopped (`pg_ctl stop -m immediate`) for a few seconds mid-job and started again,
//! a local object store whose root disappears for a few seconds, and an S3 server (moto) that
//! cannot be reached for a few seconds (a TCP proxy in front of it stops, closing its
//! connections, and starts again on the same port). Each time the worker
//! retries with backoff, the job succeeds on its first attempt, and every step has exactly one
//! metrics row (and one `metrics.jsonl` line); after the store outage the final checkpoint
//! downloads and loads.

use verity_tests::training_support;

use serde_json::json;
use sqlx::PgPool;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use training_support::{
    cpu_training_handler, enqueue, event_kinds, method, metric_steps, metrics_jsonl_steps, prepare,
    prepare_store,
};
use verity_cli::commands::postgres_cluster::PrivateCluster;
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::storage::{download_folder, ObjectStore, S3Options, S3Store};
use verity_core::testing::{s3_test_endpoint, s3_test_options};
use verity_core::JobState;
use verity_testkit::proxy::FaultProxy;

const STEPS: i32 = 12;

/// Shows the worker's warnings (the retries) in the test output (`RUST_LOG` overrides).
fn log_to_test_output() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}
/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(4);

fn hyperparameters() -> serde_json::Value {
    json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.01, "max_steps": STEPS,
           "max_completion_tokens": 8, "checkpoint_interval": 4, "micro_batch_size": 8})
}

/// Runs one job with the real training handler in this process; returns the jobs run.
fn spawn_worker(
    queue: &Queue,
    store: Arc<dyn ObjectStore>,
    cache: &Path,
) -> tokio::task::JoinHandle<usize> {
    let handler = cpu_training_handler(store, cache);
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    tokio::spawn(run_worker(
        queue.clone(),
        WorkerInfo::new(DeviceKind::Cpu, 1024),
        Arc::new(handler),
        options,
        CancellationToken::new(),
    ))
}

async fn metric_rows(pool: &PgPool, job: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM job_metrics WHERE job_id = $1")
        .bind(job)
        .fetch_one(pool)
        .await
        .unwrap_or(-1)
}

async fn wait_for_rows(pool: &PgPool, job: &str, rows: i64) -> i64 {
    let started = Instant::now();
    loop {
        let now = metric_rows(pool, job).await;
        if now >= rows {
            return now;
        }
        assert!(started.elapsed() < Duration::from_secs(180), "no progress: {now} rows");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The job succeeded on its first attempt with one metrics row and one metrics line per step.
async fn assert_survived(pool: &PgPool, store: &dyn ObjectStore, queue: &Queue, job: &str) {
    assert_eq!(queue.state(job).await.unwrap(), JobState::Succeeded);
    let (attempt, failures): (i32, i32) =
        sqlx::query_as("SELECT attempt, failures FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((attempt, failures), (1, 0), "the outage did not cost an attempt");
    assert_eq!(metric_steps(pool, job).await, (1..=STEPS).collect::<Vec<_>>());
    assert_eq!(
        metrics_jsonl_steps(store, job).await,
        (1..=STEPS as i64).collect::<Vec<_>>(),
        "one metrics.jsonl line per step"
    );
    let kinds = event_kinds(pool, job).await;
    assert!(!kinds.contains(&"failed".to_string()), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_survives_a_postgres_restart_mid_job() {
    log_to_test_output();
    let root = tempfile::tempdir().unwrap();
    let pg_dir = root.path().join("pg");
    let start = |dir: std::path::PathBuf| async move {
        tokio::task::spawn_blocking(move || PrivateCluster::start(&dir)).await.unwrap().unwrap()
    };
    let mut cluster = start(pg_dir.clone()).await;
    cluster.ensure_database().await.unwrap();
    let pool = verity_core::db::connect(&cluster.database_url(), 8).await.unwrap();
    verity_core::db::migrate(&pool).await.unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let job = enqueue(&pool, &queue, method(hyperparameters())).await;
    let worker = spawn_worker(&queue, store.clone(), &root.path().join("cache"));

    let before = wait_for_rows(&pool, &job, 2).await;
    assert!(before < STEPS as i64, "stopped mid-job");
    cluster = tokio::task::spawn_blocking(move || {
        cluster.stop_immediately();
        cluster
    })
    .await
    .unwrap();
    tokio::time::sleep(OUTAGE).await;
    drop(cluster);
    let _cluster = start(pg_dir).await;

    let done = tokio::time::timeout(Duration::from_secs(300), worker).await.unwrap().unwrap();
    assert_eq!(done, 1);
    assert_survived(&pool, store.as_ref(), &queue, &job).await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_survives_its_object_store_disappearing_mid_job(pool: PgPool) {
    log_to_test_output();
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let job = enqueue(&pool, &queue, method(hyperparameters())).await;
    let worker = spawn_worker(&queue, store.clone(), &root.path().join("cache"));

    let objects = root.path().join("objects");
    let away = root.path().join("objects-away");
    let before = wait_for_rows(&pool, &job, 2).await;
    assert!(before < STEPS as i64, "the store disappears mid-job");
    std::fs::rename(&objects, &away).unwrap();
    tokio::time::sleep(OUTAGE).await;
    let during = metric_rows(&pool, &job).await;
    std::fs::rename(&away, &objects).unwrap();
    // A step writes its samples to the store before its metrics row, so at most the step that
    // was already past that point recorded its row: the worker waited for the store.
    assert!(during <= before + 1, "steps went on without the store: {before} then {during}");

    let done = tokio::time::timeout(Duration::from_secs(300), worker).await.unwrap().unwrap();
    assert_eq!(done, 1);
    assert_survived(&pool, store.as_ref(), &queue, &job).await;
    let prefix: String = sqlx::query_scalar(
        "SELECT storage_prefix FROM checkpoints WHERE job_id = $1 ORDER BY step DESC LIMIT 1",
    )
    .bind(&job)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(prefix.ends_with(&format!("step-{STEPS}")), "{prefix}");
    let dir = root.path().join("downloaded");
    download_folder(store.as_ref(), &prefix, &dir).await.unwrap();
    verity_worker::load_model(&dir, &candle_core::Device::Cpu).expect("the checkpoint loads");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_survives_its_s3_server_being_unreachable_mid_job(pool: PgPool) {
    log_to_test_output();
    let Some(endpoint) = s3_test_endpoint("a job through an S3 outage") else { return };
    let target = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut proxy = FaultProxy::start(&target).await.unwrap();
    let proxied = format!("http://127.0.0.1:{}", proxy.port());
    let s3 = S3Store::connect(S3Options {
        max_attempts: 2,
        ..s3_test_options(&proxied, "verity-outage", "")
    })
    .await
    .unwrap();
    s3.create_bucket_if_missing().await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = prepare(&pool, root.path(), Arc::new(s3)).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let job = enqueue(&pool, &queue, method(hyperparameters())).await;
    let worker = spawn_worker(&queue, store.clone(), &root.path().join("cache"));

    let before = wait_for_rows(&pool, &job, 2).await;
    assert!(before < STEPS as i64, "S3 goes away mid-job");
    proxy.stop();
    tokio::time::sleep(OUTAGE).await;
    let during = metric_rows(&pool, &job).await;
    proxy.restart().await.unwrap();
    assert!(during <= before + 1, "steps went on without the store: {before} then {during}");

    let done = tokio::time::timeout(Duration::from_secs(300), worker).await.unwrap().unwrap();
    assert_eq!(done, 1);
    assert_survived(&pool, store.as_ref(), &queue, &job).await;
    let dir = root.path().join("downloaded");
    download_folder(store.as_ref(), &format!("jobs/{job}/checkpoints/step-{STEPS}"), &dir)
        .await
        .unwrap();
    verity_worker::load_model(&dir, &candle_core::Device::Cpu).expect("the checkpoint loads");
}
