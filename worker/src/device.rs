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
