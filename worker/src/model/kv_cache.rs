//! Key/value cache for incremental decoding, with row selection (share a prefill across
//! samples, drop finished sequences), and the weight copies the decode reads.

use super::compact::CompactWeights;
use crate::error::Result;
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// Per-layer keys and values `(batch, kv_heads, capacity, head_dim)`, the first `len` filled;
/// optionally the low-precision weight copies every forward through this cache uses.
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    len: usize,
    capacity: usize,
    weights: Option<Arc<CompactWeights>>,
}

impl KvCache {
    /// An empty cache for `layers` layers able to hold `capacity` positions of `(batch,
    /// kv_heads, head_dim)` keys and values in `dtype` (the model's compute dtype) before growing.
    pub fn new(
        layers: usize,
        (batch, kv_heads, head_dim): (usize, usize, usize),
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let capacity = capacity.max(1);
        let zeros = || Tensor::zeros((batch, kv_heads, capacity, head_dim), dtype, device);
        let keys = (0..layers).map(|_| zeros()).collect::<candle_core::Result<Vec<_>>>()?;
        let values = (0..layers).map(|_| zeros()).collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self { keys, values, len: 0, capacity, weights: None })
    }

    /// Makes every forward through this cache read these weight copies (bf16 or int8 rollouts); pass
    /// an `Arc` to share one set of copies among caches.
    pub fn use_weights(&mut self, weights: impl Into<Arc<CompactWeights>>) {
        self.weights = Some(weights.into());
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

    /// Rows in the cache.
    pub fn rows(&self) -> usize {
        self.keys.first().and_then(|k| k.dim(0).ok()).unwrap_or(0)
    }

    /// Appends the rows of `other` after this cache's rows, aligning the two on their last
    /// position: the shorter one is left-padded with zero keys. Returns how many positions were
    /// added in front of (this cache's rows, `other`'s rows); masks must skip them.
    pub fn append_rows(&mut self, other: KvCache) -> Result<(usize, usize)> {
        let len = self.len.max(other.len);
        let (pad_self, pad_other) = (len - self.len, len - other.len);
        let spare = self.capacity.saturating_sub(self.len).max(other.capacity - other.len).max(1);
        let aligned = |cache: &Tensor, filled: usize, pad: usize| -> Result<Tensor> {
            let (b, h, _, d) = cache.dims4()?;
            let kept = cache.narrow(2, 0, filled)?;
            let front = Tensor::zeros((b, h, pad, d), cache.dtype(), cache.device())?;
            let back = Tensor::zeros((b, h, spare, d), cache.dtype(), cache.device())?;
            Ok(Tensor::cat(&[&front, &kept, &back], 2)?)
        };
        for (mine, theirs) in self
            .keys
            .iter_mut()
            .zip(other.keys.iter())
            .chain(self.values.iter_mut().zip(other.values.iter()))
        {
            let a = aligned(mine, self.len, pad_self)?;
            let b = aligned(theirs, other.len, pad_other)?;
            *mine = Tensor::cat(&[&a, &b], 0)?;
        }
        self.len = len;
        self.capacity = len + spare;
        Ok((pad_self, pad_other))
    }

    /// Forgets the first `count` positions of every row (padding no row attends to any more).
    pub fn drop_front(&mut self, count: usize) -> Result<()> {
        let count = count.min(self.len);
        if count == 0 {
            return Ok(());
        }
        let keep = self.capacity - count;
        for cache in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *cache = cache.narrow(2, count, keep)?.contiguous()?;
        }
        self.len -= count;
        self.capacity = keep;
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
