//! Rotary position embedding (HF "rotate half" layout) with a hand-written backward.

use super::{f32_slice, use_cpu_kernel};
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Applies RoPE to `x` `(B, H, T, Dh)` with per-row angles `cos`/`sin` `(B, T, Dh/2)`.
/// Differentiable in `x` (the angles are constants).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if use_cpu_kernel(x) {
        x.contiguous()?.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope)
    } else {
        rope_reference(x, cos, sin)
    }
}

/// The same function composed of plain candle ops (slow; the test reference and GPU path).
pub fn rope_reference(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    // The angle tables are f32; bf16 activations rotate in bf16, as HF models do.
    let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
    let cos = Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

struct Rope;

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "verity-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, cos, sin) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let &[b, h, t, d] = l1.dims() else { bail!("rope: x must be 4-d, got {:?}", l1.dims()) };
        let half = d / 2;
        if l2.dims() != [b, t, half] || l3.dims() != [b, t, half] {
            bail!("rope: cos/sin {:?} do not match x {:?}", l2.dims(), l1.dims());
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(d).zip(x.par_chunks(d)).enumerate().for_each(|(row, (o, xr))| {
            let (bi, ti) = (row / (h * t), row % t);
            let off = (bi * t + ti) * half;
            let (c, s) = (&cos[off..off + half], &sin[off..off + half]);
            for i in 0..half {
                let (a, bb) = (xr[i], xr[i + half]);
                o[i] = a * c[i] - bb * s[i];
                o[i + half] = bb * c[i] + a * s[i];
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // A rotation's transpose is the rotation by the opposite angle.
        let dx = g.contiguous()?.apply_op3_no_bwd(cos, &sin.neg()?, &Rope)?;
        Ok((Some(dx), None, None))
    }
}
