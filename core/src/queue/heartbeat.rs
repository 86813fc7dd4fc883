//! A background task that keeps a lease alive while a job runs and relays control signals.

use super::{Backoff, Lease, QueueError};
use crate::ControlSignal;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// What the last heartbeat learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatState {
    /// The lease is held; the user's latest request.
    Held(ControlSignal),
    /// The lease was lost: stop writing, the job belongs to someone else.
    Lost,
}

/// Shortest time after a heartbeat sent early for a progress report before the next (reports
/// in a burst are folded into one write).
const REPORT_GAP: Duration = Duration::from_millis(250);

/// Heartbeats a lease every `interval` until dropped, and at once when progress is reported.
#[derive(Debug)]
pub struct Heartbeat {
    state: watch::Receiver<HeartbeatState>,
    reporter: ProgressReporter,
    task: JoinHandle<()>,
}

/// A cloneable handle on a heartbeat's progress: each report is stored on the job by a
/// heartbeat sent at once (not at the next interval), so the API never lags the worker.
#[derive(Debug, Clone)]
pub struct ProgressReporter {
    progress: Arc<Mutex<Option<Value>>>,
    wake: Arc<Notify>,
}

impl ProgressReporter {
    /// Stores `progress` on the job with an immediate heartbeat.
    pub fn report(&self, progress: Value) {
        if let Ok(mut slot) = self.progress.lock() {
            *slot = Some(progress);
        }
        self.wake.notify_one();
    }
}

impl Heartbeat {
    /// Starts heartbeating `lease`, beating at once (to learn the request) whenever `control`
    /// is notified: a cancel or pause announced by the database reaches the job within a
    /// round trip instead of an interval (see [`super::JobWaker::control_wake`]).
    pub fn start(lease: Lease, interval: Duration, control: Option<Arc<Notify>>) -> Heartbeat {
        let control = control.unwrap_or_default();
        let (tx, state) = watch::channel(HeartbeatState::Held(ControlSignal::Continue));
        let reporter = ProgressReporter {
            progress: Arc::new(Mutex::new(None)),
            wake: Arc::new(Notify::new()),
        };
        let (shared, wake) = (reporter.progress.clone(), reporter.wake.clone());
        let task = tokio::spawn(async move {
            // A failed heartbeat (database unreachable) does not lose the job: the lease stays
            // valid until it expires, and writes are fenced anyway. Retry sooner than usual so
            // the lease is renewed as soon as the database answers again.
            let mut backoff = Backoff::new(interval.min(Duration::from_millis(500)), interval);
            let mut delay = interval;
            loop {
                // A progress report beats early, unless heartbeats are failing (then the
                // backoff decides).
                let healthy = backoff.failures() == 0;
                let early = tokio::select! {
                    _ = tokio::time::sleep(delay) => false,
                    _ = wake.notified(), if healthy => true,
                    _ = control.notified() => true,
                };
                let snapshot = shared.lock().map(|p| p.clone()).unwrap_or(None);
                match lease.heartbeat(snapshot.as_ref()).await {
                    Ok(signal) => {
                        if backoff.failures() > 0 {
                            tracing::info!(job_id = %lease.job().id, failures = backoff.failures(), "heartbeat recovered");
                        }
                        backoff.reset();
                        delay = interval;
                        tx.send_replace(HeartbeatState::Held(signal));
                        if early {
                            // Reports arriving meanwhile are folded into the next beat.
                            tokio::time::sleep(REPORT_GAP).await;
                        }
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
        Heartbeat { state, reporter, task }
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

    /// Waits until the user cancels or the lease is lost (a pause is not waited for: pausing
    /// lets the current unit of work finish so that it can be checkpointed).
    pub async fn cancelled_or_lost(&self) -> HeartbeatState {
        let mut rx = self.state.clone();
        let seen = rx
            .wait_for(|s| {
                matches!(s, HeartbeatState::Lost | HeartbeatState::Held(ControlSignal::Cancel))
            })
            .await
            .map(|s| *s);
        seen.unwrap_or(HeartbeatState::Lost)
    }

    /// Stores `progress` on the job (shown by the API) with a heartbeat sent at once.
    pub fn set_progress(&self, progress: Value) {
        self.reporter.report(progress);
    }

    /// A handle that reports progress from anywhere (a blocking training thread).
    pub fn reporter(&self) -> ProgressReporter {
        self.reporter.clone()
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
