//! Uploaded dataset files: the `files` rows (the content lives in the object store).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// A file row.
#[derive(Debug, Clone)]
pub struct FileRecord {
    /// `file-…`.
    pub id: String,
    /// Owning org.
    pub org_id: Uuid,
    /// Name given at upload.
    pub filename: String,
    /// Declared purpose (`fine-tune`).
    pub purpose: String,
    /// Size in bytes.
    pub bytes: i64,
    /// Number of records, once validated.
    pub line_count: Option<i64>,
    /// `uploaded`, `processed` or `error`.
    pub status: String,
    /// Why validation failed.
    pub status_details: Option<Value>,
    /// Object key of the content.
    pub storage_key: String,
    /// Upload time.
    pub created_at: DateTime<Utc>,
}

/// Inserts a file row.
pub async fn insert_file(pool: &PgPool, file: &FileRecord) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"INSERT INTO files (id, org_id, filename, purpose, bytes, line_count, status, status_details,
                              storage_key, created_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"#,
        file.id,
        file.org_id,
        file.filename,
        file.purpose,
        file.bytes,
        file.line_count,
        file.status,
        file.status_details,
        file.storage_key,
        file.created_at
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The org's file `id`, if it exists.
pub async fn get_file(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<FileRecord>, sqlx::Error> {
    sqlx::query_as!(
        FileRecord,
        r#"SELECT id, org_id, filename, purpose, bytes, line_count, status, status_details, storage_key, created_at
           FROM files WHERE org_id = $1 AND id = $2"#,
        org_id,
        id
    )
    .fetch_optional(pool)
    .await
}

/// The org's files, newest first, after the file `after` (exclusive); at most `limit`.
pub async fn list_files(
    pool: &PgPool,
    org_id: Uuid,
    purpose: Option<&str>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<FileRecord>, sqlx::Error> {
    sqlx::query_as!(
        FileRecord,
        r#"SELECT id, org_id, filename, purpose, bytes, line_count, status, status_details, storage_key, created_at
           FROM files f
           WHERE org_id = $1 AND ($2::text IS NULL OR purpose = $2)
             AND ($3::text IS NULL OR (created_at, id) <
                  (SELECT created_at, id FROM files a WHERE a.org_id = $1 AND a.id = $3))
           ORDER BY created_at DESC, id DESC
           LIMIT $4"#,
        org_id,
        purpose,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// A job or sampling run that reads a file (its `training_file` or `validation_file`; a
/// sampling run's file is its `training_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileUse {
    /// The job's or run's id.
    pub job_id: String,
    /// `fine_tuning`, `evaluation`, `rejection_sampling` or `difficulty_profile`.
    pub kind: String,
    /// Its state (`queued`, `running`, `succeeded`, …).
    pub state: String,
    /// Whether it is the job's training file (a run's file).
    pub training: bool,
    /// Whether it is the job's validation file.
    pub validation: bool,
}

/// The org's jobs and runs that read file `id`, newest first, at most `limit`.
pub async fn file_uses(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
    limit: i64,
) -> Result<Vec<FileUse>, sqlx::Error> {
    sqlx::query_as!(
        FileUse,
        r#"SELECT id AS job_id, kind, state,
                  training_file IS NOT DISTINCT FROM $2 AS "training!",
                  validation_file IS NOT DISTINCT FROM $2 AS "validation!"
           FROM jobs
           WHERE org_id = $1 AND (training_file = $2 OR validation_file = $2)
           ORDER BY created_at DESC, id DESC
           LIMIT $3"#,
        org_id,
        id,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Deletes the org's file `id` unless a job or run reads it (then only with `force`); returns
/// its storage key when it was deleted (`None`: no such file, or one in use without `force`).
pub async fn delete_file(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
    force: bool,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "DELETE FROM files f WHERE f.org_id = $1 AND f.id = $2
           AND ($3 OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.org_id = $1
                                  AND (j.training_file = $2 OR j.validation_file = $2)))
         RETURNING f.storage_key",
        org_id,
        id,
        force
    )
    .fetch_optional(pool)
    .await
}
