//! A BERT encoder (the architecture of sentence-transformers' MiniLM, MPNet-free BERT family):
//! token, position and segment embeddings, then post-norm layers of bidirectional attention
//! and a feed-forward block, as Hugging Face's `BertModel` computes its last hidden states.
//!
//! Verity's own, instead of candle-transformers' (one model of ~100 there): the worker needs
//! this one encoder, and the crate was a tenth of a cold build (docs/quickstart.md).

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};
use serde::Deserialize;

/// The fields of a BERT `config.json` the encoder reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    /// Rows of the token embedding.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (`hidden_size` divides evenly).
    pub num_attention_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// The feed-forward activation.
    #[serde(default)]
    pub hidden_act: Activation,
    /// Rows of the position embedding (the longest input).
    pub max_position_embeddings: usize,
    /// Rows of the segment embedding.
    #[serde(default = "one")]
    pub type_vocab_size: usize,
    /// Layer norm epsilon.
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f64,
    /// Only `absolute` is supported.
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    /// The weights' prefix when they sit under one (`bert`, `roberta`, …).
    #[serde(default)]
    pub model_type: Option<String>,
}

fn one() -> usize {
    1
}

fn default_layer_norm_eps() -> f64 {
    1e-12
}

/// A feed-forward activation, by its `config.json` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// The exact (erf) GELU.
    #[default]
    Gelu,
    /// The tanh approximation of GELU.
    #[serde(alias = "gelu_new", alias = "gelu_pytorch_tanh", alias = "gelu_approximate")]
    GeluTanh,
    /// max(0, x).
    Relu,
}

impl Activation {
    fn apply(self, xs: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => xs.gelu_erf(),
            Activation::GeluTanh => xs.gelu(),
            Activation::Relu => xs.relu(),
        }
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

impl Layer {
    fn load(vb: VarBuilder, config: &BertConfig) -> Result<Self> {
        let (h, i, eps) = (config.hidden_size, config.intermediate_size, config.layer_norm_eps);
        let attention = vb.pp("attention");
        Ok(Self {
            query: linear(h, h, attention.pp("self.query"))?,
            key: linear(h, h, attention.pp("self.key"))?,
            value: linear(h, h, attention.pp("self.value"))?,
            attention_out: linear(h, h, attention.pp("output.dense"))?,
            attention_norm: layer_norm(h, eps, attention.pp("output.LayerNorm"))?,
            intermediate: linear(h, i, vb.pp("intermediate.dense"))?,
            output: linear(i, h, vb.pp("output.dense"))?,
            output_norm: layer_norm(h, eps, vb.pp("output.LayerNorm"))?,
        })
    }

    /// One layer over `xs` (batch, tokens, hidden); `mask_bias` (batch, 1, 1, tokens) is 0 on
    /// real tokens and very negative on padding.
    fn forward(&self, xs: &Tensor, mask_bias: &Tensor, config: &BertConfig) -> Result<Tensor> {
        let (b, t, h) = xs.dims3()?;
        let heads = config.num_attention_heads;
        let d = h / heads;
        let split = |x: Tensor| x.reshape((b, t, heads, d))?.transpose(1, 2)?.contiguous();
        let q = split(self.query.forward(xs)?)?;
        let k = split(self.key.forward(xs)?)?;
        let v = split(self.value.forward(xs)?)?;
        let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?.broadcast_add(mask_bias)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let context = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, h))?;
        let attended =
            self.attention_norm.forward(&(self.attention_out.forward(&context)? + xs)?)?;
        let inner = config.hidden_act.apply(&self.intermediate.forward(&attended)?)?;
        self.output_norm.forward(&(self.output.forward(&inner)? + attended)?)
    }
}

/// A BERT encoder's weights.
pub struct Bert {
    config: BertConfig,
    words: Embedding,
    positions: Embedding,
    segments: Embedding,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
}

impl Bert {
    /// Loads the encoder from `vb`, whose weights may sit under `bert.` or `<model_type>.`.
    pub fn load(vb: VarBuilder, config: &BertConfig) -> Result<Self> {
        if let Some(kind) = config.position_embedding_type.as_deref().filter(|k| *k != "absolute") {
            candle_core::bail!("position_embedding_type {kind:?} is not supported (only absolute)");
        }
        if config.num_attention_heads == 0
            || !config.hidden_size.is_multiple_of(config.num_attention_heads)
        {
            candle_core::bail!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size,
                config.num_attention_heads
            );
        }
        let word_key = "embeddings.word_embeddings.weight";
        let vb = match vb.contains_tensor(word_key) {
            true => vb,
            false => ["bert"]
                .into_iter()
                .chain(config.model_type.as_deref())
                .map(|prefix| vb.pp(prefix))
                .find(|scoped| scoped.contains_tensor(word_key))
                .unwrap_or_else(|| vb.clone()),
        };
        let (h, eps) = (config.hidden_size, config.layer_norm_eps);
        let embeddings = vb.pp("embeddings");
        Ok(Self {
            words: embedding(config.vocab_size, h, embeddings.pp("word_embeddings"))?,
            positions: embedding(
                config.max_position_embeddings,
                h,
                embeddings.pp("position_embeddings"),
            )?,
            segments: embedding(config.type_vocab_size, h, embeddings.pp("token_type_embeddings"))?,
            embedding_norm: layer_norm(h, eps, embeddings.pp("LayerNorm"))?,
            layers: (0..config.num_hidden_layers)
                .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), config))
                .collect::<Result<_>>()?,
            config: config.clone(),
        })
    }

    /// The last hidden states (batch, tokens, hidden) of `ids` (batch, tokens, u32), all in
    /// segment 0; `mask` (batch, tokens, u32) is 1 on real tokens and 0 on padding.
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (_, t) = ids.dims2()?;
        if t > self.config.max_position_embeddings {
            candle_core::bail!(
                "{t} tokens exceed the model's {} positions",
                self.config.max_position_embeddings
            );
        }
        let positions = Tensor::arange(0u32, t as u32, ids.device())?;
        let segment = Tensor::zeros(1, DType::U32, ids.device())?;
        let embedded = self
            .words
            .forward(ids)?
            .broadcast_add(&self.positions.forward(&positions)?)?
            .broadcast_add(&self.segments.forward(&segment)?)?;
        let mut xs = self.embedding_norm.forward(&embedded)?;
        // 0 where attended, the most negative float on padding (as transformers does)
        let padding = mask.to_dtype(DType::F32)?.affine(-1.0, 1.0)?;
        let mask_bias = (padding * f64::from(f32::MIN))?.unsqueeze(1)?.unsqueeze(1)?;
        for layer in &self.layers {
            xs = layer.forward(&xs, &mask_bias, &self.config)?;
        }
        Ok(xs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_its_activation_as_transformers_does() {
        let config: BertConfig = serde_json::from_value(serde_json::json!({
            "vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 8, "hidden_act": "gelu_new",
            "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
        }))
        .unwrap();
        assert_eq!(config.hidden_act, Activation::GeluTanh);
        assert_eq!(config.position_embedding_type, None);
    }
}
