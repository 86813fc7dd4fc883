//! `verity worker`: connect, open the store, and run the claim loop with the training handler.

use super::handler::{TrainingHandler, TrainingHandlerConfig};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use verity_core::config::{DatabaseConfig, QueueConfig, StorageConfig};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};

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
    /// Parallel gradings (0 = CPU cores).
    pub grader_workers: usize,
    /// Stop after this many jobs (`None`: until `shutdown`).
    pub max_jobs: Option<usize>,
}

/// Runs the training claim loop until `shutdown` fires (or `max_jobs` jobs ran).
pub async fn run_training_worker(
    config: TrainingWorkerConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<usize> {
    let device = crate::device::parse_device(&config.device)
        .with_context(|| format!("device {:?}", config.device))?;
    let kind = if device.is_cpu() { DeviceKind::Cpu } else { DeviceKind::Cuda };
    let pool =
        verity_core::db::connect(&config.database.database_url, config.database.max_connections)
            .await?;
    let store = verity_core::storage::open_store(&config.storage).await?;
    let settings = QueueSettings {
        lease: config.queue.lease(),
        retry_base: Duration::from_millis(config.queue.retry_base_ms),
        ..QueueSettings::default()
    };
    let queue = Queue::new(pool, settings);
    let handler = TrainingHandler::new(
        store,
        TrainingHandlerConfig {
            cache_dir: config.cache_dir.clone(),
            device,
            grader_workers: config.grader_workers,
        },
    );
    let options = RunnerOptions {
        poll_interval: config.queue.poll_interval(),
        heartbeat_interval: (config.queue.lease() / 4).max(Duration::from_millis(200)),
        max_jobs: config.max_jobs,
    };
    let worker = WorkerInfo::new(kind, config.memory_mb);
    tracing::info!(worker_id = %worker.id, device = %config.device, "training worker started");
    Ok(run_worker(queue, worker, Arc::new(handler), options, shutdown).await?)
}
