//! The Postgres-backed job queue: enqueue, claim with fenced leases, heartbeats, retries with
//! backoff, rescue of expired leases, cancel / pause / resume, and NOTIFY wake-ups.
//!
//! Every state change is validated and recorded as a job event by triggers in the schema; every
//! write a worker makes names its attempt and is rejected by the database once that attempt no
//! longer holds the job (see `fence_worker_write` in the migrations).

mod backoff;
mod claim;
mod control;
mod enqueue;
mod error;
mod heartbeat;
mod lease;
mod liveness;
mod rescue;
mod runner;
mod waker;

pub use backoff::{retry_transient, Backoff, RetryPolicy};
pub use claim::{ClaimedJob, DeviceKind, WorkerInfo};
pub use control::ControlOutcome;
pub use enqueue::{NewJob, FINE_TUNING};
pub use error::{is_transient_db_error, QueueError};
pub use heartbeat::{Heartbeat, HeartbeatState, ProgressReporter};
pub use lease::{
    EventLevel, FailOutcome, Lease, ResultsFile, SampleIndexRow, TrainedModel, RESULTS_PURPOSE,
};
pub use liveness::{WorkerHealth, WorkerLiveness};
pub use runner::{run_worker, JobHandler, JobOutcome, RunnerOptions, SharedKind};
pub use waker::{ControlWake, JobWaker, Wake, CONTROL_CHANNEL};

use sqlx::PgPool;
use std::time::Duration;

/// Name of the Postgres channel that announces queued jobs.
pub const CHANNEL: &str = "verity_jobs";

/// Timing of leases, polling and retries: the one settings type of the queue. The command
/// line's [`crate::config::QueueConfig`] converts into it and takes its defaults from
/// [`QueueSettings::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a claim lasts without a heartbeat.
    pub lease: Duration,
    /// How often an idle worker polls when no notification arrives.
    pub poll_interval: Duration,
    /// Delay before the first retry; doubled by each further failure.
    pub retry_base: Duration,
    /// Upper bound on the retry delay.
    pub retry_max: Duration,
    /// Most jobs one org may have running at once; its further jobs wait queued (0: no limit).
    pub org_max_running: u32,
    /// Most jobs one org may have queued; enqueueing more is refused (0: no limit).
    pub org_max_queued: u32,
}

impl QueueSettings {
    /// The defaults: 60 s leases, 5 s polling, retries after 10 s doubling up to an hour, no
    /// limit on an org's running jobs (fair share interleaves orgs) and 1000 queued per org.
    pub const DEFAULT: QueueSettings = QueueSettings {
        lease: Duration::from_secs(60),
        poll_interval: Duration::from_secs(5),
        retry_base: Duration::from_secs(10),
        retry_max: Duration::from_secs(3600),
        org_max_running: 0,
        org_max_queued: 1000,
    };

    /// Time between a running job's heartbeats: a quarter of the lease (at least 200 ms), so
    /// that three can fail before the lease expires.
    pub fn heartbeat_interval(&self) -> Duration {
        (self.lease / 4).max(Duration::from_millis(200))
    }
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings::DEFAULT
    }
}

/// Handle on the queue; cheap to clone.
#[derive(Debug, Clone)]
pub struct Queue {
    pool: PgPool,
    settings: QueueSettings,
}

impl Queue {
    /// A queue over `pool` with the given timings.
    pub fn new(pool: PgPool, settings: QueueSettings) -> Queue {
        Queue { pool, settings }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The lease and retry timings.
    pub fn settings(&self) -> QueueSettings {
        self.settings
    }

    /// The current state of a job.
    pub async fn state(&self, job_id: &str) -> Result<crate::JobState, QueueError> {
        let state = sqlx::query_scalar!("SELECT state FROM jobs WHERE id = $1", job_id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| QueueError::NotFound(job_id.to_string()))?;
        state
            .parse()
            .map_err(|e: crate::job_state::UnknownState| QueueError::Corrupt(e.to_string()))
    }
}

/// Seconds as the `double precision` Postgres' `make_interval(secs => …)` takes.
fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
