//! Login throttling: after too many failed sign-ins for one user name or from one address within
//! a window, further attempts are refused (429 with `Retry-After`) until the window has passed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed attempts allowed per user name within the window.
pub const MAX_FAILURES_PER_USER: usize = 5;
/// Failed attempts allowed per client address within the window.
pub const MAX_FAILURES_PER_IP: usize = 20;
/// How long a failure counts.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);

/// Recent failed sign-ins per bucket (`user:<name>`, `ip:<address>`).
#[derive(Debug, Default)]
pub struct LoginThrottle {
    failures: Mutex<HashMap<String, Vec<Instant>>>,
}

/// The buckets of an attempt.
fn buckets(user: Option<&str>, ip: Option<&str>) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    if let Some(user) = user {
        out.push((format!("user:{}", user.trim().to_lowercase()), MAX_FAILURES_PER_USER));
    }
    if let Some(ip) = ip {
        out.push((format!("ip:{ip}"), MAX_FAILURES_PER_IP));
    }
    out
}

impl LoginThrottle {
    /// Refuses with the seconds to wait when `user` or `ip` is over its limit.
    pub fn check(&self, user: Option<&str>, ip: Option<&str>) -> Result<(), u64> {
        let now = Instant::now();
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = 0u64;
        for (bucket, limit) in buckets(user, ip) {
            if let Some(times) = failures.get_mut(&bucket) {
                times.retain(|t| now.duration_since(*t) < WINDOW);
                if times.len() >= limit {
                    let oldest = times[times.len() - limit];
                    let left = WINDOW.saturating_sub(now.duration_since(oldest)).as_secs().max(1);
                    wait = wait.max(left);
                }
            }
        }
        if wait > 0 {
            Err(wait)
        } else {
            Ok(())
        }
    }

    /// Counts a failed attempt.
    pub fn failed(&self, user: Option<&str>, ip: Option<&str>) {
        let now = Instant::now();
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.retain(|_, times| times.last().is_some_and(|t| now.duration_since(*t) < WINDOW));
        for (bucket, _) in buckets(user, ip) {
            failures.entry(bucket).or_default().push(now);
        }
    }

    /// Forgets the failures of `user` after a successful sign-in.
    pub fn succeeded(&self, user: Option<&str>) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        for (bucket, _) in buckets(user, None) {
            failures.remove(&bucket);
        }
    }
}

/// The client address of a request, when the server recorded it.
pub fn client_ip(extensions: &axum::http::Extensions) -> Option<String> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_after_the_limit_per_user_and_forgets_on_success() {
        let throttle = LoginThrottle::default();
        for _ in 0..MAX_FAILURES_PER_USER {
            assert!(throttle.check(Some("a@x"), None).is_ok());
            throttle.failed(Some("a@x"), None);
        }
        let wait = throttle.check(Some("A@x"), None).unwrap_err();
        assert!(wait > 0 && wait <= WINDOW.as_secs());
        assert!(throttle.check(Some("b@x"), None).is_ok());
        throttle.succeeded(Some("a@x"));
        assert!(throttle.check(Some("a@x"), None).is_ok());
    }
}
