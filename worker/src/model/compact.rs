//! bf16 copies of the weights a decode step streams (the rollout precision `bf16`): built once
//! per sampling call from the current f32 parameters, read by the no-grad products only.

use super::Transformer;
use crate::error::Result;
use crate::kernels::Bf16Matrix;
use std::collections::HashMap;
pub use verity_core::spec::RolloutDtype;

/// bf16 copies of every projection weight (by HF module path) and of the LM head.
pub struct CompactWeights {
    linears: HashMap<String, Bf16Matrix>,
    lm_head: Bf16Matrix,
}

impl CompactWeights {
    /// Rounds the model's current projection and LM-head weights to bf16.
    pub fn of(model: &Transformer) -> Result<Self> {
        let linears = model
            .layers
            .iter()
            .flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down])
            .map(|lin| Ok((lin.path.clone(), Bf16Matrix::from_tensor(lin.weight_t.as_tensor())?)))
            .collect::<Result<_>>()?;
        let lm_head =
            Bf16Matrix::from_tensor(model.lm_head.as_ref().unwrap_or(&model.embed).as_tensor())?;
        Ok(Self { linears, lm_head })
    }

    /// The copy of the projection at `path` (`(in, out)`, like the f32 one).
    pub(super) fn linear(&self, path: &str) -> Option<&Bf16Matrix> {
        self.linears.get(path)
    }

    /// The copy of the LM head `(vocab, hidden)`.
    pub(super) fn lm_head(&self) -> &Bf16Matrix {
        &self.lm_head
    }
}
