//! No-grad matmuls for a few rows (decode steps), written to stream each weight exactly once.
//!
//! For a handful of rows a general gemm spends its time packing the weight; these kernels read
//! each weight row once and reuse it for every input row, so decoding runs near memory speed.

use super::{use_cpu_kernel, with_f32};
use candle_core::{bail, Device, Result, Tensor};
use rayon::prelude::*;

/// Largest row count for which the skinny kernels beat gemm.
pub const SKINNY_MAX_ROWS: usize = 8;

/// Widest block of output columns one parallel task computes (its accumulators, at most
/// `SKINNY_MAX_ROWS` rows of it, stay in L1/L2).
const MAX_COLS_PER_TASK: usize = 1024;

/// Whether the skinny kernels apply to `x` (CPU f32 with at most [`SKINNY_MAX_ROWS`] rows).
pub fn skinny_applies(x: &Tensor) -> bool {
    use_cpu_kernel(x) && x.rank() == 2 && x.dim(0).map(|m| m <= SKINNY_MAX_ROWS).unwrap_or(false)
}

/// Sizes of `x (m, k) @ wt (k, n)`.
#[derive(Clone, Copy)]
struct Dims {
    m: usize,
    k: usize,
    n: usize,
}

/// A block of output columns `j0..j0 + w`.
#[derive(Clone, Copy)]
struct Cols {
    j0: usize,
    w: usize,
}

/// Columns per task: blocks of at most [`MAX_COLS_PER_TASK`], and at least one per thread.
fn cols_per_task(n: usize) -> usize {
    let per_thread = n.div_ceil(rayon::current_num_threads().max(1));
    per_thread.next_multiple_of(16).clamp(16, MAX_COLS_PER_TASK)
}

/// `acc[r][..w] += sum_k x[r][k] * wt[k][j0..j0 + w]` for all `m` rows, streaming the weight
/// rows in order, four at a time (one accumulator load and store per four products).
#[inline(always)]
fn stream_block(acc: &mut [f32], x: &[f32], wt: &[f32], d: Dims, c: Cols) {
    let (m, k, n, j0, w) = (d.m, d.k, d.n, c.j0, c.w);
    let row = |kk: usize| &wt[kk * n + j0..kk * n + j0 + w];
    let mut kk = 0;
    while kk + 4 <= k {
        let (w0, w1, w2, w3) = (row(kk), row(kk + 1), row(kk + 2), row(kk + 3));
        for r in 0..m {
            let a = &x[r * k + kk..r * k + kk + 4];
            let (a0, a1, a2, a3) = (a[0], a[1], a[2], a[3]);
            let accr = &mut acc[r * w..(r + 1) * w];
            for ((((y, &v0), &v1), &v2), &v3) in accr.iter_mut().zip(w0).zip(w1).zip(w2).zip(w3) {
                *y += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3;
            }
        }
        kk += 4;
    }
    for kk in kk..k {
        let w0 = row(kk);
        for r in 0..m {
            let a = x[r * k + kk];
            for (y, &v) in acc[r * w..(r + 1) * w].iter_mut().zip(w0) {
                *y += a * v;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn stream_block_avx2(acc: &mut [f32], x: &[f32], wt: &[f32], d: Dims, c: Cols) {
    stream_block(acc, x, wt, d, c)
}

fn stream_dispatch(acc: &mut [f32], x: &[f32], wt: &[f32], d: Dims, c: Cols) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { stream_block_avx2(acc, x, wt, d, c) };
    }
    stream_block(acc, x, wt, d, c)
}

/// `x (m, k) @ wt (k, n)` without gradient.
pub fn skinny_matmul(x: &Tensor, wt: &Tensor) -> Result<Tensor> {
    let mut out = skinny_matmul_many(x, &[wt])?;
    out.pop().ok_or_else(|| candle_core::Error::Msg("skinny_matmul: no output".into()))
}

/// `x (m, k) @ wt (k, n_i)` for several weights at once (the query, key and value projections of
/// one input, say), without gradient: one parallel pass over all their columns.
pub fn skinny_matmul_many(x: &Tensor, wts: &[&Tensor]) -> Result<Vec<Tensor>> {
    let (m, k) = x.dims2()?;
    let mut widths = Vec::with_capacity(wts.len());
    for wt in wts {
        let (k2, n) = wt.dims2()?;
        if k != k2 {
            bail!("skinny_matmul: {:?} x {:?}", x.dims(), wt.dims());
        }
        widths.push(n);
    }
    let cols = cols_per_task(widths.iter().sum());
    // (weight, first column, columns) of every task.
    let tasks: Vec<(usize, Cols)> = widths
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| (0..n.div_ceil(cols)).map(move |b| (i, Cols { j0: b * cols, w: cols.min(n - b * cols) })))
        .collect();
    let x = x.contiguous()?;
    let wts: Vec<Tensor> = wts.iter().map(|wt| wt.contiguous()).collect::<Result<_>>()?;
    let guards: Vec<_> = std::iter::once(&x).chain(&wts).map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::with_capacity(guards.len());
    for (storage, layout) in &guards {
        match &**storage {
            candle_core::Storage::Cpu(cpu) => slices.push(super::f32_slice(cpu, layout)?),
            _ => bail!("kernel expects a CPU tensor"),
        }
    }
    let (xs, ws) = (slices[0], &slices[1..]);
    let blocks: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(i, c)| {
            let mut acc = vec![0f32; m * c.w];
            stream_dispatch(&mut acc, xs, ws[i], Dims { m, k, n: widths[i] }, c);
            acc
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = widths.iter().map(|&n| vec![0f32; m * n]).collect();
    for (&(i, c), acc) in tasks.iter().zip(&blocks) {
        let n = widths[i];
        for r in 0..m {
            outs[i][r * n + c.j0..r * n + c.j0 + c.w].copy_from_slice(&acc[r * c.w..(r + 1) * c.w]);
        }
    }
    outs.into_iter().zip(&widths).map(|(out, &n)| Tensor::from_vec(out, (m, n), &Device::Cpu)).collect()
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn dot_rows(out: &mut [f32], x: &[f32], w: &[f32], m: usize, k: usize, v0: usize, nv: usize) {
    for v in 0..nv {
        let wrow = &w[(v0 + v) * k..(v0 + v + 1) * k];
        for r in 0..m {
            out[r * nv + v] = dot(&x[r * k..(r + 1) * k], wrow);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    v0: usize,
    nv: usize,
) {
    dot_rows(out, x, w, m, k, v0, nv)
}

/// Weight rows (output columns) per parallel task of [`skinny_matmul_nt`].
const NT_ROWS_PER_TASK: usize = 256;

/// `x (m, k) @ w (n, k)^T` without gradient (the LM head on a few rows).
pub fn skinny_matmul_nt(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let (n, k2) = w.dims2()?;
    if k != k2 {
        bail!("skinny_matmul_nt: {:?} x {:?}^T", x.dims(), w.dims());
    }
    let blocks: Vec<Vec<f32>> = with_f32(x, |xs| {
        with_f32(w, |ws| {
            Ok((0..n.div_ceil(NT_ROWS_PER_TASK))
                .into_par_iter()
                .map(|b| {
                    let v0 = b * NT_ROWS_PER_TASK;
                    let nv = NT_ROWS_PER_TASK.min(n - v0);
                    let mut out = vec![0f32; m * nv];
                    #[cfg(target_arch = "x86_64")]
                    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                        // SAFETY: the CPU supports the features the function was compiled for.
                        unsafe { dot_rows_avx2(&mut out, xs, ws, m, k, v0, nv) };
                        return out;
                    }
                    dot_rows(&mut out, xs, ws, m, k, v0, nv);
                    out
                })
                .collect())
        })
    })?;
    let mut out = vec![0f32; m * n];
    for (b, blk) in blocks.iter().enumerate() {
        let v0 = b * NT_ROWS_PER_TASK;
        let nv = blk.len() / m.max(1);
        for r in 0..m {
            out[r * n + v0..r * n + v0 + nv].copy_from_slice(&blk[r * nv..(r + 1) * nv]);
        }
    }
    Tensor::from_vec(out, (m, n), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skinny_kernels_match_matmul() {
        let dev = Device::Cpu;
        for m in [1usize, 3, 6, 8, 16] {
            let x = Tensor::randn(0f32, 1.0, (m, 70), &dev).unwrap();
            let wt = Tensor::randn(0f32, 1.0, (70, 300 + 37), &dev).unwrap();
            let want = x.matmul(&wt).unwrap();
            let got = skinny_matmul(&x, &wt).unwrap();
            let d = crate::testing::max_abs_diff(&want, &got);
            assert!(d < 1e-4, "m={m}: {d}");
            let other = Tensor::randn(0f32, 1.0, (70, 45), &dev).unwrap();
            let both = skinny_matmul_many(&x, &[&wt, &other]).unwrap();
            for (got, w) in both.iter().zip([&wt, &other]) {
                let d = crate::testing::max_abs_diff(&x.matmul(w).unwrap(), got);
                assert!(d < 1e-4, "many m={m}: {d}");
            }
            let w = wt.t().unwrap().contiguous().unwrap();
            let got = skinny_matmul_nt(&x, &w).unwrap();
            let want = x.matmul(&w.t().unwrap()).unwrap();
            let d = crate::testing::max_abs_diff(&want, &got);
            assert!(d < 1e-4, "nt m={m}: {d}");
        }
    }
}
