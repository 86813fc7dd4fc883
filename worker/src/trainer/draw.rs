//! Drawing a step's groups: B prompts from the data order, or (dynamic sampling) prompts until
//! B groups have reward contrast or the cap is reached — one continuously batched stream for
//! plain completions, rounds of prompts for tool episodes — or (partial rollouts) the
//! groups that finish decoding this step. The synchronous step and the asynchronous pipeline's
//! background rollout draw through the same [`Drawer`].

use super::dataset::{DataOrder, Example};
use super::error::Result;
use super::mix_seed;
use super::rollout::{Group, Rollout, RolloutTimes};
use crate::grpo::DynamicSampler;
use crate::sampler::{Completion, FinishReason, SamplingParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;
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
    /// Optimizer steps of the oldest weights that sampled any of their tokens, when older than
    /// the weights drawing them (partial rollouts carry tokens across steps).
    #[serde(default)]
    pub oldest_policy_step: Option<u64>,
}

/// A group still decoding under partial rollouts (`partial_rollout_tokens`): its completions
/// so far, each token with the log-prob of the weights that sampled it, and the step that
/// sampled its first tokens. Checkpoints save these ([`super::state`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialGroup {
    /// Row index of the prompt.
    pub example: usize,
    /// The completions so far, in sample order.
    pub completions: Vec<Completion>,
    /// The step whose weights sampled the first tokens.
    pub first_step: u64,
}

/// Whether a completion has ended: by EOS or a stop string, or at the completion limit.
pub(super) fn has_ended(completion: &Completion, limit: usize) -> bool {
    completion.finish_reason != FinishReason::Length || completion.token_ids.len() >= limit
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
        constraint: None,
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
            return Ok(Drawn { groups, groups_drawn: batch, times, oldest_policy_step: None });
        }
        let cap = self.hp.max_groups_drawn.unwrap_or(3 * batch);
        let mut sampler = DynamicSampler::new(batch, cap)?;
        if self.rollout.environment.is_none() {
            times.add(self.draw_stream(order, &mut sampler, &params(0))?);
        } else {
            times.add(self.draw_rounds(order, &mut sampler, &params)?);
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
        Ok(Drawn { groups, groups_drawn: outcome.groups_drawn, times, oldest_policy_step: None })
    }

    /// Dynamic sampling as one stream (continuous batching): starts as many groups as the batch
    /// misses; each group is graded as soon as its samples end, and every group dropped for
    /// want of contrast is replaced at once by the next prompt, which joins the rows still
    /// decoding. The same prompts are drawn, in the same order, as by rounds; prompt k of the
    /// stream samples with the stream's seed and index k, so the first `batch_size` groups are
    /// those of the first round.
    fn draw_stream(
        &self,
        order: &mut DataOrder,
        sampler: &mut DynamicSampler<Group>,
        params: &SamplingParams,
    ) -> Result<RolloutTimes> {
        let first: Vec<usize> = (0..sampler.groups_missing().min(sampler.draws_left()))
            .map(|_| order.next_index())
            .collect();
        let mut in_flight = first.len();
        self.rollout.run_stream(self.examples, &first, params, &mut |group| {
            in_flight -= 1;
            let rewards = group.rewards();
            let _ = sampler.offer(group, &rewards);
            let budget = sampler.draws_left().saturating_sub(in_flight);
            let start = sampler.groups_missing().saturating_sub(in_flight).min(budget);
            in_flight += start;
            Ok((0..start).map(|_| order.next_index()).collect())
        })
    }

    /// Dynamic sampling in rounds (tool episodes): each round draws as many prompts as the
    /// batch misses, sampled with that round's parameters, and waits for all of them.
    fn draw_rounds(
        &self,
        order: &mut DataOrder,
        sampler: &mut DynamicSampler<Group>,
        params: &dyn Fn(u64) -> SamplingParams,
    ) -> Result<RolloutTimes> {
        let mut times = RolloutTimes::default();
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
        Ok(times)
    }

    /// Partial rollouts: continues the unfinished completions of the `carried` groups and
    /// starts new groups up to `batch_size`, each decoding at most `segment` new tokens; returns
    /// the groups whose every completion has ended, graded, and leaves the rest in `carried`.
    /// A continued completion is its prompt plus its own tokens so far, so tokens of two
    /// completions never mix, and each token keeps the log-prob of the weights that sampled it.
    pub fn draw_partial(
        &self,
        order: &mut DataOrder,
        step: u64,
        carried: &mut Vec<PartialGroup>,
        segment: usize,
    ) -> Result<Drawn> {
        let (batch, group) = (self.hp.batch_size(), self.hp.group_size());
        let limit = self.hp.max_completion_tokens();
        super::phase::tell(self.rollout.phases, super::phase::Phase::Sampling);
        let started = Instant::now();
        let mut tokens = 0;
        // Continue the unfinished completions, one row each, batched by the tokens they have
        // left (usually all the same: each earlier segment decoded `segment` tokens).
        let mut by_budget: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (g, partial) in carried.iter().enumerate() {
            for (j, c) in partial.completions.iter().enumerate() {
                if !has_ended(c, limit) {
                    let budget = segment.min(limit - c.token_ids.len());
                    by_budget.entry(budget).or_default().push((g, j));
                }
            }
        }
        for (budget, members) in by_budget {
            let prompts: Vec<Vec<u32>> = members
                .iter()
                .map(|&(g, j)| {
                    let partial = &carried[g];
                    let mut ids = self.examples[partial.example].prompt_ids.clone();
                    ids.extend(&partial.completions[j].token_ids);
                    ids
                })
                .collect();
            let mut params =
                sampling_params(self.hp, 1, mix_seed(self.seed, &[step, 1, budget as u64]));
            params.max_new_tokens = budget;
            let more = self.rollout.sample_prompts(&prompts, &params)?;
            for (&(g, j), next) in members.iter().zip(more) {
                tokens += next.token_ids.len();
                let c = &mut carried[g].completions[j];
                c.token_ids.extend(next.token_ids);
                c.logprobs.extend(next.logprobs);
                c.finish_reason = next.finish_reason;
            }
        }
        // New groups fill the batch.
        let fresh = batch.saturating_sub(carried.len());
        if fresh > 0 {
            let examples: Vec<usize> = (0..fresh).map(|_| order.next_index()).collect();
            let prompts: Vec<Vec<u32>> =
                examples.iter().map(|&i| self.examples[i].prompt_ids.clone()).collect();
            let mut params = sampling_params(self.hp, group, mix_seed(self.seed, &[step, 0]));
            params.max_new_tokens = segment.min(limit);
            let completions = self.rollout.sample_prompts(&prompts, &params)?;
            tokens += completions.iter().map(|c| c.token_ids.len()).sum::<usize>();
            let mut completions = completions.into_iter();
            for example in examples {
                let completions = completions.by_ref().take(group).collect();
                carried.push(PartialGroup { example, completions, first_step: step });
            }
        }
        let sampling = started.elapsed().as_secs_f64();
        // The groups whose completions have all ended are graded and trained now.
        let (done, open): (Vec<PartialGroup>, Vec<PartialGroup>) = std::mem::take(carried)
            .into_iter()
            .partition(|g| g.completions.iter().all(|c| has_ended(c, limit)));
        *carried = open;
        let oldest_policy_step =
            done.iter().map(|g| g.first_step.saturating_sub(1)).min().filter(|&s| s + 1 < step);
        let examples: Vec<usize> = done.iter().map(|g| g.example).collect();
        let completions: Vec<Completion> = done
            .into_iter()
            .enumerate()
            .flat_map(|(i, g)| {
                g.completions.into_iter().enumerate().map(move |(j, mut c)| {
                    c.prompt_index = i;
                    c.sample_index = j;
                    c
                })
            })
            .collect();
        let (groups, grading) =
            self.rollout.grade(self.examples, &examples, group, completions, Vec::new())?;
        Ok(Drawn {
            groups,
            groups_drawn: fresh,
            times: RolloutTimes { sampling, grading, tokens },
            oldest_policy_step,
        })
    }
}
