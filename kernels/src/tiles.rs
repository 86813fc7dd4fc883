//! AVX2/FMA and AVX-512 register tiles for the skinny no-grad products. A tile keeps its
//! accumulators in registers, so each weight vector it loads (f32, or bf16 or int8 widened in a
//! register) feeds the multiply-adds of up to [`TILE_ROWS`] input rows. Every output element is
//! summed in the same order whatever the other rows are, so results do not depend on batch
//! composition; the stream tiles of both widths do the same fused multiply-adds per element, in
//! the same order, so they give identical results.

use std::arch::x86_64::*;

/// Input rows one tile handles.
pub(super) const TILE_ROWS: usize = 4;
/// Output columns one stream tile handles (two vectors).
pub(super) const TILE_COLS: usize = 16;
/// Reduction rows between accumulator loads and stores of a stream tile.
pub(super) const BAND: usize = 8;

/// Weight format of a tile's data: f32 values.
pub(super) const F32: u8 = 0;
/// Weight format of a tile's data: bf16 bit patterns.
pub(super) const BF16: u8 = 1;
/// Weight format of a tile's data: int8 values (unscaled; the caller applies the scales).
pub(super) const I8: u8 = 2;

/// Bytes per element of weight format `FMT`.
pub(super) const fn element_bytes(fmt: u8) -> usize {
    match fmt {
        F32 => 4,
        BF16 => 2,
        _ => 1,
    }
}

/// Weight `idx` (elements from `w`) of format `FMT`, as f32.
#[inline(always)]
unsafe fn weight_at<const FMT: u8>(w: *const u8, idx: usize) -> f32 {
    match FMT {
        F32 => *(w as *const f32).add(idx),
        BF16 => f32::from_bits((*(w as *const u16).add(idx) as u32) << 16),
        _ => *(w as *const i8).add(idx) as f32,
    }
}

/// Eight weights at `w + idx` (elements) as f32: f32 data, or bf16 bit patterns or int8 values
/// widened.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load8<const FMT: u8>(w: *const u8, idx: usize) -> __m256 {
    match FMT {
        F32 => _mm256_loadu_ps((w as *const f32).add(idx)),
        BF16 => {
            let p = (w as *const u16).add(idx) as *const __m128i;
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p))))
        }
        _ => {
            let p = (w as *const i8).add(idx) as *const __m128i;
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p)))
        }
    }
}

/// Output columns one AVX-512 stream tile handles (two 16-lane vectors).
pub(super) const WIDE_TILE_COLS: usize = 32;

/// Sixteen weights at `w + idx` (elements) as f32: f32 data, or bf16 bit patterns or int8
/// values widened.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load16<const FMT: u8>(w: *const u8, idx: usize) -> __m512 {
    match FMT {
        F32 => _mm512_loadu_ps((w as *const f32).add(idx)),
        BF16 => {
            let p = (w as *const u16).add(idx) as *const __m256i;
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                p,
            ))))
        }
        _ => {
            let p = (w as *const i8).add(idx) as *const __m128i;
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)))
        }
    }
}

/// Defines a stream tile: `acc[r][0..2·lanes] += sum_kk x[r][kk] * w[kk][0..2·lanes]` for `R`
/// rows and `kb` reduction rows, with two vectors of `lanes` f32 per row. `acc`, `x` and `w`
/// point at the tile's first element; `ld*` are their row strides (elements). Both widths run
/// the same fused multiply-adds per element in the same order.
macro_rules! stream_tile {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $vec:ty, $lanes:literal, $load:ident,
     $zero:ident, $loadu:ident, $storeu:ident, $set1:ident, $fmadd:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must support the tile's instruction set, and every addressed element must be
        /// in bounds.
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name<const FMT: u8, const R: usize>(
            acc: *mut f32,
            ldacc: usize,
            (x, ldx): (*const f32, usize),
            (w, ldw): (*const u8, usize),
            kb: usize,
        ) {
            let mut a: [[$vec; 2]; R] = [[$zero(); 2]; R];
            for (r, ar) in a.iter_mut().enumerate() {
                ar[0] = $loadu(acc.add(r * ldacc));
                ar[1] = $loadu(acc.add(r * ldacc + $lanes));
            }
            let elem = element_bytes(FMT);
            // Cache lines one strip of a weight row spans.
            let lines = (2 * $lanes * elem).div_ceil(64);
            for kk in 0..kb {
                // The same strip of the next band, needed one sweep over the block's strips
                // from now.
                let next = w.wrapping_add((kk + BAND) * ldw * elem);
                for line in 0..lines {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line) as *const i8);
                }
                let w0 = $load::<FMT>(w, kk * ldw);
                let w1 = $load::<FMT>(w, kk * ldw + $lanes);
                for (r, ar) in a.iter_mut().enumerate() {
                    let b = $set1(*x.add(r * ldx + kk));
                    ar[0] = $fmadd(b, w0, ar[0]);
                    ar[1] = $fmadd(b, w1, ar[1]);
                }
            }
            for (r, ar) in a.iter().enumerate() {
                $storeu(acc.add(r * ldacc), ar[0]);
                $storeu(acc.add(r * ldacc + $lanes), ar[1]);
            }
        }
    };
}

stream_tile!(
    /// The AVX2/FMA stream tile: [`TILE_COLS`] output columns.
    stream_tile, "avx2,fma", __m256, 8, load8,
    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps
);

stream_tile!(
    /// The AVX-512 stream tile: [`WIDE_TILE_COLS`] output columns (twice the multiply-adds per
    /// instruction).
    stream_tile_wide, "avx512f", __m512, 16, load16,
    _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps
);

/// Horizontal sum of an AVX2 vector (fixed order).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// Horizontal sum of an AVX-512 vector (fixed order: its two halves added, then [`hsum`]).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn hsum16(v: __m512) -> f32 {
    // The upper half through a double-precision view: AVX-512F alone has no f32x8 extract.
    let upper = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let halves = _mm256_add_ps(_mm512_castps512_ps256(v), upper);
    hsum(halves)
}

/// Defines a dot tile: `out[r][v] = x[r] · w[v]` for `R` input rows and two weight rows `v`
/// (length-`k` dot products), `lanes` products at a time per row pair. `out` has row stride
/// `ldout`.
macro_rules! dot_tile {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $lanes:literal, $load:ident, $zero:ident,
     $loadu:ident, $fmadd:ident, $hsum:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must support the tile's instruction set, and every addressed element must be
        /// in bounds.
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name<const FMT: u8, const R: usize>(
            (out, ldout): (*mut f32, usize),
            (x, ldx): (*const f32, usize),
            (w, ldw): (*const u8, usize),
            k: usize,
        ) {
            let mut a = [[$zero(); 2]; R];
            let whole = k - k % $lanes;
            let mut kk = 0;
            while kk < whole {
                let w0 = $load::<FMT>(w, kk);
                let w1 = $load::<FMT>(w, ldw + kk);
                for (r, ar) in a.iter_mut().enumerate() {
                    let xv = $loadu(x.add(r * ldx + kk));
                    ar[0] = $fmadd(xv, w0, ar[0]);
                    ar[1] = $fmadd(xv, w1, ar[1]);
                }
                kk += $lanes;
            }
            let weight = |v: usize, i: usize| -> f32 { weight_at::<FMT>(w, v * ldw + i) };
            for (r, ar) in a.iter().enumerate() {
                for (v, &acc) in ar.iter().enumerate() {
                    let mut sum = $hsum(acc);
                    for i in whole..k {
                        sum += *x.add(r * ldx + i) * weight(v, i);
                    }
                    *out.add(r * ldout + v) = sum;
                }
            }
        }
    };
}

dot_tile!(
    /// The AVX2/FMA dot tile: eight products per row pair and instruction.
    dot_tile, "avx2,fma", 8, load8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, hsum
);

dot_tile!(
    /// The AVX-512 dot tile: sixteen products per row pair and instruction.
    dot_tile_wide, "avx512f,avx2,fma", 16, load16, _mm512_setzero_ps, _mm512_loadu_ps,
    _mm512_fmadd_ps, hsum16
);
