//! Sampler-vs-trainer mismatch: the KL between the two log-prob sources and a truncated
//! importance-sampling (TIS) correction.
//!
//! The sampler (quantised, cached, batched) and the trainer compute slightly different
//! log-probabilities for the same tokens. The metric shows how far apart they are; the
//! correction reweights each token's policy term by `min(exp(logp_old_trainer − logp_sampler), C)`.

use candle_core::Tensor;

use super::error::{invalid_input, Result, TensorContext};
use super::tensor_ops::{check_dims, mask_predicate, masked_mean, token_dims, zero_outside};

/// Detached per-token weights `min(exp(logp_old_trainer − logp_sampler), cap)`, 0 where
/// `mask` is 0; pass them as `PolicyLossInputs::is_weights`.
pub fn truncated_is_weights(
    logp_old_trainer: &Tensor,
    logp_sampler: &Tensor,
    mask: &Tensor,
    cap: f64,
) -> Result<Tensor> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(invalid_input(format!("TIS cap must be finite and > 0, got {cap}")));
    }
    let log_weight = masked_log_ratio(logp_old_trainer, logp_sampler, mask)?;
    let weights = log_weight
        .exp()
        .and_then(|weights| weights.clamp(0.0, cap))
        .ctx("truncating IS weights")?;
    zero_outside(&weights, &mask_predicate(mask)?).map(|weights| weights.detach())
}

/// Mean per-token KL(sampler ‖ trainer) over unmasked tokens, estimated on the sampled tokens
/// with the non-negative k3 estimator `r − 1 − log r`, `r = p_trainer / p_sampler`.
pub fn sampler_trainer_kl(
    logp_sampler: &Tensor,
    logp_trainer: &Tensor,
    mask: &Tensor,
) -> Result<f64> {
    let log_ratio = masked_log_ratio(logp_trainer, logp_sampler, mask)?;
    let k3 = log_ratio
        .exp()
        .and_then(|ratio| ratio - &log_ratio)
        .and_then(|kl| kl.affine(1.0, -1.0))
        .ctx("k3 estimator")?;
    masked_mean(&k3, mask)
}

/// `numerator − denominator` (detached), 0 at masked positions; validates the shapes.
fn masked_log_ratio(numerator: &Tensor, denominator: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (responses, steps) = token_dims(numerator, "trainer log-probs")?;
    check_dims(denominator, &[responses, steps], "sampler log-probs")?;
    check_dims(mask, &[responses, steps], "mask")?;
    let denominator = denominator.detach().to_dtype(numerator.dtype()).ctx("casting log-probs")?;
    let difference = (numerator.detach() - denominator).ctx("log ratio")?;
    zero_outside(&difference, &mask_predicate(mask)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    fn matrix(rows: &[Vec<f64>]) -> Tensor {
        Tensor::new(rows.to_vec(), &Device::Cpu).unwrap()
    }

    #[test]
    fn weights_are_truncated_ratios_and_zero_on_padding() {
        let trainer = matrix(&[vec![-1.0, -0.5, f64::NEG_INFINITY]]);
        let sampler = matrix(&[vec![-1.2, -3.0, -1.0]]);
        let mask = matrix(&[vec![1.0, 1.0, 0.0]]);
        let weights = truncated_is_weights(&trainer, &sampler, &mask, 2.0).unwrap();
        let weights = weights.to_vec2::<f64>().unwrap();
        assert!((weights[0][0] - 0.2f64.exp()).abs() < 1e-12);
        assert_eq!(weights[0][1], 2.0);
        assert_eq!(weights[0][2], 0.0);
        assert!(truncated_is_weights(&trainer, &sampler, &mask, 0.0).is_err());
    }

    #[test]
    fn kl_is_zero_for_identical_log_probs_and_positive_otherwise() {
        let logp = matrix(&[vec![-1.0, -2.0], vec![-0.3, -7.0]]);
        let mask = matrix(&[vec![1.0, 1.0], vec![1.0, 0.0]]);
        assert_eq!(sampler_trainer_kl(&logp, &logp, &mask).unwrap(), 0.0);
        let shifted = matrix(&[vec![-1.1, -2.0], vec![-0.3, 100.0]]);
        let kl = sampler_trainer_kl(&logp, &shifted, &mask).unwrap();
        // One token of three differs by log r = −0.1: (e^{−0.1} − 1 + 0.1) / 3.
        let expected = ((-0.1f64).exp() - 1.0 + 0.1) / 3.0;
        assert!((kl - expected).abs() < 1e-12, "{kl} vs {expected}");
        let wrong = matrix(&[vec![-1.0]]);
        assert!(sampler_trainer_kl(&logp, &wrong, &mask).is_err());
    }
}
