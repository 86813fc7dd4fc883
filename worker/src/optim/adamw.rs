//! AdamW with decoupled weight decay: f32 moments per parameter, one update path per device
//! ([`OptimizerPath`]), and an exact save/restore of its state.

use super::{view_f32, GradAccumulator, OptimizerPath, PAR_CHUNK};
use crate::error::{Result, WorkerError};
use crate::safetensors_file::{pytorch_metadata, write_safetensors, PendingTensor};
use crate::weights::read_safetensors;
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Tensor, Var};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

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

/// AdamW's first and second moments of one parameter, in f32.
enum Moments {
    /// Host vectors, updated by the fused CPU loop.
    Host(Vec<f32>, Vec<f32>),
    /// Tensors on the parameter's device, updated by tensor ops.
    Device(Tensor, Tensor),
}

impl Moments {
    fn zeros(var: &Var, path: OptimizerPath) -> Result<Self> {
        let n = var.elem_count();
        Ok(match path {
            OptimizerPath::FusedCpu => Moments::Host(vec![0f32; n], vec![0f32; n]),
            OptimizerPath::Tensor => {
                let z = Tensor::zeros(n, DType::F32, var.device())?;
                Moments::Device(z.clone(), z)
            }
        })
    }

    fn from_host(m: Vec<f32>, v: Vec<f32>, var: &Var, path: OptimizerPath) -> Result<Self> {
        Ok(match path {
            OptimizerPath::FusedCpu => Moments::Host(m, v),
            OptimizerPath::Tensor => {
                let n = m.len();
                Moments::Device(
                    Tensor::from_vec(m, n, var.device())?,
                    Tensor::from_vec(v, n, var.device())?,
                )
            }
        })
    }

    /// Both moments as flat f32 CPU tensors.
    fn to_host(&self) -> Result<(Tensor, Tensor)> {
        Ok(match self {
            Moments::Host(m, v) => (
                Tensor::from_slice(m, m.len(), &Device::Cpu)?,
                Tensor::from_slice(v, v.len(), &Device::Cpu)?,
            ),
            Moments::Device(m, v) => (m.to_device(&Device::Cpu)?, v.to_device(&Device::Cpu)?),
        })
    }

    /// Both moments as tensors to write: host vectors in place, device tensors copied to the
    /// host only when written.
    fn to_write(&self) -> (PendingTensor<'_>, PendingTensor<'_>) {
        match self {
            Moments::Host(m, v) => (PendingTensor::f32_slice(m), PendingTensor::f32_slice(v)),
            Moments::Device(m, v) => (
                PendingTensor::converted(m.clone(), DType::F32),
                PendingTensor::converted(v.clone(), DType::F32),
            ),
        }
    }

    /// The same values on another path (for `var`'s device).
    fn on_path(self, var: &Var, path: OptimizerPath) -> Result<Self> {
        match (self, path) {
            (m @ Moments::Host(..), OptimizerPath::FusedCpu) => Ok(m),
            (m @ Moments::Device(..), OptimizerPath::Tensor) => Ok(m),
            (moments, path) => {
                let (m, v) = moments.to_host()?;
                Moments::from_host(m.to_vec1()?, v.to_vec1()?, var, path)
            }
        }
    }
}

/// The scalars of one AdamW update of one parameter.
#[derive(Clone, Copy)]
struct AdamScalars {
    grad_scale: f32,
    lr: f32,
    decay: f32,
    b1: f32,
    b2: f32,
    eps: f32,
    bias1: f32,
    bias2_sqrt: f32,
}

/// The tensor-op update of one parameter (any device): the same arithmetic as the fused loop.
fn tensor_update(
    var: &Var,
    grad: Option<&Tensor>,
    m: &mut Tensor,
    v: &mut Tensor,
    k: AdamScalars,
) -> Result<()> {
    // Detached, so that the update records no graph (the gradient sums are detached already).
    let p = var.as_tensor().detach().flatten_all()?;
    let g = match grad {
        Some(g) => g.affine(k.grad_scale as f64, 0.0)?,
        None => p.zeros_like()?,
    };
    *m = (m.affine(k.b1 as f64, 0.0)? + g.affine((1.0 - k.b1) as f64, 0.0)?)?;
    *v = (v.affine(k.b2 as f64, 0.0)? + g.sqr()?.affine((1.0 - k.b2) as f64, 0.0)?)?;
    let denom = v.sqrt()?.affine(1.0 / k.bias2_sqrt as f64, k.eps as f64)?;
    let update = (&*m / denom)?.affine((k.lr / k.bias1) as f64, 0.0)?;
    let p = (p.affine((1.0 - k.lr * k.decay) as f64, 0.0)? - update)?;
    Ok(var.set(&p.reshape(var.shape())?)?)
}

/// AdamW with f32 moments held per parameter, updated in one fused parallel loop on the CPU or
/// with tensor ops on the parameters' device (see [`OptimizerPath`]).
pub struct AdamW {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    step: u64,
    names: Vec<String>,
    moments: Vec<Moments>,
    path: OptimizerPath,
}

fn decays(name: &str) -> bool {
    !(name.ends_with(".bias") || name.contains("norm"))
}

struct AdamUpdate<'a> {
    grad: &'a [f32],
    moments: Mutex<(&'a mut [f32], &'a mut [f32])>,
    k: AdamScalars,
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
        let k = self.k;
        let step_size = k.lr / k.bias1;
        p.par_chunks_mut(PAR_CHUNK)
            .zip(self.grad.par_chunks(PAR_CHUNK))
            .zip(m.par_chunks_mut(PAR_CHUNK).zip(v.par_chunks_mut(PAR_CHUNK)))
            .for_each(|((p, g), (m, v))| {
                for i in 0..p.len() {
                    let g = g[i] * k.grad_scale;
                    m[i] = k.b1 * m[i] + (1.0 - k.b1) * g;
                    v[i] = k.b2 * v[i] + (1.0 - k.b2) * g * g;
                    p[i] *= 1.0 - k.lr * k.decay;
                    p[i] -= step_size * m[i] / (v[i].sqrt() / k.bias2_sqrt + k.eps);
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
    /// Zero moments for `params`, on the path their device calls for.
    pub fn new(config: AdamWConfig, params: &[(String, Var)]) -> Result<Self> {
        Self::with_path(config, params, OptimizerPath::for_params(params))
    }

    /// Zero moments for `params` on the given path.
    pub fn with_path(
        config: AdamWConfig,
        params: &[(String, Var)],
        path: OptimizerPath,
    ) -> Result<Self> {
        Ok(Self {
            config,
            step: 0,
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            moments: params.iter().map(|(_, v)| Moments::zeros(v, path)).collect::<Result<_>>()?,
            path,
        })
    }

    /// The path the moments live on.
    pub fn path(&self) -> OptimizerPath {
        self.path
    }

    /// Moves the moments to another path (exact: f32 either way).
    pub fn set_path(&mut self, params: &[(String, Var)], path: OptimizerPath) -> Result<()> {
        if params.len() != self.moments.len() {
            return Err(WorkerError::InvalidArgument(
                "parameter list does not match the optimizer".into(),
            ));
        }
        self.moments = std::mem::take(&mut self.moments)
            .into_iter()
            .zip(params)
            .map(|(m, (_, var))| m.on_path(var, path))
            .collect::<Result<_>>()?;
        self.path = path;
        Ok(())
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
        if params.len() != self.names.len()
            || grads.sums.len() != params.len()
            || self.moments.len() != params.len()
        {
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
            let k = AdamScalars {
                grad_scale,
                lr: lr as f32,
                decay: if decays(name) { c.weight_decay as f32 } else { 0.0 },
                b1: c.beta1 as f32,
                b2: c.beta2 as f32,
                eps: c.eps as f32,
                bias1: bias1 as f32,
                bias2_sqrt: bias2.sqrt() as f32,
            };
            match &mut self.moments[i] {
                Moments::Device(m, v) => tensor_update(var, grads.sums[i].as_ref(), m, v, k)?,
                Moments::Host(m, v) => {
                    if !var.device().is_cpu() {
                        return Err(WorkerError::Model(format!(
                            "{name} is not on the CPU: the fused optimizer path needs CPU \
                             parameters (use the tensor path)"
                        )));
                    }
                    let zeros;
                    let grad_tensor = match &grads.sums[i] {
                        Some(t) => t,
                        None => {
                            zeros = Tensor::zeros(m.len(), DType::F32, &Device::Cpu)?;
                            &zeros
                        }
                    };
                    view_f32(grad_tensor, |grad| {
                        let op = AdamUpdate { grad, moments: Mutex::new((m, v)), k };
                        Ok(var.as_tensor().inplace_op1(&op)?)
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Saves moments and step count to a safetensors file (exact, f32), one moment at a time:
    /// host moments are written in place, device moments copied to the host one by one.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors = Vec::with_capacity(self.names.len() * 2);
        for (name, moments) in self.names.iter().zip(&self.moments) {
            let (m, v) = moments.to_write();
            tensors.push((format!("exp_avg/{name}"), m));
            tensors.push((format!("exp_avg_sq/{name}"), v));
        }
        let mut meta = pytorch_metadata();
        meta.insert("step".to_string(), self.step.to_string());
        meta.insert("adamw".to_string(), serde_json::to_string(&self.config).unwrap_or_default());
        write_safetensors(path, &tensors, meta)
    }

    /// Restores a state written by [`AdamW::save`] for the same parameter list, on the path
    /// their device calls for.
    pub fn load(path: &Path, params: &[(String, Var)]) -> Result<Self> {
        Self::load_with_path(path, params, OptimizerPath::for_params(params))
    }

    /// [`AdamW::load`] onto the given path. The file is read one moment at a time (never whole).
    pub fn load_with_path(
        path: &Path,
        params: &[(String, Var)],
        on: OptimizerPath,
    ) -> Result<Self> {
        let mut stored: HashMap<String, Vec<f32>> = HashMap::new();
        let meta = read_safetensors(path, &Device::Cpu, |key, t| {
            let values = t
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()
                .map_err(|e| WorkerError::Model(format!("optimizer state `{key}`: {e}")))?;
            stored.insert(key, values);
            Ok(())
        })?;
        let step = meta
            .get("step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| WorkerError::Model("optimizer state lacks step".into()))?;
        let config: AdamWConfig = meta
            .get("adamw")
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| WorkerError::Model("optimizer state lacks its config".into()))?;
        let mut opt = Self { config, step, names: Vec::new(), moments: Vec::new(), path: on };
        let mut read = |key: String, n: usize| -> Result<Vec<f32>> {
            let data = stored
                .remove(&key)
                .ok_or_else(|| WorkerError::Model(format!("optimizer state lacks `{key}`")))?;
            if data.len() != n {
                return Err(WorkerError::Model(format!(
                    "optimizer state `{key}` has {} values, expected {n}",
                    data.len()
                )));
            }
            Ok(data)
        };
        for (name, var) in params {
            let m = read(format!("exp_avg/{name}"), var.elem_count())?;
            let v = read(format!("exp_avg_sq/{name}"), var.elem_count())?;
            opt.moments.push(Moments::from_host(m, v, var, on)?);
            opt.names.push(name.clone());
        }
        Ok(opt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two layers of parameters: the second one's gradient is computed from the first's
    /// output, an activation that records ops (as every layer's input in a model does).
    fn params_and_loss() -> (Vec<(String, Var)>, Tensor) {
        let a = Var::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], (2, 2), &Device::Cpu).unwrap();
        let w = Var::from_vec(vec![1.5f32, 0.5, -0.5, 1.0], (2, 2), &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1f32, 2.0], [3.0, -1.0]], &Device::Cpu).unwrap();
        let h = x.matmul(a.as_tensor()).unwrap();
        let loss = h.matmul(w.as_tensor()).unwrap().sqr().unwrap().sum_all().unwrap();
        (vec![("a".to_string(), a), ("w".to_string(), w)], loss)
    }

    #[test]
    fn the_tensor_path_keeps_no_graph_in_gradient_sums_or_moments() {
        let (params, loss) = params_and_loss();
        let mut acc = GradAccumulator::with_path(&params, OptimizerPath::Tensor);
        for _ in 0..2 {
            acc.accumulate(loss.backward().unwrap(), &params, 0.5).unwrap();
        }
        for sum in &acc.sums {
            let sum = sum.as_ref().expect("a gradient sum");
            assert!(!sum.track_op(), "a gradient sum records the graph it came from");
        }
        let mut opt =
            AdamW::with_path(AdamWConfig::default(), &params, OptimizerPath::Tensor).unwrap();
        for _ in 0..2 {
            opt.step(&params, &acc, 1e-2, 1.0).unwrap();
        }
        for moments in &opt.moments {
            let Moments::Device(m, v) = moments else { panic!("tensor-path moments") };
            assert!(!m.track_op() && !v.track_op(), "AdamW's moments record a graph");
        }
    }
}
