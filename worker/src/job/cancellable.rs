//! Long blocking work (a training step, an evaluation, a sampling chunk) that a cancel ends
//! within seconds: the work runs on a blocking thread under a [`StopFlag`]; when the heartbeat
//! reports a cancel (or a lost lease) meanwhile, the flag is raised, the sampler and the grading
//! pool stop at their next decode step or row, and the job ends without waiting for the rest.

use super::stop::{retryable, Stop};
use verity_core::queue::{Heartbeat, HeartbeatState, JobOutcome};
use verity_verifiers::StopFlag;

/// Runs `work` on a blocking thread; `Err(Stop)` with `Cancelled` (or `LeaseLost`) when the
/// heartbeat says so before it ends. A pause does not interrupt: the work finishes, so that it
/// can be checkpointed.
pub(super) async fn blocking_until_cancelled<T: Send + 'static>(
    heartbeat: &Heartbeat,
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Stop> {
    let stop = StopFlag::new();
    let flag = stop.clone();
    let task = tokio::task::spawn_blocking(move || flag.scope(work));
    tokio::pin!(task);
    let state = tokio::select! {
        done = &mut task => return done.map_err(|e| retryable(what, e)),
        state = heartbeat.cancelled_or_lost() => state,
    };
    stop.raise();
    tracing::info!(what, "stopping the work in progress: the job was cancelled or its lease lost");
    // The work ends at its next decode step or grading row; waiting for it keeps the next job
    // from competing with it for the cores.
    let _ = task.await;
    Err(Stop::Outcome(match state {
        HeartbeatState::Held(_) => JobOutcome::Cancelled,
        HeartbeatState::Lost => JobOutcome::LeaseLost,
    }))
}
