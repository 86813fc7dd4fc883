//! `verity worker`: connect, open the store, and run the claim loop with the training handler.

use super::handler::{TrainingHandler, TrainingHandlerConfig};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use verity_core::config::{DatabaseConfig, QueueConfig, StorageConfig};
use verity_core::db::DbError;
use verity_core::queue::{
    is_transient_db_error, retry_transient, run_worker, DeviceKind, Queue, QueueSettings,
    RetryPolicy, RunnerOptions, SharedKind, WorkerInfo, WorkerLiveness,
};
use verity_core::storage::StorageError;
use verity_verifiers::GradingBudget;

/// Everything `verity worker` needs.
#[derive(Debug, Clone)]
pub struct TrainingWorkerConfig {
    /// Postgres.
    pub database: DatabaseConfig,
    /// Object store.
    pub storage: StorageConfig,
    /// Lease and polling.
    pub queue: QueueConfig,
    /// `cpu` or `cuda[:N]`.
    pub device: String,
    /// Memory this worker offers a job (MiB).
    pub memory_mb: i64,
    /// Local cache of models and checkpoints.
    pub cache_dir: PathBuf,
    /// Parallel gradings (0 = CPU cores), for every job of this worker together.
    pub grader_workers: usize,
    /// A grading budget shared with the rest of the process (`verity up` passes the API's);
    /// `None`: a budget of `grader_workers` of its own.
    pub grader_budget: Option<GradingBudget>,
    /// Stop after this many jobs (`None`: until `shutdown`).
    pub max_jobs: Option<usize>,
    /// Routing, timeouts and retries of model graders' judges.
    pub judges: crate::judge::JudgeSettings,
    /// The most Tinker training clients held at once (`None`: [`default_tinker_clients`]).
    pub tinker_clients: Option<usize>,
}

/// How many Tinker training clients a worker holds at once unless told: 4 on a CPU, where a
/// client's model is small and mostly waits for its user's next call; 1 on a GPU, whose memory
/// holds one client's model, optimizer and activations safely (raise it for LoRA on small
/// models).
pub fn default_tinker_clients(device: DeviceKind) -> usize {
    match device {
        DeviceKind::Cpu => 4,
        DeviceKind::Cuda => 1,
    }
}

/// Runs the training claim loop until `shutdown` fires (or `max_jobs` jobs ran), reporting to
/// `liveness`. Connecting to the database and opening the store are retried with backoff while
/// they fail transiently (a worker may start before Postgres); a configuration error (bad
/// device, URL or store location) ends it with an error. Once running, only `shutdown` ends it.
pub async fn run_training_worker(
    config: TrainingWorkerConfig,
    liveness: WorkerLiveness,
    shutdown: CancellationToken,
) -> anyhow::Result<usize> {
    let device = crate::device::parse_device(&config.device)
        .with_context(|| format!("device {:?}", config.device))?;
    let kind = if device.is_cpu() { DeviceKind::Cpu } else { DeviceKind::Cuda };
    let database = &config.database;
    let connect = || verity_core::db::connect(&database.database_url, database.max_connections);
    let transient_db =
        |e: &DbError| matches!(e, DbError::Connect { source, .. } if is_transient_db_error(source));
    let Ok(pool) = retry_until_stopped("connecting to Postgres", &shutdown, transient_db, connect)
        .await
        .map_err(|e| anyhow::Error::new(e).context("connecting to Postgres"))?
    else {
        return Ok(0);
    };
    let open = || verity_core::storage::open_store(&config.storage);
    let Ok(store) = retry_until_stopped(
        "opening the object store",
        &shutdown,
        StorageError::is_transient,
        open,
    )
    .await
    .map_err(|e| anyhow::Error::new(e).context("opening the object store"))?
    else {
        return Ok(0);
    };
    let queue = Queue::new(pool, QueueSettings::from(&config.queue));
    let budget =
        config.grader_budget.clone().unwrap_or_else(|| GradingBudget::new(config.grader_workers));
    let handler = TrainingHandler::with_budget(
        store,
        TrainingHandlerConfig {
            cache_dir: config.cache_dir.clone(),
            device,
            grader_workers: budget.size(),
        },
        budget,
    )
    .with_judge_settings(config.judges.clone());
    let clients = config.tinker_clients.unwrap_or_else(|| default_tinker_clients(kind));
    let shared =
        SharedKind { kind: verity_core::tinker::clients::TINKER.to_string(), max: clients };
    let options = RunnerOptions { max_jobs: config.max_jobs, liveness, shared: Some(shared) };
    let worker = WorkerInfo::new(kind, config.memory_mb);
    tracing::info!(worker_id = %worker.id, device = %config.device, tinker_clients = clients, "training worker started");
    Ok(run_worker(queue, worker, Arc::new(handler), options, shutdown).await)
}

/// Retries `op` with the workers' backoff, without a time budget, while it fails transiently;
/// `Ok(Err(()))` when `shutdown` fired first.
async fn retry_until_stopped<T, E, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    is_transient: impl Fn(&E) -> bool,
    op: F,
) -> Result<Result<T, ()>, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let policy = RetryPolicy { budget: Duration::MAX, ..RetryPolicy::WORKER };
    let attempt = retry_transient(what, policy, is_transient, || shutdown.is_cancelled(), op);
    tokio::select! {
        result = attempt => result.map(Ok),
        _ = shutdown.cancelled() => Ok(Err(())),
    }
}
