//! A background task that keeps a lease alive while a job runs and relays control signals.

use super::{Backoff, Lease, QueueError};
use crate::ControlSignal;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the last heartbeat learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatState {
    /// The lease is held; the user's latest request.
    Held(ControlSignal),
    /// The lease was lost: stop writing, the job belongs to someone else.
    Lost,
}

/// Heartbeats a lease every `interval` until dropped.
#[derive(Debug)]
pub struct Heartbeat {
    state: watch::Receiver<HeartbeatState>,
    progress: Arc<Mutex<Option<Value>>>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts heartbeating `lease`.
    pub fn start(lease: Lease, interval: Duration) -> Heartbeat {
        let (tx, state) = watch::channel(HeartbeatState::Held(ControlSignal::Continue));
        let progress: Arc<Mutex<Option<Value>>> = Arc::new(Mutex::new(None));
        let shared = progress.clone();
        let task = tokio::spawn(async move {
            // A failed heartbeat (database unreachable) does not lose the job: the lease stays
            // valid until it expires, and writes are fenced anyway. Retry sooner than usual so
            // the lease is renewed as soon as the database answers again.
            let mut backoff = Backoff::new(interval.min(Duration::from_millis(500)), interval);
            let mut delay = interval;
            loop {
                tokio::time::sleep(delay).await;
                let snapshot = shared.lock().map(|p| p.clone()).unwrap_or(None);
                match lease.heartbeat(snapshot.as_ref()).await {
                    Ok(signal) => {
                        if backoff.failures() > 0 {
                            tracing::info!(job_id = %lease.job().id, failures = backoff.failures(), "heartbeat recovered");
                        }
                        backoff.reset();
                        delay = interval;
                        tx.send_replace(HeartbeatState::Held(signal));
                    }
                    Err(QueueError::LeaseLost { .. }) => {
                        tracing::warn!(job_id = %lease.job().id, attempt = lease.job().attempt, "lease lost");
                        tx.send_replace(HeartbeatState::Lost);
                        return;
                    }
                    Err(err) => {
                        delay = backoff.next_delay();
                        tracing::warn!(job_id = %lease.job().id, error = %err, failures = backoff.failures(),
                                       retry_in_ms = delay.as_millis() as u64, "heartbeat failed; retrying");
                    }
                }
            }
        });
        Heartbeat { state, progress, task }
    }

    /// The latest known state.
    pub fn state(&self) -> HeartbeatState {
        *self.state.borrow()
    }

    /// Waits until the state differs from `Held(Continue)`.
    pub async fn interrupted(&self) -> HeartbeatState {
        let mut rx = self.state.clone();
        let seen =
            rx.wait_for(|s| *s != HeartbeatState::Held(ControlSignal::Continue)).await.map(|s| *s);
        // If the task ended without saying Lost, we can no longer vouch for the lease.
        seen.unwrap_or(HeartbeatState::Lost)
    }

    /// Progress to attach to the next heartbeat (shown by the API).
    pub fn set_progress(&self, progress: Value) {
        if let Ok(mut slot) = self.progress.lock() {
            *slot = Some(progress);
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
