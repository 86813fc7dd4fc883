//! What a job reads and writes in the object store (its database rows go through
//! `verity_core::models` and `verity_core::jobs`).

use bytes::Bytes;
use serde_json::Value;
use verity_core::queue::ResultsFile;
use verity_core::storage::ObjectStore;

/// Writes a finished job's results file (the OpenAI-shaped metrics CSV of every step, see
/// [`verity_core::metrics_csv::results_csv`]) under a new file id; the file row is written
/// when the job completes.
pub async fn write_results_file(
    store: &dyn ObjectStore,
    rows: &[(i32, Value)],
) -> Result<ResultsFile, verity_core::storage::StorageError> {
    let id = verity_core::ids::file_id();
    let storage_key = verity_core::keys::results_file(&id);
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

/// Replaces the lines of `jobs/{id}/metrics.jsonl` for `step` and later with `line`, so a
/// re-run step (after a crash) appears exactly once.
pub async fn append_metrics_line(
    store: &dyn ObjectStore,
    job_id: &str,
    step: u64,
    line: &Value,
) -> anyhow::Result<()> {
    let key = verity_core::keys::metrics(job_id);
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
