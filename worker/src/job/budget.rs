//! The budget during training ([`verity_core::budget`]): the attempt's wall clock and generated
//! tokens on top of what earlier attempts used, stored at the end of every step (as a total, so
//! a retried write changes nothing), with the caps read back in the same write.

use super::stop::{persist, retryable, Stop};
use sqlx::Error;
use std::time::Instant;
use verity_core::budget::{job_budget, record_usage, Caps, Usage};
use verity_core::queue::{is_transient_db_error, Heartbeat, JobOutcome, Lease};

/// What one attempt adds to the usage its job had when the attempt began.
#[derive(Debug, Clone)]
pub(super) struct Meter {
    before: Usage,
    started: Instant,
    tokens: i64,
    steps: u64,
}

impl Meter {
    /// An attempt that began at `started` (when the worker took the job) of a job that had used
    /// `before`.
    pub(super) fn new(before: Usage, started: Instant) -> Meter {
        Meter { before, started, tokens: 0, steps: 0 }
    }

    /// A step ended, having generated `tokens` completion tokens.
    pub(super) fn step_done(&mut self, tokens: u64) {
        self.tokens = self.tokens.saturating_add(i64::try_from(tokens).unwrap_or(i64::MAX));
        self.steps += 1;
    }

    /// The job's usage now: earlier attempts' plus this one's.
    pub(super) fn usage(&self) -> Usage {
        Usage {
            wall_seconds: self.before.wall_seconds + self.started.elapsed().as_secs_f64(),
            tokens: self.before.tokens.saturating_add(self.tokens),
        }
    }

    /// Mean generated tokens per step of this attempt (0 before a step).
    pub(super) fn tokens_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.tokens as f64 / self.steps as f64
        }
    }
}

/// What the job had used when this attempt began.
pub(super) async fn usage_before(lease: &Lease, heartbeat: &Heartbeat) -> Result<Usage, Stop> {
    let (pool, job) = (lease.queue().pool(), lease.job());
    let read = || job_budget(pool, &job.id);
    let budget = persist("reading the budget", heartbeat, is_transient_db_error, read)
        .await
        .map_err(|e: Error| retryable("reading the budget", e))?;
    Ok(budget.map(|(_, usage)| usage).unwrap_or_default())
}

/// Stores `usage` on the job and returns its caps now; the lease lost ends the attempt.
pub(super) async fn store_usage(
    lease: &Lease,
    heartbeat: &Heartbeat,
    usage: Usage,
) -> Result<Caps, Stop> {
    let (pool, job) = (lease.queue().pool(), lease.job());
    let write = || record_usage(pool, &job.id, job.attempt, usage);
    persist("recording the budget", heartbeat, is_transient_db_error, write)
        .await
        .map_err(|e: Error| retryable("recording the budget", e))?
        .ok_or(Stop::Outcome(JobOutcome::LeaseLost))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn usage_adds_this_attempt_to_the_earlier_ones() {
        let before = Usage { wall_seconds: 100.0, tokens: 500 };
        let started = Instant::now() - Duration::from_secs(30);
        let mut meter = Meter::new(before, started);
        assert_eq!(meter.tokens_per_step(), 0.0);
        meter.step_done(40);
        meter.step_done(60);
        let now = meter.usage();
        assert_eq!(now.tokens, 600);
        assert!((130.0..131.0).contains(&now.wall_seconds), "{now:?}");
        assert_eq!(meter.tokens_per_step(), 50.0);
        // A job at its cap after this attempt's steps.
        let caps = Caps { max_wall_seconds: None, max_tokens: Some(600) };
        assert_eq!(
            caps.reached(now).map(|r| r.describe(2)).as_deref(),
            Some("budget of 600 generated tokens reached at step 2 (600 generated tokens used)")
        );
    }
}
