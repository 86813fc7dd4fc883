//! The models a job starts from and ends with: fetching its start model (a base, or another
//! job's model or checkpoint) into the local cache, and saving, publishing and registering each
//! checkpoint; the model a finished job describes.

use super::artifacts::write_results_file;
use super::handler::TrainingHandler;
use super::stop::{event, lease_error, persist, retryable, transient_chain, user_error, Stop};
use crate::checkpoint::cache::remove_cache_dir;
use crate::checkpoint::stack::{fetch_stack, FetchedStack};
use crate::trainer::Trainer;
use serde_json::{json, Value};
use verity_core::queue::{
    is_transient_db_error, EventLevel, Heartbeat, Lease, QueueError, TrainedModel,
};
use verity_core::storage::{publish_folder, StorageError};

impl TrainingHandler {
    /// Fetches the model the job starts from: a base model, or another job's model or
    /// checkpoint over the model that job started from ([`verity_core::lineage`], org checked).
    pub(super) async fn start_model(
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
    pub(super) async fn checkpoint(
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

    /// Writes the results file and describes the model the job produced (its final checkpoint).
    pub(super) async fn trained_model(
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
}
