//! Errors of the trainer, split into what a user can fix and what is Verity's problem.

use crate::error::WorkerError;
use crate::grpo::GrpoError;

/// A trainer failure.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// A dataset row is unusable (the user must fix the file).
    #[error("{file} line {line}: {message}")]
    Data {
        /// Which file (`training` or `validation`).
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The grader spec does not compile.
    #[error("invalid grader: {0}")]
    Grader(String),
    /// Too many gradings failed for infrastructure reasons.
    #[error(
        "grader failures: {failed} of {total} gradings in step {step} failed (first: {first})"
    )]
    GraderStorm {
        /// Step where it happened.
        step: u64,
        /// Failed gradings.
        failed: usize,
        /// All gradings.
        total: usize,
        /// The first failure's message.
        first: String,
    },
    /// The judge of a model grader is down (an outage, not a verdict): the step is not scored.
    #[error("judge unavailable: {0}; the step was not scored")]
    JudgeUnavailable(String),
    /// The hyperparameters are inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The model or tokenizer failed.
    #[error("model: {0}")]
    Model(#[from] WorkerError),
    /// The loss or advantages failed.
    #[error("loss: {0}")]
    Grpo(#[from] GrpoError),
    /// A checkpoint could not be read or written.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The folder.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl TrainerError {
    /// Whether the user (not a retry) must act: bad data, grader, config or model.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            TrainerError::Data { .. }
                | TrainerError::Grader(_)
                | TrainerError::Config(_)
                | TrainerError::GraderStorm { .. }
        )
    }
}

impl From<candle_core::Error> for TrainerError {
    fn from(e: candle_core::Error) -> Self {
        TrainerError::Model(WorkerError::from(e))
    }
}

/// Result with [`TrainerError`].
pub type Result<T> = std::result::Result<T, TrainerError>;
