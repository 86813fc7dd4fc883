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
    /// `jobs.kind`: what the row is (a fine-tuning job, a run, a Tinker training client).
    pub kind: String,
    /// The memory the job asked of its worker (MiB).
    pub required_memory_mb: i64,
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

    /// Claims the next queued job this worker can run, or `None`, serving orgs by fair share.
    ///
    /// The org with the fewest running jobs goes first, then the org whose last claim is oldest
    /// (never-served orgs first), so one org's backlog cannot starve another's: round-robin
    /// across orgs with claimable work. Within an org: priority, then age. Orgs at
    /// [`QueueSettings::org_max_running`](super::QueueSettings) are skipped.
    ///
    /// One statement: the orgs with queued work are found by a skip scan of
    /// `jobs_org_queued_idx`, each org's head job is locked with `SKIP LOCKED`, the chosen one is
    /// moved to `running` with a new attempt and a lease, and committed at once; no transaction
    /// stays open while the job runs.
    pub async fn claim(&self, worker: &WorkerInfo) -> Result<Option<Lease>, QueueError> {
        self.claim_beside(worker, None, worker.memory_mb).await
    }

    /// Claims as [`Queue::claim`] does, but only a job of `kind` (any kind when `None`) asking
    /// at most `memory_mb`: what a worker already running jobs of that kind may take beside
    /// them with the memory they leave.
    pub async fn claim_beside(
        &self,
        worker: &WorkerInfo,
        kind: Option<&str>,
        memory_mb: i64,
    ) -> Result<Option<Lease>, QueueError> {
        let row = sqlx::query!(
            r#"WITH RECURSIVE orgs(org_id) AS (
                   (SELECT org_id FROM jobs WHERE state = 'queued' ORDER BY org_id LIMIT 1)
                   UNION ALL
                   SELECT (SELECT j.org_id FROM jobs j
                           WHERE j.state = 'queued' AND j.org_id > orgs.org_id
                           ORDER BY j.org_id LIMIT 1)
                   FROM orgs WHERE orgs.org_id IS NOT NULL
               ),
               heads AS (
                   SELECT head.id, head.priority, head.created_at, running.n AS running,
                          served.last_claimed
                   FROM orgs
                   CROSS JOIN LATERAL (
                       SELECT count(*) AS n FROM jobs r
                       WHERE r.org_id = orgs.org_id AND r.state = 'running'
                   ) running
                   CROSS JOIN LATERAL (
                       SELECT max(c.claimed_at) AS last_claimed FROM jobs c
                       WHERE c.org_id = orgs.org_id
                   ) served
                   CROSS JOIN LATERAL (
                       SELECT q.id, q.priority, q.created_at FROM jobs q
                       WHERE q.org_id = orgs.org_id AND q.state = 'queued' AND q.run_after <= now()
                         AND (q.required_device = 'any' OR q.required_device = $2)
                         AND q.required_memory_mb <= $3
                         AND ($6::text IS NULL OR q.kind = $6)
                       ORDER BY q.priority DESC, q.created_at, q.id
                       LIMIT 1
                       FOR UPDATE SKIP LOCKED
                   ) head
                   WHERE orgs.org_id IS NOT NULL AND ($5::int8 = 0 OR running.n < $5::int8)
               ),
               next AS (
                   SELECT id FROM heads
                   ORDER BY running, last_claimed NULLS FIRST, priority DESC, created_at, id
                   LIMIT 1
               )
               UPDATE jobs SET state = 'running', attempt = jobs.attempt + 1, worker_id = $1,
                               lease_expires_at = now() + make_interval(secs => $4),
                               heartbeat_at = now(), started_at = coalesce(jobs.started_at, now()),
                               claimed_at = now(), error = NULL
               FROM next WHERE jobs.id = next.id
               RETURNING jobs.id, jobs.org_id, jobs.attempt, jobs.failures, jobs.model,
                         jobs.training_file, jobs.validation_file, jobs.seed, jobs.spec,
                         jobs.kind, jobs.required_memory_mb"#,
            worker.id,
            worker.device.as_str(),
            memory_mb,
            secs(self.settings.lease),
            i64::from(self.settings.org_max_running),
            kind,
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
                kind: r.kind,
                required_memory_mb: r.required_memory_mb,
            };
            tracing::debug!(job_id = %job.id, attempt = job.attempt, worker_id = %worker.id, "claimed job");
            Lease::new(self.clone(), job, worker.id.clone())
        }))
    }
}
