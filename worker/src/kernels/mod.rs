//! CPU kernels with hand-written backward passes for the trainable forward, and the device path.
//!
//! candle 0.11's fused `rms_norm`, `softmax_last_dim` and `rope` return no gradient, so each op
//! here is a candle custom op whose `bwd` is written by hand. Each public function dispatches: on
//! the CPU with f32 it runs the fused kernel, elsewhere (CUDA, or bf16 activations) the device
//! path ([`device`]: fused forward kernels with composed backward for RMS norm and the attention
//! softmax) or a differentiable composition of candle ops, which is also the reference the tests
//! compare against.

mod attention;
mod attention_train;
mod bf16;
mod blas;
pub mod device;
mod embedding;
mod int8;
mod logprob;
mod lora;
mod rms_norm;
mod rope;
mod skinny;
mod softmax;
mod swiglu;
#[cfg(target_arch = "x86_64")]
mod tiles;

pub use attention::attention_nograd;
pub use attention_train::{attention, attention_reference};
pub use bf16::Bf16Matrix;
pub use blas::{blas_core, blas_in_use, matmul, serial_sgemm, sgemm, Product};
pub use device::{attention_device, rms_norm_device};
pub use embedding::embedding;
pub use int8::{Int8Matrix, ScaleAxis};
pub use logprob::{token_logprobs, token_logprobs_reference};
pub use lora::lora_matmul;
pub use rms_norm::{rms_norm, rms_norm_reference};
pub use rope::{rope, rope_reference};
pub use skinny::{
    skinny_applies, skinny_matmul, skinny_matmul_many, skinny_matmul_nt, DecodeWeight,
    SKINNY_MAX_ROWS,
};
pub use softmax::masked_softmax_reference;
pub use swiglu::{swiglu, swiglu_matmul, swiglu_reference};

use candle_core::{bail, CpuStorage, Layout, Result, Tensor};

/// The contiguous f32 data of a storage under a layout.
fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let data = s.as_slice::<f32>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("kernel input must be contiguous"),
    }
}

/// Whether the fused CPU kernels apply to this tensor.
pub(crate) fn use_cpu_kernel(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == candle_core::DType::F32
}

/// Runs `f` on the contiguous f32 data of a CPU tensor.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => f(f32_slice(cpu, layout)?),
        _ => bail!("kernel expects a CPU tensor"),
    }
}

/// Runs `work` on a thread of the rayon pool (the caller blocks once): the parallel kernels it
/// calls then fork and join among the pool's own threads, which the calling thread joins,
/// instead of waking a sleeping outside thread at the end of each of the many small products of
/// a decode step.
pub fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return work();
    }
    rayon::scope(|_| work())
}

/// Threads for gemm calls inside kernels.
fn gemm_parallelism() -> gemm::Parallelism {
    let n = rayon::current_num_threads();
    if n > 1 {
        gemm::Parallelism::Rayon(n)
    } else {
        gemm::Parallelism::None
    }
}
