//! Wake-ups for workers: LISTEN on the queue channel (an idle worker claims at once, with
//! polling as the fallback) and on the control channel (a running job's heartbeat beats at once
//! when its job is cancelled or paused, instead of at its next interval).

use super::{RetryPolicy, CHANNEL};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Name of the Postgres channel that announces a cancel or pause request (payload: the job id).
pub const CONTROL_CHANNEL: &str = "verity_job_control";

/// The running jobs' wake-ups, by job id.
type Controls = Arc<Mutex<HashMap<String, Arc<Notify>>>>;

/// Why [`JobWaker::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A job was announced.
    Notified,
    /// The polling interval passed.
    Poll,
}

/// Listens for queued jobs on a dedicated connection, reconnecting when it drops. Waiting never
/// depends on the listener alone: every wait also ends after the polling interval.
#[derive(Debug)]
pub struct JobWaker {
    notify: Arc<Notify>,
    controls: Controls,
    listener: JoinHandle<()>,
}

/// A running job's registration for control wake-ups; unregisters when dropped.
#[derive(Debug)]
pub struct ControlWake {
    job_id: String,
    notify: Arc<Notify>,
    controls: Controls,
}

impl ControlWake {
    /// Notified when the job's control request changes (or the listener reconnects, when a
    /// request may have been missed).
    pub fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }
}

impl Drop for ControlWake {
    fn drop(&mut self) {
        let mut controls = self.controls.lock().unwrap_or_else(|p| p.into_inner());
        if controls.get(&self.job_id).is_some_and(|n| Arc::ptr_eq(n, &self.notify)) {
            controls.remove(&self.job_id);
        }
    }
}

impl JobWaker {
    /// Starts listening; fails only if the first LISTEN fails.
    pub async fn start(pool: &PgPool) -> Result<JobWaker, sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen_all([CHANNEL, CONTROL_CHANNEL]).await?;
        let notify = Arc::new(Notify::new());
        let controls = Controls::default();
        let task = listen(Some(listener), pool.clone(), notify.clone(), controls.clone());
        Ok(JobWaker { notify, controls, listener: tokio::spawn(task) })
    }

    /// Starts listening in the background: connects (and reconnects whenever the connection
    /// drops) with backoff; polling covers the gaps. Never fails.
    pub fn spawn(pool: &PgPool) -> JobWaker {
        let notify = Arc::new(Notify::new());
        let controls = Controls::default();
        let listener = tokio::spawn(listen(None, pool.clone(), notify.clone(), controls.clone()));
        JobWaker { notify, controls, listener }
    }

    /// A waker with no listener at all: polling only.
    pub fn polling_only() -> JobWaker {
        JobWaker {
            notify: Arc::new(Notify::new()),
            controls: Controls::default(),
            listener: tokio::spawn(async {}),
        }
    }

    /// Registers `job_id` for control wake-ups while the returned guard lives.
    pub fn control_wake(&self, job_id: &str) -> ControlWake {
        let notify = Arc::new(Notify::new());
        let mut controls = self.controls.lock().unwrap_or_else(|p| p.into_inner());
        controls.insert(job_id.to_string(), notify.clone());
        ControlWake { job_id: job_id.to_string(), notify, controls: self.controls.clone() }
    }

    /// Waits for a notification or `poll_interval`, whichever comes first.
    pub async fn wait(&self, poll_interval: Duration) -> Wake {
        tokio::select! {
            _ = self.notify.notified() => Wake::Notified,
            _ = tokio::time::sleep(poll_interval) => Wake::Poll,
        }
    }

    /// Stops the listener task (as if its connection had died for good).
    pub fn stop_listener(&self) {
        self.listener.abort();
    }
}

/// Relays notifications to `wake` (queued jobs) or to the job's entry of `controls` (control
/// requests), (re)connecting with backoff whenever there is no listener.
async fn listen(
    mut listener: Option<PgListener>,
    pool: PgPool,
    wake: Arc<Notify>,
    controls: Controls,
) {
    let mut backoff = RetryPolicy::WORKER.backoff();
    // Whatever was announced while not listening: jobs may have been queued, and running jobs
    // cancelled, so wake everyone.
    let wake_all = || {
        wake.notify_one();
        let controls = controls.lock().unwrap_or_else(|p| p.into_inner());
        controls.values().for_each(|notify| notify.notify_one());
    };
    loop {
        let Some(connected) = listener.as_mut() else {
            let attempt = async {
                let mut fresh = PgListener::connect_with(&pool).await?;
                fresh.listen_all([CHANNEL, CONTROL_CHANNEL]).await?;
                Ok::<PgListener, sqlx::Error>(fresh)
            };
            match attempt.await {
                Ok(fresh) => {
                    if backoff.failures() > 0 {
                        tracing::info!("queue listener connected again");
                    }
                    backoff.reset();
                    listener = Some(fresh);
                    wake_all();
                }
                Err(err) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "queue listener cannot connect; polling meanwhile");
                    tokio::time::sleep(delay).await;
                }
            }
            continue;
        };
        match connected.try_recv().await {
            Ok(Some(notification)) => {
                backoff.reset();
                if notification.channel() == CONTROL_CHANNEL {
                    let controls = controls.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(notify) = controls.get(notification.payload()) {
                        notify.notify_one();
                    }
                } else {
                    wake.notify_one();
                }
            }
            // The connection dropped; the next call would reconnect, but we do it ourselves to
            // back off while the database is down.
            Ok(None) => {
                tracing::warn!("queue listener lost its connection; reconnecting");
                listener = None;
                wake_all();
            }
            Err(err) => {
                tracing::warn!(error = %err, "queue listener failed; reconnecting");
                listener = None;
                wake_all();
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

impl Drop for JobWaker {
    fn drop(&mut self) {
        self.listener.abort();
    }
}
