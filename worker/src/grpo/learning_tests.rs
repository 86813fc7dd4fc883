//! Learning test: every loss mode turns a uniform toy policy into one that solves its task.
//!
//! The policy is a table of logits `[prompts, positions, vocab]`; a completion is one token per
//! position, and its verifiable reward is the fraction of positions that match the prompt's
//! target sequence. Starting uniform, the expected reward is `1 / vocab` (≈ 0.06). Each step
//! runs the real pipeline pieces: group advantages, (DAPO) dynamic sampling, old/reference
//! log-probs, μ optimisation passes over micro-batches with a step-global normaliser, autograd
//! and a hand-written Adam.

use candle_core::{DType, Device, IndexOp, Tensor, Var, D};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::advantages::group_advantages;
use super::dapo::DynamicSampler;
use super::loss::{policy_loss, Loss, LossConfig, LossStats, PolicyLossInputs, StepNormalizer};
use super::mismatch::{sampler_trainer_kl, truncated_is_weights};

const PROMPTS: usize = 4;
const POSITIONS: usize = 4;
const VOCAB: usize = 16;
const GROUP_SIZE: usize = 8;
const INNER_EPOCHS: usize = 2;
const MICRO_BATCH_RESPONSES: usize = 12;
const LEARNING_RATE: f64 = 0.05;
const MAX_STEPS: usize = 300;
const TARGET_REWARD: f64 = 0.9;

/// The token the prompt `prompt` wants at `position`.
fn target_token(prompt: usize, position: usize) -> usize {
    (3 * prompt + 5 * position + 1) % VOCAB
}

/// Fraction of positions where `tokens` matches the prompt's target.
fn reward(prompt: usize, tokens: &[usize]) -> f64 {
    let hits = tokens
        .iter()
        .enumerate()
        .filter(|&(position, &token)| token == target_token(prompt, position))
        .count();
    hits as f64 / POSITIONS as f64
}

/// Log-softmax over the vocabulary of a `[.., VOCAB]` logits table.
fn log_softmax(logits: &Tensor) -> Tensor {
    let max = logits.max_keepdim(D::Minus1).unwrap().detach();
    let shifted = logits.broadcast_sub(&max).unwrap();
    let log_partition = shifted.exp().unwrap().sum_keepdim(D::Minus1).unwrap().log().unwrap();
    shifted.broadcast_sub(&log_partition).unwrap()
}

/// Expected reward of the policy: mean over prompts and positions of p(target token).
fn expected_reward(logits: &Tensor) -> f64 {
    let probabilities = log_softmax(logits).exp().unwrap().to_vec3::<f64>().unwrap();
    let mut total = 0.0;
    for (prompt, rows) in probabilities.iter().enumerate() {
        for (position, row) in rows.iter().enumerate() {
            total += row[target_token(prompt, position)];
        }
    }
    total / (PROMPTS * POSITIONS) as f64
}

/// One sampled group: a prompt and `GROUP_SIZE` completions with their rewards.
struct Group {
    prompt: usize,
    completions: Vec<Vec<usize>>,
    rewards: Vec<f64>,
}

fn sample_group(prompt: usize, probabilities: &[Vec<Vec<f64>>], rng: &mut StdRng) -> Group {
    let completions: Vec<Vec<usize>> = (0..GROUP_SIZE)
        .map(|_| {
            (0..POSITIONS)
                .map(|position| {
                    let row = &probabilities[prompt][position];
                    let mut draw: f64 = rng.random();
                    row.iter()
                        .position(|&p| {
                            draw -= p;
                            draw < 0.0
                        })
                        .unwrap_or(VOCAB - 1)
                })
                .collect()
        })
        .collect();
    let rewards = completions.iter().map(|tokens| reward(prompt, tokens)).collect();
    Group { prompt, completions, rewards }
}

/// Log-probs `[N, POSITIONS]` of the sampled tokens under `logits` (differentiable).
fn sequence_log_probs(logits: &Tensor, prompts: &Tensor, tokens: &Tensor) -> Tensor {
    log_softmax(logits)
        .index_select(prompts, 0)
        .unwrap()
        .gather(tokens, 2)
        .unwrap()
        .squeeze(2)
        .unwrap()
}

/// Plain Adam over one parameter tensor.
struct Adam {
    first: Tensor,
    second: Tensor,
    steps: i32,
}

impl Adam {
    fn new(parameter: &Var) -> Self {
        Adam {
            first: parameter.zeros_like().unwrap(),
            second: parameter.zeros_like().unwrap(),
            steps: 0,
        }
    }

    fn step(&mut self, parameter: &Var, gradient: &Tensor) {
        let (beta1, beta2, epsilon) = (0.9, 0.999, 1e-8);
        self.steps += 1;
        self.first =
            ((&self.first * beta1).unwrap() + (gradient * (1.0 - beta1)).unwrap()).unwrap();
        self.second = ((&self.second * beta2).unwrap()
            + (gradient.sqr().unwrap() * (1.0 - beta2)).unwrap())
        .unwrap();
        let first_hat = (&self.first / (1.0 - beta1.powi(self.steps))).unwrap();
        let second_hat = (&self.second / (1.0 - beta2.powi(self.steps))).unwrap();
        let update = (first_hat / (second_hat.sqrt().unwrap() + epsilon).unwrap()).unwrap();
        let next = (parameter.as_tensor() - (update * LEARNING_RATE).unwrap()).unwrap();
        parameter.set(&next).unwrap();
    }
}

/// Draws the step's groups: all prompts once, or DAPO dynamic sampling over repeated prompts.
fn draw_groups(
    dynamic_sampling: bool,
    probabilities: &[Vec<Vec<f64>>],
    rng: &mut StdRng,
) -> (Vec<Group>, usize) {
    if !dynamic_sampling {
        let groups = (0..PROMPTS).map(|prompt| sample_group(prompt, probabilities, rng)).collect();
        return (groups, PROMPTS);
    }
    let mut sampler = DynamicSampler::new(PROMPTS, 4 * PROMPTS).unwrap();
    let mut next_prompt = 0;
    while sampler.needs_more() {
        let group = sample_group(next_prompt % PROMPTS, probabilities, rng);
        next_prompt += 1;
        let rewards = group.rewards.clone();
        sampler.offer(group, &rewards);
    }
    let outcome = sampler.finish();
    (outcome.groups, outcome.groups_drawn)
}

/// Pipeline options of a toy run besides the loss config.
#[derive(Clone, Copy, Default)]
struct ToyOptions {
    /// Use DAPO dynamic sampling instead of one group per prompt.
    dynamic_sampling: bool,
    /// Simulate a sampler whose log-probs differ from the trainer's by uniform noise of this
    /// size, and correct with truncated IS weights (cap 2).
    sampler_noise: Option<f64>,
}

/// Result of one training run.
struct TrainingRun {
    initial_reward: f64,
    final_reward: f64,
    steps: usize,
    last_stats: LossStats,
    last_sampler_kl: f64,
}

/// Sampler log-probs: the trainer's plus uniform noise in `[-noise, noise]`.
fn noisy_sampler_log_probs(logp_old: &Tensor, noise: f64, rng: &mut StdRng) -> Tensor {
    let (rows, columns) = logp_old.dims2().unwrap();
    let offsets: Vec<f64> = (0..rows * columns).map(|_| rng.random_range(-noise..=noise)).collect();
    let offsets = Tensor::from_vec(offsets, (rows, columns), logp_old.device()).unwrap();
    (logp_old + offsets).unwrap()
}

fn train(config: &LossConfig, options: ToyOptions, seed: u64) -> TrainingRun {
    let device = Device::Cpu;
    let logits = Var::zeros((PROMPTS, POSITIONS, VOCAB), DType::F64, &device).unwrap();
    let reference = logits.as_tensor().detach().copy().unwrap();
    let mut optimizer = Adam::new(&logits);
    let mut rng = StdRng::seed_from_u64(seed);
    let initial_reward = expected_reward(logits.as_tensor());
    let mut last_stats = LossStats::default();
    let mut last_sampler_kl = 0.0;
    for step in 1..=MAX_STEPS {
        let probabilities =
            log_softmax(logits.as_tensor()).exp().unwrap().to_vec3::<f64>().unwrap();
        let (groups, _drawn) = draw_groups(options.dynamic_sampling, &probabilities, &mut rng);
        let rewards: Vec<f64> = groups.iter().flat_map(|g| g.rewards.clone()).collect();
        let advantages =
            group_advantages(&rewards, GROUP_SIZE, config.mode.default_scale_rewards()).unwrap();
        let responses = rewards.len();
        let prompt_ids: Vec<u32> =
            groups.iter().flat_map(|g| std::iter::repeat_n(g.prompt as u32, GROUP_SIZE)).collect();
        let token_ids: Vec<u32> =
            groups.iter().flat_map(|g| g.completions.iter().flatten().map(|&t| t as u32)).collect();
        let prompts = Tensor::new(prompt_ids, &device).unwrap();
        let tokens =
            Tensor::new(token_ids, &device).unwrap().reshape((responses, POSITIONS, 1)).unwrap();
        let advantages = Tensor::new(advantages.advantages, &device).unwrap();
        let mask = Tensor::ones((responses, POSITIONS), DType::F64, &device).unwrap();
        let logp_old = sequence_log_probs(logits.as_tensor(), &prompts, &tokens).detach();
        let logp_ref = sequence_log_probs(&reference, &prompts, &tokens);
        let is_weights = options.sampler_noise.map(|noise| {
            let logp_sampler = noisy_sampler_log_probs(&logp_old, noise, &mut rng);
            last_sampler_kl = sampler_trainer_kl(&logp_sampler, &logp_old, &mask).unwrap();
            truncated_is_weights(&logp_old, &logp_sampler, &mask, 2.0).unwrap()
        });
        let micro_batches: Vec<(usize, usize)> = (0..responses)
            .step_by(MICRO_BATCH_RESPONSES)
            .map(|start| (start, MICRO_BATCH_RESPONSES.min(responses - start)))
            .collect();
        let masks: Vec<Tensor> =
            micro_batches.iter().map(|&(start, len)| mask.narrow(0, start, len).unwrap()).collect();
        let normalizer = StepNormalizer::from_masks(&masks).unwrap();
        for _ in 0..INNER_EPOCHS {
            let mut gradient = logits.zeros_like().unwrap();
            last_stats = LossStats::default();
            for &(start, len) in &micro_batches {
                let rows = start..start + len;
                let logp = sequence_log_probs(
                    logits.as_tensor(),
                    &prompts.i(rows.clone()).unwrap(),
                    &tokens.i(rows.clone()).unwrap(),
                );
                let logp_old = logp_old.i(rows.clone()).unwrap();
                let logp_ref = logp_ref.i(rows.clone()).unwrap();
                let mask = mask.i(rows.clone()).unwrap();
                let is_weights = is_weights.as_ref().map(|w| w.i(rows.clone()).unwrap());
                let advantages = advantages.i(rows).unwrap();
                let inputs = PolicyLossInputs {
                    logp: &logp,
                    logp_old: &logp_old,
                    logp_ref: Some(&logp_ref),
                    mask: &mask,
                    advantages: &advantages,
                    is_weights: is_weights.as_ref(),
                };
                let output = policy_loss(&inputs, config, &normalizer).unwrap();
                last_stats.merge(&output.stats);
                let grads = output.loss.backward().unwrap();
                gradient = (gradient + grads.get(logits.as_tensor()).unwrap()).unwrap();
            }
            optimizer.step(&logits, &gradient);
        }
        let current = expected_reward(logits.as_tensor());
        if current > TARGET_REWARD {
            return TrainingRun {
                initial_reward,
                final_reward: current,
                steps: step,
                last_stats,
                last_sampler_kl,
            };
        }
    }
    TrainingRun {
        initial_reward,
        final_reward: expected_reward(logits.as_tensor()),
        steps: MAX_STEPS,
        last_stats,
        last_sampler_kl,
    }
}

fn assert_learns(config: LossConfig, options: ToyOptions) -> TrainingRun {
    let run = train(&config, options, 7);
    eprintln!(
        "{}: expected reward {:.3} -> {:.3} in {} steps (last clip low/high {:.3}/{:.3}, kl {:.4}, sampler kl {:.4})",
        config.mode,
        run.initial_reward,
        run.final_reward,
        run.steps,
        run.last_stats.clip_fraction_low(),
        run.last_stats.clip_fraction_high(),
        run.last_stats.kl_mean(),
        run.last_sampler_kl,
    );
    assert!(run.initial_reward < 0.1, "starts near 0: {}", run.initial_reward);
    assert!(
        run.final_reward > TARGET_REWARD,
        "{} reached only {:.3} after {} steps",
        config.mode,
        run.final_reward,
        run.steps
    );
    run
}

#[test]
fn grpo_with_kl_learns() {
    let config = LossConfig { beta: 0.01, ..LossConfig::for_mode(Loss::Grpo, POSITIONS) };
    let run = assert_learns(config, ToyOptions::default());
    assert!(run.last_stats.kl_mean() > 0.0, "the KL term is active");
}

#[test]
fn dapo_with_dynamic_sampling_learns() {
    let options = ToyOptions { dynamic_sampling: true, ..ToyOptions::default() };
    assert_learns(LossConfig::for_mode(Loss::Dapo, POSITIONS), options);
}

#[test]
fn dr_grpo_learns() {
    assert_learns(LossConfig::for_mode(Loss::DrGrpo, POSITIONS), ToyOptions::default());
}

#[test]
fn gspo_learns() {
    assert_learns(LossConfig::for_mode(Loss::Gspo, POSITIONS), ToyOptions::default());
}

#[test]
fn cispo_with_truncated_is_correction_learns() {
    let options = ToyOptions { sampler_noise: Some(0.3), ..ToyOptions::default() };
    let run = assert_learns(LossConfig::for_mode(Loss::Cispo, POSITIONS), options);
    assert!(run.last_sampler_kl > 0.0, "the simulated sampler mismatch is measured");
}
