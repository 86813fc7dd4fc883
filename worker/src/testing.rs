//! Fixtures for tests: a tiny random model made in memory, and locating the SmolLM2 test model.
//! Compiled into the crate's own tests and with feature `testing` (the other crates' tests).

use crate::config::Family;
use crate::error::Result;
use crate::model::Transformer;
use crate::weights::random_weights;
use candle_core::{Device, Tensor};
use std::path::PathBuf;

pub use crate::synthetic::{tiny_config, tiny_model};

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

/// The greedy completion (token ids, at most `max_new_tokens`) of the prompt `ids`.
pub fn greedy_ids(
    lm: &crate::LoadedModel,
    ids: Vec<u32>,
    max_new_tokens: usize,
) -> Result<Vec<u32>> {
    let params = crate::SamplingParams::greedy(max_new_tokens);
    let out = crate::sample(
        &lm.model,
        &[ids],
        &params,
        &lm.tokenizer.eos_token_ids,
        lm.tokenizer.pad_id(),
        None,
    )?;
    Ok(out.into_iter().next().map(|c| c.token_ids).unwrap_or_default())
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

pub use verity_kernels::testing::{assert_same_function, max_abs_diff, wave_var};
