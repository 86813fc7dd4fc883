//! Opening a model from an HF folder or a GGUF file, or a stack of checkpoints over one.

use crate::config::ModelConfig;
use crate::error::{Result, WorkerError};
use crate::gguf::GgufFile;
use crate::model::Transformer;
use crate::tokenizer::ChatTokenizer;
use crate::weights::WeightMap;
use candle_core::Device;
use std::path::{Path, PathBuf};

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

/// Whether a checkpoint folder holds a PEFT adapter (else full weights).
pub fn is_adapter(dir: &Path) -> bool {
    dir.join("adapter_config.json").is_file()
}

/// Where loading a stack ([`verity_core::lineage::ModelStack`]) starts: the topmost layer
/// holding full weights (everything below it is replaced), else the base; `None` for the base.
pub fn stack_start(layers: &[PathBuf]) -> Option<usize> {
    layers.iter().rposition(|dir| !is_adapter(dir))
}

/// Loads a model stack: `base` (a model folder or GGUF file, unused when a layer holds full
/// weights) with the checkpoint folders `layers` over it, bottom first. A full-weights folder
/// replaces the weights below it; each adapter above the last one is merged into the weights
/// ([`Transformer::merge_lora`]: `W + scale · B A`), so the result computes what the stack does
/// and trains on as a plain model ("merge, not stack").
pub fn load_stack(base: Option<&Path>, layers: &[PathBuf], device: &Device) -> Result<LoadedModel> {
    let start = stack_start(layers);
    let (mut loaded, adapters) = match start {
        Some(i) => (load_model(&layers[i], device)?, &layers[i + 1..]),
        None => {
            let base = base.ok_or_else(|| {
                WorkerError::InvalidArgument("a stack of adapters needs its base model".into())
            })?;
            (load_model(base, device)?, layers)
        }
    };
    for dir in adapters {
        loaded.model.load_lora(dir)?;
        loaded.model.merge_lora()?;
    }
    Ok(loaded)
}

/// A checkpoint folder over the model it was trained from: a PEFT adapter
/// (`adapter_config.json`) applied unmerged over a model sharing `base`'s weights (the base's
/// tokenizer applies: `None`), or full weights with their own tokenizer.
pub fn load_checkpoint(
    base: &Transformer,
    dir: &Path,
    device: &Device,
) -> Result<(Transformer, Option<ChatTokenizer>)> {
    if is_adapter(dir) {
        let mut model = base.share_base();
        model.load_lora(dir)?;
        Ok((model, None))
    } else {
        let loaded = load_model(dir, device)?;
        Ok((loaded.model, Some(loaded.tokenizer)))
    }
}
