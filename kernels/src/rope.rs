//! Rotary position embedding (HF "rotate half" layout) with a hand-written backward.

use super::{f32_slice, use_cpu_kernel};
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Applies RoPE to `x` `(B, H, T, Dh)` with per-row angles `cos`/`sin` `(B, T, Dh/2)`.
/// Differentiable in `x` (the angles are constants). On the CPU `x` may be any strided view
/// whose last dimension is dense (a transposed projection, read in place: no head-major copy is
/// made, nor kept for the backward); the result is contiguous.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if use_cpu_kernel(x) {
        let x = if x.stride().last() == Some(&1) { x.clone() } else { x.contiguous()? };
        x.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope)
    } else {
        rope_reference(x, cos, sin)
    }
}

/// The same function composed of plain candle ops (slow; the test reference and GPU path).
pub fn rope_reference(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let x = &x.contiguous()?;
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
        let (cos, sin) = (f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let &[b, h, t, d] = l1.dims() else { bail!("rope: x must be 4-d, got {:?}", l1.dims()) };
        let &[sb, sh, st, 1] = l1.stride() else {
            bail!("rope: the last dimension of x must be dense, strides {:?}", l1.stride())
        };
        let half = d / 2;
        if l2.dims() != [b, t, half] || l3.dims() != [b, t, half] {
            bail!("rope: cos/sin {:?} do not match x {:?}", l2.dims(), l1.dims());
        }
        let data = &s1.as_slice::<f32>()?[l1.start_offset()..];
        let last = (b.max(1) - 1) * sb + (h.max(1) - 1) * sh + (t.max(1) - 1) * st + d;
        if b * h * t > 0 && data.len() < last {
            bail!("rope: x's layout {l1:?} runs past its storage");
        }
        let mut out = vec![0f32; b * h * t * d];
        out.par_chunks_mut(d).enumerate().for_each(|(row, o)| {
            let (bi, hi, ti) = (row / (h * t), row / t % h, row % t);
            let start = bi * sb + hi * sh + ti * st;
            let xr = &data[start..start + d];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_same_function, wave_var};

    #[test]
    fn rope_reads_a_transposed_projection_in_place_with_the_references_values_and_gradient() {
        // Rows (batch 2 × 3 positions) of 2 heads × 4 dims, taken past a first row as the
        // model's grouped forward narrows them, then viewed head-major without a copy.
        let (b, t, h, d) = (2, 3, 2, 4);
        let rows = wave_var((b * t + 1, h * d), 0.7);
        let view = |rows: &Tensor| {
            rows.narrow(0, 1, b * t)
                .unwrap()
                .reshape((b, t, h, d))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
        };
        let x = view(rows.as_tensor());
        assert!(!x.is_contiguous());
        let angles =
            |seed| wave_var((b * t, d / 2), seed).as_tensor().detach().reshape((b, t, d / 2));
        let (cos, sin) = (angles(1.1).unwrap(), angles(2.3).unwrap());
        let fused = rope(&x, &cos, &sin).unwrap();
        assert!(fused.is_contiguous());
        let plain = rope_reference(&x.contiguous().unwrap(), &cos, &sin).unwrap();
        assert_same_function(&fused, &plain, &[&rows], 1e-6);
        // The strided read and a contiguous copy give the same bits.
        let dense = rope(&x.contiguous().unwrap(), &cos, &sin).unwrap();
        assert_eq!(
            fused.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            dense.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
    }
}
