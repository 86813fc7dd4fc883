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
    /// Mistral: Llama's layers, with an optional sliding attention window.
    Mistral,
    /// Qwen2 / Qwen2.5 (q/k/v bias).
    Qwen2,
    /// Qwen3 (per-head q/k RMS norm, no bias).
    Qwen3,
    /// OLMo 2: norms after the attention and the MLP (not before), q/k RMS norms over the
    /// whole projection.
    Olmo2,
    /// SmolLM3: Llama's layers, every fourth without RoPE (NoPE).
    #[serde(rename = "smollm3")]
    SmolLM3,
    /// Gemma 3 (text): four norms per layer with `1 + w` weights, scaled embeddings, a GELU MLP,
    /// sliding-window local layers between global ones, each kind with its own RoPE base.
    #[serde(rename = "gemma3_text")]
    Gemma3,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: fused `qkv_proj` and `gate_up_proj`, partial rotary
    /// embedding and LongRoPE scaling, a sliding window in every layer.
    Phi3,
}

/// One value per place a decoder layer can hold an RMS norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerNorms<T> {
    /// Before the attention (pre-norm).
    pub attn_in: T,
    /// On the attention's output, before the residual add.
    pub attn_out: T,
    /// Before the MLP (pre-norm).
    pub mlp_in: T,
    /// On the MLP's output, before the residual add.
    pub mlp_out: T,
}

impl<T> LayerNorms<T> {
    /// The four values in order: attention in, attention out, MLP in, MLP out.
    pub fn into_array(self) -> [T; 4] {
        [self.attn_in, self.attn_out, self.mlp_in, self.mlp_out]
    }
}

/// Where a family normalises queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    /// No q/k norm (Llama, Qwen2).
    None,
    /// An RMS norm over each head's `head_dim` values (Qwen3).
    PerHead,
    /// An RMS norm over the whole projection, all heads at once (OLMo 2).
    Projection,
}

impl Family {
    /// HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Olmo2 => "olmo2",
            Family::SmolLM3 => "smollm3",
            Family::Gemma3 => "gemma3_text",
            Family::Phi3 => "phi3",
        }
    }

    /// Every family Verity trains, in the order the docs list them.
    pub const ALL: [Family; 8] = [
        Family::Llama,
        Family::Mistral,
        Family::Qwen2,
        Family::Qwen3,
        Family::Olmo2,
        Family::SmolLM3,
        Family::Gemma3,
        Family::Phi3,
    ];

    /// Whether the family stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj`.
    pub fn fuses_projections(self) -> bool {
        self == Family::Phi3
    }

    /// How the family normalises queries and keys.
    pub fn qk_norm(self) -> QkNorm {
        match self {
            Family::Qwen3 | Family::Gemma3 => QkNorm::PerHead,
            Family::Olmo2 => QkNorm::Projection,
            _ => QkNorm::None,
        }
    }

    /// The HF names (under `model.layers.N.`) of each decoder layer's RMS norms by where they
    /// sit, [`LayerNorms`] order; `None` where the family has no norm there.
    pub fn layer_norms(self) -> LayerNorms<Option<&'static str>> {
        match self {
            // Norms on the sublayers' outputs, none on their inputs.
            Family::Olmo2 => LayerNorms {
                attn_in: None,
                attn_out: Some("post_attention_layernorm"),
                mlp_in: None,
                mlp_out: Some("post_feedforward_layernorm"),
            },
            Family::Gemma3 => LayerNorms {
                attn_in: Some("input_layernorm"),
                attn_out: Some("post_attention_layernorm"),
                mlp_in: Some("pre_feedforward_layernorm"),
                mlp_out: Some("post_feedforward_layernorm"),
            },
            _ => LayerNorms {
                attn_in: Some("input_layernorm"),
                attn_out: None,
                mlp_in: Some("post_attention_layernorm"),
                mlp_out: None,
            },
        }
    }

    /// Whether RMS norms scale by `1 + w` (Gemma: weights stored as offsets from one) rather
    /// than by `w`.
    pub fn norm_weight_is_offset(self) -> bool {
        self == Family::Gemma3
    }

    /// Whether the embedding rows are multiplied by `sqrt(hidden_size)` (Gemma).
    pub fn scales_embedding(self) -> bool {
        self == Family::Gemma3
    }

    /// Whether the MLP gates with GELU (tanh approximation, Gemma's `gelu_pytorch_tanh`) rather
    /// than SiLU (SwiGLU).
    pub fn gelu_mlp(self) -> bool {
        self == Family::Gemma3
    }

    /// HF `architectures[0]` class name.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Olmo2 => "Olmo2ForCausalLM",
            Family::SmolLM3 => "SmolLM3ForCausalLM",
            Family::Gemma3 => "Gemma3ForCausalLM",
            Family::Phi3 => "Phi3ForCausalLM",
        }
    }

    /// Parses an HF `model_type` (or GGUF architecture) string.
    pub fn from_model_type(s: &str) -> Result<Self> {
        match s {
            "llama" => Ok(Family::Llama),
            "mistral" => Ok(Family::Mistral),
            "qwen2" => Ok(Family::Qwen2),
            "qwen3" => Ok(Family::Qwen3),
            "olmo2" => Ok(Family::Olmo2),
            "smollm3" => Ok(Family::SmolLM3),
            "gemma3_text" => Ok(Family::Gemma3),
            "phi3" => Ok(Family::Phi3),
            "gemma3" => Err(WorkerError::Model(
                "model_type `gemma3` is Gemma 3's image-text model; Verity trains the text-only \
                 `gemma3_text` checkpoints (Gemma 3 270M and 1B)"
                    .into(),
            )),
            other => Err(WorkerError::Model(format!(
                "unsupported model_type `{other}` ({})",
                Family::ALL.map(Family::model_type).join(", ")
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

/// LongRoPE frequency scaling (`rope_type: "longrope"`: Phi-3.5, Phi-4-mini): per-frequency
/// divisors for short and long contexts and a scale on cos/sin.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// Divisors of the inverse frequencies while every position is below the original context.
    pub short_factor: Vec<f64>,
    /// Divisors once a position reaches past it.
    pub long_factor: Vec<f64>,
    /// Context length the model was pre-trained with.
    pub original_max_position_embeddings: usize,
    /// The config's own `factor`, if it gives one (else max / original context).
    pub factor: Option<f64>,
    /// The config's own `attention_factor`, if it gives one (else derived from the factor).
    pub attention_factor: Option<f64>,
}

impl LongRope {
    /// The scale of cos and sin for a model of context `max_position_embeddings`, as
    /// transformers derives it.
    pub fn effective_attention_factor(&self, max_position_embeddings: usize) -> f64 {
        let original = self.original_max_position_embeddings as f64;
        let factor = self.factor.unwrap_or(max_position_embeddings as f64 / original);
        match self.attention_factor {
            Some(a) => a,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / original.ln()).sqrt(),
        }
    }
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
    /// LongRoPE scaling, if any (Phi).
    pub long_rope: Option<LongRope>,
    /// Leading dimensions of each head that RoPE rotates (`head_dim` unless the config has a
    /// `partial_rotary_factor`, as Phi-4-mini's 0.75).
    pub rotary_dim: usize,
    /// Longest supported context.
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections carry a bias.
    pub attention_bias: bool,
    /// Layers that apply no rotary embedding (SmolLM3's NoPE layers); empty for most families.
    pub nope_layers: Vec<usize>,
    /// Sliding attention window (a query sees itself and the `w - 1` keys before it), if any:
    /// in every layer (Mistral) or every layer but `full_attention_layers` (Gemma 3).
    pub sliding_window: Option<usize>,
    /// Layers that attend to every key despite a sliding window (Gemma 3's global layers).
    pub full_attention_layers: Vec<usize>,
    /// RoPE base of the sliding-window layers where it differs from `rope_theta` (Gemma 3).
    pub local_rope_theta: Option<f64>,
    /// Attention scores are scaled by `1 / sqrt(this)`; `head_dim` when `None` (Gemma 3 sets it).
    pub query_pre_attn_scalar: Option<usize>,
    /// BOS token id, if any.
    pub bos_token_id: Option<u32>,
    /// Padding token id the config names, if any (written back as read).
    pub pad_token_id: Option<u32>,
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
    pad_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    hidden_act: Option<String>,
    mlp_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<String>>,
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
    partial_rotary_factor: Option<f64>,
    hidden_activation: Option<String>,
    rope_local_base_freq: Option<f64>,
    sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    sliding_window_pattern_private: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    use_bidirectional_attention: Option<bool>,
    original_max_position_embeddings: Option<usize>,
    lm_head_bias: Option<bool>,
}

/// `partial_rotary_factor`, at the top level or (transformers 5) inside `rope_parameters`.
fn partial_rotary_factor(raw: &RawConfig) -> Option<f64> {
    raw.partial_rotary_factor
        .or_else(|| raw.rope_parameters.as_ref()?.get("partial_rotary_factor")?.as_f64())
}

/// What a config says about individual layers (see [`layer_options`]).
struct LayerOptions {
    nope_layers: Vec<usize>,
    sliding_window: Option<usize>,
    full_attention_layers: Vec<usize>,
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

/// The per-layer options of a config — SmolLM3's NoPE layers and a sliding window — after
/// refusing, by field name, every option Verity does not implement.
fn layer_options(raw: &RawConfig, family: Family) -> Result<LayerOptions> {
    let refuse = |field: &str, why: &str| {
        Err(WorkerError::Model(format!(
            "config.json `{field}`: {why} is not supported for model_type `{}`",
            raw.model_type
        )))
    };
    if raw.mlp_bias == Some(true) {
        return refuse("mlp_bias", "an MLP bias");
    }
    if family != Family::Phi3 && partial_rotary_factor(raw).is_some_and(|f| f != 1.0) {
        return refuse("partial_rotary_factor", "a partial rotary embedding");
    }
    if raw.lm_head_bias == Some(true) {
        return refuse("lm_head_bias", "an LM-head bias");
    }
    if raw.use_sliding_window == Some(true) {
        return refuse("use_sliding_window", "a sliding window on some layers only");
    }
    for (field, value) in [
        ("final_logit_softcapping", raw.final_logit_softcapping),
        ("attn_logit_softcapping", raw.attn_logit_softcapping),
    ] {
        if value.is_some() {
            return refuse(field, "soft-capping");
        }
    }
    if raw.use_bidirectional_attention == Some(true) {
        return refuse("use_bidirectional_attention", "bidirectional attention");
    }
    let n = raw.num_hidden_layers;
    let mut full_attention_layers = Vec::new();
    let sliding_window = match family {
        Family::Mistral | Family::Phi3 => raw.sliding_window,
        Family::Gemma3 => {
            // transformers' default: every `sliding_window_pattern`-th layer is global.
            let every = raw
                .sliding_window_pattern
                .or(raw.sliding_window_pattern_private)
                .unwrap_or(6)
                .max(1);
            let default: Vec<String> = (0..n)
                .map(|i| if (i + 1) % every == 0 { "full_attention" } else { "sliding_attention" })
                .map(String::from)
                .collect();
            let types = raw.layer_types.as_ref().unwrap_or(&default);
            if types.len() != n {
                return refuse("layer_types", &format!("{} entries for {n} layers", types.len()));
            }
            for (i, kind) in types.iter().enumerate() {
                match kind.as_str() {
                    "full_attention" => full_attention_layers.push(i),
                    "sliding_attention" => {}
                    other => return refuse("layer_types", &format!("a layer of type `{other}`")),
                }
            }
            Some(raw.sliding_window.unwrap_or(4096))
        }
        _ => None,
    };
    if family != Family::Gemma3 {
        if let Some(kind) = raw.layer_types.iter().flatten().find(|t| *t != "full_attention") {
            return refuse("layer_types", &format!("a layer of type `{kind}`"));
        }
    }
    if sliding_window == Some(0) {
        return refuse("sliding_window", "a window of 0 tokens");
    }
    let nope_layers = match family {
        Family::SmolLM3 => {
            let rope: Vec<bool> = match &raw.no_rope_layers {
                Some(list) if list.len() != n => {
                    return refuse(
                        "no_rope_layers",
                        &format!("a list of {} entries for {n} layers", list.len()),
                    )
                }
                Some(list) => list.iter().map(|&r| r != 0).collect(),
                // transformers' default: every `no_rope_layer_interval`-th layer has no RoPE.
                None => {
                    let every = raw.no_rope_layer_interval.unwrap_or(4).max(1);
                    (0..n).map(|i| (i + 1) % every != 0).collect()
                }
            };
            rope.iter().enumerate().filter(|(_, &r)| !r).map(|(i, _)| i).collect()
        }
        _ => Vec::new(),
    };
    Ok(LayerOptions { nope_layers, sliding_window, full_attention_layers })
}

/// The RoPE settings of a config: (base, Llama 3 scaling) of the global layers and the base
/// of the sliding-window layers where it differs. transformers 5 writes them per layer type
/// (`rope_parameters: {full_attention: …, sliding_attention: …}`), earlier versions as
/// `rope_theta`, `rope_scaling` and Gemma's `rope_local_base_freq`.
struct RopeSettings {
    theta: f64,
    llama3: Option<Llama3RopeScaling>,
    long_rope: Option<LongRope>,
    local_theta: Option<f64>,
}

fn rope_settings(raw: &RawConfig) -> Result<RopeSettings> {
    let params = raw.rope_parameters.as_ref().filter(|p| !p.is_null());
    let per_type = params.and_then(|p| p.get("full_attention")).is_some();
    let (global, local) = match params {
        Some(p) if per_type => (p.get("full_attention"), p.get("sliding_attention")),
        _ => (params, None),
    };
    fn kind_of(v: Option<&serde_json::Value>) -> Option<&str> {
        v.and_then(|s| s.get("rope_type").or_else(|| s.get("type"))).and_then(|t| t.as_str())
    }
    let scaling = raw.rope_scaling.as_ref().filter(|s| !s.is_null()).or(global);
    let (mut rope_scaling, mut long_rope) = (None, None);
    match kind_of(scaling) {
        None | Some("default") => {}
        Some("llama3") => {
            let s = scaling.cloned().unwrap_or_default();
            rope_scaling = Some(
                serde_json::from_value::<Llama3RopeScaling>(s)
                    .map_err(|e| WorkerError::Model(format!("llama3 rope scaling: {e}")))?,
            );
        }
        Some("longrope") => {
            let s = scaling.cloned().unwrap_or_default();
            let field = |name: &str| -> Result<Vec<f64>> {
                serde_json::from_value(s.get(name).cloned().unwrap_or_default()).map_err(|e| {
                    WorkerError::Model(format!("config.json `rope_scaling.{name}`: {e}"))
                })
            };
            let number = |name: &str| s.get(name).and_then(|v| v.as_f64());
            long_rope = Some(LongRope {
                short_factor: field("short_factor")?,
                long_factor: field("long_factor")?,
                original_max_position_embeddings: number("original_max_position_embeddings")
                    .map(|v| v as usize)
                    .or(raw.original_max_position_embeddings)
                    .or(raw.max_position_embeddings)
                    .unwrap_or(4096),
                factor: number("factor"),
                attention_factor: number("attention_factor"),
            });
        }
        Some(kind) => return Err(WorkerError::Model(format!("unsupported rope scaling `{kind}`"))),
    };
    if let Some(kind) = kind_of(local).filter(|k| *k != "default") {
        return Err(WorkerError::Model(format!(
            "unsupported rope scaling `{kind}` of the sliding-window layers"
        )));
    }
    let theta = |v: Option<&serde_json::Value>| v.and_then(|p| p.get("rope_theta"))?.as_f64();
    let rope_theta = raw.rope_theta.or_else(|| theta(global)).unwrap_or(10_000.0);
    let local_theta = raw.rope_local_base_freq.or_else(|| theta(local));
    Ok(RopeSettings {
        theta: rope_theta,
        llama3: rope_scaling,
        long_rope,
        local_theta: local_theta.filter(|t| *t != rope_theta),
    })
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
        let expected = if family.gelu_mlp() { "gelu_pytorch_tanh" } else { "silu" };
        for (field, act) in
            [("hidden_act", &raw.hidden_act), ("hidden_activation", &raw.hidden_activation)]
        {
            if let Some(act) = act.as_deref().filter(|a| *a != expected) {
                return Err(WorkerError::Model(format!(
                    "config.json `{field}`: `{act}` is not supported for model_type `{}` ({expected} only)",
                    raw.model_type
                )));
            }
        }
        let rope = rope_settings(&raw)?;
        if raw.num_attention_heads == 0
            || !raw.hidden_size.is_multiple_of(raw.num_attention_heads) && raw.head_dim.is_none()
        {
            return Err(WorkerError::Model(
                "hidden_size must divide into num_attention_heads".into(),
            ));
        }
        let layers = layer_options(&raw, family)?;
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads);
        let rotary_dim = (head_dim as f64 * partial_rotary_factor(&raw).unwrap_or(1.0)) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(WorkerError::Model(format!(
                "config.json `partial_rotary_factor`: rotates {rotary_dim} of {head_dim} dimensions \
                 (must be even, at least 2)"
            )));
        }
        if let Some(l) = &rope.long_rope {
            if l.short_factor.len() != rotary_dim / 2 || l.long_factor.len() != rotary_dim / 2 {
                return Err(WorkerError::Model(format!(
                    "config.json `rope_scaling`: LongRoPE needs {} short and long factors, got {} and {}",
                    rotary_dim / 2,
                    l.short_factor.len(),
                    l.long_factor.len()
                )));
            }
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
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: rope.theta,
            rope_scaling: rope.llama3,
            long_rope: rope.long_rope,
            rotary_dim,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw.attention_bias.unwrap_or(family == Family::Qwen2),
            nope_layers: layers.nope_layers,
            sliding_window: layers.sliding_window,
            full_attention_layers: layers.full_attention_layers,
            local_rope_theta: rope.local_theta,
            query_pre_attn_scalar: match raw.query_pre_attn_scalar {
                Some(q) if q < 1.0 || q.fract() != 0.0 => {
                    return Err(WorkerError::Model(format!(
                        "config.json `query_pre_attn_scalar`: {q} is not a positive integer"
                    )))
                }
                q => q.map(|q| q as usize),
            },
            bos_token_id: ids_of(&raw.bos_token_id).first().copied(),
            pad_token_id: ids_of(&raw.pad_token_id).first().copied(),
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
                // transformers checks that this one is an integer.
                "original_max_position_embeddings": s.original_max_position_embeddings as u64,
            })),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": true,
            "bos_token_id": self.bos_token_id,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": eos,
            "torch_dtype": self.torch_dtype,
        });
        match self.family {
            Family::Llama => {
                v["mlp_bias"] = false.into();
                v["pretraining_tp"] = 1.into();
            }
            Family::Mistral => v["sliding_window"] = self.sliding_window.into(),
            Family::SmolLM3 => {
                let rope: Vec<u8> = (0..self.num_hidden_layers)
                    .map(|i| u8::from(!self.nope_layers.contains(&i)))
                    .collect();
                v["no_rope_layers"] = rope.into();
                v["use_sliding_window"] = false.into();
                v["mlp_bias"] = false.into();
            }
            Family::Gemma3 => {
                let obj = v.as_object_mut().expect("a JSON object");
                obj.remove("hidden_act");
                let types: Vec<&str> = (0..self.num_hidden_layers)
                    .map(|i| match self.layer_window(i) {
                        Some(_) => "sliding_attention",
                        None => "full_attention",
                    })
                    .collect();
                v["hidden_activation"] = "gelu_pytorch_tanh".into();
                v["layer_types"] = types.into();
                v["sliding_window"] = self.sliding_window.into();
                v["rope_local_base_freq"] = self.local_rope_theta.unwrap_or(self.rope_theta).into();
                v["query_pre_attn_scalar"] = self.query_pre_attn_scalar.into();
                v["final_logit_softcapping"] = serde_json::Value::Null;
                v["attn_logit_softcapping"] = serde_json::Value::Null;
            }
            Family::Phi3 => {
                v["sliding_window"] = self.sliding_window.into();
                v["partial_rotary_factor"] = (self.rotary_dim as f64 / self.head_dim as f64).into();
                if let Some(l) = &self.long_rope {
                    let mut scaling = serde_json::json!({
                        "type": "longrope",
                        "short_factor": l.short_factor,
                        "long_factor": l.long_factor,
                    });
                    if let Some(f) = l.factor {
                        scaling["factor"] = f.into();
                    }
                    if let Some(a) = l.attention_factor {
                        scaling["attention_factor"] = a.into();
                    }
                    v["rope_scaling"] = scaling;
                    v["original_max_position_embeddings"] =
                        l.original_max_position_embeddings.into();
                }
            }
            Family::Qwen2 | Family::Qwen3 | Family::Olmo2 => {}
        }
        v
    }

    /// The sliding window of decoder layer `layer`, if it has one.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|_| !self.full_attention_layers.contains(&layer))
    }

    /// The scale of attention scores, `1 / sqrt(query_pre_attn_scalar or head_dim)`.
    pub fn attention_scale(&self) -> f32 {
        (1.0 / (self.query_pre_attn_scalar.unwrap_or(self.head_dim) as f64).sqrt()) as f32
    }

    /// Whether decoder layer `layer` applies the rotary embedding.
    pub fn layer_uses_rope(&self, layer: usize) -> bool {
        !self.nope_layers.contains(&layer)
    }

    /// Number of query heads per key/value head (the GQA ratio; not GRPO's group size).
    pub fn query_heads_per_kv_head(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}
