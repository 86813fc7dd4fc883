//! Learning-rate schedules: linear warm-up, then constant or cosine decay.

use serde::{Deserialize, Serialize};

/// Learning-rate schedule: linear warmup, then constant or cosine decay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Steps of linear warmup from 0.
    pub warmup_steps: u64,
    /// Total steps (cosine reaches `min_lr_ratio * lr` here).
    pub total_steps: u64,
    /// Cosine decay after warmup (else constant).
    pub cosine: bool,
    /// Floor of the cosine as a fraction of `lr`.
    pub min_lr_ratio: f64,
}

impl LrSchedule {
    /// A constant rate with no warmup.
    pub fn constant(lr: f64) -> Self {
        Self { lr, warmup_steps: 0, total_steps: 0, cosine: false, min_lr_ratio: 0.0 }
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if !self.cosine || self.total_steps <= self.warmup_steps {
            return self.lr;
        }
        let progress = ((step - self.warmup_steps) as f64
            / (self.total_steps - self.warmup_steps) as f64)
            .min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cos)
    }
}
