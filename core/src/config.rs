//! Typed configuration, read once at start-up from flags and environment variables.

use clap::Args;
use std::time::Duration;

/// Where Postgres is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// Postgres URL, e.g. postgres://verity@127.0.0.1/verity.
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub database_url: String,
    /// Largest number of pooled connections.
    #[arg(long = "db-max-connections", env = "VERITY_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub max_connections: u32,
}

/// Where objects (files, models, checkpoints, samples) are kept.
#[derive(Debug, Clone, Args)]
pub struct StorageConfig {
    /// `s3://bucket/prefix` for S3 (endpoint and credentials from the standard AWS_* variables),
    /// or a local directory (`file:///path` or a plain path).
    #[arg(long = "storage", env = "VERITY_STORAGE", default_value = "./.verity/objects")]
    pub storage: String,
    /// Use path-style S3 addressing (MinIO, moto, Ceph); needed by most self-hosted S3 servers.
    #[arg(long = "s3-path-style", env = "VERITY_S3_PATH_STYLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub s3_path_style: bool,
    /// Objects larger than this are uploaded in parts (MiB; at least 5).
    #[arg(
        long = "multipart-threshold-mib",
        env = "VERITY_MULTIPART_THRESHOLD_MIB",
        default_value_t = 16
    )]
    pub multipart_threshold_mib: u64,
    /// Secret used to sign download URLs of the local backend.
    #[arg(long = "signing-secret", env = "VERITY_SIGNING_SECRET", default_value = "")]
    pub signing_secret: String,
    /// Public base URL of this server, used in signed download URLs of the local backend.
    #[arg(long = "public-url", env = "VERITY_PUBLIC_URL")]
    pub public_url: Option<String>,
}

/// Queue timing.
#[derive(Debug, Clone, Args)]
pub struct QueueConfig {
    /// How long a claim lasts without a heartbeat (seconds).
    #[arg(long = "lease-seconds", env = "VERITY_LEASE_SECONDS", default_value_t = 60)]
    pub lease_seconds: u64,
    /// How often an idle worker polls when no notification arrives (milliseconds).
    #[arg(long = "poll-ms", env = "VERITY_POLL_MS", default_value_t = 5000)]
    pub poll_ms: u64,
    /// First retry delay after a failure (milliseconds); doubles with each failure.
    #[arg(long = "retry-base-ms", env = "VERITY_RETRY_BASE_MS", default_value_t = 10_000)]
    pub retry_base_ms: u64,
}

impl QueueConfig {
    /// The lease length.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    /// The polling interval.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }
}
