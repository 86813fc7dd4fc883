//! Evaluation on the validation set: mean reward, pass@1 and pass@k (unbiased estimator), and
//! the first [`VALIDATION_SAMPLES_KEPT`] completions for the completions explorer.

use super::dataset::Dataset;
use super::error::Result;
use super::mix_seed;
use super::phase::{tell, Phase};
use super::rollout::Group;
use super::step::{SampleRecord, Trainer, SUCCESS_THRESHOLD};
use super::tuning::Objective;
use crate::grpo::metrics::mean_pass_at_k;
use crate::model::compact::RolloutDtype;
use crate::sampler::SamplingParams;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Validation results after a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    /// Step after which it ran.
    pub step: u64,
    /// Validation prompts.
    pub prompts: usize,
    /// Completions per prompt.
    pub samples_per_prompt: usize,
    /// Mean grader score over every completion.
    pub mean_reward: f64,
    /// `pass@k` for k = 1, 2, 4, … up to the samples per prompt (and that number itself).
    pub pass_at_k: BTreeMap<String, f64>,
    /// Failed gradings (excluded from the means).
    pub grader_errors: usize,
    /// The completions of the first validation rows, at most [`VALIDATION_SAMPLES_KEPT`]
    /// (stored as the step's validation samples, not in the metrics row).
    #[serde(skip)]
    pub samples: Vec<SampleRecord>,
}

/// Validation completions an evaluation keeps for the explorer: those of the first rows, every
/// completion of a row, whole rows only (at least one row).
pub const VALIDATION_SAMPLES_KEPT: usize = 32;

impl EvalMetrics {
    /// pass@1.
    pub fn pass_at_1(&self) -> f64 {
        self.pass_at_k.get("pass@1").copied().unwrap_or(0.0)
    }
}

/// The k values reported for `n` samples per prompt: 1, 2, 4, … up to `n`, and `n`.
pub fn ks(n: usize) -> Vec<usize> {
    let mut ks: Vec<usize> =
        std::iter::successors(Some(1usize), |k| Some(k * 2)).take_while(|&k| k <= n).collect();
    if ks.last() != Some(&n) {
        ks.push(n);
    }
    ks
}

impl Trainer {
    /// Evaluates the current policy on the validation set (`None` without one). Sampling uses
    /// the training temperature and a fixed seed, so evaluations are comparable across steps,
    /// and reads the f32 weights whatever `rollout_dtype` says: the metrics are those of the
    /// checkpoint a user downloads, not of the rollouts' low-precision copies.
    pub fn evaluate(&self) -> Result<Option<EvalMetrics>> {
        let Some(validation) = &self.validation else { return Ok(None) };
        let n = self.hp.eval_samples();
        let params = SamplingParams {
            rollout_dtype: RolloutDtype::F32,
            ..self.sampling_params(n, mix_seed(self.seed, &[0xe7a1]))
        };
        let examples: Vec<usize> = (0..validation.len()).collect();
        let total = examples.len();
        // One continuous batch over the whole validation set, as wide as a training step's
        // rollout (`max_batch_rows`, default B × G): a prompt joins as soon as rows are free.
        self.phase(Phase::Evaluating { done: 0, total });
        let phases = self.phases.clone();
        let sampled = move |done: usize| tell(phases.as_ref(), Phase::Evaluating { done, total });
        let mut rollout = self.rollout()?;
        rollout.phases = None; // the evaluation counts prompts, not sampling and grading
        rollout.sampled = Some(&sampled);
        let (groups, _) = rollout.run(&validation.examples, &examples, &params)?;
        self.phase(Phase::Evaluating { done: total, total });
        let summary = summarize_groups(&groups, n)?;
        let rows_kept = (VALIDATION_SAMPLES_KEPT / n.max(1)).max(1);
        let samples = self.validation_records(validation, &groups[..rows_kept.min(groups.len())]);
        Ok(Some(EvalMetrics {
            samples,
            step: self.step,
            prompts: validation.len(),
            samples_per_prompt: n,
            mean_reward: summary.mean_reward,
            pass_at_k: summary.pass_at_k,
            grader_errors: summary.grader_errors,
        }))
    }
}

impl Trainer {
    /// Sample records of validation `groups` (advantage 0: nothing trains on them).
    fn validation_records(&self, validation: &Dataset, groups: &[Group]) -> Vec<SampleRecord> {
        let name = match &self.objective {
            Objective::Reinforcement { name, .. } => name.as_str(),
            _ => "",
        };
        super::rollout::sample_records(
            self.step,
            groups,
            &validation.examples,
            name,
            &self.tokenizer,
        )
    }
}

/// What graded groups add up to: mean reward, unbiased pass@k and failed gradings.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSummary {
    /// Mean grader score over every successful grading.
    pub mean_reward: f64,
    /// `pass@k` for k = 1, 2, 4, … up to `n` (and `n`), over the prompts with at least k
    /// successful gradings.
    pub pass_at_k: BTreeMap<String, f64>,
    /// Failed gradings (excluded from the means).
    pub grader_errors: usize,
}

/// Summarises groups of `n` completions each: a completion passes at or above
/// [`SUCCESS_THRESHOLD`]; failed gradings count for neither side.
pub fn summarize_groups(groups: &[Group], n: usize) -> Result<GroupSummary> {
    let mut total = 0.0;
    let mut count = 0usize;
    let mut errors = 0usize;
    let mut problems = Vec::with_capacity(groups.len());
    for g in groups {
        let mut graded = 0;
        let mut correct = 0;
        for grade in &g.grades {
            if grade.is_error() {
                errors += 1;
                continue;
            }
            graded += 1;
            total += grade.score;
            count += 1;
            if grade.score >= SUCCESS_THRESHOLD {
                correct += 1;
            }
        }
        if graded > 0 {
            problems.push((graded, correct));
        }
    }
    let mut pass_at_k = BTreeMap::new();
    for k in ks(n) {
        let usable: Vec<(usize, usize)> =
            problems.iter().copied().filter(|&(graded, _)| graded >= k).collect();
        if !usable.is_empty() {
            pass_at_k.insert(format!("pass@{k}"), mean_pass_at_k(&usable, k)?);
        }
    }
    Ok(GroupSummary {
        mean_reward: if count > 0 { total / count as f64 } else { 0.0 },
        pass_at_k,
        grader_errors: errors,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reported_ks_are_powers_of_two_and_n() {
        assert_eq!(super::ks(1), vec![1]);
        assert_eq!(super::ks(4), vec![1, 2, 4]);
        assert_eq!(super::ks(6), vec![1, 2, 4, 6]);
    }
}
