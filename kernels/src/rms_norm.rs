//! RMS norm `y = x / sqrt(mean(x^2) + eps) * w` with a hand-written backward.

use super::{f32_slice, use_cpu_kernel};
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// RMS norm over the last dimension with weight `w`; differentiable in `x` and `w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    if use_cpu_kernel(x) {
        x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps })
    } else {
        super::rms_norm_device(x, w, eps)
    }
}

/// The same function composed of plain candle ops (slow; the test reference; the GPU path is
/// [`super::rms_norm_device`]).
pub fn rms_norm_reference(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let r = (ms + eps as f64)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}

fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let ss: f32 = row.iter().map(|v| v * v).sum();
    1.0 / (ss / row.len() as f32 + eps).sqrt()
}

struct RmsNorm {
    eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "verity-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32_slice(s1, l1)?;
        let w = f32_slice(s2, l2)?;
        let d = w.len();
        if l1.dims().last() != Some(&d) {
            candle_core::bail!("rms_norm: weight length {d} does not match {:?}", l1.dims());
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(d).zip(x.par_chunks(d)).for_each(|(o, row)| {
            let r = inv_rms(row, self.eps);
            for ((o, &v), &wv) in o.iter_mut().zip(row).zip(w) {
                *o = v * r * wv;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = g.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &g, &RmsNormGradX { eps: self.eps })?;
        let dw = x.apply_op2_no_bwd(&g, &RmsNormGradW { eps: self.eps })?;
        Ok((Some(dx), Some(dw)))
    }
}

struct RmsNormGradX {
    eps: f32,
}

impl CustomOp3 for RmsNormGradX {
    fn name(&self) -> &'static str {
        "verity-rms-norm-grad-x"
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
        let (x, w, g) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let d = w.len();
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(d).zip(x.par_chunks(d).zip(g.par_chunks(d))).for_each(
            |(o, (xr, gr))| {
                let r = inv_rms(xr, self.eps);
                let dot: f32 = xr.iter().zip(gr).zip(w).map(|((a, b), c)| a * b * c).sum();
                let k = r * r * r * dot / d as f32;
                for i in 0..d {
                    o[i] = r * w[i] * gr[i] - xr[i] * k;
                }
            },
        );
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

struct RmsNormGradW {
    eps: f32,
}

impl CustomOp2 for RmsNormGradW {
    fn name(&self) -> &'static str {
        "verity-rms-norm-grad-w"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, g) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let d = *l1.dims().last().unwrap_or(&1);
        let rows = x.len() / d.max(1);
        let per_task = rows.div_ceil(rayon::current_num_threads() * 4).max(1);
        let dw = x
            .par_chunks(d * per_task)
            .zip(g.par_chunks(d * per_task))
            .map(|(xs, gs)| {
                let mut acc = vec![0f32; d];
                for (xr, gr) in xs.chunks(d).zip(gs.chunks(d)) {
                    let r = inv_rms(xr, self.eps);
                    for i in 0..d {
                        acc[i] += gr[i] * xr[i] * r;
                    }
                }
                acc
            })
            .reduce(
                || vec![0f32; d],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        Ok((CpuStorage::F32(dw), Shape::from(d)))
    }
}
