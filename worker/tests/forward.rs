//! Trainable forward on tiny random models: gradients, kernels, invariances, KV cache, LoRA.

use candle_core::{Device, Tensor, Var};
use verity_kernels as kernels;
use verity_worker::model::compact::{CompactWeights, RolloutDtype};
use verity_worker::model::lora::LoraConfig;
use verity_worker::optim::GradAccumulator;
use verity_worker::testing::{max_abs_diff, tiny_model};
use verity_worker::{Family, Kernels, Transformer};

const FAMILIES: [Family; Family::ALL.len()] = Family::ALL;

fn prompts() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    (
        // Three completions share the first prompt (as a GRPO group does): its forward runs once.
        vec![
            vec![5, 9, 13, 22, 7],
            vec![3, 4],
            vec![5, 9, 13, 22, 7],
            vec![11, 12, 13],
            vec![5, 9, 13, 22, 7],
        ],
        vec![
            vec![30, 31, 32],
            vec![40, 41, 42, 43, 44],
            vec![33, 34, 35, 36, 37, 38],
            vec![50],
            vec![60],
        ],
    )
}

/// A loss that weights every completion token differently, so all gradients are exercised.
fn loss(model: &Transformer, track: bool) -> Tensor {
    let (p, c) = prompts();
    weighted_loss(model.completion_logprobs(&p, &c, 0.7, 0, track).unwrap())
}

fn weighted_loss(lp: verity_worker::model::CompletionLogprobs) -> Tensor {
    let (b, l) = lp.logprobs.dims2().unwrap();
    let w: Vec<f32> = (0..b * l).map(|i| 1.0 + (i % 5) as f32 * 0.3).collect();
    let w = Tensor::from_vec(w, (b, l), &Device::Cpu).unwrap();
    (lp.logprobs * lp.mask).unwrap().mul(&w).unwrap().sum_all().unwrap()
}

#[test]
fn every_trainable_tensor_gets_a_gradient_matching_the_reference() {
    for family in FAMILIES {
        let mut model = tiny_model(family, 7).unwrap();
        let fused = loss(&model, true);
        let fused_grads = fused.backward().unwrap();
        model.set_kernels(Kernels::Reference);
        let reference = loss(&model, true);
        let ref_grads = reference.backward().unwrap();
        assert!(max_abs_diff(&fused, &reference) < 1e-4, "{family:?} loss differs");
        for (name, var) in model.trainable_params() {
            let g = fused_grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{family:?}: no gradient for {name}"));
            let norm: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert!(norm > 0.0, "{family:?}: zero gradient for {name}");
            let r = ref_grads.get(var.as_tensor()).unwrap();
            let diff = max_abs_diff(g, r);
            let scale: f32 =
                r.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
            assert!(
                diff <= 1e-3 * scale.max(1.0),
                "{family:?}: gradient of {name} differs by {diff} (scale {scale})"
            );
        }
    }
}

#[test]
fn the_layer_by_layer_backward_gives_the_gradients_of_the_whole_graph() {
    let (p, c) = prompts();
    let targets = ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec();
    let lora = LoraConfig { r: 4, lora_alpha: 8.0, target_modules: targets, lora_dropout: 0.0 };
    for (family, with_lora) in [
        (Family::Llama, false),
        (Family::Qwen2, false),
        (Family::Qwen3, false),
        (Family::Qwen2, true),
    ] {
        let mut model = tiny_model(family, 5).unwrap();
        if with_lora {
            model.enable_lora(lora.clone(), 4).unwrap();
            for (name, var) in model.lora_params() {
                if name.contains("lora_B") {
                    var.set(&(var.as_tensor().ones_like().unwrap() * 0.05).unwrap()).unwrap();
                }
            }
        }
        let whole = loss(&model, true).backward().unwrap();
        let (lp, tape) = model.completion_logprobs_layered(&p, &c, &[], 0.7, 0).unwrap();
        let layered_loss = weighted_loss(lp);
        // A plain backward stops at the last cut: only the final norm and the LM head get gradients.
        let cut_short = layered_loss.backward().unwrap();
        let params = model.trainable_params();
        assert!(params.len() > 4, "{family:?}");
        let mut layered = GradAccumulator::new(&params);
        layered.accumulate_layered(&layered_loss, tape, &params, 1.0).unwrap();
        assert_eq!(layered.micro_batches(), 1);
        let mut stopped_at_cut = 0;
        for (name, var) in &params {
            let w = whole.get(var.as_tensor()).unwrap_or_else(|| panic!("{family:?}: {name}"));
            let l = Tensor::from_vec(layered.get(name).unwrap(), w.shape(), &Device::Cpu).unwrap();
            let scale = max_abs_diff(w, &w.zeros_like().unwrap()).max(1e-3);
            let diff = max_abs_diff(w, &l);
            assert!(
                diff <= 1e-5 * scale,
                "{family:?} lora={with_lora}: {name} differs by {diff} (scale {scale})"
            );
            stopped_at_cut += usize::from(cut_short.get(var.as_tensor()).is_none());
        }
        assert!(stopped_at_cut > 0, "{family:?}: the tape cut nothing");
    }
}

#[test]
fn gradients_match_finite_differences() {
    for family in FAMILIES {
        let model = tiny_model(family, 3).unwrap();
        let grads = loss(&model, true).backward().unwrap();
        for (name, var) in model.trainable_params() {
            let g: Vec<f32> =
                grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            // Probe the coordinate with the largest gradient and one fixed coordinate.
            let big =
                g.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap().0;
            for idx in [big, g.len() / 3] {
                let fd = finite_difference(&model, &var, idx, 1e-2);
                let tol = 2e-2 * g[idx].abs().max(fd.abs()) + 2e-3;
                assert!(
                    (fd - g[idx]).abs() <= tol,
                    "{family:?} {name}[{idx}]: analytic {} vs numeric {fd}",
                    g[idx]
                );
            }
        }
    }
}

fn finite_difference(model: &Transformer, var: &Var, idx: usize, eps: f32) -> f32 {
    let orig = var.as_tensor().copy().unwrap();
    let shape = orig.shape().clone();
    let mut data: Vec<f32> = orig.flatten_all().unwrap().to_vec1().unwrap();
    let mut eval = |delta: f32| -> f64 {
        let base = data[idx];
        data[idx] = base + delta;
        var.set(&Tensor::from_vec(data.clone(), &shape, &Device::Cpu).unwrap()).unwrap();
        data[idx] = base;
        loss(model, false).to_dtype(candle_core::DType::F64).unwrap().to_scalar::<f64>().unwrap()
    };
    let fd = (eval(eps) - eval(-eps)) / (2.0 * eps as f64);
    var.set(&orig).unwrap();
    fd as f32
}

#[test]
fn logprobs_do_not_depend_on_padding_or_batch_composition() {
    for family in FAMILIES {
        let model = tiny_model(family, 11).unwrap();
        let (p, c) = prompts();
        let together = model.completion_logprobs(&p, &c, 1.0, 0, false).unwrap();
        for i in 0..p.len() {
            let alone = model.completion_logprobs(&p[i..=i], &c[i..=i], 1.0, 0, false).unwrap();
            let n = c[i].len();
            let a = together.logprobs.get(i).unwrap().narrow(0, 0, n).unwrap();
            let b = alone.logprobs.get(0).unwrap();
            assert!(max_abs_diff(&a, &b) < 1e-4, "{family:?} row {i}");
            // Pad id must not matter either.
            let other_pad = model.completion_logprobs(&p, &c, 1.0, 63, false).unwrap();
            assert!(max_abs_diff(&together.logprobs, &other_pad.logprobs) < 1e-4);
        }
    }
}

#[test]
fn a_shared_prompt_gives_the_gradients_of_separate_sequences() {
    for family in FAMILIES {
        let model = tiny_model(family, 5).unwrap();
        let (p, c) = prompts();
        let sum = |lp: &verity_worker::model::CompletionLogprobs| {
            (&lp.logprobs * &lp.mask).unwrap().sum_all().unwrap()
        };
        let together = sum(&model.completion_logprobs(&p, &c, 0.9, 0, true).unwrap());
        let mut separate = Tensor::new(0f32, &Device::Cpu).unwrap();
        for i in 0..p.len() {
            let alone = model.completion_logprobs(&p[i..=i], &c[i..=i], 0.9, 0, true).unwrap();
            separate = (separate + sum(&alone)).unwrap();
        }
        assert!(max_abs_diff(&together, &separate) < 1e-4, "{family:?} loss differs");
        let (g1, g2) = (together.backward().unwrap(), separate.backward().unwrap());
        for (name, var) in model.trainable_params() {
            let (a, b) = (g1.get(var.as_tensor()).unwrap(), g2.get(var.as_tensor()).unwrap());
            let scale: f32 =
                b.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
            let diff = max_abs_diff(a, b);
            assert!(
                diff <= 1e-4 * scale.max(1.0),
                "{family:?}: gradient of {name} differs by {diff}"
            );
        }
    }
}

#[test]
fn kv_cache_decode_equals_full_forward() {
    for family in FAMILIES {
        let model = tiny_model(family, 5).unwrap();
        let seqs: Vec<Vec<u32>> =
            vec![vec![1, 2, 3, 4, 5, 6, 7, 8], vec![9, 10, 11, 12, 13, 14, 15, 16]];
        let prompt_lens = [3usize, 5];
        let full = model.sequence_logits(&[&seqs[0], &seqs[1]], 0).unwrap();
        // Prefill the (left-padded) prompts, then feed the rest one token at a time.
        let prompts: Vec<&[u32]> = seqs.iter().zip(prompt_lens).map(|(s, l)| &s[..l]).collect();
        let pb = verity_worker::model::inputs::PaddedBatch::new(&prompts, 0).unwrap();
        let mut cache = model.new_cache(2, 4).unwrap();
        let h = model
            .hidden_states(&pb.ids, &pb.positions(), 2, &pb.pads, Some(&mut cache), false)
            .unwrap();
        let logits = model.logits(&h, None).unwrap().reshape((2, pb.len, 64)).unwrap();
        for (b, &l) in prompt_lens.iter().enumerate() {
            let got = logits.get(b).unwrap().get(pb.len - 1).unwrap();
            assert!(max_abs_diff(&got, &full.get(b).unwrap().get(l - 1).unwrap()) < 1e-4);
        }
        let mut pos: Vec<usize> = prompt_lens.to_vec();
        for _ in 0..3 {
            let ids: Vec<u32> = (0..2).map(|b| seqs[b][pos[b]]).collect();
            let p: Vec<u32> = pos.iter().map(|&x| x as u32).collect();
            let h = model.hidden_states(&ids, &p, 2, &pb.pads, Some(&mut cache), false).unwrap();
            let step = model.logits(&h, None).unwrap();
            for (b, &p) in pos.iter().enumerate() {
                let want = full.get(b).unwrap().get(p).unwrap();
                assert!(
                    max_abs_diff(&step.get(b).unwrap(), &want) < 1e-4,
                    "{family:?} row {b} pos {p}"
                );
            }
            pos.iter_mut().for_each(|x| *x += 1);
        }
    }
}

/// `w` (an `(out, in)` weight) as a rollout precision's copy reads it: rounded to bf16, or
/// quantised to int8 with one scale per output channel (row) and scaled back.
fn as_read_in(w: &Tensor, dtype: RolloutDtype) -> Tensor {
    match dtype {
        RolloutDtype::Int8 => {
            let q = kernels::Int8Matrix::from_tensor(w, kernels::ScaleAxis::Rows).unwrap();
            Tensor::from_vec(q.dequantised(), w.dims2().unwrap(), &Device::Cpu).unwrap()
        }
        _ => {
            w.to_dtype(candle_core::DType::BF16).unwrap().to_dtype(candle_core::DType::F32).unwrap()
        }
    }
}

#[test]
fn low_precision_weight_copies_give_the_forward_of_the_rounded_weights() {
    for (family, dtype) in
        FAMILIES.into_iter().flat_map(|f| [(f, RolloutDtype::Bf16), (f, RolloutDtype::Int8)])
    {
        let model = tiny_model(family, 6).unwrap();
        // f32 decoding reads the weights themselves: there are no f32 copies to make.
        assert!(CompactWeights::for_rollouts(&model, RolloutDtype::F32).unwrap().is_none());
        assert!(CompactWeights::of(&model, RolloutDtype::F32).is_err());
        // The same model with every projection weight rounded (embeddings and norms stay f32).
        let rounded = tiny_model(family, 6).unwrap();
        for (name, w) in model.export_weights().unwrap() {
            if Transformer::is_held_transposed(&name) {
                rounded.import_weight(&name, &as_read_in(&w, dtype)).unwrap();
            }
        }
        let seqs: [&[u32]; 2] = [&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], &[9, 10, 11]];
        let pb = verity_worker::model::inputs::PaddedBatch::new(&seqs, 0).unwrap();
        let mut cache = model.new_cache(2, 16).unwrap();
        cache.use_weights(CompactWeights::of(&model, dtype).unwrap());
        let got = model
            .hidden_states(&pb.ids, &pb.positions(), 2, &pb.pads, Some(&mut cache), false)
            .unwrap();
        let want =
            rounded.hidden_states(&pb.ids, &pb.positions(), 2, &pb.pads, None, false).unwrap();
        assert!(max_abs_diff(&got, &want) < 1e-4, "{family:?} {dtype:?}");
        let f32_hidden =
            model.hidden_states(&pb.ids, &pb.positions(), 2, &pb.pads, None, false).unwrap();
        assert!(max_abs_diff(&got, &f32_hidden) > 1e-6, "{family:?} {dtype:?}: copies unused");
        // The LM head reads its copy too.
        let logits = model.logits(&got, Some(&cache)).unwrap();
        let weights = model.export_weights().unwrap();
        let lm_name = if model.config.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let lm = as_read_in(&weights.into_iter().find(|(n, _)| n == lm_name).unwrap().1, dtype);
        let want = got.matmul(&lm.t().unwrap()).unwrap();
        assert!(max_abs_diff(&logits, &want) < 1e-4, "{family:?} {dtype:?}");
    }
}

#[test]
fn lora_with_zero_b_leaves_logits_unchanged_and_trains_only_adapters() {
    let mut model = tiny_model(Family::Qwen2, 2).unwrap();
    let seq = [4u32, 8, 15, 16, 23, 42];
    let before = model.sequence_logits(&[&seq], 0).unwrap();
    let targets = ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec();
    model
        .enable_lora(
            LoraConfig { r: 4, lora_alpha: 8.0, target_modules: targets, lora_dropout: 0.0 },
            9,
        )
        .unwrap();
    let after = model.sequence_logits(&[&seq], 0).unwrap();
    assert_eq!(max_abs_diff(&before, &after), 0.0);
    let params = model.trainable_params();
    assert_eq!(params.len(), 2 * 3 * 2, "A and B for 3 projections in 2 layers");
    let grads = loss(&model, true).backward().unwrap();
    for (name, var) in &params {
        assert!(name.starts_with("base_model.model.model.layers."), "{name}");
        let g = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("no grad for {name}"));
        if name.contains("lora_B") {
            let n: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
            assert!(n > 0.0, "{name}");
        }
    }
    for (name, var) in model.named_weights() {
        assert!(
            grads.get(var.as_tensor()).is_none(),
            "base weight {name} must not train under LoRA"
        );
    }
}

fn scalar(t: &Tensor) -> f32 {
    t.to_scalar::<f32>().unwrap()
}

#[test]
fn lora_dropout_acts_only_on_training_forwards_and_follows_its_seed() {
    let targets = ["q_proj", "up_proj"].map(String::from).to_vec();
    let with_dropout = |p: f64| {
        let mut model = tiny_model(Family::Llama, 2).unwrap();
        let config =
            LoraConfig { r: 4, lora_alpha: 8.0, target_modules: targets.clone(), lora_dropout: p };
        model.enable_lora(config, 3).unwrap();
        for (name, var) in model.lora_params() {
            if name.contains("lora_B") {
                // A non-zero B, so the adapter path (where dropout acts) changes the output.
                let filled = (var.as_tensor().ones_like().unwrap() * 0.05).unwrap();
                var.set(&filled).unwrap();
            }
        }
        model
    };
    let plain = with_dropout(0.0);
    let dropped = with_dropout(0.5);
    // No-gradient forwards (sampling, old log-probs) never drop.
    assert_eq!(scalar(&loss(&plain, false)), scalar(&loss(&dropped, false)));
    // Training forwards do, and the same seed draws the same masks.
    dropped.seed_lora_dropout(7);
    let first = scalar(&loss(&dropped, true));
    dropped.seed_lora_dropout(7);
    let again = scalar(&loss(&dropped, true));
    dropped.seed_lora_dropout(8);
    let other_seed = scalar(&loss(&dropped, true));
    assert_eq!(first, again);
    assert_ne!(first, scalar(&loss(&plain, true)));
    assert_ne!(first, other_seed);
    let bad =
        LoraConfig { r: 4, lora_alpha: 8.0, target_modules: targets.clone(), lora_dropout: 1.0 };
    assert!(tiny_model(Family::Llama, 2).unwrap().enable_lora(bad, 0).is_err());
}

#[test]
fn kernels_reject_bad_shapes_without_panicking() {
    let x = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(kernels::rms_norm(&x, &w, 1e-5).is_err());
    let h = Tensor::zeros((2, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let lm = Tensor::zeros((10, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(kernels::token_logprobs(&h, &lm, &[1, 99], 1.0).is_err());
    assert!(kernels::token_logprobs(&h, &lm, &[1], 1.0).is_err());
}
