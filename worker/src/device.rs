//! Device selection: `cpu` or `cuda:N`.

use crate::error::{Result, WorkerError};
use candle_core::Device;

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
}
