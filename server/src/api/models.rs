//! `/v1/models`: base models (shared or the org's) and fine-tuned checkpoints; registering a
//! base model folder that is already in the store.

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::jobs::view::checkpoint_model_name;
use super::state::AppState;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use verity_core::models::ModelRecord;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(list_models).post(register_model))
        .route("/v1/models/{*model}", get(retrieve_model).delete(delete_model))
}

/// OpenAI's `model` object, with Verity's extra facts.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelObject {
    /// Name to use as `model`.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Registration time (Unix seconds).
    pub created: i64,
    /// `verity` for shared models, else the org id.
    pub owned_by: String,
    /// `base`, `fine_tuned` or `checkpoint`.
    pub kind: String,
    /// `hf`, `gguf` or `peft`.
    pub format: Option<String>,
    /// The job that produced it.
    pub job_id: Option<String>,
    /// The hub id (`OWNER/NAME`) accepted as `model` too (a pulled model's); absent if none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_id: Option<String>,
}

/// The model list.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The models.
    pub data: Vec<ModelObject>,
}

impl From<ModelRecord> for ModelObject {
    fn from(model: ModelRecord) -> ModelObject {
        ModelObject {
            id: model.id,
            object: "model",
            created: model.created_at.timestamp(),
            owned_by: model.org_id.map_or_else(|| "verity".to_string(), |o| o.to_string()),
            kind: model.kind,
            format: Some(model.format),
            job_id: model.job_id,
            hub_id: model.hub_id,
        }
    }
}

/// Models the caller can use, then checkpoints of the org's jobs.
#[utoipa::path(get, path = "/v1/models", tag = "models", responses((status = 200, body = ModelList), (status = 401)))]
pub async fn list_models(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<ModelList>> {
    let data = visible_models(&state, principal.org_id).await?;
    Ok(Json(ModelList { object: "list", data }))
}

/// One model the caller can use (OpenAI's `client.models.retrieve`): a base or fine-tuned model,
/// or a checkpoint's `…:ckpt-step-N` name; 404 for anything else, another org's included.
#[utoipa::path(get, path = "/v1/models/{model}", tag = "models",
    params(("model" = String, Path, description = "The model's id")),
    responses((status = 200, body = ModelObject), (status = 401), (status = 404)))]
pub async fn retrieve_model(
    State(state): State<AppState>,
    principal: Principal,
    Path(model): Path<String>,
) -> ApiResult<Json<ModelObject>> {
    visible_models(&state, principal.org_id)
        .await?
        .into_iter()
        .find(|candidate| candidate.id == model || candidate.hub_id.as_ref() == Some(&model))
        .map(Json)
        .ok_or_else(|| ApiError {
            param: Some("model".to_string()),
            code: Some("model_not_found"),
            ..ApiError::not_found("model", &model)
        })
}

/// OpenAI's answer to `DELETE /v1/models/{model}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedModel {
    /// The model's id.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Always true.
    pub deleted: bool,
}

/// Deletes one of the org's models (OpenAI's `client.models.delete`, admins only): its
/// registration, not its files or the job that made it. A shared model is the operator's (403);
/// a model unfinished jobs start from answers 409 naming them.
#[utoipa::path(delete, path = "/v1/models/{model}", tag = "models",
    params(("model" = String, Path, description = "The model's id")),
    responses((status = 200, body = DeletedModel), (status = 401), (status = 403), (status = 404), (status = 409)))]
pub async fn delete_model(
    State(state): State<AppState>,
    principal: Principal,
    Path(model): Path<String>,
) -> ApiResult<Json<DeletedModel>> {
    principal.require_admin()?;
    use verity_core::models::ModelDeletion;
    match verity_core::models::delete_org_model(&state.pool, principal.org_id, &model).await? {
        ModelDeletion::Deleted => {
            Ok(Json(DeletedModel { id: model, object: "model", deleted: true }))
        }
        ModelDeletion::NotFound => Err(ApiError {
            param: Some("model".to_string()),
            code: Some("model_not_found"),
            ..ApiError::not_found("model", &model)
        }),
        ModelDeletion::Shared => Err(ApiError {
            param: Some("model".to_string()),
            ..ApiError::forbidden(
                "a shared model is the operator's; it cannot be deleted through the API",
            )
        }),
        ModelDeletion::InUse(jobs) => Err(ApiError {
            param: Some("model".to_string()),
            ..ApiError::conflict(
                "model_in_use",
                format!(
                    "unfinished jobs start from {model:?}: {}; cancel them or wait for them to end",
                    jobs.join(", ")
                ),
            )
        }),
    }
}

/// What `org_id` may name as `model`: base and fine-tuned models (shared or its own), then its
/// jobs' checkpoints, newest first.
pub async fn visible_models(
    state: &AppState,
    org_id: uuid::Uuid,
) -> Result<Vec<ModelObject>, sqlx::Error> {
    let mut data: Vec<ModelObject> = verity_core::models::list_models(&state.pool, org_id)
        .await?
        .into_iter()
        .map(ModelObject::from)
        .collect();
    for (checkpoint, job_model) in verity_core::jobs::org_checkpoints(&state.pool, org_id).await? {
        data.push(ModelObject {
            id: checkpoint_model_name(&job_model, checkpoint.step),
            object: "model",
            created: checkpoint.created_at.timestamp(),
            owned_by: org_id.to_string(),
            kind: "checkpoint".to_string(),
            format: None,
            job_id: Some(checkpoint.job_id),
            hub_id: None,
        });
    }
    Ok(data)
}

/// Body of `POST /v1/models`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterModelRequest {
    /// Name (1–200 characters, no whitespace).
    pub id: String,
    /// Folder (or GGUF file) of the org's already in the object store: under `models/`, an
    /// uploaded file, or a checkpoint of one of its jobs.
    pub storage_prefix: String,
    /// `hf` (default), `gguf` or `peft`.
    pub format: Option<String>,
    /// Visible to every org: publishing is the operator's act (`verity models share` or
    /// `verity models import` on the server), so `true` answers 403.
    #[serde(default)]
    pub shared: bool,
    /// Extra facts.
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
}

pub use verity_core::models::check_model_name;

/// The answer for a prefix the caller may not register, or where nothing is stored: the same
/// body either way, so that it tells nothing about other orgs' objects.
fn no_model_storage() -> ApiError {
    ApiError {
        message: "no model storage at that prefix in your org".to_string(),
        param: Some("storage_prefix".to_string()),
        ..ApiError::not_found("model storage", "")
    }
}

/// Registers a base model (admins only). Its storage must be the org's: a published base folder
/// under `models/`, a file the org uploaded, or a checkpoint of one of its jobs; any other prefix
/// answers 404 whether or not something is stored there.
#[utoipa::path(post, path = "/v1/models", tag = "models", request_body = RegisterModelRequest,
    responses((status = 200, body = ModelObject), (status = 400), (status = 401), (status = 403), (status = 404), (status = 409)))]
pub async fn register_model(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<RegisterModelRequest>,
) -> ApiResult<Json<ModelObject>> {
    principal.require_admin()?;
    if request.shared {
        return Err(ApiError {
            param: Some("shared".to_string()),
            ..ApiError::forbidden(
                "publishing a model to every org is the operator's act: run `verity models share \
                 --name NAME --storage-prefix PREFIX` (or `verity models import`) on the server; \
                 register it for your org with shared: false",
            )
        });
    }
    check_model_name(&request.id).map_err(|reason| ApiError::invalid("id", reason))?;
    let format = request.format.unwrap_or_else(|| "hf".to_string());
    if !matches!(format.as_str(), "hf" | "gguf" | "peft") {
        return Err(ApiError::invalid("format", "use hf, gguf or peft"));
    }
    let config = request.config.unwrap_or_else(|| Value::Object(Default::default()));
    crate::api::extract::reject_nul_json("config", &config)?;
    if !config.is_object() {
        return Err(ApiError::invalid("config", "must be an object"));
    }
    let prefix = verity_core::models::normalize_prefix(&request.storage_prefix)
        .map_err(|e| ApiError::invalid("storage_prefix", e.to_string()))?;
    let prefix = prefix.as_str();
    if !verity_core::models::org_may_register(&state.pool, principal.org_id, prefix).await? {
        tracing::warn!(org_id = %principal.org_id, prefix, "model registration outside the org refused");
        return Err(no_model_storage());
    }
    let stored = state.store.head(prefix).await?.is_some()
        || !state.store.list(&format!("{prefix}/")).await?.is_empty();
    if !stored {
        return Err(no_model_storage());
    }
    if !verity_core::models::insert_base_model(
        &state.pool,
        Some(principal.org_id),
        &request.id,
        prefix,
        &format,
        &config,
    )
    .await?
    {
        return Err(ApiError::conflict(
            "model_exists",
            format!("a model named {:?} already exists", request.id),
        ));
    }
    let model = verity_core::models::get_model(&state.pool, principal.org_id, &request.id)
        .await?
        .ok_or_else(|| ApiError::internal("register model", "row vanished"))?;
    Ok(Json(model.into()))
}
