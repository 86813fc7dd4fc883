//! `verity worker`: claim training jobs from the queue and run them until SIGTERM / ctrl-c.

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;
use verity_core::config::{DatabaseConfig, QueueConfig, StorageConfig};
use verity_core::queue::WorkerLiveness;
use verity_worker::job::{run_training_worker, TrainingWorkerConfig};

/// Options of `verity worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    database: DatabaseConfig,
    #[command(flatten)]
    storage: StorageConfig,
    #[command(flatten)]
    queue: QueueConfig,
    /// The device jobs run on.
    #[command(flatten)]
    device: verity_core::config::DeviceArgs,
    /// Memory this worker offers a job (MiB); jobs asking for more are left to others.
    #[arg(long = "memory-mb", env = "VERITY_WORKER_MEMORY_MB", default_value_t = 16_384)]
    memory_mb: i64,
    /// Local cache of models and checkpoints.
    #[command(flatten)]
    cache: verity_core::config::CacheArgs,
    /// Parallel gradings (0 = number of cores).
    #[arg(long = "grader-workers", env = "VERITY_GRADER_WORKERS", default_value_t = 0)]
    grader_workers: usize,
    /// The most Tinker training clients held at once (default: 4 on a CPU, 1 on a GPU); each
    /// holds its own model and optimizer state, and their calls share the device.
    #[arg(long = "tinker-clients", env = "VERITY_TINKER_CLIENTS", value_parser = clap::value_parser!(u16).range(1..))]
    tinker_clients: Option<u16>,
    /// Exit after this many jobs.
    #[arg(long = "max-jobs")]
    max_jobs: Option<usize>,
    /// Judges of model graders.
    #[command(flatten)]
    judges: verity_server::api::state::JudgeArgs,
}

/// Runs the claim loop; the first SIGTERM or ctrl-c stops claiming (a running job is left to its
/// lease, so another worker resumes it from its last checkpoint). Database and store outages
/// are retried inside the loop; if the worker cannot run at all (bad device or configuration)
/// it returns the reason, and the process exits non-zero.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        verity_server::app::shutdown_signal().await;
        trigger.cancel();
    });
    // The worker opens its own store (sweeping it once); this one sweeps it periodically,
    // opened in the background so an unreachable store never delays the claim loop.
    let storage = args.storage.clone();
    tokio::spawn(async move {
        match verity_core::storage::open_store(&storage).await {
            Ok(store) => {
                let _ = verity_core::storage::spawn_temp_sweeper(store).await;
            }
            Err(error) => tracing::warn!(%error, "no periodic sweep of the object store"),
        }
    });
    let config = training_config(args)?;
    let jobs = run_training_worker(config, WorkerLiveness::new(), shutdown)
        .await
        .context("the worker stopped")?;
    tracing::info!(jobs, "worker stopped");
    Ok(())
}

/// The training worker's configuration from the command's options (shared with `verity up`).
pub fn training_config(args: WorkerArgs) -> anyhow::Result<TrainingWorkerConfig> {
    Ok(TrainingWorkerConfig {
        judges: args.judges.settings()?,
        database: args.database,
        storage: args.storage,
        queue: args.queue,
        device: args.device.name,
        memory_mb: args.memory_mb,
        cache_dir: args.cache.dir,
        grader_workers: args.grader_workers,
        grader_budget: None,
        max_jobs: args.max_jobs,
        tinker_clients: args.tinker_clients.map(usize::from),
    })
}
