//! Writing a model as a llama.cpp GGUF file (what llama.cpp, Ollama and LM Studio run): the
//! metadata `convert_hf_to_gguf.py` writes for the family, the tokenizer and chat template, and
//! the weights in f16, q8_0 or llama-quantize's q4_k_m mix (candle's ports of ggml's reference
//! quantisers), plus an Ollama `Modelfile` to go beside it.

use super::names::{gguf_name, layer_of};
use super::vocab::tokenizer_metadata;
use crate::config::{Family, ModelConfig};
use crate::error::{Result, WorkerError};
use crate::loader::LoadedModel;
use crate::tokenizer::ChatTokenizer;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// ggml's super-block width: k-quant rows must be a multiple of it.
const QK_K: usize = 256;
/// The block width of q8_0 and q5_0.
const QK8_0: usize = 32;
/// ggml's quantisation format version (`general.quantization_version`).
const QUANTIZATION_VERSION: u32 = 2;

/// The precision of an export, named as llama.cpp's tools name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GgufQuant {
    /// Every matrix in f16 (norms and biases stay f32, as everywhere).
    #[serde(rename = "f16")]
    F16,
    /// Every matrix in q8_0 (8.5 bits per weight).
    #[serde(rename = "q8_0")]
    Q8_0,
    /// llama-quantize's `Q4_K_M`: q4_K, with q6_K for the output matrix and for `attn_v` and
    /// `ffn_down` in a third of the layers (about 4.9 bits per weight).
    #[serde(rename = "q4_k_m")]
    Q4KM,
}

impl GgufQuant {
    /// Every precision, in order of size.
    pub const ALL: [GgufQuant; 3] = [GgufQuant::F16, GgufQuant::Q8_0, GgufQuant::Q4KM];

    /// The name users type (`f16`, `q8_0`, `q4_k_m`).
    pub fn name(self) -> &'static str {
        match self {
            GgufQuant::F16 => "f16",
            GgufQuant::Q8_0 => "q8_0",
            GgufQuant::Q4KM => "q4_k_m",
        }
    }

    /// llama.cpp's `llama_ftype` of a file in this precision (`general.file_type`).
    fn file_type(self) -> u32 {
        match self {
            GgufQuant::F16 => 1,
            GgufQuant::Q8_0 => 7,
            GgufQuant::Q4KM => 15,
        }
    }
}

impl std::str::FromStr for GgufQuant {
    type Err = WorkerError;

    fn from_str(s: &str) -> Result<Self> {
        GgufQuant::ALL.into_iter().find(|q| q.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            WorkerError::InvalidArgument(format!(
                "unknown GGUF precision {s:?} (one of: {})",
                GgufQuant::ALL.map(GgufQuant::name).join(", ")
            ))
        })
    }
}

impl std::fmt::Display for GgufQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct GgufExport {
    /// Tensors in the file.
    pub tensors: usize,
    /// Size of the file.
    pub bytes: u64,
    /// How many tensors each ggml type holds (`q4_K: 60, q6_K: 31, f32: 61`).
    pub types: BTreeMap<String, usize>,
}

/// llama.cpp's architecture name of a model (`general.architecture`); the families and options
/// the export does not write yet are refused.
fn architecture(config: &ModelConfig) -> Result<&'static str> {
    match config.family {
        Family::Llama => Ok("llama"),
        // llama.cpp runs Mistral as `llama`; a sliding window has no key there to say so.
        Family::Mistral if config.sliding_window.is_none() => Ok("llama"),
        Family::Qwen2 => Ok("qwen2"),
        Family::Qwen3 => Ok("qwen3"),
        Family::Mistral => Err(WorkerError::InvalidArgument(
            "GGUF export of a Mistral model with a sliding window is not supported".into(),
        )),
        Family::Olmo2 | Family::SmolLM3 | Family::Gemma3 | Family::Phi3 => {
            Err(WorkerError::InvalidArgument(format!(
                "GGUF export of the {} family is not supported yet (llama, mistral, qwen2, qwen3)",
                config.family.model_type()
            )))
        }
    }
}

/// Writes `loaded` (adapters already merged) as a GGUF file at `out` named `name`, in `quant`.
/// The file appears whole or not at all (written beside it, then renamed).
pub fn export_gguf(
    loaded: &LoadedModel,
    name: &str,
    quant: GgufQuant,
    out: &Path,
) -> Result<GgufExport> {
    let config = &loaded.model.config;
    let mut metadata = model_metadata(config, name, quant)?;
    metadata.extend(tokenizer_metadata(&loaded.tokenizer, config.vocab_size)?);
    let tensors = gguf_tensors(loaded.model.export_weights()?, config, quant)?;
    let mut types = BTreeMap::new();
    for (_, t) in &tensors {
        *types.entry(format!("{:?}", t.dtype())).or_insert(0) += 1;
    }
    let partial = out.with_extension("gguf.partial");
    let write = || -> Result<()> {
        let file = std::fs::File::create(&partial)
            .map_err(|e| WorkerError::io("creating", &partial, e))?;
        let mut w = std::io::BufWriter::new(file);
        let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
        gguf_file::write(&mut w, &meta, &refs)?;
        w.flush().map_err(|e| WorkerError::io("writing", &partial, e))?;
        std::fs::rename(&partial, out).map_err(|e| WorkerError::io("renaming", &partial, e))
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    let bytes = std::fs::metadata(out).map_err(|e| WorkerError::io("reading", out, e))?.len();
    tracing::info!(out = %out.display(), %quant, tensors = tensors.len(), bytes, "exported GGUF");
    Ok(GgufExport { tensors: tensors.len(), bytes, types })
}

/// Loads a fetched model stack on the CPU (adapters merged into their base) and writes it as
/// the GGUF file `out` (see [`export_gguf`]); returns what was written and the Ollama
/// [`modelfile`] for it.
pub fn export_stack(
    stack: &crate::checkpoint::stack::FetchedStack,
    name: &str,
    quant: GgufQuant,
    out: &Path,
) -> Result<(GgufExport, String)> {
    let loaded = stack.load(&Device::Cpu)?;
    let written = export_gguf(&loaded, name, quant, out)?;
    let file = out.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    Ok((written, modelfile(&file, &loaded.tokenizer)))
}

/// The `general.*` and `{arch}.*` metadata of `config`.
fn model_metadata(
    config: &ModelConfig,
    name: &str,
    quant: GgufQuant,
) -> Result<Vec<(String, Value)>> {
    let arch = architecture(config)?;
    let u32_of = |n: usize| Value::U32(n as u32);
    let mut meta = vec![
        ("general.architecture".to_string(), Value::String(arch.into())),
        ("general.name".to_string(), Value::String(name.into())),
        ("general.file_type".to_string(), Value::U32(quant.file_type())),
        ("general.quantization_version".to_string(), Value::U32(QUANTIZATION_VERSION)),
    ];
    for (key, value) in [
        ("vocab_size", u32_of(config.vocab_size)),
        ("context_length", u32_of(config.max_position_embeddings)),
        ("embedding_length", u32_of(config.hidden_size)),
        ("block_count", u32_of(config.num_hidden_layers)),
        ("feed_forward_length", u32_of(config.intermediate_size)),
        ("rope.dimension_count", u32_of(config.head_dim)),
        ("rope.freq_base", Value::F32(config.rope_theta as f32)),
        ("attention.head_count", u32_of(config.num_attention_heads)),
        ("attention.head_count_kv", u32_of(config.num_key_value_heads)),
        ("attention.key_length", u32_of(config.head_dim)),
        ("attention.value_length", u32_of(config.head_dim)),
        ("attention.layer_norm_rms_epsilon", Value::F32(config.rms_norm_eps as f32)),
    ] {
        meta.push((format!("{arch}.{key}"), value));
    }
    Ok(meta)
}

/// The weights under llama.cpp's names and types: Llama's q/k rows permuted into llama.cpp's
/// rotary layout, Llama 3 frequency scaling as the `rope_freqs` tensor.
fn gguf_tensors(
    weights: Vec<(String, Tensor)>,
    config: &ModelConfig,
    quant: GgufQuant,
) -> Result<Vec<(String, QTensor)>> {
    let has_output = weights.iter().any(|(n, _)| n == "lm_head.weight");
    let mut out = Vec::with_capacity(weights.len() + 1);
    for (hf, tensor) in weights {
        let name = gguf_name(&hf).ok_or_else(|| {
            WorkerError::Model(format!("weight `{hf}` has no llama.cpp counterpart"))
        })?;
        let mut tensor = tensor.to_dtype(DType::F32)?;
        if architecture(config)? == "llama" {
            if name.starts_with("blk.") && name.contains(".attn_q.") {
                tensor = permute_rows(&tensor, config.num_attention_heads)?;
            } else if name.starts_with("blk.") && name.contains(".attn_k.") {
                tensor = permute_rows(&tensor, config.num_key_value_heads)?;
            }
        }
        let dtype = tensor_type(quant, &name, tensor.dims(), config.num_hidden_layers, has_output);
        out.push((name, QTensor::quantize(&tensor, dtype)?));
    }
    if let Some(factors) = rope_factors(config) {
        let t = Tensor::from_vec(factors, config.head_dim / 2, &Device::Cpu)?;
        out.push(("rope_freqs.weight".to_string(), QTensor::quantize(&t, GgmlDType::F32)?));
    }
    Ok(out)
}

/// llama-quantize's `use_more_bits`: the first and last eighth of the layers and every third
/// one between them get more bits.
fn use_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer.wrapping_sub(layers / 8)) % 3 == 2
}

/// The ggml type of tensor `name` in an export to `quant`: vectors stay f32; the q4_k_m mix
/// follows llama-quantize (`llama_tensor_get_type`), with its fallbacks (q5_0, q8_0) for rows
/// that are no multiple of 256, and f16 for rows no block fits.
fn tensor_type(
    quant: GgufQuant,
    name: &str,
    dims: &[usize],
    layers: usize,
    has_output: bool,
) -> GgmlDType {
    let cols = dims.last().copied().unwrap_or(0);
    if dims.len() < 2 {
        return GgmlDType::F32;
    }
    let wanted = match quant {
        GgufQuant::F16 => return GgmlDType::F16,
        GgufQuant::Q8_0 => GgmlDType::Q8_0,
        GgufQuant::Q4KM => {
            let is_output = name == "output.weight" || (!has_output && name == "token_embd.weight");
            let more_bits = (name.ends_with(".attn_v.weight")
                || name.ends_with(".ffn_down.weight"))
                && layer_of(name).is_some_and(|l| use_more_bits(l, layers));
            if is_output || more_bits {
                GgmlDType::Q6K
            } else {
                GgmlDType::Q4K
            }
        }
    };
    let fallback = match wanted {
        GgmlDType::Q4K if cols % QK_K != 0 => GgmlDType::Q5_0,
        GgmlDType::Q6K if cols % QK_K != 0 => GgmlDType::Q8_0,
        other => other,
    };
    if cols % QK8_0 != 0 {
        GgmlDType::F16
    } else {
        fallback
    }
}

/// llama.cpp's rotary layout of q/k rows (`convert_hf_to_gguf.py`'s `permute`): each head's
/// rows `(2, d/2)` reordered to `(d/2, 2)`; biases (vectors) alike. The inverse of
/// [`super::unpermute_rows`].
fn permute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    let cols = t.elem_count() / rows.max(1);
    let half = rows / heads.max(1) / 2;
    if heads == 0 || half * heads * 2 != rows {
        return Err(WorkerError::Model(format!("cannot permute {rows} rows into {heads} heads")));
    }
    Ok(t.reshape((heads, 2, half, cols))?.transpose(1, 2)?.contiguous()?.reshape(dims)?)
}

/// Llama 3's per-frequency RoPE divisors, as `convert_hf_to_gguf.py` writes `rope_freqs`.
fn rope_factors(config: &ModelConfig) -> Option<Vec<f32>> {
    let s = config.rope_scaling?;
    let dim = config.head_dim as f64;
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    let factors = (0..config.head_dim / 2)
        .map(|i| {
            let freq = 1.0 / config.rope_theta.powf((2 * i) as f64 / dim);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let factor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                s.factor
            } else {
                let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            };
            factor as f32
        })
        .collect();
    Some(factors)
}

/// An Ollama `Modelfile` for the GGUF file `gguf_file` (a name in the same folder): `FROM`, the
/// chat template in Ollama's Go template syntax when the model chats in ChatML (otherwise
/// Ollama reads the template stored in the GGUF), and a `stop` for each end-of-turn token.
pub fn modelfile(gguf_file: &str, tokenizer: &ChatTokenizer) -> String {
    let mut text = format!("FROM ./{gguf_file}\n");
    let chatml =
        tokenizer.chat_template_source.as_deref().is_some_and(|t| t.contains("<|im_start|>"));
    if chatml {
        text.push_str(
            "TEMPLATE \"\"\"{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n\"\"\"\n",
        );
    }
    let mut stops: Vec<String> = tokenizer
        .eos_token_ids
        .iter()
        .filter_map(|id| tokenizer.tokenizer.id_to_token(*id))
        .collect();
    if chatml {
        stops.push("<|im_end|>".into());
    }
    stops.sort();
    stops.dedup();
    for stop in stops {
        text.push_str(&format!("PARAMETER stop {}\n", serde_json::Value::String(stop)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_llama_cpp_would_misread_are_refused() {
        let arch = |family: Family| architecture(&crate::testing::tiny_config(family));
        assert_eq!(arch(Family::Llama).unwrap(), "llama");
        assert_eq!(arch(Family::Qwen3).unwrap(), "qwen3");
        let mut no_window = crate::testing::tiny_config(Family::Mistral);
        no_window.sliding_window = None;
        assert_eq!(architecture(&no_window).unwrap(), "llama");
        for family in
            [Family::Mistral, Family::Olmo2, Family::SmolLM3, Family::Gemma3, Family::Phi3]
        {
            let err = arch(family).unwrap_err();
            assert!(matches!(err, WorkerError::InvalidArgument(_)), "{family:?}: {err}");
        }
    }

    #[test]
    fn q4_k_m_follows_llama_quantize() {
        let layers = 30;
        let more: Vec<usize> = (0..layers).filter(|l| use_more_bits(*l, layers)).collect();
        // llama.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, with n/8 = 3 and 7n/8 = 26.
        assert_eq!(more, vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
        let t =
            |name: &str, dims: &[usize]| tensor_type(GgufQuant::Q4KM, name, dims, layers, false);
        assert_eq!(t("blk.0.attn_v.weight", &[256, 512]), GgmlDType::Q6K);
        assert_eq!(t("blk.3.attn_v.weight", &[256, 512]), GgmlDType::Q4K);
        assert_eq!(t("blk.5.ffn_down.weight", &[256, 1536]), GgmlDType::Q6K);
        assert_eq!(t("blk.5.attn_q.weight", &[512, 512]), GgmlDType::Q4K);
        // Tied embeddings are the output matrix: q6_K, or q8_0 where rows don't fit 256.
        assert_eq!(t("token_embd.weight", &[100, 512]), GgmlDType::Q6K);
        assert_eq!(t("token_embd.weight", &[100, 576]), GgmlDType::Q8_0);
        // SmolLM2-135M's 576-wide rows: q4_K falls back to q5_0.
        assert_eq!(t("blk.3.attn_q.weight", &[576, 576]), GgmlDType::Q5_0);
        assert_eq!(t("blk.3.attn_norm.weight", &[576]), GgmlDType::F32);
        assert_eq!(t("blk.3.attn_q.weight", &[8, 20]), GgmlDType::F16);
        assert_eq!(
            tensor_type(GgufQuant::Q8_0, "output.weight", &[8, 64], 2, true),
            GgmlDType::Q8_0
        );
        assert_eq!(tensor_type(GgufQuant::F16, "output.weight", &[8, 64], 2, true), GgmlDType::F16);
    }

    #[test]
    fn precisions_parse_by_their_llama_cpp_names() {
        for q in GgufQuant::ALL {
            assert_eq!(q.name().parse::<GgufQuant>().unwrap(), q);
        }
        assert_eq!("Q4_K_M".parse::<GgufQuant>().unwrap(), GgufQuant::Q4KM);
        let e = "q3_k".parse::<GgufQuant>().unwrap_err().to_string();
        assert!(e.contains("f16, q8_0, q4_k_m"), "{e}");
    }

    #[test]
    fn permuting_rows_is_undone_by_the_reader() {
        let t = Tensor::arange(0f32, 48., &Device::Cpu).unwrap().reshape((8, 6)).unwrap();
        let back = super::super::unpermute_rows(&permute_rows(&t, 2).unwrap(), 2).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), t.to_vec2::<f32>().unwrap());
        // Row r of head h, half j, index i (HF: h, j, i) lands at (h, i, j).
        let p = permute_rows(&t, 2).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(p[1][0], 12.0); // HF row 2 (h0, j1, i0) → row 1
    }

    #[test]
    fn llama3_rope_factors_match_the_converter() {
        let mut config = crate::testing::tiny_config(Family::Llama);
        config.head_dim = 128;
        config.rope_theta = 500_000.0;
        config.rope_scaling = Some(crate::config::Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        });
        let f = rope_factors(&config).unwrap();
        assert_eq!(f.len(), 64);
        // High frequencies are kept, the lowest divided by the factor, a smooth ramp between.
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    }
}
