//! A Tinker training client's model on its worker: the weights (LoRA adapters or all of them)
//! and the optimizer, resident between calls, and the calls that change them —
//! `forward_backward` with the built-in losses (gradients add up until the next step),
//! `forward` (log-probabilities and loss only) and `optim_step` with the caller's Adam
//! settings. The calls' shapes are [`verity_core::tinker::training`]'s.

mod loss;

pub use loss::datum_losses;

use crate::grpo::GrpoError;
use crate::model::Transformer;
use crate::optim::policy_optimizer::PolicyOptimizer;
use crate::optim::{AdamWConfig, LrSchedule};
use crate::WorkerError;
use candle_core::{DType, Tensor};
use std::collections::BTreeMap;
use verity_core::tinker::training::{
    AdamParams, FieldError, ForwardBackward, ForwardBackwardOutput, LossFn, OptimStepOutput,
};

/// Why a training call failed.
#[derive(Debug, thiserror::Error)]
pub enum TinkerCallError {
    /// The call's data does not fit the loss or the model (the caller's mistake).
    #[error("{0}")]
    Input(FieldError),
    /// `optim_step`'s settings are out of range (the caller's mistake).
    #[error("adam_params.{field}: {message}")]
    Adam {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The model or optimizer failed.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The loss failed.
    #[error(transparent)]
    Loss(#[from] GrpoError),
}

impl From<candle_core::Error> for TinkerCallError {
    fn from(err: candle_core::Error) -> Self {
        TinkerCallError::Worker(WorkerError::from(err))
    }
}

impl TinkerCallError {
    /// Whether the caller caused it (Tinker's `user` category) rather than the server.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            TinkerCallError::Input(_)
                | TinkerCallError::Adam { .. }
                | TinkerCallError::Worker(WorkerError::NonFiniteGradient { .. })
        )
    }
}

/// Result of a training call.
pub type Result<T> = std::result::Result<T, TinkerCallError>;

/// A training client's model and optimizer, resident between its calls.
pub struct TinkerTrainer {
    model: Transformer,
    optimizer: PolicyOptimizer,
    pad_id: u32,
    /// `forward_backward` calls whose gradients await the next `optim_step`.
    pending: usize,
}

impl TinkerTrainer {
    /// A trainer of `model`'s trainable parameters (its LoRA adapters when LoRA is enabled)
    /// with fresh Adam moments; `pad_id` pads scoring batches.
    pub fn new(model: Transformer, pad_id: u32) -> Result<Self> {
        let defaults = AdamParams::default();
        let optimizer = PolicyOptimizer::new(
            &model,
            adam_config(&defaults),
            LrSchedule::constant(defaults.learning_rate),
            defaults.grad_clip_norm,
        )?;
        Ok(TinkerTrainer { model, optimizer, pad_id, pending: 0 })
    }

    /// The model as trained so far.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// The optimizer (moments and step count), e.g. to save it beside the weights.
    pub fn optimizer(&self) -> &PolicyOptimizer {
        &self.optimizer
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.optimizer.adamw.step_count()
    }

    /// Runs a `forward_backward` (or `forward`) call: each datum's target log-probabilities
    /// and loss; unless `forward_only`, the summed loss's gradients are added to those waiting
    /// for the next [`TinkerTrainer::optim_step`].
    pub fn forward_backward(&mut self, call: &ForwardBackward) -> Result<ForwardBackwardOutput> {
        call.check(self.model.config.vocab_size).map_err(TinkerCallError::Input)?;
        let inputs: Vec<Vec<u32>> = call.data.iter().map(|d| d.tokens.clone()).collect();
        let targets: Vec<Vec<u32>> = call.data.iter().map(|d| d.target_tokens.clone()).collect();
        let track = !call.forward_only;
        let scored = self.model.next_token_logprobs(&inputs, &targets, self.pad_id, track)?;
        let per_token = datum_losses(call, &scored.logprobs, &scored.mask)?;
        let loss = per_token.sum_all()?;
        if track {
            self.optimizer.backward(&loss, 1.0)?;
            self.pending += 1;
        }
        let logprobs = scored.logprobs.detach().to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let elementwise = per_token.detach().to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let outputs = call
            .data
            .iter()
            .enumerate()
            .map(|(i, datum)| {
                let n = datum.tokens.len();
                let mut fields = BTreeMap::new();
                fields.insert("logprobs".to_string(), logprobs[i][..n].to_vec());
                if call.loss_fn == LossFn::CrossEntropy {
                    fields.insert("elementwise_loss".to_string(), elementwise[i][..n].to_vec());
                }
                fields
            })
            .collect();
        let mut metrics = BTreeMap::new();
        metrics.insert("loss:sum".to_string(), scalar(&loss)?);
        Ok(ForwardBackwardOutput { outputs, metrics })
    }

    /// Applies one Adam step with `params` to the gradients summed since the last step, then
    /// clears them. A step with no `forward_backward` before it changes nothing but Adam's
    /// step count and moments' decay, as in Tinker.
    pub fn optim_step(&mut self, params: &AdamParams) -> Result<OptimStepOutput> {
        params.check().map_err(|(field, message)| TinkerCallError::Adam { field, message })?;
        self.optimizer.adamw.config = adam_config(params);
        self.optimizer.schedule = LrSchedule::constant(params.learning_rate);
        self.optimizer.max_grad_norm = params.grad_clip_norm;
        let stats = self.optimizer.step();
        self.pending = 0;
        if stats.is_err() {
            self.optimizer.zero_grad();
        }
        let stats = stats?;
        let mut metrics = OptimStepOutput::new();
        metrics.insert("grad_norm:mean".into(), stats.grad_norm);
        metrics.insert("learning_rate:mean".into(), stats.lr);
        metrics.insert("step:max".into(), stats.step as f64);
        Ok(metrics)
    }

    /// Loads the weights of checkpoint folder `dir` (written by
    /// [`crate::checkpoint::save_checkpoint`] for a model of the same shape and adapters) and,
    /// with `optimizer`, its Adam state; gradients waiting for a step are dropped.
    pub fn restore(&mut self, dir: &std::path::Path, optimizer: bool) -> Result<()> {
        crate::checkpoint::restore_weights(&mut self.model, dir)?;
        // Loading an adapter makes new parameters: the optimizer is rebuilt over them, with the
        // saved moments or fresh ones (the rate and clip come with each step's settings).
        let adam = self.optimizer.adamw.config.clone();
        let (schedule, clip) = (self.optimizer.schedule.clone(), self.optimizer.max_grad_norm);
        self.optimizer = if optimizer {
            PolicyOptimizer::restore(&self.model, dir, schedule, clip)?
        } else {
            PolicyOptimizer::new(&self.model, adam, schedule, clip)?
        };
        self.pending = 0;
        Ok(())
    }

    /// `forward_backward` calls whose gradients wait for the next step.
    pub fn pending_backwards(&self) -> usize {
        self.pending
    }
}

/// The optimizer's settings for `params` (the rate and clip are set apart).
fn adam_config(params: &AdamParams) -> AdamWConfig {
    AdamWConfig {
        beta1: params.beta1,
        beta2: params.beta2,
        eps: params.eps,
        weight_decay: params.weight_decay,
    }
}

fn scalar(tensor: &Tensor) -> Result<f64> {
    Ok(tensor.detach().to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

#[cfg(test)]
mod tests;
