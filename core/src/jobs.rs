//! Read models of jobs and everything a job writes (events, checkpoints, metrics, samples),
//! always scoped by org, plus the aggregate counts the server exports as metrics.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::job_state::JobState;

/// A job row as the API shows it.
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// `ftjob-…`.
    pub id: String,
    /// Owning org.
    pub org_id: Uuid,
    /// The org's name (its slug is part of the fine-tuned model's name).
    pub org_name: String,
    /// Base model.
    pub model: String,
    /// Training file id.
    pub training_file: Option<String>,
    /// Validation file id.
    pub validation_file: Option<String>,
    /// Suffix of the fine-tuned model's name.
    pub suffix: Option<String>,
    /// Seed.
    pub seed: i64,
    /// Method, grader and hyperparameters as submitted.
    pub spec: Value,
    /// User metadata.
    pub metadata: Option<Value>,
    /// Queue state.
    pub state: JobState,
    /// Pending request to the worker (`none`, `cancel`, `pause`).
    pub control: String,
    /// Last error.
    pub error: Option<Value>,
    /// Progress the worker reported.
    pub progress: Option<Value>,
    /// Final model name.
    pub fine_tuned_model: Option<String>,
    /// What the worker reported on success (`trained_tokens`, `result_files`, …).
    pub result: Option<Value>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// End time, for terminal states.
    pub finished_at: Option<DateTime<Utc>>,
    /// Budget cap on wall seconds ([`crate::budget`]).
    pub max_wall_seconds: Option<i64>,
    /// Budget cap on generated tokens ([`crate::budget`]).
    pub max_tokens: Option<i64>,
    /// Wall seconds used so far ([`crate::budget::Usage`]).
    pub used_wall_seconds: f64,
    /// Generated tokens used so far ([`crate::budget::Usage`]).
    pub used_tokens: i64,
}

/// The org's fine-tuning job `id` (sampling runs are read by [`crate::sampling_runs`]).
pub async fn get_job(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<JobRecord>, sqlx::Error> {
    get_job_of_kind(pool, org_id, "fine_tuning", id).await
}

/// The org's queue row `id` of kind `kind` (`fine_tuning`, or a sampling run's kind).
pub async fn get_job_of_kind(
    pool: &PgPool,
    org_id: Uuid,
    kind: &str,
    id: &str,
) -> Result<Option<JobRecord>, sqlx::Error> {
    sqlx::query_as!(
        JobRecord,
        r#"SELECT j.id, j.org_id, o.name AS org_name, j.model, j.training_file, j.validation_file,
                  j.suffix, j.seed, j.spec, j.metadata, j.state AS "state: JobState", j.control, j.error, j.progress,
                  j.fine_tuned_model, j.result, j.created_at, j.finished_at,
                  j.max_wall_seconds, j.max_tokens, j.used_wall_seconds, j.used_tokens
           FROM jobs j JOIN orgs o ON o.id = j.org_id
           WHERE j.org_id = $1 AND j.kind = $2 AND j.id = $3"#,
        org_id,
        kind,
        id
    )
    .fetch_optional(pool)
    .await
}

/// The org's fine-tuning jobs, newest first, after job `after` (exclusive); at most `limit`.
pub async fn list_jobs(
    pool: &PgPool,
    org_id: Uuid,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<JobRecord>, sqlx::Error> {
    list_jobs_matching(pool, org_id, after, limit, &MetadataFilter::Any).await
}

/// Which jobs a listing keeps by their metadata: OpenAI's `metadata[k]=v` and `metadata=null`
/// filters of `GET /v1/fine_tuning/jobs`.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MetadataFilter {
    /// Every job.
    #[default]
    Any,
    /// The jobs whose metadata holds every one of these pairs.
    Holds(serde_json::Map<String, Value>),
    /// The jobs without metadata (none, or an empty object).
    Without,
}

/// [`list_jobs`] keeping only the jobs `filter` keeps.
pub async fn list_jobs_matching(
    pool: &PgPool,
    org_id: Uuid,
    after: Option<&str>,
    limit: i64,
    filter: &MetadataFilter,
) -> Result<Vec<JobRecord>, sqlx::Error> {
    list_jobs_of_kind(pool, org_id, "fine_tuning", after, limit, filter).await
}

/// The org's queue rows of kind `kind` that `filter` keeps, newest first, after `after`
/// (exclusive); at most `limit`.
pub async fn list_jobs_of_kind(
    pool: &PgPool,
    org_id: Uuid,
    kind: &str,
    after: Option<&str>,
    limit: i64,
    filter: &MetadataFilter,
) -> Result<Vec<JobRecord>, sqlx::Error> {
    let (holds, without) = match filter {
        MetadataFilter::Any => (None, false),
        MetadataFilter::Holds(pairs) => (Some(Value::Object(pairs.clone())), false),
        MetadataFilter::Without => (None, true),
    };
    sqlx::query_as!(
        JobRecord,
        r#"SELECT j.id, j.org_id, o.name AS org_name, j.model, j.training_file, j.validation_file,
                  j.suffix, j.seed, j.spec, j.metadata, j.state AS "state: JobState", j.control, j.error, j.progress,
                  j.fine_tuned_model, j.result, j.created_at, j.finished_at,
                  j.max_wall_seconds, j.max_tokens, j.used_wall_seconds, j.used_tokens
           FROM jobs j JOIN orgs o ON o.id = j.org_id
           WHERE j.org_id = $1 AND j.kind = $2
             AND ($3::text IS NULL OR (j.created_at, j.id) <
                  (SELECT created_at, id FROM jobs a WHERE a.org_id = $1 AND a.id = $3))
             AND ($5::jsonb IS NULL OR j.metadata @> $5)
             AND (NOT $6 OR j.metadata IS NULL OR j.metadata = '{}'::jsonb)
           ORDER BY j.created_at DESC, j.id DESC
           LIMIT $4"#,
        org_id,
        kind,
        after,
        limit,
        holds,
        without
    )
    .fetch_all(pool)
    .await
}

/// Why a failed job (or sampling run) failed, as its stored error says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Machine-readable code (`job_failed` / `run_failed` when the error has none).
    pub code: String,
    /// What happened.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

impl JobRecord {
    /// Why the row failed (`None` unless its state is `failed`); `kind` (`job`, `run`) names
    /// it in the defaults of an error without a code or message.
    pub fn failure(&self, kind: &str) -> Option<Failure> {
        let error = self.error.as_ref().filter(|_| self.state == JobState::Failed)?;
        let text = |key: &str| error.get(key).and_then(Value::as_str).map(str::to_string);
        Some(Failure {
            code: text("code").unwrap_or_else(|| format!("{kind}_failed")),
            message: text("message").unwrap_or_else(|| format!("the {kind} failed")),
            param: text("param"),
        })
    }

    /// The name of the model this job produces (and, with `:ckpt-step-N`, of its checkpoints).
    pub fn output_model_name(&self) -> String {
        crate::models::fine_tuned_model_name(
            &self.model,
            &self.org_name,
            self.suffix.as_deref(),
            &self.id,
        )
    }
}

/// A job event row.
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// Sequence number (increasing).
    pub id: i64,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// What happened (`created`, `state`, `metrics`, …).
    pub kind: String,
    /// Human-readable text.
    pub message: String,
    /// Structured details.
    pub data: Option<Value>,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// Events of a job, newest first, older than event `before_id` when given; at most `limit`.
pub async fn list_events(
    pool: &PgPool,
    job_id: &str,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<EventRecord>, sqlx::Error> {
    sqlx::query_as!(
        EventRecord,
        r#"SELECT id, level, kind, message, data, created_at FROM job_events
           WHERE job_id = $1 AND ($2::bigint IS NULL OR id < $2)
           ORDER BY id DESC LIMIT $3"#,
        job_id,
        before_id,
        limit
    )
    .fetch_all(pool)
    .await
}

/// A checkpoint row.
#[derive(Debug, Clone)]
pub struct CheckpointRecord {
    /// `ftckpt-…`.
    pub id: String,
    /// Owning job.
    pub job_id: String,
    /// Training step.
    pub step: i32,
    /// Published folder.
    pub storage_prefix: String,
    /// Total size.
    pub bytes: i64,
    /// Metrics at that step.
    pub metrics: Option<Value>,
    /// When it was registered.
    pub created_at: DateTime<Utc>,
}

/// Checkpoints of a job, latest step first, with steps below `before_step` when given.
pub async fn list_checkpoints(
    pool: &PgPool,
    job_id: &str,
    before_step: Option<i32>,
    limit: i64,
) -> Result<Vec<CheckpointRecord>, sqlx::Error> {
    sqlx::query_as!(
        CheckpointRecord,
        r#"SELECT id, job_id, step, storage_prefix, bytes, metrics, created_at FROM checkpoints
           WHERE job_id = $1 AND ($2::int4 IS NULL OR step < $2)
           ORDER BY step DESC LIMIT $3"#,
        job_id,
        before_step,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The checkpoint `id` of a job.
pub async fn get_checkpoint(
    pool: &PgPool,
    job_id: &str,
    id: &str,
) -> Result<Option<CheckpointRecord>, sqlx::Error> {
    sqlx::query_as!(
        CheckpointRecord,
        r#"SELECT id, job_id, step, storage_prefix, bytes, metrics, created_at FROM checkpoints
           WHERE job_id = $1 AND id = $2"#,
        job_id,
        id
    )
    .fetch_optional(pool)
    .await
}

/// The e-mail of the user who created each of the org's jobs `ids` (jobs created by a deleted
/// user are absent), as `(job id, e-mail)`.
pub async fn job_creators(
    pool: &PgPool,
    org_id: Uuid,
    ids: &[String],
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT j.id, u.email FROM jobs j JOIN users u ON u.id = j.created_by
           WHERE j.org_id = $1 AND j.id = ANY($2)"#,
        org_id,
        ids
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.email)).collect())
}

/// Every checkpoint of the org's jobs (for the model list), newest first, each with the name of
/// the model its job produces ([`JobRecord::output_model_name`]).
pub async fn org_checkpoints(
    pool: &PgPool,
    org_id: Uuid,
) -> Result<Vec<(CheckpointRecord, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT c.id, c.job_id, c.step, c.storage_prefix, c.bytes, c.metrics, c.created_at,
                  j.model, j.suffix, o.name AS org_name
           FROM checkpoints c JOIN jobs j ON j.id = c.job_id JOIN orgs o ON o.id = j.org_id
           WHERE j.org_id = $1 ORDER BY c.created_at DESC, c.id DESC"#,
        org_id
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let name = crate::models::fine_tuned_model_name(
                &r.model,
                &r.org_name,
                r.suffix.as_deref(),
                &r.job_id,
            );
            let record = CheckpointRecord {
                id: r.id,
                job_id: r.job_id,
                step: r.step,
                storage_prefix: r.storage_prefix,
                bytes: r.bytes,
                metrics: r.metrics,
                created_at: r.created_at,
            };
            (record, name)
        })
        .collect())
}

/// Deletes a checkpoint row; returns whether it existed.
pub async fn delete_checkpoint(pool: &PgPool, job_id: &str, id: &str) -> Result<bool, sqlx::Error> {
    let deleted = sqlx::query!("DELETE FROM checkpoints WHERE job_id = $1 AND id = $2", job_id, id)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(deleted > 0)
}

/// Which metrics rows to read: steps after `after_step`, at most `limit` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsWindow {
    /// Only steps strictly greater than this.
    pub after_step: i32,
    /// At most this many rows.
    pub limit: i64,
}

impl MetricsWindow {
    /// Every row of the job.
    pub const ALL: MetricsWindow = MetricsWindow { after_step: i32::MIN, limit: i64::MAX };
}

/// A window of a job's per-step metrics as one JSON array text (`[{"step": n, …}, …]`, by
/// step), built by Postgres so that large jobs cost one round trip and no re-encoding, and
/// whether rows after the window exist.
pub async fn metrics_json(
    pool: &PgPool,
    job_id: &str,
    window: MetricsWindow,
) -> Result<(String, bool), sqlx::Error> {
    let row = sqlx::query!(
        r#"WITH page AS (
               SELECT step, data FROM job_metrics WHERE job_id = $1 AND step > $2 ORDER BY step LIMIT $3)
           SELECT coalesce((SELECT jsonb_agg(jsonb_build_object('step', step) || data ORDER BY step) FROM page),
                           '[]'::jsonb)::text AS "rows!",
                  EXISTS (SELECT 1 FROM job_metrics
                          WHERE job_id = $1 AND step > coalesce((SELECT max(step) FROM page), $2)) AS "has_more!""#,
        job_id,
        window.after_step,
        window.limit
    )
    .fetch_one(pool)
    .await?;
    Ok((row.rows, row.has_more))
}

/// Every per-step metrics row of a job as JSON object text (`{"step": n, …}`), by step.
pub async fn metrics_row_texts(
    pool: &PgPool,
    job_id: &str,
) -> Result<Vec<(i32, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT step, (jsonb_build_object('step', step) || data)::text AS "row!"
           FROM job_metrics WHERE job_id = $1 ORDER BY step"#,
        job_id
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.step, r.row)).collect())
}

/// The per-step metrics of a job, by step.
pub async fn metrics_rows(pool: &PgPool, job_id: &str) -> Result<Vec<(i32, Value)>, sqlx::Error> {
    metrics_rows_in(pool, job_id, MetricsWindow::ALL).await
}

/// A window of a job's per-step metrics, by step.
pub async fn metrics_rows_in(
    pool: &PgPool,
    job_id: &str,
    window: MetricsWindow,
) -> Result<Vec<(i32, Value)>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT step, data FROM job_metrics WHERE job_id = $1 AND step > $2 ORDER BY step LIMIT $3",
        job_id,
        window.after_step,
        window.limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.step, r.data)).collect())
}

/// A completion's entry in the samples index, read back with its step (the worker writes
/// [`crate::queue::SampleIndexRow`]).
#[derive(Debug, Clone)]
pub struct IndexedSample {
    /// Training step.
    pub step: i32,
    /// Index within the step.
    pub idx: i32,
    /// Index of the prompt it answers.
    pub prompt_idx: i32,
    /// Total reward.
    pub score: Option<f64>,
    /// Advantage.
    pub advantage: Option<f64>,
    /// Why sampling stopped.
    pub finish_reason: Option<String>,
    /// Object holding the full sample.
    pub storage_key: String,
    /// Line in that object (0-based).
    pub line_no: i32,
}

/// Filters on a job's samples.
#[derive(Debug, Clone, Default)]
pub struct SampleFilter {
    /// Only this step.
    pub step: Option<i32>,
    /// Score at least this.
    pub min_score: Option<f64>,
    /// Score at most this.
    pub max_score: Option<f64>,
    /// Start after this (step, idx).
    pub after: Option<(i32, i32)>,
    /// Only a training job's validation samples (`true`: those without an advantage, kept by
    /// its evaluations during training) or only its training samples (`false`).
    pub validation: Option<bool>,
}

/// A job's samples by (step, idx), filtered; at most `limit`.
pub async fn list_samples(
    pool: &PgPool,
    job_id: &str,
    filter: &SampleFilter,
    limit: i64,
) -> Result<Vec<IndexedSample>, sqlx::Error> {
    let (after_step, after_idx) = filter.after.map_or((None, None), |(s, i)| (Some(s), Some(i)));
    sqlx::query_as!(
        IndexedSample,
        r#"SELECT step, idx, prompt_idx, score, advantage, finish_reason, storage_key, line_no FROM samples
           WHERE job_id = $1
             AND ($2::int4 IS NULL OR step = $2)
             AND ($3::float8 IS NULL OR score >= $3)
             AND ($4::float8 IS NULL OR score <= $4)
             AND ($5::int4 IS NULL OR (step, idx) > ($5, $6::int4))
             AND ($8::bool IS NULL OR (advantage IS NULL) = $8)
           ORDER BY step, idx LIMIT $7"#,
        job_id,
        filter.step,
        filter.min_score,
        filter.max_score,
        after_step,
        after_idx,
        limit,
        filter.validation
    )
    .fetch_all(pool)
    .await
}

/// Counts for monitoring.
#[derive(Debug, Clone, Default)]
pub struct QueueStats {
    /// Jobs per state.
    pub by_state: Vec<(String, i64)>,
    /// Queued jobs that may run now.
    pub queue_depth: i64,
    /// Workers that sent a heartbeat within the window.
    pub workers_seen: i64,
}

/// Job counts by state, runnable queue depth, and workers seen in the last `window_secs`.
pub async fn queue_stats(pool: &PgPool, window_secs: f64) -> Result<QueueStats, sqlx::Error> {
    let by_state =
        sqlx::query!(r#"SELECT state, count(*) AS "n!" FROM jobs GROUP BY state ORDER BY state"#)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|r| (r.state, r.n))
            .collect();
    let queue_depth = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM jobs WHERE state = 'queued' AND run_after <= now()"#
    )
    .fetch_one(pool)
    .await?;
    let workers_seen = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM workers WHERE last_seen_at > now() - make_interval(secs => $1)"#,
        window_secs
    )
    .fetch_one(pool)
    .await?;
    Ok(QueueStats { by_state, queue_depth, workers_seen })
}

/// The fingerprint of a job's metrics rows: row count and latest write.
pub type MetricsVersion = (i64, Option<DateTime<Utc>>);

/// A fingerprint of a job's metrics (row count and latest write) that changes with every write.
pub async fn metrics_version(pool: &PgPool, job_id: &str) -> Result<MetricsVersion, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT count(*) AS "rows!", max(created_at) AS latest FROM job_metrics WHERE job_id = $1"#,
        job_id
    )
    .fetch_one(pool)
    .await?;
    Ok((row.rows, row.latest))
}

/// The last step a job recorded metrics for, if any (where a resumed attempt carries on).
pub async fn last_metric_step(pool: &PgPool, job_id: &str) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar!("SELECT max(step) FROM job_metrics WHERE job_id = $1", job_id)
        .fetch_one(pool)
        .await
}
