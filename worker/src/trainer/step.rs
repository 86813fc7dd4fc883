//! One training step of the GRPO family, and the trainer that owns model, optimizer and data.

use super::dataset::{DataCursor, DataOrder, Dataset};
use super::draw::{sampling_params, Drawer, Drawn};
use super::error::{Result, TrainerError};
use super::mix_seed;
use super::phase::{tell, Phase, PhaseObserver};
use super::pipeline::{InFlight, Pipeline};
use super::rollout::{per_grader_scores, Group, Rollout};
use super::tuning::{Objective, TuningMetrics};
use crate::error::WorkerError;
use crate::grpo::{
    group_advantages, mask_truncated, policy_loss, sampler_trainer_kl, truncated_is_weights,
    LossConfig, LossStats, OverlongShaping, PolicyLossInputs, StepMetrics, StepNormalizer,
};
use crate::model::lora::LoraConfig;
use crate::model::Transformer;
use crate::optim::policy_optimizer::PolicyOptimizer;
use crate::optim::{AdamWConfig, LrSchedule};
use crate::sampler::{FinishReason, SamplingParams};
use crate::tokenizer::ChatTokenizer;
use crate::weights::WeightMap;
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;
use verity_core::spec::Hyperparameters;
use verity_verifiers::{Grader, GraderPool};

pub use verity_verifiers::SUCCESS_THRESHOLD;

/// Fraction of failed gradings in one step above which the step fails (a grader crash storm).
pub const MAX_GRADER_ERROR_FRACTION: f64 = 0.5;

/// Settings of a trainer besides the hyperparameters.
#[derive(Debug, Clone)]
pub struct TrainerOptions {
    /// The job seed (the hyperparameters' `seed` overrides it).
    pub seed: u64,
    /// Name of the base model (written into LoRA adapter configs).
    pub base_model: String,
    /// The pool that grades rollouts (its budget bounds gradings in parallel; a worker shares
    /// one across its jobs, and `verity up` with the API's `graders/run`).
    pub graders: GraderPool,
}

/// One completion of a step, as stored in `samples/step-{n}.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// Step number.
    pub step: u64,
    /// Position within the step.
    pub idx: usize,
    /// Which group (prompt) of the step.
    pub prompt_idx: usize,
    /// The dataset row it answers: its 0-based index among the file's rows (blank lines not
    /// counted), the same at every step, so one row can be followed across training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row: Option<usize>,
    /// The rendered prompt.
    pub prompt: String,
    /// The completion text.
    pub completion: String,
    /// Total grader score.
    pub score: f64,
    /// Scores per named grader.
    pub per_grader: BTreeMap<String, f64>,
    /// The grader's reason.
    pub reason: String,
    /// Infrastructure failure of the grading, if any.
    pub grader_error: Option<String>,
    /// Reward used for the advantage (after overlong shaping).
    pub reward: f64,
    /// Group-relative advantage.
    pub advantage: f64,
    /// `stop` or `length`.
    pub finish_reason: String,
    /// Completion length in tokens.
    pub tokens: usize,
    /// The row's target (supervised and DPO samples: the assistant message trained on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The episode, turn by turn, when the job has a tool environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode: Option<crate::episodes::EpisodeRecord>,
}

/// What one step produced.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// The step's metrics (of a supervised or DPO step only the fields every method has: step,
    /// loss, grad norm, learning rate, tokens, time).
    pub metrics: StepMetrics,
    /// The metrics of a supervised or DPO step (its metrics row).
    pub tuning: Option<TuningMetrics>,
    /// Every completion of the step.
    pub samples: Vec<SampleRecord>,
}

impl StepOutput {
    /// The step's metrics row as stored.
    pub fn row(&self) -> serde_json::Result<serde_json::Value> {
        match &self.tuning {
            Some(tuning) => serde_json::to_value(tuning),
            None => serde_json::to_value(&self.metrics),
        }
    }
}

/// The trainer: model, reference, optimizer, data order and objective (grader or targets).
pub struct Trainer {
    /// The policy being trained.
    pub model: Transformer,
    /// Its tokenizer.
    pub tokenizer: ChatTokenizer,
    pub(super) reference: Option<Transformer>,
    pub(super) objective: Objective,
    pub(super) pool: GraderPool,
    pub(super) hp: Hyperparameters,
    pub(super) loss: LossConfig,
    pub(super) optimizer: PolicyOptimizer,
    pub(super) train: Dataset,
    pub(super) validation: Option<Dataset>,
    pub(super) order: DataOrder,
    pub(super) step: u64,
    pub(super) seed: u64,
    pub(super) total_steps: u64,
    pub(super) options: TrainerOptions,
    /// Told each phase of a step or evaluation as it begins.
    pub(super) phases: Option<PhaseObserver>,
    /// Groups drawn ahead for the next step (the asynchronous pipeline, `max_staleness`).
    pub(super) in_flight: Option<InFlight>,
    /// Groups still decoding, carried to the next step (partial rollouts).
    pub(super) partial: Vec<super::draw::PartialGroup>,
    /// The pipeline's shared copies and thread pools, once it has run.
    pub(super) pipeline: Option<Pipeline>,
    /// The grammar rollouts follow (a JSON `response_format`), if any.
    pub(super) constraint: Option<crate::constrained::OutputConstraint>,
}

/// A frozen copy of the model's current (base) weights, for the KL reference.
fn frozen_copy(model: &Transformer) -> Result<Transformer> {
    let mut map = WeightMap::default();
    for (name, tensor) in model.export_weights()? {
        map.insert(name, tensor)?;
    }
    Ok(Transformer::from_weights(model.config.clone(), map, model.device())?)
}

/// The masks of completions `start..start + len`; empty when no completion was constrained, so
/// that free batches take the unmasked path.
fn masked_slice(
    masks: &[Vec<crate::constrained::VocabMask>],
    start: usize,
    len: usize,
) -> &[Vec<crate::constrained::VocabMask>] {
    let slice = &masks[start..start + len];
    if slice.iter().all(Vec::is_empty) {
        &[]
    } else {
        slice
    }
}

/// Rows `[N, T]` (f32) of per-token values padded with zeros to the longest row.
fn padded_rows(rows: &[&[f32]], device: &candle_core::Device) -> Result<Tensor> {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut data = vec![0f32; rows.len() * width];
    for (i, row) in rows.iter().enumerate() {
        data[i * width..i * width + row.len()].copy_from_slice(row);
    }
    Ok(Tensor::from_vec(data, (rows.len(), width), device)?)
}

/// Mean of `values` where `mask` is 1.
fn masked_mean_f64(values: &Tensor, mask: &Tensor) -> Result<(f64, f64)> {
    let sum = values
        .to_dtype(DType::F64)?
        .mul(&mask.to_dtype(DType::F64)?)?
        .sum_all()?
        .to_scalar::<f64>()?;
    let count = mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
    Ok((sum, count))
}

/// The `[N, T]` (f32) mask of real completion tokens, `T` the longest completion — the mask
/// [`Transformer::completion_logprobs`] returns, without running the model.
fn completion_mask(completions: &[Vec<u32>], device: &candle_core::Device) -> Result<Tensor> {
    let rows: Vec<Vec<f32>> = completions.iter().map(|c| vec![1.0; c.len()]).collect();
    padded_rows(&rows.iter().map(Vec::as_slice).collect::<Vec<_>>(), device)
}

/// One micro-batch's loss inputs that stay fixed across the inner epochs of a step.
struct Micro {
    /// Old-policy log-probs; `None` until the first pass when they come from that pass.
    logp_old: Option<Tensor>,
    logp_ref: Option<Tensor>,
    mask: Tensor,
    advantages: Tensor,
    is_weights: Option<Tensor>,
}

/// Entropy and sampler-vs-trainer KL of the old policy, summed over a step's micro-batches.
#[derive(Default)]
struct OldPolicyStats {
    entropy_sum: f64,
    entropy_tokens: f64,
    kl_sum: f64,
    kl_tokens: f64,
}

impl OldPolicyStats {
    /// Adds one micro-batch's old-policy log-probs; returns its truncated IS weights when
    /// `tis_cap` is set (`mask` is the loss mask, truncation already applied).
    fn observe(
        &mut self,
        old: &crate::model::CompletionLogprobs,
        mask: &Tensor,
        sampler_logprobs: &[Vec<f32>],
        tis_cap: Option<f64>,
    ) -> Result<Option<Tensor>> {
        let (sum, count) = masked_mean_f64(&old.entropy, &old.mask)?;
        self.entropy_sum += sum;
        self.entropy_tokens += count;
        let rows: Vec<&[f32]> = sampler_logprobs.iter().map(Vec::as_slice).collect();
        let logp_sampler = padded_rows(&rows, old.logprobs.device())?;
        let kl = sampler_trainer_kl(&logp_sampler, &old.logprobs, &old.mask)?;
        let tokens = old.mask.sum_all()?.to_scalar::<f32>()? as f64;
        self.kl_sum += kl * tokens;
        self.kl_tokens += tokens;
        Ok(match tis_cap {
            Some(cap) => Some(truncated_is_weights(&old.logprobs, &logp_sampler, mask, cap)?),
            None => None,
        })
    }

    /// Token-weighted mean entropy (0 without tokens).
    fn mean_entropy(&self) -> f64 {
        if self.entropy_tokens > 0.0 {
            self.entropy_sum / self.entropy_tokens
        } else {
            0.0
        }
    }

    /// Token-weighted mean sampler-vs-trainer KL (0 without tokens).
    fn mean_sampler_kl(&self) -> f64 {
        if self.kl_tokens > 0.0 {
            self.kl_sum / self.kl_tokens
        } else {
            0.0
        }
    }
}

/// The flattened completions of a step, with everything the loss needs.
pub(super) struct Batch {
    pub(super) prompts: Vec<Vec<u32>>,
    pub(super) completions: Vec<Vec<u32>>,
    pub(super) sampler_logprobs: Vec<Vec<f32>>,
    pub(super) advantages: Vec<f32>,
    pub(super) keep: Vec<bool>,
    /// Per completion, which tokens the model sampled (`None`: all; episodes with tools).
    pub(super) model_masks: Vec<Option<Vec<bool>>>,
    /// Per completion, the vocabulary mask each token was sampled under (constrained
    /// decoding; empty when free), so the loss sees the distribution the sampler drew from.
    pub(super) token_masks: Vec<Vec<crate::constrained::VocabMask>>,
}

impl Trainer {
    /// Builds a reinforcement trainer for `model` (already loaded, without adapters) on `train`
    /// with optional `validation`, scored by `grader`; enables LoRA when the hyperparameters
    /// ask for it.
    pub fn new(
        model: Transformer,
        tokenizer: ChatTokenizer,
        grader: Grader,
        hp: Hyperparameters,
        train: Dataset,
        validation: Option<Dataset>,
        options: TrainerOptions,
    ) -> Result<Trainer> {
        let objective = Objective::reinforcement(grader);
        Trainer::with_objective(model, tokenizer, objective, hp, (train, validation), options)
    }

    /// Builds a trainer of any [`Objective`]; `data` are the training and validation prompts
    /// (for a supervised or DPO objective, those of its rows, in the same order).
    pub fn with_objective(
        mut model: Transformer,
        tokenizer: ChatTokenizer,
        objective: Objective,
        hp: Hyperparameters,
        (train, validation): (Dataset, Option<Dataset>),
        options: TrainerOptions,
    ) -> Result<Trainer> {
        hp.validate("hyperparameters").map_err(|e| TrainerError::Config(e.to_string()))?;
        let seed = hp.seed.unwrap_or(options.seed);
        let loss = LossConfig::from_hyperparameters(&hp);
        loss.validate()?;
        let reference = if hp.beta > 0.0 { Some(frozen_copy(&model)?) } else { None };
        if let Some(lora) = &hp.lora {
            let config = LoraConfig {
                r: lora.rank,
                lora_alpha: lora.alpha,
                target_modules: lora.targets.clone(),
                lora_dropout: lora.dropout,
            };
            model
                .enable_lora(config, mix_seed(seed, &[0x10a]))
                .map_err(|e| TrainerError::Config(format!("lora: {e}")))?;
        }
        let per_epoch = train.len().div_ceil(hp.batch_size()) as u64;
        let total_steps =
            hp.max_steps.map(|s| s as u64).unwrap_or(per_epoch * hp.n_epochs() as u64).max(1);
        let schedule = LrSchedule {
            lr: hp.effective_learning_rate(),
            warmup_steps: hp.warmup_steps as u64,
            total_steps,
            cosine: hp.lr_schedule == verity_core::spec::LrDecay::Cosine,
            min_lr_ratio: 0.0,
        };
        let optimizer = PolicyOptimizer::new(
            &model,
            AdamWConfig { weight_decay: hp.weight_decay, ..AdamWConfig::default() },
            schedule,
            hp.max_grad_norm,
        )?;
        let order = DataOrder::new(seed, train.len(), DataCursor::default());
        Ok(Trainer {
            model,
            tokenizer,
            reference,
            objective,
            pool: options.graders.clone(),
            hp,
            loss,
            optimizer,
            train,
            validation,
            order,
            step: 0,
            seed,
            total_steps,
            options,
            phases: None,
            in_flight: None,
            partial: Vec::new(),
            pipeline: None,
            constraint: None,
        })
    }

    /// Tells `observer` each phase (sampling, grading, training, evaluating) as it begins.
    pub fn observe_phases(&mut self, observer: PhaseObserver) {
        self.phases = Some(observer);
    }

    /// Tells the observer, if any, that `phase` began.
    pub(super) fn phase(&self, phase: Phase) {
        tell(self.phases.as_ref(), phase);
    }

    /// Steps completed so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Steps the run will take in all.
    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// Whether every step is done.
    pub fn finished(&self) -> bool {
        self.step >= self.total_steps
    }

    /// Where the data order stands.
    pub fn cursor(&self) -> DataCursor {
        self.order.cursor()
    }

    /// The hyperparameters.
    pub fn hyperparameters(&self) -> &Hyperparameters {
        &self.hp
    }

    /// The effective seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub(super) fn sampling_params(&self, n: usize, seed: u64) -> SamplingParams {
        sampling_params(&self.hp, n, seed)
    }

    pub(super) fn rollout(&self) -> Result<Rollout<'_>> {
        let Objective::Reinforcement { grader, environment, .. } = &self.objective else {
            return Err(TrainerError::Config("only reinforcement jobs sample rollouts".into()));
        };
        Ok(Rollout {
            model: &self.model,
            tokenizer: &self.tokenizer,
            grader,
            pool: &self.pool,
            phases: self.phases.as_ref(),
            environment: environment.as_deref(),
            sampled: None,
            constraint: self.constraint.as_ref(),
        })
    }

    /// The grader's name in per-grader metrics.
    fn grader_name(&self) -> &str {
        match &self.objective {
            Objective::Reinforcement { name, .. } => name,
            _ => "",
        }
    }

    /// Draws step `step`'s groups from the current weights ([`Drawer`]).
    pub(super) fn draw_groups(&mut self, step: u64) -> Result<Drawn> {
        let mut order = self.order.clone();
        let drawer = Drawer {
            rollout: self.rollout()?,
            examples: &self.train.examples,
            hp: &self.hp,
            seed: self.seed,
        };
        let drawn = match self.hp.partial_rollout_tokens {
            Some(segment) => {
                // A failed draw leaves the carried groups as they were.
                let mut carried = self.partial.clone();
                let drawn = drawer.draw_partial(&mut order, step, &mut carried, segment)?;
                self.partial = carried;
                drawn
            }
            None => drawer.draw(&mut order, step)?,
        };
        self.order = order;
        Ok(drawn)
    }

    /// Runs one training step and returns its metrics and samples.
    pub fn train_step(&mut self) -> Result<StepOutput> {
        match self.objective {
            Objective::Reinforcement { .. } => self.reinforcement_step(),
            _ => self.tuning_step(),
        }
    }

    /// One GRPO-family step: rollouts, rewards, advantages, μ passes of the policy loss.
    fn reinforcement_step(&mut self) -> Result<StepOutput> {
        let step = self.step + 1;
        let (Drawn { groups, groups_drawn, times, .. }, policy_step) = self.take_or_draw(step)?;
        let group_size = self.hp.group_size();
        let mut metrics = StepMetrics {
            step,
            groups_drawn: groups_drawn as u64,
            groups_kept: groups.len() as u64,
            staleness: self.step - policy_step,
            groups_carried: self.partial.len() as u64,
            ..StepMetrics::default()
        };
        metrics.sampling_seconds = times.sampling;
        metrics.grading_seconds = times.grading;
        metrics.tokens_per_second =
            if times.sampling > 0.0 { times.tokens as f64 / times.sampling } else { 0.0 };
        metrics.generated_tokens = times.tokens as u64;

        // Rewards, grader failures, overlong shaping, advantages.
        let scores: Vec<f64> = groups.iter().flat_map(Group::scores).collect();
        let failed: Vec<bool> = groups.iter().flat_map(Group::grader_failed).collect();
        let mut rewards: Vec<f64> = groups.iter().flat_map(Group::rewards).collect();
        let completions: Vec<&crate::sampler::Completion> =
            groups.iter().flat_map(|g| g.completions.iter()).collect();
        let lengths: Vec<usize> = completions.iter().map(|c| c.token_ids.len()).collect();
        let truncated: Vec<bool> =
            completions.iter().map(|c| c.finish_reason == FinishReason::Length).collect();
        let error_count = failed.iter().filter(|&&f| f).count();
        metrics.grader_errors = error_count as u64;
        if !failed.is_empty()
            && error_count as f64 > MAX_GRADER_ERROR_FRACTION * failed.len() as f64
        {
            let first = groups
                .iter()
                .flat_map(|g| g.grades.iter())
                .find_map(|g| g.error.as_ref().map(|e| e.message.clone()))
                .unwrap_or_default();
            return Err(TrainerError::GraderStorm {
                step,
                failed: error_count,
                total: failed.len(),
                first,
            });
        }
        if self.hp.overlong_buffer > 0 {
            OverlongShaping::new(
                self.hp.max_completion_tokens(),
                self.hp.overlong_buffer,
                self.hp.overlong_penalty,
            )?
            .apply(&mut rewards, &lengths)?;
        }
        let ok_scores: Vec<f64> =
            scores.iter().zip(&failed).filter(|(_, &f)| !f).map(|(&s, _)| s).collect();
        let mut per_grader: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for g in &groups {
            for grade in g.grades.iter().filter(|g| !g.is_error()) {
                for (name, score) in per_grader_scores(grade, self.grader_name()) {
                    per_grader.entry(name).or_default().push(score);
                }
            }
        }
        metrics.record_rewards(&ok_scores, &per_grader, SUCCESS_THRESHOLD);
        metrics.record_completions(&lengths, &truncated)?;
        metrics.episodes =
            crate::episodes::EpisodeMetrics::of(groups.iter().flat_map(|g| &g.episodes));
        let advantages = if rewards.is_empty() {
            Vec::new()
        } else {
            let adv = group_advantages(&rewards, group_size, self.hp.scale_rewards())?;
            metrics.zero_advantage_group_fraction = adv.zero_advantage_group_fraction();
            adv.advantages
        };
        let keep: Vec<bool> = failed
            .iter()
            .zip(&truncated)
            .map(|(&f, &t)| !(f || (self.hp.mask_truncated && t)))
            .collect();
        let samples = self.sample_records(step, &groups, &rewards, &advantages);

        // Optimisation.
        self.phase(Phase::Training);
        let mut training_seconds = 0.0;
        if !completions.is_empty() {
            let batch = Batch {
                prompts: groups
                    .iter()
                    .flat_map(|g| {
                        std::iter::repeat_n(
                            self.train.examples[g.example].prompt_ids.clone(),
                            group_size,
                        )
                    })
                    .collect(),
                completions: completions.iter().map(|c| c.token_ids.clone()).collect(),
                sampler_logprobs: completions.iter().map(|c| c.logprobs.clone()).collect(),
                advantages: advantages.iter().map(|&a| a as f32).collect(),
                keep,
                model_masks: groups.iter().flat_map(Group::model_masks).collect(),
                token_masks: completions.iter().map(|c| c.token_masks.clone()).collect(),
            };
            metrics.trained_tokens = batch
                .prompts
                .iter()
                .zip(&batch.completions)
                .zip(&batch.keep)
                .filter(|pair| *pair.1)
                .map(|((prompt, completion), _)| (prompt.len() + completion.len()) as u64)
                .sum();
            self.train_overlapped(step, |trainer| {
                let started = Instant::now();
                verity_kernels::on_pool(|| trainer.optimise(&batch, &mut metrics))?;
                training_seconds = started.elapsed().as_secs_f64();
                Ok(())
            })?;
        } else {
            self.train_overlapped(step, |trainer| {
                metrics.learning_rate = trainer.optimizer.next_lr();
                Ok(())
            })?;
        }
        metrics.training_seconds = training_seconds;
        self.step = step;
        Ok(StepOutput { metrics, tuning: None, samples })
    }

    fn sample_records(
        &self,
        step: u64,
        groups: &[Group],
        rewards: &[f64],
        advantages: &[f64],
    ) -> Vec<SampleRecord> {
        let mut out = Vec::new();
        for (prompt_idx, g) in groups.iter().enumerate() {
            let records =
                g.sample_records(step, &self.train.examples, self.grader_name(), &self.tokenizer);
            for (j, mut record) in records.into_iter().enumerate() {
                let idx = prompt_idx * self.hp.group_size() + j;
                record.idx = idx;
                record.prompt_idx = prompt_idx;
                record.reward = rewards.get(idx).copied().unwrap_or(0.0);
                record.advantage = advantages.get(idx).copied().unwrap_or(0.0);
                out.push(record);
            }
        }
        out
    }

    /// The optimizer's step; a non-finite gradient is the user's to fix (a lower learning rate).
    pub(super) fn optimizer_step(&mut self) -> Result<crate::optim::policy_optimizer::StepStats> {
        self.optimizer.step().map_err(|e| match e {
            WorkerError::NonFiniteGradient { norm } => TrainerError::Config(format!(
                "the gradient norm is {norm} at step {}; lower the learning rate",
                self.step + 1
            )),
            other => other.into(),
        })
    }

    /// Old/reference log-probs, then μ passes of the loss over micro-batches, each ending in a
    /// clipped AdamW step.
    ///
    /// With a single pass (μ = 1) the old policy *is* the current one, so its log-probs are the
    /// detached log-probs of the differentiable forward itself (ratio exactly 1, as in TRL) and
    /// the separate no-grad forward is skipped.
    pub(super) fn optimise(&mut self, batch: &Batch, metrics: &mut StepMetrics) -> Result<()> {
        self.model.seed_lora_dropout(mix_seed(self.seed, &[self.step, 0xd407]));
        let device = self.model.device().clone();
        let temperature = self.hp.temperature as f32;
        let pad = self.tokenizer.pad_id();
        let reuse_current_as_old = self.hp.inner_epochs == 1;
        let n = batch.completions.len();
        let ranges: Vec<(usize, usize)> = (0..n)
            .step_by(self.hp.micro_batch_size)
            .map(|s| (s, self.hp.micro_batch_size.min(n - s)))
            .collect();
        let mut micros = Vec::with_capacity(ranges.len());
        let mut old_stats = OldPolicyStats::default();
        for &(start, len) in &ranges {
            let prompts = &batch.prompts[start..start + len];
            let comps = &batch.completions[start..start + len];
            let masks = masked_slice(&batch.token_masks, start, len);
            let truncated: Vec<bool> = batch.keep[start..start + len].iter().map(|k| !k).collect();
            // tool outputs and template tokens fed into episodes are not the model's: no loss
            let model_masks: Vec<Option<&[bool]>> =
                batch.model_masks[start..start + len].iter().map(Option::as_deref).collect();
            let logp_ref = match &self.reference {
                Some(reference) => Some(
                    reference
                        .completion_logprobs_masked(prompts, comps, masks, temperature, pad, false)?
                        .logprobs,
                ),
                None => None,
            };
            let advantages =
                Tensor::from_slice(&batch.advantages[start..start + len], len, &device)?;
            let micro = if reuse_current_as_old {
                let mask = mask_truncated(&completion_mask(comps, &device)?, &truncated)?;
                let mask = crate::episodes::mask_tool_tokens(&mask, &model_masks)?;
                Micro { logp_old: None, logp_ref, mask, advantages, is_weights: None }
            } else {
                let old = self.model.completion_logprobs_masked(
                    prompts,
                    comps,
                    masks,
                    temperature,
                    pad,
                    false,
                )?;
                let mask = mask_truncated(&old.mask, &truncated)?;
                let mask = crate::episodes::mask_tool_tokens(&mask, &model_masks)?;
                let is_weights = old_stats.observe(
                    &old,
                    &mask,
                    &batch.sampler_logprobs[start..start + len],
                    self.hp.tis_cap,
                )?;
                Micro {
                    logp_old: Some(old.logprobs.detach()),
                    logp_ref,
                    mask,
                    advantages,
                    is_weights,
                }
            };
            micros.push(micro);
        }
        let normalizer = StepNormalizer::from_masks(micros.iter().map(|m| &m.mask))?;
        let mut stats = LossStats::default();
        for _ in 0..self.hp.inner_epochs {
            self.optimizer.zero_grad();
            for (m, &(start, len)) in micros.iter_mut().zip(&ranges) {
                let (current, tape) = self.model.completion_logprobs_layered(
                    &batch.prompts[start..start + len],
                    &batch.completions[start..start + len],
                    masked_slice(&batch.token_masks, start, len),
                    temperature,
                    pad,
                )?;
                let logp_old = match m.logp_old.take() {
                    Some(old) => old,
                    None => {
                        let sampler = &batch.sampler_logprobs[start..start + len];
                        m.is_weights =
                            old_stats.observe(&current, &m.mask, sampler, self.hp.tis_cap)?;
                        current.logprobs.detach()
                    }
                };
                let inputs = PolicyLossInputs {
                    logp: &current.logprobs,
                    logp_old: &logp_old,
                    logp_ref: m.logp_ref.as_ref(),
                    mask: &m.mask,
                    advantages: &m.advantages,
                    is_weights: m.is_weights.as_ref(),
                };
                let output = policy_loss(&inputs, &self.loss, &normalizer)?;
                m.logp_old = Some(logp_old);
                stats.merge(&output.stats);
                self.optimizer.backward_layered(&output.loss, tape, 1.0)?;
            }
            let update = self.optimizer_step()?;
            metrics.grad_norm = update.grad_norm;
            metrics.learning_rate = update.lr;
        }
        metrics.entropy = old_stats.mean_entropy();
        metrics.sampler_kl = old_stats.mean_sampler_kl();
        metrics.record_loss_stats(&stats, self.hp.inner_epochs);
        Ok(())
    }
}
