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
pub mod mask;
mod prefix;
mod rms_norm;
mod rope;
mod skinny;
mod softmax;
mod swiglu;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(target_arch = "x86_64")]
mod tiles;

pub use attention::attention_nograd;
pub use attention_train::{attention, attention_reference};
pub use bf16::Bf16Matrix;
pub use blas::{
    blas_core, blas_in_use, blas_library, matmul, serial_sgemm, set_fetched_openblas, sgemm,
    FetchOpenblas, Product,
};
pub use device::{attention_device, rms_norm_device};
pub use embedding::embedding;
pub use int8::{Int8Matrix, ScaleAxis};
pub use logprob::{
    mask_allows, token_logprobs, token_logprobs_masked, token_logprobs_reference,
    token_logprobs_reference_masked, VocabMask,
};
pub use lora::lora_matmul;
pub use prefix::{after_prefix, after_prefix_reference};
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
pub fn use_cpu_kernel(t: &Tensor) -> bool {
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

/// Idle rounds of a spinning thread between two yields of its core to the OS.
const SPIN_ROUNDS_PER_YIELD: u32 = 64;

/// [`on_pool`] for a decode loop on `device`: on the CPU, while `work` runs, the pool's other
/// threads stay awake, taking the halves of its parallel products as soon as they are queued,
/// instead of parking between them. A decode step runs some 150 small parallel products per token (four or five
/// per layer), and waking a parked thread for each (a futex call, then the scheduler's latency)
/// took about a fifth of a batch-1 step's time on a 2-core VM. The spinning threads run any of
/// the pool's work and give their core back to the OS every few rounds; they stop when `work`
/// returns. Off the CPU (a GPU decodes; the pool has nothing to do) nobody spins.
pub fn on_pool_for_decoding<R: Send>(
    device: &candle_core::Device,
    work: impl FnOnce() -> R + Send,
) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    let spin = device.is_cpu();
    on_pool(|| {
        if !spin || rayon::current_num_threads() < 2 {
            return work();
        }
        let done = AtomicBool::new(false);
        let me = rayon::current_thread_index();
        rayon::scope(|scope| {
            scope.spawn_broadcast(|_, thread| {
                if Some(thread.index()) == me {
                    return;
                }
                let mut idle = 0u32;
                while !done.load(Ordering::Acquire) {
                    if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                        idle = 0;
                        continue;
                    }
                    idle += 1;
                    if idle.is_multiple_of(SPIN_ROUNDS_PER_YIELD) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            });
            let out = work();
            done.store(true, Ordering::Release);
            out
        })
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn decoding_work_runs_with_spinning_helpers_nested_or_not_and_they_stop() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let cpu = candle_core::Device::Cpu;
        let sum =
            |n: u32| (0..n).into_par_iter().with_max_len(1).map(|i| u64::from(i * i)).sum::<u64>();
        pool.install(|| {
            // Many small parallel regions, as a decode step has, and one nested decoding call.
            let total = on_pool_for_decoding(&cpu, || {
                let inner = on_pool_for_decoding(&cpu, || sum(100));
                (0..200).map(|_| sum(64)).sum::<u64>() + inner
            });
            assert_eq!(total, 200 * 85_344 + 328_350);
            // The helpers have stopped: ordinary parallel work still completes.
            assert_eq!(sum(10), 285);
        });
        // From outside any pool, on the global pool.
        assert_eq!(on_pool_for_decoding(&cpu, || sum(64)), 85_344);
    }
}
