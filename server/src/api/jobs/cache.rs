//! Job rows kept in memory between requests, dropped when the database announces a change to the
//! job (see `verity_core::change_feed`): a `GET` of a job then costs no query.
//!
//! The cache only holds anything while the change listener is subscribed. A copy read from the
//! database is stored only if no announcement (nor a lost connection) arrived since the read
//! began — each one advances an epoch that [`JobCache::ticket`] captures — so a copy older than
//! an announcement can never outlive it. Entries also expire after [`MAX_AGE`], a safety net.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use verity_core::change_feed::JobChange;
use verity_core::jobs::JobRecord;

/// Longest time a copy is served without re-reading the row, even with no announcement.
const MAX_AGE: Duration = Duration::from_secs(10);

/// Most job rows held; beyond it the cache is emptied and refills with what is read.
const MAX_ENTRIES: usize = 10_000;

/// A permission to store a row read after it was issued (see [`JobCache::put`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Debug, Default)]
struct Inner {
    subscribed: bool,
    epoch: u64,
    entries: HashMap<String, (JobRecord, Instant)>,
}

/// Recently read job rows, valid while the change listener is subscribed.
#[derive(Debug, Default)]
pub struct JobCache {
    inner: Mutex<Inner>,
}

impl JobCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached row of job `id`, if any.
    pub fn get(&self, id: &str) -> Option<JobRecord> {
        let inner = self.lock();
        if !inner.subscribed {
            return None;
        }
        inner.entries.get(id).filter(|(_, at)| at.elapsed() < MAX_AGE).map(|(job, _)| job.clone())
    }

    /// A ticket to take before reading a row from the database; `None` while nothing may be
    /// cached (the listener is not subscribed).
    pub fn ticket(&self) -> Option<Ticket> {
        let inner = self.lock();
        inner.subscribed.then_some(Ticket(inner.epoch))
    }

    /// Stores `job`, read after `ticket` was taken, unless a change may have happened since.
    pub fn put(&self, ticket: Ticket, job: JobRecord) {
        let mut inner = self.lock();
        if !inner.subscribed || inner.epoch != ticket.0 {
            return;
        }
        if inner.entries.len() >= MAX_ENTRIES {
            inner.entries.clear();
        }
        inner.entries.insert(job.id.clone(), (job, Instant::now()));
    }

    /// Drops job `id` (after this server changed it, or an announcement said so).
    pub fn evict(&self, id: &str) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.entries.remove(id);
    }

    /// Acts on what the change listener learnt.
    pub fn apply(&self, change: JobChange) {
        match change {
            JobChange::Changed(id) => self.evict(&id),
            JobChange::Lost | JobChange::Subscribed => {
                let mut inner = self.lock();
                inner.epoch += 1;
                inner.entries.clear();
                inner.subscribed = change == JobChange::Subscribed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(id: &str, state: &str) -> JobRecord {
        JobRecord {
            id: id.into(),
            org_id: uuid::Uuid::nil(),
            model: "m".into(),
            training_file: None,
            validation_file: None,
            suffix: None,
            seed: 1,
            spec: json!({}),
            metadata: None,
            state: state.into(),
            control: "none".into(),
            error: None,
            progress: None,
            fine_tuned_model: None,
            created_at: chrono::Utc::now(),
            finished_at: None,
        }
    }

    #[test]
    fn holds_nothing_until_subscribed_and_after_a_lost_connection() {
        let cache = JobCache::default();
        assert_eq!(cache.ticket(), None);
        cache.apply(JobChange::Subscribed);
        let ticket = cache.ticket().expect("subscribed");
        cache.put(ticket, job("ftjob-a", "queued"));
        assert_eq!(cache.get("ftjob-a").map(|j| j.state), Some("queued".into()));
        cache.apply(JobChange::Lost);
        assert!(cache.get("ftjob-a").is_none(), "a lost connection empties the cache");
        assert_eq!(cache.ticket(), None);
        cache.apply(JobChange::Subscribed);
        assert!(cache.get("ftjob-a").is_none(), "nothing survives the gap");
    }

    #[test]
    fn an_announcement_drops_the_copy_and_refuses_reads_that_began_before_it() {
        let cache = JobCache::default();
        cache.apply(JobChange::Subscribed);
        let before = cache.ticket().expect("subscribed");
        cache.put(before, job("ftjob-a", "queued"));
        cache.put(before, job("ftjob-b", "queued"));
        let read_started = cache.ticket().expect("subscribed");
        cache.apply(JobChange::Changed("ftjob-a".into()));
        assert!(cache.get("ftjob-a").is_none());
        assert!(cache.get("ftjob-b").is_some(), "other jobs stay");
        // A row read before the announcement may be stale: it is not stored.
        cache.put(read_started, job("ftjob-a", "queued"));
        assert!(cache.get("ftjob-a").is_none());
        let fresh = cache.ticket().expect("subscribed");
        cache.put(fresh, job("ftjob-a", "running"));
        assert_eq!(cache.get("ftjob-a").map(|j| j.state), Some("running".into()));
    }
}
