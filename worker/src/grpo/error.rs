//! Errors of the GRPO-family core.

/// Result alias for the GRPO-family core.
pub type Result<T> = std::result::Result<T, GrpoError>;

/// What can go wrong when computing advantages, losses or metrics.
#[derive(Debug, thiserror::Error)]
pub enum GrpoError {
    /// The caller passed inconsistent or out-of-range input.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A hyperparameter is out of its valid range.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// A tensor operation failed.
    #[error("tensor operation failed while {context}: {source}")]
    Tensor {
        /// What the code was doing.
        context: &'static str,
        /// The underlying candle error.
        #[source]
        source: candle_core::Error,
    },
}

/// Adds context to candle results.
pub(crate) trait TensorContext<T> {
    /// Wraps a candle error with a description of the failed step.
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> TensorContext<T> for candle_core::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| GrpoError::Tensor { context, source })
    }
}

/// Shorthand for an [`GrpoError::InvalidInput`] error.
pub(crate) fn invalid_input(message: impl Into<String>) -> GrpoError {
    GrpoError::InvalidInput(message.into())
}
