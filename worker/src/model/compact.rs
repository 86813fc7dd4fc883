//! Low-precision copies of the weights a decode step streams (the rollout precisions `bf16` and
//! `int8`): built once per sampling call from the current f32 parameters, read by the no-grad
//! products only.

use super::Transformer;
use crate::error::{Result, WorkerError};
use candle_core::Tensor;
use std::collections::HashMap;
use std::sync::Arc;
pub use verity_core::spec::RolloutDtype;
use verity_kernels::{Bf16Matrix, DecodeWeight, Int8Matrix, ScaleAxis};

/// One weight's copy.
enum CompactMatrix {
    Bf16(Bf16Matrix),
    Int8(Int8Matrix),
}

impl CompactMatrix {
    /// The copy of `t` in `dtype`, int8 scaled per output channel on `axis`; `f32` has no copy.
    fn of(t: &Tensor, dtype: RolloutDtype, axis: ScaleAxis) -> Result<Self> {
        Ok(match dtype {
            RolloutDtype::Int8 => CompactMatrix::Int8(Int8Matrix::from_tensor(t, axis)?),
            RolloutDtype::Bf16 => CompactMatrix::Bf16(Bf16Matrix::from_tensor(t)?),
            RolloutDtype::F32 => {
                return Err(WorkerError::InvalidArgument(
                    "f32 decoding reads the weights themselves; there is no f32 copy".into(),
                ))
            }
        })
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        match self {
            CompactMatrix::Bf16(b) => b.bytes(),
            CompactMatrix::Int8(q) => q.bytes(),
        }
    }

    fn decode_weight(&self) -> DecodeWeight<'_> {
        match self {
            CompactMatrix::Bf16(b) => DecodeWeight::Bf16(b),
            CompactMatrix::Int8(q) => DecodeWeight::Int8(q),
        }
    }
}

/// Copies of every projection weight (by HF module path) and of the LM head.
pub struct CompactWeights {
    linears: HashMap<String, CompactMatrix>,
    lm_head: CompactMatrix,
}

impl CompactWeights {
    /// The copies a sampling call on `model` reads for rollout precision `dtype`: none for
    /// `f32`, and none off the CPU (a GPU decodes from its own weights; it is not
    /// bandwidth-starved the way the CPU kernels are).
    pub fn for_rollouts(model: &Transformer, dtype: RolloutDtype) -> Result<Option<Arc<Self>>> {
        if dtype == RolloutDtype::F32 || !model.device().is_cpu() {
            return Ok(None);
        }
        Ok(Some(Arc::new(Self::of(model, dtype)?)))
    }

    /// Rounds the model's current projection and LM-head weights to `dtype` (`bf16` or `int8`;
    /// `f32` is an error: it has no copies, see [`CompactWeights::for_rollouts`]).
    pub fn of(model: &Transformer, dtype: RolloutDtype) -> Result<Self> {
        let linears = model
            .layers
            .iter()
            .flat_map(|l| l.linears())
            .map(|lin| {
                let copy = CompactMatrix::of(lin.weight_t.as_tensor(), dtype, ScaleAxis::Columns)?;
                Ok((lin.path.clone(), copy))
            })
            .collect::<Result<_>>()?;
        let head = model.lm_head.as_ref().unwrap_or(&model.embed).as_tensor();
        let lm_head = CompactMatrix::of(head, dtype, ScaleAxis::Rows)?;
        Ok(Self { linears, lm_head })
    }

    /// Bytes the copies hold.
    pub fn bytes(&self) -> usize {
        self.linears.values().map(CompactMatrix::bytes).sum::<usize>() + self.lm_head.bytes()
    }

    /// The copy of the projection at `path` (`(in, out)`, like the f32 one).
    pub(super) fn linear(&self, path: &str) -> Option<DecodeWeight<'_>> {
        self.linears.get(path).map(CompactMatrix::decode_weight)
    }

    /// The copy of the LM head `(vocab, hidden)`.
    pub(super) fn lm_head(&self) -> DecodeWeight<'_> {
        self.lm_head.decode_weight()
    }
}
