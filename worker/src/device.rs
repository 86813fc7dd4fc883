//! Device selection: `cpu` or `cuda:N`.

use crate::error::{Result, WorkerError};
use candle_core::{DType, Device};

/// The environment variable that overrides [`default_compute_dtype`]: `f32` or `bf16`.
pub const PRECISION_ENV: &str = "VERITY_PRECISION";

/// The compute dtype of a model loaded on `device`: bf16 activations over f32 master weights
/// (mixed precision) on a GPU, f32 on the CPU, whose fused kernels are f32. `VERITY_PRECISION`
/// (`f32` or `bf16`) overrides it on every device.
pub fn default_compute_dtype(device: &Device) -> Result<DType> {
    match std::env::var(PRECISION_ENV) {
        Ok(v) => parse_precision(&v),
        Err(_) if device.is_cpu() => Ok(DType::F32),
        Err(_) => Ok(DType::BF16),
    }
}

/// Parses a precision name (`f32`, `bf16`).
pub fn parse_precision(name: &str) -> Result<DType> {
    match name.trim().to_ascii_lowercase().as_str() {
        "f32" | "fp32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        other => {
            Err(WorkerError::InvalidArgument(format!("{PRECISION_ENV}={other}: use f32 or bf16")))
        }
    }
}

/// Parses a device spec (`cpu`, `cuda`, `cuda:N`) into a candle device.
pub fn parse_device(spec: &str) -> Result<Device> {
    let spec = spec.trim();
    if spec.eq_ignore_ascii_case("cpu") {
        return Ok(Device::Cpu);
    }
    let ordinal = match spec.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => {
            rest.strip_prefix(':').and_then(|n| n.parse::<usize>().ok()).ok_or_else(|| {
                WorkerError::InvalidArgument(format!("bad device `{spec}` (use cpu or cuda:N)"))
            })?
        }
        None => {
            return Err(WorkerError::InvalidArgument(format!(
                "unknown device `{spec}` (use cpu or cuda:N)"
            )))
        }
    };
    cuda_device(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> Result<Device> {
    Ok(Device::new_cuda(ordinal)?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> Result<Device> {
    Err(WorkerError::InvalidArgument(format!(
        "cuda:{ordinal} requested but verity-worker was built without the `cuda` feature"
    )))
}

/// The most memory (MiB) the GPU's default memory pool, where candle allocates, has held since
/// the last [`reset_gpu_memory_peak`] (or the process start); `None` on the CPU.
pub fn gpu_memory_peak_mib(device: &Device) -> Option<f64> {
    gpu_pool::peak_bytes(device).map(|b| b as f64 / (1024.0 * 1024.0))
}

/// Starts a new [`gpu_memory_peak_mib`] measurement from what the pool holds now.
pub fn reset_gpu_memory_peak(device: &Device) {
    gpu_pool::reset_peak(device);
}

#[cfg(feature = "cuda")]
mod gpu_pool {
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::Device;

    /// The default memory pool of `device`'s GPU, with its context bound to this thread.
    fn pool(device: &Device) -> Option<sys::CUmemoryPool> {
        let Device::Cuda(dev) = device else { return None };
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread().ok()?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and the device handle is the context's own.
        let rc = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
        (rc == sys::CUresult::CUDA_SUCCESS).then_some(pool)
    }

    /// A u64 attribute of the pool.
    fn attribute(device: &Device, attr: sys::CUmemPool_attribute) -> Option<u64> {
        let pool = pool(device)?;
        let mut value = 0u64;
        // SAFETY: the memory attributes are cuuint64_t, read into a u64.
        let rc = unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) };
        (rc == sys::CUresult::CUDA_SUCCESS).then_some(value)
    }

    pub(super) fn peak_bytes(device: &Device) -> Option<u64> {
        attribute(device, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    pub(super) fn reset_peak(device: &Device) {
        if let Some(pool) = pool(device) {
            let mut zero = 0u64;
            // SAFETY: setting USED_MEM_HIGH to 0 (the only value allowed) resets it to the
            // current use; the pointer is to a live u64.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                );
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod gpu_pool {
    use candle_core::Device;

    pub(super) fn peak_bytes(_: &Device) -> Option<u64> {
        None
    }

    pub(super) fn reset_peak(_: &Device) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_rejects_garbage() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(parse_device("tpu:0").is_err());
        assert!(parse_device("cuda:x").is_err());
    }

    #[test]
    fn precision_names() {
        assert_eq!(parse_precision("bf16").unwrap(), DType::BF16);
        assert_eq!(parse_precision(" F32 ").unwrap(), DType::F32);
        assert!(parse_precision("f16").is_err());
    }
}
