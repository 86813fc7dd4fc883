//! Verity graders: the reward spec, verifiable graders and the code sandbox (no DB, no network).
//!
//! - [`Grader::from_json`] parses and checks a spec (errors carry JSON paths), then
//!   [`Grader::grade`]`(item, sample)` returns a [`GradeResult`]: a score in [0, 1], a reason,
//!   sub-scores, and `error` set only for infrastructure failures (missing template field,
//!   sandbox failure, the grader's own timeout), which are never silently scored as wrong.
//! - [`GraderPool`] grades batches with bounded parallelism: `grade_batch` (async, tokio) and
//!   `grade_batch_blocking`; before a batch it asks the judge of model graders every prompt
//!   at once ([`Grader::prefetch_judge`]).
//! - [`judge`] defines the [`Judge`] that `score_model` / `label_model` ask (implemented by the
//!   worker crate: a model registered in Verity, or an operator's OpenAI-compatible endpoint).
//! - [`grader_json_schema`] exports the spec's JSON Schema (`verity graders run|validate` and
//!   `verity bench graders` live in the `verity-cli` crate).
//! - [`sampling`]: the ranges of sampling settings (temperature, top_p, stop strings) that
//!   judges and every other sampling edge are checked with.
//! - [`stop`]: a cooperative [`StopFlag`] that ends long batches early (a cancelled job).
//! - [`sandbox`] runs untrusted programs under bubblewrap; [`SandboxConfig`] finds `bwrap` and
//!   `python3` on `PATH` (overridable with `VERITY_SANDBOX_BWRAP` / `VERITY_SANDBOX_PYTHON`).

pub mod code;
pub mod embed;
pub mod formula;
pub mod grader;
pub mod graders;
pub mod judge;
pub mod math;
pub mod pool;
pub mod probes;
pub mod python;
pub mod result;
pub mod sample;
pub mod sampling;
pub mod sandbox;
pub mod spec;
pub mod stop;
pub mod template;
pub mod tools;

pub use embed::{EmbedError, Embedder, Embedding, SharedEmbedder};
pub use grader::{Grader, InvalidGrader, SpecError};
pub use judge::{
    Judge, JudgeCache, JudgeError, JudgeMessage, JudgePrompt, JudgeReply, JudgeSampling, TokenUsage,
};
pub use pool::{GraderPool, GradingBudget};
pub use result::{ErrorKind, GradeError, GradeResult, SUCCESS_THRESHOLD};
pub use sample::Sample;
pub use sandbox::SandboxConfig;
pub use spec::{grader_json_schema, GraderSpec};
pub use stop::StopFlag;
