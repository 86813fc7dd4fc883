//! Model pulls (docs/models.md, "Pulling from the API"): `OWNER/NAME[@REVISION]` fetched from a
//! Hugging Face-compatible hub by a worker and registered for the org that asked, as
//! `verity models pull` does on the operator's machine. A pull is a row of the job queue of its
//! own kind (`pulljob-…`), so it is leased, retried after a crash (the files already in the hub
//! cache are not fetched again), cancellable and logged like every other row; this module holds
//! its spec, its result and its reads.

use crate::jobs::JobRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// `jobs.kind` of model pulls, and the key of their spec.
pub const MODEL_PULL: &str = "model_pull";

/// A new pull's id (`pulljob-…`).
pub fn new_id() -> String {
    crate::ids::new_id("pulljob")
}

/// What a worker fetches and registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullSpec {
    /// The hub id, `OWNER/NAME` (checked).
    pub hub_id: String,
    /// The branch, tag or commit.
    pub revision: String,
    /// The name it is registered under.
    pub name: String,
}

impl PullSpec {
    /// The spec of a queue row, if the row is a pull.
    pub fn of_job(spec: &Value) -> Option<Result<PullSpec, serde_json::Error>> {
        let pull = spec.get(MODEL_PULL)?;
        Some(serde_json::from_value(pull.clone()))
    }

    /// The queue row's `spec`.
    pub fn to_job_spec(&self) -> Value {
        serde_json::json!({ MODEL_PULL: self })
    }

    /// `OWNER/NAME@REVISION`, as the hub client takes it.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.hub_id, self.revision)
    }
}

/// What a finished pull reports (`jobs.result`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullResult {
    /// The registered model's name.
    pub model: String,
    /// The hub id it answers to as well; `None` when another model of the org had it.
    pub hub_id: Option<String>,
    /// The commit the revision resolved to.
    pub commit: String,
    /// The files fetched (or found in the worker's hub cache).
    pub files: Vec<String>,
    /// How many of them were downloaded.
    pub downloaded: usize,
    /// Its folder in the object store.
    pub storage_prefix: String,
}

/// The org's pull `id`.
pub async fn get_pull(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<JobRecord>, sqlx::Error> {
    crate::jobs::get_job_of_kind(pool, org_id, MODEL_PULL, id).await
}

/// The org's pulls, newest first, after pull `after` (exclusive); at most `limit`.
pub async fn list_pulls(
    pool: &PgPool,
    org_id: Uuid,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<JobRecord>, sqlx::Error> {
    let any = crate::jobs::MetadataFilter::Any;
    crate::jobs::list_jobs_of_kind(pool, org_id, MODEL_PULL, after, limit, &any).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_is_recognised_by_its_spec() {
        let spec = PullSpec {
            hub_id: "Qwen/Qwen3-1.7B".into(),
            revision: "main".into(),
            name: "Qwen3-1.7B".into(),
        };
        let row = spec.to_job_spec();
        assert_eq!(PullSpec::of_job(&row).unwrap().unwrap(), spec);
        assert!(PullSpec::of_job(&serde_json::json!({"method": {}})).is_none());
        assert_eq!(spec.reference(), "Qwen/Qwen3-1.7B@main");
        assert!(new_id().starts_with("pulljob-"));
    }
}
