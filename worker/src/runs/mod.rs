//! The sample-and-grade engine of sampling runs (evaluation reports and rejection sampling):
//! `n` completions per prompt of a dataset from one model, sampled by the trainer's rollout
//! (the batched KV-cached sampler) and graded on the shared grader pool; the unbiased pass@k
//! summary of [`crate::trainer::eval`]; and the selection that turns graded completions into a
//! supervised chat dataset. The queue side (leases, resume, files) is in `crate::job`.

pub mod engine;
pub mod selection;

pub use crate::trainer::rollout::sample_records;
pub use engine::{prompt_chunks, sample_and_grade};
pub use selection::{select, supervised_jsonl, Kept, PromptSummary, Selection};
