//! Tinker's built-in losses, token by token and summed (no normalisation: a datum's weights or
//! advantages carry any the caller wants). PPO's and CISPO's terms are the GRPO family's own
//! ([`crate::grpo::loss`]); only the aggregation differs.

use super::Result;
use crate::grpo::loss::{cispo_term, clipped_surrogate};
use candle_core::{DType, Device, Tensor};
use verity_core::tinker::training::{Datum, ForwardBackward, LossFn};

/// Each datum's per-position loss, `(datums, max_len)`, zero past each datum's end: the call's
/// loss is its sum. `logprobs` are the targets' log-probabilities under the current weights
/// (carrying the gradient), laid out as [`crate::Transformer::next_token_logprobs`] returns
/// them, `mask` 1 on real positions.
pub fn datum_losses(call: &ForwardBackward, logprobs: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (rows, width) = logprobs.dims2()?;
    let device = logprobs.device();
    let logp = logprobs.to_dtype(DType::F32)?;
    let grid = |pick: fn(&Datum) -> Option<&Vec<f32>>, missing: f32| -> Result<Tensor> {
        padded(call, rows, width, device, pick, missing)
    };
    // The sampled-to-current ratio ρ and the advantages, for the policy-gradient losses.
    let policy = || -> Result<(Tensor, Tensor)> {
        let sampled = grid(|d| d.logprobs.as_ref(), 0.0)?;
        let ratio = (&logp - &sampled)?.exp()?;
        Ok((ratio, grid(|d| d.advantages.as_ref(), 0.0)?))
    };
    let bounds = (call.clip.low, call.clip.high);
    let per_token = match call.loss_fn {
        LossFn::CrossEntropy => logp.mul(&grid(|d| d.weights.as_ref(), 1.0)?)?.neg()?,
        LossFn::ImportanceSampling => {
            let (ratio, advantages) = policy()?;
            ratio.mul(&advantages)?.neg()?
        }
        LossFn::Ppo => {
            let (ratio, advantages) = policy()?;
            clipped_surrogate(&ratio, &advantages, bounds)?
        }
        LossFn::Cispo => {
            let (ratio, advantages) = policy()?;
            cispo_term(&ratio, &logp, &advantages, bounds)?
        }
    };
    Ok(per_token.mul(&mask.to_dtype(DType::F32)?)?)
}

/// One of the datums' per-position inputs as a `(rows, width)` grid: `missing` where a datum
/// lacks it, 0 past each datum's end.
fn padded(
    call: &ForwardBackward,
    rows: usize,
    width: usize,
    device: &Device,
    pick: fn(&Datum) -> Option<&Vec<f32>>,
    missing: f32,
) -> Result<Tensor> {
    let mut grid = vec![0f32; rows * width];
    for (i, datum) in call.data.iter().enumerate() {
        let row = &mut grid[i * width..i * width + datum.tokens.len()];
        match pick(datum) {
            Some(values) => row.copy_from_slice(values),
            None => row.fill(missing),
        }
    }
    Ok(Tensor::from_vec(grid, (rows, width), device)?)
}
