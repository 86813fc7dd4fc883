//! Training and evaluation metrics: token entropy, pass@k, accuracy and the per-step record.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

use super::advantages::mean_and_population_std;
use super::error::{invalid_input, Result, TensorContext};
use super::loss::LossStats;

pub use super::tensor_ops::masked_mean;

/// Rows of logits processed at once by [`token_entropy`] unless the caller says otherwise.
pub const DEFAULT_ENTROPY_CHUNK_ROWS: usize = 256;

/// Entropy (nats) of the softmax of `logits` `[..., V]` at every position, shape `[...]`.
///
/// Works `chunk_rows` positions at a time so the softmax intermediates stay small; computes in
/// f32 (f64 for f64 input) and returns a detached tensor.
pub fn token_entropy(logits: &Tensor, chunk_rows: usize) -> Result<Tensor> {
    if chunk_rows == 0 {
        return Err(invalid_input("entropy chunk_rows must be at least 1"));
    }
    let dims = logits.dims();
    let Some((&vocab, leading)) = dims.split_last() else {
        return Err(invalid_input("logits must have a vocabulary dimension"));
    };
    if vocab == 0 {
        return Err(invalid_input("logits have an empty vocabulary dimension"));
    }
    let rows: usize = leading.iter().product();
    let compute_dtype = if logits.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let flat = logits.detach().reshape((rows, vocab)).ctx("flattening logits")?;
    let mut chunks = Vec::with_capacity(rows.div_ceil(chunk_rows));
    let mut start = 0;
    while start < rows {
        let length = chunk_rows.min(rows - start);
        let chunk = flat
            .narrow(0, start, length)
            .and_then(|chunk| chunk.to_dtype(compute_dtype))
            .ctx("slicing logits")?;
        chunks.push(chunk_entropy(&chunk)?);
        start += length;
    }
    if chunks.is_empty() {
        return Tensor::zeros(leading, compute_dtype, logits.device()).ctx("empty entropy");
    }
    Tensor::cat(&chunks, 0)
        .and_then(|entropy| entropy.reshape(leading))
        .ctx("joining entropy chunks")
}

/// `logsumexp(z) − Σ softmax(z)·z` for `[R, V]` logits shifted by their row maximum.
fn chunk_entropy(logits: &Tensor) -> Result<Tensor> {
    let shifted = logits
        .broadcast_sub(&logits.max_keepdim(D::Minus1).ctx("row maximum")?)
        .ctx("shifting logits")?;
    let exp = shifted.exp().ctx("exponentiating logits")?;
    let partition = exp.sum_keepdim(D::Minus1).ctx("partition function")?;
    let probabilities = exp.broadcast_div(&partition).ctx("softmax")?;
    let expected_logit = (probabilities * &shifted)
        .and_then(|weighted| weighted.sum(D::Minus1))
        .ctx("expected logit")?;
    partition
        .log()
        .and_then(|log_partition| log_partition.squeeze(D::Minus1))
        .and_then(|log_partition| log_partition - expected_logit)
        .ctx("entropy")
}

/// Unbiased pass@k from `n` samples of which `correct` are right: `1 − C(n−c, k) / C(n, k)`,
/// evaluated as a stable product.
pub fn pass_at_k(n: usize, correct: usize, k: usize) -> Result<f64> {
    if k == 0 || k > n {
        return Err(invalid_input(format!("pass@k needs 1 <= k <= n, got k={k}, n={n}")));
    }
    if correct > n {
        return Err(invalid_input(format!("{correct} correct out of only {n} samples")));
    }
    if n - correct < k {
        return Ok(1.0);
    }
    let all_wrong: f64 = ((n - correct + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    Ok(1.0 - all_wrong)
}

/// Mean pass@k over problems given as `(samples, correct)` pairs (0 for no problems).
pub fn mean_pass_at_k(problems: &[(usize, usize)], k: usize) -> Result<f64> {
    if problems.is_empty() {
        return Ok(0.0);
    }
    let mut total = 0.0;
    for &(n, correct) in problems {
        total += pass_at_k(n, correct, k)?;
    }
    Ok(total / problems.len() as f64)
}

/// Fraction of rewards at or above `success_threshold` (0 for no rewards).
pub fn accuracy(rewards: &[f64], success_threshold: f64) -> f64 {
    if rewards.is_empty() {
        return 0.0;
    }
    let successes = rewards.iter().filter(|&&reward| reward >= success_threshold).count();
    successes as f64 / rewards.len() as f64
}

/// Mean and population standard deviation of a set of rewards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardSummary {
    /// Mean reward.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
}

impl RewardSummary {
    /// Summarises `values` (zeros for an empty slice).
    pub fn from_values(values: &[f64]) -> Self {
        if values.is_empty() {
            return RewardSummary::default();
        }
        let (mean, std) = mean_and_population_std(values);
        RewardSummary { mean, std }
    }
}

/// One training step's metrics, one line of `jobs/{id}/metrics.jsonl` and one Postgres row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Step number (1-based).
    pub step: u64,
    /// Mean total reward over the step's completions.
    pub reward_mean: f64,
    /// Population std of the total reward.
    pub reward_std: f64,
    /// Reward mean/std per named grader.
    pub reward_per_grader: BTreeMap<String, RewardSummary>,
    /// Fraction of completions whose total reward reached the success threshold.
    pub accuracy: f64,
    /// Grader infrastructure failures (not wrong answers).
    pub grader_errors: u64,
    /// Mean completion length in tokens.
    pub completion_length_mean: f64,
    /// Longest completion in tokens.
    pub completion_length_max: u64,
    /// Fraction of completions cut off at `max_completion_tokens`.
    pub truncated_fraction: f64,
    /// Mean per-token policy entropy (nats).
    pub entropy: f64,
    /// Mean per-token k3 KL to the reference (0 when β = 0).
    pub kl: f64,
    /// Mean per-token KL between sampler and trainer log-probs.
    pub sampler_kl: f64,
    /// Optimizer steps between the weights that sampled the step's rollouts and the weights it
    /// trained (0 on-policy; 1 with the asynchronous pipeline, `max_staleness`).
    #[serde(default)]
    pub staleness: u64,
    /// Groups still decoding, carried to the next step (partial rollouts, else 0).
    #[serde(default)]
    pub groups_carried: u64,
    /// Fraction of tokens clipped below `1 − ε_low`.
    pub clip_fraction_low: f64,
    /// Fraction of tokens clipped above `1 + ε_high`.
    pub clip_fraction_high: f64,
    /// Mean importance ratio per token.
    pub ratio_mean: f64,
    /// Policy loss of the step (summed over micro-batches, averaged over inner epochs).
    pub loss: f64,
    /// Fraction of groups with all-equal rewards.
    pub zero_advantage_group_fraction: f64,
    /// Groups sampled to fill the batch (equals the batch size without dynamic sampling).
    pub groups_drawn: u64,
    /// Groups the step trained on: 0 when dynamic sampling kept no group with reward contrast
    /// (the step learnt nothing and its reward fields describe no completion).
    pub groups_kept: u64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used for the step.
    pub learning_rate: f64,
    /// Completion tokens generated per second of sampling.
    pub tokens_per_second: f64,
    /// Seconds spent sampling.
    pub sampling_seconds: f64,
    /// Seconds spent grading.
    pub grading_seconds: f64,
    /// Seconds spent in loss, backward and optimizer.
    pub training_seconds: f64,
    /// Prompt plus completion tokens of the completions the loss trained on this step (the
    /// job's `trained_tokens` is their sum).
    #[serde(default)]
    pub trained_tokens: u64,
    /// Completion tokens the policy generated this step: every completion sampled, those of
    /// groups dynamic sampling discarded included (what a job's `max_tokens` budget counts).
    #[serde(default)]
    pub generated_tokens: u64,
    /// Tool use of the step's episodes (jobs with an environment only).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub episodes: Option<crate::episodes::EpisodeMetrics>,
}

impl StepMetrics {
    /// Fills the reward fields from total rewards and per-grader scores.
    pub fn record_rewards(
        &mut self,
        total: &[f64],
        per_grader: &BTreeMap<String, Vec<f64>>,
        success_threshold: f64,
    ) {
        let summary = RewardSummary::from_values(total);
        self.reward_mean = summary.mean;
        self.reward_std = summary.std;
        self.accuracy = accuracy(total, success_threshold);
        self.reward_per_grader = per_grader
            .iter()
            .map(|(name, scores)| (name.clone(), RewardSummary::from_values(scores)))
            .collect();
    }

    /// Fills the completion length fields from token counts and truncation flags.
    pub fn record_completions(&mut self, lengths: &[usize], truncated: &[bool]) -> Result<()> {
        if lengths.len() != truncated.len() {
            return Err(invalid_input(format!(
                "{} completion lengths but {} truncation flags",
                lengths.len(),
                truncated.len()
            )));
        }
        if lengths.is_empty() {
            return Ok(());
        }
        let count = lengths.len() as f64;
        self.completion_length_mean = lengths.iter().sum::<usize>() as f64 / count;
        self.completion_length_max = lengths.iter().copied().max().unwrap_or(0) as u64;
        self.truncated_fraction = truncated.iter().filter(|&&cut| cut).count() as f64 / count;
        Ok(())
    }

    /// Fills the KL, clip, ratio and loss fields from merged loss statistics; `passes` is the
    /// number of optimisation passes (inner epochs) the statistics were merged over.
    pub fn record_loss_stats(&mut self, stats: &LossStats, passes: usize) {
        self.kl = stats.kl_mean();
        self.clip_fraction_low = stats.clip_fraction_low();
        self.clip_fraction_high = stats.clip_fraction_high();
        self.ratio_mean = stats.ratio_mean();
        self.loss = stats.loss_sum / passes.max(1) as f64;
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn entropy_matches_closed_forms_and_is_chunk_invariant() {
        let uniform = Tensor::zeros((2, 3, 8), DType::F32, &Device::Cpu).unwrap();
        let entropy = token_entropy(&uniform, 4).unwrap();
        assert_eq!(entropy.dims(), &[2, 3]);
        for row in entropy.to_vec2::<f32>().unwrap() {
            for value in row {
                assert!((value as f64 - 8f64.ln()).abs() < 1e-6);
            }
        }
        // Two tokens with probabilities 0.25 / 0.75, and a near-deterministic row with huge logits.
        let logits =
            Tensor::new(&[[0.0f64, 3f64.ln()], [1000.0, -1000.0], [-5.0, 7.0]], &Device::Cpu)
                .unwrap();
        let expected_first = -(0.25 * 0.25f64.ln() + 0.75 * 0.75f64.ln());
        for chunk_rows in [1, 2, 3, 100] {
            let entropy = token_entropy(&logits, chunk_rows).unwrap();
            let values = entropy.to_vec1::<f64>().unwrap();
            assert!((values[0] - expected_first).abs() < 1e-12);
            assert!(values[1].abs() < 1e-12 && values[1].is_finite());
            assert!(values[2] > 0.0 && values[2] < 1e-4);
        }
        let half = logits.to_dtype(DType::BF16).unwrap();
        assert_eq!(token_entropy(&half, 2).unwrap().dtype(), DType::F32);
        assert!(token_entropy(&logits, 0).is_err());
    }

    #[test]
    fn masked_mean_entropy_ignores_padding() {
        let logits = Tensor::new(&[[[0.0f32, 0.0], [0.0, 50.0]]], &Device::Cpu).unwrap();
        let entropy = token_entropy(&logits, 8).unwrap();
        let mask = Tensor::new(&[[1.0f32, 0.0]], &Device::Cpu).unwrap();
        let mean = masked_mean(&entropy, &mask).unwrap();
        assert!((mean - 2f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        fn binomial(n: u64, k: u64) -> f64 {
            if k > n {
                return 0.0;
            }
            (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
        }
        for (n, c, k) in [(10, 3, 1), (10, 3, 5), (16, 1, 4), (20, 0, 3), (5, 5, 5), (8, 2, 7)] {
            let expected = 1.0 - binomial((n - c) as u64, k as u64) / binomial(n as u64, k as u64);
            let actual = pass_at_k(n, c, k).unwrap();
            assert!((actual - expected).abs() < 1e-12, "n={n} c={c} k={k}");
        }
        assert!((pass_at_k(10, 3, 1).unwrap() - 0.3).abs() < 1e-12);
        // Large n stays finite and in range where C(n, k) would overflow.
        let large = pass_at_k(5000, 10, 1000).unwrap();
        assert!(large > 0.89 && large < 1.0, "{large}");
        assert!(pass_at_k(4, 1, 5).is_err());
        assert!(pass_at_k(4, 5, 1).is_err());
        assert!(pass_at_k(4, 1, 0).is_err());
        let mean = mean_pass_at_k(&[(4, 0), (4, 4)], 2).unwrap();
        assert!((mean - 0.5).abs() < 1e-12);
    }

    #[test]
    fn accuracy_and_reward_summaries() {
        assert_eq!(accuracy(&[1.0, 0.0, 0.5, 1.0], 1.0), 0.5);
        assert_eq!(accuracy(&[], 1.0), 0.0);
        let summary = RewardSummary::from_values(&[1.0, 0.0, 0.0, 1.0]);
        assert_eq!(summary, RewardSummary { mean: 0.5, std: 0.5 });
    }

    #[test]
    fn step_metrics_serialise_with_every_field() {
        let mut metrics = StepMetrics { step: 3, ..StepMetrics::default() };
        let per_grader = BTreeMap::from([("math".to_string(), vec![1.0, 0.0])]);
        metrics.record_rewards(&[1.0, 0.2], &per_grader, 1.0);
        metrics.record_completions(&[10, 64], &[false, true]).unwrap();
        assert!(metrics.record_completions(&[1], &[]).is_err());
        let stats = LossStats {
            tokens: 10.0,
            clipped_low_tokens: 1.0,
            clipped_high_tokens: 2.0,
            kl_sum: 0.5,
            ratio_sum: 10.0,
            ratio_min: 0.9,
            ratio_max: 1.1,
            loss_sum: 0.4,
        };
        metrics.record_loss_stats(&stats, 2);
        assert_eq!(metrics.accuracy, 0.5);
        assert_eq!(metrics.completion_length_max, 64);
        assert_eq!(metrics.truncated_fraction, 0.5);
        assert!((metrics.clip_fraction_high - 0.2).abs() < 1e-12);
        assert!((metrics.loss - 0.2).abs() < 1e-12);
        let json = serde_json::to_value(&metrics).unwrap();
        for field in [
            "step",
            "reward_mean",
            "reward_std",
            "reward_per_grader",
            "accuracy",
            "grader_errors",
            "completion_length_mean",
            "completion_length_max",
            "truncated_fraction",
            "entropy",
            "kl",
            "sampler_kl",
            "staleness",
            "groups_carried",
            "clip_fraction_low",
            "clip_fraction_high",
            "zero_advantage_group_fraction",
            "groups_drawn",
            "grad_norm",
            "learning_rate",
            "tokens_per_second",
            "sampling_seconds",
            "grading_seconds",
            "training_seconds",
            "trained_tokens",
            "generated_tokens",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["reward_per_grader"]["math"]["mean"], 0.5);
        let back: StepMetrics = serde_json::from_value(json).unwrap();
        assert_eq!(back, metrics);
    }
}
