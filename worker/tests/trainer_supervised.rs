//! Supervised fine-tuning in the trainer: labels cover exactly the trained assistant messages
//! (weight-0 ones and every other role masked), the loss is the mean cross-entropy over those
//! tokens computed independently from the model's logits, a few steps lower it, and a
//! checkpoint resumes exactly.

use serde_json::{json, Value};
use verity_core::spec::Method;
use verity_verifiers::GraderPool;
use verity_worker::optim::policy_optimizer::PolicyOptimizer;
use verity_worker::optim::LrSchedule;
use verity_worker::trainer::supervised::{supervised_backward, supervised_row};
use verity_worker::trainer::testing::tiny_tokenizer;
use verity_worker::trainer::{SupervisedExample, Trainer, TrainerOptions};
use verity_worker::{testing::tiny_model, Family, LoadedModel};

fn chat(weights: [u8; 2]) -> Value {
    json!({"messages": [
        {"role": "system", "content": "t3 t4"},
        {"role": "user", "content": "t5 t6"},
        {"role": "assistant", "content": "t7 t8", "weight": weights[0]},
        {"role": "user", "content": "t9"},
        {"role": "assistant", "content": "t10 t11", "weight": weights[1]},
    ]})
}

fn example(row: &Value) -> SupervisedExample {
    supervised_row(row, &tiny_tokenizer().unwrap(), 256).unwrap().0
}

#[test]
fn labels_are_exactly_the_trained_assistant_messages() {
    // the tiny template renders each message's content followed by a space
    let both = example(&chat([1, 1]));
    assert_eq!(both.ids, vec![3, 4, 5, 6, 7, 8, 9, 10, 11]);
    let on = |ids: &[u32], ex: &SupervisedExample| -> Vec<bool> {
        ex.ids.iter().map(|id| ids.contains(id)).collect()
    };
    assert_eq!(both.labels, on(&[7, 8, 10, 11], &both));
    assert_eq!(both.target, "t10 t11");
    let first_skipped = example(&chat([0, 1]));
    assert_eq!(first_skipped.labels, on(&[10, 11], &first_skipped), "weight 0 is masked");
    let last_skipped = example(&chat([1, 0]));
    assert_eq!(last_skipped.labels, on(&[7, 8], &last_skipped));
    assert_eq!(last_skipped.target, "t7 t8", "the target is the last trained message");
    // the samples' prompt is the chat before the last trained assistant message
    let (_, prompt) = supervised_row(&chat([1, 0]), &tiny_tokenizer().unwrap(), 256).unwrap();
    assert_eq!(prompt.prompt_ids, vec![3, 4, 5, 6]);

    let tokenizer = tiny_tokenizer().unwrap();
    let err = |row: Value| supervised_row(&row, &tokenizer, 256).unwrap_err();
    assert!(err(chat([0, 0])).contains("weight 0"));
    assert!(err(json!({"messages": [{"role": "user", "content": "t3"}]})).contains("no assistant"));
    let half = json!({"messages": [{"role": "user", "content": "t3"},
        {"role": "assistant", "content": "t4", "weight": 0.5}]});
    assert!(err(half).contains("messages[1].weight"));
    assert!(supervised_row(&chat([1, 1]), &tokenizer, 5).unwrap_err().contains("at most 5"));
}

/// Mean −log p over the labelled tokens, from the full logits (f64 log-softmax).
fn independent_loss(
    model: &verity_worker::model::Transformer,
    examples: &[SupervisedExample],
) -> f64 {
    let (mut nll, mut count) = (0.0, 0usize);
    for ex in examples {
        let logits = model.sequence_logits(&[ex.ids.as_slice()], 0).unwrap().squeeze(0).unwrap();
        let rows = logits.to_dtype(candle_core::DType::F64).unwrap().to_vec2::<f64>().unwrap();
        for (t, (&id, _)) in
            ex.ids.iter().zip(&ex.labels).enumerate().skip(1).filter(|(_, (_, &l))| l)
        {
            let row = &rows[t - 1];
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            nll += log_z - row[id as usize];
            count += 1;
        }
    }
    nll / count as f64
}

#[test]
fn the_loss_is_the_mean_cross_entropy_of_the_assistant_tokens_only() {
    let model = tiny_model(Family::Qwen2, 3).unwrap();
    let schedule =
        LrSchedule { lr: 1e-3, warmup_steps: 0, total_steps: 1, cosine: false, min_lr_ratio: 0.0 };
    let mut optimizer = PolicyOptimizer::new(&model, Default::default(), schedule, 1.0).unwrap();
    let examples = vec![example(&chat([1, 1])), example(&chat([0, 1])), example(&chat([1, 0]))];
    let refs: Vec<&SupervisedExample> = examples.iter().collect();
    for micro in [1, 2, 3] {
        optimizer.zero_grad();
        let update = supervised_backward(&model, &mut optimizer, &refs, micro, 0).unwrap();
        let want = independent_loss(&model, &examples);
        assert!((update.loss - want).abs() < 1e-4, "micro {micro}: {} vs {want}", update.loss);
        assert_eq!(update.label_tokens, 4 + 2 + 2);
    }
    // were every token trained on, the loss would differ
    let mut all = examples[0].clone();
    all.labels = vec![true; all.ids.len()];
    all.labels[0] = false;
    let masked = independent_loss(&model, &examples[..1]);
    assert!((independent_loss(&model, &[all]) - masked).abs() > 1e-3);
}

fn jsonl(rows: usize) -> String {
    (0..rows)
        .map(|i| {
            json!({"messages": [{"role": "user", "content": format!("t{}", 3 + i)},
                {"role": "assistant", "content": "t40 t41"}]})
            .to_string()
                + "\n"
        })
        .collect()
}

fn trainer(method: &Value) -> Trainer {
    let method: Method = serde_json::from_value(method.clone()).unwrap();
    let loaded = LoadedModel {
        model: tiny_model(Family::Qwen2, 9).unwrap(),
        tokenizer: tiny_tokenizer().unwrap(),
    };
    let options =
        TrainerOptions { seed: 5, base_model: "tiny".into(), graders: GraderPool::new(1) };
    let (train, validation) = (jsonl(6), jsonl(2));
    Trainer::tuning(&method, loaded, ("train", &train), Some(("validation", &validation)), options)
        .unwrap()
}

fn sft(max_steps: usize) -> Value {
    json!({"type": "supervised", "supervised": {"hyperparameters": {
        "batch_size": 3, "learning_rate": 3e-3, "max_steps": max_steps, "eval_interval": 2,
        "max_completion_tokens": 3, "micro_batch_size": 2}}})
}

#[test]
fn a_few_steps_lower_the_loss_and_a_checkpoint_resumes_exactly() {
    let mut straight = trainer(&sft(6));
    let before = straight.evaluation().unwrap().unwrap();
    let mut losses = Vec::new();
    let mut outputs = Vec::new();
    while !straight.finished() {
        let out = straight.train_step().unwrap();
        losses.push(out.metrics.loss);
        outputs.push(out);
    }
    let after = straight.evaluation().unwrap().unwrap();
    let (before, after) =
        (serde_json::to_value(before).unwrap(), serde_json::to_value(after).unwrap());
    assert!(after["loss"].as_f64() < before["loss"].as_f64(), "{before} → {after}");
    assert!(losses[5] < losses[0], "{losses:?}");
    let accuracy = after["token_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&accuracy), "{after}");
    // samples at evaluation steps only: greedy completions beside their targets
    assert!(outputs[0].samples.is_empty());
    let samples = &outputs[1].samples;
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].reference.as_deref(), Some("t40 t41"));
    let row = outputs[1].row().unwrap();
    assert_eq!(row["label_tokens"], json!(6), "{row}");
    assert!(row.get("reward_mean").is_none(), "no RL metrics: {row}");

    let mut first = trainer(&sft(6));
    for _ in 0..3 {
        first.train_step().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    first.save(dir.path()).unwrap();
    drop(first);
    let mut resumed = trainer(&sft(6));
    resumed.restore(dir.path()).unwrap();
    assert_eq!(resumed.step(), 3);
    for want in &outputs[3..] {
        let got = resumed.train_step().unwrap();
        assert_eq!(got.metrics.loss, want.metrics.loss, "step {}", want.metrics.step);
        assert_eq!(got.samples, want.samples);
    }
    assert_eq!(resumed.cursor(), straight.cursor());
}
