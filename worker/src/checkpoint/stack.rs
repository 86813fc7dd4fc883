//! Fetching a model stack ([`verity_core::lineage::ModelStack`]: a base model and the
//! checkpoints of chained jobs over it) from the object store into a local cache, and loading
//! it as one model: what a job starts from, and what a fine-tuned judge runs.

use crate::checkpoint::cache::{cached_folder, model_path};
use crate::error::Result;
use crate::loader::{is_adapter, load_stack, LoadedModel};
use candle_core::Device;
use std::path::{Path, PathBuf};
use verity_core::lineage::ModelStack;
use verity_core::names::{child_folder, NameError};
use verity_core::storage::ObjectStore;

/// A stack's folders on local disk.
#[derive(Debug, Clone)]
pub struct FetchedStack {
    /// The base model's folder or GGUF file; `None` when a layer holds full weights (the base
    /// is then not needed, nor fetched).
    pub base: Option<PathBuf>,
    /// The layers fetched, bottom first: from the topmost full-weights folder (if any) up.
    pub layers: Vec<PathBuf>,
}

impl FetchedStack {
    /// Loads the stack as one model ([`load_stack`]).
    pub fn load(&self, device: &Device) -> Result<LoadedModel> {
        load_stack(self.base.as_deref(), &self.layers, device)
    }
}

/// A model whose name breaks [`verity_core::names::check_name`]: a permanent error (the name
/// can never become a cache folder).
#[derive(Debug, thiserror::Error)]
#[error("model name {name:?} {reason}")]
pub struct BadModelName {
    /// The name.
    pub name: String,
    /// What is wrong with it.
    pub reason: NameError,
}

/// `cache_dir/{folder name of model}`, or [`BadModelName`].
pub fn model_folder(cache_dir: &Path, model: &str) -> std::result::Result<PathBuf, BadModelName> {
    child_folder(cache_dir, model)
        .map_err(|reason| BadModelName { name: model.chars().take(80).collect(), reason })
}

/// Fetches `stack` into `cache_dir` (each model in `cache_dir/{its name}`, reused while its
/// published manifest is unchanged): layers from the top down to the first full-weights one,
/// and the base only when every layer is an adapter.
pub async fn fetch_stack(
    store: &dyn ObjectStore,
    stack: &ModelStack,
    cache_dir: &Path,
) -> anyhow::Result<FetchedStack> {
    let mut layers = Vec::new();
    for layer in stack.layers.iter().rev() {
        let dir = model_folder(cache_dir, &layer.name)?;
        let dir = cached_folder(store, &layer.storage_prefix, cache_dir, &dir).await?;
        let full = !is_adapter(&dir);
        layers.push(dir);
        if full {
            layers.reverse();
            return Ok(FetchedStack { base: None, layers });
        }
    }
    layers.reverse();
    let dir = model_folder(cache_dir, &stack.base.id)?;
    let dir = cached_folder(store, &stack.base.storage_prefix, cache_dir, &dir).await?;
    let base = model_path(&dir, &stack.base.format)?;
    Ok(FetchedStack { base: Some(base), layers })
}
