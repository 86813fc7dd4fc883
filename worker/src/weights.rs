//! Named weight maps: loading HF safetensors folders (single or sharded) and saving them back
//! with their original names and dtypes.

use crate::error::{read_json, Result, WorkerError};
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// Tensors by HF name, converted to f32 for compute, with the dtype each had on disk.
#[derive(Debug, Default)]
pub struct WeightMap {
    /// Tensors (f32) by name.
    pub tensors: BTreeMap<String, Tensor>,
    /// On-disk dtype of each tensor, restored when saving.
    pub dtypes: BTreeMap<String, DType>,
}

impl WeightMap {
    /// Inserts a tensor (converted to f32) remembering its original dtype.
    pub fn insert(&mut self, name: String, tensor: Tensor) -> Result<()> {
        self.dtypes.insert(name.clone(), tensor.dtype());
        self.tensors.insert(name, tensor.to_dtype(DType::F32)?);
        Ok(())
    }

    /// Removes and returns a tensor, with a clear error if it is missing.
    pub fn take(&mut self, name: &str) -> Result<Tensor> {
        self.tensors
            .remove(name)
            .ok_or_else(|| WorkerError::Model(format!("missing weight `{name}`")))
    }

    /// Loads `model.safetensors` or the shards listed in `model.safetensors.index.json`.
    pub fn load_hf_dir(dir: &Path, device: &Device) -> Result<Self> {
        let mut map = WeightMap::default();
        for file in safetensors_files(dir)? {
            let loaded = candle_core::safetensors::load(&file, device)
                .map_err(|e| WorkerError::Model(format!("reading {}: {e}", file.display())))?;
            for (name, t) in loaded {
                map.insert(name, t)?;
            }
        }
        Ok(map)
    }
}

/// The safetensors files of an HF folder (single file or shards from the index).
pub fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(WorkerError::Model(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )));
    }
    let v: serde_json::Value = read_json(&index)?;
    let files: BTreeSet<String> = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| WorkerError::Model(format!("{}: no weight_map", index.display())))?
        .values()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Writes tensors to one safetensors file (with `format: pt` metadata, as transformers expects),
/// each converted to the dtype given for it (f32 when absent).
pub fn save_safetensors(path: &Path, tensors: &[(String, Tensor)], dtypes: &HashMap<String, DType>) -> Result<()> {
    let mut converted = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let dtype = dtypes.get(name).copied().unwrap_or(DType::F32);
        let t = t.to_dtype(dtype)?.to_device(&Device::Cpu)?.contiguous()?;
        converted.push((name.clone(), t));
    }
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(converted.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata), path)
        .map_err(|e| WorkerError::Model(format!("writing {}: {e}", path.display())))
}
