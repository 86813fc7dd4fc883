//! What a trainer optimises ([`Objective`]: a grader's rewards, or the supervised or DPO loss on
//! fixed data), and the step, evaluation and samples of supervised and DPO jobs. They share the
//! trainer's model, optimizer, data order, checkpoints and resume with reinforcement jobs; only
//! the loss differs.

use super::error::{Result, TrainerError};
use super::eval::EvalMetrics;
use super::mix_seed;
use super::preference::{
    dpo_backward, dpo_eval, load_preferences, sequence_logprobs, DpoStats, PreferencePair,
    ReferenceLogprobs,
};
use super::rollout::finish_reason_name;
use super::step::{SampleRecord, StepOutput, Trainer, TrainerOptions};
use super::supervised::{load_supervised, supervised_backward, supervised_eval, SupervisedExample};
use crate::grpo::StepMetrics;
use crate::sampler::{sample, SamplingParams};
use serde::Serialize;
use std::time::Instant;
use verity_core::spec::{Method, MethodKind};
use verity_verifiers::Grader;

/// Validation prompts (or training prompts without a validation file) whose greedy completion
/// is written as the samples of each evaluation step of a supervised or DPO job.
pub const SAMPLE_PROMPTS: usize = 4;

/// The rows of a supervised job.
#[derive(Debug, Clone)]
pub struct SupervisedData {
    /// The training file's conversations (in the order of the trainer's `train` prompts).
    pub train: Vec<SupervisedExample>,
    /// The validation file's, if any.
    pub validation: Option<Vec<SupervisedExample>>,
}

/// The rows of a DPO job and their cached reference log-probs.
#[derive(Debug, Clone)]
pub struct PreferenceData {
    /// DPO's β.
    pub beta: f64,
    /// The training file's pairs (in the order of the trainer's `train` prompts).
    pub train: Vec<PreferencePair>,
    /// The validation file's, if any.
    pub validation: Option<Vec<PreferencePair>>,
    /// Reference log-probs of every pair: computed from the start model before the first
    /// update, then kept (and saved in checkpoints, so a resumed job never needs the start
    /// model again).
    pub reference: Option<ReferenceLogprobs>,
}

/// What the trainer optimises.
pub enum Objective {
    /// GRPO-family losses on rollouts scored by `grader` (named `name` in per-grader metrics).
    Reinforcement {
        /// The grader.
        grader: Box<Grader>,
        /// Its name.
        name: String,
        /// Multi-turn episodes with tools, when the job has an environment (see
        /// [`Trainer::with_environment`](super::Trainer::with_environment)).
        environment: Option<Box<verity_core::environment::Environment>>,
    },
    /// Cross-entropy on the trained assistant tokens.
    Supervised(Box<SupervisedData>),
    /// The DPO loss on preference pairs.
    Dpo(Box<PreferenceData>),
}

impl Objective {
    /// The reinforcement objective of `grader`.
    pub fn reinforcement(grader: Grader) -> Objective {
        let name = grader.spec().name().unwrap_or(grader.spec().kind()).to_string();
        Objective::Reinforcement { grader: Box::new(grader), name, environment: None }
    }
}

/// The metrics row of a supervised or DPO step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TuningMetrics {
    /// Step number (1-based).
    pub step: u64,
    /// The step's loss: mean cross-entropy per trained token (supervised) or mean DPO loss per
    /// pair.
    pub loss: f64,
    /// Assistant tokens trained on (supervised).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_tokens: Option<u64>,
    /// Mean `chosen_reward − rejected_reward` (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward_margin: Option<f64>,
    /// Share of pairs whose preferred response has the higher reward (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference_accuracy: Option<f64>,
    /// Mean summed log-prob of the preferred responses (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chosen_logprob: Option<f64>,
    /// Mean summed log-prob of the non-preferred responses (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_logprob: Option<f64>,
    /// Mean implicit reward `β (log π − log π_ref)` of the preferred responses (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chosen_reward: Option<f64>,
    /// Mean implicit reward of the non-preferred responses (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_reward: Option<f64>,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used for the step.
    pub learning_rate: f64,
    /// Tokens of the step's sequences (the job's `trained_tokens` is their sum).
    pub trained_tokens: u64,
    /// Seconds spent in forward, backward and optimizer.
    pub training_seconds: f64,
}

/// Validation results of a supervised or DPO job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuningEval {
    /// Step after which it ran.
    pub step: u64,
    /// Validation rows.
    pub examples: usize,
    /// Mean loss (supervised: per trained token; DPO: per pair).
    pub loss: f64,
    /// Share of trained tokens that are the argmax of the next-token logits (supervised).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_accuracy: Option<f64>,
    /// Share of pairs whose preferred response has the higher reward (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference_accuracy: Option<f64>,
    /// Mean reward margin (DPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward_margin: Option<f64>,
}

impl TuningMetrics {
    /// Records a DPO step's stats.
    fn record_dpo(&mut self, stats: &DpoStats) {
        self.loss = stats.loss;
        self.reward_margin = Some(stats.reward_margin);
        self.preference_accuracy = Some(stats.preference_accuracy);
        self.chosen_logprob = Some(stats.chosen_logprob);
        self.rejected_logprob = Some(stats.rejected_logprob);
        self.chosen_reward = Some(stats.chosen_reward);
        self.rejected_reward = Some(stats.rejected_reward);
    }
}

/// One evaluation of the validation file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Evaluation {
    /// Sampled and graded (reward, pass@k).
    Reinforcement(EvalMetrics),
    /// Scored against the file's targets (loss, accuracy).
    Tuning(TuningEval),
}

impl Evaluation {
    /// The step after which it ran.
    pub fn step(&self) -> u64 {
        match self {
            Evaluation::Reinforcement(e) => e.step,
            Evaluation::Tuning(e) => e.step,
        }
    }

    /// One line for the job's `eval` event.
    pub fn summary(&self) -> String {
        match self {
            Evaluation::Reinforcement(e) => {
                format!("step {}: validation pass@1 {:.3}", e.step, e.pass_at_1())
            }
            Evaluation::Tuning(e) => {
                let mut line = format!("step {}: validation loss {:.4}", e.step, e.loss);
                if let Some(accuracy) = e.token_accuracy {
                    line.push_str(&format!(", token accuracy {accuracy:.3}"));
                }
                if let Some(accuracy) = e.preference_accuracy {
                    line.push_str(&format!(", preference accuracy {accuracy:.3}"));
                }
                line
            }
        }
    }
}

/// A training or validation file: its name in errors (`training file file-…`) and its text.
pub type NamedText<'a> = (&'a str, &'a str);

impl Trainer {
    /// Builds the trainer of a supervised or DPO `method` for `loaded` on the training file and
    /// the optional validation file.
    pub fn tuning(
        method: &Method,
        loaded: crate::LoadedModel,
        train: NamedText<'_>,
        validation: Option<NamedText<'_>>,
        options: TrainerOptions,
    ) -> Result<Trainer> {
        let max_tokens = loaded.model.config.max_position_embeddings;
        let tokenizer = &loaded.tokenizer;
        let (objective, prompts) = match method.kind() {
            MethodKind::Supervised => {
                let (train_prompts, train) =
                    load_supervised(train.1, train.0, tokenizer, max_tokens)?;
                let (validation_prompts, validation) = match validation {
                    Some((name, text)) => {
                        let (prompts, rows) = load_supervised(text, name, tokenizer, max_tokens)?;
                        (Some(prompts), Some(rows))
                    }
                    None => (None, None),
                };
                let data = SupervisedData { train, validation };
                (Objective::Supervised(Box::new(data)), (train_prompts, validation_prompts))
            }
            MethodKind::Dpo => {
                let (train_prompts, train) =
                    load_preferences(train.1, train.0, tokenizer, max_tokens)?;
                let (validation_prompts, validation) = match validation {
                    Some((name, text)) => {
                        let (prompts, rows) = load_preferences(text, name, tokenizer, max_tokens)?;
                        (Some(prompts), Some(rows))
                    }
                    None => (None, None),
                };
                let beta = method.dpo_beta().unwrap_or(verity_core::spec::DPO_BETA);
                let data = PreferenceData { beta, train, validation, reference: None };
                (Objective::Dpo(Box::new(data)), (train_prompts, validation_prompts))
            }
            MethodKind::Reinforcement => {
                return Err(TrainerError::Config("a reinforcement job needs a grader".into()))
            }
        };
        let hp = method.training_hyperparameters();
        Trainer::with_objective(loaded.model, loaded.tokenizer, objective, hp, prompts, options)
    }

    /// Whether the step just taken is one to evaluate after (every `eval_interval` steps, and
    /// the last).
    pub fn eval_due(&self) -> bool {
        let interval = self.hp.eval_interval() as u64;
        self.finished() || (interval > 0 && self.step > 0 && self.step.is_multiple_of(interval))
    }

    /// Evaluates the current policy on the validation file (`None` without one): pass@k for
    /// reinforcement jobs ([`Trainer::evaluate`]), loss and accuracy for supervised and DPO ones.
    pub fn evaluation(&self) -> Result<Option<Evaluation>> {
        let pad = self.tokenizer.pad_id();
        match &self.objective {
            Objective::Reinforcement { .. } => Ok(self.evaluate()?.map(Evaluation::Reinforcement)),
            Objective::Supervised(data) => {
                let Some(validation) = &data.validation else { return Ok(None) };
                let (loss, accuracy) =
                    verity_kernels::on_pool(|| supervised_eval(&self.model, validation, pad))?;
                Ok(Some(Evaluation::Tuning(TuningEval {
                    step: self.step,
                    examples: validation.len(),
                    loss,
                    token_accuracy: Some(accuracy),
                    preference_accuracy: None,
                    reward_margin: None,
                })))
            }
            Objective::Dpo(data) => {
                let (Some(validation), Some(reference)) = (&data.validation, &data.reference)
                else {
                    return Ok(None);
                };
                let settings = (data.beta, self.pairs_per_micro_batch(), pad);
                let stats = verity_kernels::on_pool(|| {
                    dpo_eval(&self.model, validation, &reference.validation, settings)
                })?;
                Ok(Some(Evaluation::Tuning(TuningEval {
                    step: self.step,
                    examples: validation.len(),
                    loss: stats.loss,
                    token_accuracy: None,
                    preference_accuracy: Some(stats.preference_accuracy),
                    reward_margin: Some(stats.reward_margin),
                })))
            }
        }
    }

    /// Preference pairs per micro-batch (`micro_batch_size` counts sequences, two per pair).
    fn pairs_per_micro_batch(&self) -> usize {
        (self.hp.micro_batch_size / 2).max(1)
    }

    /// Computes the DPO reference log-probs from the current model when they are not cached:
    /// before the first update the policy is the start model, so no frozen copy is held. A
    /// checkpoint past step 0 without them cannot be resumed (the start model is gone).
    fn ensure_reference(&mut self) -> Result<()> {
        let micro = self.pairs_per_micro_batch();
        let pad = self.tokenizer.pad_id();
        let Objective::Dpo(data) = &mut self.objective else { return Ok(()) };
        if data.reference.is_some() {
            return Ok(());
        }
        if self.step > 0 {
            return Err(TrainerError::Config(format!(
                "the DPO reference log-probs are missing at step {}",
                self.step
            )));
        }
        let model = &self.model;
        let reference = verity_kernels::on_pool(|| -> Result<ReferenceLogprobs> {
            Ok(ReferenceLogprobs {
                train: sequence_logprobs(model, &data.train, micro, pad)?,
                validation: match &data.validation {
                    Some(pairs) => sequence_logprobs(model, pairs, micro, pad)?,
                    None => Vec::new(),
                },
            })
        })?;
        data.reference = Some(reference);
        Ok(())
    }

    /// One supervised or DPO step: `batch_size` rows in the data order, one accumulation pass
    /// of the method's loss over micro-batches, one clipped AdamW step; greedy samples when the
    /// step is an evaluation step.
    pub(super) fn tuning_step(&mut self) -> Result<StepOutput> {
        let step = self.step + 1;
        self.phase(super::phase::Phase::Training);
        self.ensure_reference()?;
        let started = Instant::now();
        let rows: Vec<usize> = (0..self.hp.batch_size()).map(|_| self.order.next_index()).collect();
        self.model.seed_lora_dropout(mix_seed(self.seed, &[self.step, 0xd407]));
        let (micro, pad) = (self.hp.micro_batch_size, self.tokenizer.pad_id());
        let mut metrics = TuningMetrics { step, ..TuningMetrics::default() };
        self.optimizer.zero_grad();
        let (model, optimizer) = (&self.model, &mut self.optimizer);
        match &self.objective {
            Objective::Supervised(data) => {
                let batch: Vec<&SupervisedExample> = rows.iter().map(|&i| &data.train[i]).collect();
                let update = verity_kernels::on_pool(|| {
                    supervised_backward(model, optimizer, &batch, micro, pad)
                })?;
                metrics.loss = update.loss;
                metrics.label_tokens = Some(update.label_tokens);
                metrics.trained_tokens = update.tokens;
            }
            Objective::Dpo(data) => {
                let reference = data.reference.as_ref().ok_or_else(|| {
                    TrainerError::Config("the DPO reference log-probs are missing".into())
                })?;
                let batch: Vec<(&PreferencePair, [f64; 2])> =
                    rows.iter().map(|&i| (&data.train[i], reference.train[i])).collect();
                let (stats, tokens) = verity_kernels::on_pool(|| {
                    dpo_backward(model, optimizer, &batch, (data.beta, micro, pad))
                })?;
                metrics.record_dpo(&stats);
                metrics.trained_tokens = tokens;
            }
            Objective::Reinforcement { .. } => {
                return Err(TrainerError::Config("a reinforcement job has no fixed targets".into()))
            }
        }
        let update = self.optimizer_step()?;
        metrics.grad_norm = update.grad_norm;
        metrics.learning_rate = update.lr;
        metrics.training_seconds = started.elapsed().as_secs_f64();
        self.step = step;
        let samples = if self.eval_due() { self.greedy_samples()? } else { Vec::new() };
        let common = StepMetrics {
            step,
            loss: metrics.loss,
            grad_norm: metrics.grad_norm,
            learning_rate: metrics.learning_rate,
            trained_tokens: metrics.trained_tokens,
            training_seconds: metrics.training_seconds,
            ..StepMetrics::default()
        };
        Ok(StepOutput { metrics: common, tuning: Some(metrics), samples })
    }

    /// The targets of the rows the samples show (validation rows, else training rows).
    fn sample_targets(&self) -> Vec<String> {
        match &self.objective {
            Objective::Supervised(data) => {
                let rows = data.validation.as_ref().unwrap_or(&data.train);
                rows.iter().map(|e| e.target.clone()).collect()
            }
            Objective::Dpo(data) => {
                let rows = data.validation.as_ref().unwrap_or(&data.train);
                rows.iter().map(|p| p.target.clone()).collect()
            }
            Objective::Reinforcement { .. } => Vec::new(),
        }
    }

    /// Greedy completions of the first [`SAMPLE_PROMPTS`] validation prompts (training prompts
    /// without a validation file), each beside its target.
    fn greedy_samples(&self) -> Result<Vec<SampleRecord>> {
        let rows = self.validation.as_ref().unwrap_or(&self.train);
        let examples = &rows.examples[..rows.len().min(SAMPLE_PROMPTS)];
        let prompts: Vec<Vec<u32>> = examples.iter().map(|e| e.prompt_ids.clone()).collect();
        let params = SamplingParams {
            seed: self.seed,
            ..SamplingParams::greedy(self.hp.max_completion_tokens())
        };
        let tokenizer = &self.tokenizer;
        let mut completions = sample(
            &self.model,
            &prompts,
            &params,
            &tokenizer.eos_token_ids,
            tokenizer.pad_id(),
            Some(tokenizer),
        )?;
        completions.sort_by_key(|c| c.prompt_index);
        let targets = self.sample_targets();
        completions
            .iter()
            .map(|c| {
                Ok(SampleRecord {
                    step: self.step,
                    idx: c.prompt_index,
                    prompt_idx: c.prompt_index,
                    row: None,
                    prompt: examples[c.prompt_index].prompt_text.clone(),
                    completion: tokenizer.decode(&c.token_ids, true)?,
                    score: 0.0,
                    per_grader: Default::default(),
                    reason: "greedy completion".into(),
                    grader_error: None,
                    reward: 0.0,
                    advantage: 0.0,
                    finish_reason: finish_reason_name(c.finish_reason).to_string(),
                    tokens: c.token_ids.len(),
                    reference: targets.get(c.prompt_index).cloned(),
                    episode: None,
                })
            })
            .collect()
    }
}
