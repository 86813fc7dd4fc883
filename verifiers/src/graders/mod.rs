//! The graders that run in-process (the sandboxed ones live beside the sandbox).

pub mod constraints;
pub mod format;
pub mod meteor;
pub mod model;
pub mod string_check;
pub mod text_similarity;
