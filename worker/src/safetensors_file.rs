//! Writing safetensors files one tensor at a time: each tensor's bytes are laid out only when the
//! writer reaches it, so that saving a model or an optimizer state holds one tensor's copy at a
//! time instead of a second copy of everything it writes (for a 135M-parameter model's full
//! checkpoint that copy was 1.6 GiB: the weights and AdamW's two moments).

use crate::error::{Result, WorkerError};
use candle_core::{DType, Device, Tensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// Makes the bytes of one tensor when the writer reaches it.
type MakeBytes<'a> = Box<dyn Fn() -> Result<Cow<'a, [u8]>> + 'a>;

/// One tensor to write: its shape and dtype now, its bytes when written.
pub struct PendingTensor<'a> {
    shape: Vec<usize>,
    dtype: DType,
    bytes: MakeBytes<'a>,
}

impl<'a> PendingTensor<'a> {
    /// `tensor` (any layout, any device) converted to `dtype` and laid out contiguously on the
    /// host when written. The tensor shares its storage until then: nothing is copied now.
    pub fn converted(tensor: Tensor, dtype: DType) -> Self {
        Self {
            shape: tensor.dims().to_vec(),
            dtype,
            bytes: Box::new(move || {
                let host = tensor.to_dtype(dtype)?.to_device(&Device::Cpu)?.contiguous()?;
                // One copy of this one tensor (candle's own view of a host tensor as bytes).
                Ok(Cow::Owned(safetensors::View::data(&host).into_owned()))
            }),
        }
    }

    /// A flat f32 tensor written straight from `values`, without a copy.
    pub fn f32_slice(values: &'a [f32]) -> Self {
        Self {
            shape: vec![values.len()],
            dtype: DType::F32,
            bytes: Box::new(move || Ok(Cow::Borrowed(bytemuck::cast_slice(values)))),
        }
    }

    fn len_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }
}

/// The `format: pt` metadata transformers expects of a weights file.
pub fn pytorch_metadata() -> HashMap<String, String> {
    HashMap::from([("format".to_string(), "pt".to_string())])
}

/// Writes `tensors` and `metadata` to one safetensors file, one tensor's bytes at a time; the
/// file appears complete or not at all (the library writes a sibling temporary file and renames
/// it), and a tensor that cannot be laid out fails the write naming it.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, PendingTensor<'_>)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let failure = Mutex::new(None);
    let views = tensors
        .iter()
        .map(|(name, tensor)| (name.as_str(), WrittenTensor { name, tensor, failure: &failure }));
    let written = safetensors::serialize_to_file(views, Some(metadata), path);
    let failure = failure.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(error) = failure {
        // The library has renamed its temporary file into place: the file is not a checkpoint.
        let _ = std::fs::remove_file(path);
        return Err(error);
    }
    written.map_err(|e| WorkerError::Model(format!("writing {}: {e}", path.display())))
}

/// A pending tensor as the safetensors writer sees it. The writer's `View::data` cannot fail, so
/// a tensor that cannot be laid out writes no bytes and leaves its error in `failure`.
struct WrittenTensor<'t, 'a> {
    name: &'t str,
    tensor: &'t PendingTensor<'a>,
    failure: &'t Mutex<Option<WorkerError>>,
}

impl WrittenTensor<'_, '_> {
    fn fail(&self, error: WorkerError) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure
            .get_or_insert(WorkerError::Model(format!("writing tensor `{}`: {error}", self.name)));
    }
}

impl safetensors::View for WrittenTensor<'_, '_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.tensor.dtype.into()
    }

    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match (self.tensor.bytes)() {
            Ok(bytes) if bytes.len() == self.tensor.len_bytes() => bytes,
            Ok(bytes) => {
                self.fail(WorkerError::Model(format!(
                    "{} bytes laid out for {} expected",
                    bytes.len(),
                    self.tensor.len_bytes()
                )));
                Cow::Borrowed(&[])
            }
            Err(error) => {
                self.fail(error);
                Cow::Borrowed(&[])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.tensor.len_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::read_safetensors;

    /// The tensors of a file by name, and its metadata.
    fn read_back(path: &Path) -> (HashMap<String, Tensor>, HashMap<String, String>) {
        let mut out = HashMap::new();
        let metadata = read_safetensors(path, &Device::Cpu, |name, t| {
            out.insert(name, t);
            Ok(())
        })
        .unwrap();
        (out, metadata)
    }

    #[test]
    fn pending_tensors_are_written_as_their_dtype_layout_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let square = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::Cpu).unwrap();
        let moments = vec![0.5f32, -0.25, 8.0];
        let tensors = vec![
            // A transposed view is laid out contiguously when written.
            ("t".to_string(), PendingTensor::converted(square.t().unwrap(), DType::F32)),
            ("b".to_string(), PendingTensor::converted(square.clone(), DType::BF16)),
            ("m".to_string(), PendingTensor::f32_slice(&moments)),
        ];
        write_safetensors(&path, &tensors, pytorch_metadata()).unwrap();
        let (back, metadata) = read_back(&path);
        let values = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(values(&back["t"]), values(&square.t().unwrap()));
        assert_eq!(back["b"].dtype(), DType::BF16);
        assert_eq!(values(&back["b"]), values(&square), "small integers are exact in bf16");
        assert_eq!(back["m"].to_vec1::<f32>().unwrap(), moments);
        assert_eq!(metadata, pytorch_metadata());
    }

    #[test]
    fn a_tensor_that_cannot_be_laid_out_fails_the_write_by_name_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let good = [1f32, 2.0];
        let bad = PendingTensor {
            shape: vec![4],
            dtype: DType::F32,
            bytes: Box::new(|| Err(WorkerError::Model("the device went away".into()))),
        };
        let tensors =
            vec![("good".to_string(), PendingTensor::f32_slice(&good)), ("bad".to_string(), bad)];
        let err = write_safetensors(&path, &tensors, pytorch_metadata()).unwrap_err().to_string();
        assert!(err.contains("`bad`") && err.contains("the device went away"), "{err}");
        assert!(!path.exists(), "a failed write left a file behind");
    }
}
