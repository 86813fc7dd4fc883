//! The trainer's checkpoint restores exactly: a run interrupted after two steps, saved and
//! restored into a fresh trainer, continues with the same data order, samples and updates as an
//! uninterrupted run.

use verity_core::spec::{Hyperparameters, Loss};
use verity_verifiers::{Grader, GraderPool};
use verity_worker::trainer::testing::{first_token_grader, target_token_jsonl, tiny_tokenizer};
use verity_worker::trainer::{Dataset, Trainer, TrainerOptions};
use verity_worker::{testing::tiny_model, Family};

fn trainer(hp: &Hyperparameters) -> Trainer {
    let tokenizer = tiny_tokenizer().unwrap();
    let train = Dataset::from_jsonl(&target_token_jsonl(5), "training", &tokenizer, 256).unwrap();
    let grader = Grader::from_json(&first_token_grader().to_string()).unwrap();
    let options =
        TrainerOptions { seed: 5, base_model: "tiny".into(), graders: GraderPool::new(2) };
    Trainer::new(
        tiny_model(Family::Qwen2, 9).unwrap(),
        tokenizer,
        grader,
        hp.clone(),
        train,
        None,
        options,
    )
    .unwrap()
}

fn run_and_compare(hp: Hyperparameters) {
    let mut straight = trainer(&hp);
    let expected: Vec<_> = (0..4).map(|_| straight.train_step().unwrap()).collect();

    let mut first = trainer(&hp);
    for _ in 0..2 {
        first.train_step().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    first.save(dir.path()).unwrap();
    drop(first);
    let mut resumed = trainer(&hp);
    resumed.restore(dir.path()).unwrap();
    assert_eq!(resumed.step(), 2);
    for want in &expected[2..] {
        let got = resumed.train_step().unwrap();
        assert_eq!(got.samples, want.samples, "step {} samples", want.metrics.step);
        let (mut a, mut b) = (got.metrics.clone(), want.metrics.clone());
        for m in [&mut a, &mut b] {
            m.sampling_seconds = 0.0;
            m.grading_seconds = 0.0;
            m.training_seconds = 0.0;
            m.tokens_per_second = 0.0;
        }
        assert_eq!(a, b, "step {} metrics", want.metrics.step);
    }
    assert_eq!(resumed.cursor(), straight.cursor());
}

fn hp() -> Hyperparameters {
    Hyperparameters {
        batch_size: Some(2),
        group_size: Some(4),
        learning_rate: 0.01,
        max_steps: Some(10),
        max_completion_tokens: Some(3),
        micro_batch_size: 3,
        warmup_steps: 2,
        lr_schedule: verity_core::spec::LrDecay::Cosine,
        seed: Some(3),
        ..Hyperparameters::default()
    }
}

#[test]
fn full_fine_tuning_resumes_exactly() {
    run_and_compare(Hyperparameters {
        beta: 0.05,
        loss: Loss::Dapo,
        overlong_buffer: 1,
        mask_truncated: true,
        ..hp()
    });
}

#[test]
fn lora_resumes_exactly() {
    let lora = verity_core::spec::LoraSpec { rank: 2, alpha: 4.0, ..Default::default() };
    run_and_compare(Hyperparameters { lora: Some(lora), dynamic_sampling: true, ..hp() });
}

#[test]
fn the_asynchronous_pipeline_resumes_exactly() {
    // The groups drawn ahead for step 3 (by the weights of step 1) are saved with the
    // checkpoint of step 2 and trained on after the restore.
    let hp = Hyperparameters { max_staleness: 1, tis_cap: Some(2.0), ..hp() };
    run_and_compare(hp.clone());
    run_and_compare(Hyperparameters { dynamic_sampling: true, beta: 0.05, ..hp });
}

#[test]
fn bad_rows_name_their_line() {
    let tokenizer = tiny_tokenizer().unwrap();
    let err =
        Dataset::from_jsonl("{\"prompt\": \"t3\"}\n{\"answer\": 1}\n", "training", &tokenizer, 256)
            .unwrap_err();
    assert_eq!(err.to_string(), "training line 2: the row has neither `messages` nor `prompt`");
    assert!(err.is_user_error());
    let err = Dataset::from_jsonl("not json\n", "training", &tokenizer, 256).unwrap_err();
    assert!(err.to_string().starts_with("training line 1: not valid JSON"), "{err}");
    let chat =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"t5 t6\"}], \"answer\": \"t9\"}\n";
    let data = Dataset::from_jsonl(chat, "training", &tokenizer, 256).unwrap();
    assert_eq!(data.examples[0].prompt_ids, vec![5, 6]);
}
