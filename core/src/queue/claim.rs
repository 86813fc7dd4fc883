//! Claiming the next job a worker can run.

use super::{secs, Lease, Queue, QueueError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// The kind of accelerator a worker has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// CPU only.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

impl DeviceKind {
    /// The name stored in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// What a worker advertises when it claims.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// Unique per worker process.
    pub id: String,
    /// Host it runs on.
    pub hostname: String,
    /// Its device.
    pub device: DeviceKind,
    /// Memory it can give a job (MiB).
    pub memory_mb: i64,
}

impl WorkerInfo {
    /// A worker with a fresh id on this host.
    pub fn new(device: DeviceKind, memory_mb: i64) -> WorkerInfo {
        let hostname = std::env::var("HOSTNAME").unwrap_or_default();
        WorkerInfo {
            id: format!("worker-{}", Uuid::new_v4().simple()),
            hostname,
            device,
            memory_mb,
        }
    }
}

/// The parts of a job row a worker needs to run it.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    /// Job id.
    pub id: String,
    /// Owning org.
    pub org_id: Uuid,
    /// This claim's attempt number (the fencing token).
    pub attempt: i32,
    /// Failed attempts so far.
    pub failures: i32,
    /// Base model id.
    pub model: String,
    /// Training file id.
    pub training_file: Option<String>,
    /// Validation file id.
    pub validation_file: Option<String>,
    /// Seed.
    pub seed: i64,
    /// Method, grader and hyperparameters.
    pub spec: Value,
}

impl Queue {
    /// Records the worker (or refreshes it) so operators can see who is alive.
    pub async fn register_worker(&self, worker: &WorkerInfo) -> Result<(), QueueError> {
        sqlx::query!(
            r#"INSERT INTO workers (id, hostname, device, memory_mb) VALUES ($1, $2, $3, $4)
               ON CONFLICT (id) DO UPDATE SET last_seen_at = now(), device = EXCLUDED.device,
                                              memory_mb = EXCLUDED.memory_mb"#,
            worker.id,
            worker.hostname,
            worker.device.as_str(),
            worker.memory_mb
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Claims the highest-priority queued job this worker can run, or `None`.
    ///
    /// One statement: the row is locked with `SKIP LOCKED`, moved to `running` with a new attempt
    /// and a lease, and committed at once; no transaction stays open while the job runs.
    pub async fn claim(&self, worker: &WorkerInfo) -> Result<Option<Lease>, QueueError> {
        let row = sqlx::query!(
            r#"WITH next AS (
                   SELECT id FROM jobs
                   WHERE state = 'queued' AND run_after <= now()
                     AND (required_device = 'any' OR required_device = $2)
                     AND required_memory_mb <= $3
                   ORDER BY priority DESC, created_at, id
                   LIMIT 1
                   FOR UPDATE SKIP LOCKED
               )
               UPDATE jobs SET state = 'running', attempt = jobs.attempt + 1, worker_id = $1,
                               lease_expires_at = now() + make_interval(secs => $4),
                               heartbeat_at = now(), started_at = coalesce(jobs.started_at, now()),
                               error = NULL
               FROM next WHERE jobs.id = next.id
               RETURNING jobs.id, jobs.org_id, jobs.attempt, jobs.failures, jobs.model,
                         jobs.training_file, jobs.validation_file, jobs.seed, jobs.spec"#,
            worker.id,
            worker.device.as_str(),
            worker.memory_mb,
            secs(self.settings.lease),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            let job = ClaimedJob {
                id: r.id,
                org_id: r.org_id,
                attempt: r.attempt,
                failures: r.failures,
                model: r.model,
                training_file: r.training_file,
                validation_file: r.validation_file,
                seed: r.seed,
                spec: r.spec,
            };
            tracing::debug!(job_id = %job.id, attempt = job.attempt, worker_id = %worker.id, "claimed job");
            Lease::new(self.clone(), job, worker.id.clone())
        }))
    }
}
