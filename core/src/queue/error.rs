//! Queue errors.

/// SQLSTATE raised by `fence_worker_write` when a stale attempt writes.
pub(crate) const STALE_ATTEMPT: &str = "VT001";
/// SQLSTATE raised by `jobs_check_transition` for a forbidden state change.
pub(crate) const BAD_TRANSITION: &str = "VT002";

/// What can go wrong with a queue operation.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The attempt no longer holds the job (its lease expired and it was reclaimed, or it ended).
    #[error("attempt {attempt} no longer holds job {job_id}")]
    LeaseLost {
        /// The job.
        job_id: String,
        /// The stale attempt.
        attempt: i32,
    },
    /// No such job.
    #[error("job {0} not found")]
    NotFound(String),
    /// The job is in a state that does not allow the operation.
    #[error("job {job_id} is {state}; cannot {action}")]
    InvalidState {
        /// The job.
        job_id: String,
        /// Its current state.
        state: String,
        /// What was asked.
        action: &'static str,
    },
    /// The org already has as many queued jobs as
    /// [`QueueSettings::org_max_queued`](super::QueueSettings) allows.
    #[error("this organization already has {limit} queued jobs, the most allowed (VERITY_ORG_MAX_QUEUED); wait for some to start or cancel some")]
    OrgQueueFull {
        /// The limit.
        limit: u32,
    },
    /// The database holds something the code does not understand.
    #[error("unexpected data in the jobs table: {0}")]
    Corrupt(String),
    /// A database error.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

impl QueueError {
    /// True for failures another try may not hit: the database was unreachable, restarting or
    /// overloaded (see [`is_transient_db_error`]).
    pub fn is_transient(&self) -> bool {
        match self {
            QueueError::Db(err) => is_transient_db_error(err),
            _ => false,
        }
    }

    /// Maps the fencing trigger's error to [`QueueError::LeaseLost`]; other errors pass through.
    pub(crate) fn fenced(err: sqlx::Error, job_id: &str, attempt: i32) -> QueueError {
        let code = err.as_database_error().and_then(|db| db.code().map(|c| c.into_owned()));
        match code.as_deref() {
            Some(STALE_ATTEMPT) => QueueError::LeaseLost { job_id: job_id.to_string(), attempt },
            Some(BAD_TRANSITION) => QueueError::InvalidState {
                job_id: job_id.to_string(),
                state: "changed".to_string(),
                action: "write",
            },
            _ => QueueError::Db(err),
        }
    }
}

/// SQLSTATEs of failures that go away on their own: the server shutting down or starting up,
/// too many connections, serialization failures and deadlocks (class 08, connection
/// exceptions, is matched by its prefix).
const TRANSIENT_SQLSTATES: &[&str] = &["57P01", "57P02", "57P03", "53300", "40001", "40P01"];

/// True when `err` says the database could not be reached or was restarting, rather than that
/// the statement was wrong: retrying it later can succeed.
pub fn is_transient_db_error(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || TRANSIENT_SQLSTATES.contains(&code.as_ref())
        }),
        _ => false,
    }
}
