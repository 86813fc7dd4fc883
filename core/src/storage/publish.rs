//! Atomic publication of folders (checkpoints, models): every file is uploaded first and the
//! manifest last, so a folder without `manifest.json` is incomplete and readers ignore it.

use super::{ObjectStore, StorageError};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tokio::io::AsyncReadExt;

/// Name of the manifest object inside a published folder.
pub const MANIFEST: &str = "manifest.json";

/// One file of a published folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path relative to the folder, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
}

/// The list of files that makes a published folder complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The files, sorted by path.
    pub files: Vec<ManifestEntry>,
    /// Sum of their sizes.
    pub total_bytes: u64,
    /// When the folder was published (RFC 3339).
    pub created_at: String,
}

impl Manifest {
    /// The manifest of the files `keep` accepts (total recomputed): what a partial download holds.
    pub fn only(&self, keep: impl Fn(&ManifestEntry) -> bool) -> Manifest {
        let files: Vec<ManifestEntry> = self.files.iter().filter(|f| keep(f)).cloned().collect();
        Manifest {
            total_bytes: files.iter().map(|f| f.size).sum(),
            files,
            created_at: self.created_at.clone(),
        }
    }
}

fn join(prefix: &str, path: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        path.to_string()
    } else {
        format!("{prefix}/{path}")
    }
}

/// Files under `dir`, relative and sorted.
fn local_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else if let Ok(relative) = path.strip_prefix(dir) {
                out.push((relative.to_string_lossy().replace('\\', "/"), path));
            }
        }
    }
    out.sort();
    Ok(out)
}

async fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// Deletes the published folder at `prefix`: its manifest first, so that a half-deleted folder
/// is never read as complete, then every object under it.
pub async fn delete_folder(store: &dyn ObjectStore, prefix: &str) -> Result<(), StorageError> {
    let prefix = format!("{}/", prefix.trim_end_matches('/'));
    store.delete(&format!("{prefix}{MANIFEST}")).await?;
    store.delete_prefix(&prefix).await.map(|_| ())
}

/// Uploads every file of `dir` under `prefix`, then the manifest; returns the manifest.
/// A `manifest.json` inside `dir` is refused (it would be overwritten).
pub async fn publish_folder(
    store: &dyn ObjectStore,
    dir: &Path,
    prefix: &str,
) -> Result<Manifest, StorageError> {
    let dir_name = dir.display().to_string();
    let files = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || local_files(&dir))
            .await
            .map_err(|e| StorageError::io(&dir_name, std::io::Error::other(e)))?
            .map_err(|e| StorageError::io(&dir_name, e))?
    };
    let mut entries = Vec::with_capacity(files.len());
    for (relative, path) in files {
        if relative == MANIFEST {
            return Err(StorageError::Integrity {
                key: join(prefix, MANIFEST),
                reason: "the folder already holds a manifest.json".into(),
            });
        }
        let key = join(prefix, &relative);
        let (size, sha256) = sha256_file(&path).await.map_err(|e| StorageError::io(&key, e))?;
        let uploaded = store.put_file(&key, &path).await?;
        if uploaded != size {
            return Err(StorageError::Integrity {
                key,
                reason: format!("{size} bytes on disk but {uploaded} uploaded (file changed?)"),
            });
        }
        entries.push(ManifestEntry { path: relative, size, sha256 });
    }
    let manifest = Manifest {
        total_bytes: entries.iter().map(|e| e.size).sum(),
        files: entries,
        created_at: chrono::Utc::now().to_rfc3339(),
    };
    let body = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| StorageError::io(prefix, std::io::Error::other(e)))?;
    store.put_bytes(&join(prefix, MANIFEST), Bytes::from(body)).await?;
    Ok(manifest)
}

/// The manifest of the folder at `prefix`, or `None` if it was never completely published.
pub async fn read_manifest(
    store: &dyn ObjectStore,
    prefix: &str,
) -> Result<Option<Manifest>, StorageError> {
    let key = join(prefix, MANIFEST);
    match store.get_bytes(&key).await {
        Ok(body) => serde_json::from_slice(&body).map(Some).map_err(|e| StorageError::Integrity {
            key,
            reason: format!("unreadable manifest: {e}"),
        }),
        Err(StorageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Downloads a published folder into `dir`, checking each file's size and hash.
pub async fn download_folder(
    store: &dyn ObjectStore,
    prefix: &str,
    dir: &Path,
) -> Result<Manifest, StorageError> {
    let manifest = read_manifest(store, prefix).await?.ok_or_else(|| {
        StorageError::NotFound(format!("{} (folder not published)", join(prefix, MANIFEST)))
    })?;
    for entry in &manifest.files {
        super::validate_key(&entry.path)?;
        let key = join(prefix, &entry.path);
        let target = dir.join(&entry.path);
        store.get_to_file(&key, &target).await?;
        let (size, sha256) = sha256_file(&target).await.map_err(|e| StorageError::io(&key, e))?;
        if size != entry.size || sha256 != entry.sha256 {
            return Err(StorageError::Integrity {
                key,
                reason: format!(
                    "expected {} bytes sha256 {}, got {size} bytes sha256 {sha256}",
                    entry.size, entry.sha256
                ),
            });
        }
    }
    Ok(manifest)
}
