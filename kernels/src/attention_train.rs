//! Differentiable attention for the trainable forward, one fused op with a hand-written backward
//! that recomputes the probabilities (as flash attention does) instead of keeping them: the
//! forward saves nothing but its inputs, where the composed version kept the scores and the
//! probabilities — two `(B, H, T, T)` tensors per layer — and transposed copies of the output.
//!
//! Work is split over (batch row, key/value head) pairs, each running the small products of its
//! query heads single-threaded, so key and value gradients need no cross-thread reduction.

use super::blas::{serial_sgemm, Product};
use super::softmax::softmax_row;
use super::{f32_slice, use_cpu_kernel, with_f32};
use candle_core::{bail, CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `softmax(scale * q k^T + mask) v` for `q (B, H, Tq, Dh)`, `k`, `v` `(B, Hkv, Tk, Dh)` and an
/// additive `mask (B, Tq, Tk)` (0 or -inf; fully masked rows give zeros). Query head `h` reads
/// key/value head `h / (H / Hkv)`. Returns `(B * Tq, H * Dh)`, differentiable in `q`, `k`, `v`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f32) -> Result<Tensor> {
    if use_cpu_kernel(q) {
        let op = Attention { mask: mask.contiguous()?, scale };
        q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)
    } else {
        super::attention_device(q, k, v, mask, scale)
    }
}

/// The same function composed of candle ops (the test reference; the GPU path is
/// [`super::attention_device`]; no fully masked rows there).
pub fn attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f32,
) -> Result<Tensor> {
    attention_composed(q, k, v, |scores| super::masked_softmax_reference(scores, mask, scale))
}

/// `p v` for `p = probabilities(q kᵀ)`, composed of candle ops: the raw scores `(B, H, Tq, Tk)`
/// go to `probabilities` (scale, mask, softmax), query head `h` reads key/value head
/// `h / (H / Hkv)`; returns `(B * Tq, H * Dh)`. Shared by the reference and the device path.
pub(super) fn attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    probabilities: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (b, h, t, dh) = q.dims4()?;
    let (_, hkv, tk, _) = k.dims4()?;
    let rep = h / hkv.max(1);
    let q = q.contiguous()?;
    let scores = q.reshape((b, hkv, rep * t, dh))?.matmul(&k.t()?)?.reshape((b, h, t, tk))?;
    let probs = probabilities(&scores)?;
    probs
        .reshape((b, hkv, rep * t, tk))?
        .matmul(&v.contiguous()?)?
        .reshape((b, h, t, dh))?
        .transpose(1, 2)?
        .reshape((b * t, h * dh))
}

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    h: usize,
    hkv: usize,
    t: usize,
    tk: usize,
    dh: usize,
}

impl Dims {
    fn check(q: &[usize], k: &[usize], v: &[usize], mask: &[usize]) -> Result<Dims> {
        let (&[b, h, t, dh], &[kb, hkv, tk, kdh]) = (q, k) else {
            bail!("attention: q {q:?} and k {k:?} must be 4-d");
        };
        if kb != b || kdh != dh || v != k || mask != [b, t, tk] || hkv == 0 || h % hkv != 0 {
            bail!("attention: q {q:?}, k {k:?}, v {v:?}, mask {mask:?}");
        }
        Ok(Dims { b, h, hkv, t, tk, dh })
    }

    fn rep(&self) -> usize {
        self.h / self.hkv
    }
}

/// `P = softmax(scale * Q K^T + mask)` of one head into `p` (`t × tk`).
fn probabilities(p: &mut [f32], q: &[f32], k: &[f32], mask: &[f32], d: Dims, scale: f32) {
    // SAFETY: q is t×dh, k is tk×dh (read transposed), p is t×tk, all contiguous.
    unsafe {
        serial_sgemm(Product {
            m: d.t,
            n: d.tk,
            k: d.dh,
            dst: p.as_mut_ptr(),
            dst_cs: 1,
            dst_rs: d.tk as isize,
            accumulate: false,
            lhs: q.as_ptr(),
            lhs_cs: 1,
            lhs_rs: d.dh as isize,
            rhs: k.as_ptr(),
            rhs_cs: d.dh as isize,
            rhs_rs: 1,
        })
    };
    let mut scores = vec![0f32; d.tk];
    for (row, m) in p.chunks_mut(d.tk).zip(mask.chunks(d.tk)) {
        scores.copy_from_slice(row);
        softmax_row(row, &scores, m, scale);
    }
}

struct Attention {
    mask: Tensor,
    scale: f32,
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "verity-attention"
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
        let (q, k, v) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let d = Dims::check(l1.dims(), l2.dims(), l3.dims(), self.mask.dims())?;
        let (t, tk, dh, h) = (d.t, d.tk, d.dh, d.h);
        let heads = with_f32(&self.mask, |mask| {
            Ok((0..d.b * h)
                .into_par_iter()
                .map(|bh| {
                    let (bi, hi) = (bh / h, bh % h);
                    let g = bi * d.hkv + hi / d.rep();
                    let mut p = vec![0f32; t * tk];
                    let mask = &mask[bi * t * tk..][..t * tk];
                    probabilities(
                        &mut p,
                        &q[bh * t * dh..][..t * dh],
                        &k[g * tk * dh..][..tk * dh],
                        mask,
                        d,
                        self.scale,
                    );
                    let mut o = vec![0f32; t * dh];
                    // SAFETY: p is t×tk, v's head is tk×dh, o is t×dh, all contiguous.
                    unsafe {
                        serial_sgemm(Product {
                            m: t,
                            n: dh,
                            k: tk,
                            dst: o.as_mut_ptr(),
                            dst_cs: 1,
                            dst_rs: dh as isize,
                            accumulate: false,
                            lhs: p.as_ptr(),
                            lhs_cs: 1,
                            lhs_rs: tk as isize,
                            rhs: v[g * tk * dh..][..tk * dh].as_ptr(),
                            rhs_cs: 1,
                            rhs_rs: dh as isize,
                        })
                    };
                    o
                })
                .collect::<Vec<_>>())
        })?;
        // Rows of the output are (batch, position) and columns (head, dim).
        let mut out = vec![0f32; d.b * t * h * dh];
        for (bh, o) in heads.iter().enumerate() {
            let (bi, hi) = (bh / h, bh % h);
            for (i, row) in o.chunks(dh).enumerate() {
                out[((bi * t + i) * h + hi) * dh..][..dh].copy_from_slice(row);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((d.b * t, h * dh))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d = Dims::check(q.dims(), k.dims(), v.dims(), self.mask.dims())?;
        let grad = grad.contiguous()?;
        let groups = with_f32(q, |q| {
            with_f32(k, |k| {
                with_f32(v, |v| {
                    with_f32(&grad, |dout| {
                        with_f32(&self.mask, |mask| {
                            Ok((0..d.b * d.hkv)
                                .into_par_iter()
                                .map(|bg| group_gradients(bg, q, k, v, dout, mask, d, self.scale))
                                .collect::<Vec<_>>())
                        })
                    })
                })
            })
        })?;
        let (mut dq, mut dk, mut dv) = (
            Vec::with_capacity(q.elem_count()),
            Vec::with_capacity(k.elem_count()),
            Vec::with_capacity(v.elem_count()),
        );
        // Group (b, g) owns query heads g*rep.. and key/value head g: in (b, g) order their
        // blocks tile q's and k's layouts exactly.
        for (gq, gk, gv) in groups {
            dq.extend_from_slice(&gq);
            dk.extend_from_slice(&gk);
            dv.extend_from_slice(&gv);
        }
        let dev = &Device::Cpu;
        Ok((
            Some(Tensor::from_vec(dq, q.shape(), dev)?),
            Some(Tensor::from_vec(dk, k.shape(), dev)?),
            Some(Tensor::from_vec(dv, v.shape(), dev)?),
        ))
    }
}

/// Gradients owned by group `bg` = (batch row, key/value head): `d q` of its query heads and
/// `d k`, `d v` of its key/value head.
#[allow(clippy::too_many_arguments)]
fn group_gradients(
    bg: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    mask: &[f32],
    d: Dims,
    scale: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (t, tk, dh, rep) = (d.t, d.tk, d.dh, d.rep());
    let (bi, g) = (bg / d.hkv, bg % d.hkv);
    let kh = &k[bg * tk * dh..][..tk * dh];
    let vh = &v[bg * tk * dh..][..tk * dh];
    let mask = &mask[bi * t * tk..][..t * tk];
    let (mut dq, mut dk, mut dv) =
        (vec![0f32; rep * t * dh], vec![0f32; tk * dh], vec![0f32; tk * dh]);
    let (mut p, mut dp) = (vec![0f32; t * tk], vec![0f32; t * tk]);
    let out_rs = (d.h * dh) as isize;
    for r in 0..rep {
        let hi = g * rep + r;
        let qh = &q[(bi * d.h + hi) * t * dh..][..t * dh];
        // dO of this head: rows (bi, i), columns hi*dh.., row stride H*Dh.
        let doh = dout[(bi * t * d.h + hi) * dh..].as_ptr();
        probabilities(&mut p, qh, kh, mask, d, scale);
        // SAFETY (all products): every operand addresses its whole matrix under its strides —
        // p/dp t×tk, qh t×dh, kh/vh/dk/dv tk×dh, dq's head t×dh, dO t×dh at row stride H*Dh.
        unsafe {
            // dV += P^T dO
            serial_sgemm(Product {
                m: tk,
                n: dh,
                k: t,
                dst: dv.as_mut_ptr(),
                dst_cs: 1,
                dst_rs: dh as isize,
                accumulate: true,
                lhs: p.as_ptr(),
                lhs_cs: tk as isize,
                lhs_rs: 1,
                rhs: doh,
                rhs_cs: 1,
                rhs_rs: out_rs,
            });
            // dP = dO V^T
            serial_sgemm(Product {
                m: t,
                n: tk,
                k: dh,
                dst: dp.as_mut_ptr(),
                dst_cs: 1,
                dst_rs: tk as isize,
                accumulate: false,
                lhs: doh,
                lhs_cs: 1,
                lhs_rs: out_rs,
                rhs: vh.as_ptr(),
                rhs_cs: dh as isize,
                rhs_rs: 1,
            });
        }
        // dS = scale * P ∘ (dP − rowsum(P ∘ dP)), in place of dP.
        for (dpr, pr) in dp.chunks_mut(tk).zip(p.chunks(tk)) {
            let dot: f32 = dpr.iter().zip(pr).map(|(a, b)| a * b).sum();
            for (x, &pv) in dpr.iter_mut().zip(pr) {
                *x = scale * pv * (*x - dot);
            }
        }
        unsafe {
            // dQ = dS K
            serial_sgemm(Product {
                m: t,
                n: dh,
                k: tk,
                dst: dq[r * t * dh..].as_mut_ptr(),
                dst_cs: 1,
                dst_rs: dh as isize,
                accumulate: false,
                lhs: dp.as_ptr(),
                lhs_cs: 1,
                lhs_rs: tk as isize,
                rhs: kh.as_ptr(),
                rhs_cs: 1,
                rhs_rs: dh as isize,
            });
            // dK += dS^T Q
            serial_sgemm(Product {
                m: tk,
                n: dh,
                k: t,
                dst: dk.as_mut_ptr(),
                dst_cs: 1,
                dst_rs: dh as isize,
                accumulate: true,
                lhs: dp.as_ptr(),
                lhs_cs: tk as isize,
                lhs_rs: 1,
                rhs: qh.as_ptr(),
                rhs_cs: 1,
                rhs_rs: dh as isize,
            });
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::attention_mask;
    use crate::testing::max_abs_diff;
    use candle_core::Var;

    fn qkv(b: usize, h: usize, hkv: usize, t: usize, dh: usize) -> [Var; 3] {
        let dev = Device::Cpu;
        [h, hkv, hkv].map(|n| Var::randn(0f32, 1.0, (b, n, t, dh), &dev).unwrap())
    }

    #[test]
    fn matches_the_composition_in_value_and_gradient() {
        let dev = Device::Cpu;
        for (b, h, hkv, t, dh, pads) in
            [(2, 4, 2, 7, 8, vec![0, 3]), (1, 3, 3, 5, 4, vec![0]), (3, 6, 1, 9, 16, vec![2, 0, 5])]
        {
            let [q, k, v] = qkv(b, h, hkv, t, dh);
            // The model's own mask: causal, left padding, a padded position sees itself.
            let m = attention_mask(&pads, 0, t, &dev).unwrap();
            let scale = 1.0 / (dh as f32).sqrt();
            let weights = Tensor::randn(0f32, 1.0, (b * t, h * dh), &dev).unwrap();
            let run = |fused: bool| {
                let f = if fused { attention } else { attention_reference };
                let y = f(q.as_tensor(), k.as_tensor(), v.as_tensor(), &m, scale).unwrap();
                let grads = (&y * &weights).unwrap().sum_all().unwrap().backward().unwrap();
                (y, [&q, &k, &v].map(|x| grads.get(x.as_tensor()).unwrap().clone()))
            };
            let ((y1, g1), (y2, g2)) = (run(true), run(false));
            assert!(max_abs_diff(&y1, &y2) < 1e-5, "value {b}×{h}/{hkv}×{t}×{dh}");
            for (name, (a, r)) in ["q", "k", "v"].iter().zip(g1.iter().zip(&g2)) {
                assert!(
                    max_abs_diff(a, r) < 1e-4,
                    "d{name} {b}×{h}/{hkv}×{t}×{dh}: {}",
                    max_abs_diff(a, r)
                );
            }
        }
    }

    #[test]
    fn fully_masked_rows_give_zeros_and_no_gradient() {
        let (h, t, dh) = (2, 4, 4);
        let [q, k, v] = qkv(1, h, h, t, dh);
        // Query rows 0 and 1 see no key at all; rows 2 and 3 see keys 2..=i.
        let mut m = vec![f32::NEG_INFINITY; t * t];
        for i in 2..t {
            for j in 2..=i {
                m[i * t + j] = 0.0;
            }
        }
        let m = Tensor::from_vec(m, (1, t, t), &Device::Cpu).unwrap();
        let y = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &m, 0.5).unwrap();
        let rows = y.to_vec2::<f32>().unwrap();
        assert!(rows[0].iter().chain(&rows[1]).all(|&x| x == 0.0), "rows without keys are zero");
        assert!(rows[2].iter().all(|x| x.is_finite()) && rows[2].iter().any(|&x| x != 0.0));
        let grads = y.sum_all().unwrap().backward().unwrap();
        for (x, what) in [(&q, "queries without keys"), (&k, "keys nobody sees")] {
            let g =
                grads.get(x.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for hi in 0..h {
                assert!(
                    g[hi * t * dh..][..2 * dh].iter().all(|&x| x == 0.0),
                    "{what} get no gradient"
                );
                assert!(g[hi * t * dh + 2 * dh..][..2 * dh].iter().all(|x| x.is_finite()));
            }
        }
    }
}
