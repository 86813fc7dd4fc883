//! GGUF → HF folder conversion (`verity models convert`).

use crate::error::{write_json, Result, WorkerError};
use crate::gguf::GgufFile;
use crate::weights::save_safetensors;
use candle_core::Device;
use std::collections::HashMap;
use std::path::Path;

/// Converts a llama.cpp GGUF file into an HF folder that transformers loads unchanged:
/// `config.json`, `generation_config.json`, `tokenizer.json`, `tokenizer_config.json` (with the
/// chat template) and `model.safetensors` (dequantised to f32, q/k un-permuted).
pub fn convert_gguf(gguf: &Path, out: &Path) -> Result<()> {
    let file = GgufFile::open(gguf)?;
    let config = file.config()?;
    let tokenizer = file.tokenizer()?;
    let weights = file.weights(&Device::Cpu)?;
    std::fs::create_dir_all(out).map_err(|e| WorkerError::io("creating", out, e))?;
    write_json(&out.join("config.json"), &config.to_hf_json())?;
    let pad = tokenizer.special.pad.as_deref().and_then(|t| tokenizer.tokenizer.token_to_id(t));
    write_json(
        &out.join("generation_config.json"),
        &serde_json::json!({
            "bos_token_id": config.bos_token_id,
            "eos_token_id": tokenizer.eos_token_ids,
            "pad_token_id": pad,
        }),
    )?;
    tokenizer.save_hf(out, config.max_position_embeddings)?;
    let tensors: Vec<_> = weights
        .tensors
        .into_iter()
        .filter(|(name, _)| !(config.tie_word_embeddings && name == "lm_head.weight"))
        .collect();
    save_safetensors(&out.join("model.safetensors"), &tensors, &HashMap::new())?;
    tracing::info!(gguf = %gguf.display(), out = %out.display(), tensors = tensors.len(), "converted GGUF to HF folder");
    Ok(())
}
