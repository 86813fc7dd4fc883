//! Named weight maps: loading HF safetensors folders (single or sharded) and saving them back
//! with their original names and dtypes.

use crate::config::{ModelConfig, QkNorm};
use crate::error::{read_json, Result, WorkerError};
use crate::safetensors_file::{pytorch_metadata, write_safetensors, PendingTensor};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
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
            read_safetensors(&file, device, |name, t| map.insert(name, t))?;
        }
        Ok(map)
    }
}

/// One tensor's entry in a safetensors header: name, dtype, shape and byte range in the data.
struct HeaderEntry {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    start: u64,
    end: u64,
}

/// A safetensors file's header: its tensors in file order, its `__metadata__`, and where the
/// data begins.
struct Header {
    entries: Vec<HeaderEntry>,
    metadata: HashMap<String, String>,
    data_start: u64,
}

/// Reads and checks the header of the safetensors file `f` (at `path`).
fn read_header(f: &mut std::fs::File, path: &Path) -> Result<Header> {
    use std::io::Read;
    let bad = |msg: String| WorkerError::Model(format!("{}: {msg}", path.display()));
    let file_len = f.metadata().map_err(|e| WorkerError::io("reading", path, e))?.len();
    let mut len8 = [0u8; 8];
    f.read_exact(&mut len8).map_err(|e| WorkerError::io("reading", path, e))?;
    let header_len = u64::from_le_bytes(len8);
    if header_len > file_len.saturating_sub(8) || header_len > 100 << 20 {
        return Err(bad(format!("header length {header_len} is invalid")));
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(|e| WorkerError::io("reading", path, e))?;
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let data_start = 8 + header_len;
    let mut entries = Vec::new();
    let mut metadata = HashMap::new();
    for (name, info) in header {
        if name == "__metadata__" {
            metadata = serde_json::from_value(info)
                .map_err(|e| bad(format!("`__metadata__` is not a map of strings: {e}")))?;
            continue;
        }
        let dtype = info
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad(format!("`{name}` has no dtype")))?;
        let dtype = match dtype {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            other => return Err(bad(format!("`{name}` has unsupported dtype {other}"))),
        };
        let shape: Vec<usize> = info
            .get("shape")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as usize)).collect())
            .ok_or_else(|| bad(format!("`{name}` has no shape")))?;
        let offsets: Vec<u64> = info
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        let [start, end] = offsets[..] else {
            return Err(bad(format!("`{name}` has bad data_offsets")));
        };
        if start > end || data_start + end > file_len {
            return Err(bad(format!("`{name}` lies outside the file")));
        }
        if end - start != (shape.iter().product::<usize>() * dtype.size_in_bytes()) as u64 {
            return Err(bad(format!("`{name}` size does not match its shape")));
        }
        entries.push(HeaderEntry { name, dtype, shape, start, end });
    }
    entries.sort_by_key(|e| e.start);
    Ok(Header { entries, metadata, data_start })
}

/// Streams the tensors of a safetensors file one at a time (so loading never holds the file
/// and the converted weights in memory together), calling `each(name, tensor)`; returns the
/// file's `__metadata__` (empty when it has none).
pub fn read_safetensors(
    path: &Path,
    device: &Device,
    mut each: impl FnMut(String, Tensor) -> Result<()>,
) -> Result<HashMap<String, String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| WorkerError::io("opening", path, e))?;
    let header = read_header(&mut f, path)?;
    for HeaderEntry { name, dtype, shape, start, end } in header.entries {
        let mut bytes = vec![0u8; (end - start) as usize];
        f.seek(SeekFrom::Start(header.data_start + start))
            .map_err(|e| WorkerError::io("reading", path, e))?;
        f.read_exact(&mut bytes).map_err(|e| WorkerError::io("reading", path, e))?;
        let t = Tensor::from_raw_buffer(&bytes, dtype, &shape, device)?;
        each(name, t)?;
    }
    Ok(header.metadata)
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
pub fn save_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    dtypes: &HashMap<String, DType>,
) -> Result<()> {
    let pending: Vec<(String, PendingTensor)> = tensors
        .iter()
        .map(|(name, t)| {
            let dtype = dtypes.get(name).copied().unwrap_or(DType::F32);
            (name.clone(), PendingTensor::converted(t.clone(), dtype))
        })
        .collect();
    write_safetensors(path, &pending, pytorch_metadata())
}

/// Random weights (HF names) for `config`, deterministic in `seed`: the shapes of a model whose
/// weights are not at hand (benchmarks on a machine without them; tests).
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
    // Norm weights near their identity: 1, or 0 where the family stores `w` for `1 + w`.
    let one = if config.family.norm_weight_is_offset() { 0.0 } else { 1.0 };
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for name in config.family.layer_norms().into_array().into_iter().flatten() {
            add(format!("{p}.{name}.weight"), &[d], 0.2, one)?;
        }
        let projections: &[(&str, usize, usize)] = if config.family.fuses_projections() {
            &[
                ("self_attn.qkv_proj", qd + 2 * kd, d),
                ("self_attn.o_proj", d, qd),
                ("mlp.gate_up_proj", 2 * f, d),
                ("mlp.down_proj", d, f),
            ]
        } else {
            &[
                ("self_attn.q_proj", qd, d),
                ("self_attn.k_proj", kd, d),
                ("self_attn.v_proj", kd, d),
                ("self_attn.o_proj", d, qd),
                ("mlp.gate_proj", f, d),
                ("mlp.up_proj", f, d),
                ("mlp.down_proj", d, f),
            ]
        };
        for &(name, o, inp) in projections {
            add(format!("{p}.{name}.weight"), &[o, inp], 1.0 / (inp as f32).sqrt(), 0.0)?;
        }
        if config.attention_bias {
            let biases: &[(&str, usize)] = if config.family.fuses_projections() {
                &[("qkv_proj", qd + 2 * kd)]
            } else {
                &[("q_proj", qd), ("k_proj", kd), ("v_proj", kd)]
            };
            for &(name, o) in biases {
                add(format!("{p}.self_attn.{name}.bias"), &[o], 0.1, 0.0)?;
            }
        }
        let (qn, kn) = match config.family.qk_norm() {
            QkNorm::None => (0, 0),
            QkNorm::PerHead => (config.head_dim, config.head_dim),
            QkNorm::Projection => (qd, kd),
        };
        if qn > 0 {
            add(format!("{p}.self_attn.q_norm.weight"), &[qn], 0.2, one)?;
            add(format!("{p}.self_attn.k_norm.weight"), &[kn], 0.2, one)?;
        }
    }
    add("model.norm.weight".into(), &[d], 0.2, one)?;
    if !config.tie_word_embeddings {
        add("lm_head.weight".into(), &[v, d], 0.5, 0.0)?;
    }
    Ok(map)
}
