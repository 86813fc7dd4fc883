//! Training-step machinery: gradient accumulation over micro-batches, global grad-norm
//! clipping, fused AdamW (decoupled weight decay) and learning-rate schedules, with exact
//! state save/restore.

use crate::error::{Result, WorkerError};
use crate::model::tape::Tape;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, Device, InplaceOp1, Layout, Tensor, Var};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// Elements per rayon task in the fused loops.
const PAR_CHUNK: usize = 1 << 15;

/// Runs `f` on the contiguous f32 data of a CPU tensor without copying.
fn view_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => {
            let (a, b) = layout
                .contiguous_offsets()
                .ok_or_else(|| WorkerError::Model("non-contiguous gradient".into()))?;
            f(&cpu.as_slice::<f32>()?[a..b])
        }
        _ => Err(WorkerError::Model("gradient is not on the CPU".into())),
    }
}

/// `dst += scale * src`, in place.
struct AddScaled<'a> {
    src: &'a [f32],
    scale: f32,
}

impl InplaceOp1 for AddScaled<'_> {
    fn name(&self) -> &'static str {
        "verity-add-scaled"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (a, b) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("accumulator not contiguous".into()))?;
        let CpuStorage::F32(data) = storage else { candle_core::bail!("accumulator must be f32") };
        let dst = &mut data[a..b];
        if dst.len() != self.src.len() {
            candle_core::bail!("gradient size changed between micro-batches");
        }
        dst.par_chunks_mut(PAR_CHUNK).zip(self.src.par_chunks(PAR_CHUNK)).for_each(|(d, s)| {
            d.iter_mut().zip(s).for_each(|(d, &s)| *d += self.scale * s);
        });
        Ok(())
    }
}

/// Sums gradients of the trainable parameters over micro-batches. The first micro-batch's
/// gradients are taken over without a copy; later ones are added in place (parallel), and
/// [`GradAccumulator::reset`] frees the memory between optimizer steps.
pub struct GradAccumulator {
    names: Vec<String>,
    sizes: Vec<usize>,
    sums: Vec<Option<Tensor>>,
    micro_batches: usize,
}

impl GradAccumulator {
    /// An empty accumulator for `params`.
    pub fn new(params: &[(String, Var)]) -> Self {
        Self {
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            sizes: params.iter().map(|(_, v)| v.elem_count()).collect(),
            sums: params.iter().map(|_| None).collect(),
            micro_batches: 0,
        }
    }

    /// Adds `scale * grad` of every parameter found in `grads` (consumed: its tensors are moved
    /// or freed as they are added) as one micro-batch. A parameter without a gradient
    /// contributes zero.
    pub fn accumulate(
        &mut self,
        grads: GradStore,
        params: &[(String, Var)],
        scale: f32,
    ) -> Result<()> {
        self.add(grads, params, scale)?;
        self.micro_batches += 1;
        Ok(())
    }

    /// [`GradAccumulator::accumulate`] for a loss built from
    /// [`crate::model::Transformer::completion_logprobs_layered`]: back-propagates it through
    /// its `tape` layer by layer, adding each layer's gradients in place as they come.
    pub fn accumulate_layered(
        &mut self,
        loss: &Tensor,
        tape: Tape,
        params: &[(String, Var)],
        scale: f32,
    ) -> Result<()> {
        tape.backward(loss, |grads| self.add(grads, params, scale))?;
        self.micro_batches += 1;
        Ok(())
    }

    fn add(&mut self, mut grads: GradStore, params: &[(String, Var)], scale: f32) -> Result<()> {
        if params.len() != self.sums.len() {
            return Err(WorkerError::InvalidArgument(
                "parameter list changed since the accumulator was made".into(),
            ));
        }
        for (i, (name, var)) in params.iter().enumerate() {
            let Some(g) = grads.remove(var.as_tensor()) else {
                continue;
            };
            if g.elem_count() != self.sizes[i] {
                return Err(WorkerError::Model(format!("gradient of {name} has the wrong size")));
            }
            let g = g.to_device(&Device::Cpu)?.to_dtype(candle_core::DType::F32)?;
            match &self.sums[i] {
                None => {
                    let owned = if scale == 1.0 {
                        g.contiguous()?
                    } else {
                        (g * scale as f64)?.contiguous()?
                    };
                    self.sums[i] = Some(owned.flatten_all()?);
                }
                Some(sum) => {
                    let g = g.contiguous()?;
                    view_f32(&g, |src| Ok(sum.inplace_op1(&AddScaled { src, scale })?))?;
                }
            }
        }
        Ok(())
    }

    /// Micro-batches accumulated since the last reset.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// L2 norm of all accumulated gradients together.
    pub fn global_norm(&self) -> f64 {
        self.sums
            .par_iter()
            .map(|s| match s {
                Some(t) => view_f32(t, |d| {
                    Ok(d.par_chunks(PAR_CHUNK)
                        .map(|c| c.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>())
                        .sum::<f64>())
                })
                .unwrap_or(f64::NAN),
                None => 0.0,
            })
            .sum::<f64>()
            .sqrt()
    }

    /// The factor that brings the global norm to at most `max_norm` (1.0 when already below,
    /// or when `max_norm` is not positive), and the norm before clipping.
    pub fn clip_factor(&self, max_norm: f64) -> (f32, f64) {
        let norm = self.global_norm();
        if max_norm > 0.0 && norm > max_norm {
            ((max_norm / (norm + 1e-6)) as f32, norm)
        } else {
            (1.0, norm)
        }
    }

    /// Frees the sums for the next optimizer step.
    pub fn reset(&mut self) {
        self.sums.iter_mut().for_each(|s| *s = None);
        self.micro_batches = 0;
    }

    /// The accumulated gradient of one parameter, by name (tests, diagnostics); `None` when the
    /// parameter is unknown, zeros when it got no gradient.
    pub fn get(&self, name: &str) -> Option<Vec<f32>> {
        let i = self.names.iter().position(|n| n == name)?;
        match &self.sums[i] {
            Some(t) => t.to_vec1().ok(),
            None => Some(vec![0.0; self.sizes[i]]),
        }
    }
}

/// AdamW hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (not applied to biases and norm weights, as HF Trainer does).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

/// Learning-rate schedule: linear warmup, then constant or cosine decay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Steps of linear warmup from 0.
    pub warmup_steps: u64,
    /// Total steps (cosine reaches `min_lr_ratio * lr` here).
    pub total_steps: u64,
    /// Cosine decay after warmup (else constant).
    pub cosine: bool,
    /// Floor of the cosine as a fraction of `lr`.
    pub min_lr_ratio: f64,
}

impl LrSchedule {
    /// A constant rate with no warmup.
    pub fn constant(lr: f64) -> Self {
        Self { lr, warmup_steps: 0, total_steps: 0, cosine: false, min_lr_ratio: 0.0 }
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if !self.cosine || self.total_steps <= self.warmup_steps {
            return self.lr;
        }
        let progress = ((step - self.warmup_steps) as f64
            / (self.total_steps - self.warmup_steps) as f64)
            .min(1.0);
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cos)
    }
}

/// AdamW with f32 moments held per parameter, updated in one fused parallel loop.
pub struct AdamW {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    step: u64,
    names: Vec<String>,
    exp_avg: Vec<Vec<f32>>,
    exp_avg_sq: Vec<Vec<f32>>,
}

fn decays(name: &str) -> bool {
    !(name.ends_with(".bias") || name.contains("norm"))
}

struct AdamUpdate<'a> {
    grad: &'a [f32],
    moments: Mutex<(&'a mut [f32], &'a mut [f32])>,
    grad_scale: f32,
    lr: f32,
    decay: f32,
    b1: f32,
    b2: f32,
    eps: f32,
    bias1: f32,
    bias2_sqrt: f32,
}

impl AdamUpdate<'_> {
    fn apply(&self, p: &mut [f32]) -> Result<()> {
        let mut guard = self
            .moments
            .lock()
            .map_err(|_| WorkerError::Model("optimizer state poisoned".into()))?;
        let (m, v) = &mut *guard;
        if p.len() != self.grad.len() || m.len() != p.len() {
            return Err(WorkerError::Model("optimizer state does not match the parameter".into()));
        }
        let step_size = self.lr / self.bias1;
        p.par_chunks_mut(PAR_CHUNK)
            .zip(self.grad.par_chunks(PAR_CHUNK))
            .zip(m.par_chunks_mut(PAR_CHUNK).zip(v.par_chunks_mut(PAR_CHUNK)))
            .for_each(|((p, g), (m, v))| {
                for i in 0..p.len() {
                    let g = g[i] * self.grad_scale;
                    m[i] = self.b1 * m[i] + (1.0 - self.b1) * g;
                    v[i] = self.b2 * v[i] + (1.0 - self.b2) * g * g;
                    p[i] *= 1.0 - self.lr * self.decay;
                    p[i] -= step_size * m[i] / (v[i].sqrt() / self.bias2_sqrt + self.eps);
                }
            });
        Ok(())
    }
}

impl InplaceOp1 for AdamUpdate<'_> {
    fn name(&self) -> &'static str {
        "verity-adamw"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (a, b) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("parameter not contiguous".into()))?;
        let data = match storage {
            CpuStorage::F32(d) => d,
            _ => candle_core::bail!("AdamW expects f32 parameters"),
        };
        self.apply(&mut data[a..b]).map_err(|e| candle_core::Error::Msg(e.to_string()))
    }
}

impl AdamW {
    /// Zero moments for `params`.
    pub fn new(config: AdamWConfig, params: &[(String, Var)]) -> Self {
        Self {
            config,
            step: 0,
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            exp_avg: params.iter().map(|(_, v)| vec![0f32; v.elem_count()]).collect(),
            exp_avg_sq: params.iter().map(|(_, v)| vec![0f32; v.elem_count()]).collect(),
        }
    }

    /// Optimizer steps taken.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// One update of every parameter from the accumulated gradients times `grad_scale`
    /// (e.g. the clip factor divided by the number of micro-batches) at learning rate `lr`.
    pub fn step(
        &mut self,
        params: &[(String, Var)],
        grads: &GradAccumulator,
        lr: f64,
        grad_scale: f32,
    ) -> Result<()> {
        if params.len() != self.names.len() || grads.sums.len() != params.len() {
            return Err(WorkerError::InvalidArgument(
                "parameter list does not match the optimizer".into(),
            ));
        }
        self.step += 1;
        let c = &self.config;
        let bias1 = 1.0 - c.beta1.powi(self.step as i32);
        let bias2 = 1.0 - c.beta2.powi(self.step as i32);
        for (i, (name, var)) in params.iter().enumerate() {
            if name != &self.names[i] {
                return Err(WorkerError::InvalidArgument(format!(
                    "parameter {i} is {name}, optimizer has {}",
                    self.names[i]
                )));
            }
            let zeros;
            let grad_tensor = match &grads.sums[i] {
                Some(t) => t,
                None => {
                    zeros = Tensor::zeros(
                        self.exp_avg[i].len(),
                        candle_core::DType::F32,
                        &Device::Cpu,
                    )?;
                    &zeros
                }
            };
            view_f32(grad_tensor, |grad| {
                let op = AdamUpdate {
                    grad,
                    moments: Mutex::new((&mut self.exp_avg[i], &mut self.exp_avg_sq[i])),
                    grad_scale,
                    lr: lr as f32,
                    decay: if decays(name) { c.weight_decay as f32 } else { 0.0 },
                    b1: c.beta1 as f32,
                    b2: c.beta2 as f32,
                    eps: c.eps as f32,
                    bias1: bias1 as f32,
                    bias2_sqrt: bias2.sqrt() as f32,
                };
                if var.device().is_cpu() {
                    var.as_tensor().inplace_op1(&op)?;
                } else {
                    let mut p: Vec<f32> = var.as_tensor().flatten_all()?.to_vec1()?;
                    op.apply(&mut p)?;
                    var.set(&Tensor::from_vec(p, var.shape(), var.device())?)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Saves moments and step count to a safetensors file (exact, f32).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = Vec::with_capacity(self.names.len() * 2);
        for (i, name) in self.names.iter().enumerate() {
            let n = self.exp_avg[i].len();
            tensors.push((
                format!("exp_avg/{name}"),
                Tensor::from_slice(&self.exp_avg[i], n, &Device::Cpu)?,
            ));
            tensors.push((
                format!("exp_avg_sq/{name}"),
                Tensor::from_slice(&self.exp_avg_sq[i], n, &Device::Cpu)?,
            ));
        }
        let mut meta = HashMap::from([
            ("step".to_string(), self.step.to_string()),
            ("adamw".to_string(), serde_json::to_string(&self.config).unwrap_or_default()),
        ]);
        meta.insert("format".into(), "pt".into());
        safetensors::serialize_to_file(
            tensors.iter().map(|(n, t)| (n.as_str(), t)),
            Some(meta),
            path,
        )
        .map_err(|e| WorkerError::Model(format!("writing {}: {e}", path.display())))
    }

    /// Restores a state written by [`AdamW::save`] for the same parameter list.
    pub fn load(path: &Path, params: &[(String, Var)]) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| WorkerError::io("reading", path, e))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| WorkerError::Model(format!("{}: {e}", path.display())))?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| WorkerError::Model(format!("{}: {e}", path.display())))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        let step = meta
            .get("step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| WorkerError::Model("optimizer state lacks step".into()))?;
        let config: AdamWConfig = meta
            .get("adamw")
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| WorkerError::Model("optimizer state lacks its config".into()))?;
        let mut opt = Self::new(config, params);
        opt.step = step;
        let read = |key: String, n: usize| -> Result<Vec<f32>> {
            let view = st
                .tensor(&key)
                .map_err(|e| WorkerError::Model(format!("optimizer state `{key}`: {e}")))?;
            let data: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if data.len() != n {
                return Err(WorkerError::Model(format!(
                    "optimizer state `{key}` has {} values, expected {n}",
                    data.len()
                )));
            }
            Ok(data)
        };
        for (i, (name, var)) in params.iter().enumerate() {
            opt.exp_avg[i] = read(format!("exp_avg/{name}"), var.elem_count())?;
            opt.exp_avg_sq[i] = read(format!("exp_avg_sq/{name}"), var.elem_count())?;
        }
        Ok(opt)
    }
}
