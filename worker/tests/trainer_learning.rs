//! Learning test: on a tiny random model and a synthetic verifiable task (the completion must be
//! the row's answer token, graded by a real `string_check` grader), every loss mode lifts the
//! validation reward from near 0 to above 0.9 within a bounded number of steps.

use verity_core::spec::{Hyperparameters, Loss, RolloutDtype};
use verity_verifiers::{Grader, GraderPool};
use verity_worker::trainer::testing::{first_token_grader, target_token_jsonl, tiny_tokenizer};
use verity_worker::trainer::{Dataset, Trainer, TrainerOptions};
use verity_worker::{testing::tiny_model, Family};

const MAX_STEPS: usize = 80;

fn hyperparameters(loss: Loss) -> Hyperparameters {
    Hyperparameters {
        batch_size: Some(4),
        group_size: Some(8),
        learning_rate: 0.03,
        max_steps: Some(MAX_STEPS),
        max_completion_tokens: Some(1),
        loss,
        micro_batch_size: 16,
        eval_samples: Some(8),
        seed: Some(11),
        ..Hyperparameters::default()
    }
}

fn trainer(hp: Hyperparameters) -> Trainer {
    let tokenizer = tiny_tokenizer().unwrap();
    let data = target_token_jsonl(4);
    let train = Dataset::from_jsonl(&data, "training", &tokenizer, 256).unwrap();
    let validation = Dataset::from_jsonl(&data, "validation", &tokenizer, 256).unwrap();
    let grader = Grader::from_json(&first_token_grader().to_string()).unwrap();
    let options =
        TrainerOptions { seed: 1, base_model: "tiny".into(), graders: GraderPool::new(2) };
    Trainer::new(
        tiny_model(Family::Llama, 3).unwrap(),
        tokenizer,
        grader,
        hp,
        train,
        Some(validation),
        options,
    )
    .unwrap()
}

/// Trains until the validation reward passes 0.9 (checked every 5 steps); returns the steps.
fn assert_learns(hp: Hyperparameters) -> u64 {
    let loss = hp.loss;
    let mut trainer = trainer(hp);
    let before = trainer.evaluate().unwrap().unwrap();
    assert!(before.mean_reward < 0.15, "{loss:?} starts near 0: {before:?}");
    let mut last = None;
    while !trainer.finished() {
        let out = trainer.train_step().unwrap();
        assert!(
            out.samples.len() <= 32 && out.samples.len().is_multiple_of(8),
            "whole groups of at most B prompts"
        );
        last = Some(out.metrics);
        if trainer.step().is_multiple_of(5)
            && trainer.evaluate().unwrap().unwrap().mean_reward > 0.9
        {
            break;
        }
    }
    let after = trainer.evaluate().unwrap().unwrap();
    eprintln!(
        "{loss:?}: validation reward {:.3} -> {:.3} in {} steps; last {:?}",
        before.mean_reward,
        after.mean_reward,
        trainer.step(),
        last
    );
    assert!(after.mean_reward > 0.9, "{loss:?} reached only {after:?} in {} steps", trainer.step());
    assert!(after.pass_at_1() > 0.9 && after.pass_at_k["pass@8"] >= after.pass_at_1());
    trainer.step()
}

#[test]
fn grpo_learns() {
    assert_learns(hyperparameters(Loss::Grpo));
}

#[test]
fn grpo_with_kl_and_lora_learns() {
    let hp = Hyperparameters {
        beta: 0.01,
        lora: Some(verity_core::spec::LoraSpec {
            rank: 4,
            alpha: 8.0,
            targets: ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        }),
        learning_rate: 0.1,
        ..hyperparameters(Loss::Grpo)
    };
    assert_learns(hp);
}

#[test]
fn dapo_with_dynamic_sampling_learns() {
    let hp = Hyperparameters { dynamic_sampling: true, ..hyperparameters(Loss::Dapo) };
    assert_learns(hp);
}

#[test]
fn dr_grpo_learns() {
    assert_learns(hyperparameters(Loss::DrGrpo));
}

#[test]
fn gspo_learns() {
    assert_learns(hyperparameters(Loss::Gspo));
}

#[test]
fn cispo_with_micro_batches_and_tis_learns() {
    let hp = Hyperparameters {
        micro_batch_size: 6,
        tis_cap: Some(2.0),
        inner_epochs: 2,
        ..hyperparameters(Loss::Cispo)
    };
    assert_learns(hp);
}

#[test]
fn grpo_single_pass_with_tis_learns() {
    // One inner epoch: the old-policy log-probs (and the TIS weights built from them) come from
    // the differentiable forward itself rather than a separate no-grad pass.
    let hp =
        Hyperparameters { micro_batch_size: 6, tis_cap: Some(2.0), ..hyperparameters(Loss::Grpo) };
    assert_eq!(hp.inner_epochs, 1);
    assert_learns(hp);
}

#[test]
fn the_asynchronous_pipeline_learns_as_fast_per_step_as_the_synchronous_trainer() {
    // One step off-policy with the truncated importance correction.
    let sync = Hyperparameters { tis_cap: Some(2.0), ..hyperparameters(Loss::Grpo) };
    let steps_sync = assert_learns(sync.clone());
    let steps_async = assert_learns(Hyperparameters { max_staleness: 1, ..sync });
    eprintln!("steps to learn: synchronous {steps_sync}, asynchronous {steps_async}");
    assert!(
        steps_async <= steps_sync + 5,
        "asynchronous {steps_async} steps, synchronous {steps_sync} (checked every 5)"
    );
}

#[test]
fn stop_strings_end_training_completions() {
    // Every word of the tiny vocabulary starts with "t", so each completion stops after its
    // first token (or at EOS) instead of running to the 6-token limit.
    let hp = Hyperparameters {
        max_steps: Some(1),
        max_completion_tokens: Some(6),
        stop: vec!["t".into()],
        ..hyperparameters(Loss::Grpo)
    };
    let mut trainer = trainer(hp);
    let out = trainer.train_step().unwrap();
    assert!(!out.samples.is_empty());
    // `<s>` and `<unk>` hold no "t"; a completion that samples one goes on to the next word.
    for s in &out.samples {
        assert_eq!(s.finish_reason, "stop", "{s:?}");
    }
    let one_token = out.samples.iter().filter(|s| s.tokens == 1).count();
    assert!(2 * one_token >= out.samples.len(), "most completions stop after their first word");
}

#[test]
fn int8_rollouts_with_tis_learn() {
    let hp = Hyperparameters {
        rollout_dtype: RolloutDtype::Int8,
        tis_cap: Some(2.0),
        ..hyperparameters(Loss::Grpo)
    };
    assert_learns(hp);
}

#[test]
fn evaluations_read_the_f32_weights_whatever_the_rollout_precision() {
    let f32_eval = trainer(hyperparameters(Loss::Grpo)).evaluate().unwrap().unwrap();
    for dtype in [RolloutDtype::Bf16, RolloutDtype::Int8] {
        let hp = Hyperparameters { rollout_dtype: dtype, ..hyperparameters(Loss::Grpo) };
        let eval = trainer(hp).evaluate().unwrap().unwrap();
        assert_eq!(eval.mean_reward, f32_eval.mean_reward, "{dtype:?}");
        assert_eq!(eval.pass_at_k, f32_eval.pass_at_k, "{dtype:?}");
    }
}
