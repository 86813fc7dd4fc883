//! A job pausing itself: on a warning listed in `auto_pause_on`, or when its budget is
//! reached; it checkpoints first, as a user's pause does.

use super::handler::TrainingHandler;
use super::progress::{JobPhase, LiveProgress};
use super::stop::{event, lease_error, persist, Stop};
use super::watch::Watch;
use crate::trainer::Trainer;
use serde_json::{json, Value};
use verity_core::queue::{EventLevel, Heartbeat, JobOutcome, Lease, QueueError};

impl TrainingHandler {
    /// Reports the warnings a new row set off (a `warning` event each, the first time a kind
    /// fires); the reason to pause when one of them is listed in `auto_pause_on` (after an
    /// `auto_pause` event).
    pub(super) async fn watch_row(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        watch: &mut Watch,
        row: Value,
    ) -> Result<Option<String>, Stop> {
        let mut pause = None;
        for warning in watch.observe(row) {
            let data = serde_json::to_value(&warning).unwrap_or(Value::Null);
            event(lease, heartbeat, EventLevel::Warn, "warning", &warning.message, Some(&data))
                .await?;
            if watch.pauses(&warning) {
                let message = format!(
                    "paused by auto_pause_on: {} ({} = {:.3}, threshold {:.3}, step {}); resume the \
                     job to continue",
                    warning.kind.as_str(),
                    warning.metric,
                    warning.value,
                    warning.threshold,
                    warning.step
                );
                event(lease, heartbeat, EventLevel::Warn, "auto_pause", &message, Some(&data))
                    .await?;
                pause = Some(message);
            }
        }
        Ok(pause)
    }

    /// Pauses the job itself for `reason`: checkpoints the trainer (unless `trainer` is `None`:
    /// nothing was trained since the checkpoint it resumed from), stores the reason with the
    /// progress, and ends the attempt as paused, as a user's pause does.
    pub(super) async fn pause_for(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        progress: &LiveProgress,
        trainer: Option<Trainer>,
        metrics: Option<&Value>,
        reason: &str,
    ) -> Result<JobOutcome, Stop> {
        if let Some(trainer) = trainer {
            progress.phase(JobPhase::Checkpointing);
            self.checkpoint(lease, heartbeat, trainer, metrics).await?;
        }
        progress.paused(reason);
        if let Some(report) = progress.snapshot() {
            let store = || lease.heartbeat(Some(&report));
            persist("reporting progress", heartbeat, QueueError::is_transient, store)
                .await
                .map_err(|e| lease_error("reporting progress", e))?;
        }
        Ok(JobOutcome::Paused)
    }

    /// Reports a cap of the job's budget reached after `step` (a `budget_pause` event); the
    /// reason to pause.
    pub(super) async fn budget_reached(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        reached: verity_core::budget::Reached,
        step: u64,
    ) -> Result<String, Stop> {
        let field = reached.cap.field();
        let reason = format!(
            "{}; raise {field} (POST /v1/verity/jobs/{}/budget) and resume the job to continue",
            reached.describe(step),
            lease.job().id
        );
        let data =
            json!({"cap": field, "limit": reached.limit, "used": reached.used, "step": step});
        tracing::info!(job_id = %lease.job().id, cap = field, step, "budget reached; pausing the job");
        event(lease, heartbeat, EventLevel::Warn, "budget_pause", &reason, Some(&data)).await?;
        Ok(reason)
    }
}
