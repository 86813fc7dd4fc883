//! What inference needs from the database: the one place that turns a request's `model` name
//! into weights (a base model, a job's fine-tuned model, or one of its checkpoints), org
//! checked; and the registry of inference workers the API servers forward to.

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
    /// The checkpoint's folder (a PEFT adapter or full weights), if not the base itself.
    pub checkpoint_prefix: Option<String>,
}

/// Resolves `name` for `org_id`: a base model the org can see, a checkpoint name of one of its
/// jobs, or one of its jobs' `fine_tuned_model` (served from that job's latest checkpoint).
/// `None` when none of these exists in the org (another org's model looks the same).
pub async fn resolve_model(
    pool: &PgPool,
    org_id: Uuid,
    name: &str,
) -> Result<Option<ServedModel>, sqlx::Error> {
    // A registered fine-tuned model (a job's result) is served as its job's checkpoint over the
    // job's base, below: its folder may be an adapter only.
    if let Some(base) = crate::models::get_model(pool, org_id, name).await? {
        if base.job_id.is_none() {
            return Ok(Some(ServedModel { base, checkpoint_prefix: None }));
        }
    }
    let checkpoint = match parse_checkpoint_model_name(name) {
        Some((job_id, step)) => sqlx::query!(
            r#"SELECT j.model, c.storage_prefix, j.id AS job_id, c.step, j.suffix,
                      o.name AS org_name
               FROM checkpoints c
               JOIN jobs j ON j.id = c.job_id
               JOIN orgs o ON o.id = j.org_id
               WHERE j.org_id = $1 AND c.job_id = $2 AND c.step = $3"#,
            org_id,
            job_id,
            step
        )
        .fetch_optional(pool)
        .await?
        .filter(|row| {
            let model = crate::models::fine_tuned_model_name(
                &row.model,
                &row.org_name,
                row.suffix.as_deref(),
                &row.job_id,
            );
            crate::models::checkpoint_model_name(&model, row.step) == name
        })
        .map(|row| (row.model, row.storage_prefix)),
        None => sqlx::query!(
            r#"SELECT j.model, c.storage_prefix FROM jobs j
               JOIN checkpoints c ON c.job_id = j.id
               WHERE j.org_id = $1 AND j.fine_tuned_model = $2
               ORDER BY c.step DESC LIMIT 1"#,
            org_id,
            name
        )
        .fetch_optional(pool)
        .await?
        .map(|row| (row.model, row.storage_prefix)),
    };
    let Some((base_name, prefix)) = checkpoint else { return Ok(None) };
    // The job's base may be shared or the org's own; a job on a since-deleted base cannot run.
    Ok(crate::models::get_model(pool, org_id, &base_name)
        .await?
        .map(|base| ServedModel { base, checkpoint_prefix: Some(prefix) }))
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
