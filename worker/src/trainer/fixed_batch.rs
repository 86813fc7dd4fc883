//! One optimisation step on a given batch, through the trainer's own code: the prompts,
//! completions (token ids), sampler log-probs and rewards of a step go in; the advantages, the
//! per-token log-probs and loss mask, the loss, the gradient norm and the AdamW update come out.
//! `bench/peers/trl_fixed_batch.py` feeds the same batch to TRL's `GRPOTrainer` and compares
//! (docs/training.md, "Why TRL learned more").

use super::draw::Drawn;
use super::error::{Result, TrainerError};
use super::rollout::Group;
use super::step::{Batch, Trainer};
use crate::grpo::{group_advantages, StepMetrics};
use crate::sampler::FinishReason;
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The completions of one step, as both trainers read them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixedBatch {
    /// Completions per prompt.
    pub group_size: usize,
    /// The rendered prompts' token ids, one per group (chat template and generation prompt
    /// applied).
    pub prompts: Vec<Vec<u32>>,
    /// The rendered prompts' text, one per group.
    #[serde(default)]
    pub prompt_texts: Vec<String>,
    /// Completion token ids, group by group (`group_size` per prompt); a completion that ended
    /// at an end-of-sequence token includes it.
    pub completions: Vec<Vec<u32>>,
    /// The sampler's log-prob of each completion token (under `softmax(logits / T)`).
    pub sampler_logprobs: Vec<Vec<f32>>,
    /// One reward per completion.
    pub rewards: Vec<f64>,
    /// Which completions were cut at `max_completion_tokens`.
    pub truncated: Vec<bool>,
    /// The completions' text.
    #[serde(default)]
    pub texts: Vec<String>,
}

/// What optimisation steps on a [`FixedBatch`] computed.
#[derive(Debug, Clone, Serialize)]
pub struct FixedBatchReport {
    /// One advantage per completion.
    pub advantages: Vec<f64>,
    /// Per completion, the log-prob of each of its tokens under the weights before the first
    /// step.
    pub logprobs: Vec<Vec<f32>>,
    /// Per completion, the loss mask of each of its tokens (0: not trained on).
    pub loss_mask: Vec<Vec<f32>>,
    /// The first step's metrics (loss, gradient norm before clipping, learning rate, …).
    pub metrics: StepMetrics,
    /// Every step's metrics, in order (the batch trained on again at each).
    pub step_metrics: Vec<StepMetrics>,
    /// L2 norm of the change of every trainable weight over all the steps, by name.
    pub update_norms: BTreeMap<String, f64>,
    /// L2 norm of the change of all weights together over all the steps.
    pub update_norm: f64,
    /// The change over all the steps of each weight named in the request, element by element.
    pub updates: BTreeMap<String, Vec<f32>>,
}

/// Weights by name, copied.
fn weights(trainer: &Trainer) -> Result<BTreeMap<String, Tensor>> {
    Ok(trainer.model.export_weights()?.into_iter().collect())
}

/// The rows of a `(batch, len)` tensor as f32, each cut to its length.
pub(crate) fn rows(tensor: &Tensor, lengths: &[usize]) -> Result<Vec<Vec<f32>>> {
    let all = tensor.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    Ok(all.into_iter().zip(lengths).map(|(row, &n)| row[..n].to_vec()).collect())
}

impl FixedBatch {
    /// The batch of step `step`'s groups as the trainer drew them.
    fn of_groups(trainer: &Trainer, groups: &[Group]) -> Result<FixedBatch> {
        let examples = &trainer.train.examples;
        let completions = || groups.iter().flat_map(|g| g.completions.iter());
        Ok(FixedBatch {
            group_size: trainer.hp.group_size(),
            prompts: groups.iter().map(|g| examples[g.example].prompt_ids.clone()).collect(),
            prompt_texts: groups.iter().map(|g| examples[g.example].prompt_text.clone()).collect(),
            completions: completions().map(|c| c.token_ids.clone()).collect(),
            sampler_logprobs: completions().map(|c| c.logprobs.clone()).collect(),
            rewards: groups.iter().flat_map(Group::rewards).collect(),
            truncated: completions().map(|c| c.finish_reason == FinishReason::Length).collect(),
            texts: groups.iter().flat_map(|g| g.texts.iter().cloned()).collect(),
        })
    }

    fn check(&self) -> Result<()> {
        let n = self.prompts.len() * self.group_size;
        let lengths = [
            ("completions", self.completions.len()),
            ("sampler_logprobs", self.sampler_logprobs.len()),
            ("rewards", self.rewards.len()),
            ("truncated", self.truncated.len()),
        ];
        for (name, len) in lengths {
            if len != n {
                return Err(TrainerError::Config(format!(
                    "fixed batch: {name} has {len} entries, expected prompts × group_size = {n}"
                )));
            }
        }
        if let Some(i) = self.completions.iter().position(Vec::is_empty) {
            return Err(TrainerError::Config(format!("fixed batch: completion {i} is empty")));
        }
        Ok(())
    }
}

impl Trainer {
    /// Samples and grades the next step's groups exactly as [`Trainer::train_step`] would, and
    /// returns them as a batch without training on them (the data order moves on).
    pub fn draw_fixed_batch(&mut self) -> Result<FixedBatch> {
        let Drawn { groups, .. } = self.draw_groups(self.step + 1)?;
        FixedBatch::of_groups(self, &groups)
    }

    /// `steps` optimisation steps on `batch` with this trainer's hyperparameters, the batch
    /// trained on again at each (its advantages fixed, the log-probs those of the weights of the
    /// moment): group advantages of its rewards, the loss mask (truncated completions masked
    /// when `mask_truncated`), μ passes of the policy loss and the clipped AdamW step — the code
    /// of a training step after grading. Several steps exercise AdamW's moments and the
    /// learning-rate schedule past the first step. `watch` names weights whose change is
    /// returned element by element.
    pub fn train_on_fixed_batch(
        &mut self,
        batch: &FixedBatch,
        watch: &[String],
        steps: usize,
    ) -> Result<FixedBatchReport> {
        if steps == 0 {
            return Err(TrainerError::Config("fixed batch: at least one step".into()));
        }
        batch.check()?;
        let g = batch.group_size;
        if g != self.hp.group_size() {
            return Err(TrainerError::Config(format!(
                "fixed batch: group_size {g} differs from the recipe's {}",
                self.hp.group_size()
            )));
        }
        let advantages = group_advantages(&batch.rewards, g, self.hp.scale_rewards())?;
        let keep: Vec<bool> =
            batch.truncated.iter().map(|&t| !(self.hp.mask_truncated && t)).collect();
        let prompts: Vec<Vec<u32>> =
            batch.prompts.iter().flat_map(|p| std::iter::repeat_n(p.clone(), g)).collect();
        let lengths: Vec<usize> = batch.completions.iter().map(Vec::len).collect();
        let temperature = self.hp.temperature as f32;
        let pad = self.tokenizer.pad_id();
        let scored = self.model.completion_logprobs(
            &prompts,
            &batch.completions,
            temperature,
            pad,
            false,
        )?;
        let loss_mask: Vec<Vec<f32>> = rows(&scored.mask, &lengths)?
            .into_iter()
            .zip(&keep)
            .map(|(row, &k)| if k { row } else { vec![0.0; row.len()] })
            .collect();
        let before = weights(self)?;
        let trained = Batch {
            prompts,
            completions: batch.completions.clone(),
            sampler_logprobs: batch.sampler_logprobs.clone(),
            advantages: advantages.advantages.iter().map(|&a| a as f32).collect(),
            keep,
            model_masks: vec![None; batch.completions.len()],
            token_masks: vec![Vec::new(); batch.completions.len()],
        };
        let mut step_metrics = Vec::with_capacity(steps);
        for _ in 0..steps {
            let mut metrics = StepMetrics { step: self.step + 1, ..StepMetrics::default() };
            metrics.zero_advantage_group_fraction = advantages.zero_advantage_group_fraction();
            verity_kernels::on_pool(|| self.optimise(&trained, &mut metrics))?;
            self.step += 1;
            step_metrics.push(metrics);
        }
        let after = weights(self)?;
        let mut update_norms = BTreeMap::new();
        let mut updates = BTreeMap::new();
        let mut total = 0.0;
        for (name, old) in &before {
            let Some(new) = after.get(name) else { continue };
            let delta = (new.to_dtype(DType::F32)? - old.to_dtype(DType::F32)?)?;
            let squared = delta.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            total += squared;
            update_norms.insert(name.clone(), squared.sqrt());
            if watch.contains(name) {
                updates.insert(name.clone(), delta.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        Ok(FixedBatchReport {
            advantages: advantages.advantages,
            logprobs: rows(&scored.logprobs, &lengths)?,
            loss_mask,
            metrics: step_metrics[0].clone(),
            step_metrics,
            update_norms,
            update_norm: total.sqrt(),
            updates,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::testing::tiny_rollout_trainer;
    use verity_core::spec::Hyperparameters;

    fn recipe() -> Hyperparameters {
        Hyperparameters {
            batch_size: Some(2),
            group_size: Some(4),
            max_completion_tokens: Some(6),
            learning_rate: 1e-3,
            max_steps: Some(2),
            micro_batch_size: 3,
            seed: Some(5),
            ..Hyperparameters::default()
        }
    }

    /// The fixed-batch path is the training step's: a batch drawn as step 1 draws it, trained
    /// on, gives the step's loss, gradient norm and weights.
    #[test]
    fn a_drawn_batch_trains_as_the_step_does() {
        let mut stepped = tiny_rollout_trainer(recipe(), 6, 3).unwrap();
        let step = stepped.train_step().unwrap().metrics;
        let mut fixed = tiny_rollout_trainer(recipe(), 6, 3).unwrap();
        let batch = fixed.draw_fixed_batch().unwrap();
        assert_eq!(batch.completions.len(), 8);
        let report = fixed.train_on_fixed_batch(&batch, &[], 1).unwrap();
        assert!(step.grad_norm > 0.0, "the step had contrast");
        assert_eq!(report.metrics.loss, step.loss);
        assert_eq!(report.metrics.grad_norm, step.grad_norm);
        assert_eq!(report.metrics.learning_rate, step.learning_rate);
        let a = stepped.model.export_weights().unwrap();
        let b = fixed.model.export_weights().unwrap();
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            let diff = (x - y).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{name}");
        }
        assert!(report.update_norm > 0.0);
        // two steps on the batch are two training steps on it
        let mut twice = tiny_rollout_trainer(recipe(), 6, 3).unwrap();
        let batch2 = twice.draw_fixed_batch().unwrap();
        let report2 = twice.train_on_fixed_batch(&batch2, &[], 2).unwrap();
        assert_eq!(report2.step_metrics.len(), 2);
        assert_eq!(report2.step_metrics[0].loss, report.metrics.loss);
        assert_ne!(report2.step_metrics[1].grad_norm, report2.step_metrics[0].grad_norm);
        assert_ne!(report2.update_norm, report.update_norm, "the second step moved the weights");
        // the batch survives JSON unchanged
        let json = serde_json::to_string(&batch).unwrap();
        assert_eq!(serde_json::from_str::<FixedBatch>(&json).unwrap(), batch);
    }

    #[test]
    fn a_batch_of_the_wrong_shape_is_refused() {
        let mut trainer = tiny_rollout_trainer(recipe(), 6, 3).unwrap();
        let mut batch = trainer.draw_fixed_batch().unwrap();
        batch.rewards.pop();
        let err = trainer.train_on_fixed_batch(&batch, &[], 1).unwrap_err().to_string();
        assert!(err.contains("rewards has 7 entries"), "{err}");
    }
}
