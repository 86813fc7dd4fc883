//! Registered embedding models (`models.kind = 'embedding'`) that `cosine` graders name by id:
//! fetched from the object store like base models, loaded once per name and shared. Graders
//! that name none get the process's default model ([`crate::embedding::configured`],
//! `VERITY_EMBEDDING_MODEL`).

use crate::embedding::{configured, BertEmbedder, EmbeddingModelError};
use crate::job::artifacts::cached_folder;
use crate::stack::model_folder;
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

/// Embedding models loaded by name, their files cached under `cache_dir/embeddings`.
pub struct EmbeddingModels {
    cache_dir: PathBuf,
    loaded: Mutex<BTreeMap<String, Arc<BertEmbedder>>>,
    loading: tokio::sync::Mutex<()>,
}

impl EmbeddingModels {
    /// Models cached under `cache_dir/embeddings`.
    pub fn new(cache_dir: PathBuf) -> Self {
        Self { cache_dir, loaded: Mutex::default(), loading: tokio::sync::Mutex::new(()) }
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
                None => configured().get().map_err(EmbeddingSetupError::from),
                Some(name) => self.load(pool, store, org_id, name).await,
            };
            models.insert(name, model.map_err(|e| (path, e))?);
        }
        Ok(grader.with_embedders(&|name| models.get(&name.map(str::to_string)).cloned()))
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
        let key = format!("{}:{}", row.storage_prefix, name);
        if let Some(model) = self.loaded.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok(model.clone());
        }
        let load = |message: String| EmbeddingSetupError::Load { name: name.to_string(), message };
        let root = self.cache_dir.join("embeddings");
        let dir = model_folder(&root, name).map_err(|e| load(e.to_string()))?;
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

/// The embedding model `name` if org `org_id` can see it.
async fn registered(
    pool: &PgPool,
    org_id: Uuid,
    name: &str,
) -> Result<Option<verity_core::models::ModelRecord>, sqlx::Error> {
    let row = verity_core::models::get_model(pool, org_id, name).await?;
    Ok(row.filter(|m| m.kind == verity_core::models::EMBEDDING))
}
