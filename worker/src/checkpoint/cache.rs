//! The local cache of fetched models and checkpoints: a published folder downloaded once into a
//! cache folder (checked by its manifest), never written or deleted outside the cache root.

use anyhow::{anyhow, Context};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use verity_core::storage::{download_folder, read_manifest, ObjectStore};

/// One lock per cache folder being filled in this process: the jobs and clients a worker runs
/// side by side (and `verity up`'s inference worker beside them) often want the same base
/// model at once, and two downloads into one folder would delete each other's files.
static FILLING: LazyLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Default::default);

/// The lock of cache folder `dir` (locks no one holds or waits for are dropped on the way).
fn filling_lock(dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    let mut locks = FILLING.lock().unwrap_or_else(|p| p.into_inner());
    locks.retain(|_, lock| Arc::strong_count(lock) > 1);
    locks.entry(dir.to_path_buf()).or_default().clone()
}

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
/// Calls for one folder in this process take turns, so the second finds the first's copy.
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
    let lock = filling_lock(dir);
    let _turn = lock.lock().await;
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

    /// Two clients of one base model starting together on one worker: both get the whole
    /// folder, downloaded once.
    #[tokio::test]
    async fn calls_for_one_folder_take_turns_and_share_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path().join("objects"), None).await.unwrap();
        let source = dir.path().join("source");
        std::fs::create_dir_all(&source).unwrap();
        for i in 0..8 {
            std::fs::write(source.join(format!("shard-{i}.bin")), vec![i as u8; 1 << 16]).unwrap();
        }
        verity_core::storage::publish_folder(&store, &source, "models/m").await.unwrap();
        let root = dir.path().join("cache/models");
        let target = root.join("m");
        let fetch = || cached_folder(&store, "models/m", &root, &target);
        let (a, b, c) = tokio::join!(fetch(), fetch(), fetch());
        for got in [a, b, c] {
            assert_eq!(got.unwrap(), target);
        }
        for i in 0..8 {
            let bytes = std::fs::read(target.join(format!("shard-{i}.bin"))).unwrap();
            assert_eq!(bytes, vec![i as u8; 1 << 16]);
        }
        let left: Vec<_> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["m"], "no partial download left behind");
    }
}
