//! Every decoder family against transformers itself: a tiny model with random weights that
//! transformers built from the family's own config class gives Verity the logits, greedy tokens
//! and log-likelihood gradients that transformers computed from it (in f64, the exact values
//! that f32 arithmetic approximates; eager attention).
//! Fixtures: `worker/tests/data/families/{model_type}/`, made by
//! `scripts/reference/family_fixtures.py` (its header says how to regenerate them).

use candle_core::{DType, Device};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use verity_worker::weights::WeightMap;
use verity_worker::{Family, Kernels, ModelConfig, SamplingParams, Transformer};

#[derive(Deserialize)]
struct Reference {
    transformers: String,
    sequences: Vec<Vec<u32>>,
    logits: Vec<Vec<Vec<f32>>>,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    gradients: BTreeMap<String, Vec<f32>>,
}

/// The fixture folder of `family`: under `VERITY_FAMILY_FIXTURES` (set by scripts/gpu-check.sh,
/// whose test binaries run away from this checkout) or this crate's `tests/data/families`.
fn fixture(family: Family) -> PathBuf {
    let root = std::env::var_os("VERITY_FAMILY_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/families"));
    root.join(family.model_type())
}

fn load(family: Family) -> (Transformer, Reference) {
    load_on(family, &Device::Cpu)
}

fn load_on(family: Family, device: &Device) -> (Transformer, Reference) {
    let dir = fixture(family);
    let config = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
    assert_eq!(config.family, family, "{}", dir.display());
    let weights = WeightMap::load_hf_dir(&dir, device).unwrap();
    let mut model = Transformer::from_weights(config, weights, device).unwrap();
    // Compared with f32 references (a GPU would default to bf16).
    model.set_compute_dtype(DType::F32).unwrap();
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    (model, serde_json::from_str(&text).unwrap())
}

/// How far Verity's f32 logits may be from the exact logits `want`: f32 rounding, relative to
/// the logits' size (transformers' own f32 logits are up to 6e-5 of it away; a wrong layer
/// is off by whole units).
fn logit_tolerance(want: &[f32]) -> f32 {
    1e-4 + 1e-4 * want.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Largest `|a - b|` over the pair, after checking the lengths agree.
fn worst(a: &[f32], b: &[f32], what: &str) -> f32 {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn every_family_gives_transformers_logits_alone_and_in_a_padded_batch() {
    for family in Family::ALL {
        let (mut model, reference) = load(family);
        let seqs: Vec<&[u32]> = reference.sequences.iter().map(Vec::as_slice).collect();
        for kernels in [Kernels::Fused, Kernels::Device, Kernels::Reference] {
            model.set_kernels(kernels);
            // Each sequence alone, then both left-padded into one batch.
            for (i, seq) in seqs.iter().enumerate() {
                let got = model.sequence_logits(&[seq], 0).unwrap();
                let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
                let want: Vec<f32> = reference.logits[i].concat();
                let diff = worst(&got, &want, family.model_type());
                assert!(
                    diff < logit_tolerance(&want),
                    "{family:?} {kernels:?} sequence {i}: logits differ from transformers {} by {diff}",
                    reference.transformers
                );
            }
            assert_padded_batch_logits(&model, &reference, &format!("{family:?} {kernels:?}"));
        }
    }
}

/// The reference sequences left-padded into one batch give the reference logits row by row.
fn assert_padded_batch_logits(model: &Transformer, reference: &Reference, label: &str) {
    let seqs: Vec<&[u32]> = reference.sequences.iter().map(Vec::as_slice).collect();
    let batch = model.sequence_logits(&seqs, 0).unwrap().to_device(&Device::Cpu).unwrap();
    let len = batch.dim(1).unwrap();
    for (i, seq) in seqs.iter().enumerate() {
        let row = batch.get(i).unwrap().narrow(0, len - seq.len(), seq.len()).unwrap();
        let got: Vec<f32> = row.flatten_all().unwrap().to_vec1().unwrap();
        let want = reference.logits[i].concat();
        let diff = worst(&got, &want, label);
        assert!(diff < logit_tolerance(&want), "{label}: padded row {i} off by {diff}");
    }
}

#[test]
fn every_family_gives_transformers_logits_on_the_test_device() {
    // VERITY_TEST_DEVICE (scripts/gpu-check.sh sets cuda:0); the CPU otherwise.
    let spec = std::env::var("VERITY_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    let device = verity_worker::parse_device(&spec).unwrap();
    for family in Family::ALL {
        let (model, reference) = load_on(family, &device);
        assert_padded_batch_logits(&model, &reference, &format!("{family:?} on {spec}"));
    }
}

#[test]
fn every_family_decodes_transformers_greedy_tokens_through_the_kv_cache() {
    for family in Family::ALL {
        let (model, reference) = load(family);
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: reference.greedy.len(),
            ..Default::default()
        };
        let out = verity_worker::sample(
            &model,
            std::slice::from_ref(&reference.prompt),
            &params,
            &[],
            0,
            None,
        )
        .unwrap();
        assert_eq!(out[0].token_ids, reference.greedy, "{family:?}: greedy tokens");
    }
}

#[test]
fn every_family_gives_transformers_gradients_of_the_log_likelihood() {
    for (family, kernels) in
        Family::ALL.into_iter().flat_map(|f| [Kernels::Fused, Kernels::Device].map(|k| (f, k)))
    {
        let (mut model, reference) = load(family);
        model.set_kernels(kernels);
        let seq = &reference.sequences[0];
        let scored =
            model.completion_logprobs(&[seq[..1].to_vec()], &[seq[1..].to_vec()], 1.0, 0, true);
        let total = scored.unwrap().logprobs.sum_all().unwrap();
        let grads = total.backward().unwrap();
        let params: BTreeMap<String, _> = model.trainable_params().into_iter().collect();
        assert!(!reference.gradients.is_empty());
        for (name, want) in &reference.gradients {
            let var = params.get(name).unwrap_or_else(|| panic!("{family:?}: no `{name}`"));
            let mut grad = grads.get(var.as_tensor()).unwrap().clone();
            if Transformer::is_held_transposed(name) {
                grad = grad.t().unwrap();
            }
            let got: Vec<f32> =
                grad.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff = worst(&got, want, name);
            assert!(
                diff < 1e-3 * scale,
                "{family:?} {kernels:?} `{name}`: gradient off by {diff} (scale {scale})"
            );
        }
    }
}

#[test]
fn every_family_round_trips_through_a_checkpoint_folder() {
    // VERITY_FAMILY_DUMP=DIR keeps the folders, for loading them in transformers
    // (scripts/reference/check_family_exports.py).
    let keep = std::env::var_os("VERITY_FAMILY_DUMP").map(PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    for family in Family::ALL {
        let (model, reference) = load(family);
        let dir = keep.as_deref().unwrap_or(tmp.path()).join(family.model_type());
        verity_worker::checkpoint::save_checkpoint(&dir, &model, None, None, "fixture").unwrap();
        let config = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
        assert_eq!(config, model.config, "{family:?}: config.json round trip");
        let weights = WeightMap::load_hf_dir(&dir, &Device::Cpu).unwrap();
        let back = Transformer::from_weights(config, weights, &Device::Cpu).unwrap();
        let seq = reference.sequences[0].as_slice();
        let logits = |m: &Transformer| -> Vec<f32> {
            m.sequence_logits(&[seq], 0).unwrap().flatten_all().unwrap().to_vec1().unwrap()
        };
        assert_eq!(logits(&back), logits(&model), "{family:?}: reloaded logits");
    }
}

#[test]
fn lora_adapts_each_familys_projections_under_their_peft_names() {
    let every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
    for family in Family::ALL {
        let (mut model, _) = load(family);
        let lora = verity_worker::model::lora::LoraConfig {
            r: 2,
            lora_alpha: 4.0,
            target_modules: every.map(String::from).to_vec(),
            lora_dropout: 0.0,
        };
        model.enable_lora(lora, 1).unwrap();
        let mut adapted: Vec<String> = model
            .lora_params()
            .into_iter()
            .filter_map(|(name, _)| {
                let module = name.strip_prefix("base_model.model.model.layers.0.")?;
                Some(module.strip_suffix(".lora_A.weight")?.to_string())
            })
            .collect();
        adapted.sort();
        // Phi-3 fuses q/k/v and gate/up: PEFT names its adapters by the fused modules.
        let want: &[&str] = if family == Family::Phi3 {
            &["mlp.down_proj", "mlp.gate_up_proj", "self_attn.o_proj", "self_attn.qkv_proj"]
        } else {
            &[
                "mlp.down_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
                "self_attn.k_proj",
                "self_attn.o_proj",
                "self_attn.q_proj",
                "self_attn.v_proj",
            ]
        };
        assert_eq!(adapted, want, "{family:?}");
    }
}
