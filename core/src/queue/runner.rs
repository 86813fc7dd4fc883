//! The worker's claim loop: wait, rescue, claim, run the handler under a heartbeat, record the
//! outcome. Training is one handler; tests use others.

use super::heartbeat::Heartbeat;
use super::{JobWaker, Lease, Queue, QueueError, WorkerInfo};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How a handler's run ended.
#[derive(Debug, Clone)]
pub enum JobOutcome {
    /// Done; the job succeeds.
    Succeeded {
        /// Summary stored on the job.
        result: Value,
        /// Name of the model it produced.
        fine_tuned_model: Option<String>,
    },
    /// An error; retried while attempts remain if `retryable`.
    Failed {
        /// What a user can act on.
        message: String,
        /// Whether another attempt could succeed.
        retryable: bool,
    },
    /// The handler stopped because the user cancelled.
    Cancelled,
    /// The handler checkpointed and stopped because the user paused.
    Paused,
    /// The lease was lost; nothing more may be written.
    LeaseLost,
}

/// Runs one claimed job.
#[async_trait]
pub trait JobHandler: Send + Sync {
    /// Runs the job; poll `heartbeat` for cancel/pause/lost between units of work.
    async fn run(&self, lease: &Lease, heartbeat: &Heartbeat) -> JobOutcome;
}

/// Claim-loop settings.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Wait between polls when no notification arrives.
    pub poll_interval: Duration,
    /// Time between heartbeats (well under the lease).
    pub heartbeat_interval: Duration,
    /// Stop after this many jobs (tests, batch use); `None` runs until shut down.
    pub max_jobs: Option<usize>,
}

/// Claims and runs jobs until `shutdown` fires (or `max_jobs` is reached).
pub async fn run_worker(
    queue: Queue,
    worker: WorkerInfo,
    handler: Arc<dyn JobHandler>,
    options: RunnerOptions,
    shutdown: CancellationToken,
) -> Result<usize, QueueError> {
    queue.register_worker(&worker).await?;
    let waker = match JobWaker::start(queue.pool()).await {
        Ok(waker) => waker,
        Err(err) => {
            tracing::warn!(error = %err, "LISTEN failed; polling only");
            JobWaker::polling_only()
        }
    };
    let mut done = 0usize;
    while !shutdown.is_cancelled() && options.max_jobs.is_none_or(|max| done < max) {
        queue.rescue_expired().await?;
        let Some(lease) = queue.claim(&worker).await? else {
            tokio::select! {
                _ = waker.wait(options.poll_interval) => {}
                _ = shutdown.cancelled() => {}
            }
            continue;
        };
        let span =
            tracing::info_span!("job", job_id = %lease.job().id, attempt = lease.job().attempt);
        run_one(&lease, handler.as_ref(), options.heartbeat_interval).instrument(span).await;
        done += 1;
    }
    Ok(done)
}

async fn run_one(lease: &Lease, handler: &dyn JobHandler, heartbeat_interval: Duration) {
    let heartbeat = Heartbeat::start(lease.clone(), heartbeat_interval);
    let outcome = handler.run(lease, &heartbeat).await;
    drop(heartbeat);
    let recorded = match &outcome {
        JobOutcome::Succeeded { result, fine_tuned_model } => {
            lease.complete(result, fine_tuned_model.as_deref()).await
        }
        JobOutcome::Failed { message, retryable } => {
            lease.fail(message, *retryable).await.map(|_| ())
        }
        JobOutcome::Cancelled => lease.ack_cancel().await,
        JobOutcome::Paused => lease.ack_pause().await,
        JobOutcome::LeaseLost => Ok(()),
    };
    match recorded {
        Ok(()) => tracing::info!(outcome = ?outcome_name(&outcome), "job attempt ended"),
        Err(err) => tracing::warn!(error = %err, "could not record the job's outcome"),
    }
}

fn outcome_name(outcome: &JobOutcome) -> &'static str {
    match outcome {
        JobOutcome::Succeeded { .. } => "succeeded",
        JobOutcome::Failed { .. } => "failed",
        JobOutcome::Cancelled => "cancelled",
        JobOutcome::Paused => "paused",
        JobOutcome::LeaseLost => "lease_lost",
    }
}
