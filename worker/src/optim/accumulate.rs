//! Gradient accumulation over micro-batches: the sums the optimizer steps with, and their
//! global norm for clipping.

use super::{view_f32, OptimizerPath, PAR_CHUNK};
use crate::error::{Result, WorkerError};
use crate::model::tape::Tape;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Tensor, Var};
use rayon::prelude::*;

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

/// Sums gradients of the trainable parameters over micro-batches, in f32 on the parameters'
/// device ([`OptimizerPath::Tensor`]) or in host memory ([`OptimizerPath::FusedCpu`]). The first
/// micro-batch's gradients are taken over without a copy; later ones are added (in place and in
/// parallel on the fused path), and [`GradAccumulator::reset`] frees the memory between
/// optimizer steps.
pub struct GradAccumulator {
    names: Vec<String>,
    sizes: Vec<usize>,
    pub(super) sums: Vec<Option<Tensor>>,
    micro_batches: usize,
    path: OptimizerPath,
}

impl GradAccumulator {
    /// An empty accumulator for `params` on the path their device calls for.
    pub fn new(params: &[(String, Var)]) -> Self {
        Self::with_path(params, OptimizerPath::for_params(params))
    }

    /// An empty accumulator for `params` on the given path.
    pub fn with_path(params: &[(String, Var)], path: OptimizerPath) -> Self {
        Self {
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            sizes: params.iter().map(|(_, v)| v.elem_count()).collect(),
            sums: params.iter().map(|_| None).collect(),
            micro_batches: 0,
            path,
        }
    }

    /// The path the sums live on.
    pub fn path(&self) -> OptimizerPath {
        self.path
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
            // Detached: candle records the backward's ops too, so a gradient kept as it comes
            // holds the forward's whole graph (every activation) alive for as long as the sum,
            // and through AdamW's moments for every later step.
            let Some(g) = grads.remove(var.as_tensor()).map(|g| g.detach()) else {
                continue;
            };
            if g.elem_count() != self.sizes[i] {
                return Err(WorkerError::Model(format!("gradient of {name} has the wrong size")));
            }
            let g = match self.path {
                OptimizerPath::FusedCpu => g.to_device(&Device::Cpu)?.to_dtype(DType::F32)?,
                OptimizerPath::Tensor => g.to_dtype(DType::F32)?,
            };
            let scaled = |g: Tensor| -> Result<Tensor> {
                let g = if scale == 1.0 { g } else { (g * scale as f64)? };
                Ok(g.contiguous()?.flatten_all()?)
            };
            self.sums[i] = Some(match (self.sums[i].take(), self.path) {
                (None, _) => scaled(g)?,
                (Some(sum), OptimizerPath::FusedCpu) => {
                    let g = g.contiguous()?;
                    view_f32(&g, |src| Ok(sum.inplace_op1(&AddScaled { src, scale })?))?;
                    sum
                }
                (Some(sum), OptimizerPath::Tensor) => (sum + scaled(g)?)?,
            });
        }
        Ok(())
    }

    /// Micro-batches accumulated since the last reset.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// L2 norm of all accumulated gradients together (NaN when it cannot be computed, which
    /// the trainer treats as a non-finite gradient). On the tensor path the squares are summed
    /// on the device and one scalar comes back.
    pub fn global_norm(&self) -> f64 {
        let squares = match self.path {
            OptimizerPath::FusedCpu => Ok(self
                .sums
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
                .sum::<f64>()),
            OptimizerPath::Tensor => self.device_sum_of_squares(),
        };
        match squares {
            Ok(s) => s.sqrt(),
            Err(e) => {
                tracing::error!(error = %e, "could not compute the gradient norm");
                f64::NAN
            }
        }
    }

    fn device_sum_of_squares(&self) -> Result<f64> {
        let parts = self
            .sums
            .iter()
            .flatten()
            .map(|t| Ok(t.sqr()?.sum_all()?.reshape(1)?))
            .collect::<Result<Vec<_>>>()?;
        if parts.is_empty() {
            return Ok(0.0);
        }
        Ok(Tensor::cat(&parts, 0)?.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?)
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
