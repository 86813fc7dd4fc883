//! The loss mask of trajectories: only the model's own tokens are trained on.

use candle_core::Tensor;

use crate::error::{Result, WorkerError};

/// Zeroes the `[N, T]` loss `mask` at every token the model did not sample: row `i`'s
/// `model_masks[i]` marks its model tokens (tool results and template tokens fed into an
/// episode are `false`); a row without one (a plain completion) is left as it is.
pub fn mask_tool_tokens(mask: &Tensor, model_masks: &[Option<&[bool]>]) -> Result<Tensor> {
    if model_masks.iter().all(Option::is_none) {
        return Ok(mask.clone());
    }
    let (rows, width) = mask.dims2()?;
    if model_masks.len() != rows {
        return Err(WorkerError::InvalidArgument(format!(
            "{} model masks for {rows} completions",
            model_masks.len()
        )));
    }
    let mut keep = vec![1f32; rows * width];
    for (i, model) in model_masks.iter().enumerate() {
        let Some(model) = model else { continue };
        for (t, &sampled) in model.iter().take(width).enumerate() {
            if !sampled {
                keep[i * width + t] = 0.0;
            }
        }
    }
    let keep = Tensor::from_vec(keep, (rows, width), mask.device())?.to_dtype(mask.dtype())?;
    Ok(mask.mul(&keep)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpo::{policy_loss, LossConfig, PolicyLossInputs, StepNormalizer};
    use candle_core::{Device, Var};

    /// The gradient of the policy loss reaches every model token of a trajectory and no fed
    /// (tool-output or template) token: the test fails if a tool token got gradient.
    #[test]
    fn tool_output_tokens_get_no_gradient() {
        let device = Device::Cpu;
        // Row 0: an episode (model, model, tool, tool, tool, model); row 1: a plain completion
        // of 4 tokens (padded to 6).
        let model_mask = [true, true, false, false, false, true];
        let lengths = [6usize, 4];
        let padded: Vec<f32> = lengths
            .iter()
            .flat_map(|&n| (0..6).map(move |t| if t < n { 1.0 } else { 0.0 }))
            .collect();
        let base = Tensor::from_vec(padded, (2, 6), &device).unwrap();
        let mask = mask_tool_tokens(&base, &[Some(&model_mask), None]).unwrap();
        let logp = Var::from_tensor(
            &Tensor::from_vec(
                vec![-0.5f32, -1.0, -0.2, -0.3, -0.4, -0.7, -0.1, -0.9, -1.1, -0.6, 0.0, 0.0],
                (2, 6),
                &device,
            )
            .unwrap(),
        )
        .unwrap();
        let old = logp.as_tensor().detach();
        let advantages = Tensor::new(&[1.0f32, -1.0], &device).unwrap();
        for loss in verity_core::spec::Loss::ALL {
            let hp = verity_core::spec::Hyperparameters { loss, ..Default::default() };
            let config = LossConfig::from_hyperparameters(&hp);
            let normalizer = StepNormalizer::from_masks([&mask]).unwrap();
            let inputs = PolicyLossInputs {
                logp: logp.as_tensor(),
                logp_old: &old,
                logp_ref: None,
                mask: &mask,
                advantages: &advantages,
                is_weights: None,
            };
            let output = policy_loss(&inputs, &config, &normalizer).unwrap();
            let grads = output.loss.backward().unwrap();
            let grad: Vec<Vec<f32>> = grads.get(logp.as_tensor()).unwrap().to_vec2().unwrap();
            for (t, &sampled) in model_mask.iter().enumerate() {
                if sampled {
                    assert!(grad[0][t] != 0.0, "{loss:?}: model token {t} got no gradient");
                } else {
                    assert_eq!(grad[0][t], 0.0, "{loss:?}: tool token {t} got gradient");
                }
            }
            assert!(grad[1][..4].iter().all(|&g| g != 0.0), "{loss:?}: plain rows unchanged");
            assert!(grad[1][4..].iter().all(|&g| g == 0.0), "{loss:?}: padding");
        }
    }
}
