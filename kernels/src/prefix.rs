//! The keys (or values) a group's completions attend to: the shared prompt's, then each
//! completion's own, in one copy. The composition of candle ops (a broadcast prompt concatenated
//! with the completions) copies twice, and the graph keeps both copies until the backward.

use super::{f32_slice, use_cpu_kernel};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `(n, heads, p + w, d)`: for each of the `n` completions, the prompt's `(1, heads, p, d)` rows
/// followed by its own `(n, heads, w, d)` rows. Differentiable in both; the prompt's gradient is
/// the sum over the completions.
pub fn after_prefix(prefix: &Tensor, own: &Tensor) -> Result<Tensor> {
    if use_cpu_kernel(prefix) && use_cpu_kernel(own) {
        prefix.contiguous()?.apply_op2(&own.contiguous()?, AfterPrefix)
    } else {
        after_prefix_reference(prefix, own)
    }
}

/// The same function composed of candle ops (the test reference and the device path).
pub fn after_prefix_reference(prefix: &Tensor, own: &Tensor) -> Result<Tensor> {
    let (n, heads, _, d) = own.dims4()?;
    let p = prefix.dim(2)?;
    Tensor::cat(&[&prefix.broadcast_as((n, heads, p, d))?, own], 2)?.contiguous()
}

struct AfterPrefix;

/// Sizes `(n, heads, p, w, d)` of the operands, checked.
fn sizes(lp: &Layout, lo: &Layout) -> Result<(usize, usize, usize, usize, usize)> {
    let (&[one, heads, p, d], &[n, heads2, w, d2]) = (lp.dims(), lo.dims()) else {
        bail!("after_prefix: 4-d operands expected, got {:?} and {:?}", lp.dims(), lo.dims());
    };
    if one != 1 || heads != heads2 || d != d2 {
        bail!("after_prefix: prefix {:?} does not fit completions {:?}", lp.dims(), lo.dims());
    }
    Ok((n, heads, p, w, d))
}

impl CustomOp2 for AfterPrefix {
    fn name(&self) -> &'static str {
        "verity-after-prefix"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, heads, p, w, d) = sizes(l1, l2)?;
        let (prefix, own) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?);
        let mut out = vec![0f32; n * heads * (p + w) * d];
        if !out.is_empty() {
            out.par_chunks_mut((p + w) * d).enumerate().for_each(|(i, rows)| {
                let (c, h) = (i / heads, i % heads);
                rows[..p * d].copy_from_slice(&prefix[h * p * d..(h + 1) * p * d]);
                let mine = (c * heads + h) * w * d;
                rows[p * d..].copy_from_slice(&own[mine..mine + w * d]);
            });
        }
        Ok((CpuStorage::F32(out), Shape::from((n, heads, p + w, d))))
    }

    fn bwd(
        &self,
        prefix: &Tensor,
        _own: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let p = prefix.dim(2)?;
        let w = grad.dim(2)? - p;
        let d_prefix = grad.narrow(2, 0, p)?.sum_keepdim(0)?;
        let d_own = grad.narrow(2, p, w)?.contiguous()?;
        Ok((Some(d_prefix), Some(d_own)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_same_function, wave_var};

    #[test]
    fn after_prefix_matches_the_composition_with_gradients() {
        let (n, heads, p, w, d) = (3, 2, 4, 5, 6);
        let prefix = wave_var((heads * p, d), 0.4);
        let own = wave_var((n * heads * w, d), 1.9);
        let shaped = |v: &candle_core::Var, dims: (usize, usize, usize, usize)| {
            v.as_tensor().reshape(dims).unwrap()
        };
        let (pt, ot) = (shaped(&prefix, (1, heads, p, d)), shaped(&own, (n, heads, w, d)));
        let fused = after_prefix(&pt, &ot).unwrap();
        let plain = after_prefix_reference(&pt, &ot).unwrap();
        assert_eq!(fused.dims(), &[n, heads, p + w, d]);
        assert_same_function(&fused, &plain, &[&prefix, &own], 1e-6);
    }

    #[test]
    fn after_prefix_rejects_operands_that_do_not_fit() {
        let prefix =
            Tensor::zeros((2, 2, 3, 4), candle_core::DType::F32, &candle_core::Device::Cpu);
        let own = Tensor::zeros((3, 2, 5, 4), candle_core::DType::F32, &candle_core::Device::Cpu);
        assert!(after_prefix(&prefix.unwrap(), &own.unwrap()).is_err());
    }
}
