//! The local-directory backend: objects are files under a root; writes go to a temporary file
//! that is renamed into place, so readers never see a partial object.

use super::{validate_key, ByteReader, ObjectMeta, ObjectStore, StorageError, UrlSigner};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Folder under the root that holds in-flight writes; never listed.
const TMP_DIR: &str = ".tmp";

/// Temporary files untouched for this long are left over from interrupted writes (a crash, a
/// killed process) and are removed by [`LocalStore::sweep_stale_temp`].
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Objects in a local directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    signer: Option<UrlSigner>,
}

impl LocalStore {
    /// Opens (creating if needed) a store rooted at `root`. With a `signer`, presigned URLs are
    /// signed server URLs; without, they are `file://` paths.
    pub async fn open(
        root: impl AsRef<Path>,
        signer: Option<UrlSigner>,
    ) -> Result<LocalStore, StorageError> {
        let root = root.as_ref();
        tokio::fs::create_dir_all(root.join(TMP_DIR))
            .await
            .map_err(|e| StorageError::io(root.display().to_string(), e))?;
        let root = tokio::fs::canonicalize(root)
            .await
            .map_err(|e| StorageError::io(root.display().to_string(), e))?;
        let store = LocalStore { root, signer };
        if let Err(error) = store.sweep_stale_temp(STALE_TEMP_AGE).await {
            tracing::warn!(%error, "could not sweep the object store's temporary files");
        }
        Ok(store)
    }

    /// Removes temporary files of interrupted writes not modified for `max_age`; writes in
    /// progress keep touching theirs and are left alone. Returns how many were removed.
    pub async fn sweep_stale_temp(&self, max_age: Duration) -> Result<usize, StorageError> {
        let dir = self.root.join(TMP_DIR);
        let key = dir.display().to_string();
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StorageError::io(key, e)),
        };
        let mut removed = 0;
        while let Some(entry) = entries.next_entry().await.map_err(|e| StorageError::io(&key, e))? {
            let Ok(meta) = entry.metadata().await else { continue };
            let age = meta.modified().ok().and_then(|at| at.elapsed().ok());
            if !meta.is_file() || age.is_none_or(|age| age < max_age) {
                continue;
            }
            match tokio::fs::remove_file(entry.path()).await {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(entry.path().display().to_string(), e)),
            }
        }
        if removed > 0 {
            tracing::info!(removed, root = %self.root.display(), "removed stale temporary files");
        }
        Ok(removed)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds `key`.
    pub fn path_of(&self, key: &str) -> Result<PathBuf, StorageError> {
        validate_key(key)?;
        if key == TMP_DIR || key.starts_with(&format!("{TMP_DIR}/")) {
            return Err(StorageError::InvalidKey {
                key: key.to_string(),
                reason: "reserved prefix",
            });
        }
        Ok(self.root.join(key))
    }

    /// The error for `key` found missing: absent, or (when the root itself is gone, e.g. an
    /// unmounted volume) an I/O error, so callers retry instead of concluding it does not exist.
    async fn missing(&self, key: &str, error: std::io::Error) -> StorageError {
        match tokio::fs::metadata(&self.root).await {
            Ok(meta) if meta.is_dir() => StorageError::NotFound(key.to_string()),
            _ => StorageError::io(
                key,
                std::io::Error::new(
                    error.kind(),
                    format!("the store root {} is not available: {error}", self.root.display()),
                ),
            ),
        }
    }

    /// Creates the folders between the root and `path`, never the root itself: if the root is
    /// gone (an unmounted volume, a moved directory) this fails instead of recreating it.
    async fn create_parents(&self, path: &Path) -> std::io::Result<()> {
        let Some(parent) = path.parent() else { return Ok(()) };
        if tokio::fs::metadata(parent).await.is_ok_and(|meta| meta.is_dir()) {
            return Ok(());
        }
        let relative = parent
            .strip_prefix(&self.root)
            .map_err(|_| std::io::Error::other("the object's folder is outside the store root"))?;
        let mut dir = self.root.clone();
        for component in relative.components() {
            dir.push(component);
            match tokio::fs::create_dir(&dir).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Collects files under `dir` whose keys start with `prefix`.
    fn walk(&self, dir: &Path, prefix: &str, out: &mut Vec<ObjectMeta>) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let path = entry.path();
            let Ok(relative) = path.strip_prefix(&self.root) else { continue };
            let key = relative.to_string_lossy().replace('\\', "/");
            if key == TMP_DIR {
                continue;
            }
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                // Descend only where keys below could still match the prefix.
                let dir_key = format!("{key}/");
                if dir_key.starts_with(prefix) || prefix.starts_with(&dir_key) {
                    self.walk(&path, prefix, out)?;
                }
            } else if file_type.is_file() && key.starts_with(prefix) {
                let meta = entry.metadata()?;
                out.push(ObjectMeta {
                    key,
                    size: meta.len(),
                    last_modified: meta.modified().ok().map(DateTime::<Utc>::from),
                });
            }
        }
        Ok(())
    }
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn put_reader(&self, key: &str, mut reader: ByteReader) -> Result<u64, StorageError> {
        let path = self.path_of(key)?;
        let tmp = self.root.join(TMP_DIR).join(uuid::Uuid::new_v4().simple().to_string());
        let mut file = tokio::fs::File::create(&tmp).await.map_err(|e| StorageError::io(key, e))?;
        let written = async {
            let n = tokio::io::copy(&mut reader, &mut file).await?;
            file.flush().await?;
            file.sync_all().await?;
            self.create_parents(&path).await?;
            tokio::fs::rename(&tmp, &path).await?;
            Ok::<u64, std::io::Error>(n)
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        written.map_err(|e| StorageError::io(key, e))
    }

    async fn get_reader(&self, key: &str) -> Result<ByteReader, StorageError> {
        let path = self.path_of(key)?;
        match tokio::fs::File::open(&path).await {
            Ok(file) => Ok(Box::pin(file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(self.missing(key, e).await),
            Err(e) => Err(StorageError::io(key, e)),
        }
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, StorageError> {
        let path = self.path_of(key)?;
        match tokio::fs::metadata(&path).await {
            Ok(meta) if meta.is_file() => Ok(Some(ObjectMeta {
                key: key.to_string(),
                size: meta.len(),
                last_modified: meta.modified().ok().map(DateTime::<Utc>::from),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match self.missing(key, e).await {
                    StorageError::NotFound(_) => Ok(None),
                    unavailable => Err(unavailable),
                }
            }
            Err(e) => Err(StorageError::io(key, e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        // A missing root is an outage, not an empty store.
        if let Err(e) = tokio::fs::read_dir(&self.root).await {
            let message = format!("the store root {} is not available: {e}", self.root.display());
            return Err(StorageError::io(prefix, std::io::Error::new(e.kind(), message)));
        }
        let store = self.clone();
        let wanted = prefix.to_string();
        let mut objects = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            store.walk(&store.root, &wanted, &mut out).map(|_| out)
        })
        .await
        .map_err(|e| StorageError::io(prefix, std::io::Error::other(e)))?
        .map_err(|e| StorageError::io(prefix, e))?;
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        let path = self.path_of(key)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StorageError::io(key, e)),
        }
    }

    async fn sweep_stale_temp(&self, max_age: Duration) -> Result<usize, StorageError> {
        LocalStore::sweep_stale_temp(self, max_age).await
    }

    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, StorageError> {
        let path = self.path_of(key)?;
        if self.head(key).await?.is_none() {
            return Err(StorageError::NotFound(key.to_string()));
        }
        Ok(match &self.signer {
            Some(signer) => {
                let expires = Utc::now().timestamp()
                    + i64::try_from(expires_in.as_secs()).unwrap_or(i64::MAX / 2);
                signer.sign(key, expires)
            }
            None => format!("file://{}", path.display()),
        })
    }
}
