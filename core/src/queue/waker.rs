//! Wake-ups for idle workers: LISTEN on the queue channel, with polling as the fallback.

use super::{RetryPolicy, CHANNEL};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

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
    listener: JoinHandle<()>,
}

impl JobWaker {
    /// Starts listening; fails only if the first LISTEN fails.
    pub async fn start(pool: &PgPool) -> Result<JobWaker, sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(CHANNEL).await?;
        let notify = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(Some(listener), pool.clone(), notify.clone()));
        Ok(JobWaker { notify, listener })
    }

    /// Starts listening in the background: connects (and reconnects whenever the connection
    /// drops) with backoff; polling covers the gaps. Never fails.
    pub fn spawn(pool: &PgPool) -> JobWaker {
        let notify = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(None, pool.clone(), notify.clone()));
        JobWaker { notify, listener }
    }

    /// A waker with no listener at all: polling only.
    pub fn polling_only() -> JobWaker {
        JobWaker { notify: Arc::new(Notify::new()), listener: tokio::spawn(async {}) }
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

/// Relays notifications to `wake`, (re)connecting with backoff whenever there is no listener.
async fn listen(mut listener: Option<PgListener>, pool: PgPool, wake: Arc<Notify>) {
    let mut backoff = RetryPolicy::WORKER.backoff();
    loop {
        let Some(connected) = listener.as_mut() else {
            let attempt = async {
                let mut fresh = PgListener::connect_with(&pool).await?;
                fresh.listen(CHANNEL).await?;
                Ok::<PgListener, sqlx::Error>(fresh)
            };
            match attempt.await {
                Ok(fresh) => {
                    if backoff.failures() > 0 {
                        tracing::info!("queue listener connected again");
                    }
                    backoff.reset();
                    listener = Some(fresh);
                    // Jobs may have been queued while we were not listening.
                    wake.notify_one();
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
            Ok(Some(_)) => {
                backoff.reset();
                wake.notify_one();
            }
            // The connection dropped; the next call would reconnect, but we do it ourselves to
            // back off while the database is down.
            Ok(None) => {
                tracing::warn!("queue listener lost its connection; reconnecting");
                listener = None;
                wake.notify_one();
            }
            Err(err) => {
                tracing::warn!(error = %err, "queue listener failed; reconnecting");
                listener = None;
                wake.notify_one();
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
