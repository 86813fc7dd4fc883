//! The GRPO-family trainer: rollouts → graders → rewards → group advantages → old/reference
//! log-probs → μ passes of the policy loss over micro-batches → clipped AdamW step; evaluation
//! with pass@k; checkpoints that resume with the same data order. Supervised and DPO jobs run
//! in the same trainer with their own loss ([`tuning::Objective`]).

pub mod chat_rows;
pub mod dataset;
pub mod draw;
#[cfg(test)]
mod dynamic_tests;
pub mod environment;
pub mod error;
pub mod eval;
pub mod fixed_batch;
#[cfg(test)]
mod partial_tests;
pub mod phase;
pub mod pipeline;
pub mod preference;
pub mod rollout;
pub mod state;
pub mod step;
pub mod supervised;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tuning;

pub use dataset::{DataCursor, DataOrder, Dataset, Example};
pub use error::{Result, TrainerError};
pub use eval::EvalMetrics;
pub use fixed_batch::{FixedBatch, FixedBatchReport};
pub use phase::{Phase, PhaseObserver};
pub use preference::{load_preferences, PreferencePair, ReferenceLogprobs};
pub use state::TrainerProgress;
pub use step::{SampleRecord, StepOutput, Trainer, TrainerOptions};
pub use supervised::{load_supervised, SupervisedExample};
pub use tuning::{
    Evaluation, Objective, PreferenceData, SupervisedData, TuningEval, TuningMetrics,
};

/// SplitMix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from the job seed and a path of numbers (step, round, purpose…).
pub fn mix_seed(seed: u64, path: &[u64]) -> u64 {
    path.iter().fold(mix(seed), |acc, &part| mix(acc ^ part))
}
