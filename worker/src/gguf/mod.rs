//! llama.cpp GGUF files: reading one (config, dequantised weights in HF layout, tokenizer and
//! chat template from the metadata) and writing one from a model ([`export`]).

pub mod export;
mod names;
mod vocab;

pub use export::{export_gguf, export_stack, modelfile, GgufExport, GgufQuant};
pub use names::{gguf_name, hf_name};

use crate::config::{Family, ModelConfig};
use crate::error::{Result, WorkerError};
use crate::tokenizer::ChatTokenizer;
use crate::weights::WeightMap;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};
use std::fs::File;
use std::path::{Path, PathBuf};
use tokenizers::pre_tokenizers::{byte_level::ByteLevel, digits::Digits, sequence::Sequence};

/// An opened GGUF file: its parsed header plus the path to read tensors from.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
}

fn gguf_err(path: &Path, e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Model(format!("GGUF {}: {e}", path.display()))
}

impl GgufFile {
    /// Opens and parses the header of a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let mut f = File::open(path).map_err(|e| WorkerError::io("opening", path, e))?;
        let content = Content::read(&mut f).map_err(|e| gguf_err(path, e))?;
        Ok(Self { path: path.to_path_buf(), content })
    }

    fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn meta_u32(&self, key: &str) -> Result<u32> {
        let v = self
            .meta(key)
            .ok_or_else(|| gguf_err(&self.path, format!("missing metadata `{key}`")))?;
        value_u32(v).ok_or_else(|| gguf_err(&self.path, format!("`{key}` is not an integer")))
    }

    fn meta_f32(&self, key: &str) -> Option<f32> {
        match self.meta(key)? {
            Value::F32(v) => Some(*v),
            Value::F64(v) => Some(*v as f32),
            _ => None,
        }
    }

    fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta(key).and_then(|v| v.to_string().ok()).map(String::as_str)
    }

    /// The GGUF `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.meta_str("general.architecture")
            .ok_or_else(|| gguf_err(&self.path, "missing general.architecture"))
    }

    /// The model configuration implied by the metadata.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch = self.architecture()?.to_string();
        let family = match arch.as_str() {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            other => {
                return Err(gguf_err(
                    &self.path,
                    format!("architecture `{other}` is not read from GGUF (llama, qwen2, qwen3)"),
                ))
            }
        };
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = self.meta_u32(&k("embedding_length"))? as usize;
        let heads = self.meta_u32(&k("attention.head_count"))? as usize;
        let kv = self.meta_u32(&k("attention.head_count_kv")).map(|v| v as usize).unwrap_or(heads);
        let vocab = match self.meta_u32(&k("vocab_size")) {
            Ok(v) => v as usize,
            Err(_) => self
                .meta("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(Vec::len)
                .unwrap_or(0),
        };
        let head_dim = self
            .meta_u32(&k("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(hidden / heads.max(1));
        let tied = !self.content.tensor_infos.contains_key("output.weight");
        Ok(ModelConfig {
            family,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: self.meta_u32(&k("feed_forward_length"))? as usize,
            num_hidden_layers: self.meta_u32(&k("block_count"))? as usize,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            rms_norm_eps: self.meta_f32(&k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6)
                as f64,
            rope_theta: self.meta_f32(&k("rope.freq_base")).unwrap_or(10_000.0) as f64,
            // llama.cpp stores Llama 3 scaling as a precomputed `rope_freqs` tensor; not supported.
            rope_scaling: None,
            long_rope: None,
            rotary_dim: head_dim,
            max_position_embeddings: self
                .meta_u32(&k("context_length"))
                .map(|v| v as usize)
                .unwrap_or(4096),
            tie_word_embeddings: tied,
            attention_bias: self.content.tensor_infos.contains_key("blk.0.attn_q.bias"),
            nope_layers: Vec::new(),
            sliding_window: None,
            full_attention_layers: Vec::new(),
            local_rope_theta: None,
            query_pre_attn_scalar: None,
            bos_token_id: self.meta_u32("tokenizer.ggml.bos_token_id").ok(),
            pad_token_id: self.meta_u32("tokenizer.ggml.padding_token_id").ok(),
            eos_token_ids: self.meta_u32("tokenizer.ggml.eos_token_id").ok().into_iter().collect(),
            torch_dtype: "float32".into(),
        })
    }

    /// All tensors dequantised to f32, renamed to HF names, q/k un-permuted for llama.
    pub fn weights(&self, device: &Device) -> Result<WeightMap> {
        let cfg = self.config()?;
        let unpermute = cfg.family == Family::Llama;
        let mut f =
            File::open(&self.path).map_err(|e| WorkerError::io("opening", &self.path, e))?;
        let mut names: Vec<&String> = self.content.tensor_infos.keys().collect();
        names.sort();
        let mut map = WeightMap::default();
        for name in names {
            let Some(hf) = hf_name(name) else {
                tracing::debug!(tensor = %name, "skipping GGUF tensor without HF counterpart");
                continue;
            };
            let q =
                self.content.tensor(&mut f, name, device).map_err(|e| gguf_err(&self.path, e))?;
            let mut t = q.dequantize(device)?.to_dtype(DType::F32)?;
            if unpermute && name.contains(".attn_q.") {
                t = unpermute_rows(&t, cfg.num_attention_heads)?;
            } else if unpermute && name.contains(".attn_k.") {
                t = unpermute_rows(&t, cfg.num_key_value_heads)?;
            }
            map.insert(hf, t)?;
        }
        Ok(map)
    }

    /// The tokenizer (byte-level BPE) and chat template stored in the metadata.
    pub fn tokenizer(&self) -> Result<ChatTokenizer> {
        use candle_core::quantized::tokenizer::TokenizerFromGguf;
        let mut tok =
            tokenizers::Tokenizer::from_gguf(&self.content).map_err(|e| gguf_err(&self.path, e))?;
        let pre = self.meta_str("tokenizer.ggml.pre").unwrap_or("gpt2");
        if !matches!(pre, "qwen2" | "llama3" | "smaug-bpe" | "lfm2") {
            // llama.cpp's `smollm`/`gpt2` pre-tokenizers: GPT-2 byte level without a prefix
            // space, `smollm` also splits digits one by one (as HF's tokenizer.json does).
            let byte_level = ByteLevel::new(false, true, true);
            let pre_tok: tokenizers::PreTokenizerWrapper = if pre == "smollm" {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            } else {
                byte_level.into()
            };
            tok.with_pre_tokenizer(Some(pre_tok));
        }
        let tokens = self.meta("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok());
        let token_at = |key: &str| -> Option<String> {
            let id = self.meta_u32(key).ok()? as usize;
            tokens?.get(id)?.to_string().ok().cloned()
        };
        let eos_ids = self.meta_u32("tokenizer.ggml.eos_token_id").ok().into_iter().collect();
        Ok(ChatTokenizer::new(
            tok,
            self.meta_str("tokenizer.chat_template").map(str::to_owned),
            crate::tokenizer::SpecialTokens {
                bos: token_at("tokenizer.ggml.bos_token_id"),
                eos: token_at("tokenizer.ggml.eos_token_id"),
                pad: token_at("tokenizer.ggml.padding_token_id"),
                unk: token_at("tokenizer.ggml.unknown_token_id"),
            },
            eos_ids,
        ))
    }
}

fn value_u32(v: &Value) -> Option<u32> {
    Some(match v {
        Value::U8(x) => *x as u32,
        Value::I8(x) => *x as u32,
        Value::U16(x) => *x as u32,
        Value::I16(x) => *x as u32,
        Value::U32(x) => *x,
        Value::I32(x) => *x as u32,
        Value::U64(x) => *x as u32,
        Value::I64(x) => *x as u32,
        _ => return None,
    })
}

/// Undoes llama.cpp's q/k row permutation: rows `(heads, 2, d/2)` back to `(heads, d/2, 2)`
/// (a weight's rows, or a bias's entries).
pub fn unpermute_rows(w: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = w.dims().to_vec();
    let rows = dims.first().copied().unwrap_or(0);
    let cols = w.elem_count() / rows.max(1);
    let half = rows / heads.max(1) / 2;
    if heads == 0 || half * heads * 2 != rows {
        return Err(WorkerError::Model(format!(
            "cannot un-permute {rows} rows into {heads} heads"
        )));
    }
    Ok(w.reshape((heads, half, 2, cols))?.transpose(1, 2)?.contiguous()?.reshape(dims)?)
}
