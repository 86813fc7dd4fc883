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
    /// Jobs of one kind the worker may run side by side; `None`: one job at a time.
    pub shared: Option<SharedKind>,
}

/// A kind of job that mostly waits (a Tinker training client waits for its user's next call),
/// so that one worker may hold several at once: while every job it runs is of this kind, it
/// claims more of it — by the queue's fair share, within its memory — up to `max`. A job of
/// any other kind still runs alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedKind {
    /// `jobs.kind`.
    pub kind: String,
    /// The most such jobs run at once (1: one at a time).
    pub max: usize,
}

/// What the loop knows of a job it runs.
struct Running {
    kind: String,
    memory_mb: i64,
}

/// What the loop may claim next, given the jobs it runs: anything when idle; beside jobs of
/// the shared kind only, while fewer than its limit run, that kind with the memory they leave.
fn next_claim<'a>(
    running: &[&Running],
    shared: Option<&'a SharedKind>,
    memory_mb: i64,
) -> Option<(Option<&'a str>, i64)> {
    if running.is_empty() {
        return Some((None, memory_mb));
    }
    let shared = shared?;
    let all_shared = running.iter().all(|r| r.kind == shared.kind);
    if !all_shared || running.len() >= shared.max {
        return None;
    }
    let used: i64 = running.iter().map(|r| r.memory_mb).sum();
    Some((Some(shared.kind.as_str()), memory_mb.saturating_sub(used)))
}

/// Claims and runs jobs until `shutdown` fires (or `max_jobs` were claimed); returns how many
/// jobs it ran. Jobs run one at a time, except those of [`RunnerOptions::shared`]'s kind, which
/// run side by side, each under its own heartbeat.
///
/// Failures of the database (registering, rescuing, claiming) never end the loop: each is
/// logged and retried after an exponential backoff with jitter (0.5 s doubling to 30 s, reset
/// by a success). A handler that panics fails its attempt (retryable) instead of killing the
/// loop. Only `shutdown` (or `max_jobs`) ends it; the jobs running then are waited for.
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
    let mut claimed_jobs = 0usize;
    let mut done = 0usize;
    let mut tasks = tokio::task::JoinSet::new();
    let mut running = std::collections::HashMap::new();
    let shared = options.shared.as_ref().filter(|s| s.max > 1);
    while !shutdown.is_cancelled() && options.max_jobs.is_none_or(|max| claimed_jobs < max) {
        liveness.beat();
        let next = next_claim(&running.values().collect::<Vec<_>>(), shared, worker.memory_mb);
        let Some((kind, memory_mb)) = next else {
            // Busy: wait for a job to end.
            let ended = beating(&liveness, tick, tasks.join_next_with_id()).await;
            done += finished(ended, &mut running);
            continue;
        };
        let claimed = beating(&liveness, tick, async {
            if !registered {
                queue.register_worker(&worker).await?;
                registered = true;
            }
            queue.rescue_expired().await?;
            queue.claim_beside(&worker, kind, memory_mb).await
        })
        .await;
        match claimed {
            Ok(Some(lease)) => {
                backoff.reset();
                liveness.succeeded();
                claimed_jobs += 1;
                let job = lease.job();
                let span = tracing::info_span!("job", job_id = %job.id, attempt = job.attempt);
                let control = waker.control_wake(&job.id);
                let entry = Running { kind: job.kind.clone(), memory_mb: job.required_memory_mb };
                let handler = handler.clone();
                let interval = settings.heartbeat_interval();
                let stop = shutdown.clone();
                let run = async move {
                    run_one(&lease, handler.as_ref(), interval, &control, &stop).await;
                };
                let task = tasks.spawn(run.instrument(span));
                running.insert(task.id(), entry);
            }
            Ok(None) => {
                backoff.reset();
                liveness.succeeded();
                let idle = async {
                    tokio::select! {
                        _ = waker.wait(settings.poll_interval) => None,
                        ended = tasks.join_next_with_id(), if !tasks.is_empty() => ended,
                        _ = shutdown.cancelled() => None,
                    }
                };
                let ended = beating(&liveness, tick, idle).await;
                done += finished(ended, &mut running);
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
    while !tasks.is_empty() {
        let ended = beating(&liveness, tick, tasks.join_next_with_id()).await;
        done += finished(ended, &mut running);
    }
    guard.finish();
    done
}

/// Forgets the job whose task ended (if one did); 1 if one did. A task's panic is already
/// turned into the job's failure by [`run_one`]; one escaping that is logged.
fn finished(
    ended: Option<Result<(tokio::task::Id, ()), tokio::task::JoinError>>,
    running: &mut std::collections::HashMap<tokio::task::Id, Running>,
) -> usize {
    let id = match ended {
        None => return 0,
        Some(Ok((id, ()))) => id,
        Some(Err(error)) => {
            tracing::error!(%error, "a job's task ended abnormally");
            error.id()
        }
    };
    running.remove(&id);
    1
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

#[cfg(test)]
mod tests {
    use super::*;

    fn client(memory_mb: i64) -> Running {
        Running { kind: "tinker".into(), memory_mb }
    }

    #[test]
    fn an_idle_worker_claims_anything_and_a_busy_one_only_the_shared_kind_up_to_its_limit() {
        let shared = SharedKind { kind: "tinker".into(), max: 3 };
        assert_eq!(next_claim(&[], Some(&shared), 4096), Some((None, 4096)));
        assert_eq!(next_claim(&[], None, 4096), Some((None, 4096)));
        let (a, b, c) = (client(1000), client(500), client(0));
        // Beside clients: clients only, with the memory they leave.
        assert_eq!(next_claim(&[&a], Some(&shared), 4096), Some((Some("tinker"), 3096)));
        assert_eq!(next_claim(&[&a, &b], Some(&shared), 4096), Some((Some("tinker"), 2596)));
        // At the limit, or without sharing: nothing until one ends.
        assert_eq!(next_claim(&[&a, &b, &c], Some(&shared), 4096), None);
        assert_eq!(next_claim(&[&a], None, 4096), None);
        // A job of another kind runs alone.
        let job = Running { kind: "fine_tuning".into(), memory_mb: 0 };
        assert_eq!(next_claim(&[&job], Some(&shared), 4096), None);
    }
}
