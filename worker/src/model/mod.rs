//! The decoder-only transformer of every family in [`Family::ALL`](crate::config::Family::ALL):
//! one forward used for training (with gradients), no-grad scoring and KV-cached sampling.

pub mod compact;
pub mod decode;
pub mod inputs;
pub mod kv_cache;
pub mod lora;
pub mod prompt_groups;
pub mod tape;

use crate::config::{LayerNorms, ModelConfig, QkNorm};
use crate::error::{Result, WorkerError};
use crate::safetensors_file::PendingTensor;
use crate::weights::WeightMap;
use candle_core::{DType, Device, Tensor, Var};
use compact::CompactWeights;
pub use inputs::VisibleKeys;
use inputs::{attention_mask, attention_mask_hiding, PaddedBatch, Rotary};
use kv_cache::KvCache;
use lora::{LoraAdapter, LoraConfig};
use prompt_groups::PromptGroups;
use std::collections::BTreeMap;
use tape::Tape;
use verity_kernels::{self as kernels, DecodeWeight};

/// Which implementation of norm / softmax / rope / log-prob the forward uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// Fused CPU kernels with hand-written backward for f32 on the CPU; the device path
    /// (as `Device`) on any other device or dtype.
    Fused,
    /// The device path everywhere, the CPU included: fused forward kernels for RMS norm and the
    /// attention softmax with composed backward, candle ops elsewhere ([`kernels::device`]).
    /// What a GPU runs; the CPU tests use it to prove that path.
    Device,
    /// Compositions of plain candle ops (slow; test reference).
    Reference,
}

/// A linear layer with its HF module path. The weight is held transposed, `(in, out)`, so the
/// forward is a plain `x @ w_t` (much faster than a transposed operand for small batches) and its
/// gradient arrives contiguous; it is transposed back to HF's `(out, in)` on export.
#[derive(Clone)]
struct Linear {
    path: String,
    weight_t: Var,
    bias: Option<Var>,
}

/// Projections of one input: separate linear layers, or one fused layer whose output splits
/// into parts of the given widths (Phi-3's `qkv_proj` and `gate_up_proj`).
#[derive(Clone)]
enum Projections<const N: usize> {
    Separate([Linear; N]),
    Fused(Linear, [usize; N]),
}

impl<const N: usize> Projections<N> {
    /// The linear layers held (N, or the one fused layer).
    fn linears(&self) -> Vec<&Linear> {
        match self {
            Projections::Separate(lins) => lins.iter().collect(),
            Projections::Fused(lin, _) => vec![lin],
        }
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Projections::Separate(lins) => lins.iter_mut().collect(),
            Projections::Fused(lin, _) => vec![lin],
        }
    }
}

#[derive(Clone)]
struct Layer {
    /// The RMS norms around the attention and the MLP (which exist depends on the family).
    norms: LayerNorms<Option<Var>>,
    /// Whether the layer rotates queries and keys (SmolLM3's NoPE layers do not).
    rope: bool,
    /// Whether the layer attends through the model's sliding window (its local layers).
    windowed: bool,
    /// Query, key and value projections.
    qkv: Projections<3>,
    o: Linear,
    /// Gate and up projections of the MLP.
    gate_up: Projections<2>,
    down: Linear,
    q_norm: Option<Var>,
    k_norm: Option<Var>,
}

/// How completions are scored: the temperature, the padding id, and constrained decoding's masks.
#[derive(Clone, Copy)]
struct Scoring<'a> {
    temperature: f32,
    pad_id: u32,
    masks: &'a [Vec<kernels::VocabMask>],
    /// The tokens scored at each completion position, when they are not the completion's own
    /// (empty: the completion's).
    targets: &'a [Vec<u32>],
}

/// Per-token outputs of [`Transformer::completion_logprobs`], shaped `(batch, max_completion_len)`
/// and zero where `mask` is 0.
pub struct CompletionLogprobs {
    /// Log-probability of each completion token (differentiable when requested).
    pub logprobs: Tensor,
    /// Entropy of the next-token distribution at each completion position (no gradient).
    pub entropy: Tensor,
    /// 1.0 on real completion tokens, 0.0 on padding (f32).
    pub mask: Tensor,
}

impl Layer {
    /// Every linear layer, in HF order.
    fn linears(&self) -> Vec<&Linear> {
        let mut all = self.qkv.linears();
        all.push(&self.o);
        all.extend(self.gate_up.linears());
        all.push(&self.down);
        all
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut all = self.qkv.linears_mut();
        all.push(&mut self.o);
        all.extend(self.gate_up.linears_mut());
        all.push(&mut self.down);
        all
    }
}

/// The rotary tables and attention mask a layer reads for one stretch of rows.
type RopeAndMask = ((Tensor, Tensor), Tensor);

/// [`RopeAndMask`] of the global layers, and of the sliding-window layers where there are any.
struct LayerInputs {
    global: RopeAndMask,
    local: Option<RopeAndMask>,
}

impl LayerInputs {
    /// The tables and mask `layer` reads.
    fn of(&self, layer: &Layer) -> (&(Tensor, Tensor), &Tensor) {
        let (rope, mask) = match &self.local {
            Some(local) if layer.windowed => local,
            _ => &self.global,
        };
        (rope, mask)
    }
}

/// A loaded transformer whose parameters are candle `Var`s.
pub struct Transformer {
    /// Architecture hyper-parameters.
    pub config: ModelConfig,
    embed: Var,
    layers: Vec<Layer>,
    norm: Var,
    lm_head: Option<Var>,
    lora: BTreeMap<String, LoraAdapter>,
    lora_config: Option<LoraConfig>,
    adapters_enabled: bool,
    lora_dropout_rng: std::sync::Mutex<rand::rngs::StdRng>,
    dtypes: BTreeMap<String, DType>,
    rotary: Rotary,
    /// RoPE of the sliding-window layers where their base differs (Gemma 3).
    local_rotary: Option<Rotary>,
    kernels: Kernels,
    compute_dtype: DType,
    device: Device,
}

/// A parameter with its own copy of the values.
fn deep_copy(v: &Var) -> Result<Var> {
    Ok(Var::from_tensor(&v.as_tensor().copy()?)?)
}

fn var(map: &mut WeightMap, name: &str) -> Result<Var> {
    Ok(Var::from_tensor(&map.take(name)?)?)
}

fn linear(map: &mut WeightMap, path: String, bias: bool) -> Result<Linear> {
    let weight_t = Var::from_tensor(&map.take(&format!("{path}.weight"))?.t()?.contiguous()?)?;
    let bias = if bias { Some(var(map, &format!("{path}.bias"))?) } else { None };
    Ok(Linear { path, weight_t, bias })
}

impl Transformer {
    /// Builds the model from a weight map in HF naming (consumed).
    pub fn from_weights(config: ModelConfig, mut map: WeightMap, device: &Device) -> Result<Self> {
        let dtypes = map.dtypes.clone();
        let embed = var(&mut map, "model.embed_tokens.weight")?;
        let (v, d) = embed.dims2()?;
        if v != config.vocab_size || d != config.hidden_size {
            return Err(WorkerError::Model(format!(
                "embedding is {v}x{d}, config says {}x{}",
                config.vocab_size, config.hidden_size
            )));
        }
        let bias = config.attention_bias;
        let qk_norm = config.family.qk_norm() != QkNorm::None;
        let norm_names = config.family.layer_norms();
        let (qd, kd) = (
            config.num_attention_heads * config.head_dim,
            config.num_key_value_heads * config.head_dim,
        );
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mut norm = |name: Option<&str>| -> Result<Option<Var>> {
                name.map(|n| var(&mut map, &format!("{p}.{n}.weight"))).transpose()
            };
            let norms = LayerNorms {
                attn_in: norm(norm_names.attn_in)?,
                attn_out: norm(norm_names.attn_out)?,
                mlp_in: norm(norm_names.mlp_in)?,
                mlp_out: norm(norm_names.mlp_out)?,
            };
            let (qkv, gate_up) = if config.family.fuses_projections() {
                let f = config.intermediate_size;
                (
                    Projections::Fused(
                        linear(&mut map, format!("{p}.self_attn.qkv_proj"), bias)?,
                        [qd, kd, kd],
                    ),
                    Projections::Fused(
                        linear(&mut map, format!("{p}.mlp.gate_up_proj"), false)?,
                        [f, f],
                    ),
                )
            } else {
                (
                    Projections::Separate([
                        linear(&mut map, format!("{p}.self_attn.q_proj"), bias)?,
                        linear(&mut map, format!("{p}.self_attn.k_proj"), bias)?,
                        linear(&mut map, format!("{p}.self_attn.v_proj"), bias)?,
                    ]),
                    Projections::Separate([
                        linear(&mut map, format!("{p}.mlp.gate_proj"), false)?,
                        linear(&mut map, format!("{p}.mlp.up_proj"), false)?,
                    ]),
                )
            };
            layers.push(Layer {
                norms,
                rope: config.layer_uses_rope(i),
                windowed: config.layer_window(i).is_some(),
                qkv,
                o: linear(&mut map, format!("{p}.self_attn.o_proj"), false)?,
                gate_up,
                down: linear(&mut map, format!("{p}.mlp.down_proj"), false)?,
                q_norm: if qk_norm {
                    Some(var(&mut map, &format!("{p}.self_attn.q_norm.weight"))?)
                } else {
                    None
                },
                k_norm: if qk_norm {
                    Some(var(&mut map, &format!("{p}.self_attn.k_norm.weight"))?)
                } else {
                    None
                },
            });
        }
        let norm = var(&mut map, "model.norm.weight")?;
        let lm_head = if config.tie_word_embeddings {
            map.tensors.remove("lm_head.weight");
            None
        } else {
            Some(var(&mut map, "lm_head.weight")?)
        };
        let leftover: Vec<_> =
            map.tensors.keys().filter(|k| !k.contains("rotary_emb")).cloned().collect();
        if !leftover.is_empty() {
            tracing::warn!(?leftover, "ignoring weights the model does not use");
        }
        Ok(Self {
            rotary: Rotary::of(&config),
            local_rotary: config.local_rope_theta.map(|t| Rotary::new(config.rotary_dim, t, None)),
            config,
            embed,
            layers,
            norm,
            lm_head,
            lora: BTreeMap::new(),
            lora_config: None,
            adapters_enabled: true,
            lora_dropout_rng: std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(0)),
            dtypes,
            kernels: Kernels::Fused,
            compute_dtype: crate::device::default_compute_dtype(device)?,
            device: device.clone(),
        })
    }

    /// A model over the same base weights (shared, not copied: candle tensors are reference
    /// counted) without adapters, e.g. to load another LoRA adapter beside this one for serving.
    pub fn share_base(&self) -> Transformer {
        Transformer {
            config: self.config.clone(),
            embed: self.embed.clone(),
            layers: self.layers.clone(),
            norm: self.norm.clone(),
            lm_head: self.lm_head.clone(),
            lora: BTreeMap::new(),
            lora_config: None,
            adapters_enabled: true,
            lora_dropout_rng: std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(0)),
            dtypes: self.dtypes.clone(),
            rotary: self.rotary.clone(),
            local_rotary: self.local_rotary.clone(),
            kernels: self.kernels,
            compute_dtype: self.compute_dtype,
            device: self.device.clone(),
        }
    }

    /// A copy that keeps computing the current policy while this model trains (the optimizer
    /// updates parameters in place): the trainable parameters are copied, the frozen base under
    /// LoRA is shared. The asynchronous pipeline samples the next step's rollouts from it.
    pub fn snapshot(&self) -> Result<Transformer> {
        let mut copy = self.share_base();
        if self.lora.is_empty() {
            copy.embed = deep_copy(&self.embed)?;
            copy.norm = deep_copy(&self.norm)?;
            copy.lm_head = self.lm_head.as_ref().map(deep_copy).transpose()?;
            for layer in &mut copy.layers {
                let LayerNorms { attn_in, attn_out, mlp_in, mlp_out } = &mut layer.norms;
                for v in [attn_in, attn_out, mlp_in, mlp_out]
                    .into_iter()
                    .flat_map(Option::as_mut)
                    .chain(layer.q_norm.as_mut())
                    .chain(layer.k_norm.as_mut())
                {
                    *v = deep_copy(v)?;
                }
            }
            for lin in copy.linears_mut() {
                lin.weight_t = deep_copy(&lin.weight_t)?;
                lin.bias = lin.bias.as_ref().map(deep_copy).transpose()?;
            }
        } else {
            for (path, ad) in &self.lora {
                let adapter =
                    LoraAdapter { a: deep_copy(&ad.a)?, b: deep_copy(&ad.b)?, scale: ad.scale };
                copy.lora.insert(path.clone(), adapter);
            }
            copy.lora_config = self.lora_config.clone();
        }
        copy.adapters_enabled = self.adapters_enabled;
        Ok(copy)
    }

    /// Bytes the parameters take in memory (base weights plus adapters).
    pub fn parameter_bytes(&self) -> usize {
        self.named_weights()
            .iter()
            .chain(self.lora_params().iter())
            .map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes())
            .sum()
    }

    /// Bytes the adapters take in memory (0 without LoRA).
    pub fn adapter_bytes(&self) -> usize {
        self.lora_params().iter().map(|(_, v)| v.elem_count() * v.dtype().size_in_bytes()).sum()
    }

    /// Folds the LoRA adapters into the base weights (`W + scale · B A`) and drops them: the
    /// merged model computes what the adapted one does. The base weights are copied first, so
    /// a model sharing them ([`Transformer::share_base`]) is unaffected.
    pub fn merge_lora(&mut self) -> Result<()> {
        let adapters = std::mem::take(&mut self.lora);
        for lin in self.linears_mut() {
            if let Some(ad) = adapters.get(&lin.path) {
                // weight_t is (in, out); the update B·A is (out, in).
                let delta = (ad.b.as_tensor().matmul(ad.a.as_tensor())? * ad.scale)?;
                let merged = (lin.weight_t.as_tensor() + delta.t()?)?.contiguous()?;
                lin.weight_t = Var::from_tensor(&merged)?;
            }
        }
        self.lora_config = None;
        Ok(())
    }

    /// Switches LoRA adapters off (the frozen base model, e.g. the KL reference policy) or back on.
    pub fn set_adapters_enabled(&mut self, enabled: bool) {
        self.adapters_enabled = enabled;
    }

    /// Chooses fused kernels or the reference composition.
    pub fn set_kernels(&mut self, kernels: Kernels) {
        self.kernels = kernels;
    }

    /// Sets the dtype of the activations and of the weight copies the products read: `F32`
    /// (the default) or `BF16` for mixed precision. The parameters, their gradients and the
    /// optimizer state stay f32 (master weights): each forward casts the weights it multiplies
    /// (linear layers, embedding, LM head) to this dtype, norms run in f32, and the
    /// log-probabilities and logits come out in f32.
    pub fn set_compute_dtype(&mut self, dtype: DType) -> Result<()> {
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(WorkerError::InvalidArgument(format!(
                "compute dtype must be f32 or bf16, got {dtype:?}"
            )));
        }
        self.compute_dtype = dtype;
        Ok(())
    }

    /// The dtype of activations and of the products' weight copies (see
    /// [`Transformer::set_compute_dtype`]).
    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// The device the parameters live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether the parameter of this HF name is held transposed (see [`Transformer::named_weights`]).
    pub fn is_held_transposed(name: &str) -> bool {
        name.ends_with("_proj.weight")
    }

    /// Base weight `name` in HF layout: a view of the parameter `var`, not a copy.
    fn hf_view(name: &str, var: &Var) -> Result<Tensor> {
        let held = var.as_tensor();
        Ok(if Self::is_held_transposed(name) { held.t()? } else { held.clone() })
    }

    /// Base weights in HF layout and names, ready to save (tied LM head omitted, as HF does).
    pub fn export_weights(&self) -> Result<Vec<(String, Tensor)>> {
        self.named_weights()
            .into_iter()
            .map(|(name, v)| {
                let view = Self::hf_view(&name, &v)?;
                let t = if view.is_contiguous() { view.copy()? } else { view.contiguous()? };
                Ok((name, t))
            })
            .collect()
    }

    /// Base weights as [`Transformer::export_weights`] names and lays them out, in the dtype
    /// each was loaded with, to be written one at a time: nothing is copied until the writer
    /// reaches a weight (a checkpoint then never holds a second copy of the model).
    pub fn weights_to_write(&self) -> Result<Vec<(String, PendingTensor<'static>)>> {
        self.named_weights()
            .into_iter()
            .map(|(name, v)| {
                let dtype = self.dtypes.get(&name).copied().unwrap_or(DType::F32);
                let pending = PendingTensor::converted(Self::hf_view(&name, &v)?, dtype);
                Ok((name, pending))
            })
            .collect()
    }

    /// Sets the base weight `name` from a tensor in HF layout.
    pub fn import_weight(&self, name: &str, tensor: &Tensor) -> Result<()> {
        let (_, var) = self
            .named_weights()
            .into_iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| WorkerError::Model(format!("model has no weight `{name}`")))?;
        let t =
            if Self::is_held_transposed(name) { tensor.t()?.contiguous()? } else { tensor.clone() };
        if t.dims() != var.dims() {
            return Err(WorkerError::Model(format!(
                "`{name}` has shape {:?}, model expects {:?}",
                tensor.dims(),
                var.dims()
            )));
        }
        Ok(var.set(&t.to_dtype(DType::F32)?)?)
    }

    /// All base weights by HF name (tied LM head omitted, as HF saves it). Projection weights
    /// (`*_proj.weight`) are held transposed, `(in, out)`; use [`Transformer::export_weights`] for HF layout.
    pub fn named_weights(&self) -> Vec<(String, Var)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), self.embed.clone())];
        let names = self.config.family.layer_norms().into_array();
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            for (name, norm) in names.into_iter().zip(l.norms.clone().into_array()) {
                if let (Some(name), Some(norm)) = (name, norm) {
                    out.push((format!("{p}.{name}.weight"), norm));
                }
            }
            for lin in l.linears() {
                out.push((format!("{}.weight", lin.path), lin.weight_t.clone()));
                if let Some(b) = &lin.bias {
                    out.push((format!("{}.bias", lin.path), b.clone()));
                }
            }
            if let Some(n) = &l.q_norm {
                out.push((format!("{p}.self_attn.q_norm.weight"), n.clone()));
            }
            if let Some(n) = &l.k_norm {
                out.push((format!("{p}.self_attn.k_norm.weight"), n.clone()));
            }
        }
        out.push(("model.norm.weight".to_string(), self.norm.clone()));
        if let Some(h) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), h.clone()));
        }
        out
    }

    /// The parameters that training updates: the LoRA adapters when LoRA is enabled (PEFT
    /// names), else every base weight (HF names).
    pub fn trainable_params(&self) -> Vec<(String, Var)> {
        if self.lora.is_empty() {
            self.named_weights()
        } else {
            self.lora_params()
        }
    }

    fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.layers.iter_mut().flat_map(Layer::linears_mut)
    }

    /// Whether a forward with `track` records gradients for the base weights (full fine-tuning;
    /// with LoRA only the adapters train).
    fn trains_base(&self, track: bool) -> bool {
        track && self.lora.is_empty()
    }

    fn get(&self, v: &Var, track: bool) -> Tensor {
        if track {
            v.as_tensor().clone()
        } else {
            v.as_tensor().detach()
        }
    }

    /// A weight that a product reads, in the compute dtype (a cast copy under mixed precision,
    /// through which the gradient flows back to the f32 parameter).
    fn get_compute(&self, v: &Var, track: bool) -> Result<Tensor> {
        let t = self.get(v, track);
        Ok(if t.dtype() == self.compute_dtype { t } else { t.to_dtype(self.compute_dtype)? })
    }

    fn lm_weight(&self, track: bool) -> Result<Tensor> {
        self.get_compute(self.lm_head.as_ref().unwrap_or(&self.embed), track)
    }

    fn rms_norm(&self, x: &Tensor, w: &Var, track: bool) -> Result<Tensor> {
        let mut w = self.get(w, track);
        if self.config.family.norm_weight_is_offset() {
            w = (w + 1.0)?;
        }
        let eps = self.config.rms_norm_eps as f32;
        Ok(match self.kernels {
            Kernels::Fused => kernels::rms_norm(x, &w, eps)?,
            Kernels::Device => kernels::rms_norm_device(x, &w, eps)?,
            Kernels::Reference => kernels::rms_norm_reference(x, &w, eps)?,
        })
    }

    /// Whether no-grad products with rows `x` go through the skinny kernels: always with bf16 or
    /// int8 weight copies, else for a few rows (decode steps).
    fn skinny_route(&self, x: &Tensor, track: bool, compact: Option<&CompactWeights>) -> bool {
        let max_rows = if compact.is_some() { usize::MAX } else { kernels::SKINNY_MAX_ROWS };
        !track && self.kernels == Kernels::Fused && kernels::skinny_applies(x, max_rows)
    }

    fn apply_linear(
        &self,
        x: &Tensor,
        lin: &Linear,
        track: bool,
        compact: Option<&CompactWeights>,
    ) -> Result<Tensor> {
        let [y] = self.apply_linears(x, [lin], track, compact)?;
        Ok(y)
    }

    /// Several linear layers of the same input; in one pass over their weights on the skinny route.
    fn apply_linears<const N: usize>(
        &self,
        x: &Tensor,
        lins: [&Linear; N],
        track: bool,
        compact: Option<&CompactWeights>,
    ) -> Result<[Tensor; N]> {
        let products = if self.skinny_route(x, track, compact) {
            let weights = lins
                .iter()
                .map(|lin| match compact {
                    Some(c) => c.linear(&lin.path).ok_or_else(|| {
                        WorkerError::Model(format!("no low-precision copy of `{}`", lin.path))
                    }),
                    None => Ok(DecodeWeight::F32(lin.weight_t.as_tensor())),
                })
                .collect::<Result<Vec<_>>>()?;
            kernels::skinny_matmul_many(x, &weights)?.into_iter().map(|y| (y, false)).collect()
        } else {
            let train_base = self.trains_base(track);
            lins.iter()
                .map(|lin| -> Result<(Tensor, bool)> {
                    let w = self.get_compute(&lin.weight_t, train_base)?;
                    if let Some(ad) = self.one_op_lora(lin, x, track) {
                        let (a, b) = (self.get(&ad.a, track), self.get(&ad.b, track));
                        return Ok((kernels::lora_matmul(x, &w, &a, &b, ad.scale as f32)?, true));
                    }
                    Ok((
                        match self.kernels {
                            Kernels::Fused => kernels::matmul(x, &w)?,
                            Kernels::Device | Kernels::Reference => x.matmul(&w)?,
                        },
                        false,
                    ))
                })
                .collect::<Result<Vec<_>>>()?
        };
        let ys = products
            .into_iter()
            .zip(lins)
            .map(|((y, adapted), lin)| self.finish_linear(x, y, lin, (track, adapted)))
            .collect::<Result<Vec<_>>>()?;
        ys.try_into().map_err(|_| WorkerError::InvalidArgument("linear layer count".into()))
    }

    /// The outputs of `projections` on rows `x`: one per separate layer, or the fused layer's
    /// output split into its parts.
    fn project<const N: usize>(
        &self,
        x: &Tensor,
        projections: &Projections<N>,
        track: bool,
        compact: Option<&CompactWeights>,
    ) -> Result<[Tensor; N]> {
        match projections {
            Projections::Separate(lins) => self.apply_linears(x, lins.each_ref(), track, compact),
            Projections::Fused(lin, widths) => {
                let y = self.apply_linear(x, lin, track, compact)?;
                let mut start = 0;
                let parts = widths
                    .iter()
                    .map(|&w| {
                        let part = y.narrow(candle_core::D::Minus1, start, w)?.contiguous()?;
                        start += w;
                        Ok(part)
                    })
                    .collect::<Result<Vec<_>>>()?;
                parts
                    .try_into()
                    .map_err(|_| WorkerError::InvalidArgument("projection parts".into()))
            }
        }
    }

    /// Adds the bias and (unless `adapted`: already in `y`) the LoRA update of `lin` to `y = x · W`.
    fn finish_linear(
        &self,
        x: &Tensor,
        mut y: Tensor,
        lin: &Linear,
        (track, adapted): (bool, bool),
    ) -> Result<Tensor> {
        let train_base = self.trains_base(track);
        if let Some(b) = &lin.bias {
            y = y.broadcast_add(&self.get_compute(b, train_base)?)?;
        }
        if let Some(ad) = self.lora.get(&lin.path).filter(|_| self.adapters_enabled && !adapted) {
            let a = self.get_compute(&ad.a, track)?;
            let b = self.get_compute(&ad.b, track)?;
            let x = self.lora_dropout_input(x, track)?;
            // The scale goes on the rank-r product: one fewer (rows × out) tensor in the graph.
            let h = (x.matmul(&a.t()?)? * ad.scale)?;
            y = (y + h.matmul(&b.t()?)?)?;
        }
        Ok(y)
    }

    /// Embedding rows of `ids` (checked against the vocabulary).
    fn embed_rows(&self, ids: &[u32], track: bool) -> Result<Tensor> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(WorkerError::InvalidArgument(format!("token id {bad} outside vocabulary")));
        }
        let rows =
            kernels::embedding(&self.get_compute(&self.embed, self.trains_base(track))?, ids)?;
        if self.config.family.scales_embedding() {
            let scale = (self.config.hidden_size as f32).sqrt();
            return Ok((rows * f64::from(scale))?);
        }
        Ok(rows)
    }

    /// Query/key/value heads `(batch, heads, t, head_dim)` of projected rows `(batch * t, _)`,
    /// with the q/k norms (Qwen3, OLMo 2) and RoPE (`rope` = cos/sin tables
    /// `(batch, t, head_dim/2)`; not in NoPE layers) applied.
    fn attention_heads(
        &self,
        layer: &Layer,
        [mut q, mut k, v]: [Tensor; 3],
        (batch, t): (usize, usize),
        (cos, sin): &(Tensor, Tensor),
        track: bool,
    ) -> Result<[Tensor; 3]> {
        let cfg = &self.config;
        let qk_norm = cfg.family.qk_norm();
        let train_base = self.trains_base(track);
        if let (QkNorm::Projection, Some(qn), Some(kn)) = (qk_norm, &layer.q_norm, &layer.k_norm) {
            q = self.rms_norm(&q, qn, train_base)?;
            k = self.rms_norm(&k, kn, train_base)?;
        }
        // Head-major views of the rows: q and k go to RoPE (which reads the view in place), v
        // is made contiguous for attention.
        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            // One position per row (a decode step): the head-major layout is the same memory,
            // so a reshape of the contiguous rows avoids a strided copy.
            if t == 1 {
                return Ok(y.contiguous()?.reshape((batch, n, 1, cfg.head_dim))?);
            }
            Ok(y.reshape((batch, t, n, cfg.head_dim))?.transpose(1, 2)?)
        };
        let (mut q, mut k) =
            (heads(q, cfg.num_attention_heads)?, heads(k, cfg.num_key_value_heads)?);
        let v = heads(v, cfg.num_key_value_heads)?.contiguous()?;
        if let (QkNorm::PerHead, Some(qn), Some(kn)) = (qk_norm, &layer.q_norm, &layer.k_norm) {
            q = self.rms_norm(&q, qn, train_base)?;
            k = self.rms_norm(&k, kn, train_base)?;
        }
        if !layer.rope {
            // RoPE would have written contiguous heads; attention's products need them so.
            return Ok([q.contiguous()?, k.contiguous()?, v]);
        }
        let rotate = |x: &Tensor| -> Result<Tensor> {
            Ok(match self.kernels {
                Kernels::Fused => kernels::rope(x, cos, sin)?,
                Kernels::Device | Kernels::Reference => kernels::rope_reference(x, cos, sin)?,
            })
        };
        let (rot, dim) = (cfg.rotary_dim, cfg.head_dim);
        if rot == dim {
            return Ok([rotate(&q)?, rotate(&k)?, v]);
        }
        // A partial rotary embedding (Phi-4-mini) turns the first `rot` dimensions of each head
        // and passes the rest through.
        let partial = |x: &Tensor| -> Result<Tensor> {
            let turned = rotate(&x.narrow(3, 0, rot)?.contiguous()?)?;
            let kept = x.narrow(3, rot, dim - rot)?.contiguous()?;
            Ok(Tensor::cat(&[&turned, &kept], 3)?)
        };
        Ok([partial(&q)?, partial(&k)?, v])
    }

    /// Attention of query heads over key/value heads under an additive mask `(batch, tq, tk)`;
    /// rows `(batch * tq, heads * head_dim)`.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Tensor,
        track: bool,
    ) -> Result<Tensor> {
        let scale = self.config.attention_scale();
        Ok(match self.kernels {
            Kernels::Fused if !track && kernels::use_cpu_kernel(q) => {
                kernels::attention_nograd(q, k, v, mask, scale)?
            }
            Kernels::Fused => kernels::attention(q, k, v, mask, scale)?,
            Kernels::Device => kernels::attention_device(q, k, v, mask, scale)?,
            Kernels::Reference => kernels::attention_reference(q, k, v, mask, scale)?,
        })
    }

    /// The rotary tables and attention masks of one stretch of rows (`positions`, `(batch, t)`)
    /// under `mask`: for the global layers, and for the sliding-window layers if there are any.
    fn layer_inputs(
        &self,
        positions: &[u32],
        (batch, t): (usize, usize),
        mask: Tensor,
    ) -> Result<LayerInputs> {
        let rope = self.rotary.tables(positions, batch, t, &self.device)?;
        let local = match self.config.sliding_window {
            Some(window) if self.layers.iter().any(|l| l.windowed) => {
                let local_rope = match &self.local_rotary {
                    Some(r) => r.tables(positions, batch, t, &self.device)?,
                    None => rope.clone(),
                };
                Some((local_rope, kernels::mask::sliding_window(&mask, window)?))
            }
            _ => None,
        };
        Ok(LayerInputs { global: (rope, mask), local })
    }

    /// One decoder layer on rows `x`; `attention` turns the projected q/k/v rows into attention
    /// output rows (it owns the sequence layout). No-grad products read `compact` when given.
    fn decoder_layer(
        &self,
        layer: &Layer,
        x: Tensor,
        (track, compact): (bool, Option<&CompactWeights>),
        attention: impl FnOnce([Tensor; 3]) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let train_base = self.trains_base(track);
        let norm = |x: Tensor, w: &Option<Var>| -> Result<Tensor> {
            match w {
                Some(w) => self.rms_norm(&x, w, train_base),
                None => Ok(x),
            }
        };
        let hn = norm(x.clone(), &layer.norms.attn_in)?;
        let attn = attention(self.project(&hn, &layer.qkv, track, compact)?)?;
        let attn = self.apply_linear(&attn, &layer.o, track, compact)?;
        let x = (x + norm(attn, &layer.norms.attn_out)?)?;
        let hn = norm(x.clone(), &layer.norms.mlp_in)?;
        let [gate, up] = self.project(&hn, &layer.gate_up, track, compact)?;
        let down = if self.activation_into_down(&layer.down, &gate, track) {
            kernels::swiglu_matmul(&gate, &up, &self.get(&layer.down.weight_t, train_base))?
        } else {
            let act = if self.config.family.gelu_mlp() {
                (gate.gelu()? * up)?
            } else {
                match self.kernels {
                    Kernels::Fused => kernels::swiglu(&gate, &up)?,
                    Kernels::Device | Kernels::Reference => kernels::swiglu_reference(&gate, &up)?,
                }
            };
            self.apply_linear(&act, &layer.down, track, compact)?
        };
        Ok((x + norm(down, &layer.norms.mlp_out)?)?)
    }

    /// Whether a tracked MLP runs its activation and down projection as one op that keeps no
    /// activation for the backward (fused CPU f32 kernels, a plain down projection: no bias, no
    /// active adapter).
    fn activation_into_down(&self, down: &Linear, gate: &Tensor, track: bool) -> bool {
        track
            && !self.config.family.gelu_mlp()
            && self.fused_cpu_rows(gate)
            && down.bias.is_none()
            && !(self.adapters_enabled && self.lora.contains_key(&down.path))
    }

    /// Whether the fused CPU kernels take rows `x` (a 2-D f32 CPU tensor).
    fn fused_cpu_rows(&self, x: &Tensor) -> bool {
        self.kernels == Kernels::Fused && kernels::use_cpu_kernel(x) && x.rank() == 2
    }

    /// Runs the decoder on `(batch, t)` ids and returns the final-normed hidden states
    /// `(batch * t, hidden)`. `positions` are `(batch * t)` RoPE positions, `first_valid` the
    /// first real key index of each row; with a cache, keys/values are appended to it and the
    /// cache's weight copies (if any) serve the no-grad products.
    pub fn hidden_states(
        &self,
        ids: &[u32],
        positions: &[u32],
        batch: usize,
        first_valid: &[usize],
        cache: Option<&mut KvCache>,
        track: bool,
    ) -> Result<Tensor> {
        let keys = VisibleKeys { first_valid, hidden: &[] };
        self.hidden_states_of(ids, positions, batch, keys, cache, track)
    }

    /// [`Transformer::hidden_states`] where each row sees the keys `keys` allows (rows that
    /// skipped cache positions hide them).
    pub fn hidden_states_of(
        &self,
        ids: &[u32],
        positions: &[u32],
        batch: usize,
        keys: VisibleKeys,
        mut cache: Option<&mut KvCache>,
        track: bool,
    ) -> Result<Tensor> {
        let first_valid = keys.first_valid;
        let t = ids.len() / batch.max(1);
        if t == 0
            || t * batch != ids.len()
            || positions.len() != ids.len()
            || first_valid.len() != batch
        {
            return Err(WorkerError::InvalidArgument("inconsistent batch shapes".into()));
        }
        let past = cache.as_ref().map(|c| c.len()).unwrap_or(0);
        let mask = attention_mask_hiding(first_valid, keys.hidden, past, t, &self.device)?;
        let inputs = self.layer_inputs(positions, (batch, t), mask)?;
        let compact = cache.as_ref().and_then(|c| c.weights().cloned());
        let mut x = self.embed_rows(ids, track)?;
        for (li, layer) in self.layers.iter().enumerate() {
            // A cancelled job's forward ends between layers (a long prefill takes seconds).
            if verity_verifiers::stop::requested() {
                return Err(WorkerError::Stopped);
            }
            x = self.decoder_layer(layer, x, (track, compact.as_deref()), |qkv| {
                let (rope, mask) = inputs.of(layer);
                let [q, k, v] = self.attention_heads(layer, qkv, (batch, t), rope, track)?;
                let (k, v) = match cache.as_deref_mut() {
                    Some(c) => c.append(li, &k, &v)?,
                    None => (k, v),
                };
                self.attend(&q, &k, &v, mask, track)
            })?;
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        self.rms_norm(&x, &self.norm, self.trains_base(track))
    }

    /// Final-normed hidden states of the rows of `layout` (see [`PromptGroups`]): each shared
    /// prompt runs once and its keys/values serve every completion of its group.
    /// With a `tape`, the graph is cut at each layer's input and before the final norm.
    pub fn grouped_hidden_states(
        &self,
        layout: &PromptGroups,
        track: bool,
        mut tape: Option<&mut Tape>,
    ) -> Result<Tensor> {
        let mut cut = |x: Tensor| match tape.as_deref_mut() {
            Some(tape) => tape.cut(x),
            None => Ok(x),
        };
        let dev = &self.device;
        let inputs_of = |start: usize, (batch, t): (usize, usize), mask: Tensor| {
            self.layer_inputs(&layout.positions[start..start + batch * t], (batch, t), mask)
        };
        // Per group: one causal sequence (prompt, or prompt + its only completion), then the
        // completions of a shared prompt, which see all of it.
        struct Causal {
            first: usize,
            len: usize,
            inputs: LayerInputs,
        }
        struct Tails {
            count: usize,
            width: usize,
            inputs: LayerInputs,
        }
        struct Parts {
            head: Causal,
            tails: Option<Tails>,
        }
        let parts = layout
            .groups
            .iter()
            .map(|g| -> Result<Parts> {
                let (p, n, w) = (g.prompt_len, g.members.len(), g.width);
                let causal = |first: usize, len: usize| -> Result<Causal> {
                    let mask = attention_mask(&[0], 0, len, dev)?;
                    Ok(Causal { first, len, inputs: inputs_of(first, (1, len), mask)? })
                };
                Ok(if n == 1 || w == 0 {
                    Parts { head: causal(g.offset, g.rows())?, tails: None }
                } else {
                    let off = g.completion_offset();
                    let mask = attention_mask(&vec![0; n], p, w, dev)?;
                    let tails = Tails { count: n, width: w, inputs: inputs_of(off, (n, w), mask)? };
                    Parts { head: causal(g.offset, p)?, tails: Some(tails) }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut x = self.embed_rows(&layout.ids, track)?;
        for layer in &self.layers {
            x = self.decoder_layer(layer, cut(x)?, (track, None), |qkv| {
                let rows = |start: usize, len: usize| -> Result<[Tensor; 3]> {
                    Ok([
                        qkv[0].narrow(0, start, len)?,
                        qkv[1].narrow(0, start, len)?,
                        qkv[2].narrow(0, start, len)?,
                    ])
                };
                let mut outs = Vec::with_capacity(parts.len() * 2);
                for part in &parts {
                    let Causal { first: start, len, inputs } = &part.head;
                    let (rope, mask) = inputs.of(layer);
                    let [q, k, v] =
                        self.attention_heads(layer, rows(*start, *len)?, (1, *len), rope, track)?;
                    outs.push(self.attend(&q, &k, &v, mask, track)?);
                    if let Some(Tails { count: n, width: w, inputs }) = &part.tails {
                        let (rope, mask) = inputs.of(layer);
                        let [qc, kc, vc] = self.attention_heads(
                            layer,
                            rows(start + len, n * w)?,
                            (*n, *w),
                            rope,
                            track,
                        )?;
                        let after_prompt = |prompt: &Tensor, own: &Tensor| match self.kernels {
                            Kernels::Fused => kernels::after_prefix(prompt, own),
                            Kernels::Device | Kernels::Reference => {
                                kernels::after_prefix_reference(prompt, own)
                            }
                        };
                        outs.push(self.attend(
                            &qc,
                            &after_prompt(&k, &kc)?,
                            &after_prompt(&v, &vc)?,
                            mask,
                            track,
                        )?);
                    }
                }
                Ok(if outs.len() == 1 { outs.remove(0) } else { Tensor::cat(&outs, 0)? })
            })?;
        }
        self.rms_norm(&cut(x)?, &self.norm, self.trains_base(track))
    }

    /// Next-token logits `(rows, vocab)` of hidden states `(rows, hidden)` (no gradient); with a
    /// cache holding weight copies, from the copy of the LM head.
    pub fn logits(&self, hidden: &Tensor, cache: Option<&KvCache>) -> Result<Tensor> {
        let hidden = hidden.detach();
        let w = self.lm_weight(false)?;
        let compact = cache.and_then(|c| c.weights()).map(|c| &**c);
        if self.skinny_route(&hidden, false, compact) {
            let weight = match compact {
                Some(c) => c.lm_head(),
                None => DecodeWeight::F32(&w),
            };
            return Ok(kernels::skinny_matmul_nt(&hidden, weight)?);
        }
        Ok(hidden.matmul(&w.t()?)?.to_dtype(DType::F32)?)
    }

    /// Full-sequence logits `(batch, len, vocab)` of left-padded sequences (no gradient; tests
    /// and small batches).
    pub fn sequence_logits(&self, seqs: &[&[u32]], pad_id: u32) -> Result<Tensor> {
        let pb = PaddedBatch::new(seqs, pad_id)?;
        let hidden =
            self.hidden_states(&pb.ids, &pb.positions(), pb.batch, &pb.pads, None, false)?;
        Ok(self.logits(&hidden, None)?.reshape((pb.batch, pb.len, self.config.vocab_size))?)
    }

    /// Log-probabilities (and entropies) of each completion token given its prompt, under
    /// `softmax(logits / temperature)`. With `track`, `logprobs` carries gradients to
    /// [`Transformer::trainable_params`]; without, nothing is recorded (old/reference policy).
    pub fn completion_logprobs(
        &self,
        prompts: &[Vec<u32>],
        completions: &[Vec<u32>],
        temperature: f32,
        pad_id: u32,
        track: bool,
    ) -> Result<CompletionLogprobs> {
        self.completion_logprobs_masked(prompts, completions, &[], temperature, pad_id, track)
    }

    /// [`Transformer::completion_logprobs`] under constrained decoding's masks: `masks` is empty
    /// (no completion was constrained) or has one entry per completion, itself empty (free
    /// sampling) or one mask per token; a masked token's distribution is the softmax over the
    /// tokens its mask allows, the distribution the sampler drew it from.
    pub fn completion_logprobs_masked(
        &self,
        prompts: &[Vec<u32>],
        completions: &[Vec<u32>],
        masks: &[Vec<kernels::VocabMask>],
        temperature: f32,
        pad_id: u32,
        track: bool,
    ) -> Result<CompletionLogprobs> {
        let scoring = Scoring { temperature, pad_id, masks, targets: &[] };
        self.scored_completions(prompts, completions, &scoring, track, None)
    }

    /// [`Transformer::completion_logprobs`] with gradients, recorded for a layer-by-layer
    /// backward: back-propagate a loss built from `logprobs` with [`Tape::backward`] (a plain
    /// `backward()` would stop at the last layer). Same gradients; the activations of each layer
    /// are freed as soon as the backward has passed it, which lowers peak memory.
    /// `masks` as in [`Transformer::completion_logprobs_masked`].
    pub fn completion_logprobs_layered(
        &self,
        prompts: &[Vec<u32>],
        completions: &[Vec<u32>],
        masks: &[Vec<kernels::VocabMask>],
        temperature: f32,
        pad_id: u32,
    ) -> Result<(CompletionLogprobs, Tape)> {
        let mut tape = Tape::default();
        let scoring = Scoring { temperature, pad_id, masks, targets: &[] };
        let scored =
            self.scored_completions(prompts, completions, &scoring, true, Some(&mut tape))?;
        Ok((scored, tape))
    }

    /// Log-probability of `targets[i][t]` after `inputs[i][..=t]`, for every position of every
    /// sequence (Tinker's next-token alignment, where a target need not be the next input), in
    /// the [`CompletionLogprobs`] layout `(batch, max_len)`. With `track`, gradients flow as in
    /// [`Transformer::completion_logprobs`].
    pub fn next_token_logprobs(
        &self,
        inputs: &[Vec<u32>],
        targets: &[Vec<u32>],
        pad_id: u32,
        track: bool,
    ) -> Result<CompletionLogprobs> {
        if inputs.len() != targets.len()
            || inputs.iter().zip(targets).any(|(i, t)| i.is_empty() || i.len() != t.len())
        {
            return Err(WorkerError::InvalidArgument(
                "need one non-empty target list per input, as long as it".into(),
            ));
        }
        // Score as completions of the first token: the rows fed are exactly the inputs (the
        // completion's last token is never fed), and each position's target replaces the
        // completion token scored there.
        let prompts: Vec<Vec<u32>> = inputs.iter().map(|i| vec![i[0]]).collect();
        let completions: Vec<Vec<u32>> = inputs
            .iter()
            .zip(targets)
            .map(|(i, t)| i[1..].iter().copied().chain(t.last().copied()).collect())
            .collect();
        let scoring = Scoring { temperature: 1.0, pad_id, masks: &[], targets };
        self.scored_completions(&prompts, &completions, &scoring, track, None)
    }

    fn scored_completions(
        &self,
        prompts: &[Vec<u32>],
        completions: &[Vec<u32>],
        scoring: &Scoring<'_>,
        track: bool,
        tape: Option<&mut Tape>,
    ) -> Result<CompletionLogprobs> {
        let Scoring { temperature, pad_id, masks, targets: scored } = *scoring;
        if !scored.is_empty()
            && (scored.len() != completions.len()
                || scored.iter().zip(completions).any(|(t, c)| t.len() != c.len()))
        {
            return Err(WorkerError::InvalidArgument(
                "need no targets, or one per completion token".into(),
            ));
        }
        if !masks.is_empty()
            && (masks.len() != completions.len()
                || masks.iter().zip(completions).any(|(m, c)| !m.is_empty() && m.len() != c.len()))
        {
            return Err(WorkerError::InvalidArgument(
                "need no masks, or one list per completion with one mask per token".into(),
            ));
        }
        if prompts.len() != completions.len() || prompts.is_empty() {
            return Err(WorkerError::InvalidArgument(
                "need as many prompts as completions (at least one)".into(),
            ));
        }
        if prompts.iter().any(|p| p.is_empty()) {
            return Err(WorkerError::InvalidArgument("prompts must not be empty".into()));
        }
        let max_c = completions.iter().map(Vec::len).max().unwrap_or(0);
        let b = prompts.len();
        if max_c == 0 {
            let z = Tensor::zeros((b, 0), DType::F32, &self.device)?;
            return Ok(CompletionLogprobs { logprobs: z.clone(), entropy: z.clone(), mask: z });
        }
        let layout = PromptGroups::new(prompts, completions, pad_id)?;
        let hidden = self.grouped_hidden_states(&layout, track, tape)?;
        // Rows of `hidden` that predict each completion token, and the tokens themselves.
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        let mut vocab_masks = Vec::new();
        let masked = masks.iter().any(|m| !m.is_empty());
        let mut slot = vec![0u32; b * max_c];
        let mut mask = vec![0f32; b * max_c];
        for (i, (c, predicting)) in completions.iter().zip(&layout.predicting_rows).enumerate() {
            for (j, (&tok, &row)) in c.iter().zip(predicting).enumerate() {
                slot[i * max_c + j] = rows.len() as u32 + 1;
                mask[i * max_c + j] = 1.0;
                rows.push(row);
                targets.push(scored.get(i).map_or(tok, |t| t[j]));
                if masked {
                    vocab_masks.push(masks[i].get(j).cloned());
                }
            }
        }
        let picked = hidden.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
        let lm = self.lm_weight(self.trains_base(track))?;
        let out = match self.kernels {
            Kernels::Fused => {
                kernels::token_logprobs_masked(&picked, &lm, &targets, &vocab_masks, temperature)?
            }
            Kernels::Device | Kernels::Reference => kernels::token_logprobs_reference_masked(
                &picked,
                &lm,
                &targets,
                &vocab_masks,
                temperature,
            )?,
        };
        // Scatter the flat per-token values into (b, max_c), slot 0 being a zero pad.
        let padded = Tensor::cat(&[&Tensor::zeros((1, 2), DType::F32, &self.device)?, &out], 0)?;
        let grid = padded.index_select(&Tensor::new(slot.as_slice(), &self.device)?, 0)?;
        Ok(CompletionLogprobs {
            logprobs: grid.narrow(1, 0, 1)?.reshape((b, max_c))?,
            entropy: grid.narrow(1, 1, 1)?.reshape((b, max_c))?.detach(),
            mask: Tensor::from_vec(mask, (b, max_c), &self.device)?,
        })
    }

    /// Keys/values cache sized for this model.
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let c = &self.config;
        KvCache::new(
            c.num_hidden_layers,
            (batch, c.num_key_value_heads, c.head_dim),
            capacity,
            self.compute_dtype,
            &self.device,
        )
    }
}
