//! How a job's run stops early ([`Stop`]: fail, retry, lease lost) and how its writes survive
//! transient outages of the database and the store ([`persist`]).

use crate::trainer::TrainerError;
use serde_json::Value;
use verity_core::queue::{
    is_transient_db_error, retry_transient, EventLevel, Heartbeat, HeartbeatState, JobOutcome,
    Lease, QueueError, RetryPolicy,
};
use verity_core::storage::StorageError;

/// Why a run stopped early.
pub(super) enum Stop {
    /// End with this outcome.
    Outcome(JobOutcome),
}

pub(super) fn user_error(message: impl Into<String>) -> Stop {
    Stop::Outcome(JobOutcome::Failed { message: message.into(), retryable: false })
}

pub(super) fn retryable(context: &str, err: impl std::fmt::Display) -> Stop {
    Stop::Outcome(JobOutcome::Failed { message: format!("{context}: {err}"), retryable: true })
}

pub(super) fn trainer_error(err: TrainerError) -> Stop {
    let retry = !err.is_user_error();
    Stop::Outcome(JobOutcome::Failed { message: err.to_string(), retryable: retry })
}

/// Runs a read or write of the store or the database, retrying it with backoff while it fails
/// transiently (Postgres restarting, the store unreachable) for up to
/// [`RetryPolicy::WORKER`]'s budget, so that a short outage does not cost the job an attempt.
/// Stops retrying once the lease is lost. Every operation retried here is idempotent (upserts
/// keyed by step, objects overwritten whole).
pub(super) async fn persist<T, E, F, Fut>(
    what: &str,
    heartbeat: &Heartbeat,
    is_transient: impl Fn(&E) -> bool,
    op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let lost = || heartbeat.state() == HeartbeatState::Lost;
    retry_transient(what, RetryPolicy::WORKER, is_transient, lost, op).await
}

/// Whether an error chain holds a transient database, queue, store or I/O failure.
pub(super) fn transient_chain(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<sqlx::Error>().is_some_and(is_transient_db_error)
            || cause.downcast_ref::<QueueError>().is_some_and(QueueError::is_transient)
            || cause.downcast_ref::<StorageError>().is_some_and(StorageError::is_transient)
            || cause.downcast_ref::<std::io::Error>().is_some()
    })
}

pub(super) fn lease_error(context: &str, err: QueueError) -> Stop {
    match err {
        QueueError::LeaseLost { .. } => Stop::Outcome(JobOutcome::LeaseLost),
        other => retryable(context, other),
    }
}

/// Appends an event to the job's log, retrying while the database is unreachable.
pub(super) async fn event(
    lease: &Lease,
    heartbeat: &Heartbeat,
    level: EventLevel,
    kind: &str,
    message: &str,
    data: Option<&Value>,
) -> Result<(), Stop> {
    let write = || lease.event(level, kind, message, data);
    persist("writing an event", heartbeat, QueueError::is_transient, write)
        .await
        .map_err(|e| lease_error("writing an event", e))
}
