//! SwiGLU `silu(gate) * up` fused into one pass, with a hand-written backward (saves the
//! `silu(gate)` intermediate and several elementwise temporaries per layer).

use super::{f32_slice, use_cpu_kernel};
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

/// `silu(gate) * up`, differentiable in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if use_cpu_kernel(gate) {
        gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
    } else {
        swiglu_reference(gate, up)
    }
}

/// The same function composed of candle ops (test reference and GPU path).
pub fn swiglu_reference(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "verity-swiglu"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (g, u) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        if g.len() != u.len() {
            bail!("swiglu: shapes {:?} and {:?}", l1.dims(), l2.dims());
        }
        let mut out = vec![0f32; g.len()];
        out.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK))).for_each(|(o, (g, u))| {
            for i in 0..o.len() {
                o[i] = g[i] * sigmoid(g[i]) * u[i];
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(&self, gate: &Tensor, up: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let both = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &SwiGluGrad)?;
        Ok((Some(both.get(0)?), Some(both.get(1)?)))
    }
}

/// Gradients of SwiGLU stacked as `(2, ...)`: `[d gate, d up]`.
struct SwiGluGrad;

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "verity-swiglu-grad"
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
        let (g, u, dy) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let n = g.len();
        let mut out = vec![0f32; 2 * n];
        let (dg, du) = out.split_at_mut(n);
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)).zip(dy.par_chunks(CHUNK)))
            .for_each(|((dg, du), ((g, u), dy))| {
                for i in 0..dg.len() {
                    let s = sigmoid(g[i]);
                    du[i] = dy[i] * g[i] * s;
                    dg[i] = dy[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
                }
            });
        let mut dims = vec![2];
        dims.extend_from_slice(l1.dims());
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}
