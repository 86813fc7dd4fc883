//! The inference engine of `verity inference`: loads base models and checkpoints from the
//! object store on demand (an LRU bounded by a memory budget; LoRA checkpoints share their
//! base's weights and apply the adapter at run time, unmerged; the models a chained job
//! started from are merged into its base when that loads), and runs every model's
//! requests in one continuous batch ([`batcher`]).

mod batcher;
pub mod request;
pub mod text;

use crate::checkpoint::cache::{cached_folder, model_path};
use crate::loader::{load_checkpoint, load_stack};
use crate::model::compact::{CompactWeights, RolloutDtype};
use crate::model::Transformer;
use crate::tokenizer::ChatTokenizer;
pub use batcher::BatchCounters;
use batcher::{run_batcher, Admission};
use candle_core::Device;
use request::{GenerationEvent, GenerationRequest, ModelSource, PromptInput};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;
use verity_core::storage::ObjectStore;

/// Settings of an inference engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where downloaded models are kept.
    pub cache_dir: PathBuf,
    /// The device models run on.
    pub device: Device,
    /// Most bytes of parameters held at once (least recently used idle models are unloaded).
    pub memory_budget_bytes: usize,
    /// Most sequences decoded together per model.
    pub max_batch: usize,
    /// Precision of the weights decoding reads on a CPU: `f32` (the weights themselves), or
    /// `bf16`/`int8` copies made once per loaded model (the rollout precisions).
    pub decode_dtype: RolloutDtype,
    /// Models no request used for this long are unloaded and their memory returned by
    /// [`Engine::unload_idle`]; `None` keeps them until the budget needs the room.
    pub idle_unload: Option<std::time::Duration>,
}

/// Why a request cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The request is wrong for this model (e.g. longer than its context).
    #[error("{message}")]
    InvalidParam {
        /// The request field at fault.
        param: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model's files cannot be fetched or loaded.
    #[error("the model cannot be loaded: {0}")]
    ModelUnavailable(String),
    /// Loading the model would exceed the memory budget while every loaded model is busy.
    #[error("{0}")]
    Overloaded(String),
}

fn invalid(param: &'static str, message: impl Into<String>) -> ServeError {
    ServeError::InvalidParam { param, message: message.into() }
}

/// A running generation.
pub struct Generation {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// The completion budget of each choice.
    pub max_tokens: usize,
    /// Deltas and ends of each choice; dropping it abandons the generation.
    pub events: UnboundedReceiver<GenerationEvent>,
}

/// A model ready to serve: its weights (and their low-precision copies), tokenizer and batch.
struct Served {
    model: Arc<Transformer>,
    compact: Option<Arc<CompactWeights>>,
    tokenizer: Arc<ChatTokenizer>,
    admissions: Mutex<mpsc::Sender<Admission>>,
    counters: Arc<BatchCounters>,
}

struct Entry {
    served: Arc<Served>,
    /// Bytes this entry holds itself (an adapter: only the adapter).
    bytes: usize,
    last_used: Instant,
    /// The key of the base an adapter entry shares.
    base: Option<String>,
}

/// Serves generations for any model in the object store.
pub struct Engine {
    store: Arc<dyn ObjectStore>,
    config: EngineConfig,
    models: tokio::sync::Mutex<HashMap<String, Entry>>,
    counters: Arc<BatchCounters>,
}

impl Engine {
    /// An engine loading models from `store`.
    pub fn new(store: Arc<dyn ObjectStore>, config: EngineConfig) -> Engine {
        Engine {
            store,
            config,
            models: tokio::sync::Mutex::new(HashMap::new()),
            counters: Arc::default(),
        }
    }

    /// Unloads every model idle longer than the configured `idle_unload` (an adapter with its
    /// base only once neither serves a request) and returns the memory to the system; the keys
    /// unloaded.
    pub async fn unload_idle(&self) -> Vec<String> {
        let Some(idle_for) = self.config.idle_unload else { return Vec::new() };
        let mut models = self.models.lock().await;
        let busy = |e: &Entry| e.served.counters.requests.load(Ordering::SeqCst) > 0;
        let stale = |e: &Entry| e.last_used.elapsed() >= idle_for && !busy(e);
        let mut gone: Vec<String> = models
            .iter()
            .filter(|(key, e)| {
                // A base goes only with all its adapters; an adapter may go alone.
                stale(e)
                    && models
                        .values()
                        .filter(|a| a.base.as_deref() == Some(key.as_str()))
                        .all(stale)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let adapters: Vec<String> = models
            .iter()
            .filter(|(_, e)| e.base.as_ref().is_some_and(|b| gone.contains(b)))
            .map(|(key, _)| key.clone())
            .collect();
        for key in adapters {
            if !gone.contains(&key) {
                gone.push(key);
            }
        }
        for key in &gone {
            tracing::info!(key, idle_seconds = idle_for.as_secs(), "unloading an idle model");
            models.remove(key);
        }
        drop(models);
        if !gone.is_empty() {
            crate::memory::release_freed_memory();
        }
        gone
    }

    /// Requests running now (all models).
    pub fn active_requests(&self) -> usize {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Sequences being decoded now (all models; a request with `n` choices holds `n`).
    pub fn active_sequences(&self) -> usize {
        self.counters.rows.load(Ordering::SeqCst)
    }

    /// Cache keys of the loaded models ([`ModelSource::cache_key`]).
    pub async fn loaded_models(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.models.lock().await.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Starts a generation: loads the model if needed, renders and checks the prompt against
    /// its context, and admits the request to the model's batch.
    pub async fn generate(&self, request: GenerationRequest) -> Result<Generation, ServeError> {
        let params = request.params;
        if params.n == 0 {
            return Err(invalid("n", "must be at least 1"));
        }
        let served = self.served(&request.model).await?;
        let vocab = served.model.config.vocab_size;
        let rendered = |param: &'static str, text: Result<String, String>| {
            let text = text.map_err(|e| invalid(param, e))?;
            served.tokenizer.encode(&text).map_err(|e| invalid(param, e.to_string()))
        };
        let (prompt_param, mut prompt) = match &request.prompt {
            PromptInput::Chat(messages) => (
                "messages",
                rendered(
                    "messages",
                    served.tokenizer.apply_chat_template(messages, true).map_err(|e| e.to_string()),
                )?,
            ),
            PromptInput::Judge(messages) => (
                "messages",
                rendered(
                    "messages",
                    crate::judge::local::render_prompt(&served.tokenizer, messages)
                        .map_err(|e| e.to_string()),
                )?,
            ),
            PromptInput::Text(text) => ("prompt", rendered("prompt", Ok(text.clone()))?),
            PromptInput::Tokens(ids) => {
                if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(invalid(
                        "prompt",
                        format!("token id {id} is outside the vocabulary ({vocab} tokens)"),
                    ));
                }
                ("prompt", ids.clone())
            }
        };
        let clamp = matches!(request.prompt, PromptInput::Judge(_));
        if prompt.is_empty() {
            // An empty raw prompt continues from the beginning-of-sequence token.
            let bos = served.model.config.bos_token_id.unwrap_or(served.tokenizer.pad_id());
            prompt.push(bos);
        }
        let context = served.model.config.max_position_embeddings;
        if prompt.len() >= context {
            return Err(invalid(
                prompt_param,
                format!("the prompt has {} tokens; the model's context is {context}", prompt.len()),
            ));
        }
        let room = context - prompt.len();
        let max_tokens = match params.max_tokens {
            Some(0) => return Err(invalid("max_tokens", "must be at least 1")),
            Some(m) if m > room && clamp => room,
            Some(m) if m > room => {
                return Err(invalid(
                    "max_tokens",
                    format!(
                        "max_tokens is {m}, but the prompt has {} tokens and the model's context is {context}: at most {room}",
                        prompt.len()
                    ),
                ))
            }
            Some(m) => m,
            None => room,
        };
        if let Some(id) = params.logit_bias.keys().find(|&&id| id as usize >= vocab) {
            return Err(invalid("logit_bias", format!("token id {id} is outside the vocabulary")));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if params.prompt_logprobs {
            let logprobs = prompt_logprobs(&served, &prompt).await?;
            let _ = tx.send(GenerationEvent::PromptLogprobs { logprobs });
        }
        let prompt_tokens = prompt.len();
        for c in [&self.counters, &served.counters] {
            c.requests.fetch_add(1, Ordering::SeqCst);
        }
        let admission = Admission { prompt, params, max_tokens, events: tx };
        let sent = served
            .admissions
            .lock()
            .map_err(|_| ServeError::ModelUnavailable("the model's batch stopped".into()))?
            .send(admission);
        if sent.is_err() {
            for c in [&self.counters, &served.counters] {
                c.requests.fetch_sub(1, Ordering::SeqCst);
            }
            return Err(ServeError::ModelUnavailable("the model's batch stopped".into()));
        }
        Ok(Generation { prompt_tokens, max_tokens, events: rx })
    }

    /// The model of `source`, loading it (and its base) when needed.
    async fn served(&self, source: &ModelSource) -> Result<Arc<Served>, ServeError> {
        let key = source.cache_key();
        let mut models = self.models.lock().await;
        if let Some(entry) = models.get_mut(&key) {
            entry.last_used = Instant::now();
            return Ok(entry.served.clone());
        }
        let base_key = source.base_key();
        let base = match models.get_mut(&base_key) {
            Some(entry) => {
                entry.last_used = Instant::now();
                entry.served.clone()
            }
            None => {
                let dir = self.download(&source.base_prefix).await?;
                let file = model_path(&dir, &source.base_format)
                    .map_err(|e| ServeError::ModelUnavailable(format!("{e:#}")))?;
                let mut merged = Vec::with_capacity(source.merged.len());
                for prefix in &source.merged {
                    merged.push(self.download(prefix).await?);
                }
                let (device, dtype) = (self.config.device.clone(), self.config.decode_dtype);
                let (loaded, compact) = tokio::task::spawn_blocking(move || -> crate::Result<_> {
                    let loaded = load_stack(Some(&file), &merged, &device)?;
                    let compact = CompactWeights::for_rollouts(&loaded.model, dtype)?;
                    Ok((loaded, compact))
                })
                .await
                .map_err(|e| ServeError::ModelUnavailable(e.to_string()))?
                .map_err(|e| ServeError::ModelUnavailable(e.to_string()))?;
                let bytes =
                    loaded.model.parameter_bytes() + compact.as_ref().map_or(0, |c| c.bytes());
                make_room(&mut models, bytes, self.config.memory_budget_bytes, &[])?;
                let model = (Arc::new(loaded.model), compact);
                let served = self.start(model, Arc::new(loaded.tokenizer), &base_key);
                models.insert(
                    base_key.clone(),
                    Entry { served: served.clone(), bytes, last_used: Instant::now(), base: None },
                );
                served
            }
        };
        let Some(checkpoint) = &source.checkpoint_prefix else { return Ok(base) };
        let dir = self.download(checkpoint).await?;
        let adapter = dir.join("adapter_config.json").is_file();
        let base_model = base.model.clone();
        let (device, dtype) = (self.config.device.clone(), self.config.decode_dtype);
        // An adapter reads its base's weights, so it reads the base's copies too.
        let base_compact = base.compact.clone();
        let loaded = tokio::task::spawn_blocking(move || -> crate::Result<_> {
            let (model, tokenizer) = load_checkpoint(&base_model, &dir, &device)?;
            if adapter {
                let bytes = model.adapter_bytes();
                return Ok((model, base_compact, tokenizer, bytes));
            }
            let compact = CompactWeights::for_rollouts(&model, dtype)?;
            let bytes = model.parameter_bytes() + compact.as_ref().map_or(0, |c| c.bytes());
            Ok((model, compact, tokenizer, bytes))
        })
        .await
        .map_err(|e| ServeError::ModelUnavailable(e.to_string()))?
        .map_err(|e| ServeError::ModelUnavailable(e.to_string()))?;
        let (model, compact, tokenizer, bytes) = loaded;
        make_room(&mut models, bytes, self.config.memory_budget_bytes, &[&base_key])?;
        let tokenizer = tokenizer.map(Arc::new).unwrap_or_else(|| base.tokenizer.clone());
        let served = self.start((Arc::new(model), compact), tokenizer, &key);
        models.insert(
            key,
            Entry {
                served: served.clone(),
                bytes,
                last_used: Instant::now(),
                base: adapter.then_some(base_key),
            },
        );
        Ok(served)
    }

    /// Starts the batch thread of a loaded model.
    fn start(
        &self,
        (model, compact): (Arc<Transformer>, Option<Arc<CompactWeights>>),
        tokenizer: Arc<ChatTokenizer>,
        key: &str,
    ) -> Arc<Served> {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(BatchCounters::default());
        let shared = Arc::new([counters.clone(), self.counters.clone()]);
        let weights = (model.clone(), compact.clone());
        let (t, max_batch) = (tokenizer.clone(), self.config.max_batch);
        let spawned = std::thread::Builder::new()
            .name(format!("batch {key}"))
            .spawn(move || run_batcher(weights, t, max_batch, shared, rx));
        if let Err(error) = spawned {
            tracing::error!(%error, key, "cannot start a batch thread");
        }
        tracing::info!(key, "model loaded for inference");
        Arc::new(Served { model, compact, tokenizer, admissions: Mutex::new(tx), counters })
    }

    /// Downloads (or finds in the cache) the published folder at `prefix`.
    async fn download(&self, prefix: &str) -> Result<PathBuf, ServeError> {
        let root = self.config.cache_dir.join("serving");
        let dir = root.join(sanitize(prefix));
        cached_folder(self.store.as_ref(), prefix, &root, &dir)
            .await
            .map_err(|e| ServeError::ModelUnavailable(format!("{e:#}")))
    }
}

/// Unloads least recently used idle models until `need` more bytes fit in `budget`; `keep`
/// names entries that must stay (the base being extended). Unloading a base unloads its
/// adapters too (they hold its weights).
fn make_room(
    models: &mut HashMap<String, Entry>,
    need: usize,
    budget: usize,
    keep: &[&str],
) -> Result<(), ServeError> {
    loop {
        let used: usize = models.values().map(|e| e.bytes).sum();
        if used + need <= budget {
            return Ok(());
        }
        let idle = |key: &str, models: &HashMap<String, Entry>| {
            models
                .values()
                .filter(|e| e.base.as_deref() == Some(key))
                .chain(models.get(key))
                .all(|e| e.served.counters.requests.load(Ordering::SeqCst) == 0)
        };
        let victim = models
            .iter()
            .filter(|(k, _)| !keep.contains(&k.as_str()))
            .filter(|(k, e)| {
                e.base.as_deref().is_none_or(|b| !keep.contains(&b)) && idle(k, models)
            })
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, _)| k.clone());
        let Some(victim) = victim else {
            return Err(ServeError::Overloaded(format!(
                "loading this model needs {} MiB more than the memory budget of {} MiB, and every loaded model is busy",
                (used + need - budget) / (1 << 20) + 1,
                budget / (1 << 20)
            )));
        };
        let dependants: Vec<String> = models
            .iter()
            .filter(|(_, e)| e.base.as_deref() == Some(victim.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        for key in dependants.into_iter().chain([victim]) {
            tracing::info!(key, "unloading an idle model (memory budget)");
            models.remove(&key);
        }
    }
}

/// A storage prefix usable as a folder name.
fn sanitize(prefix: &str) -> String {
    prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect()
}

/// The log-probability of each token of `prompt` after the first given the ones before it, as
/// the trainer scores tokens (temperature 1), computed off the async threads.
async fn prompt_logprobs(served: &Arc<Served>, prompt: &[u32]) -> Result<Vec<f32>, ServeError> {
    if prompt.len() < 2 {
        return Ok(Vec::new());
    }
    let (served, prompt) = (Arc::clone(served), prompt.to_vec());
    let scored = tokio::task::spawn_blocking(move || {
        let pad = served.tokenizer.pad_id();
        let scored = served.model.completion_logprobs(
            &[prompt[..1].to_vec()],
            &[prompt[1..].to_vec()],
            1.0,
            pad,
            false,
        )?;
        Ok::<Vec<f32>, crate::WorkerError>(scored.logprobs.flatten_all()?.to_vec1()?)
    })
    .await
    .map_err(|e| ServeError::ModelUnavailable(format!("scoring the prompt: {e}")))?;
    scored.map_err(|e| ServeError::ModelUnavailable(format!("scoring the prompt: {e}")))
}
