//! A bounded pool that grades batches in parallel, for the trainer and the CLI.
//!
//! At most `workers` gradings run at once across every batch submitted to one pool (sandboxed
//! gradings are processes, so the bound is what keeps a host healthy). The bound is a
//! [`GradingBudget`] that several pools — and the API's `graders/run` slots, in a process that
//! serves both (`verity up`) — can share, so grading in one process never takes more than one
//! budget of cores. The blocking API uses scoped threads; the async API moves the batch onto
//! tokio's blocking threads.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::grader::Grader;
use crate::result::{ErrorKind, GradeResult};
use crate::sample::Sample;

/// Gradings allowed at once in a process: one permit per grading, shared by every pool (and
/// any other grading path) given a clone.
#[derive(Debug, Clone)]
pub struct GradingBudget {
    permits: Arc<Semaphore>,
    size: usize,
}

impl GradingBudget {
    /// A budget of `size` gradings at once (0 means the number of CPU cores).
    pub fn new(size: usize) -> Self {
        let size = if size == 0 {
            std::thread::available_parallelism().map(usize::from).unwrap_or(1)
        } else {
            size
        };
        Self { permits: Arc::new(Semaphore::new(size)), size }
    }

    /// Gradings allowed at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The semaphore, for async callers that wait with a deadline (the API's `graders/run`).
    pub fn semaphore(&self) -> Arc<Semaphore> {
        self.permits.clone()
    }

    /// Blocks the calling (non-async) thread until a grading may start.
    fn acquire_blocking(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        futures::executor::block_on(self.permits.acquire()).ok()
    }
}

/// Grades rows in parallel with at most `workers` gradings at a time; cheap to clone and share.
#[derive(Debug, Clone)]
pub struct GraderPool {
    budget: GradingBudget,
}

impl Default for GraderPool {
    fn default() -> Self {
        Self::new(0)
    }
}

impl GraderPool {
    /// A pool of `workers` parallel gradings (0 means the number of CPU cores).
    pub fn new(workers: usize) -> Self {
        Self::with_budget(GradingBudget::new(workers))
    }

    /// A pool drawing on a shared budget: gradings of every holder of the budget count together.
    pub fn with_budget(budget: GradingBudget) -> Self {
        Self { budget }
    }

    /// The parallelism bound.
    pub fn workers(&self) -> usize {
        self.budget.size()
    }

    /// The budget this pool draws on.
    pub fn budget(&self) -> &GradingBudget {
        &self.budget
    }

    /// Grades one row, turning a panic (a Verity bug) into an `internal` error.
    pub fn grade_one(&self, grader: &Grader, item: &Value, sample: &Sample) -> GradeResult {
        let Some(_permit) = self.budget.acquire_blocking() else {
            return GradeResult::failed(ErrorKind::Internal, "the grading budget was closed");
        };
        catch_unwind(AssertUnwindSafe(|| grader.grade(item, sample)))
            .unwrap_or_else(|_| GradeResult::failed(ErrorKind::Internal, "grading panicked"))
    }

    /// Grades every row, blocking the calling thread; results are in row order.
    pub fn grade_batch_blocking(
        &self,
        grader: &Grader,
        rows: &[(Value, Sample)],
    ) -> Vec<GradeResult> {
        // model graders: one batched judge call for the whole batch, then cache hits per row
        grader.prefetch_judge(rows);
        let next = AtomicUsize::new(0);
        let slots: Vec<Mutex<Option<GradeResult>>> =
            rows.iter().map(|_| Mutex::new(None)).collect();
        let threads = self.workers().min(rows.len());
        // A raised stop flag (the job was cancelled) leaves the remaining rows ungraded.
        let stop = crate::stop::current();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    crate::stop::within(stop.as_ref(), || loop {
                        if crate::stop::requested() {
                            break;
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((item, sample)) = rows.get(i) else { break };
                        let result = self.grade_one(grader, item, sample);
                        *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                    })
                });
            }
        });
        slots
            .into_iter()
            .map(|slot| {
                slot.into_inner().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(|| {
                    GradeResult::failed(ErrorKind::Internal, "row was not graded")
                })
            })
            .collect()
    }

    /// Grades every row on tokio's blocking threads (call from a tokio runtime); results are in
    /// row order. Infrastructure failures are `error`s in the results, never a missing row.
    pub async fn grade_batch(
        &self,
        grader: &Grader,
        rows: Vec<(Value, Sample)>,
    ) -> Vec<GradeResult> {
        let pool = self.clone();
        let grader = grader.clone();
        let count = rows.len();
        match tokio::task::spawn_blocking(move || pool.grade_batch_blocking(&grader, &rows)).await {
            Ok(results) => results,
            Err(e) => (0..count)
                .map(|_| {
                    GradeResult::failed(ErrorKind::Internal, format!("grading task failed: {e}"))
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(n: usize) -> Vec<(Value, Sample)> {
        (0..n)
            .map(|i| {
                (
                    json!({"answer": i.to_string()}),
                    Sample::from_text(format!("\\boxed{{{}}}", i % 3)),
                )
            })
            .collect()
    }

    fn grader() -> Grader {
        Grader::from_json(r#"{"type":"math","reference":"{{item.answer}}"}"#).unwrap()
    }

    #[test]
    fn results_keep_row_order() {
        let results = GraderPool::new(3).grade_batch_blocking(&grader(), &rows(50));
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.score, if i < 3 { 1.0 } else { 0.0 }, "row {i}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_batches_share_the_bound() {
        let pool = GraderPool::new(2);
        let g = grader();
        let (a, b) = tokio::join!(pool.grade_batch(&g, rows(20)), pool.grade_batch(&g, rows(5)));
        assert_eq!(a.len(), 20);
        assert_eq!(b.len(), 5);
        assert_eq!(pool.budget().semaphore().available_permits(), 2);
    }

    #[test]
    fn pools_sharing_a_budget_wait_for_each_other() {
        // Another holder of the budget (the API's graders/run in `verity up`) takes both slots:
        // a trainer's pool on the same budget grades nothing until one is given back.
        let budget = GradingBudget::new(2);
        let trainer = GraderPool::with_budget(budget.clone());
        let held = budget.semaphore().try_acquire_many_owned(2).unwrap();
        let g = grader();
        let rows = rows(4);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let results = trainer.grade_batch_blocking(&g, &rows);
                done_tx.send(results.len()).unwrap();
            });
            let waited = done_rx.recv_timeout(std::time::Duration::from_millis(300));
            assert!(waited.is_err(), "the pool graded while the shared budget was exhausted");
            drop(held);
            assert_eq!(done_rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(), 4);
        });
        assert_eq!(budget.semaphore().available_permits(), 2);
    }
}
