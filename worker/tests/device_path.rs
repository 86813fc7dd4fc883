//! The GPU's code path: the device kernels (fused forward, composed backward), the tensor-op
//! optimizer, and bf16 mixed precision over f32 master weights. Runs on `VERITY_TEST_DEVICE`
//! (`cuda:0` under `scripts/gpu-check.sh`), else on the CPU with the device path forced, so
//! the CPU suite proves the logic the GPU runs. References are computed on the CPU.

use candle_core::{DType, Device, Tensor};
use verity_worker::optim::OptimizerPath;
use verity_worker::testing::{max_abs_diff, tiny_config, tiny_model};
use verity_worker::weights::random_weights;
use verity_worker::{
    parse_device, AdamWConfig, Family, Kernels, LrSchedule, PolicyOptimizer, Transformer,
};

/// The device under test: `VERITY_TEST_DEVICE`, else the CPU.
fn device() -> Device {
    let spec = std::env::var("VERITY_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    parse_device(&spec).expect("VERITY_TEST_DEVICE must name a usable device")
}

/// The tiny model of `family` and `seed` on the device under test, on the device path, in f32.
fn device_model(family: Family, seed: u64) -> Transformer {
    let (config, dev) = (tiny_config(family), device());
    let weights = random_weights(&config, seed, &dev).unwrap();
    let mut model = Transformer::from_weights(config, weights, &dev).unwrap();
    model.set_kernels(Kernels::Device);
    model.set_compute_dtype(DType::F32).unwrap();
    model
}

const FAMILIES: [Family; Family::ALL.len()] = Family::ALL;

fn batch() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    (
        vec![vec![5, 9, 13, 22, 7], vec![3, 4], vec![5, 9, 13, 22, 7], vec![11, 12, 13]],
        vec![vec![30, 31, 32], vec![40, 41, 42, 43, 44], vec![33, 34, 35, 36], vec![50]],
    )
}

/// A loss weighting every completion token differently (all gradients exercised).
fn loss(model: &Transformer) -> Tensor {
    let (p, c) = batch();
    let lp = model.completion_logprobs(&p, &c, 0.7, 0, true).unwrap();
    let (b, l) = lp.logprobs.dims2().unwrap();
    let w: Vec<f32> = (0..b * l).map(|i| 1.0 + (i % 5) as f32 * 0.3).collect();
    let w = Tensor::from_vec(w, (b, l), model.device()).unwrap();
    (lp.logprobs * lp.mask).unwrap().mul(&w).unwrap().sum_all().unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
}

fn all_weights(model: &Transformer) -> Vec<f32> {
    model.named_weights().iter().flat_map(|(_, v)| flat(v.as_tensor())).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn relative_distance(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

#[test]
fn device_kernels_match_the_reference_in_values_and_gradients() {
    for family in FAMILIES {
        let mut model = device_model(family, 7);
        let device = loss(&model);
        let device_grads = device.backward().unwrap();
        model.set_kernels(Kernels::Reference);
        let reference = loss(&model);
        let ref_grads = reference.backward().unwrap();
        assert!(max_abs_diff(&device, &reference) < 1e-4, "{family:?}: loss differs");
        for (name, var) in model.trainable_params() {
            let g = device_grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{name}"));
            let r = ref_grads.get(var.as_tensor()).unwrap();
            let scale = flat(r).iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
            let diff = max_abs_diff(g, r);
            assert!(diff <= 1e-4 * scale, "{family:?}: gradient of {name} differs by {diff}");
        }
    }
}

#[test]
fn device_softmax_and_rms_norm_have_the_gradients_of_their_compositions() {
    let dev = device();
    let x =
        candle_core::Var::from_tensor(&Tensor::randn(0f32, 2.0, (3, 4, 7), &dev).unwrap()).unwrap();
    let w = candle_core::Var::from_tensor(&Tensor::randn(1f32, 0.3, 7, &dev).unwrap()).unwrap();
    let dy = Tensor::randn(0f32, 1.0, (3, 4, 7), &dev).unwrap();
    let pairs: [(Tensor, Tensor); 2] = [
        (
            verity_kernels::device::softmax_last_dim(x.as_tensor()).unwrap(),
            candle_nn::ops::softmax(x.as_tensor(), candle_core::D::Minus1).unwrap(),
        ),
        (
            verity_kernels::rms_norm_device(x.as_tensor(), w.as_tensor(), 1e-5).unwrap(),
            verity_kernels::rms_norm_reference(x.as_tensor(), w.as_tensor(), 1e-5).unwrap(),
        ),
    ];
    for (fused, composed) in pairs {
        assert!(max_abs_diff(&fused, &composed) < 1e-5);
        let gf = (fused * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        let gc = (composed * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        for v in [&x, &w] {
            match (gf.get(v.as_tensor()), gc.get(v.as_tensor())) {
                (Some(a), Some(b)) => assert!(max_abs_diff(a, b) < 1e-4, "gradient differs"),
                (None, None) => {}
                _ => panic!("one side has a gradient the other lacks"),
            }
        }
    }
}

/// Trains `model` two steps on the batch with the given optimizer path; returns the grad norms.
fn two_steps(model: &Transformer, path: OptimizerPath) -> Vec<f64> {
    let cfg = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
    let mut opt = PolicyOptimizer::new(model, cfg, LrSchedule::constant(1e-2), 0.5).unwrap();
    opt.set_path(path).unwrap();
    assert_eq!(opt.path(), path);
    (0..2)
        .map(|_| {
            // Two micro-batches, the norm clipped (0.5 is below these gradients' norm).
            opt.backward(&loss(model), 0.5).unwrap();
            opt.backward(&(loss(model) * 0.5).unwrap(), 0.5).unwrap();
            let stats = opt.step().unwrap();
            assert!(stats.clip_factor < 1.0, "{stats:?}");
            stats.grad_norm
        })
        .collect()
}

/// The CPU's fused optimizer on the CPU against the tensor-op optimizer on the device under
/// test, both over the device path's forward: on the CPU the same gradients, so the same
/// weights to 1e-5; on a GPU the gradients differ by float reassociation, which Adam's
/// normalisation can amplify on near-zero gradients, so the updates are compared by cosine.
#[test]
fn the_tensor_optimizer_path_computes_the_fused_update() {
    let mut fused = tiny_model(Family::Qwen2, 3).unwrap();
    fused.set_kernels(Kernels::Device);
    let tensor = device_model(Family::Qwen2, 3);
    let before = all_weights(&fused);
    let norms_fused = two_steps(&fused, OptimizerPath::FusedCpu);
    let norms_tensor = two_steps(&tensor, OptimizerPath::Tensor);
    for (a, b) in norms_fused.iter().zip(&norms_tensor) {
        assert!((a - b).abs() <= 1e-4 * a, "grad norms {a} vs {b}");
    }
    let (a, b) = (all_weights(&fused), all_weights(&tensor));
    if device().is_cpu() {
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "weights differ by {diff} after two steps");
    } else {
        let delta = |w: &[f32]| -> Vec<f32> { w.iter().zip(&before).map(|(x, y)| x - y).collect() };
        let cos = cosine(&delta(&a), &delta(&b));
        assert!(cos >= 0.999, "update cosine {cos}");
    }
}

#[test]
fn optimizer_state_moves_between_paths_and_checkpoints_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = device_model(Family::Llama, 8);
    let params = model.trainable_params();
    let mut opt = verity_worker::AdamW::with_path(
        AdamWConfig { weight_decay: 0.01, ..Default::default() },
        &params,
        OptimizerPath::Tensor,
    )
    .unwrap();
    let mut acc = verity_worker::GradAccumulator::with_path(&params, OptimizerPath::Tensor);
    acc.accumulate(loss(&model).backward().unwrap(), &params, 1.0).unwrap();
    opt.step(&params, &acc, 1e-2, 1.0).unwrap();
    let path = dir.path().join("state.safetensors");
    opt.save(&path).unwrap();
    // Loaded onto the host path (a CPU model's) and moved back: the same moments.
    let cpu = tiny_model(Family::Llama, 8).unwrap();
    let cpu_params = cpu.trainable_params();
    let mut moved =
        verity_worker::AdamW::load_with_path(&path, &cpu_params, OptimizerPath::FusedCpu).unwrap();
    assert_eq!(moved.step_count(), 1);
    moved.set_path(&cpu_params, OptimizerPath::Tensor).unwrap();
    moved.set_path(&cpu_params, OptimizerPath::FusedCpu).unwrap();
    let path2 = dir.path().join("again.safetensors");
    moved.save(&path2).unwrap();
    let read = |p: &std::path::Path| {
        let bytes = std::fs::read(p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        names.into_iter().map(|n| st.tensor(&n).unwrap().data().to_vec()).collect::<Vec<_>>()
    };
    assert_eq!(read(&path), read(&path2), "moments changed on the way between paths");
}

#[test]
fn bf16_mixed_precision_keeps_f32_masters_and_f32_logprobs() {
    let mut model = device_model(Family::Qwen3, 11);
    model.set_compute_dtype(DType::BF16).unwrap();
    assert!(model.set_compute_dtype(DType::F16).is_err());
    let (p, c) = batch();
    let lp = model.completion_logprobs(&p, &c, 1.0, 0, true).unwrap();
    // The log-probabilities (what the GRPO ratio exp(new − old) is computed from) are f32, and
    // f32 math: not bf16 values cast up.
    assert_eq!(lp.logprobs.dtype(), DType::F32);
    assert_eq!(lp.entropy.dtype(), DType::F32);
    let values = flat(&lp.logprobs);
    let rounded = flat(&lp.logprobs.to_dtype(DType::BF16).unwrap());
    assert!(values.iter().zip(&rounded).any(|(a, b)| a != b), "log-probs are bf16-quantised");
    // The gradients reach the f32 parameters; sampling runs in bf16 with a bf16 cache.
    let grads = loss(&model).backward().unwrap();
    for (name, var) in model.trainable_params() {
        assert_eq!(var.dtype(), DType::F32, "{name}");
        assert_eq!(grads.get(var.as_tensor()).unwrap().dtype(), DType::F32, "{name}");
    }
    let logits = model.sequence_logits(&[&[1, 2, 3]], 0).unwrap();
    assert_eq!(logits.dtype(), DType::F32);
    let params =
        verity_worker::SamplingParams { temperature: 0.0, max_new_tokens: 4, ..Default::default() };
    let out = verity_worker::sample(&model, &[vec![1, 2, 3]], &params, &[], 0, None).unwrap();
    assert_eq!(out[0].token_ids.len(), 4);
}

/// The stated tolerance of a bf16 step against the f32 one (tiny random model, 2 steps of AdamW
/// at lr 1e-2): log-probabilities within 0.05 nats, gradients with cosine similarity ≥ 0.99,
/// and the weight updates with cosine similarity ≥ 0.99.
#[test]
fn a_bf16_training_step_stays_within_tolerance_of_the_f32_step() {
    for family in FAMILIES {
        let full = tiny_model(family, 13).unwrap();
        let mut mixed = device_model(family, 13);
        mixed.set_compute_dtype(DType::BF16).unwrap();
        let (p, c) = batch();
        let lp_full = full.completion_logprobs(&p, &c, 1.0, 0, false).unwrap().logprobs;
        let lp_mixed = mixed.completion_logprobs(&p, &c, 1.0, 0, false).unwrap().logprobs;
        let d = max_abs_diff(&lp_full, &lp_mixed.to_device(&Device::Cpu).unwrap());
        assert!(d < 0.05, "{family:?}: bf16 log-probs differ by {d} nats");
        let (gf, gm) = (loss(&full).backward().unwrap(), loss(&mixed).backward().unwrap());
        let grads = |g: &candle_core::backprop::GradStore, m: &Transformer| -> Vec<f32> {
            m.trainable_params()
                .iter()
                .flat_map(|(_, v)| flat(g.get(v.as_tensor()).unwrap()))
                .collect()
        };
        let cos = cosine(&grads(&gf, &full), &grads(&gm, &mixed));
        assert!(cos >= 0.99, "{family:?}: gradient cosine {cos}");
        let before = all_weights(&full);
        two_steps(&full, OptimizerPath::Tensor);
        two_steps(&mixed, OptimizerPath::Tensor);
        let delta = |m: &Transformer| -> Vec<f32> {
            all_weights(m).iter().zip(&before).map(|(a, b)| a - b).collect()
        };
        let (df, dm) = (delta(&full), delta(&mixed));
        let cos = cosine(&df, &dm);
        eprintln!(
            "{family:?}: log-prob diff {d:.4}, update cosine {cos:.4}, relative distance {:.4}",
            relative_distance(&dm, &df)
        );
        assert!(cos >= 0.99, "{family:?}: update cosine {cos}");
    }
}

/// The KV-cached sampler on the device path (batched rows, a prefill shared by each prompt's
/// samples, continuous batching) gives the CPU's greedy tokens and log-probabilities.
#[test]
fn the_sampler_on_the_device_path_gives_the_cpus_greedy_tokens() {
    for family in FAMILIES {
        let cpu = tiny_model(family, 17).unwrap();
        let dev = device_model(family, 17);
        let prompts = vec![vec![3, 9, 27, 4], vec![5, 6], vec![8, 1, 2]];
        let params = verity_worker::SamplingParams {
            n: 3,
            temperature: 0.0,
            max_new_tokens: 6,
            max_batch_rows: 4,
            ..Default::default()
        };
        let want = verity_worker::sample(&cpu, &prompts, &params, &[], 0, None).unwrap();
        let got = verity_worker::sample(&dev, &prompts, &params, &[], 0, None).unwrap();
        assert_eq!(want.len(), 9);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(
                (w.prompt_index, &w.token_ids),
                (g.prompt_index, &g.token_ids),
                "{family:?}"
            );
            for (a, b) in w.logprobs.iter().zip(&g.logprobs) {
                assert!((a - b).abs() < 1e-3, "{family:?}: log-prob {a} vs {b}");
            }
        }
    }
}
