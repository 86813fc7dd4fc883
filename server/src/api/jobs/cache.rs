//! Per-job values kept in memory between requests (job rows, rendered metrics), dropped when the
//! database announces a change to the job (see `verity_core::change_feed`): a cached read costs
//! no query.
//!
//! A cache only holds anything while the change listener is subscribed. A value read from the
//! database is stored only if no announcement (nor a lost connection) arrived since the read
//! began — each one advances an epoch that [`ChangeCache::ticket`] captures — so a copy older
//! than an announcement can never outlive it. Entries also expire after [`MAX_AGE`], a safety
//! net.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use verity_core::change_feed::JobChange;
use verity_core::jobs::JobRecord;

/// Longest time a copy is served without re-reading it, even with no announcement.
const MAX_AGE: Duration = Duration::from_secs(10);

/// Most job rows a [`JobCache`] holds.
pub const JOB_CACHE_CAPACITY: usize = 10_000;

/// A permission to store a value read after it was issued (see [`ChangeCache::put`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Debug)]
struct Inner<V> {
    subscribed: bool,
    epoch: u64,
    entries: HashMap<String, (V, Instant)>,
}

/// Values keyed by job id, valid while the change listener is subscribed.
#[derive(Debug)]
pub struct ChangeCache<V> {
    capacity: usize,
    inner: Mutex<Inner<V>>,
}

/// Job rows read recently.
pub type JobCache = ChangeCache<JobRecord>;

impl<V: Clone> ChangeCache<V> {
    /// An empty cache that holds at most `capacity` jobs' values (beyond it, it is emptied and
    /// refills with what is read).
    pub fn new(capacity: usize) -> Self {
        ChangeCache {
            capacity,
            inner: Mutex::new(Inner { subscribed: false, epoch: 0, entries: HashMap::new() }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached value of job `id`, if any.
    pub fn get(&self, id: &str) -> Option<V> {
        let inner = self.lock();
        if !inner.subscribed {
            return None;
        }
        inner
            .entries
            .get(id)
            .filter(|(_, at)| at.elapsed() < MAX_AGE)
            .map(|(value, _)| value.clone())
    }

    /// A ticket to take before reading a value from the database; `None` while nothing may be
    /// cached (the listener is not subscribed).
    pub fn ticket(&self) -> Option<Ticket> {
        let inner = self.lock();
        inner.subscribed.then_some(Ticket(inner.epoch))
    }

    /// Stores `value` of job `id`, read after `ticket` was taken, unless a change may have
    /// happened since.
    pub fn put(&self, ticket: Ticket, id: &str, value: V) {
        let mut inner = self.lock();
        if !inner.subscribed || inner.epoch != ticket.0 {
            return;
        }
        if inner.entries.len() >= self.capacity && !inner.entries.contains_key(id) {
            inner.entries.clear();
        }
        inner.entries.insert(id.to_string(), (value, Instant::now()));
    }

    /// Drops job `id` (after this server changed it, or an announcement said so).
    pub fn evict(&self, id: &str) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.entries.remove(id);
    }

    /// Acts on what the change listener learnt.
    pub fn apply(&self, change: &JobChange) {
        match change {
            JobChange::Changed(id) => self.evict(id),
            JobChange::Lost | JobChange::Subscribed => {
                let mut inner = self.lock();
                inner.epoch += 1;
                inner.entries.clear();
                inner.subscribed = *change == JobChange::Subscribed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_nothing_until_subscribed_and_after_a_lost_connection() {
        let cache = ChangeCache::new(8);
        assert_eq!(cache.ticket(), None);
        cache.apply(&JobChange::Subscribed);
        let ticket = cache.ticket().expect("subscribed");
        cache.put(ticket, "ftjob-a", "queued");
        assert_eq!(cache.get("ftjob-a"), Some("queued"));
        cache.apply(&JobChange::Lost);
        assert!(cache.get("ftjob-a").is_none(), "a lost connection empties the cache");
        assert_eq!(cache.ticket(), None);
        cache.apply(&JobChange::Subscribed);
        assert!(cache.get("ftjob-a").is_none(), "nothing survives the gap");
    }

    #[test]
    fn an_announcement_drops_the_copy_and_refuses_reads_that_began_before_it() {
        let cache = ChangeCache::new(8);
        cache.apply(&JobChange::Subscribed);
        let before = cache.ticket().expect("subscribed");
        cache.put(before, "ftjob-a", "queued");
        cache.put(before, "ftjob-b", "queued");
        let read_started = cache.ticket().expect("subscribed");
        cache.apply(&JobChange::Changed("ftjob-a".into()));
        assert!(cache.get("ftjob-a").is_none());
        assert!(cache.get("ftjob-b").is_some(), "other jobs stay");
        // A value read before the announcement may be stale: it is not stored.
        cache.put(read_started, "ftjob-a", "queued");
        assert!(cache.get("ftjob-a").is_none());
        let fresh = cache.ticket().expect("subscribed");
        cache.put(fresh, "ftjob-a", "running");
        assert_eq!(cache.get("ftjob-a"), Some("running"));
    }

    #[test]
    fn a_full_cache_starts_over_rather_than_growing() {
        let cache = ChangeCache::new(2);
        cache.apply(&JobChange::Subscribed);
        let ticket = cache.ticket().expect("subscribed");
        cache.put(ticket, "a", 1);
        cache.put(ticket, "b", 2);
        cache.put(ticket, "b", 3);
        assert_eq!(
            (cache.get("a"), cache.get("b")),
            (Some(1), Some(3)),
            "replacing a value is not growth"
        );
        cache.put(ticket, "c", 4);
        assert_eq!((cache.get("a"), cache.get("b"), cache.get("c")), (None, None, Some(4)));
    }
}
