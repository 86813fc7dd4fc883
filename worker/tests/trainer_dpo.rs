//! DPO in the trainer: the loss equals the formula evaluated on sequence log-probs computed
//! independently from the model's logits (policy after a step, reference from the start model),
//! a few steps separate preferred from non-preferred responses, and a checkpoint resumes with
//! its cached reference log-probs.

use serde_json::{json, Value};
use verity_core::spec::Method;
use verity_verifiers::GraderPool;
use verity_worker::model::Transformer;
use verity_worker::trainer::preference::preference_row;
use verity_worker::trainer::testing::tiny_tokenizer;
use verity_worker::trainer::{PreferencePair, Trainer, TrainerOptions};
use verity_worker::{testing::tiny_model, Family, LoadedModel};

const BETA: f64 = 0.5;

fn rows() -> String {
    (0..3)
        .map(|i| {
            json!({"input": {"messages": [{"role": "user", "content": format!("t{} t{}", 3 + i, 20 + i)}]},
                "preferred_output": [{"role": "assistant", "content": "t40 t41"}],
                "non_preferred_output": [{"role": "assistant", "content": format!("t{}", 50 + i)}]})
            .to_string()
                + "\n"
        })
        .collect()
}

fn dpo(max_steps: usize, lr: f64) -> Value {
    json!({"type": "dpo", "dpo": {"hyperparameters": {
        "beta": BETA, "batch_size": 3, "learning_rate": lr, "max_steps": max_steps,
        "micro_batch_size": 2, "eval_interval": 2, "max_completion_tokens": 2}}})
}

fn trainer(method: &Value) -> Trainer {
    let method: Method = serde_json::from_value(method.clone()).unwrap();
    let loaded = LoadedModel {
        model: tiny_model(Family::Llama, 4).unwrap(),
        tokenizer: tiny_tokenizer().unwrap(),
    };
    let options =
        TrainerOptions { seed: 8, base_model: "tiny".into(), graders: GraderPool::new(1) };
    let text = rows();
    Trainer::tuning(&method, loaded, ("train", &text), Some(("validation", &text)), options)
        .unwrap()
}

fn pairs() -> Vec<PreferencePair> {
    let tokenizer = tiny_tokenizer().unwrap();
    rows()
        .lines()
        .map(|l| preference_row(&serde_json::from_str(l).unwrap(), &tokenizer, 256).unwrap().0)
        .collect()
}

/// Σ log p(response | prompt) from the full logits, in f64.
fn logprob(model: &Transformer, prompt: &[u32], response: &[u32]) -> f64 {
    let seq: Vec<u32> = prompt.iter().chain(response).copied().collect();
    let logits = model.sequence_logits(&[seq.as_slice()], 0).unwrap().squeeze(0).unwrap();
    let rows = logits.to_dtype(candle_core::DType::F64).unwrap().to_vec2::<f64>().unwrap();
    (prompt.len()..seq.len())
        .map(|t| {
            let row = &rows[t - 1];
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            row[seq[t] as usize] - log_z
        })
        .sum()
}

/// Mean DPO loss and accuracy by hand.
fn by_hand(policy: &Transformer, reference: &Transformer) -> (f64, f64, f64) {
    let pairs = pairs();
    let (mut loss, mut correct, mut chosen) = (0.0, 0.0, 0.0);
    for p in &pairs {
        let (pc, pr) =
            (logprob(policy, &p.prompt, &p.chosen), logprob(policy, &p.prompt, &p.rejected));
        let (rc, rr) =
            (logprob(reference, &p.prompt, &p.chosen), logprob(reference, &p.prompt, &p.rejected));
        let z = BETA * ((pc - rc) - (pr - rr));
        loss += -(1.0 / (1.0 + (-z).exp())).ln();
        correct += f64::from(u8::from(z > 0.0));
        chosen += pc;
    }
    let n = pairs.len() as f64;
    (loss / n, correct / n, chosen / n)
}

#[test]
fn the_loss_matches_the_formula_on_independent_log_probs() {
    let pairs = pairs();
    assert_eq!(pairs[0].chosen, vec![40, 41]);
    assert_eq!(pairs[1].rejected, vec![51]);
    let mut trainer = trainer(&dpo(4, 5e-3));
    let start = tiny_model(Family::Llama, 4).unwrap();
    let first = trainer.train_step().unwrap();
    let row = first.row().unwrap();
    // before any update the policy is the reference: every margin is 0, the loss ln 2
    assert!((row["loss"].as_f64().unwrap() - std::f64::consts::LN_2).abs() < 1e-4, "{row}");
    assert!(row["reward_margin"].as_f64().unwrap().abs() < 1e-4, "{row}");
    for _ in 0..2 {
        let (loss, accuracy, chosen) = by_hand(&trainer.model, &start);
        let row = trainer.train_step().unwrap().row().unwrap();
        assert!((row["loss"].as_f64().unwrap() - loss).abs() < 1e-4, "{row} vs {loss}");
        assert!((row["chosen_logprob"].as_f64().unwrap() - chosen).abs() < 1e-3, "{row}");
        assert_eq!(row["preference_accuracy"].as_f64().unwrap(), accuracy, "{row}");
        assert!(loss < std::f64::consts::LN_2, "training lowers the loss: {loss}");
    }
    let eval = serde_json::to_value(trainer.evaluation().unwrap().unwrap()).unwrap();
    let (loss, accuracy, _) = by_hand(&trainer.model, &start);
    assert!((eval["loss"].as_f64().unwrap() - loss).abs() < 1e-4, "{eval} vs {loss}");
    assert_eq!(eval["preference_accuracy"].as_f64().unwrap(), accuracy);
    assert!(eval["reward_margin"].as_f64().unwrap() > 0.0, "{eval}");
}

#[test]
fn a_checkpoint_resumes_with_its_cached_reference() {
    let mut straight = trainer(&dpo(5, 5e-3));
    let outputs: Vec<_> = (0..5).map(|_| straight.train_step().unwrap()).collect();
    assert!(outputs[1].samples.len() == 3 && outputs[0].samples.is_empty());
    assert_eq!(outputs[1].samples[0].reference.as_deref(), Some("t40 t41"));
    let mut first = trainer(&dpo(5, 5e-3));
    for _ in 0..2 {
        first.train_step().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    first.save(dir.path()).unwrap();
    assert!(dir.path().join("dpo_reference.json").exists());
    drop(first);
    let mut resumed = trainer(&dpo(5, 5e-3));
    resumed.restore(dir.path()).unwrap();
    for want in &outputs[2..] {
        let got = resumed.train_step().unwrap();
        let (mut a, mut b) = (got.tuning.clone().unwrap(), want.tuning.clone().unwrap());
        a.training_seconds = 0.0;
        b.training_seconds = 0.0;
        assert_eq!(a, b, "step {}", b.step);
    }
    // without the cached reference, a checkpoint past step 0 cannot resume
    std::fs::remove_file(dir.path().join("dpo_reference.json")).unwrap();
    let mut lost = trainer(&dpo(5, 5e-3));
    lost.restore(dir.path()).unwrap();
    assert!(lost.train_step().unwrap_err().to_string().contains("reference"));
}
