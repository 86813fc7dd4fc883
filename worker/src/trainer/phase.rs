//! What a training step or an evaluation is doing right now, told to an observer as it changes
//! (the job handler turns it into the job's live progress).

use std::sync::Arc;

/// A phase of a step or of an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Generating completions.
    Sampling,
    /// Scoring completions with the grader.
    Grading,
    /// Loss, backward and optimizer.
    Training,
    /// Evaluating on the validation set: `done` of `total` prompts (both 0 when not counted).
    Evaluating {
        /// Prompts evaluated so far.
        done: usize,
        /// Prompts to evaluate.
        total: usize,
    },
}

impl Phase {
    /// The phase's name in progress reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Sampling => "sampling",
            Phase::Grading => "grading",
            Phase::Training => "training",
            Phase::Evaluating { .. } => "evaluating",
        }
    }
}

/// Receives phases as they change; called from the training thread.
pub type PhaseObserver = Arc<dyn Fn(Phase) + Send + Sync>;

/// Tells `observer`, when there is one, that `phase` began.
pub fn tell(observer: Option<&PhaseObserver>, phase: Phase) {
    if let Some(observer) = observer {
        observer(phase);
    }
}
