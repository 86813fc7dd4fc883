//! A real training worker process for the crash test: the production claim loop and training
//! handler, configured from the environment (`DATABASE_URL`, `VERITY_STORAGE`,
//! `VERITY_CACHE_DIR`, `TEST_LEASE_MS`).

use std::path::PathBuf;
use tokio_util::sync::CancellationToken;
use verity_core::config::{DatabaseConfig, QueueConfig, StorageConfig};
use verity_core::queue::WorkerLiveness;
use verity_worker::job::{run_training_worker, TrainingWorkerConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let lease_ms: u64 =
        std::env::var("TEST_LEASE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let config = TrainingWorkerConfig {
        database: DatabaseConfig {
            database_url: std::env::var("DATABASE_URL")?,
            max_connections: 4,
            acquire_timeout_seconds: 30,
        },
        storage: StorageConfig {
            storage: std::env::var("VERITY_STORAGE")?,
            s3_path_style: true,
            multipart_threshold_mib: 16,
            signing_secret: String::new(),
            public_url: None,
        },
        queue: QueueConfig {
            lease_seconds: lease_ms.div_ceil(1000),
            poll_ms: 100,
            retry_base_ms: 100,
            ..QueueConfig::default()
        },
        device: "cpu".into(),
        memory_mb: 1024,
        cache_dir: PathBuf::from(std::env::var("VERITY_CACHE_DIR")?),
        grader_workers: 2,
        grader_budget: None,
        max_jobs: Some(1),
        judges: Default::default(),
        tinker_clients: None,
    };
    run_training_worker(config, WorkerLiveness::new(), CancellationToken::new()).await?;
    Ok(())
}
