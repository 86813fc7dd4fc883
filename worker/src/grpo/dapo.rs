//! DAPO extras: overlong reward shaping, truncated-sample masking and dynamic sampling.

use candle_core::Tensor;

use super::advantages::group_has_contrast;
use super::error::{invalid_input, GrpoError, Result, TensorContext};
use super::tensor_ops::token_dims;

/// DAPO's soft overlong punishment: 0 up to `max − buffer` tokens, then falling linearly to
/// `−penalty_factor` at `max` tokens (and staying there beyond).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverlongShaping {
    max_completion_tokens: usize,
    buffer: usize,
    penalty_factor: f64,
}

impl OverlongShaping {
    /// Shaping for completions limited to `max_completion_tokens`, with a soft zone of `buffer`
    /// tokens before the limit (0 disables the penalty) and a full penalty of `penalty_factor`.
    pub fn new(max_completion_tokens: usize, buffer: usize, penalty_factor: f64) -> Result<Self> {
        if buffer > max_completion_tokens {
            return Err(GrpoError::InvalidConfig(format!(
                "overlong_buffer ({buffer}) exceeds max_completion_tokens ({max_completion_tokens})"
            )));
        }
        if !(penalty_factor.is_finite() && penalty_factor >= 0.0) {
            return Err(GrpoError::InvalidConfig(format!(
                "overlong penalty factor must be finite and >= 0, got {penalty_factor}"
            )));
        }
        Ok(OverlongShaping { max_completion_tokens, buffer, penalty_factor })
    }

    /// The (non-positive) reward term for a completion of `length` tokens.
    pub fn penalty(&self, length: usize) -> f64 {
        if self.buffer == 0 {
            return 0.0;
        }
        let soft_start = self.max_completion_tokens - self.buffer;
        if length <= soft_start {
            return 0.0;
        }
        let excess = (length - soft_start).min(self.buffer) as f64;
        -self.penalty_factor * excess / self.buffer as f64
    }

    /// Adds the penalty for each completion's length to its reward, in place.
    pub fn apply(&self, rewards: &mut [f64], lengths: &[usize]) -> Result<()> {
        if rewards.len() != lengths.len() {
            return Err(invalid_input(format!(
                "{} rewards but {} completion lengths",
                rewards.len(),
                lengths.len()
            )));
        }
        for (reward, &length) in rewards.iter_mut().zip(lengths) {
            *reward += self.penalty(length);
        }
        Ok(())
    }
}

/// The `[N, T]` loss mask with the rows of truncated completions zeroed (DAPO's overlong
/// filtering), so a cut-off answer is neither rewarded nor punished.
pub fn mask_truncated(mask: &Tensor, truncated: &[bool]) -> Result<Tensor> {
    let (responses, _) = token_dims(mask, "mask")?;
    if truncated.len() != responses {
        return Err(invalid_input(format!(
            "{} truncation flags for {responses} responses",
            truncated.len()
        )));
    }
    let keep: Vec<f64> = truncated.iter().map(|&cut| if cut { 0.0 } else { 1.0 }).collect();
    Tensor::new(keep, mask.device())
        .and_then(|keep| keep.to_dtype(mask.dtype()))
        .and_then(|keep| keep.reshape((responses, 1)))
        .and_then(|keep| mask.broadcast_mul(&keep))
        .ctx("masking truncated responses")
}

/// What [`DynamicSampler::offer`] did with a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferOutcome {
    /// The group has contrast and joined the batch.
    Kept,
    /// All rewards were equal: no learning signal.
    DroppedNoContrast,
    /// The batch already holds the target number of groups.
    DroppedBatchFull,
}

/// DAPO dynamic sampling bookkeeping: keeps groups with reward contrast until `target_groups`
/// are collected or `max_groups_drawn` groups have been drawn.
#[derive(Debug, Clone)]
pub struct DynamicSampler<G> {
    target_groups: usize,
    max_groups_drawn: usize,
    kept: Vec<G>,
    drawn: usize,
}

/// The batch dynamic sampling collected.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicSamplingOutcome<G> {
    /// The kept groups, in the order they were offered.
    pub groups: Vec<G>,
    /// How many groups were drawn (sampled and graded) in total.
    pub groups_drawn: usize,
    /// How many drawn groups were not kept.
    pub groups_dropped: usize,
    /// Whether the batch reached the target before the cap.
    pub reached_target: bool,
}

impl<G> DynamicSampler<G> {
    /// A sampler that wants `target_groups` (> 0) groups and draws at most `max_groups_drawn`
    /// (≥ `target_groups`).
    pub fn new(target_groups: usize, max_groups_drawn: usize) -> Result<Self> {
        if target_groups == 0 {
            return Err(GrpoError::InvalidConfig(
                "dynamic sampling needs a target of at least 1 group".to_string(),
            ));
        }
        if max_groups_drawn < target_groups {
            return Err(GrpoError::InvalidConfig(format!(
                "dynamic sampling cap ({max_groups_drawn}) is below the target ({target_groups})"
            )));
        }
        Ok(DynamicSampler {
            target_groups,
            max_groups_drawn,
            kept: Vec::with_capacity(target_groups),
            drawn: 0,
        })
    }

    /// Records one drawn group with its rewards; keeps it if it has contrast and there is room.
    pub fn offer(&mut self, group: G, rewards: &[f64]) -> OfferOutcome {
        self.drawn += 1;
        if !group_has_contrast(rewards) {
            OfferOutcome::DroppedNoContrast
        } else if self.kept.len() >= self.target_groups {
            OfferOutcome::DroppedBatchFull
        } else {
            self.kept.push(group);
            OfferOutcome::Kept
        }
    }

    /// Groups still wanted (0 once the batch is full).
    pub fn groups_missing(&self) -> usize {
        self.target_groups - self.kept.len()
    }

    /// Groups that may still be drawn before the cap.
    pub fn draws_left(&self) -> usize {
        self.max_groups_drawn.saturating_sub(self.drawn)
    }

    /// True while the batch is short and the cap allows more draws.
    pub fn needs_more(&self) -> bool {
        self.groups_missing() > 0 && self.draws_left() > 0
    }

    /// Groups drawn so far.
    pub fn groups_drawn(&self) -> usize {
        self.drawn
    }

    /// Ends the sampling; logs a warning when the cap stopped it short of the target.
    pub fn finish(self) -> DynamicSamplingOutcome<G> {
        let reached_target = self.kept.len() == self.target_groups;
        if !reached_target {
            tracing::warn!(
                kept = self.kept.len(),
                target = self.target_groups,
                drawn = self.drawn,
                "dynamic sampling hit its cap before filling the batch"
            );
        }
        DynamicSamplingOutcome {
            groups_dropped: self.drawn - self.kept.len(),
            groups_drawn: self.drawn,
            groups: self.kept,
            reached_target,
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn overlong_penalty_follows_the_dapo_schedule() {
        let shaping = OverlongShaping::new(100, 20, 1.0).unwrap();
        assert_eq!(shaping.penalty(0), 0.0);
        assert_eq!(shaping.penalty(80), 0.0);
        assert!((shaping.penalty(81) + 0.05).abs() < 1e-12);
        assert!((shaping.penalty(90) + 0.5).abs() < 1e-12);
        assert_eq!(shaping.penalty(100), -1.0);
        assert_eq!(shaping.penalty(130), -1.0);
        let mut rewards = vec![1.0, 1.0, 0.0];
        shaping.apply(&mut rewards, &[10, 95, 100]).unwrap();
        assert_eq!(rewards, vec![1.0, 0.25, -1.0]);
        assert!(shaping.apply(&mut rewards, &[1]).is_err());
        let disabled = OverlongShaping::new(100, 0, 1.0).unwrap();
        assert_eq!(disabled.penalty(100), 0.0);
        let half = OverlongShaping::new(100, 20, 0.5).unwrap();
        assert_eq!(half.penalty(100), -0.5);
        assert!(OverlongShaping::new(10, 11, 1.0).is_err());
        assert!(OverlongShaping::new(10, 5, f64::NAN).is_err());
    }

    #[test]
    fn truncated_rows_are_masked_out() {
        let mask = Tensor::new(&[[1.0f32, 1.0, 0.0], [1.0, 1.0, 1.0]], &Device::Cpu).unwrap();
        let masked = mask_truncated(&mask, &[false, true]).unwrap();
        assert_eq!(
            masked.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 1.0, 0.0], vec![0.0, 0.0, 0.0]]
        );
        assert!(mask_truncated(&mask, &[true]).is_err());
    }

    #[test]
    fn dynamic_sampling_keeps_contrasting_groups_until_the_batch_is_full() {
        let mut sampler = DynamicSampler::new(2, 10).unwrap();
        let groups = [
            ("all wrong", vec![0.0, 0.0]),
            ("mixed 1", vec![1.0, 0.0]),
            ("all right", vec![1.0, 1.0]),
            ("mixed 2", vec![0.5, 1.0]),
            ("mixed 3", vec![0.0, 1.0]),
        ];
        let mut outcomes = Vec::new();
        for (name, rewards) in &groups {
            outcomes.push(sampler.offer(*name, rewards));
        }
        assert_eq!(
            outcomes,
            vec![
                OfferOutcome::DroppedNoContrast,
                OfferOutcome::Kept,
                OfferOutcome::DroppedNoContrast,
                OfferOutcome::Kept,
                OfferOutcome::DroppedBatchFull,
            ]
        );
        assert!(!sampler.needs_more());
        let outcome = sampler.finish();
        assert_eq!(outcome.groups, vec!["mixed 1", "mixed 2"]);
        assert_eq!(outcome.groups_drawn, 5);
        assert_eq!(outcome.groups_dropped, 3);
        assert!(outcome.reached_target);
    }

    #[test]
    fn dynamic_sampling_stops_at_the_cap() {
        let mut sampler = DynamicSampler::new(3, 4).unwrap();
        let mut drawn = 0;
        while sampler.needs_more() {
            let rewards = if drawn == 1 { [1.0, 0.0] } else { [1.0, 1.0] };
            sampler.offer(drawn, &rewards);
            drawn += 1;
        }
        assert_eq!(drawn, 4);
        assert_eq!(sampler.groups_missing(), 2);
        let outcome = sampler.finish();
        assert_eq!(outcome.groups, vec![1]);
        assert_eq!(outcome.groups_drawn, 4);
        assert!(!outcome.reached_target);
        assert!(DynamicSampler::<()>::new(0, 4).is_err());
        assert!(DynamicSampler::<()>::new(5, 4).is_err());
    }
}
