//! Embedding lookup whose backward allocates the (vocab × hidden) gradient once.
//!
//! candle's `index_select` backward builds that gradient as `zeros_like(weight).index_add(..)`:
//! two tensors the size of the embedding table (113 MB each for SmolLM2), both alive at once,
//! at the very end of the backward when every other gradient already exists.

use super::{f32_slice, use_cpu_kernel, with_f32};
use candle_core::{bail, CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Rows `ids` of the table `weight` `(vocab, hidden)`: `(ids.len(), hidden)`, differentiable in
/// `weight`. Ids must be inside the vocabulary.
pub fn embedding(weight: &Tensor, ids: &[u32]) -> Result<Tensor> {
    let (vocab, _) = weight.dims2()?;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("token id {bad} outside a vocabulary of {vocab}")
    }
    if use_cpu_kernel(weight) {
        weight.contiguous()?.apply_op1(Embedding { ids: ids.to_vec() })
    } else {
        weight.index_select(&Tensor::new(ids, weight.device())?, 0)
    }
}

struct Embedding {
    ids: Vec<u32>,
}

impl CustomOp1 for Embedding {
    fn name(&self) -> &'static str {
        "verity-embedding"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let table = f32_slice(storage, layout)?;
        let &[_, d] = layout.dims() else {
            bail!("embedding: the table must be 2-d, got {:?}", layout.dims())
        };
        let mut out = vec![0f32; self.ids.len() * d];
        out.par_chunks_mut(d).zip(&self.ids).for_each(|(row, &id)| {
            let start = id as usize * d;
            row.copy_from_slice(&table[start..start + d]);
        });
        Ok((CpuStorage::F32(out), Shape::from((self.ids.len(), d))))
    }

    fn bwd(&self, weight: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (vocab, d) = weight.dims2()?;
        let mut dw = vec![0f32; vocab * d];
        with_f32(grad, |g| {
            // Rows are added in id order, so a token repeated in the batch sums the same way
            // whatever the thread count.
            for (row, &id) in g.chunks_exact(d).zip(&self.ids) {
                let start = id as usize * d;
                dw[start..start + d].iter_mut().zip(row).for_each(|(w, &x)| *w += x);
            }
            Ok(())
        })?;
        Ok(Some(Tensor::from_vec(dw, (vocab, d), &Device::Cpu)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    #[test]
    fn rows_and_gradient_match_index_select() {
        let dev = Device::Cpu;
        let table =
            Var::from_tensor(&Tensor::arange(0f32, 24.0, &dev).unwrap().reshape((6, 4)).unwrap())
                .unwrap();
        let ids = [3u32, 0, 3, 5];
        let weights = Tensor::arange(0f32, 16.0, &dev).unwrap().reshape((4, 4)).unwrap();
        let ours = embedding(table.as_tensor(), &ids).unwrap();
        let theirs = table.as_tensor().index_select(&Tensor::new(&ids, &dev).unwrap(), 0).unwrap();
        assert_eq!(ours.to_vec2::<f32>().unwrap(), theirs.to_vec2::<f32>().unwrap());
        let g1 = (ours * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (theirs * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let (a, b) = (g1.get(table.as_tensor()).unwrap(), g2.get(table.as_tensor()).unwrap());
        assert_eq!(a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn ids_outside_the_vocabulary_are_errors() {
        let table = Tensor::zeros((6, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(embedding(&table, &[6]).is_err());
    }
}
