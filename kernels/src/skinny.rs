//! No-grad matmuls for a few rows (decode steps), written to stream each weight exactly once.
//!
//! For a handful of rows a general gemm spends its time packing the weight; these kernels read
//! each weight row once and reuse it for every input row, so decoding runs near memory speed.

use super::bf16::Bf16Matrix;
use super::int8::{Int8Matrix, ScaleAxis};
#[cfg(target_arch = "x86_64")]
use super::tiles;
use super::{use_cpu_kernel, with_f32};
use candle_core::{bail, Device, Result, Tensor};
use rayon::prelude::*;

/// Largest row count for which the skinny kernels beat gemm.
pub const SKINNY_MAX_ROWS: usize = 8;

/// Widest block of output columns one parallel task computes (its accumulators, at most
/// `SKINNY_MAX_ROWS` rows of it, stay in L1/L2).
const MAX_COLS_PER_TASK: usize = 1024;

/// Whether the skinny kernels apply to rows `x` (CPU f32, at most `max_rows` rows).
pub fn skinny_applies(x: &Tensor, max_rows: usize) -> bool {
    use_cpu_kernel(x) && x.rank() == 2 && x.dim(0).map(|m| m <= max_rows).unwrap_or(false)
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

/// Columns per task: blocks of at most [`MAX_COLS_PER_TASK`] (narrower when there are many
/// rows, so a task's accumulators stay in cache), and at least one per thread.
fn cols_per_task(n: usize, rows: usize) -> usize {
    let per_thread = n.div_ceil(rayon::current_num_threads().max(1));
    let widest = if rows > SKINNY_MAX_ROWS { MAX_COLS_PER_TASK / 4 } else { MAX_COLS_PER_TASK };
    // Multiples of 32: whole AVX-512 strips (two AVX2 strips).
    per_thread.next_multiple_of(32).clamp(32, widest)
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

/// A weight for the skinny kernels: the f32 parameter or its bf16 or int8 copy.
#[derive(Clone, Copy)]
pub enum DecodeWeight<'a> {
    /// The f32 tensor itself.
    F32(&'a Tensor),
    /// A bf16 copy of it.
    Bf16(&'a Bf16Matrix),
    /// An int8 copy of it, scaled per output channel.
    Int8(&'a Int8Matrix),
}

impl DecodeWeight<'_> {
    fn dims(&self) -> Result<(usize, usize)> {
        match self {
            DecodeWeight::F32(t) => t.dims2(),
            DecodeWeight::Bf16(b) => Ok(b.dims()),
            DecodeWeight::Int8(q) => Ok(q.dims()),
        }
    }

    /// Fails unless an int8 weight has its scales on `axis` (the output channels of the
    /// product reading it).
    fn check_scales(&self, axis: ScaleAxis, product: &str) -> Result<()> {
        match self {
            DecodeWeight::Int8(q) if q.axis() != axis => {
                bail!("{product}: the int8 weight is scaled per {:?}, not per {axis:?}", q.axis())
            }
            _ => Ok(()),
        }
    }
}

/// The data of a [`DecodeWeight`].
#[derive(Clone, Copy)]
enum WeightData<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    /// Unscaled values and the per-output-channel scales.
    I8(&'a [i8], &'a [f32]),
}

/// Runs `f` on the data of the weights (f32 ones made contiguous and borrowed from their storage).
fn with_weight_data<R>(
    wts: &[DecodeWeight],
    f: impl FnOnce(&[WeightData]) -> Result<R>,
) -> Result<R> {
    let tensors: Vec<Option<Tensor>> = wts
        .iter()
        .map(|w| match w {
            DecodeWeight::F32(t) => t.contiguous().map(Some),
            DecodeWeight::Bf16(_) | DecodeWeight::Int8(_) => Ok(None),
        })
        .collect::<Result<_>>()?;
    let guards: Vec<_> =
        tensors.iter().map(|t| t.as_ref().map(|t| t.storage_and_layout())).collect();
    let mut data = Vec::with_capacity(wts.len());
    for (w, guard) in wts.iter().zip(&guards) {
        data.push(match (w, guard) {
            (DecodeWeight::Bf16(b), _) => WeightData::Bf16(b.bits()),
            (DecodeWeight::Int8(q), _) => WeightData::I8(q.values(), q.scales()),
            (DecodeWeight::F32(_), Some((storage, layout))) => match &**storage {
                candle_core::Storage::Cpu(cpu) => WeightData::F32(super::f32_slice(cpu, layout)?),
                _ => bail!("kernel expects a CPU tensor"),
            },
            (DecodeWeight::F32(_), None) => bail!("skinny kernel: missing f32 weight"),
        });
    }
    f(&data)
}

/// `acc (rows, w) += x (rows, k) @ wt[:, j0..j0 + w]` for one block of columns, in chunks of at
/// most [`SKINNY_MAX_ROWS`] rows; a bf16 or int8 weight is widened (unscaled) a band of rows at
/// a time.
#[inline(always)]
fn stream_columns_impl(acc: &mut [f32], x: &[f32], wt: WeightData, d: Dims, c: Cols) {
    match wt {
        WeightData::F32(w) => {
            for (accs, xs) in
                acc.chunks_mut(SKINNY_MAX_ROWS * c.w).zip(x.chunks(SKINNY_MAX_ROWS * d.k))
            {
                let m = xs.len() / d.k;
                stream_block(accs, xs, w, Dims { m, ..d }, c);
            }
        }
        WeightData::Bf16(_) | WeightData::I8(..) => {
            // Widen a band of weight rows, then run the f32 kernel over it as a (band, w) matrix.
            const BAND: usize = 16;
            let mut buf = vec![0f32; BAND * c.w];
            let mut xband = vec![0f32; SKINNY_MAX_ROWS * BAND];
            for k0 in (0..d.k).step_by(BAND) {
                let kb = BAND.min(d.k - k0);
                for kk in 0..kb {
                    let start = (k0 + kk) * d.n + c.j0;
                    wt.widen(start..start + c.w, &mut buf[kk * c.w..(kk + 1) * c.w]);
                }
                for (accs, xs) in
                    acc.chunks_mut(SKINNY_MAX_ROWS * c.w).zip(x.chunks(SKINNY_MAX_ROWS * d.k))
                {
                    let m = xs.len() / d.k;
                    for r in 0..m {
                        xband[r * kb..(r + 1) * kb]
                            .copy_from_slice(&xs[r * d.k + k0..r * d.k + k0 + kb]);
                    }
                    let band = Dims { m, k: kb, n: c.w };
                    stream_block(
                        accs,
                        &xband[..m * kb],
                        &buf[..kb * c.w],
                        band,
                        Cols { j0: 0, w: c.w },
                    );
                }
            }
        }
    }
}

/// Whether the AVX-512 stream tiles can run here.
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Calls tile function `$tile::<FMT, R>($args)` for weight format `$fmt` (a [`tiles`] format)
/// and `R = min(rows, 4)` rows.
#[cfg(target_arch = "x86_64")]
macro_rules! for_rows {
    ($tile:ident, $fmt:expr, $rows:expr, $($args:expr),*) => {
        match $fmt {
            tiles::F32 => for_rows!(@rows $tile, { tiles::F32 }, $rows, $($args),*),
            tiles::BF16 => for_rows!(@rows $tile, { tiles::BF16 }, $rows, $($args),*),
            _ => for_rows!(@rows $tile, { tiles::I8 }, $rows, $($args),*),
        }
    };
    (@rows $tile:ident, $fmt:tt, $rows:expr, $($args:expr),*) => {
        match $rows {
            1 => $tile::<$fmt, 1>($($args),*),
            2 => $tile::<$fmt, 2>($($args),*),
            3 => $tile::<$fmt, 3>($($args),*),
            _ => $tile::<$fmt, 4>($($args),*),
        }
    };
}

/// Whether the AVX2/FMA register tiles can run here.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl WeightData<'_> {
    /// Elements held.
    fn len(&self) -> usize {
        match self {
            WeightData::F32(w) => w.len(),
            WeightData::Bf16(b) => b.len(),
            WeightData::I8(q, _) => q.len(),
        }
    }

    /// The data's [`tiles`] format, and a byte pointer to element `idx`.
    #[cfg(target_arch = "x86_64")]
    fn at(&self, idx: usize) -> (u8, *const u8) {
        match self {
            WeightData::F32(w) => (tiles::F32, w[idx..].as_ptr() as *const u8),
            WeightData::Bf16(b) => (tiles::BF16, b[idx..].as_ptr() as *const u8),
            WeightData::I8(q, _) => (tiles::I8, q[idx..].as_ptr() as *const u8),
        }
    }

    /// Elements `range` widened to f32 into `out` (int8 values unscaled).
    fn widen(&self, range: std::ops::Range<usize>, out: &mut [f32]) {
        match self {
            WeightData::F32(w) => out[..range.len()].copy_from_slice(&w[range]),
            WeightData::Bf16(bits) => super::bf16::widen(&bits[range], out),
            WeightData::I8(q, _) => super::int8::widen(&q[range], out),
        }
    }

    /// Multiplies output channels `first..first + width` of `out` (rows of `width` values) by
    /// their int8 scales; other formats need nothing.
    fn scale_outputs(&self, out: &mut [f32], first: usize, width: usize) {
        if let WeightData::I8(_, scales) = self {
            for row in out.chunks_mut(width) {
                for (y, &s) in row.iter_mut().zip(&scales[first..first + width]) {
                    *y *= s;
                }
            }
        }
    }
}

/// `acc (rows, w) = x (rows, k) @ wt[:, j0..j0 + w]` (`acc` starts zeroed): register tiles
/// when the CPU has them, else [`stream_columns_impl`]; int8 sums are scaled at the end.
fn stream_columns(acc: &mut [f32], x: &[f32], wt: WeightData, d: Dims, c: Cols) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        stream_columns_tiled(acc, x, wt, d, c);
        return wt.scale_outputs(acc, c.j0, c.w);
    }
    stream_columns_impl(acc, x, wt, d, c);
    wt.scale_outputs(acc, c.j0, c.w)
}

/// [`stream_columns`] with [`tiles::stream_tile`]: reduction bands of [`tiles::BAND`] rows, each
/// swept over the block's column strips (the weight rows stream in order) — 32 columns wide with
/// AVX-512, else (and for a last 16-column strip) 16 — up to four input rows per tile. Columns
/// past the last whole strip go through [`stream_columns_impl`].
#[cfg(target_arch = "x86_64")]
fn stream_columns_tiled(acc: &mut [f32], x: &[f32], wt: WeightData, d: Dims, c: Cols) {
    use tiles::{stream_tile, stream_tile_wide, BAND, TILE_COLS, TILE_ROWS, WIDE_TILE_COLS};
    let wide_strips = if has_avx512() { c.w - c.w % WIDE_TILE_COLS } else { 0 };
    let strips = c.w - c.w % TILE_COLS;
    assert!(
        acc.len() >= d.m * c.w
            && x.len() >= d.m * d.k
            && wt.len() >= d.k * d.n
            && c.j0 + c.w <= d.n
    );
    for k0 in (0..d.k).step_by(BAND) {
        let kb = BAND.min(d.k - k0);
        let wide = (0..wide_strips).step_by(WIDE_TILE_COLS).map(|jc| (jc, true));
        let narrow = (wide_strips..strips).step_by(TILE_COLS).map(|jc| (jc, false));
        for (jc, is_wide) in wide.chain(narrow) {
            let (fmt, w) = wt.at(k0 * d.n + c.j0 + jc);
            for r0 in (0..d.m).step_by(TILE_ROWS) {
                let a = acc[r0 * c.w + jc..].as_mut_ptr();
                let xs = (x[r0 * d.k + k0..].as_ptr(), d.k);
                let ws = (w, d.n);
                let rows = TILE_ROWS.min(d.m - r0);
                // SAFETY: AVX2/FMA are present (checked by the caller), AVX-512F for the wide
                // strips (`has_avx512`); the asserts above bound every element the tile touches:
                // rows r0..r0 + R < m, columns jc..jc + 32 (wide) or + 16 <= w, reduction rows
                // k0..k0 + kb <= k.
                unsafe {
                    if is_wide {
                        for_rows!(stream_tile_wide, fmt, rows, a, c.w, xs, ws, kb)
                    } else {
                        for_rows!(stream_tile, fmt, rows, a, c.w, xs, ws, kb)
                    }
                }
            }
        }
    }
    if strips < c.w {
        let tw = c.w - strips;
        let mut tail = vec![0f32; d.m * tw];
        stream_columns_impl(&mut tail, x, wt, d, Cols { j0: c.j0 + strips, w: tw });
        for r in 0..d.m {
            acc[r * c.w + strips..(r + 1) * c.w].copy_from_slice(&tail[r * tw..(r + 1) * tw]);
        }
    }
}

/// `x (m, k) @ wt (k, n)` without gradient.
pub fn skinny_matmul(x: &Tensor, wt: DecodeWeight) -> Result<Tensor> {
    let mut out = skinny_matmul_many(x, &[wt])?;
    out.pop().ok_or_else(|| candle_core::Error::Msg("skinny_matmul: no output".into()))
}

/// `x (m, k) @ wt (k, n_i)` for several weights at once (the query, key and value projections of
/// one input, say), without gradient: one parallel pass over all their columns. Rows are taken in
/// groups of fixed size, each output summed in one fixed order, so each row's result does not
/// depend on the others.
pub fn skinny_matmul_many(x: &Tensor, wts: &[DecodeWeight]) -> Result<Vec<Tensor>> {
    let (m, k) = x.dims2()?;
    let mut widths = Vec::with_capacity(wts.len());
    for wt in wts {
        wt.check_scales(ScaleAxis::Columns, "skinny_matmul")?;
        let (k2, n) = wt.dims()?;
        if k != k2 {
            bail!("skinny_matmul: {:?} x {:?}", x.dims(), (k2, n));
        }
        widths.push(n);
    }
    let cols = cols_per_task(widths.iter().sum(), m);
    // (weight, first column, columns) of every task.
    let tasks: Vec<(usize, Cols)> = widths
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| {
            (0..n.div_ceil(cols))
                .map(move |b| (i, Cols { j0: b * cols, w: cols.min(n - b * cols) }))
        })
        .collect();
    let blocks: Vec<Vec<f32>> = with_f32(x, |xs| {
        with_weight_data(wts, |ws| {
            Ok(tasks
                .par_iter()
                .map(|&(i, c)| {
                    let mut acc = vec![0f32; m * c.w];
                    stream_columns(&mut acc, xs, ws[i], Dims { m, k, n: widths[i] }, c);
                    acc
                })
                .collect())
        })
    })?;
    let mut outs: Vec<Vec<f32>> = widths.iter().map(|&n| vec![0f32; m * n]).collect();
    for (&(i, c), acc) in tasks.iter().zip(&blocks) {
        let n = widths[i];
        for r in 0..m {
            outs[i][r * n + c.j0..r * n + c.j0 + c.w].copy_from_slice(&acc[r * c.w..(r + 1) * c.w]);
        }
    }
    outs.into_iter()
        .zip(&widths)
        .map(|(out, &n)| Tensor::from_vec(out, (m, n), &Device::Cpu))
        .collect()
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

/// `out[r][v] = x[r] · w[v0 + v]` for `nv` weight rows (int8 ones unscaled); a bf16 or int8 row
/// is widened once into `buf`.
fn dot_rows(
    out: &mut [f32],
    x: &[f32],
    w: WeightData,
    buf: &mut [f32],
    (m, k): (usize, usize),
    (v0, nv): (usize, usize),
) {
    for v in 0..nv {
        let range = (v0 + v) * k..(v0 + v + 1) * k;
        let wrow: &[f32] = match w {
            WeightData::F32(w) => &w[range],
            _ => {
                w.widen(range, buf);
                buf
            }
        };
        for r in 0..m {
            out[r * nv + v] = dot(&x[r * k..(r + 1) * k], wrow);
        }
    }
}

/// [`dot_rows`] with [`tiles::dot_tile`]: two weight rows against up to four input rows per
/// tile; an odd last weight row goes through [`dot_rows`].
#[cfg(target_arch = "x86_64")]
fn dot_rows_tiled(
    out: &mut [f32],
    x: &[f32],
    w: WeightData,
    buf: &mut [f32],
    (m, k): (usize, usize),
    (v0, nv): (usize, usize),
) {
    use tiles::{dot_tile, dot_tile_wide, TILE_ROWS};
    let wide = has_avx512();
    assert!(out.len() >= m * nv && x.len() >= m * k && w.len() >= (v0 + nv) * k);
    let pairs = nv - nv % 2;
    for v in (0..pairs).step_by(2) {
        let (fmt, wp) = w.at((v0 + v) * k);
        for r0 in (0..m).step_by(TILE_ROWS) {
            let o = (out[r0 * nv + v..].as_mut_ptr(), nv);
            let xs = (x[r0 * k..].as_ptr(), k);
            let ws = (wp, k);
            // SAFETY: AVX2/FMA are present (checked by the caller); the assert above bounds
            // every element: rows r0..r0 + R <= m, weight rows v0 + v, v0 + v + 1 < v0 + nv;
            // the wide tile runs only with AVX-512F (`wide`).
            unsafe {
                if wide {
                    for_rows!(dot_tile_wide, fmt, TILE_ROWS.min(m - r0), o, xs, ws, k)
                } else {
                    for_rows!(dot_tile, fmt, TILE_ROWS.min(m - r0), o, xs, ws, k)
                }
            }
        }
    }
    if pairs < nv {
        let mut last = vec![0f32; m];
        dot_rows(&mut last, x, w, buf, (m, k), (v0 + pairs, 1));
        for (r, value) in last.into_iter().enumerate() {
            out[r * nv + pairs] = value;
        }
    }
}

/// Weight rows (output columns) per parallel task of [`skinny_matmul_nt`].
const NT_ROWS_PER_TASK: usize = 256;

/// `x (m, k) @ w (n, k)^T` without gradient (the LM head on a few rows).
pub fn skinny_matmul_nt(x: &Tensor, w: DecodeWeight) -> Result<Tensor> {
    w.check_scales(ScaleAxis::Rows, "skinny_matmul_nt")?;
    let (m, k) = x.dims2()?;
    let (n, k2) = w.dims()?;
    if k != k2 {
        bail!("skinny_matmul_nt: {:?} x {:?}^T", x.dims(), (n, k2));
    }
    let blocks: Vec<Vec<f32>> = with_f32(x, |xs| {
        with_weight_data(&[w], |ws| {
            let ws = ws[0];
            Ok((0..n.div_ceil(NT_ROWS_PER_TASK))
                .into_par_iter()
                .map(|b| {
                    let v0 = b * NT_ROWS_PER_TASK;
                    let nv = NT_ROWS_PER_TASK.min(n - v0);
                    let mut out = vec![0f32; m * nv];
                    let mut buf = vec![0f32; k];
                    #[cfg(target_arch = "x86_64")]
                    if has_avx2() {
                        dot_rows_tiled(&mut out, xs, ws, &mut buf, (m, k), (v0, nv));
                        ws.scale_outputs(&mut out, v0, nv);
                        return out;
                    }
                    dot_rows(&mut out, xs, ws, &mut buf, (m, k), (v0, nv));
                    ws.scale_outputs(&mut out, v0, nv);
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
            let got = skinny_matmul(&x, DecodeWeight::F32(&wt)).unwrap();
            let d = crate::testing::max_abs_diff(&want, &got);
            assert!(d < 1e-4, "m={m}: {d}");
            let other = Tensor::randn(0f32, 1.0, (70, 45), &dev).unwrap();
            let both = skinny_matmul_many(&x, &[DecodeWeight::F32(&wt), DecodeWeight::F32(&other)])
                .unwrap();
            for (got, w) in both.iter().zip([&wt, &other]) {
                let d = crate::testing::max_abs_diff(&x.matmul(w).unwrap(), got);
                assert!(d < 1e-4, "many m={m}: {d}");
            }
            let w = wt.t().unwrap().contiguous().unwrap();
            let got = skinny_matmul_nt(&x, DecodeWeight::F32(&w)).unwrap();
            let want = x.matmul(&w.t().unwrap()).unwrap();
            let d = crate::testing::max_abs_diff(&want, &got);
            assert!(d < 1e-4, "nt m={m}: {d}");
        }
    }

    #[test]
    fn bf16_weights_give_the_product_of_the_rounded_weights() {
        let dev = Device::Cpu;
        for m in [1usize, 5, 8, 13, 20] {
            let x = Tensor::randn(0f32, 1.0, (m, 70), &dev).unwrap();
            let wt = Tensor::randn(0f32, 1.0, (70, 300 + 37), &dev).unwrap();
            let half = Bf16Matrix::from_tensor(&wt).unwrap();
            let rounded = wt
                .to_dtype(candle_core::DType::BF16)
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap();
            let got = skinny_matmul(&x, DecodeWeight::Bf16(&half)).unwrap();
            let d = crate::testing::max_abs_diff(&x.matmul(&rounded).unwrap(), &got);
            assert!(d < 1e-4, "m={m}: {d}");
            // Each row's result is the same whatever else is in the batch.
            let alone =
                skinny_matmul(&x.narrow(0, m - 1, 1).unwrap(), DecodeWeight::Bf16(&half)).unwrap();
            assert_eq!(alone.to_vec2::<f32>().unwrap()[0], got.to_vec2::<f32>().unwrap()[m - 1]);
            let w = wt.t().unwrap().contiguous().unwrap();
            let half_t = Bf16Matrix::from_tensor(&w).unwrap();
            let got = skinny_matmul_nt(&x, DecodeWeight::Bf16(&half_t)).unwrap();
            let d = crate::testing::max_abs_diff(&x.matmul(&rounded).unwrap(), &got);
            assert!(d < 1e-4, "nt m={m}: {d}");
        }
    }

    #[test]
    fn int8_weights_give_the_product_of_the_dequantised_weights() {
        let dev = Device::Cpu;
        for m in [1usize, 5, 8, 13] {
            let x = Tensor::randn(0f32, 1.0, (m, 70), &dev).unwrap();
            let wt = Tensor::randn(0f32, 1.0, (70, 300 + 37), &dev).unwrap();
            let q = Int8Matrix::from_tensor(&wt, ScaleAxis::Columns).unwrap();
            let dequantised = Tensor::from_vec(q.dequantised(), (70, 337), &dev).unwrap();
            let got = skinny_matmul(&x, DecodeWeight::Int8(&q)).unwrap();
            let d = crate::testing::max_abs_diff(&x.matmul(&dequantised).unwrap(), &got);
            assert!(d < 1e-4, "m={m}: {d}");
            // The quantisation error itself stays small: a product's spread here is about 8.
            let exact = crate::testing::max_abs_diff(&x.matmul(&wt).unwrap(), &got);
            assert!(exact < 0.5, "m={m}: {exact}");
            let alone =
                skinny_matmul(&x.narrow(0, m - 1, 1).unwrap(), DecodeWeight::Int8(&q)).unwrap();
            assert_eq!(alone.to_vec2::<f32>().unwrap()[0], got.to_vec2::<f32>().unwrap()[m - 1]);
            let w = wt.t().unwrap().contiguous().unwrap();
            let q_t = Int8Matrix::from_tensor(&w, ScaleAxis::Rows).unwrap();
            let dequantised_t = Tensor::from_vec(q_t.dequantised(), (337, 70), &dev).unwrap();
            let got = skinny_matmul_nt(&x, DecodeWeight::Int8(&q_t)).unwrap();
            let want = x.matmul(&dequantised_t.t().unwrap()).unwrap();
            let d = crate::testing::max_abs_diff(&want, &got);
            assert!(d < 1e-4, "nt m={m}: {d}");
            // A weight scaled along the other axis is refused, not misread.
            assert!(skinny_matmul_nt(&x, DecodeWeight::Int8(&q)).is_err());
            assert!(skinny_matmul(&x, DecodeWeight::Int8(&q_t)).is_err());
        }
    }
}
