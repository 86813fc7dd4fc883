//! Tinker training clients under their lease: the worker loads the client's model (LoRA
//! adapters of the asked rank, or every weight), completes the client's `create_model` future,
//! then runs the client's calls in their order as they arrive — `forward_backward`, `forward`,
//! `optim_step` on the resident [`TinkerTrainer`], `save_weights_for_sampler` as a checkpoint of
//! the client's queue row (so the weights are a Verity model, sampled by inference workers) —
//! until the session ends or the user cancels it. A client idle past its limit (or paused by
//! the user) is parked: its state saved as a checkpoint, its row `paused`, its worker free; the
//! next call queues it again and the worker that claims it restores that checkpoint first.

use super::handler::TrainingHandler;
use super::runs::interrupted;
use super::stop::{lease_error, persist, retryable, transient_chain, user_error, Stop};
use crate::checkpoint::cache::{cached_folder, remove_cache_dir};
use crate::checkpoint::save_checkpoint;
use crate::model::lora::LoraConfig;
use crate::tinker::{TinkerCallError, TinkerTrainer};
use crate::tokenizer::ChatTokenizer;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tracing::Instrument;
use verity_core::queue::{
    is_transient_db_error, Heartbeat, HeartbeatState, JobOutcome, Lease, QueueError,
};
use verity_core::storage::{publish_folder, StorageError};
use verity_core::tinker::clients::{
    self, CallOutcome, ClientSpec, Parking, QueuedCall, Restore, Resumable,
};
use verity_core::tinker::training::{AdamParams, ForwardBackward};
use verity_core::ControlSignal;

/// LoRA's `alpha` for every rank (the update is scaled by `alpha / rank`).
pub const LORA_ALPHA: f64 = 32.0;

/// How long a client may wait for its next call before its worker parks it
/// (`VERITY_TINKER_IDLE_SECS`, else 30 minutes).
pub(super) fn idle_limit() -> Duration {
    let secs = std::env::var("VERITY_TINKER_IDLE_SECS").ok().and_then(|s| s.parse().ok());
    Duration::from_secs(secs.unwrap_or(30 * 60))
}

/// The longest pause between two looks for the next call.
const MAX_POLL: Duration = Duration::from_millis(50);

/// How often the loop checks that the client's session is still open.
const SESSION_CHECK: Duration = Duration::from_secs(2);

/// What a client holds while it runs.
struct Resident {
    trainer: TinkerTrainer,
    tokenizer: ChatTokenizer,
    /// The checkpoint of the client's row that holds the current weights and optimizer state;
    /// `None` once they changed since.
    saved: Option<i32>,
    /// The client's newest checkpoint: a new one is numbered past it, so no save is ever
    /// overwritten by different weights (after `load_weights` took the optimizer step back).
    last: Option<i32>,
}

impl Resident {
    /// The number of the checkpoint that saves the current state: the optimizer step, or one
    /// past the newest checkpoint when that is not below it.
    fn next_checkpoint(&self) -> i32 {
        let step = self.trainer.steps() as i32;
        match self.last {
            Some(last) if last >= step => last + 1,
            _ => step,
        }
    }
}

/// `save_weights_for_sampler`'s and `save_weights`' arguments.
#[derive(Debug, Deserialize)]
struct Save {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    sampling_session_seq_id: Option<i64>,
    /// Seconds until the path expires (checked by the API server).
    #[serde(default)]
    ttl_seconds: Option<i64>,
}

/// `load_weights`' arguments (the path checked by the API server).
#[derive(Debug, Deserialize)]
struct Load {
    path: String,
    #[serde(default)]
    optimizer: bool,
}

/// What a save is for: sampling (`sampler_weights/…`), resuming training (`weights/…`) or
/// downloading the weights as a Hugging Face folder (`external_weights/…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SaveKind {
    Sampler,
    Training,
    External,
}

impl SaveKind {
    /// `tinker_checkpoints.kind`.
    fn as_str(self) -> &'static str {
        match self {
            SaveKind::Sampler => "sampler",
            SaveKind::Training => "training",
            SaveKind::External => "external",
        }
    }

    /// The path segment Tinker's paths use.
    fn segment(self) -> &'static str {
        match self {
            SaveKind::Sampler => "sampler_weights",
            SaveKind::Training => "weights",
            SaveKind::External => "external_weights",
        }
    }

    /// The call it answers.
    fn call(self) -> &'static str {
        match self {
            SaveKind::Sampler => "save_weights_for_sampler",
            SaveKind::Training => "save_weights",
            SaveKind::External => "save_weights_external",
        }
    }
}

/// `optim_step`'s arguments.
#[derive(Debug, Deserialize)]
struct OptimStep {
    #[serde(default)]
    adam_params: AdamParams,
}

/// A failed call as the SDK reads it (`RequestFailedError` with this category).
fn failure(message: impl Into<String>, user: bool) -> Value {
    json!({"error": message.into(), "category": if user { "user" } else { "server" }})
}

fn json_result(value: &Value) -> CallOutcome {
    Ok(("application/json".to_string(), value.to_string().into_bytes()))
}

impl TrainingHandler {
    /// Runs a claimed Tinker training client until it ends.
    pub(super) async fn tinker_client(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: Result<ClientSpec, serde_json::Error>,
    ) -> Result<JobOutcome, Stop> {
        let spec = spec.map_err(|e| user_error(format!("invalid training client: {e}")))?;
        let outcome = match self.serve_client(lease, heartbeat, &spec).await {
            // A failed client is not tried again: its calls are answered with the failure
            // below, and only a lost worker's client comes back (`clients::resumable`).
            Ok(JobOutcome::Failed { message, .. })
            | Err(Stop::Outcome(JobOutcome::Failed { message, .. })) => {
                Ok(JobOutcome::Failed { message, retryable: false })
            }
            other => other,
        };
        // Nothing runs on the client any more: no poll may wait on its calls.
        if matches!(outcome, Ok(JobOutcome::Released)) {
            // Parked: its calls wait for the worker that takes it next.
            return outcome;
        }
        let reason = match &outcome {
            Ok(JobOutcome::Failed { message, .. })
            | Err(Stop::Outcome(JobOutcome::Failed { message, .. })) => {
                format!("the training client failed: {message}")
            }
            _ => "the training client ended; create a new one".to_string(),
        };
        let pool = lease.queue().pool();
        let error = failure(reason, false);
        let _ = clients::fail_waiting_calls(pool, &spec.model_id, &error).await;
        let _ = verity_core::tinker::fail_future(pool, &spec.create_future, &error).await;
        outcome
    }

    async fn serve_client(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &ClientSpec,
    ) -> Result<JobOutcome, Stop> {
        let job = lease.job();
        let pool = lease.queue().pool();
        let read = || clients::parked_checkpoint(pool, &spec.model_id);
        let parked = persist("reading the client", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the client", e))?;
        // A claim after the first with nothing parked: the worker before was lost.
        let lost = job.attempt > 1 && parked.is_none();
        let mut resume = parked;
        if lost {
            let check = || clients::resumable(pool, &spec.model_id, &job.id);
            let resumable = persist("reading the client", heartbeat, is_transient_db_error, check)
                .await
                .map_err(|e| retryable("reading the client", e))?;
            match resumable {
                Resumable::From(checkpoint) => resume = Some(checkpoint),
                Resumable::Fresh => {}
                Resumable::Lost => {
                    return Err(user_error(
                        "the worker holding this training client was lost, and with it the \
                         weights and optimizer state since its last save; create a new \
                         training client (or one from its last save_state)",
                    ))
                }
            }
            tracing::warn!(job_id = %job.id, model_id = %spec.model_id, checkpoint = ?resume,
                           "tinker client's worker was lost; its state is whole, resuming");
        }
        let mut resident = self.load_client(lease, heartbeat, spec).await?;
        let newest = || clients::last_checkpoint(pool, &job.id);
        resident.last = persist("reading checkpoints", heartbeat, is_transient_db_error, newest)
            .await
            .map_err(|e| retryable("reading checkpoints", e))?;
        if let Some(checkpoint) = resume {
            // A parked client (or a lost one whose newest checkpoint holds its state): its
            // state comes back from that checkpoint.
            let restore = Restore { job_id: job.id.clone(), step: checkpoint, optimizer: true };
            let (back, restored) = self.restore(heartbeat, resident, &restore).await?;
            resident = back;
            restored.map_err(|e| retryable("restoring the parked client", e))?;
            resident.saved = Some(checkpoint);
            if parked.is_some() {
                let clear = || clients::unpark(pool, &spec.model_id);
                persist("clearing the parked state", heartbeat, is_transient_db_error, clear)
                    .await
                    .map_err(|e| retryable("clearing the parked state", e))?;
            }
            tracing::info!(job_id = %job.id, model_id = %spec.model_id, checkpoint, "tinker training client restored");
        } else {
            if let Some(restore) = &spec.restore {
                let (back, restored) = self.restore(heartbeat, resident, restore).await?;
                resident = back;
                restored.map_err(|e| user_error(format!("loading the saved weights: {e}")))?;
            }
            let kind = if spec.restore.is_some() { "load_weights" } else { "create_model" };
            let created = json!({"model_id": spec.model_id, "type": kind}).to_string();
            let complete = || {
                verity_core::tinker::complete_future(
                    pool,
                    &spec.create_future,
                    "application/json",
                    created.as_bytes(),
                )
            };
            persist("completing create_model", heartbeat, is_transient_db_error, complete)
                .await
                .map_err(|e| retryable("completing create_model", e))?;
            tracing::info!(job_id = %job.id, model_id = %spec.model_id, "tinker training client ready");
        }
        let idle = self.tinker_idle;
        let mut last_call = Instant::now();
        let mut session_checked = Instant::now();
        let mut wait = Duration::from_millis(2);
        loop {
            if heartbeat.state() == HeartbeatState::Held(ControlSignal::Pause) {
                if resident.trainer.pending_backwards() > 0 {
                    tracing::warn!(job_id = %job.id, model_id = %spec.model_id,
                        "paused with gradients not yet applied by optim_step: they are dropped");
                }
                match self.park(lease, heartbeat, spec, resident, true).await? {
                    Ok(outcome) => return Ok(outcome),
                    Err(back) => resident = back,
                }
            }
            if let Some(outcome) = interrupted(heartbeat) {
                return Ok(outcome);
            }
            let read = || clients::next_call(pool, &spec.model_id);
            let next = persist("reading the next call", heartbeat, is_transient_db_error, read)
                .await
                .map_err(|e| retryable("reading the next call", e))?;
            let Some(call) = next else {
                if last_call.elapsed() > idle {
                    if resident.trainer.pending_backwards() > 0 {
                        // Gradients wait for an optim_step that no checkpoint can hold: end
                        // the client (its next call says so) rather than drop them unseen.
                        let result = json!({"released": "idle", "idle_seconds": idle.as_secs(),
                                            "gradients_dropped": true});
                        return Ok(JobOutcome::Succeeded { result, fine_tuned_model: None });
                    }
                    match self.park(lease, heartbeat, spec, resident, false).await? {
                        Ok(outcome) => return Ok(outcome),
                        Err(back) => {
                            // A call arrived as it parked: run it.
                            resident = back;
                            last_call = Instant::now();
                            continue;
                        }
                    }
                }
                if session_checked.elapsed() > SESSION_CHECK {
                    session_checked = Instant::now();
                    let open =
                        || verity_core::tinker::session_is_open(pool, job.org_id, &spec.session_id);
                    let open =
                        persist("reading the session", heartbeat, is_transient_db_error, open)
                            .await
                            .map_err(|e| retryable("reading the session", e))?;
                    if !open {
                        let result = json!({"released": "session_finished"});
                        return Ok(JobOutcome::Succeeded { result, fine_tuned_model: None });
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_POLL);
                continue;
            };
            let span = tracing::info_span!("tinker_call", model_id = %spec.model_id, seq_id = call.seq_id, kind = %call.kind);
            let started = Instant::now();
            let ran = self.run_call(lease, heartbeat, spec, resident, &call).instrument(span).await;
            let (back, outcome) = ran?;
            resident = back;
            let took = started.elapsed();
            tracing::debug!(
                model_id = %spec.model_id,
                seq_id = call.seq_id,
                elapsed_ms = took.as_millis() as u64,
                ok = outcome.is_ok(),
                "tinker call ran"
            );
            let finish = || {
                let queue = lease.queue();
                clients::finish_call(queue, &spec.model_id, job.attempt, &call, &outcome, took)
            };
            persist("recording the call", heartbeat, QueueError::is_transient, finish)
                .await
                .map_err(|e| lease_error("recording the call", e))?;
            last_call = Instant::now();
            wait = Duration::from_millis(2);
        }
    }

    /// Saves the client's state (unless a checkpoint holds it already) and parks it: the
    /// outcome to end this attempt with, or the resident back when a call is waiting (only
    /// without `force`) and must run instead.
    async fn park(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &ClientSpec,
        resident: Resident,
        force: bool,
    ) -> Result<Result<JobOutcome, Resident>, Stop> {
        let mut resident = resident;
        loop {
            let (back, checkpoint) =
                self.checkpoint_state(lease, heartbeat, spec, resident).await?;
            resident = back;
            let attempt = lease.job().attempt;
            let park = || clients::park(lease.queue(), &spec.model_id, attempt, checkpoint, force);
            let parked = persist("parking the client", heartbeat, QueueError::is_transient, park)
                .await
                .map_err(|e| lease_error("parking the client", e))?;
            return Ok(match parked {
                Parking::Parked => Ok(JobOutcome::Released),
                Parking::CallWaiting => Err(resident),
                Parking::SessionFinished => Ok(JobOutcome::Succeeded {
                    result: json!({"released": "session_finished"}),
                    fine_tuned_model: None,
                }),
                Parking::CheckpointGone => {
                    // Deleted with its last path since it was saved: save the state anew.
                    resident.saved = None;
                    continue;
                }
            });
        }
    }

    /// Fetches and loads the client's model, with LoRA adapters when it asks for a rank.
    async fn load_client(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &ClientSpec,
    ) -> Result<Resident, Stop> {
        let stack = self.fetch_model(lease, heartbeat, &spec.base_model).await?;
        let device = self.config.device.clone();
        let (name, rank, seed) = (spec.base_model.clone(), spec.lora_rank, spec.seed);
        tokio::task::spawn_blocking(move || -> Result<Resident, Stop> {
            let loaded = stack
                .load(&device)
                .map_err(|e| user_error(format!("model {name:?} cannot be loaded: {e}")))?;
            let mut model = loaded.model;
            if let Some(rank) = rank {
                let modules =
                    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
                let config = LoraConfig {
                    r: rank as usize,
                    lora_alpha: LORA_ALPHA,
                    target_modules: modules.iter().map(|m| m.to_string()).collect(),
                    lora_dropout: 0.0,
                };
                model.enable_lora(config, seed).map_err(|e| user_error(format!("LoRA: {e}")))?;
            }
            let pad = loaded.tokenizer.pad_id();
            let trainer = TinkerTrainer::new(model, pad)
                .map_err(|e| retryable("creating the optimizer", e))?;
            Ok(Resident { trainer, tokenizer: loaded.tokenizer, saved: None, last: None })
        })
        .await
        .map_err(|e| retryable("loading the model", e))?
    }

    /// Runs one call on the resident model (compute off the async threads); returns the model
    /// back with the call's outcome.
    async fn run_call(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &ClientSpec,
        mut resident: Resident,
        call: &QueuedCall,
    ) -> Result<(Resident, CallOutcome), Stop> {
        match call.kind.as_str() {
            "forward_backward" | "forward" => {
                let parsed: Result<ForwardBackward, _> = serde_json::from_value(call.body.clone());
                let Ok(work) = parsed else {
                    return Ok((resident, Err(failure("malformed forward_backward call", false))));
                };
                let (resident, result) = tokio::task::spawn_blocking(move || {
                    let result = resident.trainer.forward_backward(&work);
                    (resident, result)
                })
                .await
                .map_err(|e| retryable("running forward_backward", e))?;
                let outcome = result
                    .map_err(call_failure)
                    .and_then(|out| {
                        serde_json::to_value(out).map_err(|e| failure(e.to_string(), false))
                    })
                    .and_then(|value| json_result(&value));
                Ok((resident, outcome))
            }
            "optim_step" => {
                let parsed: Result<OptimStep, _> = serde_json::from_value(call.body.clone());
                let Ok(step) = parsed else {
                    return Ok((resident, Err(failure("malformed optim_step call", false))));
                };
                let (resident, result) = tokio::task::spawn_blocking(move || {
                    resident.saved = None;
                    let result = resident.trainer.optim_step(&step.adam_params);
                    (resident, result)
                })
                .await
                .map_err(|e| retryable("running optim_step", e))?;
                let outcome = result.map_err(call_failure).and_then(|metrics| {
                    json_result(&json!({"metrics": metrics, "type": "optim_step"}))
                });
                Ok((resident, outcome))
            }
            "save_weights_for_sampler" | "save_weights" | "save_weights_external" => {
                let kind = match call.kind.as_str() {
                    "save_weights" => SaveKind::Training,
                    "save_weights_external" => SaveKind::External,
                    _ => SaveKind::Sampler,
                };
                let Ok(save) = serde_json::from_value::<Save>(call.body.clone()) else {
                    return Ok((
                        resident,
                        Err(failure(format!("malformed {} call", kind.call()), false)),
                    ));
                };
                self.save(lease, heartbeat, spec, resident, &save, kind).await
            }
            "load_weights" => {
                let Ok(load) = serde_json::from_value::<Load>(call.body.clone()) else {
                    return Ok((resident, Err(failure("malformed load_weights call", false))));
                };
                let pool = lease.queue().pool();
                let find = || clients::saved_source(pool, lease.job().org_id, &load.path);
                let source =
                    persist("reading the saved path", heartbeat, is_transient_db_error, find)
                        .await
                        .map_err(|e| retryable("reading the saved path", e))?;
                let Some(source) = source else {
                    let message = format!("no weights were saved at {:?}", load.path);
                    return Ok((resident, Err(failure(message, true))));
                };
                let restore =
                    Restore { job_id: source.job_id, step: source.step, optimizer: load.optimizer };
                resident.saved = None;
                let (resident, restored) = self.restore(heartbeat, resident, &restore).await?;
                let outcome = restored.map_err(call_failure).and_then(|()| {
                    json_result(&json!({"path": load.path, "type": "load_weights"}))
                });
                Ok((resident, outcome))
            }
            clients::REFUSED => {
                let message = call.body["error"].as_str().unwrap_or("refused").to_string();
                Ok((resident, Err(failure(message, true))))
            }
            other => {
                let message = format!(
                    "Verity does not serve `{other}` on training clients yet (docs/tinker.md): \
                     use save_weights_for_sampler, whose weights are a Verity model"
                );
                Ok((resident, Err(failure(message, true))))
            }
        }
    }

    /// Records the client's state as a save under its `tinker://` path (a checkpoint of the
    /// client's queue row: a Verity model), and opens a sampling session on it when the SDK
    /// asks for one.
    async fn save(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &ClientSpec,
        resident: Resident,
        save: &Save,
        kind: SaveKind,
    ) -> Result<(Resident, CallOutcome), Stop> {
        let job = lease.job();
        let pool = lease.queue().pool();
        let read =
            || verity_core::jobs::get_job_of_kind(pool, job.org_id, clients::TINKER, &job.id);
        let record = persist("reading the client", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the client", e))?
            .ok_or_else(|| retryable("reading the client", "its row is gone"))?;
        let mut resident = resident;
        let (step, model, path) = loop {
            let (back, step) = self.checkpoint_state(lease, heartbeat, spec, resident).await?;
            resident = back;
            let model =
                verity_core::models::checkpoint_model_name(&record.output_model_name(), step);
            let name = save.path.clone().unwrap_or_else(|| format!("step-{step}"));
            let path = format!("tinker://{}/{}/{name}", job.id, kind.segment());
            let saved = clients::SavedWeights {
                path: &path,
                kind: kind.as_str(),
                step,
                model: &model,
                ttl_seconds: save.ttl_seconds,
            };
            let record_path =
                || clients::record_checkpoint(pool, job.org_id, &spec.model_id, &saved);
            let recorded =
                persist("recording the path", heartbeat, is_transient_db_error, record_path)
                    .await
                    .map_err(|e| retryable("recording the path", e))?;
            if recorded {
                break (step, model, path);
            }
            // The checkpoint holding this state was deleted with its last path: save it anew.
            resident.saved = None;
        };
        let mut result = json!({"path": path, "model": model, "type": kind.call()});
        if let Some(seq) = save.sampling_session_seq_id {
            let sampling =
                verity_core::tinker::SamplingModel { model: model.clone(), model_path: None };
            let open = || {
                verity_core::tinker::create_sampling_session(
                    pool,
                    job.org_id,
                    &spec.session_id,
                    seq,
                    &sampling,
                )
            };
            let session =
                persist("opening a sampling session", heartbeat, is_transient_db_error, open)
                    .await
                    .map_err(|e| retryable("opening a sampling session", e))?;
            match session {
                Some(id) => result["sampling_session_id"] = json!(id),
                None => return Ok((resident, Err(failure("the session has ended", true)))),
            }
        }
        tracing::info!(job_id = %job.id, step, model, kind = kind.as_str(), "tinker weights saved");
        Ok((resident, json_result(&result)))
    }

    /// Saves the weights and the optimizer's state as a new checkpoint of the client's queue
    /// row, unless one holds them already; returns its number.
    async fn checkpoint_state(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &ClientSpec,
        resident: Resident,
    ) -> Result<(Resident, i32), Stop> {
        if let Some(step) = resident.saved {
            return Ok((resident, step));
        }
        let job = lease.job();
        let step = resident.next_checkpoint();
        let root = self.config.cache_dir.join("jobs");
        let dir = root.join(&job.id).join(format!("step-{step}"));
        remove_cache_dir(&root, &dir).map_err(|e| user_error(e.to_string()))?;
        let (save_dir, base) = (dir.clone(), spec.base_model.clone());
        let (mut resident, saved) = tokio::task::spawn_blocking(move || {
            // Every save holds the optimizer too: one checkpoint per state, whichever call saved it.
            let saved = save_checkpoint(
                &save_dir,
                resident.trainer.model(),
                Some(&resident.tokenizer),
                Some(&resident.trainer.optimizer().adamw),
                &base,
            );
            (resident, saved)
        })
        .await
        .map_err(|e| retryable("saving weights", e))?;
        saved.map_err(|e| retryable("saving weights", e))?;
        let prefix = verity_core::keys::checkpoint(&job.id, step);
        let publish = || publish_folder(self.store.as_ref(), &dir, &prefix);
        let manifest =
            persist("publishing weights", heartbeat, StorageError::is_transient, publish)
                .await
                .map_err(|e| retryable("publishing weights", e))?;
        let _ = remove_cache_dir(&root, &dir);
        // What a lost worker's successor needs to know this checkpoint is the client's state
        // (`clients::resumable`): the calls it reflects, and no gradients left out.
        let read = || clients::next_seq(lease.queue().pool(), &spec.model_id);
        let next_seq = persist("reading the client", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the client", e))?;
        let metrics = json!({"optimizer_step": resident.trainer.steps(), "next_seq": next_seq,
                             "pending_backwards": resident.trainer.pending_backwards()});
        let register =
            || lease.checkpoint(step, &prefix, manifest.total_bytes as i64, Some(&metrics));
        persist("registering weights", heartbeat, QueueError::is_transient, register)
            .await
            .map_err(|e| lease_error("registering weights", e))?;
        resident.saved = Some(step);
        resident.last = Some(step);
        Ok((resident, step))
    }

    /// Fetches the checkpoint `restore` names and loads it into the resident model.
    async fn restore(
        &self,
        heartbeat: &Heartbeat,
        mut resident: Resident,
        restore: &Restore,
    ) -> Result<(Resident, crate::tinker::Result<()>), Stop> {
        let root = self.config.cache_dir.join("jobs");
        let dir = root.join(&restore.job_id).join(format!("restore-{}", restore.step));
        let prefix = verity_core::keys::checkpoint(&restore.job_id, restore.step);
        let fetch = || cached_folder(self.store.as_ref(), &prefix, &root, &dir);
        let dir = persist("downloading saved weights", heartbeat, transient_chain, fetch)
            .await
            .map_err(|e| retryable("downloading saved weights", e))?;
        let optimizer = restore.optimizer;
        tokio::task::spawn_blocking(move || {
            let restored = resident.trainer.restore(&dir, optimizer);
            (resident, restored)
        })
        .await
        .map_err(|e| retryable("loading saved weights", e))
    }
}

/// A failed training call's answer: the caller's mistakes are `user` errors, the rest `server`.
fn call_failure(err: TinkerCallError) -> Value {
    failure(err.to_string(), err.is_user_error())
}
