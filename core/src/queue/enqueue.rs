//! Putting jobs on the queue.

use super::{Queue, QueueError};
use crate::sampling_runs::RunKind;
use crate::JobState;
use serde_json::Value;
use uuid::Uuid;

/// `jobs.kind` of fine-tuning jobs.
pub const FINE_TUNING: &str = "fine_tuning";

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// `ftjob-…`; see [`crate::ids::job_id`].
    pub id: String,
    /// Owning org.
    pub org_id: Uuid,
    /// User who created it, if any.
    pub created_by: Option<Uuid>,
    /// Base model id.
    pub model: String,
    /// Training file id.
    pub training_file: Option<String>,
    /// Validation file id.
    pub validation_file: Option<String>,
    /// Suffix for the fine-tuned model's name.
    pub suffix: Option<String>,
    /// Seed for everything random in the job.
    pub seed: i64,
    /// Method, grader and hyperparameters as submitted.
    pub spec: Value,
    /// User metadata.
    pub metadata: Option<Value>,
    /// Higher runs first.
    pub priority: i16,
    /// `any`, `cpu` or `cuda`.
    pub required_device: String,
    /// Least memory a worker must advertise.
    pub required_memory_mb: i64,
    /// Attempts before the job fails for good.
    pub max_attempts: i32,
}

impl NewJob {
    /// A queued job with default priority, any device and three attempts.
    pub fn new(org_id: Uuid, model: impl Into<String>, spec: Value) -> NewJob {
        NewJob {
            id: crate::ids::job_id(),
            org_id,
            created_by: None,
            model: model.into(),
            training_file: None,
            validation_file: None,
            suffix: None,
            seed: 0,
            spec,
            metadata: None,
            priority: 0,
            required_device: "any".to_string(),
            required_memory_mb: 0,
            max_attempts: 3,
        }
    }
}

impl Queue {
    /// Inserts the fine-tuning job, queued; it wakes listening workers through NOTIFY (a
    /// trigger sends it).
    pub async fn enqueue(&self, job: &NewJob) -> Result<String, QueueError> {
        self.enqueue_kind(job, FINE_TUNING).await
    }

    /// Inserts a sampling run (its id from [`RunKind::new_id`]), queued like a job.
    pub async fn enqueue_run(&self, job: &NewJob, kind: RunKind) -> Result<String, QueueError> {
        self.enqueue_kind(job, kind.as_str()).await
    }

    /// Inserts a Tinker training client's row (kind [`crate::tinker::clients::TINKER`]), queued
    /// like a job: its worker holds it while the client lives.
    pub async fn enqueue_tinker(&self, job: &NewJob) -> Result<String, QueueError> {
        self.enqueue_kind(job, crate::tinker::clients::TINKER).await
    }

    /// Inserts a model pull's row (kind [`crate::model_pulls::MODEL_PULL`], id from
    /// [`crate::model_pulls::new_id`]), queued like a job.
    pub async fn enqueue_pull(&self, job: &NewJob) -> Result<String, QueueError> {
        self.enqueue_kind(job, crate::model_pulls::MODEL_PULL).await
    }

    /// Inserts the job unless its org already has
    /// [`QueueSettings::org_max_queued`](super::QueueSettings) jobs queued; the count and the
    /// insert are one statement, so concurrent requests can pass the limit by at most their
    /// number.
    async fn enqueue_kind(&self, job: &NewJob, kind: &str) -> Result<String, QueueError> {
        let limit = i64::from(self.settings.org_max_queued);
        let inserted = sqlx::query!(
            r#"INSERT INTO jobs (id, org_id, created_by, model, training_file, validation_file, suffix,
                                 seed, spec, metadata, priority, required_device, required_memory_mb,
                                 max_attempts, state, kind)
               SELECT $1::text, $2::uuid, $3::uuid, $4::text, $5::text, $6::text, $7::text,
                      $8::int8, $9::jsonb, $10::jsonb, $11::int2, $12::text, $13::int8, $14::int4,
                      $15::text, $16::text
               WHERE $17::int8 = 0
                  OR (SELECT count(*) FROM jobs WHERE org_id = $2::uuid AND state = 'queued') < $17::int8"#,
            job.id,
            job.org_id,
            job.created_by,
            job.model,
            job.training_file,
            job.validation_file,
            job.suffix,
            job.seed,
            job.spec,
            job.metadata,
            job.priority,
            job.required_device,
            job.required_memory_mb,
            job.max_attempts,
            JobState::Queued.as_str(),
            kind,
            limit,
        )
        .execute(&self.pool)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(QueueError::OrgQueueFull { limit: self.settings.org_max_queued });
        }
        Ok(job.id.clone())
    }
}
