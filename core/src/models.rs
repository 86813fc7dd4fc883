//! Registered models: base models (shared or per org) and fine-tuned ones.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// A model row.
#[derive(Debug, Clone)]
pub struct ModelRecord {
    /// The model's name, used as `model` in job requests.
    pub id: String,
    /// Owning org; `None` for a base model every org sees.
    pub org_id: Option<Uuid>,
    /// `base` or `fine_tuned`.
    pub kind: String,
    /// Folder in the object store.
    pub storage_prefix: String,
    /// `hf`, `gguf` or `peft`.
    pub format: String,
    /// Extra facts (architecture, size, …).
    pub config: Value,
    /// Job that produced it (fine-tuned models).
    pub job_id: Option<String>,
    /// Registration time.
    pub created_at: DateTime<Utc>,
}

/// Models `org_id` can see (shared ones and its own), by name.
pub async fn list_models(pool: &PgPool, org_id: Uuid) -> Result<Vec<ModelRecord>, sqlx::Error> {
    sqlx::query_as!(
        ModelRecord,
        r#"SELECT id, org_id, kind, storage_prefix, format, config, job_id, created_at FROM models
           WHERE org_id IS NULL OR org_id = $1 ORDER BY id"#,
        org_id
    )
    .fetch_all(pool)
    .await
}

/// The model `id` if `org_id` can see it.
pub async fn get_model(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<ModelRecord>, sqlx::Error> {
    sqlx::query_as!(
        ModelRecord,
        r#"SELECT id, org_id, kind, storage_prefix, format, config, job_id, created_at FROM models
           WHERE id = $2 AND (org_id IS NULL OR org_id = $1)"#,
        org_id,
        id
    )
    .fetch_optional(pool)
    .await
}

/// The model `id` whoever owns it (workers and admin commands; API handlers use [`get_model`],
/// which checks the caller's org).
pub async fn model_by_id(pool: &PgPool, id: &str) -> Result<Option<ModelRecord>, sqlx::Error> {
    sqlx::query_as!(
        ModelRecord,
        r#"SELECT id, org_id, kind, storage_prefix, format, config, job_id, created_at FROM models
           WHERE id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// Registers a base model; returns false when the name is taken.
pub async fn insert_base_model(
    pool: &PgPool,
    org_id: Option<Uuid>,
    id: &str,
    storage_prefix: &str,
    format: &str,
    config: &Value,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query!(
        r#"INSERT INTO models (id, org_id, kind, storage_prefix, format, config)
           VALUES ($1, $2, 'base', $3, $4, $5) ON CONFLICT (id) DO NOTHING"#,
        id,
        org_id,
        storage_prefix,
        format,
        config
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(inserted > 0)
}
