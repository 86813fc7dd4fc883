//! Per-key rate limiting with in-memory token buckets.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Token buckets keyed by credential; `rate` per second refill, `burst` capacity.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    /// A limiter; a `rate` of 0 disables it.
    pub fn new(rate: f64, burst: f64) -> RateLimiter {
        RateLimiter { rate, burst: burst.max(1.0), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one token for `key`; on refusal, the seconds until one is available.
    pub fn check(&self, key: &str) -> Result<(), u64> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tokens, last) = buckets.entry(key.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refuses_beyond_burst_per_key() {
        let limiter = RateLimiter::new(1.0, 3.0);
        for _ in 0..3 {
            assert!(limiter.check("a").is_ok());
        }
        assert_eq!(limiter.check("a"), Err(1));
        assert!(limiter.check("b").is_ok());
        assert!(RateLimiter::new(0.0, 1.0).check("a").is_ok());
    }
}
