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
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
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
