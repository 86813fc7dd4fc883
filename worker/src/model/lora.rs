//! LoRA adapters on chosen projections, saved and loaded in PEFT format
//! (`adapter_config.json` + `adapter_model.safetensors`).

use super::{Linear, Transformer};
use crate::error::{read_json, write_json, Result, WorkerError};
use candle_core::{DType, Tensor, Var};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// LoRA hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Adapter rank.
    pub r: usize,
    /// Scaling numerator: the update is `alpha / r * B A x`.
    pub lora_alpha: f64,
    /// Projection names to adapt (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`).
    pub target_modules: Vec<String>,
    /// Dropout on the adapter input during training forwards (PEFT's `lora_dropout`).
    #[serde(default)]
    pub lora_dropout: f64,
}

/// One adapter pair: `a` is `(r, in)`, `b` is `(out, r)`.
pub struct LoraAdapter {
    pub(crate) a: Var,
    pub(crate) b: Var,
    pub(crate) scale: f64,
}

const PEFT_PREFIX: &str = "base_model.model.";

/// Whether the projection named `module` is adapted under `targets`: named itself, or, for a
/// fused projection (Phi-3's `qkv_proj`, `gate_up_proj`), through one of the projections it
/// fuses, so the same target list adapts the same layers in every family.
fn targeted(module: &str, targets: &[String]) -> bool {
    let parts: &[&str] = match module {
        "qkv_proj" => &["q_proj", "k_proj", "v_proj"],
        "gate_up_proj" => &["gate_proj", "up_proj"],
        _ => &[],
    };
    targets.iter().any(|t| t == module || parts.contains(&t.as_str()))
}

impl Transformer {
    /// Adds adapters (A random as PEFT's Kaiming-uniform, B zero) on every targeted
    /// projection; from now on only adapters train.
    pub fn enable_lora(&mut self, config: LoraConfig, seed: u64) -> Result<()> {
        if config.r == 0 || config.target_modules.is_empty() {
            return Err(WorkerError::InvalidArgument(
                "LoRA needs r > 0 and at least one target module".into(),
            ));
        }
        if !(0.0..1.0).contains(&config.lora_dropout) {
            return Err(WorkerError::InvalidArgument(format!(
                "LoRA dropout must be in [0, 1), got {}",
                config.lora_dropout
            )));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let device = self.device.clone();
        let scale = config.lora_alpha / config.r as f64;
        let mut adapters = std::collections::BTreeMap::new();
        for lin in self.linears_mut() {
            let module = lin.path.rsplit('.').next().unwrap_or_default();
            if !targeted(module, &config.target_modules) {
                continue;
            }
            let (in_dim, out_dim) = lin.weight_t.dims2()?;
            let bound = 1.0 / (in_dim as f32).sqrt();
            let a: Vec<f32> =
                (0..config.r * in_dim).map(|_| rng.random_range(-bound..bound)).collect();
            let a = Var::from_tensor(&Tensor::from_vec(a, (config.r, in_dim), &device)?)?;
            let b = Var::zeros((out_dim, config.r), DType::F32, &device)?;
            adapters.insert(lin.path.clone(), LoraAdapter { a, b, scale });
        }
        if adapters.is_empty() {
            return Err(WorkerError::InvalidArgument(format!(
                "no projection matches {:?}",
                config.target_modules
            )));
        }
        self.lora = adapters;
        self.lora_config = Some(config);
        Ok(())
    }

    /// Adapter parameters with their PEFT names.
    pub fn lora_params(&self) -> Vec<(String, Var)> {
        let mut out = Vec::with_capacity(self.lora.len() * 2);
        for (path, ad) in &self.lora {
            out.push((format!("{PEFT_PREFIX}{path}.lora_A.weight"), ad.a.clone()));
            out.push((format!("{PEFT_PREFIX}{path}.lora_B.weight"), ad.b.clone()));
        }
        out
    }

    /// Writes `adapter_config.json` and `adapter_model.safetensors` (PEFT format) into `dir`.
    pub fn save_lora(&self, dir: &Path, base_model: &str) -> Result<()> {
        let cfg = self
            .lora_config
            .as_ref()
            .ok_or_else(|| WorkerError::InvalidArgument("LoRA is not enabled".into()))?;
        std::fs::create_dir_all(dir).map_err(|e| WorkerError::io("creating", dir, e))?;
        write_json(
            &dir.join("adapter_config.json"),
            &serde_json::json!({
                "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
                "r": cfg.r, "lora_alpha": cfg.lora_alpha, "target_modules": cfg.target_modules,
                "lora_dropout": cfg.lora_dropout, "bias": "none", "fan_in_fan_out": false, "inference_mode": true,
                "init_lora_weights": true, "modules_to_save": null, "use_rslora": false, "use_dora": false,
            }),
        )?;
        let tensors: Vec<(String, Tensor)> =
            self.lora_params().into_iter().map(|(n, v)| (n, v.as_tensor().clone())).collect();
        crate::weights::save_safetensors(
            &dir.join("adapter_model.safetensors"),
            &tensors,
            &HashMap::new(),
        )
    }

    /// Re-seeds the LoRA dropout masks; the trainer calls it once per step so that a resumed
    /// run draws the same masks as an uninterrupted one.
    pub fn seed_lora_dropout(&self, seed: u64) {
        let mut rng = self.lora_dropout_rng.lock().unwrap_or_else(|p| p.into_inner());
        *rng = rand::rngs::StdRng::seed_from_u64(seed);
    }

    /// `x` with LoRA dropout applied (inverted scaling) when training with `p > 0`.
    /// The adapter of `lin` when its product with `x` can run as one fused op (CPU f32, fused
    /// kernels, no dropout to apply): `None` leaves it to the plain composition.
    pub(super) fn one_op_lora(
        &self,
        lin: &Linear,
        x: &Tensor,
        track: bool,
    ) -> Option<&LoraAdapter> {
        let dropout = self.lora_config.as_ref().map(|c| c.lora_dropout).unwrap_or(0.0);
        let fusable = self.adapters_enabled && self.fused_cpu_rows(x) && (!track || dropout <= 0.0);
        self.lora.get(&lin.path).filter(|_| fusable)
    }

    pub(super) fn lora_dropout_input(&self, x: &Tensor, track: bool) -> Result<Tensor> {
        let p = self.lora_config.as_ref().map(|c| c.lora_dropout).unwrap_or(0.0);
        if !track || p <= 0.0 {
            return Ok(x.clone());
        }
        let keep = 1.0 - p;
        let mask: Vec<f32> = {
            let mut rng = self.lora_dropout_rng.lock().unwrap_or_else(|p| p.into_inner());
            (0..x.elem_count())
                .map(|_| if rng.random::<f64>() < keep { (1.0 / keep) as f32 } else { 0.0 })
                .collect()
        };
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        Ok((x * mask)?)
    }

    /// Loads a PEFT LoRA adapter folder written by [`Transformer::save_lora`] (or PEFT).
    pub fn load_lora(&mut self, dir: &Path) -> Result<()> {
        let raw: serde_json::Value = read_json(&dir.join("adapter_config.json"))?;
        let cfg: LoraConfig = serde_json::from_value(raw).map_err(|e| {
            WorkerError::Model(format!("{}/adapter_config.json: {e}", dir.display()))
        })?;
        let file = dir.join("adapter_model.safetensors");
        let mut tensors = HashMap::new();
        crate::weights::read_safetensors(&file, &self.device, |n, t| {
            tensors.insert(n, t);
            Ok(())
        })?;
        self.enable_lora(cfg, 0)?;
        for (name, var) in self.lora_params() {
            let t = tensors
                .get(&name)
                .ok_or_else(|| WorkerError::Model(format!("adapter lacks `{name}`")))?;
            if t.dims() != var.dims() {
                return Err(WorkerError::Model(format!(
                    "adapter `{name}` has shape {:?}, expected {:?}",
                    t.dims(),
                    var.dims()
                )));
            }
            var.set(&t.to_dtype(DType::F32)?)?;
        }
        Ok(())
    }
}
