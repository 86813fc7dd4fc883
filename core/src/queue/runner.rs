//! The worker's claim loop: wait, rescue, claim, run the handler under a heartbeat, record the
//! outcome. Training is one handler; tests use others.

use super::heartbeat::Heartbeat;
use super::liveness::LoopGuard;
use super::{
    retry_transient, ControlWake, HeartbeatState, JobWaker, Lease, Queue, QueueError, RetryPolicy,
    TrainedModel, WorkerInfo, WorkerLiveness,
};
use async_trait::async_trait;
use futures::FutureExt;
use serde_json::Value;
use std::future::Future;
use std::panic::AssertUnwindSafe;
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
        /// The model it produced (registered under its fine-tuned name on completion); boxed to
        /// keep the outcome small.
        fine_tuned_model: Option<Box<TrainedModel>>,
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
    /// The handler already gave the job back and recorded the state it left it in (a parked
    /// Tinker client); nothing more to record.
    Released,
}

/// Runs one claimed job.
#[async_trait]
pub trait JobHandler: Send + Sync {
    /// Runs the job; poll `heartbeat` for cancel/pause/lost between units of work.
    async fn run(&self, lease: &Lease, heartbeat: &Heartbeat) -> JobOutcome;
}

/// Claim-loop settings (the timings come from the queue's [`super::QueueSettings`]).
#[derive(Debug, Clone, Default)]
pub struct RunnerOptions {
    /// Stop after this many jobs (tests, batch use); `None` runs until shut down.
    pub max_jobs: Option<usize>,
    /// Where the loop reports that it is alive (read by `/readyz` of `verity up`).
    pub liveness: WorkerLiveness,
}

/// Claims and runs jobs until `shutdown` fires (or `max_jobs` is reached); returns how many
/// jobs it ran.
///
/// Failures of the database (registering, rescuing, claiming) never end the loop: each is
/// logged and retried after an exponential backoff with jitter (0.5 s doubling to 30 s, reset
/// by a success). A handler that panics fails its attempt (retryable) instead of killing the
/// loop. Only `shutdown` (or `max_jobs`) ends it.
pub async fn run_worker(
    queue: Queue,
    worker: WorkerInfo,
    handler: Arc<dyn JobHandler>,
    options: RunnerOptions,
    shutdown: CancellationToken,
) -> usize {
    let settings = queue.settings();
    let tick = settings.poll_interval.clamp(Duration::from_millis(10), Duration::from_secs(1));
    let liveness = options.liveness.clone();
    liveness.started(tick);
    let guard = LoopGuard::new(liveness.clone());
    let waker = JobWaker::spawn(queue.pool());
    let mut backoff = RetryPolicy::WORKER.backoff();
    let mut registered = false;
    let mut done = 0usize;
    while !shutdown.is_cancelled() && options.max_jobs.is_none_or(|max| done < max) {
        liveness.beat();
        let claimed = beating(&liveness, tick, async {
            if !registered {
                queue.register_worker(&worker).await?;
                registered = true;
            }
            queue.rescue_expired().await?;
            queue.claim(&worker).await
        })
        .await;
        match claimed {
            Ok(Some(lease)) => {
                backoff.reset();
                liveness.succeeded();
                let span = tracing::info_span!("job", job_id = %lease.job().id, attempt = lease.job().attempt);
                let control = waker.control_wake(&lease.job().id);
                let interval = settings.heartbeat_interval();
                let run = run_one(&lease, handler.as_ref(), interval, &control, &shutdown);
                beating(&liveness, tick, run).instrument(span).await;
                done += 1;
            }
            Ok(None) => {
                backoff.reset();
                liveness.succeeded();
                let idle = async {
                    tokio::select! {
                        _ = waker.wait(settings.poll_interval) => {}
                        _ = shutdown.cancelled() => {}
                    }
                };
                beating(&liveness, tick, idle).await;
            }
            Err(err) => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    error = %err,
                    failures = backoff.failures(),
                    retry_in_ms = delay.as_millis() as u64,
                    "the queue is unavailable; retrying"
                );
                liveness.failed(&err.to_string());
                let pause = async {
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => {}
                    }
                };
                beating(&liveness, tick, pause).await;
            }
        }
    }
    guard.finish();
    done
}

/// Runs `work`, beating `liveness` every `tick` while it is pending.
async fn beating<F: Future>(liveness: &WorkerLiveness, tick: Duration, work: F) -> F::Output {
    tokio::pin!(work);
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = ticker.tick() => liveness.beat(),
        }
    }
}

/// Runs one claimed job under a heartbeat and records its outcome. Recording is retried while
/// the database is unreachable (the heartbeat keeps the lease meanwhile), until it succeeds,
/// the lease is lost, the retry budget is spent or the worker shuts down.
async fn run_one(
    lease: &Lease,
    handler: &dyn JobHandler,
    heartbeat_interval: Duration,
    control: &ControlWake,
    shutdown: &CancellationToken,
) {
    let heartbeat = Heartbeat::start(lease.clone(), heartbeat_interval, Some(control.notify()));
    let outcome = match AssertUnwindSafe(handler.run(lease, &heartbeat)).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => {
            let message = format!("the job handler panicked: {}", panic_message(&panic));
            tracing::error!(%message, "job handler panicked");
            JobOutcome::Failed { message, retryable: true }
        }
    };
    let recorded = retry_transient(
        "recording the job's outcome",
        RetryPolicy::WORKER,
        QueueError::is_transient,
        || shutdown.is_cancelled() || heartbeat.state() == HeartbeatState::Lost,
        || async {
            match &outcome {
                JobOutcome::Succeeded { result, fine_tuned_model } => {
                    lease.complete(result, fine_tuned_model.as_deref()).await.map(|_| ())
                }
                JobOutcome::Failed { message, retryable } => {
                    lease.fail(message, *retryable).await.map(|_| ())
                }
                JobOutcome::Cancelled => lease.ack_cancel().await,
                JobOutcome::Paused => lease.ack_pause().await,
                JobOutcome::LeaseLost | JobOutcome::Released => Ok(()),
            }
        },
    )
    .await;
    drop(heartbeat);
    match recorded {
        Ok(()) => tracing::info!(outcome = ?outcome_name(&outcome), "job attempt ended"),
        Err(err) => tracing::warn!(error = %err, outcome = ?outcome_name(&outcome),
                                   "could not record the job's outcome; its lease will expire and the job will be retried"),
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

fn outcome_name(outcome: &JobOutcome) -> &'static str {
    match outcome {
        JobOutcome::Succeeded { .. } => "succeeded",
        JobOutcome::Failed { .. } => "failed",
        JobOutcome::Cancelled => "cancelled",
        JobOutcome::Paused => "paused",
        JobOutcome::LeaseLost => "lease_lost",
        JobOutcome::Released => "released",
    }
}
