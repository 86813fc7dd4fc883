//! Training runs and their saved weights as the SDK's `RestClient` lists them: each training
//! client is a run (its id the client's queue row, `tinkjob-…`), each `save_weights_for_sampler`
//! a checkpoint with its `tinker://` path — and the Verity model it is (`verity_model`); what a
//! path holds (`weights_info`), and deleting one.

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiJson;
use crate::api::extract::ApiQuery;
use crate::api::state::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use verity_core::tinker::clients::{self, CallRecord, RunRecord, SavedRecord};

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
        "public": saved.public,
        "expires_at": saved.expires_at,
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

/// A call of a run's log (`GET /api/v1/training_runs/{id}/calls`, a Verity extension).
fn call_json(call: &CallRecord) -> Value {
    json!({
        "seq_id": call.seq_id,
        "kind": call.kind,
        "created_at": call.created_at,
        "finished_at": call.finished_at,
        "took_ms": call.took_ms(),
        "ran_ms": call.ran_ms,
        "tokens": call.tokens,
        "loss_sum": call.loss,
        "error": call.error,
    })
}

/// `GET /api/v1/training_runs/{id}/calls?limit=&offset=` (a Verity extension the SDK does not
/// call): the run's call log, newest first — each call's arrival and end (`took_ms`), the
/// worker's own time on it (`ran_ms`; the rest is queueing and the protocol), its input tokens,
/// `loss:sum` and failure.
pub async fn run_calls(
    principal: Principal,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(page): ApiQuery<Page>,
) -> ApiResult<Json<Value>> {
    page.check()?;
    clients::run(&state.pool, principal.org_id, &id)
        .await?
        .ok_or_else(|| ApiError::not_found("training run", &id))?;
    let calls =
        clients::list_calls(&state.pool, principal.org_id, &id, page.limit, page.offset).await?;
    let calls: Vec<Value> = calls.iter().map(call_json).collect();
    Ok(Json(json!({ "calls": calls, "cursor": {"offset": page.offset, "limit": page.limit} })))
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

/// Body of `PUT …/checkpoints/{checkpoint_id}/ttl` (`set_checkpoint_ttl_from_tinker_path`).
#[derive(Debug, Deserialize)]
struct SetTtl {
    ttl_seconds: Option<i64>,
}

/// `/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}…`: `DELETE` of a saved weight
/// (`checkpoint_id` is `weights/<name>`, `sampler_weights/<name>` or
/// `external_weights/<name>`), `PUT …/ttl` (when it expires) and `GET
/// …/external_weights_urls` (signed URLs of an external save's files) and `POST` / `DELETE
/// …/publish` (every org may read the path, or only its own again); any other call under it
/// is named as not served.
pub async fn checkpoint(
    principal: Principal,
    State(state): State<AppState>,
    method: Method,
    Path((run_id, checkpoint_id)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Response> {
    let parts: Vec<&str> = checkpoint_id.split('/').collect();
    match (&method, parts.as_slice()) {
        (&Method::DELETE, [kind, name]) => {
            let path = format!("tinker://{run_id}/{kind}/{name}");
            Ok(delete_saved_weights(&state, &principal, &path).await?.into_response())
        }
        (&Method::GET, ["external_weights", name, "external_weights_urls"]) => {
            let path = format!("tinker://{run_id}/external_weights/{name}");
            Ok(Json(external_weights_urls(&state, &principal, &path).await?).into_response())
        }
        (&Method::POST | &Method::DELETE, [kind, name, "publish"]) => {
            let path = format!("tinker://{run_id}/{kind}/{name}");
            let public = method == Method::POST;
            publish(&state, &principal, &path, public).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (&Method::PUT, [kind, name, "ttl"]) => {
            let body: SetTtl = serde_json::from_slice(&body)
                .map_err(|e| ApiError::invalid("ttl_seconds", format!("invalid body: {e}")))?;
            super::training::check_ttl(body.ttl_seconds)?;
            let path = format!("tinker://{run_id}/{kind}/{name}");
            if !clients::set_saved_ttl(&state.pool, principal.org_id, &path, body.ttl_seconds)
                .await?
            {
                return Err(ApiError::not_found("checkpoint", &path));
            }
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        _ => {
            let call = format!("training_runs/{run_id}/checkpoints/{checkpoint_id}");
            Err(super::not_served_error(&call))
        }
    }
}

/// `publish_checkpoint_from_tinker_path` (`public`) and `unpublish_checkpoint_from_tinker_path`:
/// only the org that saved `path` may (a 404 for any other, as for a path it cannot see).
/// Asking for what already is succeeds: the SDK retries a 409 for five minutes, so Verity does
/// not answer one.
pub(crate) async fn publish(
    state: &AppState,
    principal: &Principal,
    path: &str,
    public: bool,
) -> ApiResult<()> {
    if !clients::set_saved_public(&state.pool, principal.org_id, path, public).await? {
        return Err(ApiError::not_found("checkpoint", path));
    }
    tracing::info!(org_id = %principal.org_id, path, public, "tinker checkpoint publication set");
    Ok(())
}

/// How long the URLs of `get_external_weights_urls` stay valid.
const EXTERNAL_URLS_TTL: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// `get_external_weights_urls`: a signed URL for each file of the weights saved under `path` by
/// `save_weights_external` (the Hugging Face folder or PEFT adapter, without the optimizer's
/// state), keyed by the file's path in the folder, and when they expire.
async fn external_weights_urls(
    state: &AppState,
    principal: &Principal,
    path: &str,
) -> ApiResult<Value> {
    let (kind, prefix) = clients::saved_files(&state.pool, principal.org_id, path)
        .await?
        .ok_or_else(|| ApiError::not_found("checkpoint", path))?;
    if kind != "external" {
        return Err(ApiError::invalid(
            "checkpoint_id",
            "not weights saved by save_weights_external",
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    let manifest = verity_core::storage::read_manifest(state.store.as_ref(), prefix)
        .await?
        .ok_or_else(|| {
            ApiError::conflict("checkpoint_incomplete", "the weights are not completely published")
        })?;
    let expires = chrono::Utc::now() + EXTERNAL_URLS_TTL;
    let mut urls = serde_json::Map::new();
    for file in &manifest.files {
        if crate::api::jobs::checkpoints::is_trainer_state(&file.path) {
            continue;
        }
        let key = format!("{prefix}/{}", file.path);
        let url = state.store.presign_get(&key, EXTERNAL_URLS_TTL).await?;
        urls.insert(file.path.clone(), json!(url));
    }
    Ok(json!({ "urls": urls, "expires": expires }))
}

/// How often the API server looks for expired saved weights.
const EXPIRY_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Spawns the loop that deletes expired saved weights ([`delete_expired_weights`]) every minute.
pub fn spawn_weight_expiry(
    pool: sqlx::PgPool,
    store: std::sync::Arc<dyn verity_core::storage::ObjectStore>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(error) = delete_expired_weights(&pool, store.as_ref()).await {
                tracing::warn!(%error, "deleting expired tinker weights failed; retrying");
            }
        }
    })
}

/// Deletes up to 100 saved paths whose time has passed, as a delete would ([`delete_path`]);
/// returns how many it deleted.
pub async fn delete_expired_weights(
    pool: &sqlx::PgPool,
    store: &dyn verity_core::storage::ObjectStore,
) -> ApiResult<usize> {
    let expired = clients::expired_saved(pool, 100).await?;
    for (org_id, path) in &expired {
        // Another API server's sweep may have deleted it first: nothing left to do then.
        if delete_path(pool, store, *org_id, path).await? {
            tracing::info!(%org_id, path, "expired tinker weights deleted");
        }
    }
    Ok(expired.len())
}

/// Deletes the weights `org_id` saved at `path`: the path at once, and the checkpoint's files
/// with it unless another path (or a parked client) still holds them. False when the org has
/// no such path.
async fn delete_path(
    pool: &sqlx::PgPool,
    store: &dyn verity_core::storage::ObjectStore,
    org_id: uuid::Uuid,
    path: &str,
) -> ApiResult<bool> {
    let Some(orphan) = clients::delete_saved(pool, org_id, path).await? else {
        return Ok(false);
    };
    if let Some(prefix) = orphan {
        verity_core::storage::delete_folder(store, &prefix).await?;
    }
    Ok(true)
}

/// Deletes the weights the caller's org saved at `path` (the API and the dashboard): the path
/// is gone at once; the checkpoint's files go with it unless another path (or a parked
/// client) still holds them.
pub(crate) async fn delete_saved_weights(
    state: &AppState,
    principal: &Principal,
    path: &str,
) -> ApiResult<StatusCode> {
    if !delete_path(&state.pool, state.store.as_ref(), principal.org_id, path).await? {
        return Err(ApiError::not_found("checkpoint", path));
    }
    Ok(StatusCode::NO_CONTENT)
}
