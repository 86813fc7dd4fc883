//! Exponential backoff with jitter, and retrying of operations that fail transiently (the
//! database or the object store briefly unreachable).

use std::future::Future;
use std::time::{Duration, Instant};

/// Delays between retries: `initial`, doubling up to `max`, each drawn from its upper half
/// (so that workers that failed together do not retry in lock-step). [`Backoff::reset`] after a
/// success starts again from `initial`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// A backoff from `initial` up to `max`.
    pub const fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, failures: 0 }
    }

    /// The delay before the next try; each call counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.initial.saturating_mul(1u32 << self.failures.min(20)).min(self.max);
        self.failures = self.failures.saturating_add(1);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// How long and how often a failing operation is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Retries stop once this much time has passed since the first try.
    pub budget: Duration,
}

impl RetryPolicy {
    /// The workers' policy: 0.5 s doubling to 30 s, for up to 5 minutes. The claim loop uses
    /// the same delays without a budget (only shutdown ends it).
    pub const WORKER: RetryPolicy = RetryPolicy {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(30),
        budget: Duration::from_secs(300),
    };

    /// A fresh backoff with this policy's delays.
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.initial, self.max)
    }
}

/// Runs `op` until it succeeds, fails with an error `is_transient` rejects, the policy's budget
/// is spent, or `stop` returns true; each transient failure is logged and followed by a backoff
/// delay. Returns the last result. `op` must be safe to repeat (idempotent writes).
pub async fn retry_transient<T, E, F, Fut>(
    what: &str,
    policy: RetryPolicy,
    is_transient: impl Fn(&E) -> bool,
    stop: impl Fn() -> bool,
    mut op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let started = Instant::now();
    let mut backoff = policy.backoff();
    loop {
        match op().await {
            Ok(value) => {
                if backoff.failures() > 0 {
                    tracing::info!(what, failures = backoff.failures(), "recovered after retries");
                }
                return Ok(value);
            }
            Err(error) if is_transient(&error) && started.elapsed() < policy.budget && !stop() => {
                let delay = backoff.next_delay();
                tracing::warn!(
                    what,
                    %error,
                    failures = backoff.failures(),
                    retry_in_ms = delay.as_millis() as u64,
                    "transient failure; retrying"
                );
                tokio::time::sleep(delay).await;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter_and_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        let ceilings = [500u64, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000, 30_000];
        for ceiling in ceilings {
            let delay = backoff.next_delay().as_millis() as u64;
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay} not in [{}, {ceiling}]",
                ceiling / 2
            );
        }
        assert_eq!(backoff.failures(), ceilings.len() as u32);
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(500));
    }

    #[tokio::test]
    async fn transient_errors_are_retried_and_permanent_ones_are_not() {
        let policy = RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(40),
            budget: Duration::from_secs(10),
        };
        let tries = std::cell::Cell::new(0);
        let result: Result<u32, String> = retry_transient(
            "test",
            policy,
            |e: &String| e == "transient",
            || false,
            || {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move {
                    if n < 4 {
                        Err("transient".to_string())
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(result, Ok(4));

        tries.set(0);
        let result: Result<u32, String> = retry_transient(
            "test",
            policy,
            |e: &String| e == "transient",
            || false,
            || {
                tries.set(tries.get() + 1);
                async { Err("permanent".to_string()) }
            },
        )
        .await;
        assert_eq!((result, tries.get()), (Err("permanent".to_string()), 1));

        tries.set(0);
        let result: Result<u32, String> = retry_transient(
            "test",
            policy,
            |_: &String| true,
            || tries.get() >= 2,
            || {
                tries.set(tries.get() + 1);
                async { Err("transient".to_string()) }
            },
        )
        .await;
        assert_eq!((result.is_err(), tries.get()), (true, 2), "stop ends the retries");
    }
}
