//! The GRPO-family policy loss, one function switched by [`Loss`] (the job spec's loss family,
//! whose defaults live with it in `verity_core::spec`).
//!
//! Per-token terms (all responses share their advantage `A_i` over their tokens):
//! - `grpo`, `dapo`, `dr_grpo`: `−min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)` with `ρ = exp(logp − logp_old)`;
//! - `gspo`: the same with one length-normalised ratio per response, `exp(mean_t(logp − logp_old))`;
//! - `cispo`: `−sg(clip(ρ, 1−ε_low, 1+ε_high))·A·logp`;
//! - plus `β·(exp(ref − logp) − (ref − logp) − 1)` (k3 KL) when `β > 0`.
//!
//! Aggregation (the normaliser is global to the optimisation step, see [`StepNormalizer`], so the
//! micro-batch losses of a step sum to the full-batch loss and their gradients to its gradient):
//! - `grpo`: per-response token mean, summed, divided by the step's number of responses (a fully
//!   masked response, e.g. a masked truncated one, contributes 0 but still counts, as in TRL);
//! - `dapo`, `gspo`, `cispo`: token sum divided by the step's number of unmasked tokens;
//! - `dr_grpo`: token sum divided by `N × max_completion_tokens` (N = the step's responses).

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use verity_core::spec::Hyperparameters;
pub use verity_core::spec::Loss;

use super::error::{invalid_input, GrpoError, Result, TensorContext};
use super::tensor_ops::{check_dims, mask_predicate, to_rows, token_dims, zero_outside};

/// Hyperparameters of the policy loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossConfig {
    /// The loss variant.
    pub mode: Loss,
    /// Lower clip range: ratios below `1 − epsilon_low` are clipped.
    pub epsilon_low: f64,
    /// Upper clip range: ratios above `1 + epsilon_high` are clipped.
    pub epsilon_high: f64,
    /// Weight of the k3 KL penalty to the reference policy (0 disables it and `logp_ref`).
    pub beta: f64,
    /// Completion length limit; the `dr_grpo` normaliser is `N × max_completion_tokens`.
    pub max_completion_tokens: usize,
    /// Cap `C` of the truncated importance-sampling correction for sampler-vs-trainer mismatch
    /// (`None` disables it); see [`super::mismatch::truncated_is_weights`].
    pub tis_cap: Option<f64>,
}

impl LossConfig {
    /// The loss's defaults ([`Loss::default_clip_range`]), β = 0, no truncated IS correction.
    pub fn for_mode(mode: Loss, max_completion_tokens: usize) -> Self {
        let (epsilon_low, epsilon_high) = mode.default_clip_range();
        LossConfig {
            mode,
            epsilon_low,
            epsilon_high,
            beta: 0.0,
            max_completion_tokens,
            tis_cap: None,
        }
    }

    /// The loss configuration a job's hyperparameters describe (defaults filled in by the spec).
    pub fn from_hyperparameters(hp: &Hyperparameters) -> Self {
        let (epsilon_low, epsilon_high) = hp.clip_range();
        LossConfig {
            mode: hp.loss,
            epsilon_low,
            epsilon_high,
            beta: hp.beta,
            max_completion_tokens: hp.max_completion_tokens(),
            tis_cap: hp.tis_cap,
        }
    }

    /// The ratio's clamp range `(1 − ε_low, 1 + ε_high)`.
    fn ratio_bounds(&self) -> (f64, f64) {
        (1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
    }

    /// Checks every field's range, naming the offending one.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(GrpoError::InvalidConfig(message));
        if !(self.epsilon_low.is_finite() && (0.0..=1.0).contains(&self.epsilon_low)) {
            return bad(format!("epsilon_low must be in [0, 1], got {}", self.epsilon_low));
        }
        if !(self.epsilon_high.is_finite() && self.epsilon_high >= 0.0) {
            return bad(format!("epsilon_high must be finite and >= 0, got {}", self.epsilon_high));
        }
        if !(self.beta.is_finite() && self.beta >= 0.0) {
            return bad(format!("beta must be finite and >= 0, got {}", self.beta));
        }
        if self.max_completion_tokens == 0 {
            return bad("max_completion_tokens must be at least 1".to_string());
        }
        if let Some(cap) = self.tis_cap {
            if !(cap.is_finite() && cap > 0.0) {
                return bad(format!("tis_cap must be finite and > 0, got {cap}"));
            }
        }
        Ok(())
    }
}

/// Step-global counts that make micro-batch losses add up to the full-step loss.
///
/// Build it once per optimisation pass over all responses of the step (all micro-batches), then
/// pass the same value for every micro-batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepNormalizer {
    /// Number of responses in the step (all micro-batches).
    pub total_responses: usize,
    /// Number of unmasked completion tokens in the step (all micro-batches).
    pub total_tokens: f64,
}

impl StepNormalizer {
    /// Counts responses and unmasked tokens over the masks of all micro-batches of a step.
    pub fn from_masks<'a>(masks: impl IntoIterator<Item = &'a Tensor>) -> Result<Self> {
        let mut normalizer = StepNormalizer { total_responses: 0, total_tokens: 0.0 };
        for mask in masks {
            let (responses, _) = token_dims(mask, "mask")?;
            let tokens = mask
                .ne(0.0)
                .and_then(|present| present.to_dtype(DType::F64))
                .and_then(|present| present.sum_all())
                .and_then(|sum| sum.to_scalar::<f64>())
                .ctx("counting mask tokens")?;
            normalizer.total_responses += responses;
            normalizer.total_tokens += tokens;
        }
        Ok(normalizer)
    }

    /// The denominator of the token sum for the token-level modes (`dapo`, `gspo`, `cispo`,
    /// `dr_grpo`); `grpo` divides per-response means by `total_responses` instead.
    fn token_denominator(&self, config: &LossConfig) -> f64 {
        match config.mode {
            Loss::DrGrpo => (self.total_responses * config.max_completion_tokens) as f64,
            _ => self.total_tokens,
        }
        .max(1.0)
    }
}

/// The per-micro-batch inputs of [`policy_loss`]; all per-token tensors are `[N, T]`.
#[derive(Debug, Clone, Copy)]
pub struct PolicyLossInputs<'a> {
    /// Current policy log-probs of the sampled tokens (carries the gradient).
    pub logp: &'a Tensor,
    /// Log-probs under the policy that generated the samples, recomputed by the trainer.
    pub logp_old: &'a Tensor,
    /// Reference-policy log-probs; required when `beta > 0`, ignored otherwise.
    pub logp_ref: Option<&'a Tensor>,
    /// 1 for completion tokens that count, 0 for padding and masked (e.g. truncated) samples.
    pub mask: &'a Tensor,
    /// One advantage per response, `[N]`.
    pub advantages: &'a Tensor,
    /// Optional detached per-token weights multiplying the policy term (truncated IS).
    pub is_weights: Option<&'a Tensor>,
}

/// The loss of one micro-batch and its statistics.
#[derive(Debug, Clone)]
pub struct PolicyLossOutput {
    /// Scalar loss to minimise (this micro-batch's share of the step loss).
    pub loss: Tensor,
    /// Token statistics of this micro-batch; merge them across micro-batches.
    pub stats: LossStats,
}

/// Token-level sums that merge across micro-batches into step statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossStats {
    /// Unmasked tokens seen.
    pub tokens: f64,
    /// Tokens whose ratio was clipped below `1 − ε_low` (with negative advantage; for cispo,
    /// any token whose IS weight was truncated from below).
    pub clipped_low_tokens: f64,
    /// Tokens whose ratio was clipped above `1 + ε_high` (with positive advantage; for cispo,
    /// any token whose IS weight was truncated from above).
    pub clipped_high_tokens: f64,
    /// Sum of the per-token k3 KL to the reference (0 when β = 0).
    pub kl_sum: f64,
    /// Sum of the per-token importance ratios the mode uses (sequence ratio for gspo).
    pub ratio_sum: f64,
    /// Smallest ratio seen (+∞ when no tokens).
    pub ratio_min: f64,
    /// Largest ratio seen (−∞ when no tokens).
    pub ratio_max: f64,
    /// Sum of the micro-batch loss values (equals the step loss after merging all).
    pub loss_sum: f64,
}

impl Default for LossStats {
    fn default() -> Self {
        LossStats {
            tokens: 0.0,
            clipped_low_tokens: 0.0,
            clipped_high_tokens: 0.0,
            kl_sum: 0.0,
            ratio_sum: 0.0,
            ratio_min: f64::INFINITY,
            ratio_max: f64::NEG_INFINITY,
            loss_sum: 0.0,
        }
    }
}

impl LossStats {
    /// Adds another micro-batch's statistics into these.
    pub fn merge(&mut self, other: &LossStats) {
        self.tokens += other.tokens;
        self.clipped_low_tokens += other.clipped_low_tokens;
        self.clipped_high_tokens += other.clipped_high_tokens;
        self.kl_sum += other.kl_sum;
        self.ratio_sum += other.ratio_sum;
        self.ratio_min = self.ratio_min.min(other.ratio_min);
        self.ratio_max = self.ratio_max.max(other.ratio_max);
        self.loss_sum += other.loss_sum;
    }

    /// Fraction of tokens clipped low (0 when no tokens).
    pub fn clip_fraction_low(&self) -> f64 {
        self.per_token(self.clipped_low_tokens)
    }

    /// Fraction of tokens clipped high (0 when no tokens).
    pub fn clip_fraction_high(&self) -> f64 {
        self.per_token(self.clipped_high_tokens)
    }

    /// Mean k3 KL to the reference per token (0 when no tokens).
    pub fn kl_mean(&self) -> f64 {
        self.per_token(self.kl_sum)
    }

    /// Mean importance ratio per token (1 when no tokens).
    pub fn ratio_mean(&self) -> f64 {
        if self.tokens > 0.0 {
            self.ratio_sum / self.tokens
        } else {
            1.0
        }
    }

    fn per_token(&self, sum: f64) -> f64 {
        if self.tokens > 0.0 {
            sum / self.tokens
        } else {
            0.0
        }
    }
}

/// Validated, sanitised views of the inputs in the dtype of `logp`.
struct PreparedInputs {
    logp: Tensor,
    logp_old: Tensor,
    logp_ref: Option<Tensor>,
    mask: Tensor,
    advantages: Tensor,
    is_weights: Option<Tensor>,
}

fn prepare(inputs: &PolicyLossInputs<'_>, config: &LossConfig) -> Result<PreparedInputs> {
    let (responses, steps) = token_dims(inputs.logp, "logp")?;
    let dtype = inputs.logp.dtype();
    if !dtype.is_float() {
        return Err(invalid_input(format!("logp must be a float tensor, got {dtype:?}")));
    }
    let dims = [responses, steps];
    check_dims(inputs.logp_old, &dims, "logp_old")?;
    check_dims(inputs.mask, &dims, "mask")?;
    check_dims(inputs.advantages, &[responses], "advantages")?;
    if let Some(weights) = inputs.is_weights {
        check_dims(weights, &dims, "is_weights")?;
    }
    let logp_ref = match (config.beta > 0.0, inputs.logp_ref) {
        (true, None) => return Err(invalid_input("beta > 0 needs logp_ref")),
        (true, Some(reference)) => {
            check_dims(reference, &dims, "logp_ref")?;
            Some(reference)
        }
        (false, _) => None,
    };
    let cast = |tensor: &Tensor| tensor.detach().to_dtype(dtype).ctx("casting an input");
    let present = mask_predicate(inputs.mask)?;
    let sanitized = |tensor: Tensor| zero_outside(&tensor, &present);
    Ok(PreparedInputs {
        logp: sanitized(inputs.logp.clone())?,
        logp_old: sanitized(cast(inputs.logp_old)?)?,
        logp_ref: logp_ref.map(|reference| sanitized(cast(reference)?)).transpose()?,
        mask: cast(inputs.mask)?,
        advantages: cast(inputs.advantages)?.reshape((responses, 1)).ctx("reshaping advantages")?,
        is_weights: inputs.is_weights.map(|weights| sanitized(cast(weights)?)).transpose()?,
    })
}

/// PPO's per-token term `−min(ρ·A, clamp(ρ, low, high)·A)`, broadcasting `A` (`[N, 1]` or
/// `[N, T]`) over `ratio`.
pub(crate) fn clipped_surrogate(
    ratio: &Tensor,
    advantages: &Tensor,
    (low, high): (f64, f64),
) -> Result<Tensor> {
    let unclipped = ratio.broadcast_mul(advantages).ctx("ratio × advantage")?;
    let clipped = ratio
        .clamp(low, high)
        .and_then(|clipped| clipped.broadcast_mul(advantages))
        .ctx("clipped ratio × advantage")?;
    unclipped
        .minimum(&clipped)
        .and_then(|surrogate| surrogate.neg())
        .ctx("taking the pessimistic surrogate")
}

/// CISPO's per-token term `−sg(clamp(ρ, low, high))·A·log p`, broadcasting `A` (`[N, 1]` or
/// `[N, T]`): the clipped ratio weighs the gradient of `log p` and carries none itself.
pub(crate) fn cispo_term(
    ratio: &Tensor,
    logp: &Tensor,
    advantages: &Tensor,
    (low, high): (f64, f64),
) -> Result<Tensor> {
    let weight = ratio.clamp(low, high).ctx("clipping the IS weight")?.detach();
    weight
        .mul(logp)
        .and_then(|weighted| weighted.broadcast_mul(advantages))
        .and_then(|objective| objective.neg())
        .ctx("cispo term")
}

/// Per-response unmasked token counts `[N, 1]`, at least 1 so empty responses divide safely.
fn response_lengths(mask: &Tensor) -> Result<Tensor> {
    mask.sum_keepdim(1).and_then(|lengths| lengths.maximum(1.0)).ctx("counting response lengths")
}

/// Per-token policy term `[N, T]` and the ratio the mode uses, broadcast to `[N, T]`.
fn policy_term(prepared: &PreparedInputs, config: &LossConfig) -> Result<(Tensor, Tensor)> {
    let log_ratio = (&prepared.logp - &prepared.logp_old).ctx("log ratio")?;
    match config.mode {
        Loss::Grpo | Loss::Dapo | Loss::DrGrpo => {
            let ratio = log_ratio.exp().ctx("ratio")?;
            let term = clipped_surrogate(&ratio, &prepared.advantages, config.ratio_bounds())?;
            Ok((term, ratio))
        }
        Loss::Gspo => {
            let lengths = response_lengths(&prepared.mask)?;
            let mean_log_ratio = log_ratio
                .mul(&prepared.mask)
                .and_then(|masked| masked.sum_keepdim(1))
                .and_then(|sum| sum.div(&lengths))
                .ctx("sequence log ratio")?;
            let ratio = mean_log_ratio.exp().ctx("sequence ratio")?;
            let term = clipped_surrogate(&ratio, &prepared.advantages, config.ratio_bounds())?;
            let shape = prepared.logp.shape();
            let term = term.broadcast_as(shape).ctx("expanding the sequence term")?;
            let ratio = ratio.broadcast_as(shape).ctx("expanding the sequence ratio")?;
            Ok((term, ratio))
        }
        Loss::Cispo => {
            let ratio = log_ratio.exp().ctx("ratio")?;
            let term =
                cispo_term(&ratio, &prepared.logp, &prepared.advantages, config.ratio_bounds())?;
            Ok((term, ratio))
        }
    }
}

/// Per-token k3 KL `exp(ref − logp) − (ref − logp) − 1`.
fn k3_kl(logp: &Tensor, logp_ref: &Tensor) -> Result<Tensor> {
    let difference = (logp_ref - logp).ctx("ref − logp")?;
    difference
        .exp()
        .and_then(|exp| exp - &difference)
        .and_then(|kl| kl.affine(1.0, -1.0))
        .ctx("k3 KL")
}

/// This micro-batch's share of the step's policy loss (see the module docs) and its statistics.
///
/// `logp` carries the gradient; every other input is treated as a constant. Padding positions
/// (mask 0) may hold any value, including −∞. With one micro-batch and
/// `StepNormalizer::from_masks([mask])` this is the full-batch loss.
pub fn policy_loss(
    inputs: &PolicyLossInputs<'_>,
    config: &LossConfig,
    normalizer: &StepNormalizer,
) -> Result<PolicyLossOutput> {
    config.validate()?;
    let prepared = prepare(inputs, config)?;
    let (mut per_token, ratio) = policy_term(&prepared, config)?;
    if let Some(weights) = &prepared.is_weights {
        per_token = per_token.mul(weights).ctx("applying IS weights")?;
    }
    let kl = match &prepared.logp_ref {
        Some(reference) => {
            let kl = k3_kl(&prepared.logp, reference)?;
            per_token = (per_token + kl.affine(config.beta, 0.0).ctx("β × KL")?)
                .ctx("adding the KL penalty")?;
            Some(kl)
        }
        None => None,
    };
    let masked = per_token.mul(&prepared.mask).ctx("masking the loss")?;
    let lengths = response_lengths(&prepared.mask)?;
    let loss = match config.mode {
        Loss::Grpo => masked
            .sum_keepdim(1)
            .and_then(|sums| sums.div(&lengths))
            .and_then(|means| means.sum_all())
            .and_then(|sum| sum.affine(1.0 / normalizer.total_responses.max(1) as f64, 0.0))
            .ctx("grpo aggregation")?,
        _ => masked
            .sum_all()
            .and_then(|sum| sum.affine(1.0 / normalizer.token_denominator(config), 0.0))
            .ctx("token-level aggregation")?,
    };
    let stats = collect_stats(&prepared, config, &ratio, kl.as_ref(), &loss)?;
    Ok(PolicyLossOutput { loss, stats })
}

fn collect_stats(
    prepared: &PreparedInputs,
    config: &LossConfig,
    ratio: &Tensor,
    kl: Option<&Tensor>,
    loss: &Tensor,
) -> Result<LossStats> {
    let mask = to_rows(&prepared.mask)?;
    let ratio = to_rows(ratio)?;
    let kl = kl.map(to_rows).transpose()?;
    let advantages = prepared
        .advantages
        .detach()
        .to_dtype(DType::F64)
        .and_then(|advantages| advantages.flatten_all())
        .and_then(|advantages| advantages.to_vec1::<f64>())
        .ctx("copying advantages")?;
    let (low, high) = config.ratio_bounds();
    let sign_gated = config.mode != Loss::Cispo;
    let mut stats = LossStats {
        loss_sum: loss
            .detach()
            .to_dtype(DType::F64)
            .and_then(|loss| loss.to_scalar::<f64>())
            .ctx("reading the loss")?,
        ..LossStats::default()
    };
    for (row, mask_row) in mask.iter().enumerate() {
        let advantage = advantages[row];
        for (column, &weight) in mask_row.iter().enumerate() {
            if weight == 0.0 {
                continue;
            }
            let value = ratio[row][column];
            stats.tokens += 1.0;
            stats.ratio_sum += value;
            stats.ratio_min = stats.ratio_min.min(value);
            stats.ratio_max = stats.ratio_max.max(value);
            if value < low && (!sign_gated || advantage < 0.0) {
                stats.clipped_low_tokens += 1.0;
            }
            if value > high && (!sign_gated || advantage > 0.0) {
                stats.clipped_high_tokens += 1.0;
            }
            if let Some(kl) = &kl {
                stats.kl_sum += kl[row][column];
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
#[path = "loss_tests.rs"]
mod tests;
