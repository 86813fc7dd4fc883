//! Rescue of jobs whose worker stopped heartbeating.

use super::{secs, Queue, QueueError};

impl Queue {
    /// Requeues (with backoff) every running job whose lease has expired, or fails it when its
    /// attempts are spent; pending cancel/pause requests are honoured. Returns the job ids.
    /// Any worker or server may call this; concurrent calls do not double-count.
    pub async fn rescue_expired(&self) -> Result<Vec<String>, QueueError> {
        let settings = self.settings;
        let rescued = sqlx::query_scalar!(
            r#"UPDATE jobs SET
                   failures = failures + CASE WHEN control = 'none' THEN 1 ELSE 0 END,
                   state = CASE WHEN control = 'cancel' THEN 'cancelled'
                                WHEN control = 'pause' THEN 'paused'
                                WHEN failures + 1 < max_attempts THEN 'queued'
                                ELSE 'failed' END,
                   finished_at = CASE WHEN control = 'cancel'
                                        OR (control = 'none' AND failures + 1 >= max_attempts)
                                      THEN now() END,
                   run_after = now() + make_interval(secs => least($1 * power(2, failures), $2)),
                   error = jsonb_build_object(
                       'message', 'worker ' || worker_id || ' stopped heartbeating; its lease expired',
                       'code', 'lease_expired', 'attempt', attempt),
                   worker_id = NULL, lease_expires_at = NULL, control = 'none'
               WHERE id IN (SELECT id FROM jobs WHERE state = 'running' AND lease_expires_at < now()
                            FOR UPDATE SKIP LOCKED)
               RETURNING id"#,
            secs(settings.retry_base),
            secs(settings.retry_max),
        )
        .fetch_all(&self.pool)
        .await?;
        for id in &rescued {
            tracing::warn!(job_id = %id, "rescued job with an expired lease");
        }
        Ok(rescued)
    }
}
