//! What a worker holding a job may do: heartbeat, write events, metrics, checkpoints and sample
//! rows, and end the attempt. Every write is fenced on the attempt number.

use super::{secs, ClaimedJob, Queue, QueueError};
use crate::ControlSignal;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// Severity of a job event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventLevel {
    /// Details.
    Debug,
    /// Normal progress.
    Info,
    /// Something the user should look at.
    Warn,
    /// A failure.
    Error,
}

impl EventLevel {
    fn as_str(self) -> &'static str {
        match self {
            EventLevel::Debug => "debug",
            EventLevel::Info => "info",
            EventLevel::Warn => "warn",
            EventLevel::Error => "error",
        }
    }
}

/// How a failed attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum FailOutcome {
    /// Queued again; claimable from `at`.
    Retrying {
        /// When the retry becomes claimable.
        at: DateTime<Utc>,
    },
    /// Failed for good.
    Failed,
    /// A cancel request arrived meanwhile; the job is cancelled.
    Cancelled,
}

/// One completion's entry in the samples index.
#[derive(Debug, Clone)]
pub struct SampleIndexRow {
    /// Position within the step.
    pub idx: i32,
    /// Which prompt of the step it answers.
    pub prompt_idx: i32,
    /// Total reward.
    pub score: Option<f64>,
    /// Its advantage.
    pub advantage: Option<f64>,
    /// `stop`, `length`, …
    pub finish_reason: Option<String>,
    /// Object holding the full sample.
    pub storage_key: String,
    /// Line of that object.
    pub line_no: i32,
}

/// `purpose` of the results files finished jobs write (OpenAI's value).
pub const RESULTS_PURPOSE: &str = "fine-tune-results";

/// The per-step metrics file a finished job lists in `result_files`, already in the store.
#[derive(Debug, Clone)]
pub struct ResultsFile {
    /// `file-…`.
    pub id: String,
    /// Name shown in the files list.
    pub filename: String,
    /// Object key of the content.
    pub storage_key: String,
    /// Size in bytes.
    pub bytes: i64,
    /// Data rows (steps).
    pub line_count: i64,
}

/// What a successful training run produced, registered when the job completes.
#[derive(Debug, Clone)]
pub struct TrainedModel {
    /// Published folder of the final checkpoint.
    pub storage_prefix: String,
    /// `hf` (full weights) or `peft` (a LoRA adapter).
    pub format: String,
    /// The results file.
    pub results_file: Option<ResultsFile>,
}

/// A claimed job: the only handle through which a worker may write.
#[derive(Debug, Clone)]
pub struct Lease {
    queue: Queue,
    job: ClaimedJob,
    worker_id: String,
}

impl Lease {
    pub(crate) fn new(queue: Queue, job: ClaimedJob, worker_id: String) -> Lease {
        Lease { queue, job, worker_id }
    }

    /// The job this lease holds.
    pub fn job(&self) -> &ClaimedJob {
        &self.job
    }

    /// The worker holding it.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The queue it came from.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    fn lost(&self) -> QueueError {
        QueueError::LeaseLost { job_id: self.job.id.clone(), attempt: self.job.attempt }
    }

    fn fenced(&self, err: sqlx::Error) -> QueueError {
        QueueError::fenced(err, &self.job.id, self.job.attempt)
    }

    /// Extends the lease and returns what the user asked for (continue, cancel or pause).
    /// `progress`, when given, is stored on the job for the API.
    pub async fn heartbeat(&self, progress: Option<&Value>) -> Result<ControlSignal, QueueError> {
        let control = sqlx::query_scalar!(
            r#"WITH seen AS (UPDATE workers SET last_seen_at = now() WHERE id = $3)
               UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $4),
                               heartbeat_at = now(), progress = coalesce($5, progress)
               WHERE id = $1 AND attempt = $2 AND state = 'running'
               RETURNING control"#,
            self.job.id,
            self.job.attempt,
            self.worker_id,
            secs(self.queue.settings.lease),
            progress,
        )
        .fetch_optional(&self.queue.pool)
        .await?
        .ok_or_else(|| self.lost())?;
        Ok(ControlSignal::from_column(&control))
    }

    /// Appends an event to the job's log.
    pub async fn event(
        &self,
        level: EventLevel,
        kind: &str,
        message: &str,
        data: Option<&Value>,
    ) -> Result<(), QueueError> {
        sqlx::query!(
            "INSERT INTO job_events (job_id, attempt, level, kind, message, data) VALUES ($1, $2, $3, $4, $5, $6)",
            self.job.id,
            self.job.attempt,
            level.as_str(),
            kind,
            message,
            data,
        )
        .execute(&self.queue.pool)
        .await
        .map_err(|e| self.fenced(e))?;
        Ok(())
    }

    /// Records the metrics of `step`; a step re-run by a later attempt replaces the earlier row,
    /// so each step has exactly one row.
    pub async fn metric(&self, step: i32, data: &Value) -> Result<(), QueueError> {
        sqlx::query!(
            r#"INSERT INTO job_metrics (job_id, step, attempt, data) VALUES ($1, $2, $3, $4)
               ON CONFLICT (job_id, step) DO UPDATE
               SET attempt = EXCLUDED.attempt, data = EXCLUDED.data, created_at = now()"#,
            self.job.id,
            step,
            self.job.attempt,
            data,
        )
        .execute(&self.queue.pool)
        .await
        .map_err(|e| self.fenced(e))?;
        Ok(())
    }

    /// Registers a checkpoint already published under `storage_prefix`; returns its id.
    pub async fn checkpoint(
        &self,
        step: i32,
        storage_prefix: &str,
        bytes: i64,
        metrics: Option<&Value>,
    ) -> Result<String, QueueError> {
        let id = sqlx::query_scalar!(
            r#"INSERT INTO checkpoints (id, job_id, step, attempt, storage_prefix, bytes, metrics)
               VALUES ($1, $2, $3, $4, $5, $6, $7)
               ON CONFLICT (job_id, step) DO UPDATE
               SET attempt = EXCLUDED.attempt, storage_prefix = EXCLUDED.storage_prefix,
                   bytes = EXCLUDED.bytes, metrics = EXCLUDED.metrics, created_at = now()
               RETURNING id"#,
            crate::ids::checkpoint_id(),
            self.job.id,
            step,
            self.job.attempt,
            storage_prefix,
            bytes,
            metrics,
        )
        .fetch_one(&self.queue.pool)
        .await
        .map_err(|e| self.fenced(e))?;
        Ok(id)
    }

    /// Indexes the samples of `step` (replacing any rows an earlier attempt wrote for it).
    pub async fn samples(&self, step: i32, rows: &[SampleIndexRow]) -> Result<(), QueueError> {
        let idx: Vec<i32> = rows.iter().map(|r| r.idx).collect();
        let prompt_idx: Vec<i32> = rows.iter().map(|r| r.prompt_idx).collect();
        let score: Vec<Option<f64>> = rows.iter().map(|r| r.score).collect();
        let advantage: Vec<Option<f64>> = rows.iter().map(|r| r.advantage).collect();
        let finish: Vec<Option<String>> = rows.iter().map(|r| r.finish_reason.clone()).collect();
        let key: Vec<String> = rows.iter().map(|r| r.storage_key.clone()).collect();
        let line: Vec<i32> = rows.iter().map(|r| r.line_no).collect();
        sqlx::query!(
            r#"INSERT INTO samples (job_id, step, attempt, idx, prompt_idx, score, advantage,
                                    finish_reason, storage_key, line_no)
               SELECT $1, $2, $3, * FROM UNNEST($4::int4[], $5::int4[], $6::float8[], $7::float8[],
                                                $8::text[], $9::text[], $10::int4[])
               ON CONFLICT (job_id, step, idx) DO UPDATE
               SET attempt = EXCLUDED.attempt, prompt_idx = EXCLUDED.prompt_idx,
                   score = EXCLUDED.score, advantage = EXCLUDED.advantage,
                   finish_reason = EXCLUDED.finish_reason, storage_key = EXCLUDED.storage_key,
                   line_no = EXCLUDED.line_no"#,
            self.job.id,
            step,
            self.job.attempt,
            &idx,
            &prompt_idx,
            &score as &[Option<f64>],
            &advantage as &[Option<f64>],
            &finish as &[Option<String>],
            &key,
            &line,
        )
        .execute(&self.queue.pool)
        .await
        .map_err(|e| self.fenced(e))?;
        Ok(())
    }

    /// Registers a file the job wrote to the store (e.g. a rejection-sampling run's dataset) as
    /// a processed file of the job's org with `purpose`, while this attempt holds the job.
    /// Idempotent: a file id already registered is left as it is.
    pub async fn register_file(&self, file: &ResultsFile, purpose: &str) -> Result<(), QueueError> {
        let mut tx = self.queue.pool.begin().await?;
        sqlx::query_scalar!(
            "SELECT id FROM jobs WHERE id = $1 AND attempt = $2 AND state = 'running' FOR SHARE",
            self.job.id,
            self.job.attempt,
        )
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| self.lost())?;
        sqlx::query!(
            r#"INSERT INTO files (id, org_id, filename, purpose, bytes, line_count, status, storage_key)
               VALUES ($1, $2, $3, $4, $5, $6, 'processed', $7)
               ON CONFLICT (id) DO NOTHING"#,
            file.id,
            self.job.org_id,
            file.filename,
            purpose,
            file.bytes,
            file.line_count,
            file.storage_key,
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends the job successfully. With a trained model, in the same transaction: registers it
    /// in `models` under its fine-tuned name ([`crate::models::fine_tuned_model_name`]; usable as
    /// the `model` of a new job), stores that name on the job, and records the results file.
    /// Returns the model's name. Safe to repeat after a transient failure.
    pub async fn complete(
        &self,
        result: &Value,
        trained: Option<&TrainedModel>,
    ) -> Result<Option<String>, QueueError> {
        let mut tx = self.queue.pool.begin().await?;
        let naming = sqlx::query!(
            r#"SELECT j.model, j.suffix, o.name AS org_name FROM jobs j JOIN orgs o ON o.id = j.org_id
               WHERE j.id = $1 AND j.attempt = $2 AND j.state = 'running' FOR UPDATE OF j"#,
            self.job.id,
            self.job.attempt,
        )
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| self.lost())?;
        let name = match trained {
            None => None,
            Some(trained) => {
                let name = crate::models::fine_tuned_model_name(
                    &naming.model,
                    &naming.org_name,
                    naming.suffix.as_deref(),
                    &self.job.id,
                );
                let config = json!({ "base_model": crate::models::root_base_model(&naming.model) });
                sqlx::query!(
                    r#"INSERT INTO models (id, org_id, kind, storage_prefix, format, config, job_id)
                       VALUES ($1, $2, 'fine_tuned', $3, $4, $5, $6)
                       ON CONFLICT (id) DO UPDATE SET storage_prefix = EXCLUDED.storage_prefix,
                                                      format = EXCLUDED.format"#,
                    name,
                    self.job.org_id,
                    trained.storage_prefix,
                    trained.format,
                    config,
                    self.job.id,
                )
                .execute(&mut *tx)
                .await?;
                if let Some(file) = &trained.results_file {
                    sqlx::query!(
                        r#"INSERT INTO files (id, org_id, filename, purpose, bytes, line_count, status,
                                              storage_key)
                           VALUES ($1, $2, $3, $4, $5, $6, 'processed', $7)
                           ON CONFLICT (id) DO NOTHING"#,
                        file.id,
                        self.job.org_id,
                        file.filename,
                        RESULTS_PURPOSE,
                        file.bytes,
                        file.line_count,
                        file.storage_key,
                    )
                    .execute(&mut *tx)
                    .await?;
                }
                Some(name)
            }
        };
        sqlx::query!(
            r#"UPDATE jobs SET state = 'succeeded', result = $3, fine_tuned_model = $4,
                               finished_at = now(), worker_id = NULL, lease_expires_at = NULL,
                               control = 'none'
               WHERE id = $1 AND attempt = $2 AND state = 'running'"#,
            self.job.id,
            self.job.attempt,
            result,
            name,
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(name)
    }

    /// Ends this attempt with an error. A `retryable` error queues the job again after an
    /// exponential backoff while attempts remain; otherwise, or when none remain, it fails.
    pub async fn fail(&self, message: &str, retryable: bool) -> Result<FailOutcome, QueueError> {
        let settings = self.queue.settings;
        let error = json!({ "message": message, "code": if retryable { "worker_error" } else { "job_error" },
                            "attempt": self.job.attempt });
        let row = sqlx::query!(
            r#"UPDATE jobs SET
                   failures = failures + 1,
                   state = CASE WHEN control = 'cancel' THEN 'cancelled'
                                WHEN $3 AND failures + 1 < max_attempts THEN 'queued'
                                ELSE 'failed' END,
                   finished_at = CASE WHEN control <> 'cancel' AND $3 AND failures + 1 < max_attempts
                                      THEN NULL ELSE now() END,
                   run_after = now() + make_interval(secs => least($4 * power(2, failures), $5)),
                   error = $6, worker_id = NULL, lease_expires_at = NULL, control = 'none'
               WHERE id = $1 AND attempt = $2 AND state = 'running'
               RETURNING state, run_after"#,
            self.job.id,
            self.job.attempt,
            retryable,
            secs(settings.retry_base),
            secs(settings.retry_max),
            error,
        )
        .fetch_optional(&self.queue.pool)
        .await?
        .ok_or_else(|| self.lost())?;
        Ok(match row.state.as_str() {
            "queued" => FailOutcome::Retrying { at: row.run_after },
            "cancelled" => FailOutcome::Cancelled,
            _ => FailOutcome::Failed,
        })
    }

    /// Acknowledges a cancel request: the job ends `cancelled`.
    pub async fn ack_cancel(&self) -> Result<(), QueueError> {
        self.release_to("cancelled").await
    }

    /// Acknowledges a pause request (after checkpointing): the job becomes `paused`.
    pub async fn ack_pause(&self) -> Result<(), QueueError> {
        self.release_to("paused").await
    }

    async fn release_to(&self, state: &str) -> Result<(), QueueError> {
        let done = sqlx::query!(
            r#"UPDATE jobs SET state = $3,
                               finished_at = CASE WHEN $3 = 'cancelled' THEN now() END,
                               worker_id = NULL, lease_expires_at = NULL, control = 'none'
               WHERE id = $1 AND attempt = $2 AND state = 'running'"#,
            self.job.id,
            self.job.attempt,
            state,
        )
        .execute(&self.queue.pool)
        .await
        .map_err(|e| self.fenced(e))?
        .rows_affected();
        if done == 0 {
            return Err(self.lost());
        }
        Ok(())
    }
}
