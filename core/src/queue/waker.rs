//! Wake-ups for idle workers: LISTEN on the queue channel, with polling as the fallback.

use super::CHANNEL;
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
        let wake = notify.clone();
        let listener = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(_) => wake.notify_one(),
                    Err(err) => {
                        // recv() reconnects on the next call; meanwhile polling covers us.
                        tracing::warn!(error = %err, "queue listener lost its connection; reconnecting");
                        wake.notify_one();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Ok(JobWaker { notify, listener })
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

impl Drop for JobWaker {
    fn drop(&mut self) {
        self.listener.abort();
    }
}
