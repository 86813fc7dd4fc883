//! Error type of the model core.

use std::path::PathBuf;

/// Errors raised while loading, running, training or saving models.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A JSON document could not be parsed or written.
    #[error("JSON in {path}: {source}")]
    Json {
        /// The file concerned.
        path: PathBuf,
        /// The underlying serde error.
        source: serde_json::Error,
    },
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be parsed or rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// The model files are inconsistent or unsupported.
    #[error("model: {0}")]
    Model(String),
    /// A caller passed an invalid argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The work was stopped before it finished (its job was cancelled; see
    /// [`verity_verifiers::stop`]).
    #[error("stopped: the job was cancelled")]
    Stopped,
    /// The accumulated gradients have an infinite or NaN norm; no update was applied.
    #[error("the gradient norm is {norm}")]
    NonFiniteGradient {
        /// The global norm found.
        norm: f64,
    },
}

/// Result alias of the model core.
pub type Result<T> = std::result::Result<T, WorkerError>;

impl WorkerError {
    /// Builds an I/O error with the file it concerns.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { action, path: path.into(), source }
    }
}

/// Reads a file to a string, with the path in the error.
pub(crate) fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| WorkerError::io("reading", path, e))
}

/// Reads and parses a JSON file, with the path in the error.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|source| WorkerError::Json { path: path.into(), source })
}

/// Writes a value as pretty JSON, with the path in the error.
pub(crate) fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|source| WorkerError::Json { path: path.into(), source })?;
    std::fs::write(path, text).map_err(|e| WorkerError::io("writing", path, e))
}
