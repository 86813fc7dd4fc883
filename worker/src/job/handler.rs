//! [`TrainingHandler`]: runs one claimed training job under its lease.

use super::artifacts::{append_metrics_line, cached_folder, remove_cache_dir, write_results_file};
use super::budget::{store_usage, usage_before, Meter};
use super::cancellable::blocking_until_cancelled;
use super::progress::{JobPhase, LiveProgress};
use super::watch::Watch;
use crate::embedding_models::{EmbeddingModels, EmbeddingSetupError};
use crate::judge::{JudgeProvider, JudgeSettings, JudgeSetupError};
use crate::stack::{fetch_stack, FetchedStack};
use crate::trainer::{
    Dataset, Evaluation, Phase, SampleRecord, StepOutput, Trainer, TrainerError, TrainerOptions,
};
use async_trait::async_trait;
use bytes::Bytes;
use candle_core::Device;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use verity_core::queue::{
    is_transient_db_error, retry_transient, EventLevel, Heartbeat, HeartbeatState, JobHandler,
    JobOutcome, Lease, QueueError, RetryPolicy, SampleIndexRow, TrainedModel,
};
use verity_core::spec::Method;
use verity_core::storage::{publish_folder, ObjectStore, StorageError};
use verity_core::ControlSignal;
use verity_verifiers::{Grader, GraderPool, GradingBudget};

/// Settings of the training handler.
#[derive(Debug, Clone)]
pub struct TrainingHandlerConfig {
    /// Where base models and checkpoints are cached on local disk.
    pub cache_dir: PathBuf,
    /// The device to train on.
    pub device: Device,
    /// Parallel gradings (0 = CPU cores), for every job of this handler together.
    pub grader_workers: usize,
}

/// Runs training jobs claimed from the queue.
pub struct TrainingHandler {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) config: TrainingHandlerConfig,
    /// One grading pool for every job this handler runs.
    pub(super) graders: GraderPool,
    /// The judges of model graders, loaded or routed on first use.
    judges: Arc<JudgeProvider>,
    /// The registered embedding models of `cosine` graders, loaded on first use.
    embeddings: Arc<EmbeddingModels>,
    /// How long a Tinker training client may wait for a call before it is parked.
    pub(super) tinker_idle: std::time::Duration,
}

/// Why a run stopped early.
pub(super) enum Stop {
    /// End with this outcome.
    Outcome(JobOutcome),
}

pub(super) fn user_error(message: impl Into<String>) -> Stop {
    Stop::Outcome(JobOutcome::Failed { message: message.into(), retryable: false })
}

pub(super) fn retryable(context: &str, err: impl std::fmt::Display) -> Stop {
    Stop::Outcome(JobOutcome::Failed { message: format!("{context}: {err}"), retryable: true })
}

pub(super) fn trainer_error(err: TrainerError) -> Stop {
    let retry = !err.is_user_error();
    Stop::Outcome(JobOutcome::Failed { message: err.to_string(), retryable: retry })
}

/// Runs a read or write of the store or the database, retrying it with backoff while it fails
/// transiently (Postgres restarting, the store unreachable) for up to
/// [`RetryPolicy::WORKER`]'s budget, so that a short outage does not cost the job an attempt.
/// Stops retrying once the lease is lost. Every operation retried here is idempotent (upserts
/// keyed by step, objects overwritten whole).
pub(super) async fn persist<T, E, F, Fut>(
    what: &str,
    heartbeat: &Heartbeat,
    is_transient: impl Fn(&E) -> bool,
    op: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let lost = || heartbeat.state() == HeartbeatState::Lost;
    retry_transient(what, RetryPolicy::WORKER, is_transient, lost, op).await
}

/// Whether an error chain holds a transient database, queue, store or I/O failure.
pub(super) fn transient_chain(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<sqlx::Error>().is_some_and(is_transient_db_error)
            || cause.downcast_ref::<QueueError>().is_some_and(QueueError::is_transient)
            || cause.downcast_ref::<StorageError>().is_some_and(StorageError::is_transient)
            || cause.downcast_ref::<std::io::Error>().is_some()
    })
}

pub(super) fn lease_error(context: &str, err: QueueError) -> Stop {
    match err {
        QueueError::LeaseLost { .. } => Stop::Outcome(JobOutcome::LeaseLost),
        other => retryable(context, other),
    }
}

impl TrainingHandler {
    /// A handler reading and writing `store`.
    pub fn new(store: Arc<dyn ObjectStore>, config: TrainingHandlerConfig) -> TrainingHandler {
        let budget = GradingBudget::new(config.grader_workers);
        TrainingHandler::with_budget(store, config, budget)
    }

    /// A handler whose gradings draw on `budget` (shared with other grading in the process).
    pub fn with_budget(
        store: Arc<dyn ObjectStore>,
        config: TrainingHandlerConfig,
        budget: GradingBudget,
    ) -> TrainingHandler {
        let judges = JudgeProvider::new(
            JudgeSettings::default(),
            config.cache_dir.clone(),
            config.device.clone(),
        );
        let embeddings = Arc::new(EmbeddingModels::new(config.cache_dir.clone()));
        TrainingHandler {
            store,
            embeddings,
            config,
            graders: GraderPool::with_budget(budget),
            judges: Arc::new(judges),
            tinker_idle: super::tinker::idle_limit(),
        }
    }

    /// Parks an idle Tinker training client after `idle` without a call (default:
    /// `VERITY_TINKER_IDLE_SECS`, else 30 minutes).
    pub fn with_tinker_idle(mut self, idle: std::time::Duration) -> TrainingHandler {
        self.tinker_idle = idle;
        self
    }

    /// Routes and retries judges of model graders as `settings` say (default: no endpoints).
    pub fn with_judge_settings(mut self, settings: JudgeSettings) -> TrainingHandler {
        let judges =
            JudgeProvider::new(settings, self.config.cache_dir.clone(), self.config.device.clone());
        self.judges = Arc::new(judges);
        self
    }

    pub(super) async fn read_file(
        &self,
        file_id: &str,
        heartbeat: &Heartbeat,
    ) -> Result<String, Stop> {
        let key = verity_core::keys::dataset_file(file_id);
        let read = || self.store.get_bytes(&key);
        let bytes = persist("reading a file", heartbeat, StorageError::is_transient, read)
            .await
            .map_err(|e| match e {
                e if e.is_transient() => retryable(&format!("reading file {file_id}"), e),
                e => user_error(format!("file {file_id} cannot be read: {e}")),
            })?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| user_error(format!("file {file_id} is not UTF-8 text")))
    }

    /// Compiles a job's grader, with its embedding model and judge attached.
    pub(super) async fn prepare_grader(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &Value,
    ) -> Result<Grader, Stop> {
        let grader = Grader::from_json(&spec.to_string())
            .map_err(|e| user_error(format!("invalid grader: {e}")))?;
        let pool = lease.queue().pool();
        let grader = self
            .embeddings
            .attach(pool, self.store.as_ref(), lease.job().org_id, grader)
            .await
            .map_err(|(path, e)| match e {
                EmbeddingSetupError::Database(e) => retryable("embedding model lookup", e),
                e => user_error(format!("grader {path}: {e}")),
            })?;
        if !grader.uses_judge() {
            return Ok(grader);
        }
        // the judge loads next to the policy; its prompts run batched on the same sampler
        let judge = self
            .judges
            .judge_for(pool, self.store.as_ref(), lease.job().org_id, &grader)
            .await
            .map_err(|e| match e {
                JudgeSetupError::Database(e) => retryable("judge lookup", e),
                e @ JudgeSetupError::Fetch { transient: true, .. } => {
                    retryable("fetching the judge", e)
                }
                e => user_error(format!("grader: {e}")),
            })?;
        for (path, message) in self.judges.budget_warnings(&grader) {
            tracing::warn!(%message, "judge reply budget clamped");
            let data = json!({"path": path});
            let kind = "judge_budget_clamped";
            event(lease, heartbeat, EventLevel::Warn, kind, &message, Some(&data)).await?;
        }
        Ok(grader.with_judge(judge))
    }

    /// Builds the trainer from the job: spec, grader, model, data, latest checkpoint.
    async fn build(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
    ) -> Result<(Trainer, Option<i32>), Stop> {
        let job = lease.job();
        let spec = if job.spec.get("type").is_some() {
            job.spec.clone()
        } else {
            job.spec.get("method").cloned().unwrap_or(Value::Null)
        };
        let method: Method =
            serde_json::from_value(spec).map_err(|e| user_error(format!("invalid method: {e}")))?;
        method.validate().map_err(|e| user_error(format!("invalid hyperparameters: {e}")))?;
        let pool = lease.queue().pool();
        let grader = match method.reinforcement() {
            Some(reinforcement) => {
                Some(self.prepare_grader(lease, heartbeat, &reinforcement.grader).await?)
            }
            None => None,
        };
        let start = self.start_model(lease, heartbeat).await?;
        let training_file =
            job.training_file.clone().ok_or_else(|| user_error("the job has no training file"))?;
        let train_text = self.read_file(&training_file, heartbeat).await?;
        let validation_text = match &job.validation_file {
            Some(id) => Some((id.clone(), self.read_file(id, heartbeat).await?)),
            None => None,
        };
        let lookup = || verity_core::jobs::list_checkpoints(pool, &job.id, None, 1);
        let checkpoint =
            persist("looking up the checkpoint", heartbeat, is_transient_db_error, lookup)
                .await
                .map_err(|e| retryable("checkpoint lookup", e))?
                .into_iter()
                .next()
                .map(|c| (c.step, c.storage_prefix));
        let checkpoint_dir = match &checkpoint {
            Some((step, prefix)) => {
                let root = self.config.cache_dir.join("jobs");
                let dir = root.join(&job.id).join(format!("resume-{step}"));
                let fetch = || cached_folder(self.store.as_ref(), prefix, &root, &dir);
                Some(
                    persist("downloading the checkpoint", heartbeat, transient_chain, fetch)
                        .await
                        .map_err(|e| retryable("downloading the checkpoint", e))?,
                )
            }
            None => None,
        };
        let device = self.config.device.clone();
        let options = TrainerOptions {
            seed: job.seed as u64,
            base_model: job.model.clone(),
            graders: self.graders.clone(),
        };
        let hp = method.training_hyperparameters();
        let model_name = job.model.clone();
        let built = tokio::task::spawn_blocking(move || -> Result<Trainer, Stop> {
            let loaded = start
                .load(&device)
                .map_err(|e| user_error(format!("model {model_name:?} cannot be loaded: {e}")))?;
            let Some(grader) = grader else {
                // supervised and DPO jobs: fixed targets, no grader
                let train = format!("training file {training_file}");
                let validation =
                    validation_text.map(|(id, text)| (format!("validation file {id}"), text));
                let mut trainer = Trainer::tuning(
                    &method,
                    loaded,
                    (train.as_str(), train_text.as_str()),
                    validation.as_ref().map(|(name, text)| (name.as_str(), text.as_str())),
                    options,
                )
                .map_err(trainer_error)?;
                if let Some(dir) = checkpoint_dir {
                    trainer.restore(&dir).map_err(|e| retryable("restoring the checkpoint", e))?;
                }
                return Ok(trainer);
            };
            let max_prompt = loaded
                .model
                .config
                .max_position_embeddings
                .saturating_sub(hp.max_completion_tokens());
            let train = Dataset::from_jsonl(
                &train_text,
                &format!("training file {training_file}"),
                &loaded.tokenizer,
                max_prompt,
            )
            .map_err(trainer_error)?;
            let validation = match validation_text {
                Some((id, text)) => Some(
                    Dataset::from_jsonl(
                        &text,
                        &format!("validation file {id}"),
                        &loaded.tokenizer,
                        max_prompt,
                    )
                    .map_err(trainer_error)?,
                ),
                None => None,
            };
            let mut trainer = Trainer::new(
                loaded.model,
                loaded.tokenizer,
                grader,
                hp,
                train,
                validation,
                options,
            )
            .map_err(trainer_error)?;
            // OpenAI's structured outputs, enforced while sampling (docs/graders.md)
            if let Some(format) = method.reinforcement().and_then(|r| r.response_format.as_ref()) {
                trainer = trainer.with_response_format(format).map_err(trainer_error)?;
            }
            // Verity extension: multi-turn episodes with tools (docs/tools.md)
            if let Some(environment) = method.reinforcement().and_then(|r| r.environment.clone()) {
                trainer = trainer.with_environment(*environment).map_err(trainer_error)?;
            }
            if let Some(dir) = checkpoint_dir {
                trainer.restore(&dir).map_err(|e| retryable("restoring the checkpoint", e))?;
            }
            Ok(trainer)
        })
        .await
        .map_err(|e| retryable("building the trainer", e))??;
        Ok((built, checkpoint.map(|(step, _)| step)))
    }

    /// Fetches the model the job starts from: a base model, or another job's model or
    /// checkpoint over the model that job started from ([`verity_core::lineage`], org checked).
    async fn start_model(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
    ) -> Result<FetchedStack, Stop> {
        self.fetch_model(lease, heartbeat, &lease.job().model).await
    }

    /// Resolves the org's model `name` (a base, a fine-tuned model or a checkpoint) into its
    /// stack and fetches every folder of it into the local cache.
    pub(super) async fn fetch_model(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        name: &str,
    ) -> Result<FetchedStack, Stop> {
        let org = lease.job().org_id;
        let pool = lease.queue().pool();
        let lookup = || verity_core::lineage::resolve_stack(pool, org, name);
        let stack = persist("looking up the model", heartbeat, is_transient_db_error, lookup)
            .await
            .map_err(|e| retryable("model lookup", e))?
            .ok_or_else(|| user_error(format!("model {name:?} does not exist")))?;
        let cache = self.config.cache_dir.join("models");
        let fetch = || fetch_stack(self.store.as_ref(), &stack, &cache);
        persist("fetching the model", heartbeat, transient_chain, fetch).await.map_err(
            |e| match e {
                e if transient_chain(&e) => retryable("fetching the model", format!("{e:#}")),
                e => user_error(format!("model {name:?} cannot be fetched: {e:#}")),
            },
        )
    }

    /// Saves, publishes and registers a checkpoint of the trainer's current step.
    async fn checkpoint(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        trainer: Trainer,
        metrics: Option<&Value>,
    ) -> Result<Trainer, Stop> {
        let job_id = lease.job().id.clone();
        let step = trainer.step();
        let root = self.config.cache_dir.join("jobs");
        let dir = root.join(&job_id).join(format!("step-{step}"));
        remove_cache_dir(&root, &dir).map_err(|e| user_error(e.to_string()))?;
        let save_dir = dir.clone();
        let trainer = tokio::task::spawn_blocking(move || trainer.save(&save_dir).map(|_| trainer))
            .await
            .map_err(|e| retryable("saving a checkpoint", e))?
            .map_err(|e| retryable("saving a checkpoint", e))?;
        let prefix = verity_core::keys::checkpoint(&job_id, step);
        let publish = || publish_folder(self.store.as_ref(), &dir, &prefix);
        let manifest =
            persist("publishing a checkpoint", heartbeat, StorageError::is_transient, publish)
                .await
                .map_err(|e| retryable("publishing a checkpoint", e))?;
        let register =
            || lease.checkpoint(step as i32, &prefix, manifest.total_bytes as i64, metrics);
        let id = persist("registering a checkpoint", heartbeat, QueueError::is_transient, register)
            .await
            .map_err(|e| lease_error("registering a checkpoint", e))?;
        let data = json!({"step": step, "checkpoint_id": id, "storage_prefix": prefix, "bytes": manifest.total_bytes});
        let message = format!("checkpoint saved at step {step}");
        event(lease, heartbeat, EventLevel::Info, "checkpoint", &message, Some(&data)).await?;
        let _ = remove_cache_dir(&root, &dir);
        Ok(trainer)
    }

    /// Writes `samples/step-{step}.jsonl` and its index rows. Training samples (`training`)
    /// are indexed with their advantage and score; a sampling run's without an advantage, and
    /// a failed grading without a score.
    pub(super) async fn record_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        step: i32,
        records: &[SampleRecord],
        training: bool,
    ) -> Result<(), Stop> {
        let key = verity_core::keys::samples(&lease.job().id, step);
        self.store_samples(lease, heartbeat, step, &key, records, 0, training).await
    }

    /// Writes the validation samples an evaluation after `step` kept
    /// (`samples/step-{step}-validation.jsonl`), indexed after the step's `first` training
    /// samples and without an advantage, which tells them apart.
    async fn record_validation_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        step: u64,
        eval: &Evaluation,
        first: usize,
    ) -> Result<(), Stop> {
        let Evaluation::Reinforcement(eval) = eval else { return Ok(()) };
        if eval.samples.is_empty() {
            return Ok(());
        }
        let key = verity_core::keys::validation_samples(&lease.job().id, step);
        self.store_samples(lease, heartbeat, step as i32, &key, &eval.samples, first, false).await
    }

    /// Writes `records` to `key` and indexes them under `step` from index `first` on.
    #[allow(clippy::too_many_arguments)]
    async fn store_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        step: i32,
        key: &str,
        records: &[SampleRecord],
        first: usize,
        training: bool,
    ) -> Result<(), Stop> {
        let key = key.to_string();
        let mut body = String::new();
        for record in records {
            body.push_str(
                &serde_json::to_string(record).map_err(|e| retryable("encoding samples", e))?,
            );
            body.push('\n');
        }
        let body = Bytes::from(body);
        let put = || self.store.put_bytes(&key, body.clone());
        persist("writing samples", heartbeat, StorageError::is_transient, put)
            .await
            .map_err(|e| retryable("writing samples", e))?;
        let rows: Vec<SampleIndexRow> = records
            .iter()
            .enumerate()
            .map(|(line, s)| SampleIndexRow {
                idx: (first + s.idx) as i32,
                prompt_idx: s.prompt_idx as i32,
                score: (training || s.grader_error.is_none()).then_some(s.score),
                advantage: training.then_some(s.advantage),
                finish_reason: Some(s.finish_reason.clone()),
                storage_key: key.clone(),
                line_no: line as i32,
            })
            .collect();
        let index = || lease.samples(step, &rows);
        persist("indexing samples", heartbeat, QueueError::is_transient, index)
            .await
            .map_err(|e| lease_error("indexing samples", e))
    }

    /// Writes a step's metrics row, metrics line, samples and event.
    async fn record_step(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        out: &StepOutput,
        eval: Option<&Evaluation>,
    ) -> Result<Value, Stop> {
        let job_id = &lease.job().id;
        let step = out.metrics.step;
        let mut row = out.row().map_err(|e| retryable("encoding metrics", e))?;
        if let (Some(eval), Some(map)) = (eval, row.as_object_mut()) {
            map.insert("eval".into(), serde_json::to_value(eval).unwrap_or(Value::Null));
        }
        self.record_samples(lease, heartbeat, step as i32, &out.samples, true).await?;
        let metric = || lease.metric(step as i32, &row);
        persist("writing metrics", heartbeat, QueueError::is_transient, metric)
            .await
            .map_err(|e| lease_error("writing metrics", e))?;
        let line = || append_metrics_line(self.store.as_ref(), job_id, step, &row);
        persist("writing metrics.jsonl", heartbeat, transient_chain, line)
            .await
            .map_err(|e| retryable("writing metrics.jsonl", e))?;
        let (summary, message) = match &out.tuning {
            None => (
                json!({"step": step, "reward_mean": out.metrics.reward_mean, "loss": out.metrics.loss}),
                format!("step {step}: reward {:.3}", out.metrics.reward_mean),
            ),
            Some(tuning) => (
                json!({"step": step, "loss": tuning.loss}),
                format!("step {step}: loss {:.4}", tuning.loss),
            ),
        };
        event(lease, heartbeat, EventLevel::Debug, "step", &message, Some(&summary)).await?;
        if let Some(eval) = eval {
            eval_event(lease, heartbeat, eval).await?;
        }
        Ok(row)
    }

    /// Evaluates in a blocking task (its phase reported, counted by the trainer where it
    /// samples); hands the trainer back.
    async fn evaluate(
        &self,
        trainer: Trainer,
        heartbeat: &Heartbeat,
        progress: &LiveProgress,
    ) -> Result<(Trainer, Option<Evaluation>), Stop> {
        progress.phase(JobPhase::Trainer(Phase::Evaluating { done: 0, total: 0 }));
        let (trainer, eval) = blocking_until_cancelled(heartbeat, "evaluation", move || {
            let eval = trainer.evaluation();
            (trainer, eval)
        })
        .await?;
        Ok((trainer, eval.map_err(trainer_error)?))
    }

    /// The job's metrics rows so far, by step.
    async fn metrics_rows(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
    ) -> Result<Vec<(i32, Value)>, Stop> {
        let pool = lease.queue().pool();
        let read = || verity_core::jobs::metrics_rows(pool, &lease.job().id);
        persist("reading the metrics", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the metrics", e))
    }

    /// The job's rows as the monitor reads them (baseline and steps so far).
    async fn monitor_rows(&self, lease: &Lease, heartbeat: &Heartbeat) -> Result<Vec<Value>, Stop> {
        let pool = lease.queue().pool();
        let read = || verity_core::monitor::job_rows(pool, &lease.job().id);
        persist("reading the metrics", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the metrics", e))
    }

    /// Reports the warnings a new row set off (a `warning` event each, the first time a kind
    /// fires); the reason to pause when one of them is listed in `auto_pause_on` (after an
    /// `auto_pause` event).
    async fn watch_row(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        watch: &mut Watch,
        row: Value,
    ) -> Result<Option<String>, Stop> {
        let mut pause = None;
        for warning in watch.observe(row) {
            let data = serde_json::to_value(&warning).unwrap_or(Value::Null);
            event(lease, heartbeat, EventLevel::Warn, "warning", &warning.message, Some(&data))
                .await?;
            if watch.pauses(&warning) {
                let message = format!(
                    "paused by auto_pause_on: {} ({} = {:.3}, threshold {:.3}, step {}); resume the \
                     job to continue",
                    warning.kind.as_str(),
                    warning.metric,
                    warning.value,
                    warning.threshold,
                    warning.step
                );
                event(lease, heartbeat, EventLevel::Warn, "auto_pause", &message, Some(&data))
                    .await?;
                pause = Some(message);
            }
        }
        Ok(pause)
    }

    /// Pauses the job itself for `reason`: checkpoints the trainer (unless `trainer` is `None`:
    /// nothing was trained since the checkpoint it resumed from), stores the reason with the
    /// progress, and ends the attempt as paused, as a user's pause does.
    async fn pause_for(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        progress: &LiveProgress,
        trainer: Option<Trainer>,
        metrics: Option<&Value>,
        reason: &str,
    ) -> Result<JobOutcome, Stop> {
        if let Some(trainer) = trainer {
            progress.phase(JobPhase::Checkpointing);
            self.checkpoint(lease, heartbeat, trainer, metrics).await?;
        }
        progress.paused(reason);
        if let Some(report) = progress.snapshot() {
            let store = || lease.heartbeat(Some(&report));
            persist("reporting progress", heartbeat, QueueError::is_transient, store)
                .await
                .map_err(|e| lease_error("reporting progress", e))?;
        }
        Ok(JobOutcome::Paused)
    }

    /// Reports a cap of the job's budget reached after `step` (a `budget_pause` event); the
    /// reason to pause.
    async fn budget_reached(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        reached: verity_core::budget::Reached,
        step: u64,
    ) -> Result<String, Stop> {
        let field = reached.cap.field();
        let reason = format!(
            "{}; raise {field} (POST /v1/verity/jobs/{}/budget) and resume the job to continue",
            reached.describe(step),
            lease.job().id
        );
        let data =
            json!({"cap": field, "limit": reached.limit, "used": reached.used, "step": step});
        tracing::info!(job_id = %lease.job().id, cap = field, step, "budget reached; pausing the job");
        event(lease, heartbeat, EventLevel::Warn, "budget_pause", &reason, Some(&data)).await?;
        Ok(reason)
    }

    /// Writes the results file and describes the model the job produced (its final checkpoint).
    async fn trained_model(
        &self,
        heartbeat: &Heartbeat,
        rows: &[(i32, Value)],
        checkpoint: String,
        lora: bool,
    ) -> Result<TrainedModel, Stop> {
        let write = || write_results_file(self.store.as_ref(), rows);
        let file =
            persist("writing the results file", heartbeat, StorageError::is_transient, write)
                .await
                .map_err(|e| retryable("writing the results file", e))?;
        Ok(TrainedModel {
            storage_prefix: checkpoint,
            format: if lora { "peft" } else { "hf" }.to_string(),
            results_file: Some(file),
        })
    }

    async fn train(&self, lease: &Lease, heartbeat: &Heartbeat) -> Result<JobOutcome, Stop> {
        // The attempt's wall time counts from here: set-up (model download and load) included.
        let started = std::time::Instant::now();
        // Until the trainer reports, the job is loading: a resumed job must not keep showing
        // the phase it paused in (e.g. `checkpointing`) while its model and checkpoint load.
        heartbeat.reporter().report(json!({"phase": "loading"}));
        let (mut trainer, resumed) = self.build(lease, heartbeat).await?;
        let trained_tokens: u64 = match resumed {
            Some(_) => {
                self.metrics_rows(lease, heartbeat).await?.iter().map(|(_, r)| step_tokens(r)).sum()
            }
            None => 0,
        };
        let progress = LiveProgress::new(
            heartbeat.reporter(),
            trainer.step(),
            trainer.total_steps(),
            trained_tokens,
        );
        progress.publish();
        trainer.observe_phases(progress.observer());
        match resumed {
            Some(step) => {
                let message = format!("resumed from the checkpoint of step {step}");
                let data = json!({"step": step});
                event(lease, heartbeat, EventLevel::Info, "resumed", &message, Some(&data)).await?
            }
            None => {
                let model = &lease.job().model;
                let base_model = verity_core::models::root_base_model(model);
                let data = json!({"total_steps": trainer.total_steps(), "model": model, "base_model": base_model});
                let message = "training started";
                event(lease, heartbeat, EventLevel::Info, "started", message, Some(&data)).await?
            }
        }
        let mut meter = Meter::new(usage_before(lease, heartbeat).await?, started);
        let caps = store_usage(lease, heartbeat, meter.usage()).await?;
        if let Some(reached) = caps.reached(meter.usage()) {
            // Already at a cap (lowered while queued): pause before training anything.
            let reason = self.budget_reached(lease, heartbeat, reached, trainer.step()).await?;
            return self.pause_for(lease, heartbeat, &progress, None, None, &reason).await;
        }
        let hp = trainer.hyperparameters().clone();
        let mut watch = Watch::new(self.monitor_rows(lease, heartbeat).await?, &hp.auto_pause_on);
        if hp.eval_on_start && resumed.is_none() {
            let (returned, baseline) = self.evaluate(trainer, heartbeat, &progress).await?;
            trainer = returned;
            if let Some(baseline) = baseline {
                self.record_validation_samples(lease, heartbeat, 0, &baseline, 0).await?;
                eval_event(lease, heartbeat, &baseline).await?;
                let row = json!({"step": 0, "eval": baseline});
                self.watch_row(lease, heartbeat, &mut watch, row).await?;
            }
        }
        let mut last_eval = None;
        // Each step is timed from the end of the one before, its checkpoint included.
        let mut lap = std::time::Instant::now();
        while !trainer.finished() {
            match heartbeat.state() {
                HeartbeatState::Lost => return Ok(JobOutcome::LeaseLost),
                HeartbeatState::Held(ControlSignal::Cancel) => return Ok(JobOutcome::Cancelled),
                HeartbeatState::Held(ControlSignal::Pause) => {
                    progress.phase(JobPhase::Checkpointing);
                    self.checkpoint(lease, heartbeat, trainer, None).await?;
                    return Ok(JobOutcome::Paused);
                }
                HeartbeatState::Held(ControlSignal::Continue) => {}
            }
            let (returned, out) = blocking_until_cancelled(heartbeat, "training step", move || {
                let out = trainer.train_step();
                (trainer, out)
            })
            .await?;
            trainer = returned;
            let out = match out {
                // A judge outage is not a verdict: keep the progress and pause until it is back.
                Err(TrainerError::JudgeUnavailable(reason)) => {
                    let message = format!(
                        "judge unavailable: {reason}; the step was not scored and the job is \
                         paused — resume it when the judge is back"
                    );
                    tracing::warn!(%message, "pausing the job");
                    event(lease, heartbeat, EventLevel::Warn, "judge_unavailable", &message, None)
                        .await?;
                    let trainer = Some(trainer);
                    return self
                        .pause_for(lease, heartbeat, &progress, trainer, None, &message)
                        .await;
                }
                out => out.map_err(trainer_error)?,
            };
            if heartbeat.state() == HeartbeatState::Lost {
                return Ok(JobOutcome::LeaseLost);
            }
            let step = trainer.step();
            let eval = if trainer.eval_due() {
                let (returned, eval) = self.evaluate(trainer, heartbeat, &progress).await?;
                trainer = returned;
                eval
            } else {
                None
            };
            let row = self.record_step(lease, heartbeat, &out, eval.as_ref()).await?;
            if let Some(eval) = &eval {
                let first = out.samples.len();
                self.record_validation_samples(lease, heartbeat, step, eval, first).await?;
            }
            meter.step_done(out.metrics.generated_tokens);
            let usage = meter.usage();
            let caps = store_usage(lease, heartbeat, usage).await?;
            progress.budget(caps, usage, meter.tokens_per_step());
            // The step is reported the moment its metrics row exists, so the step shown never
            // lags the charts.
            progress.step_done(step, lap.elapsed().as_secs_f64(), out.metrics.trained_tokens);
            lap = std::time::Instant::now();
            if let Some(report) = progress.snapshot() {
                // Stored before the next step begins, however fast steps are.
                let store = || lease.heartbeat(Some(&report));
                persist("reporting progress", heartbeat, QueueError::is_transient, store)
                    .await
                    .map_err(|e| lease_error("reporting progress", e))?;
            }
            if eval.is_some() {
                last_eval = eval;
            }
            let mut pause = self.watch_row(lease, heartbeat, &mut watch, row.clone()).await?;
            if let Some(reached) = caps.reached(usage).filter(|_| !trainer.finished()) {
                let reason = self.budget_reached(lease, heartbeat, reached, step).await?;
                pause = Some(match pause {
                    Some(warning) => format!("{reason}; {warning}"),
                    None => reason,
                });
            }
            if let Some(reason) = pause.filter(|_| !trainer.finished()) {
                let trainer = Some(trainer);
                return self
                    .pause_for(lease, heartbeat, &progress, trainer, Some(&row), &reason)
                    .await;
            }
            if trainer.finished() || step % hp.checkpoint_interval as u64 == 0 {
                progress.phase(JobPhase::Checkpointing);
                trainer = self.checkpoint(lease, heartbeat, trainer, Some(&row)).await?;
                progress.phase_over();
            }
        }
        let step = trainer.step();
        let checkpoint = verity_core::keys::checkpoint(&lease.job().id, step);
        let rows = self.metrics_rows(lease, heartbeat).await?;
        let trained_tokens: u64 = rows.iter().map(|(_, r)| step_tokens(r)).sum();
        let model =
            self.trained_model(heartbeat, &rows, checkpoint.clone(), hp.lora.is_some()).await?;
        let result_files: Vec<&str> = model.results_file.iter().map(|f| f.id.as_str()).collect();
        let result = json!({
            "steps": step,
            "checkpoint": checkpoint,
            "eval": last_eval,
            "trained_tokens": trained_tokens,
            "result_files": result_files,
        });
        let message = format!("training finished after {step} steps");
        event(lease, heartbeat, EventLevel::Info, "succeeded", &message, Some(&result)).await?;
        Ok(JobOutcome::Succeeded { result, fine_tuned_model: Some(Box::new(model)) })
    }
}

/// The `trained_tokens` of a stored metrics row (0 for rows written before it was measured).
fn step_tokens(row: &Value) -> u64 {
    row.get("trained_tokens").and_then(Value::as_u64).unwrap_or(0)
}

/// An `eval` event carrying the validation results (step 0 is the baseline before training).
async fn eval_event(lease: &Lease, heartbeat: &Heartbeat, eval: &Evaluation) -> Result<(), Stop> {
    let data = serde_json::to_value(eval).unwrap_or(Value::Null);
    let message = eval.summary();
    event(lease, heartbeat, EventLevel::Info, "eval", &message, Some(&data)).await
}

/// Appends an event to the job's log, retrying while the database is unreachable.
pub(super) async fn event(
    lease: &Lease,
    heartbeat: &Heartbeat,
    level: EventLevel,
    kind: &str,
    message: &str,
    data: Option<&Value>,
) -> Result<(), Stop> {
    let write = || lease.event(level, kind, message, data);
    persist("writing an event", heartbeat, QueueError::is_transient, write)
        .await
        .map_err(|e| lease_error("writing an event", e))
}

#[async_trait]
impl JobHandler for TrainingHandler {
    async fn run(&self, lease: &Lease, heartbeat: &Heartbeat) -> JobOutcome {
        let spec = &lease.job().spec;
        let work = if let Some(client) = verity_core::tinker::clients::ClientSpec::of_job(spec) {
            self.tinker_client(lease, heartbeat, client).await
        } else if let Some(run) = verity_core::sampling_runs::RunSpec::of_job(spec) {
            self.sampling_run(lease, heartbeat, run).await
        } else {
            self.train(lease, heartbeat).await
        };
        let outcome = match work {
            Ok(outcome) => outcome,
            Err(Stop::Outcome(outcome)) => outcome,
        };
        // The job's model, optimizer state and activations are dropped: give the memory back.
        let released = crate::memory::release_freed_memory();
        tracing::debug!(job_id = %lease.job().id, released, "freed memory returned after the job");
        if let JobOutcome::Failed { message, retryable } = &outcome {
            tracing::warn!(job_id = %lease.job().id, %message, retryable, "training failed");
            let _ = lease
                .event(EventLevel::Error, "failed", message, Some(&json!({"retryable": retryable})))
                .await;
        }
        outcome
    }
}
