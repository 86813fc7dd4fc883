//! User requests on a job: cancel, pause, resume. Queued and paused jobs change at once; a
//! running job gets a control flag that its worker sees on the next heartbeat.

use super::{Queue, QueueError};
use crate::JobState;

/// The job's state after a control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlOutcome {
    /// The state now.
    pub state: JobState,
    /// True when a running worker was asked and has yet to acknowledge.
    pub pending: bool,
}

impl Queue {
    /// Cancels a job: at once unless running, else by asking its worker.
    pub async fn cancel(&self, job_id: &str) -> Result<ControlOutcome, QueueError> {
        let state = sqlx::query_scalar!(
            r#"UPDATE jobs SET
                   state = CASE WHEN state = 'running' THEN 'running' ELSE 'cancelled' END,
                   control = CASE WHEN state = 'running' THEN 'cancel' ELSE 'none' END,
                   finished_at = CASE WHEN state = 'running' THEN NULL ELSE now() END
               WHERE id = $1 AND state IN ('queued', 'running', 'paused')
               RETURNING state"#,
            job_id
        )
        .fetch_optional(&self.pool)
        .await?;
        self.control_outcome(job_id, state, "cancel", "cancel requested").await
    }

    /// Pauses a job: a queued job at once, a running one after its worker checkpoints.
    pub async fn pause(&self, job_id: &str) -> Result<ControlOutcome, QueueError> {
        let state = sqlx::query_scalar!(
            r#"UPDATE jobs SET
                   state = CASE WHEN state = 'running' THEN 'running' ELSE 'paused' END,
                   control = CASE WHEN state = 'running' THEN 'pause' ELSE 'none' END
               WHERE id = $1 AND (state = 'queued' OR (state = 'running' AND control = 'none'))
               RETURNING state"#,
            job_id
        )
        .fetch_optional(&self.pool)
        .await?;
        self.control_outcome(job_id, state, "pause", "pause requested").await
    }

    /// Resumes a paused job (queued again; the next attempt continues from its checkpoint), or
    /// withdraws a pause request the worker has not acted on yet.
    pub async fn resume(&self, job_id: &str) -> Result<ControlOutcome, QueueError> {
        let state = sqlx::query_scalar!(
            r#"UPDATE jobs SET
                   state = CASE WHEN state = 'paused' THEN 'queued' ELSE state END,
                   control = 'none', run_after = now()
               WHERE id = $1 AND (state = 'paused' OR (state = 'running' AND control = 'pause'))
               RETURNING state"#,
            job_id
        )
        .fetch_optional(&self.pool)
        .await?;
        self.control_outcome(job_id, state, "resume", "pause withdrawn").await
    }

    /// Turns the row a control UPDATE returned into an outcome; logs requests sent to workers.
    async fn control_outcome(
        &self,
        job_id: &str,
        updated_state: Option<String>,
        action: &'static str,
        pending_message: &str,
    ) -> Result<ControlOutcome, QueueError> {
        let Some(state) = updated_state else {
            let state = self.state(job_id).await?;
            return Err(QueueError::InvalidState {
                job_id: job_id.to_string(),
                state: state.to_string(),
                action,
            });
        };
        let state: JobState = state
            .parse()
            .map_err(|e: crate::job_state::UnknownState| QueueError::Corrupt(e.to_string()))?;
        let pending = state == JobState::Running;
        if pending {
            sqlx::query!(
                "INSERT INTO job_events (job_id, kind, message) VALUES ($1, $2, $3)",
                job_id,
                action,
                pending_message
            )
            .execute(&self.pool)
            .await?;
        }
        Ok(ControlOutcome { state, pending })
    }
}
