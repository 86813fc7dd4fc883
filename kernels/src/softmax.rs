//! Attention softmax `softmax(scale * scores + mask)`: the row kernel the fused attention uses,
//! and the composition of candle ops that the reference attention uses.

use candle_core::{Result, Tensor, D};

/// Softmax over the last dim of `scale * scores + mask`, composed of plain candle ops (the test
/// reference). `scores` is `(B, H, Tq, Tk)`, `mask` is additive `(B, Tq, Tk)` (0 or
/// -inf) and broadcast over heads; fully masked rows must not occur on this path.
pub fn masked_softmax_reference(scores: &Tensor, mask: &Tensor, scale: f32) -> Result<Tensor> {
    let x = (scores * scale as f64)?.broadcast_add(&mask.unsqueeze(1)?)?;
    candle_nn::ops::softmax(&x, D::Minus1)
}

/// `out = softmax(scale * s + m)` of one row; a row whose entries are all masked becomes zeros.
pub(super) fn softmax_row(out: &mut [f32], s: &[f32], m: &[f32], scale: f32) {
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
