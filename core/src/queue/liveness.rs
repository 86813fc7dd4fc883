//! Liveness of a claim loop, shared with whoever reports on it (`/readyz` of `verity up`).
//!
//! The loop beats at least every tick (the poll interval, at most a second) while it waits,
//! claims or runs a job; a beat older than [`WorkerLiveness::stale_after`] means the task is no
//! longer being polled (stuck). Database failures that last longer than that, a loop that
//! ended, and a task that died (error, panic, abort) make the worker not ready, with a reason.

use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The fewest ticks without a beat before the loop counts as stuck.
const STALE_TICKS: u32 = 10;
/// The shortest time without a beat before the loop counts as stuck.
const STALE_FLOOR: Duration = Duration::from_secs(5);

/// A cheap, cloneable handle on one claim loop's liveness.
#[derive(Debug, Clone, Default)]
pub struct WorkerLiveness {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    tick: Duration,
    last_beat: Instant,
    failing_since: Option<Instant>,
    last_error: Option<String>,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner {
            phase: Phase::Starting,
            tick: Duration::from_secs(1),
            last_beat: Instant::now(),
            failing_since: None,
            last_error: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Starting,
    Running,
    Stopped,
    Dead(String),
}

/// What a readiness probe reports about the worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerHealth {
    /// Whether the worker is claiming and running jobs.
    pub ready: bool,
    /// `starting`, `running`, `failing`, `stuck`, `stopped` or `dead`.
    pub status: &'static str,
    /// Why it is not ready (or the last error while it recovers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Milliseconds since the loop last beat.
    pub last_beat_ms: u64,
}

impl WorkerLiveness {
    /// A handle for a loop that has not started yet.
    pub fn new() -> WorkerLiveness {
        WorkerLiveness::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave it inconsistent: every update is one store.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The loop started; it will beat at least every `tick`.
    pub fn started(&self, tick: Duration) {
        let mut inner = self.lock();
        inner.phase = Phase::Running;
        inner.tick = tick;
        inner.last_beat = Instant::now();
        inner.failing_since = None;
        inner.last_error = None;
    }

    /// The loop is alive.
    pub fn beat(&self) {
        self.lock().last_beat = Instant::now();
    }

    /// A queue operation succeeded: any failure streak is over.
    pub fn succeeded(&self) {
        let mut inner = self.lock();
        inner.last_beat = Instant::now();
        inner.failing_since = None;
        inner.last_error = None;
    }

    /// A queue operation failed; the loop backs off and retries.
    pub fn failed(&self, error: &str) {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.last_beat = now;
        inner.failing_since.get_or_insert(now);
        inner.last_error = Some(error.to_string());
    }

    /// The loop ended normally (shutdown, or its job limit).
    pub fn stopped(&self) {
        self.lock().phase = Phase::Stopped;
    }

    /// The loop's task died (or is being restarted) for `reason`.
    pub fn dead(&self, reason: impl Into<String>) {
        self.lock().phase = Phase::Dead(reason.into());
    }

    /// How long without a beat counts as stuck: ten ticks, at least five seconds.
    pub fn stale_after(&self) -> Duration {
        (self.lock().tick * STALE_TICKS).max(STALE_FLOOR)
    }

    /// The worker's health now (cheap: one lock, no I/O).
    pub fn health(&self) -> WorkerHealth {
        let inner = self.lock();
        let stale_after = (inner.tick * STALE_TICKS).max(STALE_FLOOR);
        let since_beat = inner.last_beat.elapsed();
        let last_beat_ms = since_beat.as_millis() as u64;
        let health = |ready, status, reason| WorkerHealth { ready, status, reason, last_beat_ms };
        match &inner.phase {
            Phase::Starting => health(false, "starting", Some("the worker has not started".into())),
            Phase::Stopped => {
                health(false, "stopped", Some("the worker's claim loop ended".into()))
            }
            Phase::Dead(reason) => health(false, "dead", Some(reason.clone())),
            Phase::Running if since_beat > stale_after => health(
                false,
                "stuck",
                Some(format!(
                    "the worker's claim loop has not run for {:.1} s (limit {:.1} s)",
                    since_beat.as_secs_f64(),
                    stale_after.as_secs_f64()
                )),
            ),
            Phase::Running => match (inner.failing_since, &inner.last_error) {
                (Some(since), Some(error)) if since.elapsed() > stale_after => health(
                    false,
                    "failing",
                    Some(format!(
                        "the worker cannot use the queue for {:.1} s: {error}",
                        since.elapsed().as_secs_f64()
                    )),
                ),
                (_, error) => health(true, "running", error.clone()),
            },
        }
    }
}

/// Marks the loop dead if it is dropped (aborted task, panic) before it ends normally.
#[derive(Debug)]
pub(crate) struct LoopGuard {
    liveness: WorkerLiveness,
    finished: bool,
}

impl LoopGuard {
    /// Guards the loop reporting to `liveness`.
    pub(crate) fn new(liveness: WorkerLiveness) -> LoopGuard {
        LoopGuard { liveness, finished: false }
    }

    /// The loop ended normally.
    pub(crate) fn finish(mut self) {
        self.finished = true;
        self.liveness.stopped();
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        if !self.finished {
            let reason = if std::thread::panicking() {
                "the worker's claim loop panicked"
            } else {
                "the worker's claim loop was stopped before it finished (its task was cancelled)"
            };
            tracing::error!(reason, "worker claim loop died");
            self.liveness.dead(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_and_staleness() {
        let live = WorkerLiveness::new();
        assert_eq!(live.health().status, "starting");
        live.started(Duration::from_millis(10));
        assert!(live.health().ready);
        live.failed("database error: pool timed out");
        let health = live.health();
        assert!(health.ready, "a short failure streak is not yet a problem: {health:?}");
        assert_eq!(health.reason.as_deref(), Some("database error: pool timed out"));
        live.succeeded();
        assert_eq!(live.health().reason, None);
        {
            // Pretend the last beat and the failure streak are old.
            let mut inner = live.lock();
            inner.last_beat = Instant::now() - Duration::from_secs(6);
        }
        let health = live.health();
        assert_eq!((health.ready, health.status), (false, "stuck"), "{health:?}");
        live.failed("connection refused");
        live.lock().failing_since = Some(Instant::now() - Duration::from_secs(6));
        let health = live.health();
        assert_eq!((health.ready, health.status), (false, "failing"), "{health:?}");
        assert!(health.reason.unwrap().contains("connection refused"));
        let guard = LoopGuard::new(live.clone());
        drop(guard);
        let health = live.health();
        assert_eq!((health.ready, health.status), (false, "dead"));
        LoopGuard::new(live.clone()).finish();
        assert_eq!(live.health().status, "stopped");
    }
}
