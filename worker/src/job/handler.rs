//! [`TrainingHandler`]: runs one claimed training job under its lease — set-up (files, grader,
//! trainer) and the step loop; what it records, checkpoints and pauses for lives beside it.

use super::budget::{store_usage, usage_before, Meter};
use super::cancellable::blocking_until_cancelled;
use super::progress::{JobPhase, LiveProgress};
use super::records::{eval_event, step_tokens};
use super::stop::{
    event, lease_error, persist, retryable, trainer_error, transient_chain, user_error, Stop,
};
use super::watch::Watch;
use crate::checkpoint::cache::cached_folder;
use crate::embedding_models::{EmbeddingModels, EmbeddingSetupError};
use crate::judge::{JudgeProvider, JudgeSettings, JudgeSetupError};
use crate::trainer::{Dataset, Evaluation, Phase, Trainer, TrainerError, TrainerOptions};
use async_trait::async_trait;
use candle_core::Device;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use verity_core::queue::{
    is_transient_db_error, EventLevel, Heartbeat, HeartbeatState, JobHandler, JobOutcome, Lease,
    QueueError,
};
use verity_core::spec::Method;
use verity_core::storage::{ObjectStore, StorageError};
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
    /// The hub model pulls fetch from, and this worker's cache of it.
    pub(super) hub: crate::hub::Hub,
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
            hub: crate::hub::Hub {
                progress: false,
                max_bytes: Some(crate::hub::api_pull_limit()),
                ..crate::hub::Hub::from_env()
            },
        }
    }

    /// Parks an idle Tinker training client after `idle` without a call (default:
    /// `VERITY_TINKER_IDLE_SECS`, else 30 minutes).
    pub fn with_tinker_idle(mut self, idle: std::time::Duration) -> TrainingHandler {
        self.tinker_idle = idle;
        self
    }

    /// Fetches model pulls from `hub` (default: the worker's environment, `HF_ENDPOINT`,
    /// `HF_HOME`, `HF_TOKEN`, limited to `VERITY_PULL_MAX_GB`).
    pub fn with_hub(mut self, hub: crate::hub::Hub) -> TrainingHandler {
        self.hub = hub;
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

#[async_trait]
impl JobHandler for TrainingHandler {
    async fn run(&self, lease: &Lease, heartbeat: &Heartbeat) -> JobOutcome {
        let spec = &lease.job().spec;
        let work = if let Some(client) = verity_core::tinker::clients::ClientSpec::of_job(spec) {
            self.tinker_client(lease, heartbeat, client).await
        } else if let Some(pull) = verity_core::model_pulls::PullSpec::of_job(spec) {
            self.model_pull(lease, heartbeat, pull).await
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
