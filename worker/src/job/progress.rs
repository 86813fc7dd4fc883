//! A training job's live progress, the one source the API and the dashboard read: the step,
//! the phase (sampling, grading, training, evaluating, checkpointing) with the phase's own
//! count (`evaluating 37/200`), trained tokens and the estimated finish from measured step
//! times (`null` when the job's budget will pause it first: `budget_pause` then says at which
//! step and when), and why the job paused when it paused itself. Every change is stored on the
//! job at once by an early heartbeat.

use crate::trainer::{Phase, PhaseObserver};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use verity_core::budget::{Caps, Usage};
use verity_core::queue::ProgressReporter;

/// The phase the handler itself is in (a trainer's phases come through [`LiveProgress::observer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JobPhase {
    /// A phase of the trainer's step or evaluation.
    Trainer(Phase),
    /// Saving and publishing a checkpoint.
    Checkpointing,
}

impl JobPhase {
    fn name(self) -> &'static str {
        match self {
            JobPhase::Trainer(phase) => phase.name(),
            JobPhase::Checkpointing => "checkpointing",
        }
    }
}

/// What has been measured and where the job is.
#[derive(Debug)]
struct State {
    step: u64,
    total_steps: u64,
    trained_tokens: u64,
    phase: Option<JobPhase>,
    phase_started: Instant,
    /// Steps measured in this attempt and their wall seconds (training, evaluation, writes and
    /// checkpoints).
    steps: u64,
    seconds: f64,
    /// The job's caps, its usage and mean generated tokens per step, as of the last step.
    budget: Option<(Caps, Usage, f64)>,
    /// Why the job paused itself (its budget, `auto_pause_on`, an unavailable judge).
    paused_reason: Option<String>,
}

/// Unix seconds now.
fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl State {
    /// Seconds the running evaluation still needs, from its own pace so far.
    fn evaluation_left(&self) -> f64 {
        match self.phase {
            Some(JobPhase::Trainer(Phase::Evaluating { done, total })) if done > 0 => {
                let spent = self.phase_started.elapsed().as_secs_f64();
                spent / done as f64 * total.saturating_sub(done) as f64
            }
            _ => 0.0,
        }
    }

    /// Steps after the current one at which the budget pauses the job, when that is before
    /// its last step.
    fn budget_pause_steps(&self) -> Option<u64> {
        let (caps, usage, tokens_per_step) = self.budget?;
        let seconds_per_step = if self.steps > 0 { self.seconds / self.steps as f64 } else { 0.0 };
        caps.steps_left(usage, seconds_per_step, tokens_per_step)
            .filter(|&k| self.step + k < self.total_steps)
    }

    /// When the job should end (Unix seconds): the steps left at the mean measured pace, plus
    /// the rest of a running evaluation; never before now. `None` before a step is measured,
    /// and when its budget will pause it first.
    fn estimated_finish(&self) -> Option<i64> {
        if self.steps == 0 || self.budget_pause_steps().is_some() {
            return None;
        }
        let mean = self.seconds / self.steps as f64;
        let left = mean * self.total_steps.saturating_sub(self.step) as f64;
        Some(now() + (left + self.evaluation_left()).ceil() as i64)
    }

    fn report(&self) -> Value {
        let (done, total) = match self.phase {
            Some(JobPhase::Trainer(Phase::Evaluating { done, total })) if total > 0 => {
                (Some(done), Some(total))
            }
            _ => (None, None),
        };
        let budget_pause = self.budget_pause_steps().map(|k| {
            let mean = if self.steps > 0 { self.seconds / self.steps as f64 } else { 0.0 };
            json!({"step": self.step + k, "at": now() + (mean * k as f64).ceil() as i64})
        });
        json!({
            "step": self.step,
            "total_steps": self.total_steps,
            "trained_tokens": self.trained_tokens,
            "estimated_finish": self.estimated_finish(),
            "step_seconds": (self.steps > 0).then(|| self.seconds / self.steps as f64),
            "phase": self.phase.map(JobPhase::name),
            "phase_done": done,
            "phase_total": total,
            "budget_pause": budget_pause,
            "paused_reason": self.paused_reason,
        })
    }
}

/// The live progress of one attempt; cloneable into the training thread.
#[derive(Clone)]
pub(super) struct LiveProgress {
    state: Arc<Mutex<State>>,
    reporter: ProgressReporter,
}

impl LiveProgress {
    /// Progress at `step` of `total_steps` (a resumed job starts at its checkpoint's step).
    pub(super) fn new(
        reporter: ProgressReporter,
        step: u64,
        total_steps: u64,
        trained_tokens: u64,
    ) -> LiveProgress {
        let state = State {
            step,
            total_steps,
            trained_tokens,
            phase: None,
            phase_started: Instant::now(),
            steps: 0,
            seconds: 0.0,
            budget: None,
            paused_reason: None,
        };
        LiveProgress { state: Arc::new(Mutex::new(state)), reporter }
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        let report = match self.state.lock() {
            Ok(mut state) => {
                change(&mut state);
                state.report()
            }
            Err(_) => return,
        };
        self.reporter.report(report);
    }

    /// `phase` began (the count of an evaluation advancing keeps its start time).
    pub(super) fn phase(&self, phase: JobPhase) {
        self.update(|state| {
            let same_kind = state.phase.map(JobPhase::name) == Some(phase.name());
            if !same_kind {
                state.phase_started = Instant::now();
            }
            state.phase = Some(phase);
        });
    }

    /// A step ended after `seconds` of wall time with `tokens` trained.
    pub(super) fn step_done(&self, step: u64, seconds: f64, tokens: u64) {
        self.update(|state| {
            state.step = step;
            state.steps += 1;
            state.seconds += seconds;
            state.trained_tokens += tokens;
            state.phase = None;
        });
    }

    /// The job's caps and usage after a step, with its mean generated tokens per step.
    pub(super) fn budget(&self, caps: Caps, usage: Usage, tokens_per_step: f64) {
        self.update(|state| state.budget = Some((caps, usage, tokens_per_step)));
    }

    /// The job pauses itself for `reason`; the phase under way is over.
    pub(super) fn paused(&self, reason: &str) {
        self.update(|state| {
            state.phase = None;
            state.paused_reason = Some(reason.to_string());
        });
    }

    /// The progress report as it is now.
    pub(super) fn snapshot(&self) -> Option<Value> {
        self.state.lock().ok().map(|state| state.report())
    }

    /// Stores the progress as it is (at the start of an attempt).
    pub(super) fn publish(&self) {
        self.update(|_| {});
    }

    /// The phase under way ended with nothing else begun.
    pub(super) fn phase_over(&self) {
        self.update(|state| state.phase = None);
    }

    /// An observer to hand the trainer: its phases become this progress's.
    pub(super) fn observer(&self) -> PhaseObserver {
        let progress = self.clone();
        Arc::new(move |phase| progress.phase(JobPhase::Trainer(phase)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: u64, total: u64, steps: u64, seconds: f64) -> State {
        State {
            step,
            total_steps: total,
            trained_tokens: 0,
            phase: None,
            phase_started: Instant::now(),
            steps,
            seconds,
            budget: None,
            paused_reason: None,
        }
    }

    #[test]
    fn a_budget_that_pauses_first_replaces_the_finish() {
        // 10 s a step, 40 s used of a 100 s cap: steps 3..8 run, the 6th from now crosses it.
        let mut s = state(2, 20, 2, 20.0);
        let caps = Caps { max_wall_seconds: Some(100), max_tokens: None };
        s.budget = Some((caps, Usage { wall_seconds: 40.0, tokens: 0 }, 0.0));
        let report = s.report();
        assert!(report["estimated_finish"].is_null(), "{report}");
        assert_eq!(report["budget_pause"]["step"], 8);
        let at = report["budget_pause"]["at"].as_i64().unwrap();
        assert!((at - now() - 60).abs() <= 1, "{at}");
        // A cap the job ends before: the finish as usual, no budget pause.
        s.total_steps = 5;
        assert!(s.report()["budget_pause"].is_null());
        assert!(s.report()["estimated_finish"].is_i64());
    }

    #[test]
    fn the_finish_is_unknown_until_a_step_is_measured_then_the_mean_pace() {
        assert_eq!(state(0, 10, 0, 0.0).estimated_finish(), None);
        let finish = state(2, 10, 2, 20.0).estimated_finish().unwrap();
        assert!((finish - now() - 80).abs() <= 1, "{finish}");
        // the last step done: the finish is now, not null
        let done = state(10, 10, 10, 100.0).estimated_finish().unwrap();
        assert!((done - now()).abs() <= 1);
    }

    #[test]
    fn a_report_names_the_phase_and_its_count() {
        let mut s = state(3, 4, 3, 3.0);
        s.phase = Some(JobPhase::Trainer(Phase::Evaluating { done: 37, total: 200 }));
        let report = s.report();
        assert_eq!(report["phase"], "evaluating");
        assert_eq!(
            (report["phase_done"].as_u64(), report["phase_total"].as_u64()),
            (Some(37), Some(200))
        );
        s.phase = Some(JobPhase::Checkpointing);
        assert_eq!(s.report()["phase"], "checkpointing");
        assert!(s.report()["phase_done"].is_null());
    }
}
