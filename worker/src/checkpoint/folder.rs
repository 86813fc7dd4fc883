//! A checkpoint folder: full weights in HF layout (original names and dtypes) or the PEFT adapter,
//! plus the optimizer state, and restoring them bit-exactly.

use crate::error::{write_json, Result, WorkerError};
use crate::model::Transformer;
use crate::optim::AdamW;
use crate::safetensors_file::{pytorch_metadata, write_safetensors};
use crate::tokenizer::ChatTokenizer;
use crate::weights::WeightMap;
use std::path::Path;

pub use verity_core::storage::TRAINER_STATE;

/// Writes a checkpoint folder: `model.safetensors` + `config.json` (full fine-tuning) or
/// `adapter_config.json` + `adapter_model.safetensors` (LoRA), the tokenizer files when given,
/// and `trainer_state.safetensors` when an optimizer is given.
///
/// Full weights are written in the dtype they were loaded with: an f32 model reloads
/// bit-exactly, a bf16 one is rounded back to bf16. Weights and moments are written one tensor
/// at a time, so saving holds at most one tensor's copy beside the model.
pub fn save_checkpoint(
    dir: &Path,
    model: &Transformer,
    tokenizer: Option<&ChatTokenizer>,
    optimizer: Option<&AdamW>,
    base_model: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| WorkerError::io("creating", dir, e))?;
    if model.lora_params().is_empty() {
        write_safetensors(
            &dir.join("model.safetensors"),
            &model.weights_to_write()?,
            pytorch_metadata(),
        )?;
        write_json(&dir.join("config.json"), &model.config.to_hf_json())?;
    } else {
        model.save_lora(dir, base_model)?;
    }
    if let Some(t) = tokenizer {
        t.save_hf(dir, model.config.max_position_embeddings)?;
    }
    if let Some(opt) = optimizer {
        opt.save(&dir.join(TRAINER_STATE))?;
    }
    Ok(())
}

/// Loads the trained weights of a checkpoint folder into `model`: the adapter when the folder
/// has `adapter_config.json`, else every base weight from its safetensors.
pub fn restore_weights(model: &mut Transformer, dir: &Path) -> Result<()> {
    if dir.join("adapter_config.json").is_file() {
        return model.load_lora(dir);
    }
    let mut map = WeightMap::load_hf_dir(dir, model.device())?;
    for (name, _) in model.named_weights() {
        model.import_weight(&name, &map.take(&name)?)?;
    }
    Ok(())
}

/// Restores the optimizer state of a checkpoint folder for the model's trainable parameters.
pub fn restore_optimizer(model: &Transformer, dir: &Path) -> Result<AdamW> {
    AdamW::load(&dir.join(TRAINER_STATE), &model.trainable_params())
}
