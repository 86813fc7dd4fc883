//! Verity graders: the reward spec, verifiable graders and the code sandbox (no DB, no network).
//!
//! Entry points: [`Grader::from_json`] then [`Grader::grade`]; [`GraderPool`] grades batches in
//! parallel; [`cli`] holds what `verity graders run|validate` and `verity bench graders` call.

pub mod cli;
pub mod code;
pub mod formula;
pub mod grader;
pub mod graders;
pub mod math;
pub mod pool;
pub mod python;
pub mod result;
pub mod sample;
pub mod sandbox;
pub mod spec;
pub mod template;

pub use grader::{Grader, InvalidGrader, SpecError};
pub use pool::GraderPool;
pub use result::{ErrorKind, GradeError, GradeResult};
pub use sample::Sample;
pub use sandbox::SandboxConfig;
pub use spec::{grader_json_schema, GraderSpec};
