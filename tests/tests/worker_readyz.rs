//! `/readyz` of a process that embeds a worker (`verity up`) reports the worker: 503 with a
//! reason before it starts and once it is dead, 200 while its claim loop runs; the supervisor of
//! `verity up` restarts a worker that panics, and gives up (with the reason, for `/readyz` and
//! the exit status) on one that cannot start.

use verity_tests::api_support;

use api_support::*;
use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use verity_cli::commands::up::{supervise_worker, RestartPolicy};
use verity_core::config::{DatabaseConfig, QueueConfig, StorageConfig};
use verity_core::queue::{
    run_worker, DeviceKind, Heartbeat, JobHandler, JobOutcome, Lease, Queue, QueueSettings,
    RunnerOptions, WorkerInfo, WorkerLiveness,
};
use verity_worker::job::{run_training_worker, TrainingWorkerConfig};

struct Succeed;

#[async_trait]
impl JobHandler for Succeed {
    async fn run(&self, _lease: &Lease, _heartbeat: &Heartbeat) -> JobOutcome {
        JobOutcome::Succeeded { result: json!({}), fine_tuned_model: None }
    }
}

async fn readyz(app: &TestApp) -> (StatusCode, Value) {
    let started = Instant::now();
    let reply = call(&app.router, Method::GET, "/readyz", None, None).await;
    assert!(started.elapsed() < Duration::from_secs(3), "/readyz is fast");
    (reply.status, reply.json())
}

/// Polls `/readyz` until it answers `status` with the worker in `worker`; returns the body.
async fn readyz_until(app: &TestApp, status: StatusCode, worker: &str) -> Value {
    let started = Instant::now();
    loop {
        let (now, body) = readyz(app).await;
        if now == status && body["checks"]["worker"]["status"] == worker {
            return body;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "/readyz stayed {now}: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn fast_queue(app: &TestApp) -> Queue {
    let settings =
        QueueSettings { poll_interval: Duration::from_millis(50), ..QueueSettings::DEFAULT };
    Queue::new(app.state.pool.clone(), settings)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn readyz_reports_a_dead_embedded_worker(pool: sqlx::PgPool) {
    let liveness = WorkerLiveness::new();
    let embedded = liveness.clone();
    let app = app_with(pool, api_config(), move |state| state.worker = Some(embedded)).await;
    let body = readyz_until(&app, StatusCode::SERVICE_UNAVAILABLE, "starting").await;
    assert!(body["reason"].as_str().unwrap().contains("worker starting"), "{body}");

    let options = RunnerOptions { max_jobs: None, liveness: liveness.clone(), shared: None };
    let worker = tokio::spawn(run_worker(
        fast_queue(&app),
        WorkerInfo::new(DeviceKind::Cpu, 1024),
        Arc::new(Succeed),
        options,
        CancellationToken::new(),
    ));
    let body = readyz_until(&app, StatusCode::OK, "running").await;
    assert_eq!(body["status"], "ready");
    assert_eq!(body["checks"]["database"], "ok");

    // The worker's task dies (as a crashed or cancelled task does): readiness says so at once.
    worker.abort();
    assert!(worker.await.unwrap_err().is_cancelled());
    let (status, body) = readyz(&app).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "unavailable");
    assert_eq!(body["checks"]["worker"]["status"], "dead", "{body}");
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("worker dead") && reason.contains("claim loop"), "{reason}");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_supervisor_restarts_a_panicking_worker(pool: sqlx::PgPool) {
    let liveness = WorkerLiveness::new();
    let embedded = liveness.clone();
    let app = app_with(pool, api_config(), move |state| state.worker = Some(embedded)).await;
    let shutdown = CancellationToken::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let start = {
        let (queue, liveness, shutdown, starts) =
            (fast_queue(&app), liveness.clone(), shutdown.clone(), starts.clone());
        move || {
            let (queue, liveness, shutdown) = (queue.clone(), liveness.clone(), shutdown.clone());
            let first = starts.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                assert!(!first, "the first run of the worker panics");
                let options = RunnerOptions { max_jobs: None, liveness, shared: None };
                let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
                Ok(run_worker(queue, worker, Arc::new(Succeed), options, shutdown).await)
            }
        }
    };
    let policy = RestartPolicy {
        initial_delay: Duration::from_millis(500),
        max_delay: Duration::from_millis(500),
        ..RestartPolicy::DEFAULT
    };
    let supervisor = tokio::spawn(supervise_worker(start, liveness, shutdown.clone(), policy));
    let body = readyz_until(&app, StatusCode::SERVICE_UNAVAILABLE, "dead").await;
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("restarting after failure 1") && reason.contains("panicked"), "{body}");
    readyz_until(&app, StatusCode::OK, "running").await;
    assert_eq!(starts.load(Ordering::SeqCst), 2, "restarted once");
    shutdown.cancel();
    let jobs = tokio::time::timeout(Duration::from_secs(10), supervisor).await.unwrap().unwrap();
    assert_eq!(jobs.unwrap(), 0);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_supervisor_gives_up_on_a_worker_that_cannot_start(pool: sqlx::PgPool) {
    let liveness = WorkerLiveness::new();
    let embedded = liveness.clone();
    let app =
        app_with(pool.clone(), api_config(), move |state| state.worker = Some(embedded)).await;
    let config = TrainingWorkerConfig {
        database: DatabaseConfig {
            database_url: verity_testkit::db::database_url_of(&pool).await.unwrap(),
            max_connections: 2,
            acquire_timeout_seconds: 30,
        },
        storage: StorageConfig {
            storage: app.dir.path().display().to_string(),
            s3_path_style: true,
            multipart_threshold_mib: 16,
            signing_secret: String::new(),
            public_url: None,
        },
        queue: QueueConfig::default(),
        // Not a device this build can use: the worker fails as it starts, every time.
        device: "cuda:7".into(),
        memory_mb: 1024,
        cache_dir: app.dir.path().join("cache"),
        grader_workers: 1,
        grader_budget: None,
        max_jobs: None,
        judges: Default::default(),
        tinker_clients: None,
    };
    let shutdown = CancellationToken::new();
    let start = {
        let (liveness, shutdown) = (liveness.clone(), shutdown.clone());
        move || run_training_worker(config.clone(), liveness.clone(), shutdown.clone())
    };
    let policy = RestartPolicy {
        initial_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(40),
        max_failures: 3,
        ..RestartPolicy::DEFAULT
    };
    let error = supervise_worker(start, liveness, shutdown, policy).await.unwrap_err();
    let message = format!("{error:#}");
    assert!(message.contains("3 times in a row") && message.contains("cuda:7"), "{message}");
    let (status, body) = readyz(&app).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("gave up after 3 failures") && reason.contains("cuda:7"), "{reason}");
}
