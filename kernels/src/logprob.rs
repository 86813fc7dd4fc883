//! Per-token log-probabilities `log softmax(h W^T / T)[target]` fused with the LM head,
//! computed over chunks of tokens so the `tokens x vocab` logits never exist in full.
//! The backward recomputes each chunk's logits instead of storing them.
//!
//! **Vocabulary masks** (constrained decoding): a row may carry the set of tokens the sampler was
//! allowed to pick ([`VocabMask`]); its distribution is then the softmax over those tokens only,
//! as the sampler drew from it. Masked-out tokens get probability 0, take no part in the
//! entropy and receive no gradient.

use super::{f32_slice, use_cpu_kernel, with_f32};
use candle_core::{bail, CpuStorage, CustomOp2, Device, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

/// Logits held in memory at once (rows x vocab floats) by the chunked kernel.
const CHUNK_FLOATS: usize = 1 << 22;

/// The tokens a row's distribution is restricted to: bit `t % 32` of word `t / 32` is set when
/// token `t` is allowed (the layout of llguidance's token sets).
pub type VocabMask = Arc<[u32]>;

/// Whether `mask` allows token `t` (ids past the mask's end are not allowed).
pub fn mask_allows(mask: &[u32], t: usize) -> bool {
    mask.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1)
}

/// What a masked-out logit becomes once scaled by the temperature: far below any real logit,
/// yet finite, so that `p · z` stays 0 rather than NaN.
const MASKED_LOGIT: f32 = -1e30;

/// Log-probabilities and entropies of `targets` under `softmax(hidden @ weight^T / temperature)`.
///
/// `hidden` is `(N, d)`, `weight` (the LM head) `(V, d)`, `targets` has N ids. Returns `(N, 2)`:
/// column 0 the log-probability (differentiable in `hidden` and `weight`), column 1 the entropy
/// of the whole distribution (no gradient flows through it).
pub fn token_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    temperature: f32,
) -> Result<Tensor> {
    token_logprobs_masked(hidden, weight, targets, &[], temperature)
}

/// [`token_logprobs`] where row `i`'s distribution is restricted to `masks[i]` when it is set
/// (`masks` is empty or has one entry per target).
pub fn token_logprobs_masked(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    masks: &[Option<VocabMask>],
    temperature: f32,
) -> Result<Tensor> {
    if temperature.is_nan() || temperature <= 0.0 {
        bail!("token_logprobs: temperature must be > 0, got {temperature}");
    }
    check_masks(targets, masks)?;
    if use_cpu_kernel(hidden) {
        let op = TokenLogprobs {
            targets: Arc::new(targets.to_vec()),
            masks: Arc::new(masks.to_vec()),
            inv_temp: 1.0 / temperature,
        };
        hidden.contiguous()?.apply_op2(&weight.contiguous()?, op)
    } else {
        token_logprobs_reference_masked(hidden, weight, targets, masks, temperature)
    }
}

/// Refuses masks that do not pair with the targets, or that rule out their own target.
fn check_masks(targets: &[u32], masks: &[Option<VocabMask>]) -> Result<()> {
    if !masks.is_empty() && masks.len() != targets.len() {
        bail!("token_logprobs: {} masks for {} targets", masks.len(), targets.len());
    }
    for (i, (mask, &t)) in masks.iter().zip(targets).enumerate() {
        if mask.as_ref().is_some_and(|m| !mask_allows(m, t as usize)) {
            bail!("token_logprobs: target {t} of row {i} is outside the row's mask");
        }
    }
    Ok(())
}

/// The same function composed of plain candle ops (materialises all logits; the test reference
/// and the device path). The product runs in the inputs' dtype; the logits are turned into f32
/// before the log-softmax, so log-probabilities and entropies are always f32.
pub fn token_logprobs_reference(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    temperature: f32,
) -> Result<Tensor> {
    token_logprobs_reference_masked(hidden, weight, targets, &[], temperature)
}

/// [`token_logprobs_masked`] composed of plain candle ops: masked-out logits are pushed far down
/// by an added bias before the log-softmax.
pub fn token_logprobs_reference_masked(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &[u32],
    masks: &[Option<VocabMask>],
    temperature: f32,
) -> Result<Tensor> {
    check_masks(targets, masks)?;
    let mut logits =
        (hidden.matmul(&weight.t()?)?.to_dtype(candle_core::DType::F32)? / temperature as f64)?;
    if masks.iter().any(Option::is_some) {
        let (n, v) = logits.dims2()?;
        let mut bias = vec![0f32; n * v];
        for (row, mask) in bias.chunks_mut(v).zip(masks) {
            if let Some(mask) = mask {
                for (t, b) in row.iter_mut().enumerate() {
                    if !mask_allows(mask, t) {
                        *b = MASKED_LOGIT;
                    }
                }
            }
        }
        logits = (logits + Tensor::from_vec(bias, (n, v), hidden.device())?)?;
    }
    let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let idx = Tensor::new(targets, hidden.device())?.unsqueeze(1)?.contiguous()?;
    let picked = logp.gather(&idx, 1)?;
    let entropy = (logp.exp()? * &logp)?.sum_keepdim(1)?.neg()?.detach();
    Tensor::cat(&[picked, entropy], 1)
}

struct TokenLogprobs {
    targets: Arc<Vec<u32>>,
    /// Empty, or one optional mask per target.
    masks: Arc<Vec<Option<VocabMask>>>,
    inv_temp: f32,
}

impl TokenLogprobs {
    /// The mask of target row `i`, if any.
    fn mask(&self, i: usize) -> Option<&[u32]> {
        self.masks.get(i).and_then(|m| m.as_deref())
    }
}

/// Shapes of the problem: tokens, width, vocab, rows per chunk.
fn dims(lh: &Layout, lw: &Layout, n_targets: usize) -> Result<(usize, usize, usize, usize)> {
    let &[n, d] = lh.dims() else {
        bail!("token_logprobs: hidden must be (N, d), got {:?}", lh.dims())
    };
    let &[v, d2] = lw.dims() else {
        bail!("token_logprobs: weight must be (V, d), got {:?}", lw.dims())
    };
    if d != d2 || n != n_targets {
        bail!(
            "token_logprobs: hidden {:?}, weight {:?}, {n_targets} targets",
            lh.dims(),
            lw.dims()
        );
    }
    Ok((n, d, v, (CHUNK_FLOATS / v.max(1)).clamp(1, n.max(1))))
}

/// `out (rows x v) = h (rows x d) . w^T`.
fn logits_chunk(out: &mut [f32], h: &[f32], w: &[f32], rows: usize, d: usize, v: usize) {
    // SAFETY: the slices hold rows*v, rows*d and v*d floats and the strides address inside them.
    unsafe {
        super::sgemm(super::Product {
            m: rows,
            n: v,
            k: d,
            dst: out.as_mut_ptr(),
            dst_cs: 1,
            dst_rs: v as isize,
            accumulate: false,
            lhs: h.as_ptr(),
            lhs_cs: 1,
            lhs_rs: d as isize,
            rhs: w.as_ptr(),
            rhs_cs: d as isize,
            rhs_rs: 1,
        });
    }
}

/// Turns a logits row into probabilities in place; returns (log-sum-exp, sum p*z) of the scaled row.
/// With a mask, the tokens it rules out get probability 0.
fn softmax_in_place(row: &mut [f32], inv_temp: f32, mask: Option<&[u32]>) -> (f32, f32) {
    let mut max = f32::NEG_INFINITY;
    for z in row.iter_mut() {
        *z *= inv_temp;
        max = max.max(*z);
    }
    if let Some(mask) = mask {
        max = f32::NEG_INFINITY;
        for (t, z) in row.iter_mut().enumerate() {
            if mask_allows(mask, t) {
                max = max.max(*z);
            } else {
                *z = MASKED_LOGIT;
            }
        }
    }
    let mut sum = 0f32;
    let mut sum_pz = 0f32;
    for z in row.iter_mut() {
        let e = (*z - max).exp();
        sum_pz += e * *z;
        *z = e;
        sum += e;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|p| *p *= inv);
    (max + sum.ln(), sum_pz * inv)
}

impl CustomOp2 for TokenLogprobs {
    fn name(&self) -> &'static str {
        "verity-token-logprobs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (h, w) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let (n, d, v, chunk) = dims(l1, l2, self.targets.len())?;
        if let Some(bad) = self.targets.iter().find(|&&t| t as usize >= v) {
            bail!("token_logprobs: target id {bad} outside vocabulary of {v}");
        }
        let mut out = vec![0f32; n * 2];
        let mut logits = vec![0f32; chunk * v];
        for start in (0..n).step_by(chunk) {
            let rows = chunk.min(n - start);
            let buf = &mut logits[..rows * v];
            logits_chunk(buf, &h[start * d..(start + rows) * d], w, rows, d, v);
            let targets = &self.targets[start..start + rows];
            out[start * 2..(start + rows) * 2]
                .par_chunks_mut(2)
                .zip(buf.par_chunks_mut(v))
                .zip(targets.par_iter())
                .enumerate()
                .for_each(|(k, ((o, row), &t))| {
                    let zt = row[t as usize] * self.inv_temp;
                    let (lse, mean_z) = softmax_in_place(row, self.inv_temp, self.mask(start + k));
                    o[0] = zt - lse;
                    o[1] = lse - mean_z;
                });
        }
        Ok((CpuStorage::F32(out), Shape::from((n, 2))))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad_lp: Vec<f32> = g.narrow(1, 0, 1)?.flatten_all()?.to_vec1()?;
        let (n, d) = hidden.dims2()?;
        let (v, _) = weight.dims2()?;
        let chunk = (CHUNK_FLOATS / v.max(1)).clamp(1, n.max(1));
        let mut dh = vec![0f32; n * d];
        // A frozen LM head (LoRA) needs no gradient: no (vocab × hidden) product, no buffer.
        let train_weight = weight.track_op();
        let mut dw = if train_weight { vec![0f32; v * d] } else { Vec::new() };
        with_f32(hidden, |h| {
            with_f32(weight, |w| {
                let mut dlogits = vec![0f32; chunk * v];
                for start in (0..n).step_by(chunk) {
                    let rows = chunk.min(n - start);
                    let buf = &mut dlogits[..rows * v];
                    let hc = &h[start * d..(start + rows) * d];
                    logits_chunk(buf, hc, w, rows, d, v);
                    let targets = &self.targets[start..start + rows];
                    let grads = &grad_lp[start..start + rows];
                    // d logp_t / d z = (onehot_t - p) / T, scaled by the incoming gradient.
                    buf.par_chunks_mut(v)
                        .zip(targets.par_iter().zip(grads.par_iter()))
                        .enumerate()
                        .for_each(|(k, (row, (&t, &gv)))| {
                            softmax_in_place(row, self.inv_temp, self.mask(start + k));
                            let k = -gv * self.inv_temp;
                            row.iter_mut().for_each(|p| *p *= k);
                            row[t as usize] += gv * self.inv_temp;
                        });
                    // SAFETY: all strides address inside the buffers sized above.
                    unsafe {
                        super::sgemm(super::Product {
                            m: rows,
                            n: d,
                            k: v,
                            dst: dh[start * d..].as_mut_ptr(),
                            dst_cs: 1,
                            dst_rs: d as isize,
                            accumulate: false,
                            lhs: buf.as_ptr(),
                            lhs_cs: 1,
                            lhs_rs: v as isize,
                            rhs: w.as_ptr(),
                            rhs_cs: 1,
                            rhs_rs: d as isize,
                        });
                        if !train_weight {
                            continue;
                        }
                        super::sgemm(super::Product {
                            m: v,
                            n: d,
                            k: rows,
                            dst: dw.as_mut_ptr(),
                            dst_cs: 1,
                            dst_rs: d as isize,
                            accumulate: start > 0,
                            lhs: buf.as_ptr(),
                            lhs_cs: v as isize,
                            lhs_rs: 1,
                            rhs: hc.as_ptr(),
                            rhs_cs: 1,
                            rhs_rs: d as isize,
                        });
                    }
                }
                Ok(())
            })
        })?;
        let dev = Device::Cpu;
        Ok((
            Some(Tensor::from_vec(dh, (n, d), &dev)?),
            train_weight.then(|| Tensor::from_vec(dw, (v, d), &dev)).transpose()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_same_function, max_abs_diff, wave_var};

    /// A mask allowing the listed tokens of a `v`-token vocabulary.
    fn mask_of(v: usize, allowed: &[usize]) -> VocabMask {
        let mut words = vec![0u32; v.div_ceil(32)];
        for &t in allowed {
            words[t / 32] |= 1 << (t % 32);
        }
        words.into()
    }

    #[test]
    fn masked_rows_match_the_composition_in_value_and_gradient() {
        let (n, d, v) = (5, 6, 70);
        let (h, w) = (wave_var((n, d), 0.3), wave_var((v, d), 1.1));
        let targets = [3u32, 40, 69, 0, 33];
        let masks = vec![
            Some(mask_of(v, &[1, 3, 5, 64])),
            None,
            Some(mask_of(v, &[69])),
            Some(mask_of(v, &(0..v).collect::<Vec<_>>())),
            Some(mask_of(v, &[2, 33, 34, 35])),
        ];
        for temperature in [1.0, 0.7] {
            let fused =
                token_logprobs_masked(h.as_tensor(), w.as_tensor(), &targets, &masks, temperature)
                    .unwrap();
            let plain = token_logprobs_reference_masked(
                h.as_tensor(),
                w.as_tensor(),
                &targets,
                &masks,
                temperature,
            )
            .unwrap();
            assert_same_function(&fused, &plain, &[&h, &w], 1e-4);
        }
    }

    #[test]
    fn a_mask_renormalises_over_its_tokens_and_a_full_mask_changes_nothing() {
        let (n, d, v) = (3, 4, 40);
        let (h, w) = (wave_var((n, d), 0.1), wave_var((v, d), 0.9));
        let targets = [7u32, 8, 9];
        let free = token_logprobs(h.as_tensor(), w.as_tensor(), &targets, 0.8).unwrap();
        let everything = vec![Some(mask_of(v, &(0..v).collect::<Vec<_>>())); n];
        let full = token_logprobs_masked(h.as_tensor(), w.as_tensor(), &targets, &everything, 0.8)
            .unwrap();
        assert!(max_abs_diff(&free, &full) < 1e-6, "a mask allowing every token is no mask");
        // A single allowed token is certain: log-probability 0, entropy 0.
        let only: Vec<_> = targets.iter().map(|&t| Some(mask_of(v, &[t as usize]))).collect();
        let certain =
            token_logprobs_masked(h.as_tensor(), w.as_tensor(), &targets, &only, 0.8).unwrap();
        assert!(certain.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() < 1e-6);
        // Two allowed tokens: the target's probability among the two.
        let two: Vec<_> = targets.iter().map(|&t| Some(mask_of(v, &[t as usize, 0]))).collect();
        let pair = token_logprobs_masked(h.as_tensor(), w.as_tensor(), &targets, &two, 0.8)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let logits = (h.as_tensor().matmul(&w.as_tensor().t().unwrap()).unwrap() / 0.8)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (i, &t) in targets.iter().enumerate() {
            let (zt, z0) = (logits[i][t as usize], logits[i][0]);
            let expected = zt - (zt.exp() + z0.exp()).ln();
            assert!((pair[i][0] - expected).abs() < 1e-5, "row {i}");
        }
    }

    #[test]
    fn masks_that_do_not_fit_are_refused() {
        let (h, w) = (wave_var((2, 4), 0.1), wave_var((10, 4), 0.2));
        let one = vec![Some(mask_of(10, &[1]))];
        assert!(token_logprobs_masked(h.as_tensor(), w.as_tensor(), &[1, 2], &one, 1.0).is_err());
        let excludes = vec![Some(mask_of(10, &[1])), Some(mask_of(10, &[1]))];
        let err = token_logprobs_masked(h.as_tensor(), w.as_tensor(), &[1, 2], &excludes, 1.0);
        assert!(err.unwrap_err().to_string().contains("outside the row's mask"));
    }
}
