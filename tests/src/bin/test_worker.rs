//! A real worker process running a test handler, for queue fault tests: each job counts
//! `spec.steps` steps of `spec.step_ms`, writing one metric row per step and resuming after the
//! last step recorded by an earlier attempt (as training resumes from its checkpoint).

use async_trait::async_trait;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use verity_core::queue::{
    run_worker, DeviceKind, Heartbeat, HeartbeatState, JobHandler, JobOutcome, Lease, Queue,
    QueueSettings, RunnerOptions, WorkerInfo,
};
use verity_core::ControlSignal;

struct CountingHandler;

#[async_trait]
impl JobHandler for CountingHandler {
    async fn run(&self, lease: &Lease, heartbeat: &Heartbeat) -> JobOutcome {
        let spec = &lease.job().spec;
        let steps = spec["steps"].as_i64().unwrap_or(10) as i32;
        let step_ms = spec["step_ms"].as_u64().unwrap_or(100);
        let resume_from: Option<i32> = match verity_core::jobs::last_metric_step(
            lease.queue().pool(),
            &lease.job().id,
        )
        .await
        {
            Ok(step) => step,
            Err(err) => return JobOutcome::Failed { message: err.to_string(), retryable: true },
        };
        let first = resume_from.map_or(0, |s| s + 1);
        if first > 0 {
            let _ = lease
                .event(
                    verity_core::queue::EventLevel::Info,
                    "resumed",
                    &format!("resumed at step {first}"),
                    None,
                )
                .await;
        }
        for step in first..steps {
            match heartbeat.state() {
                HeartbeatState::Lost => return JobOutcome::LeaseLost,
                HeartbeatState::Held(ControlSignal::Cancel) => return JobOutcome::Cancelled,
                HeartbeatState::Held(ControlSignal::Pause) => return JobOutcome::Paused,
                HeartbeatState::Held(ControlSignal::Continue) => {}
            }
            tokio::time::sleep(Duration::from_millis(step_ms)).await;
            let data =
                json!({ "step": step, "worker": lease.worker_id(), "pid": std::process::id() });
            if let Err(err) = lease.metric(step, &data).await {
                return JobOutcome::Failed { message: err.to_string(), retryable: true };
            }
        }
        JobOutcome::Succeeded { result: json!({ "steps": steps }), fine_tuned_model: None }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let url = std::env::var("DATABASE_URL")?;
    let lease_ms: u64 =
        std::env::var("TEST_LEASE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let pool = verity_core::db::connect(&url, 4).await?;
    let queue = Queue::new(
        pool,
        QueueSettings {
            lease: Duration::from_millis(lease_ms),
            retry_base: Duration::from_millis(0),
            retry_max: Duration::from_secs(1),
            poll_interval: Duration::from_millis(200),
            ..QueueSettings::DEFAULT
        },
    );
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    run_worker(queue, worker, Arc::new(CountingHandler), options, CancellationToken::new()).await;
    Ok(())
}
