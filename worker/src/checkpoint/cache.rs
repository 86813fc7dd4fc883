//! The local cache of fetched models and checkpoints: a published folder downloaded once into a
//! cache folder (checked by its manifest), never written or deleted outside the cache root.

use anyhow::{anyhow, Context};
use std::path::{Path, PathBuf};
use verity_core::storage::{download_folder, read_manifest, ObjectStore};

/// A cache path that is not strictly inside its cache root: refused before anything is
/// written or deleted (a permanent error, never retried).
#[derive(Debug, thiserror::Error)]
#[error("cache folder {path} is not strictly inside {root}")]
pub struct OutsideCache {
    /// The cache root.
    pub root: PathBuf,
    /// The refused path.
    pub path: PathBuf,
}

/// Deletes the folder `dir` (if present) after checking that it lies strictly inside `root`
/// ([`verity_core::names::strictly_inside`]); anything else is refused and left alone.
pub fn remove_cache_dir(root: &Path, dir: &Path) -> Result<(), OutsideCache> {
    if !verity_core::names::strictly_inside(root, dir) {
        return Err(OutsideCache { root: root.to_path_buf(), path: dir.to_path_buf() });
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

/// Downloads the published folder at `prefix` into `dir` (which must lie strictly inside the
/// cache folder `root`) unless a complete copy is there (its manifest matches); returns `dir`.
pub async fn cached_folder(
    store: &dyn ObjectStore,
    prefix: &str,
    root: &Path,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let partial = dir.with_extension(format!("partial-{}", std::process::id()));
    for path in [dir, partial.as_path()] {
        if !verity_core::names::strictly_inside(root, path) {
            return Err(OutsideCache { root: root.to_path_buf(), path: path.to_path_buf() }.into());
        }
    }
    let remote = read_manifest(store, prefix)
        .await
        .with_context(|| format!("reading the manifest of {prefix}"))?
        .ok_or_else(|| anyhow!("{prefix} holds no published folder (manifest.json is missing)"))?;
    let marker = dir.join(".verity-manifest.json");
    let remote_json = serde_json::to_vec(&remote)?;
    if std::fs::read(&marker).ok().as_deref() == Some(remote_json.as_slice()) {
        return Ok(dir.to_path_buf());
    }
    remove_cache_dir(root, &partial)?;
    download_folder(store, prefix, &partial)
        .await
        .with_context(|| format!("downloading {prefix}"))?;
    std::fs::write(partial.join(".verity-manifest.json"), &remote_json)?;
    remove_cache_dir(root, dir)?;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(&partial, dir)
        .with_context(|| format!("moving {} into place", dir.display()))?;
    Ok(dir.to_path_buf())
}

/// The file to load from a downloaded model folder: the folder (HF) or its `.gguf` file.
pub fn model_path(dir: &Path, format: &str) -> anyhow::Result<PathBuf> {
    if format != "gguf" {
        return Ok(dir.to_path_buf());
    }
    std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "gguf"))
        .ok_or_else(|| anyhow!("the model folder holds no .gguf file"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use verity_core::storage::LocalStore;

    /// The cache layout a `..` or `.` model name used to reach: a sibling's files must survive.
    fn cache_with_sentinels() -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let sentinels = vec![cache.join("models/other/weights"), cache.join("serving/x/weights")];
        for sentinel in &sentinels {
            std::fs::create_dir_all(sentinel.parent().unwrap()).unwrap();
            std::fs::write(sentinel, b"keep").unwrap();
        }
        (dir, cache, sentinels)
    }

    #[test]
    fn removing_refuses_anything_not_strictly_inside_the_root() {
        let (_dir, cache, sentinels) = cache_with_sentinels();
        let root = cache.join("models");
        for outside in [root.join(".."), root.join("."), root.clone(), cache.clone()] {
            assert!(remove_cache_dir(&root, &outside).is_err(), "{}", outside.display());
        }
        assert!(remove_cache_dir(&root, &root.join("other/../..")).is_err());
        assert!(sentinels.iter().all(|s| s.exists()));
        remove_cache_dir(&root, &root.join("other")).unwrap();
        assert!(!sentinels[0].exists() && sentinels[1].exists());
    }

    #[tokio::test]
    async fn a_cached_folder_outside_its_root_is_refused_before_any_download() {
        let (dir, cache, sentinels) = cache_with_sentinels();
        let store = LocalStore::open(dir.path().join("objects"), None).await.unwrap();
        let root = cache.join("models");
        for outside in [root.join(".."), root.join(".")] {
            let error = cached_folder(&store, "models/m", &root, &outside).await.unwrap_err();
            assert!(error.downcast_ref::<OutsideCache>().is_some(), "{error:#}");
        }
        assert!(sentinels.iter().all(|s| s.exists()));
    }
}
