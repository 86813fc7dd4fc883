//! `/v1/verity/model_pulls`: an org admin asks for a model by its hub name
//! (`OWNER/NAME[@REVISION]`); a worker fetches it from the hub it is configured with
//! (`HF_ENDPOINT`, `HF_TOKEN`, its `HF_HOME` cache), checks it, and registers it for the org with
//! its hub id ([`verity_core::model_pulls`]). The request is checked before anything is queued;
//! the pull is a queue row (`pulljob-…`) like a run, so it survives a crash and can be cancelled.

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::pagination::{Page, PageQuery};
use crate::api::sampling_runs::RunStatus;
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use verity_core::jobs::JobRecord;
use verity_core::model_pulls::{PullResult, PullSpec};
use verity_core::models::{check_model_name, default_pull_name, parse_hub_ref};
use verity_core::queue::NewJob;
use verity_core::JobState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/verity/model_pulls", get(list_pulls).post(create_pull))
        .route("/v1/verity/model_pulls/{pull_id}", get(get_pull))
        .route("/v1/verity/model_pulls/{pull_id}/cancel", post(cancel_pull))
}

/// Body of `POST /v1/verity/model_pulls`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePullRequest {
    /// The hub name, `OWNER/NAME` or `OWNER/NAME@REVISION` (a branch, tag or commit; default
    /// `main`), e.g. `Qwen/Qwen3-1.7B`.
    pub model: String,
    /// The name it is registered under (default: the part after the `/`).
    pub name: Option<String>,
}

/// A model pull (`verity.model_pull`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelPullObject {
    /// `pulljob-…`.
    pub id: String,
    /// Always `verity.model_pull`.
    pub object: &'static str,
    /// Status, times and error.
    #[serde(flatten)]
    pub status: RunStatus,
    /// The hub id asked for, `OWNER/NAME`.
    pub hub_id: String,
    /// The revision asked for.
    pub revision: String,
    /// The name the model is registered under.
    pub name: String,
    /// Once succeeded: the model's name, the hub id it answers to (`null` when another model
    /// of the org had it), the commit, the files and how many were downloaded.
    #[schema(value_type = Option<Object>)]
    pub result: Option<PullResult>,
}

impl ModelPullObject {
    /// The object of a stored pull.
    pub fn of(job: JobRecord) -> ApiResult<ModelPullObject> {
        let Some(Ok(spec)) = PullSpec::of_job(&job.spec) else {
            return Err(ApiError::internal("reading a model pull", "bad spec"));
        };
        let result = job
            .result
            .clone()
            .filter(|_| job.state == JobState::Succeeded)
            .and_then(|r| serde_json::from_value(r).ok());
        Ok(ModelPullObject {
            status: RunStatus::of(&job),
            object: "verity.model_pull",
            hub_id: spec.hub_id,
            revision: spec.revision,
            name: spec.name,
            result,
            id: job.id,
        })
    }
}

/// Checks a pull request (admins only; a hub name; a free model name; a hub id the org cannot
/// already use) and queues it; the stored row. Nothing is written when a check fails.
pub async fn queue_pull(
    state: &AppState,
    principal: &Principal,
    request: &CreatePullRequest,
) -> ApiResult<JobRecord> {
    principal.require_admin()?;
    let (hub_id, revision) =
        parse_hub_ref(request.model.trim()).map_err(|rule| ApiError::invalid("model", rule))?;
    let name = request.name.clone().unwrap_or_else(|| default_pull_name(&hub_id));
    check_model_name(&name).map_err(|reason| ApiError::invalid("name", reason))?;
    if let Some(holder) =
        verity_core::models::model_for_hub_id(&state.pool, principal.org_id, &hub_id).await?
    {
        return Err(ApiError {
            param: Some("model".to_string()),
            ..ApiError::conflict(
                "model_exists",
                format!("{hub_id} is already here as the model {holder:?}: name it either way"),
            )
        });
    }
    if verity_core::models::model_by_id(&state.pool, &name).await?.is_some() {
        return Err(ApiError {
            param: Some("name".to_string()),
            ..ApiError::conflict(
                "model_exists",
                format!("a model named {name:?} already exists: give another `name`"),
            )
        });
    }
    let spec = PullSpec { hub_id: hub_id.clone(), revision, name };
    let mut job = NewJob::new(principal.org_id, hub_id, spec.to_job_spec());
    job.id = verity_core::model_pulls::new_id();
    job.created_by = Some(principal.user_id);
    let id = state.queue.enqueue_pull(&job).await?;
    tracing::info!(pull_id = %id, hub_id = %spec.hub_id, org_id = %principal.org_id, "model pull queued");
    find_pull(state, principal, &id).await
}

/// The org's pull `id`, or 404.
async fn find_pull(state: &AppState, principal: &Principal, id: &str) -> ApiResult<JobRecord> {
    verity_core::model_pulls::get_pull(&state.pool, principal.org_id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("model pull", id))
}

/// Queues a pull of a model from the hub (admins only).
#[utoipa::path(post, path = "/v1/verity/model_pulls", tag = "verity", request_body = CreatePullRequest,
    responses((status = 200, body = ModelPullObject), (status = 400), (status = 401), (status = 403), (status = 409)))]
pub async fn create_pull(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreatePullRequest>,
) -> ApiResult<Json<ModelPullObject>> {
    let job = queue_pull(&state, &principal, &request).await?;
    Ok(Json(ModelPullObject::of(job)?))
}

/// Lists the org's model pulls, newest first.
#[utoipa::path(get, path = "/v1/verity/model_pulls", tag = "verity", params(PageQuery),
    responses((status = 200, body = Page<ModelPullObject>), (status = 400), (status = 401)))]
pub async fn list_pulls(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<ModelPullObject>>> {
    let limit = query.limit()?;
    let rows = verity_core::model_pulls::list_pulls(
        &state.pool,
        principal.org_id,
        query.after.as_deref(),
        limit + 1,
    )
    .await?;
    let items = rows.into_iter().map(ModelPullObject::of).collect::<ApiResult<_>>()?;
    Ok(Json(Page::from_fetched(items, limit, |p: &ModelPullObject| p.id.clone())))
}

/// One model pull.
#[utoipa::path(get, path = "/v1/verity/model_pulls/{pull_id}", tag = "verity", params(("pull_id" = String, Path)),
    responses((status = 200, body = ModelPullObject), (status = 401), (status = 404)))]
pub async fn get_pull(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ModelPullObject>> {
    Ok(Json(ModelPullObject::of(find_pull(&state, &principal, &id).await?)?))
}

/// Cancels a model pull (admins only; a running one once its worker sees the request).
#[utoipa::path(post, path = "/v1/verity/model_pulls/{pull_id}/cancel", tag = "verity", params(("pull_id" = String, Path)),
    responses((status = 200, body = ModelPullObject), (status = 401), (status = 403), (status = 404)))]
pub async fn cancel_pull(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ModelPullObject>> {
    principal.require_admin()?;
    find_pull(&state, &principal, &id).await?;
    state.queue.cancel(&id).await?;
    Ok(Json(ModelPullObject::of(find_pull(&state, &principal, &id).await?)?))
}
