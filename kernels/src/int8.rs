//! int8 copies of weights for the memory-bound no-grad products of decoding: a quarter of the
//! f32 bytes to stream per token. Symmetric, one f32 scale per output channel (weight-only
//! "W8A32": activations and sums stay f32); the kernels sum `x · q` and multiply by the
//! channel's scale once at the end.

use super::with_f32;
use candle_core::Result;
use rayon::prelude::*;

/// Which axis of the stored matrix is the output channel (one scale each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleAxis {
    /// A scale per column: an `(in, out)` projection read by the stream kernels.
    Columns,
    /// A scale per row: an `(out, in)` matrix read by dot products (the LM head).
    Rows,
}

/// A row-major int8 matrix with one scale per output channel.
pub struct Int8Matrix {
    values: Vec<i8>,
    scales: Vec<f32>,
    rows: usize,
    cols: usize,
    axis: ScaleAxis,
}

/// Rows per parallel task of the conversion.
const CONVERT_ROWS: usize = 64;

impl Int8Matrix {
    /// Quantises a 2-D f32 CPU tensor: per output channel, `scale = max |w| / 127` and
    /// `q = round(w / scale)` (to nearest even), so `q · scale` is within `scale / 2` of `w`.
    pub fn from_tensor(t: &candle_core::Tensor, axis: ScaleAxis) -> Result<Self> {
        let (rows, cols) = t.dims2()?;
        with_f32(t, |xs| {
            let chunk = CONVERT_ROWS * cols.max(1);
            let scales: Vec<f32> = match axis {
                ScaleAxis::Rows => {
                    xs.par_chunks(cols.max(1)).map(|row| scale_of(abs_max(row))).collect()
                }
                ScaleAxis::Columns => xs
                    .par_chunks(chunk)
                    .map(|band| {
                        let mut m = vec![0f32; cols];
                        for row in band.chunks_exact(cols) {
                            for (m, &v) in m.iter_mut().zip(row) {
                                *m = m.max(v.abs());
                            }
                        }
                        m
                    })
                    .reduce(
                        || vec![0f32; cols],
                        |mut a, b| {
                            a.iter_mut().zip(&b).for_each(|(a, &b)| *a = a.max(b));
                            a
                        },
                    )
                    .into_iter()
                    .map(scale_of)
                    .collect(),
            };
            let inverse: Vec<f32> =
                scales.iter().map(|&s| if s > 0.0 { 1.0 / s } else { 0.0 }).collect();
            let mut values = vec![0i8; xs.len()];
            values.par_chunks_mut(chunk).zip(xs.par_chunks(chunk)).enumerate().for_each(
                |(band, (out, src))| {
                    for (r, (o, s)) in out.chunks_mut(cols).zip(src.chunks(cols)).enumerate() {
                        match axis {
                            ScaleAxis::Columns => {
                                for ((o, &v), &inv) in o.iter_mut().zip(s).zip(&inverse) {
                                    *o = quantise(v * inv);
                                }
                            }
                            ScaleAxis::Rows => {
                                let inv = inverse[band * CONVERT_ROWS + r];
                                for (o, &v) in o.iter_mut().zip(s) {
                                    *o = quantise(v * inv);
                                }
                            }
                        }
                    }
                },
            );
            Ok(Self { values, scales, rows, cols, axis })
        })
    }

    /// `(rows, cols)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The axis whose entries each have a scale.
    pub fn axis(&self) -> ScaleAxis {
        self.axis
    }

    /// Bytes held (values and scales).
    pub fn bytes(&self) -> usize {
        self.values.len() + self.scales.len() * std::mem::size_of::<f32>()
    }

    /// The quantised values, row-major.
    pub(super) fn values(&self) -> &[i8] {
        &self.values
    }

    /// One scale per output channel.
    pub(super) fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The f32 matrix the int8 one stands for (`q · scale`), row-major (tests and checks).
    pub fn dequantised(&self) -> Vec<f32> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let channel = match self.axis {
                    ScaleAxis::Columns => i % self.cols,
                    ScaleAxis::Rows => i / self.cols,
                };
                q as f32 * self.scales[channel]
            })
            .collect()
    }
}

/// The largest magnitude in `xs`.
fn abs_max(xs: &[f32]) -> f32 {
    xs.iter().fold(0f32, |m, &v| m.max(v.abs()))
}

/// The scale that maps a channel's largest magnitude to 127.
fn scale_of(abs_max: f32) -> f32 {
    abs_max / 127.0
}

/// `v` (already divided by its scale, so within ±127) rounded to the nearest integer, ties to
/// even. Adding 1.5·2²³ leaves the rounded integer in the low mantissa bits; branch-free, so the
/// conversion loop vectorises.
#[inline(always)]
fn quantise(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    let v = v.clamp(-127.0, 127.0);
    ((v + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i8
}

/// Widens int8 values to f32 (unscaled).
#[inline(always)]
pub(super) fn widen(values: &[i8], out: &mut [f32]) {
    for (o, &q) in out.iter_mut().zip(values) {
        *o = q as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn each_channel_maps_its_largest_magnitude_to_127_and_rounds_to_nearest() {
        let t =
            Tensor::new(&[[1.0f32, -4.0, 0.0], [-0.3, 1.5, 0.0], [0.25, 1.01, 0.0]], &Device::Cpu)
                .unwrap();
        let by_column = Int8Matrix::from_tensor(&t, ScaleAxis::Columns).unwrap();
        assert_eq!(by_column.scales(), &[1.0 / 127.0, 4.0 / 127.0, 0.0]);
        // -0.3 · 127 = -38.1 → -38; 1.5 · 127 / 4 = 47.6 → 48; 0.25 · 127 = 31.75 → 32.
        assert_eq!(by_column.values(), &[127, -127, 0, -38, 48, 0, 32, 32, 0]);
        let by_row = Int8Matrix::from_tensor(&t, ScaleAxis::Rows).unwrap();
        assert_eq!(by_row.scales(), &[4.0 / 127.0, 1.5 / 127.0, 1.01 / 127.0]);
        assert_eq!(&by_row.values()[..3], &[32, -127, 0]);
        // Every dequantised weight is within half a step of the original.
        let original = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for m in [&by_column, &by_row] {
            for (i, (a, b)) in m.dequantised().iter().zip(&original).enumerate() {
                let channel = if m.axis() == ScaleAxis::Columns { i % 3 } else { i / 3 };
                assert!((a - b).abs() <= m.scales()[channel] / 2.0 + 1e-7, "{i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn rounding_goes_to_the_nearest_integer_and_ties_to_even() {
        let got: Vec<i8> =
            [63.5f32, 62.5, -63.5, 0.49, -0.51, 126.7, 300.0, -300.0].map(quantise).to_vec();
        assert_eq!(got, [64, 62, -64, 0, -1, 127, 127, -127]);
    }
}
