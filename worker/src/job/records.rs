//! What a job records as it trains: each step's metrics row and `metrics.jsonl` line, its
//! samples and their index, its events, and the rows read back on resume.

use super::artifacts::append_metrics_line;
use super::handler::TrainingHandler;
use super::stop::{event, lease_error, persist, retryable, transient_chain, Stop};
use crate::trainer::{Evaluation, SampleRecord, StepOutput};
use bytes::Bytes;
use serde_json::{json, Value};
use verity_core::queue::{
    is_transient_db_error, EventLevel, Heartbeat, Lease, QueueError, SampleIndexRow,
};
use verity_core::storage::StorageError;

impl TrainingHandler {
    /// Writes `samples/step-{step}.jsonl` and its index rows. Training samples (`training`)
    /// are indexed with their advantage and score; a sampling run's without an advantage, and
    /// a failed grading without a score.
    pub(super) async fn record_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        step: i32,
        records: &[SampleRecord],
        training: bool,
    ) -> Result<(), Stop> {
        let key = verity_core::keys::samples(&lease.job().id, step);
        self.store_samples(lease, heartbeat, step, &key, records, 0, training).await
    }

    /// Writes the validation samples an evaluation after `step` kept
    /// (`samples/step-{step}-validation.jsonl`), indexed after the step's `first` training
    /// samples and without an advantage, which tells them apart.
    pub(super) async fn record_validation_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        step: u64,
        eval: &Evaluation,
        first: usize,
    ) -> Result<(), Stop> {
        let Evaluation::Reinforcement(eval) = eval else { return Ok(()) };
        if eval.samples.is_empty() {
            return Ok(());
        }
        let key = verity_core::keys::validation_samples(&lease.job().id, step);
        self.store_samples(lease, heartbeat, step as i32, &key, &eval.samples, first, false).await
    }

    /// Writes `records` to `key` and indexes them under `step` from index `first` on.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn store_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        step: i32,
        key: &str,
        records: &[SampleRecord],
        first: usize,
        training: bool,
    ) -> Result<(), Stop> {
        let key = key.to_string();
        let mut body = String::new();
        for record in records {
            body.push_str(
                &serde_json::to_string(record).map_err(|e| retryable("encoding samples", e))?,
            );
            body.push('\n');
        }
        let body = Bytes::from(body);
        let put = || self.store.put_bytes(&key, body.clone());
        persist("writing samples", heartbeat, StorageError::is_transient, put)
            .await
            .map_err(|e| retryable("writing samples", e))?;
        let rows: Vec<SampleIndexRow> = records
            .iter()
            .enumerate()
            .map(|(line, s)| SampleIndexRow {
                idx: (first + s.idx) as i32,
                prompt_idx: s.prompt_idx as i32,
                score: (training || s.grader_error.is_none()).then_some(s.score),
                advantage: training.then_some(s.advantage),
                finish_reason: Some(s.finish_reason.clone()),
                storage_key: key.clone(),
                line_no: line as i32,
            })
            .collect();
        let index = || lease.samples(step, &rows);
        persist("indexing samples", heartbeat, QueueError::is_transient, index)
            .await
            .map_err(|e| lease_error("indexing samples", e))
    }

    /// Writes a step's metrics row, metrics line, samples and event.
    pub(super) async fn record_step(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        out: &StepOutput,
        eval: Option<&Evaluation>,
    ) -> Result<Value, Stop> {
        let job_id = &lease.job().id;
        let step = out.metrics.step;
        let mut row = out.row().map_err(|e| retryable("encoding metrics", e))?;
        if let (Some(eval), Some(map)) = (eval, row.as_object_mut()) {
            map.insert("eval".into(), serde_json::to_value(eval).unwrap_or(Value::Null));
        }
        self.record_samples(lease, heartbeat, step as i32, &out.samples, true).await?;
        let metric = || lease.metric(step as i32, &row);
        persist("writing metrics", heartbeat, QueueError::is_transient, metric)
            .await
            .map_err(|e| lease_error("writing metrics", e))?;
        let line = || append_metrics_line(self.store.as_ref(), job_id, step, &row);
        persist("writing metrics.jsonl", heartbeat, transient_chain, line)
            .await
            .map_err(|e| retryable("writing metrics.jsonl", e))?;
        let (summary, message) = match &out.tuning {
            None => (
                json!({"step": step, "reward_mean": out.metrics.reward_mean, "loss": out.metrics.loss}),
                format!("step {step}: reward {:.3}", out.metrics.reward_mean),
            ),
            Some(tuning) => (
                json!({"step": step, "loss": tuning.loss}),
                format!("step {step}: loss {:.4}", tuning.loss),
            ),
        };
        event(lease, heartbeat, EventLevel::Debug, "step", &message, Some(&summary)).await?;
        if let Some(eval) = eval {
            eval_event(lease, heartbeat, eval).await?;
        }
        Ok(row)
    }

    /// The job's metrics rows so far, by step.
    pub(super) async fn metrics_rows(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
    ) -> Result<Vec<(i32, Value)>, Stop> {
        let pool = lease.queue().pool();
        let read = || verity_core::jobs::metrics_rows(pool, &lease.job().id);
        persist("reading the metrics", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the metrics", e))
    }

    /// The job's rows as the monitor reads them (baseline and steps so far).
    pub(super) async fn monitor_rows(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
    ) -> Result<Vec<Value>, Stop> {
        let pool = lease.queue().pool();
        let read = || verity_core::monitor::job_rows(pool, &lease.job().id);
        persist("reading the metrics", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the metrics", e))
    }
}

/// The `trained_tokens` of a stored metrics row (0 for rows written before it was measured).
pub(super) fn step_tokens(row: &Value) -> u64 {
    row.get("trained_tokens").and_then(Value::as_u64).unwrap_or(0)
}

/// An `eval` event carrying the validation results (step 0 is the baseline before training).
pub(super) async fn eval_event(
    lease: &Lease,
    heartbeat: &Heartbeat,
    eval: &Evaluation,
) -> Result<(), Stop> {
    let data = serde_json::to_value(eval).unwrap_or(Value::Null);
    let message = eval.summary();
    event(lease, heartbeat, EventLevel::Info, "eval", &message, Some(&data)).await
}
