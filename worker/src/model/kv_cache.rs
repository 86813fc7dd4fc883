//! Key/value cache for incremental decoding, with row selection (share a prefill across
//! samples, drop finished sequences), and the weight copies the decode reads.

use super::compact::CompactWeights;
use crate::error::Result;
use candle_core::{Device, Tensor};
use std::sync::Arc;

/// Per-layer keys and values `(batch, kv_heads, capacity, head_dim)`, the first `len` filled;
/// optionally the bf16 weight copies every forward through this cache uses.
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    capacity: usize,
    weights: Option<Arc<CompactWeights>>,
}

impl KvCache {
    /// An empty cache for `layers` layers able to hold `capacity` positions before growing.
    pub fn new(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        device: &Device,
    ) -> Result<Self> {
        let capacity = capacity.max(1);
        let zeros = || {
            Tensor::zeros((batch, kv_heads, capacity, head_dim), candle_core::DType::F32, device)
        };
        let keys = (0..layers).map(|_| zeros()).collect::<candle_core::Result<Vec<_>>>()?;
        let values = (0..layers).map(|_| zeros()).collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self { keys, values, len: 0, capacity, weights: None })
    }

    /// Makes every forward through this cache read these weight copies (bf16 rollouts).
    pub fn use_weights(&mut self, weights: CompactWeights) {
        self.weights = Some(Arc::new(weights));
    }

    /// The weight copies forwards through this cache read, if any.
    pub fn weights(&self) -> Option<&Arc<CompactWeights>> {
        self.weights.as_ref()
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `k`/`v` `(batch, kv_heads, t, head_dim)` of `layer` after the filled part and returns
    /// views of all keys and values so far. Call [`KvCache::advance`] once all layers are done.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        if self.len + t > self.capacity {
            self.grow((self.len + t).max(self.capacity * 2))?;
        }
        self.keys[layer].slice_set(&k.contiguous()?, 2, self.len)?;
        self.values[layer].slice_set(&v.contiguous()?, 2, self.len)?;
        Ok((
            self.keys[layer].narrow(2, 0, self.len + t)?,
            self.values[layer].narrow(2, 0, self.len + t)?,
        ))
    }

    /// Marks `t` more positions as filled.
    pub fn advance(&mut self, t: usize) {
        self.len += t;
    }

    fn grow(&mut self, capacity: usize) -> Result<()> {
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let (b, h, _, d) = cache.dims4()?;
            let extra =
                Tensor::zeros((b, h, capacity - self.capacity, d), cache.dtype(), cache.device())?;
            *cache = Tensor::cat(&[&*cache, &extra], 2)?;
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Keeps (and repeats) the given batch rows, in order.
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        let device = self.keys.first().map(|k| k.device().clone()).unwrap_or(Device::Cpu);
        let idx = Tensor::new(rows, &device)?;
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *cache = cache.index_select(&idx, 0)?;
        }
        Ok(())
    }
}
