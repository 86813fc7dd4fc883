//! One object for the trainer's update loop: backward over micro-batches, global-norm clipping,
//! scheduled AdamW step, and exact save/restore of the optimizer side of a checkpoint. The GRPO
//! trainer ([`crate::trainer::Trainer`]) updates its policy through it.

use crate::checkpoint::restore_optimizer;
use crate::error::{Result, WorkerError};
use crate::model::tape::Tape;
use crate::model::Transformer;
use crate::optim::{AdamW, AdamWConfig, GradAccumulator, LrSchedule, OptimizerPath};
use candle_core::{Tensor, Var};
use serde::Serialize;
use std::path::Path;

/// What one optimizer step did (for the per-step metrics).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepStats {
    /// Optimizer steps taken so far, this one included.
    pub step: u64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Factor the gradients were scaled by (1.0 when not clipped).
    pub clip_factor: f32,
    /// Micro-batches that contributed.
    pub micro_batches: usize,
}

/// AdamW + schedule + clipping + gradient accumulation over a model's trainable parameters
/// (all weights, or only the LoRA adapters when LoRA is enabled).
pub struct PolicyOptimizer {
    params: Vec<(String, Var)>,
    /// The optimizer (moments, step count).
    pub adamw: AdamW,
    /// Learning-rate schedule, indexed by the optimizer step.
    pub schedule: LrSchedule,
    /// Global-norm clipping threshold (0 disables).
    pub max_grad_norm: f64,
    grads: GradAccumulator,
}

impl PolicyOptimizer {
    /// A fresh optimizer over `model.trainable_params()`, on the path their device calls for
    /// (see [`OptimizerPath`]).
    pub fn new(
        model: &Transformer,
        config: AdamWConfig,
        schedule: LrSchedule,
        max_grad_norm: f64,
    ) -> Result<Self> {
        let params = model.trainable_params();
        Ok(Self {
            adamw: AdamW::new(config, &params)?,
            grads: GradAccumulator::new(&params),
            params,
            schedule,
            max_grad_norm,
        })
    }

    /// Moves the gradients' and moments' arithmetic to `path` (e.g. the device-generic tensor
    /// ops on the CPU, to test the GPU's path); drops gradients accumulated since the last step.
    pub fn set_path(&mut self, path: OptimizerPath) -> Result<()> {
        self.adamw.set_path(&self.params, path)?;
        self.grads = GradAccumulator::with_path(&self.params, path);
        Ok(())
    }

    /// The path the optimizer's arithmetic runs on.
    pub fn path(&self) -> OptimizerPath {
        self.adamw.path()
    }

    /// Restores the optimizer state saved in checkpoint folder `dir` (the model's weights are
    /// restored separately with [`crate::checkpoint::restore_weights`]).
    pub fn restore(
        model: &Transformer,
        dir: &Path,
        schedule: LrSchedule,
        max_grad_norm: f64,
    ) -> Result<Self> {
        let adamw = restore_optimizer(model, dir)?;
        let params = model.trainable_params();
        Ok(Self { grads: GradAccumulator::new(&params), adamw, params, schedule, max_grad_norm })
    }

    /// Back-propagates `loss` (a scalar built from [`Transformer::completion_logprobs`] with
    /// gradients) and adds `scale` times its gradients to the running sum. Use `scale` to
    /// average over micro-batches (e.g. `1 / micro_batches`, or a token-count weight).
    pub fn backward(&mut self, loss: &Tensor, scale: f32) -> Result<()> {
        let grads = loss.backward()?;
        self.grads.accumulate(grads, &self.params, scale)
    }

    /// [`PolicyOptimizer::backward`] for a loss built from
    /// [`Transformer::completion_logprobs_layered`]: back-propagates through its `tape`, layer
    /// by layer (lower peak memory, same gradients).
    pub fn backward_layered(&mut self, loss: &Tensor, tape: Tape, scale: f32) -> Result<()> {
        self.grads.accumulate_layered(loss, tape, &self.params, scale)
    }

    /// The learning rate the next step will use.
    pub fn next_lr(&self) -> f64 {
        self.schedule.lr_at(self.adamw.step_count())
    }

    /// Clips the summed gradients to `max_grad_norm`, applies AdamW at the scheduled rate and
    /// clears the gradients. Fails with [`WorkerError::NonFiniteGradient`], applying no update,
    /// when the gradient norm is infinite or NaN.
    pub fn step(&mut self) -> Result<StepStats> {
        let (clip_factor, grad_norm) = self.grads.clip_factor(self.max_grad_norm);
        if !grad_norm.is_finite() {
            return Err(WorkerError::NonFiniteGradient { norm: grad_norm });
        }
        let lr = self.next_lr();
        let micro_batches = self.grads.micro_batches();
        self.adamw.step(&self.params, &self.grads, lr, clip_factor)?;
        self.grads.reset();
        Ok(StepStats { step: self.adamw.step_count(), lr, grad_norm, clip_factor, micro_batches })
    }

    /// Drops gradients accumulated since the last step (e.g. after a cancelled step).
    pub fn zero_grad(&mut self) {
        self.grads.reset();
    }
}
