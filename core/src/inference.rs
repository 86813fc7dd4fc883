//! What inference needs from the database: a request's `model` name as weights (a base model,
//! a job's fine-tuned model, or one of its checkpoints, org checked; resolved by
//! [`crate::lineage`]); and the registry of inference workers the API servers forward to.

use crate::models::ModelRecord;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// The job id and step a checkpoint model name ([`crate::models::checkpoint_model_name`])
/// points at: the segment before `:ckpt-step-N` is the job id.
pub fn parse_checkpoint_model_name(name: &str) -> Option<(&str, i32)> {
    let rest = name.strip_prefix(crate::models::FINE_TUNED_PREFIX)?;
    let (rest, step) = rest.rsplit_once(":ckpt-step-")?;
    let (_, job_id) = rest.rsplit_once(':')?;
    Some((job_id, step.parse().ok()?))
}

/// A servable model: its base and, for a fine-tuned model, the checkpoint served over it.
#[derive(Debug, Clone)]
pub struct ServedModel {
    /// The base model (its weights, or the base a LoRA checkpoint applies to).
    pub base: ModelRecord,
    /// Checkpoint folders folded into the base's weights before the served checkpoint, bottom
    /// first (a job chained from another job's model; see [`crate::lineage::ModelStack`]).
    pub merged: Vec<String>,
    /// The checkpoint's folder (a PEFT adapter or full weights), if not the base itself.
    pub checkpoint_prefix: Option<String>,
}

/// Resolves `name` for `org_id` ([`crate::lineage::resolve_stack`]): a base model the org can
/// see, a checkpoint name of one of its jobs, or one of its jobs' `fine_tuned_model` (served
/// from that job's latest checkpoint). `None` when none of these exists in the org (another
/// org's model looks the same).
pub async fn resolve_model(
    pool: &PgPool,
    org_id: Uuid,
    name: &str,
) -> Result<Option<ServedModel>, sqlx::Error> {
    let Some(stack) = crate::lineage::resolve_stack(pool, org_id, name).await? else {
        return Ok(None);
    };
    let mut merged: Vec<String> = stack.layers.into_iter().map(|l| l.storage_prefix).collect();
    let checkpoint_prefix = merged.pop();
    Ok(Some(ServedModel { base: stack.base, merged, checkpoint_prefix }))
}

/// A registered inference worker.
#[derive(Debug, Clone)]
pub struct InferenceWorkerRecord {
    /// The worker's id (new at each start).
    pub id: Uuid,
    /// Base URL API servers reach it at (`http://host:port`).
    pub address: String,
    /// Bearer token it accepts.
    pub token: String,
    /// Cache keys of the models it has loaded.
    pub models: Value,
    /// Requests it is running.
    pub active: i32,
    /// Last heartbeat.
    pub last_seen_at: DateTime<Utc>,
}

/// Registers or refreshes an inference worker (its heartbeat).
pub async fn heartbeat_inference_worker(
    pool: &PgPool,
    worker: &InferenceWorkerRecord,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"INSERT INTO inference_workers (id, address, token, models, active)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (id) DO UPDATE SET address = $2, token = $3, models = $4, active = $5,
                                          last_seen_at = now()"#,
        worker.id,
        worker.address,
        worker.token,
        worker.models,
        worker.active
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes an inference worker's row (clean shutdown).
pub async fn remove_inference_worker(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query!("DELETE FROM inference_workers WHERE id = $1", id).execute(pool).await?;
    Ok(())
}

/// Inference workers seen in the last `fresh_secs` seconds, least busy first.
pub async fn live_inference_workers(
    pool: &PgPool,
    fresh_secs: f64,
) -> Result<Vec<InferenceWorkerRecord>, sqlx::Error> {
    sqlx::query_as!(
        InferenceWorkerRecord,
        r#"SELECT id, address, token, models, active, last_seen_at FROM inference_workers
           WHERE last_seen_at > now() - make_interval(secs => $1)
           ORDER BY active, last_seen_at DESC"#,
        fresh_secs
    )
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names_round_trip() {
        let model =
            crate::models::fine_tuned_model_name("org:model", "Acme", Some("x"), "ftjob-abc");
        let name = crate::models::checkpoint_model_name(&model, 12);
        assert_eq!(parse_checkpoint_model_name(&name), Some(("ftjob-abc", 12)));
        assert_eq!(parse_checkpoint_model_name("tiny"), None);
        assert_eq!(parse_checkpoint_model_name("ft:tiny:ftjob-a:ckpt-step-x"), None);
    }
}
