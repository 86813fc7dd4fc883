//! Optimizer, gradient accumulation, schedules and checkpoints on tiny random models.

use candle_core::{Device, Tensor};
use verity_worker::checkpoint::{restore_optimizer, restore_weights, save_checkpoint};
use verity_worker::model::lora::LoraConfig;
use verity_worker::testing::tiny_model;
use verity_worker::{AdamW, AdamWConfig, Family, GradAccumulator, LrSchedule, Transformer};

fn batch(i: u32) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    (vec![vec![3 + i, 4, 5], vec![7, 8 + i]], vec![vec![9, 10 + i], vec![11, 12, 13]])
}

fn loss(model: &Transformer, i: u32) -> Tensor {
    let (p, c) = batch(i);
    let lp = model.completion_logprobs(&p, &c, 1.0, 0, true).unwrap();
    (lp.logprobs * lp.mask).unwrap().sum_all().unwrap().neg().unwrap()
}

/// One optimizer step over two micro-batches with clipping.
fn train_step(model: &Transformer, opt: &mut AdamW, step: u32) -> f64 {
    let params = model.trainable_params();
    let mut acc = GradAccumulator::new(&params);
    for mb in 0..2 {
        let grads = loss(model, step * 2 + mb).backward().unwrap();
        acc.accumulate(grads, &params, 0.5).unwrap();
    }
    let (clip, norm) = acc.clip_factor(1.0);
    opt.step(&params, &acc, 1e-2, clip).unwrap();
    norm
}

fn all_weights(model: &Transformer) -> Vec<Vec<f32>> {
    model
        .named_weights()
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

#[test]
fn adamw_matches_a_scalar_reference_implementation() {
    let model = tiny_model(Family::Llama, 1).unwrap();
    let params = model.trainable_params();
    let cfg = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
    let mut opt = AdamW::new(cfg.clone(), &params).unwrap();
    let name = "model.layers.0.mlp.up_proj.weight";
    let var = &params.iter().find(|(n, _)| n == name).unwrap().1;
    let mut p: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    let (mut m, mut v) = (vec![0f32; p.len()], vec![0f32; p.len()]);
    for t in 1..=3 {
        let mut acc = GradAccumulator::new(&params);
        acc.accumulate(loss(&model, t).backward().unwrap(), &params, 1.0).unwrap();
        let g = acc.get(name).unwrap();
        opt.step(&params, &acc, 0.01, 0.5).unwrap();
        for i in 0..p.len() {
            let gi = g[i] * 0.5;
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.95 * v[i] + 0.05 * gi * gi;
            let mh = m[i] / (1.0 - 0.9f32.powi(t as i32));
            let vh = v[i] / (1.0 - 0.95f32.powi(t as i32));
            p[i] = p[i] * (1.0 - 0.01 * 0.1) - 0.01 * mh / (vh.sqrt() + 1e-8);
        }
    }
    let got: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    let diff = got.iter().zip(&p).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-5, "AdamW differs from reference by {diff}");
}

#[test]
fn clipping_bounds_the_global_norm_and_accumulation_sums() {
    let model = tiny_model(Family::Qwen2, 4).unwrap();
    let params = model.trainable_params();
    let mut one = GradAccumulator::new(&params);
    one.accumulate(loss(&model, 0).backward().unwrap(), &params, 1.0).unwrap();
    let mut twice = GradAccumulator::new(&params);
    twice.accumulate(loss(&model, 0).backward().unwrap(), &params, 1.0).unwrap();
    twice.accumulate(loss(&model, 0).backward().unwrap(), &params, 1.0).unwrap();
    assert_eq!(twice.micro_batches(), 2);
    assert!((twice.global_norm() - 2.0 * one.global_norm()).abs() < 1e-3 * one.global_norm());
    let (f, norm) = one.clip_factor(norm_half(&one));
    assert!((f as f64 * norm - norm_half(&one)).abs() < 1e-3 * norm);
    assert_eq!(one.clip_factor(1e9).0, 1.0);
    twice.reset();
    assert_eq!(twice.global_norm(), 0.0);
}

fn norm_half(acc: &GradAccumulator) -> f64 {
    acc.global_norm() / 2.0
}

#[test]
fn schedules_warm_up_then_hold_or_decay() {
    let s =
        LrSchedule { lr: 1.0, warmup_steps: 4, total_steps: 14, cosine: true, min_lr_ratio: 0.1 };
    assert_eq!(s.lr_at(0), 0.25);
    assert_eq!(s.lr_at(3), 1.0);
    assert!((s.lr_at(4) - 1.0).abs() < 1e-12);
    assert!((s.lr_at(9) - 0.55).abs() < 1e-12);
    assert!((s.lr_at(14) - 0.1).abs() < 1e-12);
    assert!((s.lr_at(100) - 0.1).abs() < 1e-12);
    assert_eq!(LrSchedule::constant(0.5).lr_at(1000), 0.5);
}

#[test]
fn full_checkpoint_resumes_bit_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(Family::Llama, 8).unwrap();
    let mut opt = AdamW::new(
        AdamWConfig { weight_decay: 0.01, ..Default::default() },
        &model.trainable_params(),
    )
    .unwrap();
    train_step(&model, &mut opt, 0);
    save_checkpoint(dir.path(), &model, None, Some(&opt), "tiny").unwrap();
    train_step(&model, &mut opt, 1);
    let continued = all_weights(&model);

    let mut resumed = tiny_model(Family::Llama, 99).unwrap();
    restore_weights(&mut resumed, dir.path()).unwrap();
    let mut opt2 = restore_optimizer(&resumed, dir.path()).unwrap();
    assert_eq!(opt2.step_count(), 1);
    train_step(&resumed, &mut opt2, 1);
    assert_eq!(all_weights(&resumed), continued, "resumed training must be bit-identical");

    // The folder is an HF model folder: it loads on its own and gives identical logits.
    let seq = [1u32, 5, 9];
    let reloaded = verity_worker::model::Transformer::from_weights(
        verity_worker::ModelConfig::from_hf_file(&dir.path().join("config.json")).unwrap(),
        verity_worker::weights::WeightMap::load_hf_dir(dir.path(), &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let mut at_save = tiny_model(Family::Llama, 99).unwrap();
    restore_weights(&mut at_save, dir.path()).unwrap();
    let a: Vec<f32> = verity_worker::testing::flat_logits(&reloaded, &seq).unwrap();
    let b: Vec<f32> = verity_worker::testing::flat_logits(&at_save, &seq).unwrap();
    assert_eq!(a, b);
}

#[test]
fn lora_checkpoint_is_peft_format_and_reloads_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lora = LoraConfig {
        r: 2,
        lora_alpha: 4.0,
        target_modules: vec!["q_proj".into(), "o_proj".into()],
        lora_dropout: 0.1,
    };
    let mut model = tiny_model(Family::Qwen3, 6).unwrap();
    model.enable_lora(lora.clone(), 1).unwrap();
    let mut opt = AdamW::new(AdamWConfig::default(), &model.trainable_params()).unwrap();
    let base_before = all_weights(&model);
    let seq0 = [2u32, 7, 1, 8];
    let base_logits: Vec<f32> = verity_worker::testing::flat_logits(&model, &seq0).unwrap();
    train_step(&model, &mut opt, 0);
    assert_eq!(all_weights(&model), base_before, "base weights are frozen under LoRA");
    let trained: Vec<f32> = verity_worker::testing::flat_logits(&model, &seq0).unwrap();
    assert_ne!(trained, base_logits, "the adapters changed the policy");
    model.set_adapters_enabled(false);
    let reference: Vec<f32> = verity_worker::testing::flat_logits(&model, &seq0).unwrap();
    assert_eq!(reference, base_logits, "adapters off gives the reference policy");
    model.set_adapters_enabled(true);
    save_checkpoint(dir.path(), &model, None, Some(&opt), "tiny-qwen3").unwrap();
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["r"], 2);
    let st = std::fs::read(dir.path().join("adapter_model.safetensors")).unwrap();
    let names = safetensors::SafeTensors::deserialize(&st)
        .unwrap()
        .names()
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert!(
        names.contains(
            &"base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight".to_string()
        ),
        "{names:?}"
    );

    let mut fresh = tiny_model(Family::Qwen3, 6).unwrap();
    restore_weights(&mut fresh, dir.path()).unwrap();
    let seq = [3u32, 1, 4, 1, 5];
    let a: Vec<f32> = verity_worker::testing::flat_logits(&model, &seq).unwrap();
    let b: Vec<f32> = verity_worker::testing::flat_logits(&fresh, &seq).unwrap();
    assert_eq!(a, b);
    let opt2 = restore_optimizer(&fresh, dir.path()).unwrap();
    assert_eq!(opt2.step_count(), 1);
}

#[test]
fn policy_optimizer_steps_and_resumes_exactly() {
    use verity_worker::PolicyOptimizer;
    let dir = tempfile::tempdir().unwrap();
    let schedule =
        LrSchedule { lr: 1e-2, warmup_steps: 2, total_steps: 10, cosine: true, min_lr_ratio: 0.0 };
    let model = tiny_model(Family::Llama, 12).unwrap();
    let mut opt =
        PolicyOptimizer::new(&model, AdamWConfig::default(), schedule.clone(), 0.5).unwrap();
    let run_step = |model: &Transformer, opt: &mut PolicyOptimizer, i: u32| {
        for mb in 0..2 {
            opt.backward(&loss(model, i * 2 + mb), 0.5).unwrap();
        }
        opt.step().unwrap()
    };
    let s1 = run_step(&model, &mut opt, 0);
    assert_eq!((s1.step, s1.micro_batches), (1, 2));
    assert_eq!(s1.lr, 5e-3, "first warmup step");
    assert!(s1.grad_norm > 0.5 && s1.clip_factor < 1.0, "{s1:?}");
    save_checkpoint(dir.path(), &model, None, Some(&opt.adamw), "tiny").unwrap();
    let s2 = run_step(&model, &mut opt, 1);
    assert_eq!(s2.lr, 1e-2);

    let mut resumed = tiny_model(Family::Llama, 0).unwrap();
    restore_weights(&mut resumed, dir.path()).unwrap();
    let mut opt2 = PolicyOptimizer::restore(&resumed, dir.path(), schedule, 0.5).unwrap();
    let r2 = run_step(&resumed, &mut opt2, 1);
    assert_eq!(r2, s2);
    assert_eq!(all_weights(&resumed), all_weights(&model));
}
