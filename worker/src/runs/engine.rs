//! Sampling and grading every prompt of a dataset, chunk by chunk.

use crate::sampler::SamplingParams;
use crate::trainer::rollout::{Group, Rollout, RolloutTimes};
use crate::trainer::{Dataset, Result};

/// Sequences sampled per rollout call (prompts × completions), as wide as a default training
/// step's batch.
pub const SEQUENCES_PER_CALL: usize = 64;

/// The prompts of a dataset of `prompts` rows in rollout calls of about
/// [`SEQUENCES_PER_CALL`] sequences for `n` completions each (at least one prompt per call);
/// between calls a run checks its lease and reports progress.
pub fn prompt_chunks(prompts: usize, n: usize) -> Vec<Vec<usize>> {
    let per_call = (SEQUENCES_PER_CALL / n.max(1)).max(1);
    (0..prompts).collect::<Vec<_>>().chunks(per_call).map(<[usize]>::to_vec).collect()
}

/// Samples `params.n` completions for each of `prompts` (row indices of `dataset`) and grades
/// them: one rollout call, with its sampling and grading times.
pub fn sample_and_grade(
    rollout: &Rollout<'_>,
    dataset: &Dataset,
    prompts: &[usize],
    params: &SamplingParams,
) -> Result<(Vec<Group>, RolloutTimes)> {
    rollout.run(&dataset.examples, prompts, params)
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunks_cover_every_prompt_once_in_calls_of_bounded_width() {
        let chunks = super::prompt_chunks(10, 16);
        assert_eq!(chunks, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(super::prompt_chunks(3, 1000), vec![vec![0], vec![1], vec![2]]);
        assert!(super::prompt_chunks(0, 4).is_empty());
    }
}
