//! Per-token log-probabilities `log softmax(h W^T / T)[target]` fused with the LM head,
//! computed over chunks of tokens so the `tokens x vocab` logits never exist in full.
//! The backward recomputes each chunk's logits instead of storing them.

use super::{f32_slice, use_cpu_kernel, with_f32};
use candle_core::{bail, CpuStorage, CustomOp2, Device, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;
use std::sync::Arc;

/// Logits held in memory at once (rows x vocab floats) by the chunked kernel.
const CHUNK_FLOATS: usize = 1 << 22;

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
    if temperature.is_nan() || temperature <= 0.0 {
        bail!("token_logprobs: temperature must be > 0, got {temperature}");
    }
    if use_cpu_kernel(hidden) {
        let op = TokenLogprobs { targets: Arc::new(targets.to_vec()), inv_temp: 1.0 / temperature };
        hidden.contiguous()?.apply_op2(&weight.contiguous()?, op)
    } else {
        token_logprobs_reference(hidden, weight, targets, temperature)
    }
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
    let logits =
        (hidden.matmul(&weight.t()?)?.to_dtype(candle_core::DType::F32)? / temperature as f64)?;
    let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let idx = Tensor::new(targets, hidden.device())?.unsqueeze(1)?.contiguous()?;
    let picked = logp.gather(&idx, 1)?;
    let entropy = (logp.exp()? * &logp)?.sum_keepdim(1)?.neg()?.detach();
    Tensor::cat(&[picked, entropy], 1)
}

struct TokenLogprobs {
    targets: Arc<Vec<u32>>,
    inv_temp: f32,
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
fn softmax_in_place(row: &mut [f32], inv_temp: f32) -> (f32, f32) {
    let mut max = f32::NEG_INFINITY;
    for z in row.iter_mut() {
        *z *= inv_temp;
        max = max.max(*z);
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
                .for_each(|((o, row), &t)| {
                    let zt = row[t as usize] * self.inv_temp;
                    let (lse, mean_z) = softmax_in_place(row, self.inv_temp);
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
                    buf.par_chunks_mut(v).zip(targets.par_iter().zip(grads.par_iter())).for_each(
                        |(row, (&t, &gv))| {
                            softmax_in_place(row, self.inv_temp);
                            let k = -gv * self.inv_temp;
                            row.iter_mut().for_each(|p| *p *= k);
                            row[t as usize] += gv * self.inv_temp;
                        },
                    );
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
