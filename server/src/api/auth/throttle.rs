//! Sign-in throttling and lockout, decided *before* a password or key hash runs: an attempt is
//! reserved (counted as pending), then confirmed as a failure, a success, or released.
//!
//! - **Lockout per (account, address).** After [`FREE_FAILURES`] failures for one account (an
//!   e-mail, or a key's prefix) from one client address, that pair waits [`BACKOFF_BASE`] before
//!   its next attempt, doubling with each further failure up to [`MAX_BACKOFF`]; only one attempt
//!   of a locked pair is checked at a time. A success clears the pair; [`FORGET_AFTER`] without a
//!   failure forgets it. Another address is not affected, so a stranger cannot lock a user out.
//! - **Throttling per address.** At most `failures_per_address` failures per [`ADDRESS_WINDOW`]
//!   from one address (any accounts), and at most `checks_per_minute` credential checks that cost
//!   a hash (successes too), whatever the account.
//!
//! Pending attempts count against every limit, so parallel guesses cannot race past them.

use super::client::address_bucket;
use super::ratelimit::RateLimiter;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures per (account, address) before back-off starts.
pub const FREE_FAILURES: u32 = 5;
/// The first back-off, doubled by each further failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(30);
/// The longest back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(15 * 60);
/// How long a (account, address) pair's failures are remembered after its last one.
pub const FORGET_AFTER: Duration = Duration::from_secs(60 * 60);
/// The window of the per-address failure limit.
pub const ADDRESS_WINDOW: Duration = Duration::from_secs(15 * 60);
/// Table size above which stale entries are swept.
const SWEEP_ABOVE: usize = 4096;

/// The back-off after `failures` failures of a pair (zero below [`FREE_FAILURES`]).
pub fn backoff(failures: u32) -> Duration {
    if failures < FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_FAILURES).min(16);
    BACKOFF_BASE.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

#[derive(Debug)]
struct Pair {
    failures: u32,
    pending: u32,
    last_failure: Instant,
}

#[derive(Debug, Default)]
struct Address {
    failures: VecDeque<Instant>,
    pending: usize,
}

#[derive(Debug, Default)]
struct Tables {
    pairs: HashMap<(String, String), Pair>,
    addresses: HashMap<String, Address>,
}

impl Tables {
    fn sweep(&mut self, now: Instant) {
        if self.pairs.len() > SWEEP_ABOVE {
            self.pairs.retain(|_, p| p.pending > 0 || now - p.last_failure < FORGET_AFTER);
        }
        if self.addresses.len() > SWEEP_ABOVE {
            self.addresses.retain(|_, a| {
                a.pending > 0 || a.failures.back().is_some_and(|t| now - *t < ADDRESS_WINDOW)
            });
        }
    }
}

/// Failed and pending sign-in attempts per (account, address) and per address.
#[derive(Debug)]
pub struct AuthThrottle {
    failures_per_address: usize,
    tables: Mutex<Tables>,
    checks: RateLimiter,
}

/// Seconds to wait, for a 429's `Retry-After`.
pub type RetryAfter = u64;

fn secs(d: Duration) -> RetryAfter {
    d.as_secs_f64().ceil().max(1.0) as u64
}

impl AuthThrottle {
    /// A throttle allowing `failures_per_address` failures per [`ADDRESS_WINDOW`] and
    /// `checks_per_minute` hashed credential checks per address (0: no such limit).
    pub fn new(failures_per_address: usize, checks_per_minute: f64) -> AuthThrottle {
        AuthThrottle {
            failures_per_address,
            tables: Mutex::default(),
            checks: RateLimiter::new(checks_per_minute / 60.0, checks_per_minute),
        }
    }

    /// Reserves one credential check of `account` from `addr`, or refuses with the seconds to
    /// wait. The returned attempt must be confirmed with [`Attempt::failed`] or
    /// [`Attempt::succeeded`]; dropped unconfirmed, it is released (not counted).
    pub fn reserve(&self, account: &str, addr: Option<IpAddr>) -> Result<Attempt<'_>, RetryAfter> {
        let now = Instant::now();
        let key = (account.trim().to_lowercase(), address_bucket(addr));
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let address = tables.addresses.entry(key.1.clone()).or_default();
        while address.failures.front().is_some_and(|t| now - *t >= ADDRESS_WINDOW) {
            address.failures.pop_front();
        }
        let limit = self.failures_per_address;
        if limit > 0 && address.failures.len() + address.pending >= limit {
            let wait = match address.failures.len().checked_sub(limit) {
                Some(i) => ADDRESS_WINDOW.saturating_sub(now - address.failures[i]),
                None => Duration::from_secs(1),
            };
            return Err(secs(wait));
        }
        if let Some(pair) = tables.pairs.get(&key) {
            if pair.pending == 0 && now - pair.last_failure >= FORGET_AFTER {
                tables.pairs.remove(&key);
            } else if pair.failures + pair.pending >= FREE_FAILURES {
                let unlock = pair.last_failure + backoff(pair.failures);
                if pair.pending > 0 || now < unlock {
                    return Err(secs(unlock.saturating_duration_since(now)));
                }
            }
        }
        self.checks.check(&key.1)?;
        tables.sweep(now);
        if let Some(address) = tables.addresses.get_mut(&key.1) {
            address.pending += 1;
        }
        let pair = tables.pairs.entry(key.clone()).or_insert(Pair {
            failures: 0,
            pending: 0,
            last_failure: now,
        });
        pair.pending += 1;
        Ok(Attempt { throttle: self, key, settled: false })
    }

    fn settle(&self, key: &(String, String), outcome: Option<bool>) {
        let now = Instant::now();
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(address) = tables.addresses.get_mut(&key.1) {
            address.pending = address.pending.saturating_sub(1);
            if outcome == Some(false) {
                address.failures.push_back(now);
            }
        }
        if let Some(pair) = tables.pairs.get_mut(key) {
            pair.pending = pair.pending.saturating_sub(1);
            match outcome {
                Some(false) => {
                    pair.failures += 1;
                    pair.last_failure = now;
                }
                Some(true) => pair.failures = 0,
                None => {}
            }
            if pair.failures == 0 && pair.pending == 0 {
                tables.pairs.remove(key);
            }
        }
    }
}

/// A reserved credential check; released when dropped unconfirmed.
#[derive(Debug)]
pub struct Attempt<'a> {
    throttle: &'a AuthThrottle,
    key: (String, String),
    settled: bool,
}

impl Attempt<'_> {
    /// The credential was wrong: counts a failure for the pair and the address.
    pub fn failed(mut self) {
        self.settled = true;
        self.throttle.settle(&self.key, Some(false));
    }

    /// The credential was right: clears the pair's failures.
    pub fn succeeded(mut self) {
        self.settled = true;
        self.throttle.settle(&self.key, Some(true));
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.throttle.settle(&self.key, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        s.parse().ok()
    }

    #[test]
    fn pending_attempts_count_and_lock_only_the_pair() {
        let throttle = AuthThrottle::new(100, 0.0);
        let a = ip("192.0.2.1");
        let held: Vec<_> = (0..FREE_FAILURES)
            .map(|_| throttle.reserve("Ada@x", a).expect("free attempts"))
            .collect();
        // Five guesses in flight: the sixth is refused before any of them finished.
        assert!(throttle.reserve("ada@x", a).is_err());
        // Another address, or another account, is not affected.
        assert!(throttle.reserve("ada@x", ip("192.0.2.2")).is_ok());
        assert!(throttle.reserve("bob@x", a).is_ok());
        for attempt in held {
            attempt.failed();
        }
        let wait = throttle.reserve("ada@x", a).unwrap_err();
        assert!(wait > 0 && wait <= BACKOFF_BASE.as_secs(), "{wait}");
        throttle.reserve("ada@x", ip("192.0.2.2")).unwrap().succeeded();
        assert!(throttle.reserve("ada@x", a).is_err(), "success elsewhere does not unlock A");
    }

    #[test]
    fn released_attempts_are_not_counted_and_success_clears() {
        let throttle = AuthThrottle::new(100, 0.0);
        let a = ip("192.0.2.1");
        for _ in 0..20 {
            drop(throttle.reserve("ada@x", a).unwrap());
        }
        for _ in 0..FREE_FAILURES - 1 {
            throttle.reserve("ada@x", a).unwrap().failed();
        }
        throttle.reserve("ada@x", a).unwrap().succeeded();
        for _ in 0..FREE_FAILURES {
            throttle.reserve("ada@x", a).unwrap().failed();
        }
        assert!(throttle.reserve("ada@x", a).is_err());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(FREE_FAILURES - 1), Duration::ZERO);
        assert_eq!(backoff(FREE_FAILURES), BACKOFF_BASE);
        assert_eq!(backoff(FREE_FAILURES + 2), BACKOFF_BASE * 4);
        assert_eq!(backoff(FREE_FAILURES + 40), MAX_BACKOFF);
    }

    #[test]
    fn addresses_are_limited_across_accounts_and_by_checks() {
        let throttle = AuthThrottle::new(3, 0.0);
        let a = ip("192.0.2.1");
        for n in 0..3 {
            throttle.reserve(&format!("user{n}@x"), a).unwrap().failed();
        }
        let wait = throttle.reserve("user9@x", a).unwrap_err();
        assert!(wait > 0 && wait <= ADDRESS_WINDOW.as_secs());
        assert!(throttle.reserve("user9@x", ip("192.0.2.9")).is_ok());

        let checks = AuthThrottle::new(0, 2.0);
        checks.reserve("a@x", a).unwrap().succeeded();
        checks.reserve("a@x", a).unwrap().succeeded();
        assert!(checks.reserve("a@x", a).is_err(), "two checks a minute");
        assert!(checks.reserve("a@x", ip("192.0.2.9")).is_ok());
    }
}
