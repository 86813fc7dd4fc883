//! Loading HF folders: single and sharded safetensors, bf16 weights, config parsing errors.

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use verity_worker::testing::tiny_config;
use verity_worker::weights::random_weights;
use verity_worker::weights::{save_safetensors, WeightMap};
use verity_worker::{Family, ModelConfig, Transformer};

fn logits(model: &Transformer) -> Vec<f32> {
    model
        .sequence_logits(&[&[3, 1, 4, 1, 5, 9]], 0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn sharded_and_single_folders_load_the_same_model() {
    let cfg = tiny_config(Family::Qwen2);
    let map = random_weights(&cfg, 5, &Device::Cpu).unwrap();
    let tensors: Vec<(String, Tensor)> =
        map.tensors.iter().map(|(n, t)| (n.clone(), t.clone())).collect();
    let single = tempfile::tempdir().unwrap();
    save_safetensors(&single.path().join("model.safetensors"), &tensors, &HashMap::new()).unwrap();
    let sharded = tempfile::tempdir().unwrap();
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in
        [("model-00001-of-00002.safetensors", a), ("model-00002-of-00002.safetensors", b)]
    {
        save_safetensors(&sharded.path().join(file), part, &HashMap::new()).unwrap();
        for (n, _) in part {
            weight_map.insert(n.clone(), file.into());
        }
    }
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let load = |dir: &std::path::Path| {
        Transformer::from_weights(
            cfg.clone(),
            WeightMap::load_hf_dir(dir, &Device::Cpu).unwrap(),
            &Device::Cpu,
        )
        .unwrap()
    };
    assert_eq!(logits(&load(single.path())), logits(&load(sharded.path())));
}

#[test]
fn bf16_weights_load_as_f32_and_save_back_as_bf16() {
    let cfg = tiny_config(Family::Llama);
    let map = random_weights(&cfg, 2, &Device::Cpu).unwrap();
    let tensors: Vec<(String, Tensor)> =
        map.tensors.iter().map(|(n, t)| (n.clone(), t.clone())).collect();
    let dtypes: HashMap<String, DType> =
        tensors.iter().map(|(n, _)| (n.clone(), DType::BF16)).collect();
    let dir = tempfile::tempdir().unwrap();
    save_safetensors(&dir.path().join("model.safetensors"), &tensors, &dtypes).unwrap();
    let loaded = WeightMap::load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    assert!(loaded.dtypes.values().all(|d| *d == DType::BF16));
    assert!(loaded.tensors.values().all(|t| t.dtype() == DType::F32));
    let model = Transformer::from_weights(cfg, loaded, &Device::Cpu).unwrap();
    let out = tempfile::tempdir().unwrap();
    verity_worker::checkpoint::save_checkpoint(out.path(), &model, None, None, "tiny").unwrap();
    let again = WeightMap::load_hf_dir(out.path(), &Device::Cpu).unwrap();
    assert!(again.dtypes.values().all(|d| *d == DType::BF16));
    for (name, t) in &again.tensors {
        let before: Vec<f32> = WeightMap::load_hf_dir(dir.path(), &Device::Cpu).unwrap().tensors
            [name]
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            before,
            "{name} changed in a bf16 round trip"
        );
    }
}

#[test]
fn config_json_round_trips_and_bad_configs_are_errors() {
    for family in Family::ALL {
        let cfg = tiny_config(family);
        let back = ModelConfig::from_hf_json(&cfg.to_hf_json().to_string()).unwrap();
        assert_eq!(back, cfg);
    }
    assert!(ModelConfig::from_hf_json(r#"{"model_type": "gpt2"}"#).is_err());
    let mut llama3 = tiny_config(Family::Llama);
    llama3.rope_scaling = Some(verity_worker::config::Llama3RopeScaling {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    });
    assert_eq!(ModelConfig::from_hf_json(&llama3.to_hf_json().to_string()).unwrap(), llama3);
    let mut v = tiny_config(Family::Llama).to_hf_json();
    v["num_key_value_heads"] = 3.into();
    assert!(ModelConfig::from_hf_json(&v.to_string()).is_err());
    v["num_key_value_heads"] = 2.into();
    v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    assert!(ModelConfig::from_hf_json(&v.to_string()).is_err());
    assert!(verity_worker::load_model(std::path::Path::new("/nonexistent/model"), &Device::Cpu)
        .is_err());
}

#[test]
fn config_options_verity_does_not_implement_are_refused_by_name() {
    let refused = |family: Family, field: &str, value: serde_json::Value| {
        let mut v = tiny_config(family).to_hf_json();
        v[field] = value;
        let err = ModelConfig::from_hf_json(&v.to_string()).unwrap_err().to_string();
        assert!(err.contains(&format!("`{field}`")), "{family:?} {field}: {err}");
    };
    refused(Family::Llama, "mlp_bias", true.into());
    refused(Family::Llama, "partial_rotary_factor", 0.75.into());
    refused(Family::Qwen2, "use_sliding_window", true.into());
    refused(
        Family::Qwen3,
        "layer_types",
        serde_json::json!(["sliding_attention", "full_attention"]),
    );
    refused(Family::SmolLM3, "no_rope_layers", serde_json::json!([1, 1, 0]));
    refused(Family::Mistral, "sliding_window", 0.into());
    // What transformers writes for options left off is accepted.
    let mut qwen = tiny_config(Family::Qwen2).to_hf_json();
    qwen["use_sliding_window"] = false.into();
    qwen["sliding_window"] = 4096.into();
    qwen["layer_types"] = serde_json::json!(["full_attention", "full_attention"]);
    let qwen = ModelConfig::from_hf_json(&qwen.to_string()).unwrap();
    assert_eq!(qwen.sliding_window, None, "Qwen2 ignores its window unless use_sliding_window");
    // SmolLM3 without an explicit list: transformers' default, every fourth layer without RoPE.
    let mut smol = tiny_config(Family::SmolLM3).to_hf_json();
    smol["num_hidden_layers"] = 8.into();
    smol.as_object_mut().unwrap().remove("no_rope_layers");
    assert_eq!(ModelConfig::from_hf_json(&smol.to_string()).unwrap().nope_layers, [3, 7]);
}

#[test]
fn gemma_3_1b_config_as_the_hub_serves_it_reads_its_layer_kinds() {
    // google/gemma-3-1b-it's config.json (transformers 4.50 layout: no layer_types, the local
    // RoPE base as rope_local_base_freq).
    let cfg = ModelConfig::from_hf_json(
        r#"{"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2,
        "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": null, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
        "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
        "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true,
        "vocab_size": 262144}"#,
    )
    .unwrap();
    assert_eq!(cfg.family, Family::Gemma3);
    assert_eq!(cfg.full_attention_layers, [5, 11, 17, 23]);
    assert_eq!((cfg.layer_window(0), cfg.layer_window(5)), (Some(512), None));
    assert_eq!((cfg.rope_theta, cfg.local_rope_theta), (1e6, Some(1e4)));
    assert_eq!(cfg.eos_token_ids, [1, 106]);
    assert_eq!(cfg.attention_scale(), 1.0 / 16.0);
    let back = ModelConfig::from_hf_json(&cfg.to_hf_json().to_string()).unwrap();
    assert_eq!(back, cfg);
    let mut capped = cfg.to_hf_json();
    capped["final_logit_softcapping"] = 30.0.into();
    let err = ModelConfig::from_hf_json(&capped.to_string()).unwrap_err().to_string();
    assert!(err.contains("`final_logit_softcapping`"), "{err}");
    let mut silu = cfg.to_hf_json();
    silu["hidden_activation"] = "silu".into();
    let err = ModelConfig::from_hf_json(&silu.to_string()).unwrap_err().to_string();
    assert!(err.contains("`hidden_activation`"), "{err}");
    let mut multimodal = cfg.to_hf_json();
    multimodal["model_type"] = "gemma3".into();
    let multimodal = ModelConfig::from_hf_json(&multimodal.to_string()).unwrap_err();
    assert!(multimodal.to_string().contains("gemma3_text"), "{multimodal}");
}

#[test]
fn phi_4_mini_config_reads_its_partial_rotary_and_longrope() {
    // The shape of microsoft/Phi-4-mini-instruct's config.json (its 48 factors replaced by
    // made-up ones of the same count).
    let factors = |base: f64| (0..48).map(|i| base + i as f64 / 10.0).collect::<Vec<_>>();
    let text = serde_json::json!({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
        "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
        "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": false,
        "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "phi3",
        "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "original_max_position_embeddings": 4096, "pad_token_id": 199999,
        "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": factors(1.0), "short_factor": factors(0.5),
                         "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 200064
    });
    let cfg = ModelConfig::from_hf_json(&text.to_string()).unwrap();
    assert_eq!(cfg.family, Family::Phi3);
    assert_eq!((cfg.head_dim, cfg.rotary_dim), (128, 96));
    let long = cfg.long_rope.as_ref().unwrap();
    assert_eq!(long.original_max_position_embeddings, 4096);
    let expected = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    assert!(
        (long.effective_attention_factor(cfg.max_position_embeddings) - expected).abs() < 1e-12
    );
    assert_eq!(cfg.sliding_window, Some(262144));
    assert_eq!(ModelConfig::from_hf_json(&cfg.to_hf_json().to_string()).unwrap(), cfg);
    let mut short = text.clone();
    short["rope_scaling"]["short_factor"] = serde_json::json!([1.0, 2.0]);
    let err = ModelConfig::from_hf_json(&short.to_string()).unwrap_err().to_string();
    assert!(err.contains("`rope_scaling`") && err.contains("48"), "{err}");
    let mut biased = text;
    biased["lm_head_bias"] = true.into();
    let err = ModelConfig::from_hf_json(&biased.to_string()).unwrap_err().to_string();
    assert!(err.contains("`lm_head_bias`"), "{err}");
}

#[test]
fn corrupt_safetensors_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    for bytes in [vec![1u8, 2, 3], vec![255u8; 16], {
        let header = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}}"#;
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header);
        v.extend_from_slice(&[0u8; 16]);
        v
    }] {
        std::fs::write(&path, bytes).unwrap();
        let err = WeightMap::load_hf_dir(dir.path(), &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }
}

#[test]
fn every_benchmark_shape_is_a_config_verity_reads() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/models");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let cfg = ModelConfig::from_hf_file(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(cfg.num_hidden_layers > 0, "{}", path.display());
            read += 1;
        }
    }
    assert!(read >= 6, "found {read} shapes in {}", dir.display());
}
