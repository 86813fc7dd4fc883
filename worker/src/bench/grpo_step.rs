//! `verity bench grpo-step`: time full GRPO steps (sampling, grading, training) on arithmetic
//! prompts graded by the math grader.

use crate::trainer::dataset::Dataset;
use crate::trainer::error::{Result, TrainerError};
use crate::trainer::step::{Trainer, TrainerOptions};
use serde_json::{json, Value};
use std::time::Instant;
use verity_core::spec::Hyperparameters;
use verity_verifiers::Grader;

/// JSONL of `count` arithmetic questions asking for a `\boxed{}` answer.
pub fn arithmetic_jsonl(count: usize) -> String {
    (0..count)
        .map(|i| {
            let (a, b) = (12 + 7 * i % 50, 3 + 5 * i % 20);
            let row = json!({
                "messages": [{"role": "user", "content": format!("What is {a} + {b}? Put the final answer in \\boxed{{}}.")}],
                "answer": (a + b).to_string(),
            });
            row.to_string() + "\n"
        })
        .collect()
}

/// The math grader against `{{item.answer}}`.
pub fn math_grader() -> Result<Grader> {
    Grader::from_json(r#"{"type": "math", "name": "math", "reference": "{{item.answer}}"}"#)
        .map_err(|e| TrainerError::Grader(e.to_string()))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The recipe knobs `verity bench grpo-step` varies.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpoBenchRecipe {
    /// Precision of the weights rollouts read.
    pub rollout_dtype: verity_core::spec::RolloutDtype,
    /// 1: the asynchronous pipeline samples the next step during each step's training (its
    /// first step still samples up front).
    pub max_staleness: u32,
    /// Partial rollouts: tokens decoded per completion and step.
    pub partial_rollout_tokens: Option<usize>,
    /// DAPO dynamic sampling: groups without reward contrast are replaced (at most 3× the batch
    /// drawn per step).
    pub dynamic_sampling: bool,
}

/// Runs `steps` GRPO steps (β = 0, full fine-tuning) of `prompts` prompts × `group` samples of
/// at most `max_tokens` tokens on the model in `model_dir`; returns one JSON object with the
/// median `seconds_per_step` and median `sampling_s`, `grading_s`, `training_s`, plus
/// `peak_rss_mib`, and `model_tflops`: (2 · generated + 6 · trained tokens) · parameters per
/// second (2 to sample a token, 6 to train on one, prompts included). The `recipe` sets the
/// rollout precision, the asynchronous pipeline and partial rollouts.
pub fn bench_grpo_step(
    bench_model: &super::BenchModel,
    (prompts, group, max_tokens, steps): (usize, usize, usize, usize),
    recipe: GrpoBenchRecipe,
) -> Result<Value> {
    let GrpoBenchRecipe { rollout_dtype, max_staleness, partial_rollout_tokens, dynamic_sampling } =
        recipe;
    let loaded = bench_model.load()?;
    let described = bench_model.describe(&loaded);
    let parameters = super::model_parameters(&loaded);
    let device = loaded.model.device().clone();
    let train = Dataset::from_jsonl(
        &arithmetic_jsonl(prompts.max(1) * steps.max(1)),
        "bench",
        &loaded.tokenizer,
        2048,
    )?;
    let hp = Hyperparameters {
        batch_size: Some(prompts),
        group_size: Some(group),
        learning_rate: 1e-6,
        max_steps: Some(steps),
        max_completion_tokens: Some(max_tokens),
        micro_batch_size: group * prompts,
        rollout_dtype,
        seed: Some(0),
        max_staleness,
        partial_rollout_tokens,
        dynamic_sampling,
        tis_cap: (max_staleness > 0 || partial_rollout_tokens.is_some()).then_some(2.0),
        ..Hyperparameters::default()
    };
    let options = TrainerOptions {
        seed: 0,
        base_model: bench_model.path.display().to_string(),
        graders: verity_verifiers::GraderPool::new(0),
    };
    let mut trainer =
        Trainer::new(loaded.model, loaded.tokenizer, math_grader()?, hp, train, None, options)?;
    let (mut total, mut sampling, mut grading, mut training, mut rewards) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut sampler_kl, mut lengths, mut trained) = (vec![], vec![], vec![]);
    let (mut groups_drawn, mut generated_tokens) = (vec![], vec![]);
    for _ in 0..steps {
        let started = Instant::now();
        let out = trainer.train_step()?;
        total.push(started.elapsed().as_secs_f64());
        sampling.push(out.metrics.sampling_seconds);
        grading.push(out.metrics.grading_seconds);
        training.push(out.metrics.training_seconds);
        rewards.push(out.metrics.reward_mean);
        sampler_kl.push(out.metrics.sampler_kl);
        lengths.push(out.metrics.completion_length_mean);
        trained.push(out.metrics.trained_tokens as f64);
        groups_drawn.push(out.metrics.groups_drawn);
        generated_tokens.push(out.metrics.generated_tokens);
    }
    // Per step, in order (the medians below sort their vectors).
    let (step_seconds, sampling_step_s) = (total.clone(), sampling.clone());
    let seconds = median(&mut total);
    let generated = (prompts * group) as f64 * median(&mut lengths.clone());
    let flops = (2.0 * generated + 6.0 * median(&mut trained)) * parameters as f64;
    let report = json!({
        "bench": "grpo-step",
        "prompts": prompts,
        "group": group,
        "max_tokens": max_tokens,
        "steps": steps,
        "seconds_per_step": seconds,
        "sampling_step_s": sampling_step_s,
        "sampling_s": median(&mut sampling),
        "grading_s": median(&mut grading),
        "training_s": median(&mut training),
        "reward_mean": rewards,
        "rollout_dtype": rollout_dtype,
        "max_staleness": max_staleness,
        "partial_rollout_tokens": partial_rollout_tokens,
        "dynamic_sampling": dynamic_sampling,
        "groups_drawn": groups_drawn,
        "generated_tokens": generated_tokens,
        "step_seconds": step_seconds,
        "sampler_kl": sampler_kl,
        "completion_length_mean": lengths,
        "peak_rss_mib": super::peak_rss_mib(),
        "peak_gpu_mib": crate::device::gpu_memory_peak_mib(&device),
        "model_tflops": flops / seconds / 1e12,
    });
    Ok(super::merge_json(report, described))
}
