//! A LoRA linear layer in one op: `x · W + s · (x · Aᵀ) · Bᵀ` with `W` frozen.
//!
//! Composed of candle ops, the graph keeps the base product, the rank-r product, the adapter's
//! full-width product and their sum alive for the backward: three tensors as wide as the output
//! more than a plain linear layer, for each adapted projection. This op keeps only its inputs and
//! recomputes the small rank-r product in the backward.

use super::blas::{product, product_into, strided_matrix, Matmul, Strided};
use super::{f32_slice, with_f32};
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

/// `x · w + scale · (x · aᵀ) · bᵀ` for `x` `(m, in)`, frozen `w` `(in, out)`, `a` `(r, in)` and
/// `b` `(out, r)`: differentiable in `x`, `a` and `b`. CPU f32 only.
pub fn lora_matmul(x: &Tensor, w: &Tensor, a: &Tensor, b: &Tensor, scale: f32) -> Result<Tensor> {
    let op = LoraMatmul { w: w.detach().contiguous()?, scale };
    x.apply_op3(&a.contiguous()?, &b.contiguous()?, op)
}

struct LoraMatmul {
    w: Tensor,
    scale: f32,
}

impl CustomOp3 for LoraMatmul {
    fn name(&self) -> &'static str {
        "verity-lora-matmul"
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
        let x = strided_matrix(s1, l1)?;
        let (m, k) = l1.shape().dims2()?;
        let (r, k_a) = l2.shape().dims2()?;
        let (n, r_b) = l3.shape().dims2()?;
        let (k_w, n_w) = self.w.dims2()?;
        if k_a != k || k_w != k || n_w != n || r_b != r {
            bail!("lora matmul: x {m}×{k}, w {k_w}×{n_w}, a {r}×{k_a}, b {n}×{r_b}");
        }
        let mut out = with_f32(&self.w, |w| product(x, Strided::dense(w, k, n)?))?;
        // h = s · x · aᵀ (m × r), then out += h · bᵀ.
        let mut h = product(x, Strided::dense(f32_slice(s2, l2)?, r, k)?.t())?;
        h.iter_mut().for_each(|v| *v *= self.scale);
        let b = Strided::dense(f32_slice(s3, l3)?, n, r)?.t();
        product_into(&mut out, Strided::dense(&h, m, r)?, b, true)?;
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let product = |l: &Tensor, r: &Tensor| l.apply_op2_no_bwd(r, &Matmul);
        let g = grad.contiguous()?;
        let h = (product(x, &a.t()?)? * self.scale as f64)?;
        let g_b = (product(&g, b)? * self.scale as f64)?;
        let grad_x = if x.track_op() {
            Some((product(&g, &self.w.t()?)? + product(&g_b, a)?)?)
        } else {
            None
        };
        let grad_a = product(&g_b.t()?, x)?;
        let grad_b = product(&g.t()?, &h)?;
        Ok((grad_x, Some(grad_a), Some(grad_b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_same_function, wave_var};
    use candle_core::backprop::GradStore;

    #[test]
    fn product_and_gradients_match_the_composition() {
        let (x, w, a, b) = (
            wave_var((5, 6), 0.1),
            wave_var((6, 7), 0.2),
            wave_var((3, 6), 0.3),
            wave_var((7, 3), 0.4),
        );
        let fused =
            lora_matmul(x.as_tensor(), w.as_tensor(), a.as_tensor(), b.as_tensor(), 2.5).unwrap();
        let plain = (x.matmul(&w.as_tensor().detach()).unwrap()
            + (x.matmul(&a.t().unwrap()).unwrap() * 2.5).unwrap().matmul(&b.t().unwrap()).unwrap())
        .unwrap();
        assert_same_function(&fused, &plain, &[&x, &a, &b], 1e-5);
        let grads: GradStore = fused.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(w.as_tensor()).is_none(), "the base weight is frozen");
    }
}
