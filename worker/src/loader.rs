//! Opening a model from an HF folder or a GGUF file.

use crate::config::ModelConfig;
use crate::error::{Result, WorkerError};
use crate::gguf::GgufFile;
use crate::model::Transformer;
use crate::tokenizer::ChatTokenizer;
use crate::weights::WeightMap;
use candle_core::Device;
use std::path::Path;

/// A model with its tokenizer.
pub struct LoadedModel {
    /// The transformer.
    pub model: Transformer,
    /// Its tokenizer and chat template.
    pub tokenizer: ChatTokenizer,
}

/// Loads an HF folder (`config.json`, safetensors, `tokenizer.json`) or a `.gguf` file.
pub fn load_model(path: &Path, device: &Device) -> Result<LoadedModel> {
    if path.is_dir() {
        let config = ModelConfig::from_hf_file(&path.join("config.json"))?;
        let tokenizer = ChatTokenizer::from_hf_dir(path, &config.eos_token_ids)?;
        let weights = WeightMap::load_hf_dir(path, device)?;
        let model = Transformer::from_weights(config, weights, device)?;
        Ok(LoadedModel { model, tokenizer })
    } else if path.is_file() {
        let gguf = GgufFile::open(path)?;
        let config = gguf.config()?;
        let tokenizer = gguf.tokenizer()?;
        let weights = gguf.weights(device)?;
        let model = Transformer::from_weights(config, weights, device)?;
        Ok(LoadedModel { model, tokenizer })
    } else {
        Err(WorkerError::InvalidArgument(format!(
            "{} is neither a model folder nor a GGUF file",
            path.display()
        )))
    }
}

/// A checkpoint folder over the model it was trained from: a PEFT adapter
/// (`adapter_config.json`) applied unmerged over a model sharing `base`'s weights (the base's
/// tokenizer applies: `None`), or full weights with their own tokenizer.
pub fn load_checkpoint(
    base: &Transformer,
    dir: &Path,
    device: &Device,
) -> Result<(Transformer, Option<ChatTokenizer>)> {
    if dir.join("adapter_config.json").is_file() {
        let mut model = base.share_base();
        model.load_lora(dir)?;
        Ok((model, None))
    } else {
        let loaded = load_model(dir, device)?;
        Ok((loaded.model, Some(loaded.tokenizer)))
    }
}
