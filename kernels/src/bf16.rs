//! bf16 copies of weights for the memory-bound no-grad products of decoding: half the bytes to
//! stream per token, widened back to f32 in cache before the multiply-adds.

use super::with_f32;
use candle_core::Result;
use rayon::prelude::*;

/// A row-major matrix of bf16 values (held as their bit patterns), rounded from f32.
pub struct Bf16Matrix {
    bits: Vec<u16>,
    rows: usize,
    cols: usize,
}

/// Elements converted per parallel task.
const CONVERT_CHUNK: usize = 1 << 16;

impl Bf16Matrix {
    /// Rounds a 2-D f32 CPU tensor to bf16 (round to nearest even).
    pub fn from_tensor(t: &candle_core::Tensor) -> Result<Self> {
        let (rows, cols) = t.dims2()?;
        with_f32(t, |xs| {
            // Written once, without zeroing first: a sampling call converts every weight, and
            // zeroing the fresh pages first would be one more pass over 2 bytes a weight.
            let mut bits: Vec<u16> = Vec::with_capacity(xs.len());
            bits.spare_capacity_mut()
                .par_chunks_mut(CONVERT_CHUNK)
                .zip(xs.par_chunks(CONVERT_CHUNK))
                .for_each(|(out, src)| {
                    for (o, &v) in out.iter_mut().zip(src) {
                        o.write(to_bf16(v));
                    }
                });
            // SAFETY: the chunks above cover the first `xs.len()` slots, each written once.
            unsafe { bits.set_len(xs.len()) };
            Ok(Self { bits, rows, cols })
        })
    }

    /// `(rows, cols)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bits.len() * std::mem::size_of::<u16>()
    }

    /// The bit patterns, row-major.
    pub(super) fn bits(&self) -> &[u16] {
        &self.bits
    }
}

/// `v` rounded to the nearest bf16 (ties to even), as bits; NaN stays NaN (quieted).
/// Branch-free, so the conversion loop vectorises.
#[inline(always)]
fn to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    (if nan { (b >> 16) | 0x40 } else { rounded }) as u16
}

/// Widens bf16 bits to f32 (exact).
#[inline(always)]
pub(super) fn widen(bits: &[u16], out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(bits) {
        *o = f32::from_bits((b as u32) << 16);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_and_widening_exact() {
        let t = candle_core::Tensor::new(
            &[[1.0f32, -2.5, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, f32::MAX, 0.0]],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let m = Bf16Matrix::from_tensor(&t).unwrap();
        let mut back = vec![0f32; 6];
        widen(m.bits(), &mut back);
        // 1 + 1/256 is halfway between 1 and 1 + 1/128: ties go to the even mantissa (1.0);
        // 1 + 3/256 is halfway between 1 + 1/128 and 1 + 2/128: to 1 + 2/128.
        assert_eq!(back[..4], [1.0, -2.5, 1.0, 1.0 + 2.0 / 128.0]);
        assert!(back[4].is_infinite());
        assert_eq!(back[5], 0.0);
        assert_eq!(m.dims(), (1, 6));
    }
}
