//! Judges of model graders (`score_model`, `label_model`): a model registered in Verity, loaded
//! here and run batched on the rollout sampler ([`local`]), or, when the operator routes the
//! judge name to one, an OpenAI-compatible endpoint ([`endpoint`]). [`JudgeProvider`] resolves
//! the judge names of a grader for an org and builds the [`Judge`] it asks.

pub mod endpoint;
pub mod local;

pub use endpoint::{parse_endpoints, EndpointJudge, JudgeEndpoint, JudgeSettings};
pub use local::{LoadedJudges, LocalJudge};

use crate::checkpoint::stack::fetch_stack;
pub use candle_core::Device;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use uuid::Uuid;
use verity_core::lineage::ModelStack;
use verity_core::storage::{ObjectStore, StorageError};
use verity_verifiers::{Grader, Judge, JudgeError, JudgePrompt, JudgeReply};

/// Why the judge of a grader cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum JudgeSetupError {
    /// The judge is neither routed to an endpoint nor a model the org can use.
    #[error("{path}: judge model '{name}' does not exist (register it with `verity models import`, or route it with VERITY_JUDGE_ENDPOINTS)")]
    UnknownModel {
        /// JSON path of the grader's `model` field.
        path: String,
        /// The judge name.
        name: String,
    },
    /// The model registry could not be read.
    #[error("looking up judge models: {0}")]
    Database(#[from] sqlx::Error),
    /// The judge model's files could not be fetched.
    #[error("fetching judge model '{name}': {message}")]
    Fetch {
        /// The judge name.
        name: String,
        /// What failed.
        message: String,
        /// Whether a retry may succeed (store unreachable).
        transient: bool,
    },
    /// The judge model's files do not load.
    #[error("loading judge model '{name}': {message}")]
    Load {
        /// The judge name.
        name: String,
        /// What failed.
        message: String,
    },
}

/// Routes each prompt to its judge: an endpoint when configured, else the judge of registered
/// models (loaded here on a training worker, asked through an inference worker by the API).
pub struct JudgeRouter {
    endpoints: BTreeMap<String, EndpointJudge>,
    local: Box<dyn Judge>,
}

impl Judge for JudgeRouter {
    fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
        let mut out: Vec<Option<Result<JudgeReply, JudgeError>>> = vec![None; prompts.len()];
        let mut local: Vec<usize> = Vec::new();
        let mut remote: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, p) in prompts.iter().enumerate() {
            if self.endpoints.contains_key(&p.model) {
                remote.entry(p.model.as_str()).or_default().push(i);
            } else {
                local.push(i);
            }
        }
        let mut answer = |indices: &[usize], judge: &dyn Judge| {
            let batch: Vec<JudgePrompt> = indices.iter().map(|&i| prompts[i].clone()).collect();
            for (&i, reply) in indices.iter().zip(judge.complete(&batch)) {
                out[i] = Some(reply);
            }
        };
        for (name, indices) in remote {
            if let Some(judge) = self.endpoints.get(name) {
                answer(&indices, judge);
            }
        }
        if !local.is_empty() {
            answer(&local, self.local.as_ref());
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(JudgeError::Failed("no reply".into()))))
            .collect()
    }
}

/// Builds the judges of graders: endpoints from the settings, registered models loaded once
/// and kept (least recently used dropped past `models_loaded`).
pub struct JudgeProvider {
    settings: JudgeSettings,
    loaded: LoadedJudges,
    cache_dir: PathBuf,
    device: Device,
    loading: tokio::sync::Mutex<()>,
}

impl JudgeProvider {
    /// A provider caching model files under `cache_dir/judges` and loading them on `device`.
    pub fn new(settings: JudgeSettings, cache_dir: PathBuf, device: Device) -> Self {
        let loaded = LoadedJudges::new(settings.models_loaded);
        Self { settings, loaded, cache_dir, device, loading: tokio::sync::Mutex::new(()) }
    }

    /// A provider loading judge models on the CPU.
    pub fn on_cpu(settings: JudgeSettings, cache_dir: PathBuf) -> Self {
        Self::new(settings, cache_dir, Device::Cpu)
    }

    /// The routing settings.
    pub fn settings(&self) -> &JudgeSettings {
        &self.settings
    }

    /// The first judge `grader` names that org `org_id` cannot use, as `(path, name)`.
    pub async fn missing_judge(
        &self,
        pool: &PgPool,
        org_id: Uuid,
        grader: &Grader,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        for (path, name) in grader.judge_models() {
            if self.settings.endpoint(&name).is_some() {
                continue;
            }
            if verity_core::lineage::resolve_stack(pool, org_id, &name).await?.is_none() {
                return Ok(Some((path, name)));
            }
        }
        Ok(None)
    }

    /// The model graders of `grader` whose reply budget is more than their loaded judge
    /// model's context (call after [`JudgeProvider::judge_for`]): each reply is cut to what its
    /// prompt leaves of the context, as a warning to show the user — OpenAI's guides ask for up
    /// to 32768 reply tokens, which is accepted, not refused. Endpoint judges are not checked.
    pub fn budget_warnings(&self, grader: &Grader) -> Vec<(String, String)> {
        let mut warnings = Vec::new();
        for (path, name, asked) in grader.judge_budgets() {
            if self.settings.endpoint(&name).is_some() {
                continue;
            }
            let Some(model) = self.loaded.get(&name) else { continue };
            let context = model
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .model
                .config
                .max_position_embeddings;
            if asked >= context {
                let message = format!(
                    "{path}: {asked} reply tokens asked, more than the judge {name:?} holds \
                     ({context} tokens of context); each reply is cut to what its prompt \
                     leaves of the context"
                );
                warnings.push((path, message));
            }
        }
        warnings
    }

    /// The judge answering every model `grader` names for org `org_id` (loading models that
    /// are not loaded yet).
    pub async fn judge_for(
        &self,
        pool: &PgPool,
        store: &dyn ObjectStore,
        org_id: Uuid,
        grader: &Grader,
    ) -> Result<Arc<dyn Judge>, JudgeSetupError> {
        let mut models = BTreeMap::new();
        for (path, name) in grader.judge_models() {
            if self.settings.endpoint(&name).is_some() || models.contains_key(&name) {
                continue;
            }
            let stack = verity_core::lineage::resolve_stack(pool, org_id, &name)
                .await?
                .ok_or_else(|| JudgeSetupError::UnknownModel { path, name: name.clone() })?;
            let model = self.load(store, &name, &stack).await?;
            models.insert(name, model);
        }
        Ok(self.route(grader, Box::new(LocalJudge::new(models))))
    }

    /// The judge of `grader`: the judge names routed to an endpoint asked there, every other
    /// one asked of `models`.
    pub fn route(&self, grader: &Grader, models: Box<dyn Judge>) -> Arc<dyn Judge> {
        let endpoints = grader
            .judge_models()
            .into_iter()
            .filter_map(|(_, name)| {
                let endpoint = self.settings.endpoint(&name)?;
                Some((name, EndpointJudge::new(endpoint.clone(), &self.settings)))
            })
            .collect();
        Arc::new(JudgeRouter { endpoints, local: models })
    }

    /// The loaded model `name` (a base model, or a fine-tuned one or checkpoint with the
    /// models under it merged in: [`crate::checkpoint::stack`]), fetched and loaded when it is not yet.
    async fn load(
        &self,
        store: &dyn ObjectStore,
        name: &str,
        stack: &ModelStack,
    ) -> Result<local::SharedModel, JudgeSetupError> {
        let _one_load_at_a_time = self.loading.lock().await;
        if let Some(model) = self.loaded.get(name) {
            return Ok(model);
        }
        let fetched =
            fetch_stack(store, stack, &self.cache_dir.join("judges")).await.map_err(|e| {
                let transient = e.chain().any(|c| {
                    c.downcast_ref::<StorageError>().is_some_and(StorageError::is_transient)
                        || c.downcast_ref::<std::io::Error>().is_some()
                });
                JudgeSetupError::Fetch { name: name.into(), message: format!("{e:#}"), transient }
            })?;
        let device = self.device.clone();
        let loaded = tokio::task::spawn_blocking(move || fetched.load(&device))
            .await
            .map_err(|e| JudgeSetupError::Load { name: name.into(), message: e.to_string() })?
            .map_err(|e| JudgeSetupError::Load { name: name.into(), message: e.to_string() })?;
        tracing::info!(judge = name, "judge model loaded");
        Ok(self.loaded.insert(name, loaded))
    }
}
