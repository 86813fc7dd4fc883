//! Fixtures for tests: a tiny random model made in memory, and locating the SmolLM2 test model.

use crate::config::{Family, ModelConfig};
use crate::error::Result;
use crate::model::Transformer;
use crate::weights::WeightMap;
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// A tiny config of the given family (2 layers, vocab 64, GQA 4:2 heads).
pub fn tiny_config(family: Family) -> ModelConfig {
    ModelConfig {
        family,
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        max_position_embeddings: 256,
        tie_word_embeddings: family != Family::Qwen3,
        attention_bias: family == Family::Qwen2,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        torch_dtype: "float32".into(),
    }
}

/// Random weights (HF names) for `config`, deterministic in `seed`.
pub fn random_weights(config: &ModelConfig, seed: u64, device: &Device) -> Result<WeightMap> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut map = WeightMap::default();
    let mut add = |name: String, shape: &[usize], scale: f32, base: f32| -> Result<()> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> =
            (0..n).map(|_| base + scale * (rng.random::<f32>() * 2.0 - 1.0)).collect();
        map.insert(name, Tensor::from_vec(data, shape, device)?)
    };
    let (d, v, f) = (config.hidden_size, config.vocab_size, config.intermediate_size);
    let (qd, kd) = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    );
    add("model.embed_tokens.weight".into(), &[v, d], 0.5, 0.0)?;
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        add(format!("{p}.input_layernorm.weight"), &[d], 0.2, 1.0)?;
        add(format!("{p}.post_attention_layernorm.weight"), &[d], 0.2, 1.0)?;
        for (name, o, inp) in [
            ("self_attn.q_proj", qd, d),
            ("self_attn.k_proj", kd, d),
            ("self_attn.v_proj", kd, d),
            ("self_attn.o_proj", d, qd),
            ("mlp.gate_proj", f, d),
            ("mlp.up_proj", f, d),
            ("mlp.down_proj", d, f),
        ] {
            add(format!("{p}.{name}.weight"), &[o, inp], 1.0 / (inp as f32).sqrt(), 0.0)?;
        }
        if config.attention_bias {
            for (name, o) in [("q_proj", qd), ("k_proj", kd), ("v_proj", kd)] {
                add(format!("{p}.self_attn.{name}.bias"), &[o], 0.1, 0.0)?;
            }
        }
        if config.family == Family::Qwen3 {
            add(format!("{p}.self_attn.q_norm.weight"), &[config.head_dim], 0.2, 1.0)?;
            add(format!("{p}.self_attn.k_norm.weight"), &[config.head_dim], 0.2, 1.0)?;
        }
    }
    add("model.norm.weight".into(), &[d], 0.2, 1.0)?;
    if !config.tie_word_embeddings {
        add("lm_head.weight".into(), &[v, d], 0.5, 0.0)?;
    }
    Ok(map)
}

/// A tiny random transformer of the given family on the CPU.
pub fn tiny_model(family: Family, seed: u64) -> Result<Transformer> {
    let config = tiny_config(family);
    let weights = random_weights(&config, seed, &Device::Cpu)?;
    Transformer::from_weights(config, weights, &Device::Cpu)
}

/// A tiny Llama whose next token depends only on the current one: `script` maps a token to its
/// successor, and every other token is followed by EOS (id 2). Its attention and MLP outputs are
/// zero, so the residual stream is the token's one-hot embedding (hidden size = vocabulary, 64),
/// and the LM head gives the successor a logit margin of 80: greedy and sampled decoding follow
/// the script exactly. For engine tests that need a given sequence of tokens (a tool call).
pub fn scripted_model(script: &[(u32, u32)]) -> Result<Transformer> {
    let mut config = tiny_config(Family::Llama);
    config.hidden_size = config.vocab_size;
    config.tie_word_embeddings = false;
    let (v, device) = (config.vocab_size, Device::Cpu);
    let mut weights = random_weights(&config, 0, &device)?;
    let mut successor: Vec<u32> = vec![2; v];
    for &(from, to) in script {
        successor[from as usize] = to;
    }
    let matrix = |f: &dyn Fn(usize, usize) -> f32| -> Result<Tensor> {
        let data: Vec<f32> = (0..v * v).map(|k| f(k / v, k % v)).collect();
        Ok(Tensor::from_vec(data, (v, v), &device)?)
    };
    weights.insert("model.embed_tokens.weight".into(), matrix(&|r, c| f32::from(r == c))?)?;
    weights.insert(
        "lm_head.weight".into(),
        matrix(&|next, current| if successor[current] as usize == next { 10.0 } else { 0.0 })?,
    )?;
    let names: Vec<String> = weights.tensors.keys().cloned().collect();
    for name in names {
        let shape = weights.tensors[&name].dims().to_vec();
        if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
            weights.insert(name, Tensor::zeros(shape, candle_core::DType::F32, &device)?)?;
        } else if name.ends_with("norm.weight") {
            weights.insert(name, Tensor::ones(shape, candle_core::DType::F32, &device)?)?;
        }
    }
    Transformer::from_weights(config, weights, &device)
}

/// Logits of one token sequence, flattened (for exact comparisons between models).
pub fn flat_logits(model: &Transformer, seq: &[u32]) -> Result<Vec<f32>> {
    Ok(model.sequence_logits(&[seq], 0)?.flatten_all()?.to_vec1()?)
}

/// Token ids of `user` as a single-turn chat prompt with the generation prompt appended.
pub fn chat_prompt_ids(lm: &crate::LoadedModel, user: &str) -> Result<Vec<u32>> {
    let text = lm.tokenizer.apply_chat_template(&[crate::ChatMessage::new("user", user)], true)?;
    lm.tokenizer.encode(&text)
}

/// The SmolLM2 HF folder from `VERITY_TEST_MODEL_DIR`, or the default cache location made by
/// `scripts/fetch-test-model.sh`; `None` (after a loud `SKIPPED:` line) when absent.
pub fn smollm2_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("VERITY_TEST_MODEL_DIR").map(PathBuf::from).or_else(|| {
        let cache = std::env::var_os("VERITY_MODEL_CACHE").map(PathBuf::from).or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/verity/models"))
        })?;
        Some(cache.join("smollm2-135m-instruct"))
    });
    match dir {
        Some(d) if d.join("model.safetensors").is_file() => Some(d),
        _ => {
            eprintln!("SKIPPED: {test}: SmolLM2 HF folder not found (run scripts/fetch-test-model.sh or set VERITY_TEST_MODEL_DIR)");
            None
        }
    }
}

/// The all-MiniLM-L6-v2 folder from `VERITY_EMBEDDING_MODEL`, or the default cache location
/// made by `scripts/fetch-embedding-model.sh`; `None` (after a loud `SKIPPED:` line) when absent.
pub fn minilm_dir(test: &str) -> Option<PathBuf> {
    let dir =
        std::env::var_os(crate::embedding::EMBEDDING_MODEL_ENV).map(PathBuf::from).or_else(|| {
            let cache =
                std::env::var_os("VERITY_MODEL_CACHE").map(PathBuf::from).or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/verity/models"))
                })?;
            Some(cache.join("all-minilm-l6-v2"))
        });
    match dir {
        Some(d) if d.join("model.safetensors").is_file() => Some(d),
        _ => {
            eprintln!("SKIPPED: {test}: all-MiniLM-L6-v2 folder not found (run scripts/fetch-embedding-model.sh or set VERITY_EMBEDDING_MODEL)");
            None
        }
    }
}

/// The SmolLM2 GGUF from `VERITY_TEST_GGUF` or the default cache; `None` (loudly) when absent.
pub fn smollm2_gguf(test: &str) -> Option<PathBuf> {
    let file = std::env::var_os("VERITY_TEST_GGUF").map(PathBuf::from).or_else(|| {
        let cache = std::env::var_os("VERITY_MODEL_CACHE").map(PathBuf::from).or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/verity/models"))
        })?;
        Some(cache.join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    });
    match file {
        Some(f) if f.is_file() => Some(f),
        _ => {
            eprintln!("SKIPPED: {test}: SmolLM2 GGUF not found (run scripts/fetch-test-model.sh or set VERITY_TEST_GGUF)");
            None
        }
    }
}

/// Largest absolute elementwise difference of two tensors of the same shape (test helper).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_dtype(candle_core::DType::F32))
        .and_then(|d| d.to_scalar::<f32>())
        .unwrap_or(f32::INFINITY)
}

/// A trainable 2-D tensor of smooth, distinct values (`sin(0.37·i + seed) / 2`), for kernel tests.
pub fn wave_var(shape: (usize, usize), seed: f32) -> Var {
    let values: Vec<f32> =
        (0..shape.0 * shape.1).map(|i| (i as f32 * 0.37 + seed).sin() * 0.5).collect();
    Var::from_tensor(&Tensor::from_vec(values, shape, &Device::Cpu).expect("shape matches"))
        .expect("a new variable")
}

/// Asserts that two computations of one function agree in value (within `tol`) and in the
/// gradients of a position-weighted sum with respect to each of `vars` (within `10·tol`).
pub fn assert_same_function(fused: &Tensor, plain: &Tensor, vars: &[&Var], tol: f32) {
    assert!(max_abs_diff(fused, plain) < tol, "values differ by {}", max_abs_diff(fused, plain));
    let n = fused.elem_count();
    let weights = Tensor::arange(0f32, n as f32, &Device::Cpu)
        .and_then(|w| w.reshape(fused.shape()))
        .expect("weights");
    let loss = |t: &Tensor| {
        (t * &weights).and_then(|p| p.sum_all()).and_then(|s| s.backward()).expect("backward")
    };
    let (g1, g2) = (loss(fused), loss(plain));
    for v in vars {
        let (a, b) =
            (g1.get(v.as_tensor()).expect("gradient"), g2.get(v.as_tensor()).expect("gradient"));
        assert!(max_abs_diff(a, b) < 10.0 * tol, "gradients differ by {}", max_abs_diff(a, b));
    }
}
