//! Model configuration read from (and written to) HF `config.json`.

use crate::error::{read_json, Result, WorkerError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Supported decoder families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Llama / SmolLM2 / Llama 3.x.
    Llama,
    /// Qwen2 / Qwen2.5 (q/k/v bias).
    Qwen2,
    /// Qwen3 (per-head q/k RMS norm, no bias).
    Qwen3,
}

impl Family {
    /// HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// HF `architectures[0]` class name.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// Parses an HF `model_type` (or GGUF architecture) string.
    pub fn from_model_type(s: &str) -> Result<Self> {
        match s {
            "llama" | "mistral" => Ok(Family::Llama),
            "qwen2" => Ok(Family::Qwen2),
            "qwen3" => Ok(Family::Qwen3),
            other => Err(WorkerError::Model(format!(
                "unsupported model_type `{other}` (llama, qwen2, qwen3)"
            ))),
        }
    }
}

/// Llama 3.x RoPE frequency scaling (`rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Llama3RopeScaling {
    /// Overall context extension factor.
    pub factor: f64,
    /// Wavelengths longer than `original / low_freq_factor` are divided by `factor`.
    pub low_freq_factor: f64,
    /// Wavelengths shorter than `original / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// Context length the model was pre-trained with.
    pub original_max_position_embeddings: f64,
}

/// The architecture hyper-parameters the transformer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Decoder family.
    pub family: Family,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// RMS norm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// Llama 3.x RoPE scaling, if any.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Longest supported context.
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections carry a bias.
    pub attention_bias: bool,
    /// BOS token id, if any.
    pub bos_token_id: Option<u32>,
    /// EOS token ids (HF allows one or several).
    pub eos_token_ids: Vec<u32>,
    /// HF `torch_dtype`/`dtype` string of the stored weights.
    pub torch_dtype: String,
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    hidden_act: Option<String>,
}

fn ids_of(v: &Option<serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|x| vec![x as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => {
            a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect()
        }
        _ => vec![],
    }
}

impl ModelConfig {
    /// Reads `config.json` from an HF folder.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let raw: RawConfig = read_json(path)?;
        Self::from_raw(raw)
    }

    /// Parses the text of an HF `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text)
            .map_err(|e| WorkerError::Model(format!("config.json: {e}")))?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self> {
        let family = Family::from_model_type(&raw.model_type)?;
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(WorkerError::Model(format!(
                    "unsupported hidden_act `{act}` (silu only)"
                )));
            }
        }
        let scaling =
            raw.rope_scaling.as_ref().filter(|s| !s.is_null()).or(raw.rope_parameters.as_ref());
        let rope_scaling = match scaling
            .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
            .and_then(|t| t.as_str())
        {
            None | Some("default") => None,
            Some("llama3") => {
                let s = scaling.cloned().unwrap_or_default();
                Some(
                    serde_json::from_value::<Llama3RopeScaling>(s)
                        .map_err(|e| WorkerError::Model(format!("llama3 rope scaling: {e}")))?,
                )
            }
            Some(kind) => {
                return Err(WorkerError::Model(format!("unsupported rope scaling `{kind}`")))
            }
        };
        let rope_theta = raw
            .rope_theta
            .or_else(|| {
                raw.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(|t| t.as_f64())
            })
            .unwrap_or(10_000.0);
        if raw.num_attention_heads == 0
            || !raw.hidden_size.is_multiple_of(raw.num_attention_heads) && raw.head_dim.is_none()
        {
            return Err(WorkerError::Model(
                "hidden_size must divide into num_attention_heads".into(),
            ));
        }
        let kv = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if kv == 0 || !raw.num_attention_heads.is_multiple_of(kv) {
            return Err(WorkerError::Model(
                "num_attention_heads must be a multiple of num_key_value_heads".into(),
            ));
        }
        Ok(Self {
            family,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: kv,
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(family == Family::Qwen2),
            bos_token_id: ids_of(&raw.bos_token_id).first().copied(),
            eos_token_ids: ids_of(&raw.eos_token_id),
            torch_dtype: raw.torch_dtype.or(raw.dtype).unwrap_or_else(|| "float32".into()),
        })
    }

    /// Renders an HF `config.json` document that transformers loads unchanged.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let eos: serde_json::Value = match self.eos_token_ids.as_slice() {
            [one] => (*one).into(),
            many => many.to_vec().into(),
        };
        let mut v = serde_json::json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.map(|s| serde_json::json!({
                "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            })),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": true,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": self.torch_dtype,
        });
        if self.family == Family::Llama {
            v["mlp_bias"] = false.into();
            v["pretraining_tp"] = 1.into();
        }
        v
    }

    /// Number of query heads per key/value head (the GQA ratio; not GRPO's group size).
    pub fn query_heads_per_kv_head(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}
