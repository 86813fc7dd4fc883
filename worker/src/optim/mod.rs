//! Training-step machinery: gradient accumulation over micro-batches, global grad-norm
//! clipping, AdamW (decoupled weight decay) and learning-rate schedules, with exact state
//! save/restore.
//!
//! Two paths compute the same update ([`OptimizerPath`]): fused parallel loops over host memory
//! for f32 parameters on the CPU, and candle tensor ops on the parameters' own device (CUDA), so
//! gradients, moments and clipping stay on the GPU and only the gradient norm (a metric) comes
//! back to the host each step. The tensor path runs on the CPU too, which is how the tests prove
//! the logic the GPU runs.

mod accumulate;
mod adamw;
pub mod policy_optimizer;
mod schedule;

pub use accumulate::GradAccumulator;
pub use adamw::{AdamW, AdamWConfig};
pub use schedule::LrSchedule;

use crate::error::{Result, WorkerError};
use candle_core::{DType, Tensor, Var};

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

/// Where the optimizer's arithmetic (accumulation, norm, AdamW) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerPath {
    /// Fused parallel loops over host memory: f32 parameters on the CPU only.
    FusedCpu,
    /// candle tensor ops on the parameters' device (any device; the GPU path), state in f32.
    Tensor,
}

impl OptimizerPath {
    /// The fused loops when every parameter is an f32 CPU tensor, else the tensor ops.
    pub fn for_params(params: &[(String, Var)]) -> Self {
        if params.iter().all(|(_, v)| v.device().is_cpu() && v.dtype() == DType::F32) {
            OptimizerPath::FusedCpu
        } else {
            OptimizerPath::Tensor
        }
    }
}
