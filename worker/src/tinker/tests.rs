use super::*;
use crate::model::lora::LoraConfig;
use crate::testing::{flat_logits, tiny_model};
use crate::trainer::fixed_batch::rows;
use crate::Family;
use verity_core::tinker::training::{ClipThresholds, Datum};

const PAD: u32 = 0;

fn trainer(lora: bool) -> TinkerTrainer {
    let mut model = tiny_model(Family::Llama, 7).unwrap();
    if lora {
        let config = LoraConfig {
            r: 4,
            lora_alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into()],
            lora_dropout: 0.0,
        };
        model.enable_lora(config, 3).unwrap();
    }
    TinkerTrainer::new(model, PAD).unwrap()
}

/// `tokens` predicting their successors, the last predicting `last`.
fn datum(tokens: &[u32], last: u32) -> Datum {
    let targets = tokens[1..].iter().copied().chain([last]).collect();
    Datum {
        tokens: tokens.to_vec(),
        target_tokens: targets,
        weights: None,
        advantages: None,
        logprobs: None,
    }
}

fn call(loss_fn: LossFn, data: Vec<Datum>) -> ForwardBackward {
    ForwardBackward { data, loss_fn, clip: ClipThresholds::default(), forward_only: false }
}

/// `log softmax(logits)[target]` at each position, from the model's plain full-sequence logits.
fn reference_logprobs(model: &Transformer, datum: &Datum) -> Vec<f32> {
    let vocab = model.config.vocab_size;
    let logits = flat_logits(model, &datum.tokens).unwrap();
    logits
        .chunks(vocab)
        .zip(&datum.target_tokens)
        .map(|(row, &target)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|l| (l - max).exp()).sum();
            row[target as usize] - max - sum.ln()
        })
        .collect()
}

fn close(a: &[f32], b: &[f32], tolerance: f32) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tolerance, "{a:?} vs {b:?}");
    }
}

#[test]
fn forward_scores_each_position_s_target_even_when_it_is_not_the_next_input() {
    let mut trainer = trainer(false);
    let mut odd = datum(&[5, 9, 12, 3], 7);
    odd.target_tokens[1] = 30; // not the next input
    let data = vec![datum(&[5, 9, 12, 3, 8, 1], 4), odd, datum(&[11], 2)];
    let mut forward = call(LossFn::CrossEntropy, data.clone());
    forward.forward_only = true;
    let out = trainer.forward_backward(&forward).unwrap();
    assert_eq!(trainer.pending_backwards(), 0, "forward adds no gradient");
    let mut total = 0.0;
    for (datum, fields) in data.iter().zip(&out.outputs) {
        let expected = reference_logprobs(trainer.model(), datum);
        close(&fields["logprobs"], &expected, 1e-4);
        let loss: Vec<f32> = expected.iter().map(|l| -l).collect();
        close(&fields["elementwise_loss"], &loss, 1e-4);
        total += loss.iter().map(|&l| f64::from(l)).sum::<f64>();
    }
    assert!((out.metrics["loss:sum"] - total).abs() < 1e-3, "{:?} vs {total}", out.metrics);
}

#[test]
fn cross_entropy_weights_each_position() {
    let mut trainer = trainer(false);
    let mut weighted = datum(&[4, 8, 15, 16], 23);
    weighted.weights = Some(vec![0.0, 2.0, 0.0, 0.5]);
    let out =
        trainer.forward_backward(&call(LossFn::CrossEntropy, vec![weighted.clone()])).unwrap();
    let logp = reference_logprobs(trainer.model(), &weighted);
    let expected = [0.0, -2.0 * logp[1], 0.0, -0.5 * logp[3]];
    close(&out.outputs[0]["elementwise_loss"], &expected, 1e-4);
    assert_eq!(trainer.pending_backwards(), 1);
}

#[test]
fn the_policy_losses_follow_their_formulas() {
    let mut trainer = trainer(false);
    let base = datum(&[3, 14, 15, 9, 2], 6);
    let logp = reference_logprobs(trainer.model(), &base);
    let advantages = vec![1.0, 0.5, -2.0, 0.0, -1.0];
    // The sampler's log-probabilities: equal, far below (ρ large) and far above (ρ small).
    let shifts = [0.0f32, -2.0, 2.0, 0.3, -0.1];
    let sampled: Vec<f32> = logp.iter().zip(shifts).map(|(l, s)| l + s).collect();
    let rl =
        Datum { advantages: Some(advantages.clone()), logprobs: Some(sampled.clone()), ..base };
    let ratio: Vec<f32> = logp.iter().zip(&sampled).map(|(l, q)| (l - q).exp()).collect();
    let clip = |r: f32| r.clamp(0.8, 1.2);
    let loss_of = |trainer: &mut TinkerTrainer, loss| {
        let mut forward = call(loss, vec![rl.clone()]);
        forward.forward_only = true;
        trainer.forward_backward(&forward).unwrap().metrics["loss:sum"] as f32
    };
    let sum = |f: &dyn Fn(usize) -> f32| (0..5).map(f).sum::<f32>();
    let is = sum(&|t| -ratio[t] * advantages[t]);
    let ppo = sum(&|t| -(ratio[t] * advantages[t]).min(clip(ratio[t]) * advantages[t]));
    let cispo = sum(&|t| -clip(ratio[t]) * advantages[t] * logp[t]);
    assert!((loss_of(&mut trainer, LossFn::ImportanceSampling) - is).abs() < 1e-3);
    assert!((loss_of(&mut trainer, LossFn::Ppo) - ppo).abs() < 1e-3);
    assert!((loss_of(&mut trainer, LossFn::Cispo) - cispo).abs() < 1e-3);
    assert!((ppo - is).abs() > 1e-2, "the test's ratios must reach the clip");
}

/// Every trainable weight, flattened, in order.
fn weights(trainer: &TinkerTrainer) -> Vec<f32> {
    trainer
        .model()
        .trainable_params()
        .iter()
        .flat_map(|(_, var)| var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

#[test]
fn gradients_of_several_calls_add_up_to_one_call_over_all_their_data() {
    let data = vec![datum(&[5, 9, 12, 3], 7), datum(&[20, 21], 22), datum(&[1, 2, 3], 4)];
    let adam = AdamParams { learning_rate: 1e-2, ..AdamParams::default() };
    let mut together = trainer(true);
    together.forward_backward(&call(LossFn::CrossEntropy, data.clone())).unwrap();
    together.optim_step(&adam).unwrap();
    let mut apart = trainer(true);
    apart.forward_backward(&call(LossFn::CrossEntropy, data[..1].to_vec())).unwrap();
    apart.forward_backward(&call(LossFn::CrossEntropy, data[1..].to_vec())).unwrap();
    assert_eq!(apart.pending_backwards(), 2);
    let metrics = apart.optim_step(&adam).unwrap();
    assert_eq!(apart.pending_backwards(), 0);
    assert_eq!(metrics["step:max"], 1.0);
    assert!(metrics["grad_norm:mean"] > 0.0);
    close(&weights(&apart), &weights(&together), 1e-6);
}

#[test]
fn steps_of_cross_entropy_raise_the_targets_probability_and_train_only_the_adapters() {
    let mut trainer = trainer(true);
    let frozen: Vec<(String, Vec<f32>)> = trainer
        .model()
        .named_weights()
        .iter()
        .map(|(name, var)| {
            (name.clone(), var.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect();
    let data = vec![datum(&[5, 9, 12, 3], 7)];
    let adam = AdamParams { learning_rate: 5e-2, ..AdamParams::default() };
    let mut losses = Vec::new();
    for _ in 0..8 {
        let out = trainer.forward_backward(&call(LossFn::CrossEntropy, data.clone())).unwrap();
        losses.push(out.metrics["loss:sum"]);
        trainer.optim_step(&adam).unwrap();
    }
    assert!(losses[7] < losses[0] * 0.8, "the loss fell too little: {losses:?}");
    for (name, var) in trainer.model().named_weights() {
        let now: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let before = &frozen.iter().find(|(n, _)| n == &name).unwrap().1;
        assert_eq!(&now, before, "{name} is a base weight and must not change");
    }
    assert_eq!(trainer.steps(), 8);
}

#[test]
fn bad_calls_are_the_caller_s_errors_and_change_nothing() {
    let mut trainer = trainer(true);
    let before = weights(&trainer);
    let mut short = datum(&[5, 9, 12], 7);
    short.weights = Some(vec![1.0]);
    let err = trainer.forward_backward(&call(LossFn::CrossEntropy, vec![short])).unwrap_err();
    assert!(err.is_user_error());
    assert!(err.to_string().starts_with("data[0].loss_fn_inputs.weights: 1 values for 3"), "{err}");
    let no_advantages = datum(&[5, 9, 12], 7);
    let err = trainer.forward_backward(&call(LossFn::Ppo, vec![no_advantages])).unwrap_err();
    assert!(err.to_string().contains("advantages"), "{err}");
    let vocab = trainer.model().config.vocab_size as u32;
    let err = trainer.forward_backward(&call(LossFn::CrossEntropy, vec![datum(&[vocab], 1)]));
    assert!(err.unwrap_err().to_string().starts_with("data[0].model_input"));
    let bad_adam = AdamParams { beta1: 1.5, ..AdamParams::default() };
    let err = trainer.optim_step(&bad_adam).unwrap_err();
    assert!(err.is_user_error());
    assert!(err.to_string().starts_with("adam_params.beta1"), "{err}");
    assert_eq!(trainer.steps(), 0);
    assert_eq!(weights(&trainer), before);
}

#[test]
fn a_saved_state_restores_the_weights_and_with_them_the_optimizer() {
    let data = vec![datum(&[5, 9, 12, 3], 7)];
    let adam = AdamParams { learning_rate: 1e-2, ..AdamParams::default() };
    let mut trained = trainer(true);
    for _ in 0..2 {
        trained.forward_backward(&call(LossFn::CrossEntropy, data.clone())).unwrap();
        trained.optim_step(&adam).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let optimizer = Some(&trained.optimizer().adamw);
    crate::checkpoint::save_checkpoint(dir.path(), trained.model(), None, optimizer, "tiny")
        .unwrap();
    // Weights only: the same weights, fresh moments.
    let mut weights_only = trainer(true);
    weights_only.restore(dir.path(), false).unwrap();
    assert_eq!(weights(&weights_only), weights(&trained));
    assert_eq!(weights_only.steps(), 0);
    // With the optimizer: the next step is the one the saved client would have taken.
    let mut resumed = trainer(true);
    resumed.restore(dir.path(), true).unwrap();
    assert_eq!(resumed.steps(), 2);
    for t in [&mut trained, &mut resumed] {
        t.forward_backward(&call(LossFn::CrossEntropy, data.clone())).unwrap();
        t.optim_step(&adam).unwrap();
    }
    assert_eq!(weights(&resumed), weights(&trained));
}

#[test]
fn the_same_batch_scores_alike_on_the_tinker_path_and_in_a_fine_tuning_job() {
    // Prompts and completions of different lengths: the job's scoring pads them into one batch
    // its own way, Tinker's datums are each prompt + completion shifted by one.
    let mut trainer = trainer(true);
    let prompts: Vec<Vec<u32>> = vec![vec![3, 14, 15], vec![9], vec![26, 5, 35, 8, 9]];
    let completions: Vec<Vec<u32>> = vec![vec![7, 9, 2], vec![6, 5, 3, 5, 8], vec![1]];
    let lengths: Vec<usize> = completions.iter().map(Vec::len).collect();
    let data: Vec<Datum> = prompts
        .iter()
        .zip(&completions)
        .map(|(p, c)| {
            let sequence: Vec<u32> = p.iter().chain(c).copied().collect();
            let (last, inputs) = sequence.split_last().unwrap();
            datum(inputs, *last)
        })
        .collect();
    let mut forward = call(LossFn::CrossEntropy, data);
    forward.forward_only = true;
    let tinker = trainer.forward_backward(&forward).unwrap();
    // What a job's GRPO step scores (old policy) and trains on (with gradients, by layer).
    let model = trainer.model();
    let job = model.completion_logprobs(&prompts, &completions, 1.0, PAD, false).unwrap();
    let (layered, _tape) =
        model.completion_logprobs_layered(&prompts, &completions, &[], 1.0, PAD).unwrap();
    for scored in [&job.logprobs, &layered.logprobs] {
        for ((row, fields), prompt) in
            rows(scored, &lengths).unwrap().iter().zip(&tinker.outputs).zip(&prompts)
        {
            // Tinker's completion positions start at the prompt's last token.
            close(&fields["logprobs"][prompt.len() - 1..], row, 1e-4);
        }
    }
}
