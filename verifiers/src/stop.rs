//! A cooperative stop for long batches of work (sampling, judging, grading): the job that owns
//! the work raises a [`StopFlag`] when the user cancels, and the loops that run the work check
//! it between units (a decode step, a row) and end early instead of finishing minutes of work
//! nobody will read.
//!
//! The flag travels with the thread: [`StopFlag::scope`] makes it the current thread's flag for
//! the duration of a closure, [`current`] reads it where the work starts, and code that moves
//! work to other threads (a grading pool, a decode pool) carries it there with `scope` again.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared flag: once raised, work under it should stop as soon as it can.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

thread_local! {
    static CURRENT: RefCell<Option<StopFlag>> = const { RefCell::new(None) };
}

impl StopFlag {
    /// A flag not raised.
    pub fn new() -> StopFlag {
        StopFlag::default()
    }

    /// Asks every piece of work under this flag to stop.
    pub fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`StopFlag::raise`] was called.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Runs `work` with this flag as the current thread's flag (see [`current`]); the previous
    /// one is restored afterwards, even if `work` panics.
    pub fn scope<T>(&self, work: impl FnOnce() -> T) -> T {
        struct Restore(Option<StopFlag>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let previous = self.0.take();
                CURRENT.with(|current| *current.borrow_mut() = previous);
            }
        }
        let previous = CURRENT.with(|current| current.borrow_mut().replace(self.clone()));
        let _restore = Restore(previous);
        work()
    }
}

/// The flag of the enclosing [`StopFlag::scope`] on this thread, if any.
pub fn current() -> Option<StopFlag> {
    CURRENT.with(|current| current.borrow().clone())
}

/// Whether the enclosing scope's flag (if any) is raised.
pub fn requested() -> bool {
    CURRENT.with(|current| current.borrow().as_ref().is_some_and(StopFlag::is_raised))
}

/// Runs `work` under `flag` when there is one, else as is (to carry [`current`] to a thread).
pub fn within<T>(flag: Option<&StopFlag>, work: impl FnOnce() -> T) -> T {
    match flag {
        Some(flag) => flag.scope(work),
        None => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_sets_the_threads_flag_and_restores_the_previous_one() {
        assert!(current().is_none() && !requested());
        let outer = StopFlag::new();
        outer.scope(|| {
            assert!(!requested());
            let inner = StopFlag::new();
            inner.raise();
            inner.scope(|| assert!(requested()));
            assert!(!requested(), "the outer flag is back");
            outer.raise();
            assert!(requested());
            // Another thread does not see it unless it is carried there.
            let carried = current();
            std::thread::scope(|s| {
                s.spawn(|| assert!(!requested()));
                s.spawn(|| within(carried.as_ref(), || assert!(requested())));
            });
        });
        assert!(current().is_none());
    }
}
