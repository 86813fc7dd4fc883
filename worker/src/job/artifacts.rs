//! What a job reads and writes in the object store (its database rows go through
//! `verity_core::models` and `verity_core::jobs`).

use anyhow::{anyhow, Context};
use bytes::Bytes;
use serde_json::Value;
use std::path::{Path, PathBuf};
use verity_core::queue::ResultsFile;
use verity_core::storage::{download_folder, read_manifest, ObjectStore};

/// Downloads the published folder at `prefix` into `dir` unless a complete copy is there
/// (its manifest matches); returns `dir`.
pub async fn cached_folder(
    store: &dyn ObjectStore,
    prefix: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let remote = read_manifest(store, prefix)
        .await
        .with_context(|| format!("reading the manifest of {prefix}"))?
        .ok_or_else(|| anyhow!("{prefix} holds no published folder (manifest.json is missing)"))?;
    let marker = dir.join(".verity-manifest.json");
    let remote_json = serde_json::to_vec(&remote)?;
    if std::fs::read(&marker).ok().as_deref() == Some(remote_json.as_slice()) {
        return Ok(dir.to_path_buf());
    }
    let partial = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    download_folder(store, prefix, &partial)
        .await
        .with_context(|| format!("downloading {prefix}"))?;
    std::fs::write(partial.join(".verity-manifest.json"), &remote_json)?;
    let _ = std::fs::remove_dir_all(dir);
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

/// Writes a finished job's results file (the OpenAI-shaped metrics CSV of every step, see
/// [`verity_core::metrics_csv::results_csv`]) under a new file id; the file row is written
/// when the job completes.
pub async fn write_results_file(
    store: &dyn ObjectStore,
    rows: &[(i32, Value)],
) -> Result<ResultsFile, verity_core::storage::StorageError> {
    let id = verity_core::ids::file_id();
    let storage_key = format!("files/{id}.csv");
    let csv = verity_core::metrics_csv::results_csv(rows);
    let bytes = csv.len() as i64;
    store.put_bytes(&storage_key, Bytes::from(csv)).await?;
    Ok(ResultsFile {
        id,
        filename: "step_metrics.csv".to_string(),
        storage_key,
        bytes,
        line_count: rows.len() as i64,
    })
}

/// Key of a dataset file.
pub fn file_key(file_id: &str) -> String {
    format!("files/{file_id}.jsonl")
}

/// Replaces the lines of `jobs/{id}/metrics.jsonl` for `step` and later with `line`, so a
/// re-run step (after a crash) appears exactly once.
pub async fn append_metrics_line(
    store: &dyn ObjectStore,
    job_id: &str,
    step: u64,
    line: &Value,
) -> anyhow::Result<()> {
    let key = format!("jobs/{job_id}/metrics.jsonl");
    let existing = match store.head(&key).await? {
        Some(_) => store.get_bytes(&key).await?,
        None => Bytes::new(),
    };
    let mut out = String::new();
    for old in String::from_utf8_lossy(&existing).lines() {
        let keep = serde_json::from_str::<Value>(old)
            .ok()
            .and_then(|v| v.get("step").and_then(Value::as_u64))
            .is_some_and(|s| s < step);
        if keep {
            out.push_str(old);
            out.push('\n');
        }
    }
    out.push_str(&line.to_string());
    out.push('\n');
    store.put_bytes(&key, Bytes::from(out)).await?;
    Ok(())
}
