//! GRPO-family algorithmic core: advantages, policy losses, DAPO extras and training metrics.
//!
//! Everything here is model-agnostic: the trainer feeds per-token log-probabilities, masks and
//! rewards in and gets advantages, a differentiable scalar loss and statistics out.

pub mod advantages;
pub mod dapo;
pub mod error;
#[cfg(test)]
mod learning_tests;
pub mod loss;
pub mod metrics;
pub mod mismatch;
mod tensor_ops;
#[cfg(test)]
mod test_vectors;

pub use advantages::{group_advantages, GroupAdvantages};
pub use dapo::{mask_truncated, DynamicSampler, DynamicSamplingOutcome, OverlongShaping};
pub use error::{GrpoError, Result};
pub use loss::{
    policy_loss, Loss, LossConfig, LossStats, PolicyLossInputs, PolicyLossOutput, StepNormalizer,
};
pub use metrics::{pass_at_k, token_entropy, StepMetrics};
pub use mismatch::{sampler_trainer_kl, truncated_is_weights};
