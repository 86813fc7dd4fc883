//! Drawing a step's groups: B prompts from the data order, or (dynamic sampling) rounds of
//! prompts until B groups have reward contrast or the cap is reached. The synchronous step and
//! the asynchronous pipeline's background rollout draw through the same [`Drawer`].

use super::dataset::{DataOrder, Example};
use super::error::Result;
use super::mix_seed;
use super::rollout::{Group, Rollout, RolloutTimes};
use crate::grpo::DynamicSampler;
use crate::sampler::SamplingParams;
use serde::{Deserialize, Serialize};
use verity_core::spec::Hyperparameters;

/// The groups of one step as drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drawn {
    /// The groups to train on (at most `batch_size`).
    pub groups: Vec<Group>,
    /// Groups sampled to fill the batch.
    pub groups_drawn: usize,
    /// Time spent sampling and grading them.
    pub times: RolloutTimes,
}

/// The sampling settings of the recipe `hp`: `n` samples per prompt, seeded with `seed`.
pub fn sampling_params(hp: &Hyperparameters, n: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        n,
        temperature: hp.temperature as f32,
        top_p: hp.top_p as f32,
        top_k: hp.top_k,
        max_new_tokens: hp.max_completion_tokens(),
        stop_strings: hp.stop.clone(),
        seed,
        rollout_dtype: hp.rollout_dtype,
        max_batch_rows: hp.max_batch_rows(),
    }
}

/// What drawing a step's groups reads: the policy that samples (in `rollout`), the training
/// rows, the recipe and the job seed.
pub struct Drawer<'a> {
    /// Samples and grades.
    pub rollout: Rollout<'a>,
    /// The training rows.
    pub examples: &'a [Example],
    /// The recipe.
    pub hp: &'a Hyperparameters,
    /// The effective job seed.
    pub seed: u64,
}

impl Drawer<'_> {
    /// Draws step `step`'s groups, advancing `order` by the prompts drawn.
    pub fn draw(&self, order: &mut DataOrder, step: u64) -> Result<Drawn> {
        let batch = self.hp.batch_size();
        let group = self.hp.group_size();
        let mut times = RolloutTimes::default();
        let params =
            |round: u64| sampling_params(self.hp, group, mix_seed(self.seed, &[step, round]));
        if !self.hp.dynamic_sampling {
            let examples: Vec<usize> = (0..batch).map(|_| order.next_index()).collect();
            let (groups, t) = self.rollout.run(self.examples, &examples, &params(0))?;
            times.add(t);
            return Ok(Drawn { groups, groups_drawn: batch, times });
        }
        let cap = self.hp.max_groups_drawn.unwrap_or(3 * batch);
        let mut sampler = DynamicSampler::new(batch, cap)?;
        let mut round = 0u64;
        while sampler.needs_more() {
            let count = sampler.groups_missing().min(sampler.draws_left()).max(1);
            let examples: Vec<usize> = (0..count).map(|_| order.next_index()).collect();
            let (groups, t) = self.rollout.run(self.examples, &examples, &params(round))?;
            times.add(t);
            for g in groups {
                let rewards = g.rewards();
                let _ = sampler.offer(g, &rewards);
            }
            round += 1;
        }
        let outcome = sampler.finish();
        if !outcome.reached_target {
            tracing::info!(
                step,
                drawn = outcome.groups_drawn,
                kept = outcome.groups.len(),
                "dynamic sampling hit its cap"
            );
        }
        let mut groups = outcome.groups;
        if groups.is_empty() {
            // No group had contrast: train on nothing but still log the step.
            tracing::info!(step, "no group with reward contrast this step");
        }
        groups.truncate(batch);
        Ok(Drawn { groups, groups_drawn: outcome.groups_drawn, times })
    }
}
