//! No-grad attention for sampling and scoring: one pass per query row over (possibly strided)
//! cached keys and values, writing `(B, Tq, H * Dh)` directly.

use candle_core::{bail, Device, Layout, Result, Storage, Tensor};
use rayon::prelude::*;

/// Runs `f` on a CPU f32 tensor's storage (from its start offset) and its strides.
fn with_strided<R>(t: &Tensor, f: impl FnOnce(&[f32], &[usize]) -> Result<R>) -> Result<R> {
    let (storage, layout): (_, &Layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => {
            let data = cpu.as_slice::<f32>()?;
            f(&data[layout.start_offset()..], layout.stride())
        }
        _ => bail!("attention kernel expects CPU tensors"),
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `softmax(scale * q k^T + mask) v` for `q (B, H, Tq, Dh)` (contiguous), `k`, `v`
/// `(B, Hkv, Tk, Dh)` (any strides with a contiguous last dim) and additive `mask (B, Tq, Tk)`.
/// Query head `h` reads key/value head `h / (H / Hkv)`. Returns `(B * Tq, H * Dh)`.
pub fn attention_nograd(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f32,
) -> Result<Tensor> {
    let (b, h, tq, dh) = q.dims4()?;
    let (_, hkv, tk, _) = k.dims4()?;
    if v.dims() != k.dims() || mask.dims() != [b, tq, tk] || hkv == 0 || h % hkv != 0 {
        bail!(
            "attention: q {:?}, k {:?}, v {:?}, mask {:?}",
            q.dims(),
            k.dims(),
            v.dims(),
            mask.dims()
        );
    }
    let rep = h / hkv;
    let q = q.contiguous()?;
    let mask = mask.contiguous()?;
    let mut out = vec![0f32; b * tq * h * dh];
    with_strided(&q, |qs, _| {
        with_strided(&mask, |ms, _| {
            with_strided(k, |ks, kst| {
                with_strided(v, |vs, vst| {
                    if kst[3] != 1 || vst[3] != 1 {
                        bail!("attention: keys/values need a contiguous last dimension");
                    }
                    out.par_chunks_mut(dh).with_min_len(8).enumerate().for_each(|(row, o)| {
                        // Output rows are ordered (b, i, head).
                        let (bi, rest) = (row / (tq * h), row % (tq * h));
                        let (i, hi) = (rest / h, rest % h);
                        let kh = hi / rep;
                        let qrow = &qs[((bi * h + hi) * tq + i) * dh..][..dh];
                        let mrow = &ms[(bi * tq + i) * tk..][..tk];
                        let mut scores = vec![0f32; tk];
                        let mut max = f32::NEG_INFINITY;
                        for (j, s) in scores.iter_mut().enumerate() {
                            if mrow[j] == f32::NEG_INFINITY {
                                *s = f32::NEG_INFINITY;
                                continue;
                            }
                            let krow = &ks[bi * kst[0] + kh * kst[1] + j * kst[2]..][..dh];
                            *s = dot(qrow, krow) * scale + mrow[j];
                            max = max.max(*s);
                        }
                        if max == f32::NEG_INFINITY {
                            return;
                        }
                        let mut sum = 0f32;
                        for s in scores.iter_mut() {
                            *s = (*s - max).exp();
                            sum += *s;
                        }
                        let inv = 1.0 / sum;
                        for (j, &p) in scores.iter().enumerate() {
                            if p == 0.0 {
                                continue;
                            }
                            let vrow = &vs[bi * vst[0] + kh * vst[1] + j * vst[2]..][..dh];
                            let w = p * inv;
                            for (o, &x) in o.iter_mut().zip(vrow) {
                                *o += w * x;
                            }
                        }
                    });
                    Ok(())
                })
            })
        })
    })?;
    Tensor::from_vec(out, (b * tq, h * dh), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention of one query row, computed the plain way.
    fn naive(
        q: &[f32],
        keys: &[Vec<f32>],
        values: &[Vec<f32>],
        mask: &[f32],
        scale: f32,
    ) -> Vec<f32> {
        let scores: Vec<f32> = keys
            .iter()
            .zip(mask)
            .map(|(k, m)| q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale + m)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return vec![0.0; q.len()];
        }
        let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        let mut out = vec![0f32; q.len()];
        for (p, v) in e.iter().zip(values) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += p / sum * x;
            }
        }
        out
    }

    #[test]
    fn grouped_heads_strided_caches_and_masked_rows_match_the_plain_computation() {
        let dev = Device::Cpu;
        let (b, h, hkv, tq, tk, dh) = (2usize, 6usize, 2usize, 3usize, 37usize, 20usize);
        let q = Tensor::randn(0f32, 1.0, (b, h, tq, dh), &dev).unwrap();
        // Keys and values are a view of a longer cache (strided along the positions).
        let kc = Tensor::randn(0f32, 1.0, (b, hkv, tk + 9, dh), &dev).unwrap();
        let vc = Tensor::randn(0f32, 1.0, (b, hkv, tk + 9, dh), &dev).unwrap();
        let (k, v) = (kc.narrow(2, 0, tk).unwrap(), vc.narrow(2, 0, tk).unwrap());
        let mut mask = vec![0f32; b * tq * tk];
        for (idx, m) in mask.iter_mut().enumerate() {
            let (row, j) = (idx / tk, idx % tk);
            // Row 4 sees nothing (a padding position); the others miss some keys.
            if row == 4 || (j + row) % 5 == 0 {
                *m = f32::NEG_INFINITY;
            }
        }
        let mask_t = Tensor::from_vec(mask.clone(), (b, tq, tk), &dev).unwrap();
        let got = attention_nograd(&q, &k, &v, &mask_t, 0.3).unwrap().to_vec2::<f32>().unwrap();
        let (kv, vv) = (k.contiguous().unwrap(), v.contiguous().unwrap());
        let q4: Vec<Vec<Vec<Vec<f32>>>> =
            (0..b).map(|bi| q.get(bi).unwrap().to_vec3().unwrap()).collect();
        let k4: Vec<Vec<Vec<Vec<f32>>>> =
            (0..b).map(|bi| kv.get(bi).unwrap().to_vec3().unwrap()).collect();
        let v4: Vec<Vec<Vec<Vec<f32>>>> =
            (0..b).map(|bi| vv.get(bi).unwrap().to_vec3().unwrap()).collect();
        for bi in 0..b {
            for i in 0..tq {
                let m = &mask[(bi * tq + i) * tk..][..tk];
                for hi in 0..h {
                    let kh = hi / (h / hkv);
                    let want = naive(&q4[bi][hi][i], &k4[bi][kh], &v4[bi][kh], m, 0.3);
                    let row = &got[bi * tq + i][hi * dh..(hi + 1) * dh];
                    for (a, w) in row.iter().zip(&want) {
                        assert!((a - w).abs() < 1e-5, "b{bi} i{i} h{hi}: {a} vs {w}");
                    }
                }
            }
        }
    }
}
