//! SwiGLU `silu(gate) * up` fused into one pass, with a hand-written backward (saves the
//! `silu(gate)` intermediate and several elementwise temporaries per layer).

use super::blas::{product, strided_matrix, Matmul, Strided};
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

/// `swiglu(gate, up) · w` (the MLP's down projection), differentiable in all three. The SwiGLU
/// activation is not kept for the backward, which recomputes it: one `(rows × intermediate)`
/// tensor less per layer held between forward and backward. CPU f32 only.
pub fn swiglu_matmul(gate: &Tensor, up: &Tensor, w: &Tensor) -> Result<Tensor> {
    gate.contiguous()?.apply_op3(&up.contiguous()?, w, SwiGluMatmul)
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

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = activation(s1, l1, s2, l2)?;
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let both = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &SwiGluGrad)?;
        Ok((Some(both.get(0)?), Some(both.get(1)?)))
    }
}

/// `silu(gate) * up` of two contiguous f32 operands of one shape.
fn activation(s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<Vec<f32>> {
    let (g, u) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
    if l1.dims() != l2.dims() {
        bail!("swiglu: shapes {:?} and {:?}", l1.dims(), l2.dims());
    }
    let mut out = vec![0f32; g.len()];
    out.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK))).for_each(
        |(o, (g, u))| {
            for i in 0..o.len() {
                o[i] = g[i] * sigmoid(g[i]) * u[i];
            }
        },
    );
    Ok(out)
}

struct SwiGluMatmul;

impl CustomOp3 for SwiGluMatmul {
    fn name(&self) -> &'static str {
        "verity-swiglu-matmul"
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
        let (m, k) = l1.shape().dims2()?;
        let act = activation(s1, l1, s2, l2)?;
        let w = strided_matrix(s3, l3)?;
        let out = product(Strided::dense(&act, m, k)?, w)?;
        let (_, n) = l3.shape().dims2()?;
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let grad_w = if w.track_op() {
            let act = gate.apply_op2_no_bwd(up, &SwiGlu)?;
            Some(act.t()?.apply_op2_no_bwd(&grad, &Matmul)?)
        } else {
            None
        };
        let grad_act = grad.apply_op2_no_bwd(&w.t()?, &Matmul)?;
        let both = gate.apply_op3_no_bwd(up, &grad_act, &SwiGluGrad)?;
        Ok((Some(both.get(0)?), Some(both.get(1)?), grad_w))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_same_function, wave_var};

    #[test]
    fn swiglu_matmul_matches_the_composition_with_gradients() {
        let (gate, up, w) = (wave_var((5, 8), 0.3), wave_var((5, 8), 0.9), wave_var((8, 3), 1.7));
        let fused = swiglu_matmul(gate.as_tensor(), up.as_tensor(), w.as_tensor()).unwrap();
        let plain = swiglu_reference(gate.as_tensor(), up.as_tensor())
            .unwrap()
            .matmul(w.as_tensor())
            .unwrap();
        assert_same_function(&fused, &plain, &[&gate, &up, &w], 1e-5);
    }
}
