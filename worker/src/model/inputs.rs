//! Building the per-step tensors of a left-padded batch: ids, rotary tables and attention masks.

use crate::error::{Result, WorkerError};
use candle_core::{Device, Tensor};

/// A batch of token sequences left-padded to a common length.
#[derive(Debug, Clone)]
pub struct PaddedBatch {
    /// Row-major `(batch, len)` ids, pads first in each row.
    pub ids: Vec<u32>,
    /// Number of rows.
    pub batch: usize,
    /// Common (padded) length.
    pub len: usize,
    /// Pad count of each row.
    pub pads: Vec<usize>,
}

impl PaddedBatch {
    /// Left-pads `seqs` with `pad_id`; every sequence must be non-empty.
    pub fn new(seqs: &[&[u32]], pad_id: u32) -> Result<Self> {
        if seqs.is_empty() || seqs.iter().any(|s| s.is_empty()) {
            return Err(WorkerError::InvalidArgument(
                "batch must contain non-empty sequences".into(),
            ));
        }
        let len = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(seqs.len() * len);
        let mut pads = Vec::with_capacity(seqs.len());
        for s in seqs {
            let pad = len - s.len();
            ids.extend(std::iter::repeat_n(pad_id, pad));
            ids.extend_from_slice(s);
            pads.push(pad);
        }
        Ok(Self { ids, batch: seqs.len(), len, pads })
    }

    /// Position ids `(batch * len)`: 0 at each row's first real token (pads get 0).
    pub fn positions(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.ids.len());
        for &pad in &self.pads {
            out.extend((0..self.len).map(|j| j.saturating_sub(pad) as u32));
        }
        out
    }
}

/// RoPE frequency table of one model.
#[derive(Debug, Clone)]
pub struct Rotary {
    inv_freq: Vec<f32>,
    /// LongRoPE: the frequencies once a position reaches the original context (given here).
    long: Option<(Vec<f32>, usize)>,
    /// Scale of cos and sin (LongRoPE's attention factor; 1 otherwise).
    scale: f32,
}

impl Rotary {
    /// Frequencies `theta^(-2i/head_dim)` for `i < head_dim/2`, with Llama 3 scaling if given.
    pub fn new(
        head_dim: usize,
        theta: f64,
        scaling: Option<crate::config::Llama3RopeScaling>,
    ) -> Self {
        let half = head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let f = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                (match scaling {
                    Some(s) => llama3_scale(f, s),
                    None => f,
                }) as f32
            })
            .collect();
        Self { inv_freq, long: None, scale: 1.0 }
    }

    /// The table of a model config: its rotary dimensions, base, Llama 3 or LongRoPE scaling.
    pub fn of(config: &crate::config::ModelConfig) -> Self {
        let plain = Self::new(config.rotary_dim, config.rope_theta, config.rope_scaling);
        let Some(l) = &config.long_rope else { return plain };
        // As transformers: inv_freq_i = 1 / (factor_i · theta^(2i/dim)), the plain frequencies
        // divided by the factors.
        let divided = |factors: &[f64]| -> Vec<f32> {
            plain.inv_freq.iter().zip(factors).map(|(&f, d)| (f64::from(f) / d) as f32).collect()
        };
        Self {
            inv_freq: divided(&l.short_factor),
            long: Some((divided(&l.long_factor), l.original_max_position_embeddings)),
            scale: l.effective_attention_factor(config.max_position_embeddings) as f32,
        }
    }

    /// `(cos, sin)` tables `(batch, t, head_dim/2)` for the given positions `(batch * t)`.
    pub fn tables(
        &self,
        positions: &[u32],
        batch: usize,
        t: usize,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        // LongRoPE switches to its long factors for a forward that reaches past the original
        // context (transformers decides per forward from the largest position, as here).
        let inv_freq = match &self.long {
            Some((long, original)) if positions.iter().any(|&p| p as usize + 1 > *original) => long,
            _ => &self.inv_freq,
        };
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos() * self.scale);
                sin.push(a.sin() * self.scale);
            }
        }
        Ok((
            Tensor::from_vec(cos, (batch, t, half), device)?,
            Tensor::from_vec(sin, (batch, t, half), device)?,
        ))
    }
}

/// Llama 3.x frequency scaling of one inverse frequency (as HF `_compute_llama3_parameters`).
fn llama3_scale(freq: f64, s: crate::config::Llama3RopeScaling) -> f64 {
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor
    } else {
        let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

/// The keys each row of a forward may see: from `first_valid[b]` on, except the cache
/// positions in `hidden[b]` (see [`attention_mask_hiding`]).
#[derive(Debug, Clone, Copy)]
pub struct VisibleKeys<'a> {
    /// First real key of each row (left padding before it).
    pub first_valid: &'a [usize],
    /// Positions each row skipped (empty: none).
    pub hidden: &'a [Vec<std::ops::Range<usize>>],
}

pub use verity_kernels::mask::{attention_mask, attention_mask_hiding};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Llama3RopeScaling;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = Rotary::new(128, 500_000.0, None);
        let scaled = Rotary::new(128, 500_000.0, Some(s));
        assert_eq!(scaled.inv_freq[0], plain.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((scaled.inv_freq[last] - plain.inv_freq[last] / 8.0).abs() < 1e-12);
        assert!(scaled.inv_freq.iter().zip(&plain.inv_freq).all(|(a, b)| a <= b));
    }

    #[test]
    fn padded_batches_pad_on_the_left() {
        let pb = PaddedBatch::new(&[&[7, 8], &[9]], 0).unwrap();
        assert_eq!(pb.ids, [7, 8, 0, 9]);
        assert_eq!(pb.positions(), [0, 1, 0, 0]);
        assert!(PaddedBatch::new(&[&[]], 0).is_err());
    }
}
