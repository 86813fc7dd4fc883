//! End to end on a tiny random model: a reinforcement trainer with a tool environment samples
//! multi-turn episodes, grades them on the trajectory (`{{sample.tool_calls}}`), records the
//! tool metrics of each step, trains on the model's tokens only, and learns to call the tool.

use serde_json::json;
use verity_core::environment::Environment;
use verity_core::spec::Hyperparameters;
use verity_verifiers::{Grader, GraderPool};
use verity_worker::trainer::testing::{target_token_jsonl, tiny_tool_tokenizer};
use verity_worker::trainer::{Dataset, Trainer, TrainerOptions};
use verity_worker::{testing::tiny_model, Family};

/// Reward 1 when the episode made at least one tool call (its `tool_calls` are not `[]`).
fn used_a_tool_grader() -> Grader {
    let spec = json!({"type": "string_check", "name": "used_a_tool",
        "input": "{{sample.tool_calls}}", "reference": "[]", "operation": "ne"});
    Grader::from_json(&spec.to_string()).unwrap()
}

fn trainer() -> Trainer {
    trainer_with(hyperparameters(), used_a_tool_grader())
}

fn hyperparameters() -> Hyperparameters {
    Hyperparameters {
        batch_size: Some(4),
        group_size: Some(8),
        learning_rate: 0.03,
        max_steps: Some(30),
        max_completion_tokens: Some(8),
        micro_batch_size: 16,
        seed: Some(2),
        ..Hyperparameters::default()
    }
}

fn trainer_with(hp: Hyperparameters, grader: Grader) -> Trainer {
    let tokenizer = tiny_tool_tokenizer().unwrap();
    let train = Dataset::from_jsonl(&target_token_jsonl(4), "training", &tokenizer, 256).unwrap();
    let environment: Environment = serde_json::from_value(json!({
        "max_turns": 3, "tools": [{"type": "calculator"}], "max_episode_tokens": 96}))
    .unwrap();
    let options =
        TrainerOptions { seed: 1, base_model: "tiny".into(), graders: GraderPool::new(2) };
    Trainer::new(tiny_model(Family::Llama, 1).unwrap(), tokenizer, grader, hp, train, None, options)
        .unwrap()
        .with_environment(environment)
        .unwrap()
}

#[test]
fn a_job_with_an_environment_trains_on_episodes_and_learns_to_call_the_tool() {
    let mut trainer = trainer();
    let mut calls = Vec::new();
    while !trainer.finished() {
        let out = trainer.train_step().unwrap();
        let tools = out.metrics.episodes.clone().expect("tool metrics on every step");
        assert!(out.metrics.loss.is_finite() && out.metrics.grad_norm.is_finite());
        assert!(tools.turns_per_episode >= 1.0 && tools.turns_per_episode <= 3.0);
        assert!(tools.tool_errors_per_episode <= tools.tool_calls_per_episode);
        let row = out.row().unwrap();
        for field in [
            "turns_per_episode",
            "tool_calls_per_episode",
            "tool_errors_per_episode",
            "tool_seconds",
            "truncated_episode_fraction",
        ] {
            assert!(row.get(field).is_some(), "metrics row has {field}: {row}");
        }
        assert_eq!(out.samples.len(), 32);
        calls.push(tools.tool_calls_per_episode);
        if trainer.step() >= 10 && calls.iter().rev().take(3).all(|&c| c > 0.9) {
            break;
        }
    }
    let first = calls[..3].iter().sum::<f64>() / 3.0;
    let last = calls[calls.len() - 3..].iter().sum::<f64>() / 3.0;
    eprintln!("tool calls per episode: {calls:?}");
    assert!(last > first + 0.3, "tool use rose from {first:.2} to only {last:.2}: {calls:?}");
}

/// Tool episodes draw dynamic sampling in rounds (plain completions stream). The grader rewards
/// a `t1` anywhere in the episode's text, which the untrained model writes in some samples only:
/// groups without contrast are dropped and later rounds replace them.
#[test]
fn dynamic_sampling_in_a_tool_job_draws_rounds_and_keeps_only_groups_with_contrast() {
    let spec = json!({"type": "string_check", "name": "has_t1",
        "input": "{{sample.output_text}}", "reference": "t1", "operation": "like"});
    let grader = || Grader::from_json(&spec.to_string()).unwrap();
    let hp = Hyperparameters { dynamic_sampling: true, group_size: Some(2), ..hyperparameters() };
    let step = |t: &mut Trainer| t.train_step().unwrap();
    let out = step(&mut trainer_with(hp.clone(), grader()));
    let m = &out.metrics;
    eprintln!("drawn {} kept {}", m.groups_drawn, m.groups_kept);
    assert!(m.groups_drawn > 4, "groups without contrast were replaced: {}", m.groups_drawn);
    assert!(m.groups_drawn <= 12, "at most the default cap of 3 × batch");
    assert!(m.groups_kept >= 1 && m.groups_kept <= 4);
    assert_eq!(m.zero_advantage_group_fraction, 0.0, "every kept group has contrast");
    assert_eq!(out.samples.len() as u64, m.groups_kept * 2);
    // The rounds are seeded: the same job draws the same groups.
    let again = step(&mut trainer_with(hp, grader()));
    assert_eq!(
        (again.metrics.groups_drawn, again.metrics.groups_kept),
        (m.groups_drawn, m.groups_kept)
    );
    assert_eq!(again.metrics.reward_mean, m.reward_mean);
}
