//! Attention softmax `softmax(scale * scores + mask)` with a hand-written backward.

use super::{f32_slice, use_cpu_kernel};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Softmax over the last dim of `scale * scores + mask`.
///
/// `scores` is `(B, H, Tq, Tk)`, `mask` is additive `(B, Tq, Tk)` (0 or -inf) and broadcast over
/// heads. Rows whose keys are all masked yield zeros. Differentiable in `scores` only.
pub fn masked_softmax(scores: &Tensor, mask: &Tensor, scale: f32) -> Result<Tensor> {
    if use_cpu_kernel(scores) {
        scores.contiguous()?.apply_op2(&mask.contiguous()?, MaskedSoftmax { scale })
    } else {
        masked_softmax_reference(scores, mask, scale)
    }
}

/// The same function composed of plain candle ops (slow; the test reference and GPU path).
/// Fully masked rows must not occur on this path.
pub fn masked_softmax_reference(scores: &Tensor, mask: &Tensor, scale: f32) -> Result<Tensor> {
    let x = (scores * scale as f64)?.broadcast_add(&mask.unsqueeze(1)?)?;
    candle_nn::ops::softmax(&x, D::Minus1)
}

struct MaskedSoftmax {
    scale: f32,
}

fn softmax_row(out: &mut [f32], s: &[f32], m: &[f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for ((o, &sv), &mv) in out.iter_mut().zip(s).zip(m) {
        *o = sv * scale + mv;
        max = max.max(*o);
    }
    if max == f32::NEG_INFINITY {
        out.iter_mut().for_each(|o| *o = 0.0);
        return;
    }
    let mut sum = 0f32;
    for o in out.iter_mut() {
        *o = (*o - max).exp();
        sum += *o;
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "verity-masked-softmax"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (s, m) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let &[b, h, tq, tk] = l1.dims() else { bail!("masked_softmax: scores must be 4-d, got {:?}", l1.dims()) };
        if l2.dims() != [b, tq, tk] {
            bail!("masked_softmax: mask {:?} does not match scores {:?}", l2.dims(), l1.dims());
        }
        let mut out = vec![0f32; s.len()];
        out.par_chunks_mut(tk).zip(s.par_chunks(tk)).enumerate().for_each(|(row, (o, sr))| {
            let (bi, qi) = (row / (h * tq), row % tq);
            let mrow = &m[(bi * tq + qi) * tk..(bi * tq + qi + 1) * tk];
            softmax_row(o, sr, mrow, self.scale);
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(&self, _s: &Tensor, _m: &Tensor, y: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let ds = y.apply_op2_no_bwd(&g.contiguous()?, &SoftmaxGrad { scale: self.scale })?;
        Ok((Some(ds), None))
    }
}

struct SoftmaxGrad {
    scale: f32,
}

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "verity-softmax-grad"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (y, g) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let tk = *l1.dims().last().unwrap_or(&1);
        let mut out = vec![0f32; y.len()];
        out.par_chunks_mut(tk).zip(y.par_chunks(tk).zip(g.par_chunks(tk))).for_each(|(o, (yr, gr))| {
            let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
            for ((o, &yv), &gv) in o.iter_mut().zip(yr).zip(gr) {
                *o = self.scale * yv * (gv - dot);
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}
