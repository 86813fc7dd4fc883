//! Job change announcements for caches: the database NOTIFYs [`JOB_CHANGES_CHANNEL`] with a job's
//! id whenever its row is updated or deleted, or its metrics rows are written (migrations
//! `0002_job_changes.sql`, `0003_metrics_changes.sql`), and
//! [`listen_for_job_changes`] turns that into calls a cache can act on.

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The channel that carries the ids of changed jobs.
pub const JOB_CHANGES_CHANNEL: &str = "verity_job_changes";

/// What a change listener learnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobChange {
    /// The row of this job, or its metrics, changed (or were deleted).
    Changed(String),
    /// The listening connection was lost: announcements may be missed until `Subscribed`.
    Lost,
    /// The listener is (again) subscribed: every change from now on is announced, but changes
    /// made while it was not subscribed were not.
    Subscribed,
}

/// Longest pause between attempts to re-subscribe after the connection was lost.
const MAX_RETRY: Duration = Duration::from_secs(5);

async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Subscribes on a dedicated connection and calls `on_change` for every announcement from a
/// background task, which re-subscribes (with backoff) whenever the connection drops. Calls
/// `on_change(Subscribed)` once subscribed, before returning; fails only if that first
/// subscription fails.
pub async fn listen_for_job_changes<F>(
    pool: &PgPool,
    on_change: F,
) -> Result<JoinHandle<()>, sqlx::Error>
where
    F: Fn(JobChange) + Send + Sync + 'static,
{
    listen(pool, JOB_CHANGES_CHANNEL, on_change).await
}

/// Like [`listen_for_job_changes`] for any `channel`: `Changed` carries each NOTIFY's payload.
pub async fn listen<F>(
    pool: &PgPool,
    channel: &'static str,
    on_change: F,
) -> Result<JoinHandle<()>, sqlx::Error>
where
    F: Fn(JobChange) + Send + Sync + 'static,
{
    let mut listener = subscribe(pool, channel).await?;
    on_change(JobChange::Subscribed);
    let pool = pool.clone();
    Ok(tokio::spawn(async move {
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    on_change(JobChange::Changed(notification.payload().to_string()))
                }
                outcome => {
                    if let Err(error) = outcome {
                        tracing::warn!(%error, channel, "change listener failed; re-subscribing");
                    } else {
                        tracing::warn!(
                            channel,
                            "change listener lost its connection; re-subscribing"
                        );
                    }
                    on_change(JobChange::Lost);
                    let mut pause = Duration::from_millis(100);
                    listener = loop {
                        tokio::time::sleep(pause).await;
                        match subscribe(&pool, channel).await {
                            Ok(listener) => break listener,
                            Err(error) => {
                                tracing::warn!(%error, channel, "could not re-subscribe");
                                pause = (pause * 2).min(MAX_RETRY);
                            }
                        }
                    };
                    on_change(JobChange::Subscribed);
                }
            }
        }
    }))
}
