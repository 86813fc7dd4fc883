//! Training runs and their saved weights as the SDK's `RestClient` lists them: each training
//! client is a run (its id the client's queue row, `tinkjob-…`), each `save_weights_for_sampler`
//! a checkpoint with its `tinker://` path — and the Verity model it is (`verity_model`); what a
//! path holds (`weights_info`), and deleting one.

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiJson;
use crate::api::extract::ApiQuery;
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use verity_core::tinker::clients::{self, RunRecord, SavedRecord};

/// Most runs (or sessions) one page lists.
const MAX_PAGE: i64 = 1000;

/// `?limit=&offset=` of `training_runs` and `sessions`.
#[derive(Debug, Deserialize)]
pub struct Page {
    #[serde(default = "twenty")]
    pub(super) limit: i64,
    #[serde(default)]
    pub(super) offset: i64,
}

impl Page {
    /// A 400 naming `limit` or `offset` when either is out of range.
    pub(super) fn check(&self) -> ApiResult<()> {
        if !(1..=MAX_PAGE).contains(&self.limit) {
            return Err(ApiError::invalid("limit", format!("must be 1 to {MAX_PAGE}")));
        }
        if self.offset < 0 {
            return Err(ApiError::invalid("offset", "must be at least 0"));
        }
        Ok(())
    }
}

fn twenty() -> i64 {
    20
}

/// A saved weight (`Checkpoint`).
fn checkpoint_json(saved: &SavedRecord) -> Value {
    let prefix = format!("tinker://{}/", saved.job_id);
    json!({
        "checkpoint_id": saved.path.strip_prefix(&prefix).unwrap_or(&saved.path),
        "checkpoint_type": saved.kind,
        "time": saved.created_at,
        "tinker_path": saved.path,
        "size_bytes": saved.bytes,
        "public": false,
        "verity_model": saved.model,
    })
}

/// A run (`TrainingRun`), with its latest saves of each kind from `saved` (newest first).
fn run_json(run: &RunRecord, saved: &[SavedRecord]) -> Value {
    let latest = |kind: &str| {
        saved.iter().find(|s| s.job_id == run.job_id && s.kind == kind).map(checkpoint_json)
    };
    json!({
        "training_run_id": run.job_id,
        "base_model": run.base_model,
        "model_owner": run.owner.clone().unwrap_or_default(),
        "is_lora": run.lora_rank.is_some(),
        "lora_rank": run.lora_rank,
        "last_request_time": run.last_call_at.unwrap_or(run.created_at),
        "corrupted": run.state == "failed",
        "last_checkpoint": latest("training"),
        "last_sampler_checkpoint": latest("sampler"),
        "user_metadata": null,
        "verity_state": run.state,
        "verity_model_id": run.model_id,
        "verity_calls_run": run.calls_run,
    })
}

/// `GET /api/v1/training_runs`: the org's runs, newest first.
pub async fn list_training_runs(
    principal: Principal,
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
) -> ApiResult<Json<Value>> {
    page.check()?;
    let (runs, total) =
        clients::list_runs(&state.pool, principal.org_id, page.limit, page.offset).await?;
    let saved = clients::list_saved(&state.pool, principal.org_id, None).await?;
    let runs: Vec<Value> = runs.iter().map(|run| run_json(run, &saved)).collect();
    Ok(Json(json!({
        "training_runs": runs,
        "cursor": {"offset": page.offset, "limit": page.limit, "total_count": total},
    })))
}

/// `GET /api/v1/training_runs/{id}`.
pub async fn training_run(
    principal: Principal,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let run = clients::run(&state.pool, principal.org_id, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("training run", &id))?;
    let saved = clients::list_saved(&state.pool, principal.org_id, Some(&id)).await?;
    Ok(Json(run_json(&run, &saved)))
}

/// `GET /api/v1/training_runs/{id}/checkpoints`.
pub async fn run_checkpoints(
    principal: Principal,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    clients::run(&state.pool, principal.org_id, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("training run", &id))?;
    let saved = clients::list_saved(&state.pool, principal.org_id, Some(&id)).await?;
    let checkpoints: Vec<Value> = saved.iter().map(checkpoint_json).collect();
    Ok(Json(json!({ "checkpoints": checkpoints, "cursor": null })))
}

/// `GET /api/v1/checkpoints`: every run's saved weights.
pub async fn checkpoints(
    principal: Principal,
    State(state): State<AppState>,
) -> ApiResult<Json<Value>> {
    let saved = clients::list_saved(&state.pool, principal.org_id, None).await?;
    let checkpoints: Vec<Value> = saved.iter().map(checkpoint_json).collect();
    Ok(Json(json!({ "checkpoints": checkpoints, "cursor": null })))
}

/// `weights_info`'s body.
#[derive(Debug, Deserialize)]
pub struct WeightsInfo {
    tinker_path: String,
}

/// `POST /api/v1/weights_info`: what the weights at a `tinker://` path are (the base model and
/// adapter a client needs to load them).
pub async fn weights_info(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<WeightsInfo>,
) -> ApiResult<Json<Value>> {
    let source = clients::saved_source(&state.pool, principal.org_id, &body.tinker_path)
        .await?
        .ok_or_else(|| ApiError::not_found("checkpoint", &body.tinker_path))?;
    // LoRA adapters sit on every attention and MLP projection, never on the unembedding.
    let lora = source.lora_rank.is_some();
    Ok(Json(json!({
        "base_model": source.base_model,
        "is_lora": lora,
        "lora_rank": source.lora_rank,
        "train_unembed": !lora,
        "train_mlp": true,
        "train_attn": true,
    })))
}

/// `/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}…`: `DELETE` of a saved weight
/// (`checkpoint_id` is `weights/<name>` or `sampler_weights/<name>`); the calls under it
/// (`…/publish`, `…/ttl`, `…/external_weights_urls`) are named as not served.
pub async fn checkpoint(
    principal: Principal,
    State(state): State<AppState>,
    method: Method,
    Path((run_id, checkpoint_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    if method != Method::DELETE || checkpoint_id.split('/').count() != 2 {
        let call = format!("training_runs/{run_id}/checkpoints/{checkpoint_id}");
        return Err(super::not_served_error(&call));
    }
    delete_saved_weights(&state, &principal, &format!("tinker://{run_id}/{checkpoint_id}")).await
}

/// Deletes the weights the caller's org saved at `path` (the API and the dashboard): the path
/// is gone at once; the checkpoint's files go with it unless another path (or a parked
/// client) still holds them.
pub(crate) async fn delete_saved_weights(
    state: &AppState,
    principal: &Principal,
    path: &str,
) -> ApiResult<StatusCode> {
    let deleted = clients::delete_saved(&state.pool, principal.org_id, path)
        .await?
        .ok_or_else(|| ApiError::not_found("checkpoint", path))?;
    if let Some(prefix) = deleted {
        verity_core::storage::delete_folder(state.store.as_ref(), &prefix).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}
