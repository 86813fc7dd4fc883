//! The asynchronous rollout–training pipeline (`max_staleness: 1`): while step n trains, the
//! groups of step n+1 are sampled and graded in the background from a snapshot of the weights
//! step n started from, on their own share of the cores. Step n+1 then trains on them one
//! optimizer step off-policy (`staleness` 1 in its metrics row), with the truncated importance
//! weights `min(p_trainer / p_sampler, tis_cap)` against the sampler's log-probs; its
//! `sampler_kl` measures the lag. The background draw is joined before the step returns, so
//! between steps nothing runs: the drawn groups wait in [`InFlight`] and a checkpoint saves
//! them ([`IN_FLIGHT_FILE`]), which makes resuming exact (they could not be regenerated: the
//! weights that sampled them are gone).

use super::dataset::Example;
use super::draw::{Drawer, Drawn};
use super::error::{Result, TrainerError};
use super::rollout::Rollout;
use super::step::Trainer;
use super::tuning::Objective;
use crate::error::WorkerError;
use crate::tokenizer::ChatTokenizer;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use verity_core::environment::Environment;
use verity_verifiers::Grader;

/// File holding the groups drawn ahead for the next step inside a checkpoint folder.
pub const IN_FLIGHT_FILE: &str = "rollouts_in_flight.json";

/// Groups drawn ahead for step `step` by the weights after `policy_step` optimizer steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// The step that trains on them.
    pub step: u64,
    /// Optimizer steps the sampling weights had taken.
    pub policy_step: u64,
    /// The groups, as drawn.
    pub drawn: Drawn,
}

/// What the background rollout shares with the trainer, built at the first asynchronous step:
/// copies of the tokenizer, grader and training rows, and the two thread pools the cores are
/// split into (rollout: half of them, at least one; training: the rest, at least one), so the
/// two phases do not fight over the same threads.
#[derive(Clone)]
pub(super) struct Pipeline {
    tokenizer: Arc<ChatTokenizer>,
    grader: Grader,
    examples: Arc<Vec<Example>>,
    environment: Option<Environment>,
    constraint: Option<crate::constrained::OutputConstraint>,
    rollout_pool: Arc<rayon::ThreadPool>,
    training_pool: Arc<rayon::ThreadPool>,
}

fn thread_pool(threads: usize, name: &'static str) -> Result<Arc<rayon::ThreadPool>> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("verity-{name}-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| WorkerError::Model(format!("starting the {name} threads: {e}")).into())
}

impl Pipeline {
    fn new(trainer: &Trainer) -> Result<Pipeline> {
        let Objective::Reinforcement { grader, environment, .. } = &trainer.objective else {
            return Err(TrainerError::Config("only reinforcement jobs sample rollouts".into()));
        };
        let threads = rayon::current_num_threads();
        let rollout = (threads / 2).max(1);
        Ok(Pipeline {
            tokenizer: Arc::new(trainer.tokenizer.clone()),
            grader: (**grader).clone(),
            examples: Arc::new(trainer.train.examples.clone()),
            environment: environment.as_deref().cloned(),
            constraint: trainer.constraint.clone(),
            rollout_pool: thread_pool(rollout, "rollout")?,
            training_pool: thread_pool(threads.saturating_sub(rollout).max(1), "training")?,
        })
    }
}

impl Trainer {
    /// This step's groups: those drawn ahead for it, or drawn now from the current weights.
    /// Returns them with the optimizer steps the sampling weights had taken.
    pub(super) fn take_or_draw(&mut self, step: u64) -> Result<(Drawn, u64)> {
        match self.in_flight.take() {
            Some(ahead) if ahead.step == step => Ok((ahead.drawn, ahead.policy_step)),
            _ => {
                let drawn = self.draw_groups(step)?;
                let policy_step = drawn.oldest_policy_step.unwrap_or(self.step);
                Ok((drawn, policy_step))
            }
        }
    }

    /// Runs `train` (step `step`'s optimisation). With `max_staleness` ≥ 1 and steps left, the
    /// next step's groups are drawn meanwhile from a snapshot of the weights before this
    /// update, and wait in `in_flight`.
    pub(super) fn train_overlapped<T: Send>(
        &mut self,
        step: u64,
        train: impl FnOnce(&mut Trainer) -> Result<T> + Send,
    ) -> Result<T> {
        if self.hp.max_staleness == 0 || step >= self.total_steps {
            return train(self);
        }
        let pipeline = match &self.pipeline {
            Some(p) => p.clone(),
            None => {
                let p = Pipeline::new(self)?;
                self.pipeline = Some(p.clone());
                p
            }
        };
        let policy = self.model.snapshot()?;
        let mut order = self.order.clone();
        let (hp, seed, graders) = (self.hp.clone(), self.seed, self.pool.clone());
        let (next, policy_step) = (step + 1, self.step);
        let (trained, drawn) = std::thread::scope(|scope| {
            let background = scope.spawn(|| {
                pipeline.rollout_pool.install(|| {
                    let rollout = Rollout {
                        model: &policy,
                        tokenizer: &pipeline.tokenizer,
                        grader: &pipeline.grader,
                        pool: &graders,
                        phases: None,
                        environment: pipeline.environment.as_ref(),
                        sampled: None,
                        constraint: pipeline.constraint.as_ref(),
                    };
                    Drawer { rollout, examples: &pipeline.examples, hp: &hp, seed }
                        .draw(&mut order, next)
                })
            });
            let trained = pipeline.training_pool.install(|| train(self));
            let drawn = background.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (trained, drawn)
        });
        let trained = trained?;
        self.in_flight = Some(InFlight { step: next, policy_step, drawn: drawn? });
        self.order = order;
        Ok(trained)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::grpo::truncated_is_weights;
    use candle_core::Tensor;
    use verity_core::spec::Hyperparameters;

    const MODEL_SEED: u64 = 3;

    fn trainer(max_staleness: u32) -> Trainer {
        let hp = Hyperparameters {
            batch_size: Some(2),
            group_size: Some(4),
            learning_rate: 0.05,
            max_steps: Some(3),
            max_completion_tokens: Some(3),
            micro_batch_size: 8,
            tis_cap: Some(1000.0),
            max_staleness,
            temperature: 2.0,
            seed: Some(4),
            ..Hyperparameters::default()
        };
        crate::trainer::testing::tiny_rollout_trainer(hp, 6, MODEL_SEED).unwrap()
    }

    #[test]
    fn staleness_zero_draws_nothing_ahead() {
        let mut t = trainer(0);
        for _ in 0..3 {
            assert_eq!(t.train_step().unwrap().metrics.staleness, 0);
            assert!(t.in_flight.is_none() && t.pipeline.is_none());
        }
    }

    /// Step 2 of a `max_staleness: 1` run trains on groups sampled by the initial weights while
    /// step 1 trained; its importance weights are `p_trainer / p_sampler` of those tokens under
    /// the weights after step 1, which its `sampler_kl` (k3 of the same ratios) shows.
    #[test]
    fn staleness_one_weights_are_the_trainer_over_sampler_probability_ratio() {
        let mut t = trainer(1);
        let initial = crate::testing::tiny_model(Family::Llama, MODEL_SEED).unwrap();
        let first = t.train_step().unwrap();
        assert!(first.metrics.zero_advantage_group_fraction < 1.0, "{:?}", first.metrics);
        assert_eq!(first.metrics.staleness, 0, "step 1 samples on-policy");
        let ahead = t.in_flight.clone().expect("step 2 was drawn during step 1");
        assert_eq!((ahead.step, ahead.policy_step), (2, 0));
        let completions: Vec<&crate::sampler::Completion> =
            ahead.drawn.groups.iter().flat_map(|g| g.completions.iter()).collect();
        let prompts: Vec<Vec<u32>> = ahead
            .drawn
            .groups
            .iter()
            .flat_map(|g| std::iter::repeat_n(t.train.examples[g.example].prompt_ids.clone(), 4))
            .collect();
        let tokens: Vec<Vec<u32>> = completions.iter().map(|c| c.token_ids.clone()).collect();
        let (temperature, pad) = (t.hp.temperature as f32, t.tokenizer.pad_id());
        let score = |model: &crate::model::Transformer| {
            model.completion_logprobs(&prompts, &tokens, temperature, pad, false).unwrap()
        };
        let (before, now) = (score(&initial), score(&t.model));
        let (before_lp, now_lp) =
            (before.logprobs.to_vec2::<f32>().unwrap(), now.logprobs.to_vec2::<f32>().unwrap());
        let width = now_lp[0].len();
        let mut sampler = vec![0f32; completions.len() * width];
        let (mut moved, mut k3, mut count) = (0f32, 0f64, 0usize);
        for (i, c) in completions.iter().enumerate() {
            for (j, &s) in c.logprobs.iter().enumerate() {
                assert!((before_lp[i][j] - s).abs() < 1e-4, "sampled by the initial weights");
                sampler[i * width + j] = s;
                moved = moved.max((now_lp[i][j] - s).abs());
                let log_ratio = (now_lp[i][j] - s) as f64;
                k3 += log_ratio.exp() - 1.0 - log_ratio;
                count += 1;
            }
        }
        assert!(moved > 1e-3, "step 1 changed the policy ({moved})");
        let sampler =
            Tensor::from_vec(sampler, (completions.len(), width), &candle_core::Device::Cpu)
                .unwrap();
        let weights = truncated_is_weights(&now.logprobs, &sampler, &now.mask, 1000.0).unwrap();
        let weights = weights.to_vec2::<f32>().unwrap();
        for (i, c) in completions.iter().enumerate() {
            for (j, &s) in c.logprobs.iter().enumerate() {
                let ratio = (now_lp[i][j] - s).exp();
                assert!((weights[i][j] - ratio).abs() < 1e-5 * ratio.max(1.0), "{i},{j}");
            }
        }
        let second = t.train_step().unwrap();
        assert_eq!(second.metrics.staleness, 1);
        let trained: Vec<String> = second.samples.iter().map(|s| s.completion.clone()).collect();
        let drawn: Vec<String> =
            ahead.drawn.groups.iter().flat_map(|g| g.texts.iter().cloned()).collect();
        assert_eq!(trained, drawn, "step 2 trains on the groups drawn ahead");
        let want = k3 / count as f64;
        let got = second.metrics.sampler_kl;
        assert!(want > 0.0 && (got - want).abs() <= 1e-6 + 0.02 * want, "{got} vs {want}");
    }
}
