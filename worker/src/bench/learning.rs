//! `verity bench learn`: a learning-quality run outside the queue — validation before, a
//! fixed number of GRPO steps with periodic evaluation, validation after — reported as JSON
//! lines (one per step and per evaluation) and a closing summary. With a tool environment the
//! rollouts are multi-turn episodes, as in a job with `method.reinforcement.environment`.

use crate::trainer::dataset::Dataset;
use crate::trainer::error::Result;
use crate::trainer::eval::EvalMetrics;
use crate::trainer::step::{Trainer, TrainerOptions};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;
use verity_core::environment::Environment;
use verity_core::spec::Hyperparameters;
use verity_verifiers::Grader;

/// What a learning run trains on.
pub struct LearningRun<'a> {
    /// HF folder or GGUF file.
    pub model_dir: &'a Path,
    /// Training rows (JSONL text).
    pub train_jsonl: &'a str,
    /// Held-out rows (JSONL text).
    pub validation_jsonl: &'a str,
    /// The reward.
    pub grader: Grader,
    /// The recipe; `max_steps` bounds the run, `eval_interval` spaces the evaluations (0: only
    /// before and after).
    pub hyperparameters: Hyperparameters,
    /// A tool environment: every rollout (training and evaluation) is a multi-turn episode.
    pub environment: Option<Environment>,
    /// Only evaluate (the recipe's evaluation settings on the held-out rows), never train: how
    /// a peer's model (a TRL checkpoint) is scored exactly as Verity's own runs are.
    pub evaluate_only: bool,
}

/// An evaluation's line: pass@k and mean reward after `generated_tokens` completion tokens
/// (every completion the run's steps sampled so far) and `elapsed` seconds.
fn eval_line(eval: &EvalMetrics, generated_tokens: u64, elapsed: f64) -> Value {
    json!({"kind": "eval", "step": eval.step, "pass_at_k": eval.pass_at_k, "mean_reward": eval.mean_reward,
           "grader_errors": eval.grader_errors, "generated_tokens": generated_tokens, "elapsed_s": elapsed})
}

/// Runs the recipe, handing each step's and each evaluation's line to `report`; returns the
/// summary (validation pass@k and mean reward before and after, steps, completion tokens
/// generated, wall time). The recipe's `seed` (else 0) seeds the data order and sampling.
pub fn learning_run(run: LearningRun<'_>, mut report: impl FnMut(&Value)) -> Result<Value> {
    let started = Instant::now();
    let loaded = crate::loader::load_model(run.model_dir, &candle_core::Device::Cpu)?;
    let max_prompt_tokens = 2048;
    let train =
        Dataset::from_jsonl(run.train_jsonl, "train", &loaded.tokenizer, max_prompt_tokens)?;
    let validation = Dataset::from_jsonl(
        run.validation_jsonl,
        "validation",
        &loaded.tokenizer,
        max_prompt_tokens,
    )?;
    let eval_interval = run.hyperparameters.eval_interval() as u64;
    let options = TrainerOptions {
        seed: 0,
        base_model: run.model_dir.display().to_string(),
        graders: verity_verifiers::GraderPool::new(0),
    };
    let mut trainer = Trainer::new(
        loaded.model,
        loaded.tokenizer,
        run.grader,
        run.hyperparameters,
        train,
        Some(validation),
        options,
    )?;
    if let Some(environment) = run.environment {
        trainer = trainer.with_environment(environment)?;
    }
    let evaluate = |trainer: &Trainer,
                    generated: u64,
                    report: &mut dyn FnMut(&Value)|
     -> Result<Option<EvalMetrics>> {
        let eval = trainer.evaluate()?;
        if let Some(e) = &eval {
            report(&eval_line(e, generated, started.elapsed().as_secs_f64()));
        }
        Ok(eval)
    };
    let mut generated = 0;
    let before = evaluate(&trainer, generated, &mut report)?;
    let mut after = before.clone();
    while !run.evaluate_only && !trainer.finished() {
        let out = trainer.train_step()?;
        let m = &out.metrics;
        generated += m.generated_tokens;
        let mut line = json!({"kind": "step", "step": m.step, "reward_mean": m.reward_mean, "accuracy": m.accuracy,
                   "completion_length_mean": m.completion_length_mean, "truncated_fraction": m.truncated_fraction,
                   "zero_advantage_group_fraction": m.zero_advantage_group_fraction, "entropy": m.entropy,
                   "grad_norm": m.grad_norm, "step_generated_tokens": m.generated_tokens,
                   "generated_tokens": generated, "elapsed_s": started.elapsed().as_secs_f64()});
        // Episodes with tools add their metrics (turns, tool calls and errors per episode).
        if let (Some(episodes), Some(fields)) = (&m.episodes, line.as_object_mut()) {
            if let Ok(Value::Object(tools)) = serde_json::to_value(episodes) {
                fields.extend(tools);
            }
        }
        report(&line);
        if trainer.finished() || (eval_interval > 0 && trainer.step() % eval_interval == 0) {
            after = evaluate(&trainer, generated, &mut report)?;
        }
    }
    let pass1 = |e: &Option<EvalMetrics>| e.as_ref().map(EvalMetrics::pass_at_1);
    let reward = |e: &Option<EvalMetrics>| e.as_ref().map(|e| e.mean_reward);
    let pass_k = |e: &Option<EvalMetrics>| e.as_ref().map(|e| e.pass_at_k.clone());
    Ok(json!({
        "kind": "summary",
        "model": run.model_dir.display().to_string(),
        "steps": trainer.step(),
        "validation_pass_at_1_before": pass1(&before),
        "validation_pass_at_1_after": pass1(&after),
        "validation_reward_before": reward(&before),
        "validation_reward_after": reward(&after),
        "validation_pass_at_k_before": pass_k(&before),
        "validation_pass_at_k_after": pass_k(&after),
        "generated_tokens": generated,
        "wall_s": started.elapsed().as_secs_f64(),
        "peak_rss_mib": super::peak_rss_mib(),
    }))
}
