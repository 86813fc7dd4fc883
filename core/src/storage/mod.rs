//! Object storage: one trait, two backends (a local directory and S3), plus atomic publication
//! of folders (checkpoints) behind a manifest written last.

mod key;
mod local;
mod publish;
mod s3;
mod signing;

pub use key::validate_key;
pub use local::{LocalStore, STALE_TEMP_AGE};
pub use publish::{
    delete_folder, download_folder, publish_folder, read_manifest, Manifest, ManifestEntry,
    MANIFEST,
};
pub use s3::{S3Options, S3Store};
pub use signing::UrlSigner;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// A stream of bytes read from or written to a store.
pub type ByteReader = Pin<Box<dyn AsyncRead + Send>>;

/// What a store knows about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, when the backend says.
    pub last_modified: Option<DateTime<Utc>>,
}

/// Storage failures, each naming the key involved.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// No object under that key.
    #[error("object {0:?} not found")]
    NotFound(String),
    /// The key is not acceptable (absolute, `..`, empty segments, …).
    #[error("invalid object key {key:?}: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// Why.
        reason: &'static str,
    },
    /// A local I/O error.
    #[error("I/O error on {key:?}: {source}")]
    Io {
        /// The key or path.
        key: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The S3 service answered with an error (after retries).
    #[error("S3 {op} of {key:?} failed: {message}")]
    S3 {
        /// The operation.
        op: &'static str,
        /// The key.
        key: String,
        /// The service's message with its cause chain.
        message: String,
    },
    /// Stored data does not match its manifest.
    #[error("integrity check failed for {key:?}: {reason}")]
    Integrity {
        /// The key.
        key: String,
        /// What did not match.
        reason: String,
    },
    /// The store's location could not be understood.
    #[error("invalid storage configuration: {0}")]
    Config(String),
}

impl StorageError {
    /// True for failures another try may not hit: I/O errors (a missing or unwritable store
    /// root, a full disk) and S3 errors that outlasted the SDK's own retries. Missing objects,
    /// bad keys, bad configuration and integrity failures are permanent.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Io { .. } | StorageError::S3 { .. })
    }

    pub(crate) fn io(key: impl Into<String>, source: std::io::Error) -> StorageError {
        StorageError::Io { key: key.into(), source }
    }
}

/// An object store. Keys are relative `/`-separated paths (see [`validate_key`]).
#[async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// Streams `reader` into `key`, replacing any object there; returns the bytes written.
    /// Readers never see a partial object.
    async fn put_reader(&self, key: &str, reader: ByteReader) -> Result<u64, StorageError>;

    /// Opens `key` for streaming reads.
    async fn get_reader(&self, key: &str) -> Result<ByteReader, StorageError>;

    /// Size and date of `key`, or `None` when absent.
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StorageError>;

    /// Every object whose key starts with `prefix`, sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError>;

    /// Removes `key`; absent keys are not an error.
    async fn delete(&self, key: &str) -> Result<(), StorageError>;

    /// A URL from which `key` can be downloaded without other credentials until `expires_in`.
    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, StorageError>;

    /// Removes leftovers of interrupted writes older than `max_age`; returns how many. Only the
    /// local backend has any (failed S3 multipart uploads are aborted).
    async fn sweep_stale_temp(&self, _max_age: Duration) -> Result<usize, StorageError> {
        Ok(0)
    }

    /// Proves the store accepts writes: writes a small object under `key`, reads its size back,
    /// and deletes it (readiness probes).
    async fn probe_write(&self, key: &str) -> Result<(), StorageError> {
        let body = Bytes::from_static(b"verity readiness probe");
        self.put_bytes(key, body.clone()).await?;
        let seen = self.head(key).await;
        let deleted = self.delete(key).await;
        match seen? {
            Some(meta) if meta.size == body.len() as u64 => deleted,
            _ => Err(StorageError::Integrity {
                key: key.to_string(),
                reason: "the probe object was not readable after writing it".to_string(),
            }),
        }
    }

    /// Writes `bytes` to `key`.
    async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), StorageError> {
        self.put_reader(key, Box::pin(std::io::Cursor::new(bytes))).await?;
        Ok(())
    }

    /// Streams the local file at `path` into `key`.
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StorageError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| StorageError::io(path.display().to_string(), e))?;
        self.put_reader(key, Box::pin(file)).await
    }

    /// Reads the whole object into memory (small objects only).
    async fn get_bytes(&self, key: &str) -> Result<Bytes, StorageError> {
        let mut reader = self.get_reader(key).await?;
        let mut buf = Vec::new();
        reader.read_to_end(&mut buf).await.map_err(|e| StorageError::io(key, e))?;
        Ok(Bytes::from(buf))
    }

    /// Streams `key` into a local file (written beside it, then renamed); returns its size.
    async fn get_to_file(&self, key: &str, path: &Path) -> Result<u64, StorageError> {
        let mut reader = self.get_reader(key).await?;
        let parent = path.parent().unwrap_or_else(|| Path::new("."));
        tokio::fs::create_dir_all(parent).await.map_err(|e| StorageError::io(key, e))?;
        let partial = path.with_extension(format!("partial-{}", uuid::Uuid::new_v4().simple()));
        let mut file =
            tokio::fs::File::create(&partial).await.map_err(|e| StorageError::io(key, e))?;
        let copied = tokio::io::copy(&mut reader, &mut file).await;
        let finished = match copied {
            Ok(n) => file.flush().await.map(|_| n),
            Err(e) => Err(e),
        };
        match finished {
            Ok(n) => {
                tokio::fs::rename(&partial, path).await.map_err(|e| StorageError::io(key, e))?;
                Ok(n)
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                Err(StorageError::io(key, e))
            }
        }
    }

    /// Removes every object under `prefix`; returns how many.
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StorageError> {
        let objects = self.list(prefix).await?;
        for object in &objects {
            self.delete(&object.key).await?;
        }
        Ok(objects.len())
    }
}

/// File name of the optimizer state inside a checkpoint folder (left out of weights-only
/// downloads and of what a served or exported model reads).
pub const TRAINER_STATE: &str = "trainer_state.safetensors";

/// Folder of the small objects readiness probes write and delete again (no API object uses it).
pub const PROBE_PREFIX: &str = ".readyz";

/// Probe objects older than this were left by a probe that could not delete its object (a
/// store outage during the delete, a process killed mid-probe); a probe lasts at most seconds.
pub const STALE_PROBE_AGE: Duration = Duration::from_secs(600);

/// Removes readiness-probe objects (under [`PROBE_PREFIX`]) last written more than `max_age`
/// ago; returns how many. Objects whose backend reports no date are kept.
pub async fn sweep_stale_probes(
    store: &dyn ObjectStore,
    max_age: Duration,
) -> Result<usize, StorageError> {
    let max_age = chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
    let cutoff = Utc::now().checked_sub_signed(max_age).unwrap_or(DateTime::<Utc>::MIN_UTC);
    let mut removed = 0;
    for object in store.list(&format!("{PROBE_PREFIX}/")).await? {
        if object.last_modified.is_some_and(|at| at <= cutoff) {
            store.delete(&object.key).await?;
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, "removed stale readiness-probe objects");
    }
    Ok(removed)
}

/// How often [`spawn_temp_sweeper`] sweeps.
pub const TEMP_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// Sweeps `store`'s stale temporary files ([`STALE_TEMP_AGE`]) and stale readiness-probe
/// objects ([`STALE_PROBE_AGE`]) every [`TEMP_SWEEP_INTERVAL`] until the runtime stops; failures
/// are logged and retried at the next sweep.
pub fn spawn_temp_sweeper(store: Arc<dyn ObjectStore>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TEMP_SWEEP_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await; // the first tick is immediate; opening the store already swept
        loop {
            every.tick().await;
            if let Err(error) = store.sweep_stale_temp(STALE_TEMP_AGE).await {
                tracing::warn!(%error, "could not sweep the object store's temporary files");
            }
            if let Err(error) = sweep_stale_probes(store.as_ref(), STALE_PROBE_AGE).await {
                tracing::warn!(%error, "could not sweep the object store's probe objects");
            }
        }
    })
}

/// Opens the store a configuration names: `s3://bucket[/prefix]`, `file:///dir` or a directory.
pub async fn open_store(
    config: &crate::config::StorageConfig,
) -> Result<Arc<dyn ObjectStore>, StorageError> {
    let location = config.storage.trim();
    if let Some(rest) = location.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(StorageError::Config(format!("no bucket in {location:?}")));
        }
        let options = S3Options {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            path_style: config.s3_path_style,
            multipart_threshold: config.multipart_threshold_mib.max(5) * 1024 * 1024,
            ..S3Options::default()
        };
        return Ok(Arc::new(S3Store::connect(options).await?));
    }
    let dir = location.strip_prefix("file://").unwrap_or(location);
    if dir.is_empty() {
        return Err(StorageError::Config("empty storage location".to_string()));
    }
    let signer = match (&config.public_url, config.signing_secret.is_empty()) {
        (Some(base), false) => Some(UrlSigner::new(base, config.signing_secret.as_bytes())),
        _ => None,
    };
    Ok(Arc::new(LocalStore::open(dir, signer).await?))
}
