//! Typed configuration, read once at start-up from flags and environment variables.

use crate::queue::QueueSettings;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// The device flag of every role that runs a model (`verity worker`, `inference`, `up`,
/// `generate`).
#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Device: cpu, cuda or cuda:N.
    #[arg(long = "device", value_name = "DEVICE", env = "VERITY_DEVICE", default_value = "cpu")]
    pub name: String,
}

/// The local model cache of every role that downloads models (`verity worker`, `inference`).
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// Local cache of models and checkpoints.
    #[arg(long = "cache-dir", env = "VERITY_CACHE_DIR", default_value = "./.verity/cache")]
    pub dir: PathBuf,
}

/// Where Postgres is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseConfig {
    /// Postgres URL, e.g. postgres://verity@127.0.0.1/verity.
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub database_url: String,
    /// Largest number of pooled connections.
    #[arg(long = "db-max-connections", env = "VERITY_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub max_connections: u32,
    /// Longest an API request waits for a pooled connection before answering 503 (seconds);
    /// workers keep the longer [`crate::db::WORKER_ACQUIRE_TIMEOUT`].
    #[arg(
        long = "db-acquire-timeout-seconds",
        env = "VERITY_DB_ACQUIRE_TIMEOUT_SECONDS",
        default_value_t = 3
    )]
    pub acquire_timeout_seconds: u64,
}

impl DatabaseConfig {
    /// The API's acquire timeout (at least one second).
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_secs(self.acquire_timeout_seconds.max(1))
    }
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

/// Queue timing on the command line; defaults and meaning are those of [`QueueSettings`], into
/// which it converts (`QueueSettings::from(&config)`).
#[derive(Debug, Clone, Args)]
pub struct QueueConfig {
    /// How long a claim lasts without a heartbeat (seconds).
    #[arg(long = "lease-seconds", env = "VERITY_LEASE_SECONDS", default_value_t = QueueConfig::default().lease_seconds)]
    pub lease_seconds: u64,
    /// How often an idle worker polls when no notification arrives (milliseconds).
    #[arg(long = "poll-ms", env = "VERITY_POLL_MS", default_value_t = QueueConfig::default().poll_ms)]
    pub poll_ms: u64,
    /// First retry delay after a failure (milliseconds); doubles with each failure.
    #[arg(long = "retry-base-ms", env = "VERITY_RETRY_BASE_MS", default_value_t = QueueConfig::default().retry_base_ms)]
    pub retry_base_ms: u64,
    /// Longest retry delay (seconds).
    #[arg(long = "retry-max-seconds", env = "VERITY_RETRY_MAX_SECONDS", default_value_t = QueueConfig::default().retry_max_seconds)]
    pub retry_max_seconds: u64,
    /// Most jobs one org may have running at once (0: no limit); read by workers when claiming.
    #[arg(long = "org-max-running", env = "VERITY_ORG_MAX_RUNNING", default_value_t = QueueConfig::default().org_max_running)]
    pub org_max_running: u32,
    /// Most jobs one org may have queued (0: no limit); the API answers 429 beyond it.
    #[arg(long = "org-max-queued", env = "VERITY_ORG_MAX_QUEUED", default_value_t = QueueConfig::default().org_max_queued)]
    pub org_max_queued: u32,
}

impl Default for QueueConfig {
    fn default() -> QueueConfig {
        let defaults = QueueSettings::DEFAULT;
        QueueConfig {
            lease_seconds: defaults.lease.as_secs(),
            poll_ms: defaults.poll_interval.as_millis() as u64,
            retry_base_ms: defaults.retry_base.as_millis() as u64,
            retry_max_seconds: defaults.retry_max.as_secs(),
            org_max_running: defaults.org_max_running,
            org_max_queued: defaults.org_max_queued,
        }
    }
}

impl From<&QueueConfig> for QueueSettings {
    fn from(config: &QueueConfig) -> QueueSettings {
        QueueSettings {
            lease: Duration::from_secs(config.lease_seconds),
            poll_interval: Duration::from_millis(config.poll_ms),
            retry_base: Duration::from_millis(config.retry_base_ms),
            retry_max: Duration::from_secs(config.retry_max_seconds),
            org_max_running: config.org_max_running,
            org_max_queued: config.org_max_queued,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_defaults_are_the_settings_defaults() {
        assert_eq!(QueueSettings::from(&QueueConfig::default()), QueueSettings::DEFAULT);
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            queue: QueueConfig,
        }
        let parsed = <Cli as clap::Parser>::parse_from(["verity"]).queue;
        // The environment may override the flags; compare only when it does not.
        let queue_vars = [
            "VERITY_LEASE_SECONDS",
            "VERITY_POLL_MS",
            "VERITY_RETRY_BASE_MS",
            "VERITY_RETRY_MAX_SECONDS",
            "VERITY_ORG_MAX_RUNNING",
            "VERITY_ORG_MAX_QUEUED",
        ];
        if queue_vars.iter().all(|var| std::env::var_os(var).is_none()) {
            assert_eq!(QueueSettings::from(&parsed), QueueSettings::DEFAULT);
        }
    }
}
