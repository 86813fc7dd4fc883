//! A model pull under its lease ([`verity_core::model_pulls`]): fetch `OWNER/NAME@REVISION`
//! into this worker's hub cache, check it, publish it to the store and register it for the org
//! that asked, with its hub id. A retried attempt (after a crash or a network failure) finds the
//! files it already fetched in the cache, and a registration an earlier attempt finished.

use super::handler::TrainingHandler;
use super::stop::{event, retryable, transient_chain, user_error, Stop};
use crate::hub::{fetch, is_refusal};
use crate::model_import::{give_hub_id, import_model};
use serde_json::json;
use verity_core::model_pulls::{PullResult, PullSpec};
use verity_core::queue::{EventLevel, Heartbeat, HeartbeatState, JobOutcome, Lease};

/// The stop for a failed fetch: what the hub refused (or a model that lacks what Verity loads)
/// fails the pull; anything else (no connection, a timeout, the hub's 5xx) is retried.
fn fetch_error(what: &str, err: anyhow::Error) -> Stop {
    if is_refusal(&err) {
        user_error(format!("{what}: {err:#}"))
    } else {
        retryable(what, format!("{err:#}"))
    }
}

/// The stop for a failed import: a store or database outage is retried; a model that does not
/// load fails the pull.
fn import_error(err: anyhow::Error) -> Stop {
    if transient_chain(&err) {
        retryable("importing the model", format!("{err:#}"))
    } else {
        user_error(format!("importing the model: {err:#}"))
    }
}

impl TrainingHandler {
    /// Runs a claimed model pull.
    pub(super) async fn model_pull(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: Result<PullSpec, serde_json::Error>,
    ) -> Result<JobOutcome, Stop> {
        let spec = spec.map_err(|e| user_error(format!("invalid pull: {e}")))?;
        let job = lease.job();
        let pool = lease.queue().pool();
        let reference = spec.reference();
        let prefix = verity_core::keys::model(&spec.name);
        // Before any download: a same-named model that is not this pull's own (an earlier
        // attempt's, same org and folder) fails the pull at once.
        let existing = verity_core::models::model_by_id(pool, &spec.name)
            .await
            .map_err(|e| retryable("reading the registry", e))?;
        let registered = match existing {
            Some(model) if model.org_id == Some(job.org_id) && model.storage_prefix == prefix => {
                true
            }
            Some(_) => {
                return Err(user_error(format!(
                    "a model named {:?} was registered while the pull waited; pull again under \
                     another name",
                    spec.name
                )))
            }
            None => false,
        };
        let data = json!({"hub_id": spec.hub_id, "revision": spec.revision, "name": spec.name});
        let message = format!("fetching {reference} from {}", self.hub.endpoint);
        event(lease, heartbeat, EventLevel::Info, "started", &message, Some(&data)).await?;
        let fetched = tokio::select! {
            fetched = fetch(&self.hub, &reference) => fetched,
            state = heartbeat.cancelled_or_lost() => return Ok(match state {
                HeartbeatState::Lost => JobOutcome::LeaseLost,
                HeartbeatState::Held(_) => JobOutcome::Cancelled,
            }),
        }
        .map_err(|e| fetch_error(&format!("fetching {reference}"), e))?;
        let data = json!({"commit": fetched.commit, "files": fetched.files,
                          "downloaded": fetched.downloaded});
        let message = format!(
            "fetched {} files at commit {} ({} downloaded, the rest from the cache)",
            fetched.files.len(),
            fetched.commit,
            fetched.downloaded
        );
        event(lease, heartbeat, EventLevel::Info, "fetched", &message, Some(&data)).await?;
        if !registered {
            let store = self.store.as_ref();
            import_model(pool, store, Some(job.org_id), &spec.name, &fetched.dir, "hf")
                .await
                .map_err(import_error)?;
        }
        let hub_id = match give_hub_id(pool, &spec.name, &spec.hub_id).await {
            Ok(()) => Some(spec.hub_id.clone()),
            Err(e) if transient_chain(&e) => return Err(retryable("setting the hub id", e)),
            Err(e) => {
                let message = format!("{e:#}: requests name the pulled model {:?}", spec.name);
                event(lease, heartbeat, EventLevel::Warn, "hub_id_taken", &message, None).await?;
                None
            }
        };
        let result = PullResult {
            model: spec.name.clone(),
            hub_id,
            commit: fetched.commit,
            files: fetched.files,
            downloaded: fetched.downloaded,
            storage_prefix: prefix,
        };
        let result = serde_json::to_value(&result).map_err(|e| retryable("encoding", e))?;
        let message = format!("registered {reference} as {:?}", spec.name);
        event(lease, heartbeat, EventLevel::Info, "succeeded", &message, Some(&result)).await?;
        Ok(JobOutcome::Succeeded { result, fine_tuned_model: None })
    }
}
