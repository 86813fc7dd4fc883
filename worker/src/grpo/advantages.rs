//! Group-relative advantages: each response is scored against its siblings for the same prompt.

use super::error::{invalid_input, Result};

/// The ε added to the group's population standard deviation before dividing.
pub const ADVANTAGE_EPS: f64 = 1e-6;

/// Advantages for a batch of groups, plus which groups carry a learning signal.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupAdvantages {
    /// One advantage per response, in the order of the input rewards.
    pub advantages: Vec<f64>,
    /// One flag per group: true when the group's rewards are not all equal (non-zero contrast).
    pub informative: Vec<bool>,
}

impl GroupAdvantages {
    /// Indices of the groups with contrast.
    pub fn informative_groups(&self) -> Vec<usize> {
        self.informative
            .iter()
            .enumerate()
            .filter_map(|(index, &informative)| informative.then_some(index))
            .collect()
    }

    /// Fraction of groups whose advantages are all zero (no contrast); 0 for an empty batch.
    pub fn zero_advantage_group_fraction(&self) -> f64 {
        if self.informative.is_empty() {
            return 0.0;
        }
        let uninformative = self.informative.iter().filter(|&&flag| !flag).count();
        uninformative as f64 / self.informative.len() as f64
    }
}

/// True when a group's rewards are not all equal, i.e. the group yields a non-zero advantage.
pub fn group_has_contrast(rewards: &[f64]) -> bool {
    let max = rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = rewards.iter().copied().fold(f64::INFINITY, f64::min);
    max > min
}

/// Mean and population standard deviation of a non-empty slice.
pub(crate) fn mean_and_population_std(values: &[f64]) -> (f64, f64) {
    let count = values.len() as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = values.iter().map(|value| (value - mean).powi(2)).sum::<f64>() / count;
    (mean, variance.sqrt())
}

/// Group-relative advantages for rewards laid out group by group (`group_size` consecutive
/// responses per prompt): `(r − mean) / (population std + 1e-6)` when `scale_rewards`, else
/// `r − mean` (Dr. GRPO).
pub fn group_advantages(
    rewards: &[f64],
    group_size: usize,
    scale_rewards: bool,
) -> Result<GroupAdvantages> {
    if group_size == 0 {
        return Err(invalid_input("group_size must be at least 1"));
    }
    if !rewards.chunks_exact(group_size).remainder().is_empty() {
        return Err(invalid_input(format!(
            "{} rewards do not split into groups of {group_size}",
            rewards.len()
        )));
    }
    if let Some(position) = rewards.iter().position(|reward| !reward.is_finite()) {
        return Err(invalid_input(format!(
            "reward {position} is not finite: {}",
            rewards[position]
        )));
    }
    let mut advantages = Vec::with_capacity(rewards.len());
    let mut informative = Vec::with_capacity(rewards.len() / group_size);
    for group in rewards.chunks(group_size) {
        let (mean, std) = mean_and_population_std(group);
        let scale = if scale_rewards { std + ADVANTAGE_EPS } else { 1.0 };
        advantages.extend(group.iter().map(|reward| (reward - mean) / scale));
        informative.push(group_has_contrast(group));
    }
    Ok(GroupAdvantages { advantages, informative })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpo::test_vectors::load_test_vectors;

    fn assert_close(actual: &[f64], expected: &[f64], tolerance: f64) {
        assert_eq!(actual.len(), expected.len());
        for (index, (a, e)) in actual.iter().zip(expected).enumerate() {
            assert!((a - e).abs() <= tolerance, "index {index}: {a} vs {e}");
        }
    }

    #[test]
    fn reproduces_the_advantage_vectors() {
        let vectors = load_test_vectors();
        assert!(!vectors.advantages.is_empty());
        for case in &vectors.advantages {
            let result =
                group_advantages(&case.rewards, case.group_size, case.scale_by_std).unwrap();
            assert_close(&result.advantages, &case.expected, 1e-9);
            assert_eq!(result.informative_groups(), case.informative_groups);
        }
    }

    #[test]
    fn chapter_worked_examples() {
        // Group A (1,0,0,1) -> ±1; group B (1,0,0,0) -> +1.732 / −0.577; group C all equal -> 0.
        let rewards = [1., 0., 0., 1., 1., 0., 0., 0., 1., 1., 1., 1.];
        let grpo = group_advantages(&rewards, 4, true).unwrap();
        assert_close(&grpo.advantages[..4], &[1., -1., -1., 1.], 1e-5);
        assert_close(&grpo.advantages[4..8], &[1.732, -0.577, -0.577, -0.577], 1e-3);
        assert_close(&grpo.advantages[8..], &[0.; 4], 0.0);
        assert_eq!(grpo.informative, vec![true, true, false]);
        assert!((grpo.zero_advantage_group_fraction() - 1.0 / 3.0).abs() < 1e-12);
        for group in grpo.advantages.chunks(4) {
            assert!(group.iter().sum::<f64>().abs() < 1e-9, "advantages sum to zero");
        }
        // Dr. GRPO on group B: (+0.75, −0.25, −0.25, −0.25); (1,0,1,0) gives ±0.5.
        let dr = group_advantages(&[1., 0., 0., 0., 1., 0., 1., 0.], 4, false).unwrap();
        assert_close(&dr.advantages, &[0.75, -0.25, -0.25, -0.25, 0.5, -0.5, 0.5, -0.5], 1e-12);
        // Check-your-understanding: (0,0,1,1,1,1) -> wrong −1.414, correct +0.707.
        let six = group_advantages(&[0., 0., 1., 1., 1., 1.], 6, true).unwrap();
        assert_close(&six.advantages, &[-1.414, -1.414, 0.707, 0.707, 0.707, 0.707], 1e-3);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(group_advantages(&[1.0, 0.0, 1.0], 2, true).is_err());
        assert!(group_advantages(&[1.0], 0, true).is_err());
        assert!(group_advantages(&[1.0, f64::NAN], 2, true).is_err());
        let empty = group_advantages(&[], 4, true).unwrap();
        assert!(empty.advantages.is_empty());
        assert_eq!(empty.zero_advantage_group_fraction(), 0.0);
    }
}
