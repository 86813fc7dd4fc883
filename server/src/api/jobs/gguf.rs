//! A checkpoint as a llama.cpp GGUF file (for llama.cpp, Ollama, LM Studio): built on first
//! request from the checkpoint's model stack (adapters merged into their base), kept beside the
//! checkpoint's folder in the store so later downloads stream at once, with an Ollama
//! `Modelfile` beside it. Exports run one at a time per API process, on a blocking thread, so
//! that at most one model is held in memory for them.

use super::checkpoints::{find_checkpoint, stream_object, wants_redirect, PRESIGN_TTL};
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiQuery;
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use std::path::PathBuf;
use tokio::sync::Semaphore;
use utoipa::IntoParams;
use verity_core::models::checkpoint_model_name;
use verity_worker::gguf::{export_stack, GgufQuant};

/// The precision an export gets when none is asked for.
pub const DEFAULT_QUANT: GgufQuant = GgufQuant::Q8_0;

/// Where exports fetch model stacks to, and the one permit that serialises them.
#[derive(Debug)]
pub struct GgufExports {
    cache_dir: PathBuf,
    permit: Semaphore,
}

impl GgufExports {
    /// Exports that fetch models into `cache_dir`.
    pub fn new(cache_dir: PathBuf) -> Self {
        Self { cache_dir, permit: Semaphore::new(1) }
    }
}

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route(
        "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}/gguf",
        get(checkpoint_gguf),
    )
}

/// Query of a GGUF download.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GgufQuery {
    /// `f16`, `q8_0` (default) or `q4_k_m` (llama-quantize's mix).
    pub quantization: Option<String>,
    /// `gguf` (default) or `modelfile`: the Ollama `Modelfile` that goes beside it.
    pub file: Option<String>,
    /// `1` or `true`: answer 302 to a presigned URL of the file instead of streaming it.
    pub redirect: Option<String>,
}

/// The checkpoint as a GGUF file in the precision asked for (or its Ollama `Modelfile`), made
/// on the first request and kept in the store beside the checkpoint (deleted with it).
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}/gguf", tag = "fine_tuning",
    params(("job_id" = String, Path), ("checkpoint_id" = String, Path), GgufQuery),
    responses((status = 200, content_type = "application/octet-stream", description = "The GGUF file, or its Modelfile"), (status = 302), (status = 400), (status = 401), (status = 404), (status = 409), (status = 422)))]
pub async fn checkpoint_gguf(
    State(state): State<AppState>,
    principal: Principal,
    Path((job_id, checkpoint_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<GgufQuery>,
) -> ApiResult<Response> {
    let quant = match query.quantization.as_deref() {
        None | Some("") => DEFAULT_QUANT,
        Some(q) => q.parse().map_err(|e| ApiError::invalid("quantization", format!("{e}")))?,
    };
    let want_modelfile = match query.file.as_deref() {
        None | Some("") | Some("gguf") => false,
        Some("modelfile") => true,
        Some(_) => return Err(ApiError::invalid("file", "use gguf or modelfile")),
    };
    let redirect = wants_redirect(query.redirect.as_deref())?;
    let (checkpoint, job_model) =
        find_checkpoint(&state, &principal, &job_id, &checkpoint_id).await?;
    let stem = format!("{job_id}-step-{}.{quant}", checkpoint.step);
    let folder = format!("{}/gguf", checkpoint.storage_prefix.trim_end_matches('/'));
    let (gguf_key, modelfile_key) =
        (format!("{folder}/{stem}.gguf"), format!("{folder}/{stem}.Modelfile"));
    if state.store.head(&modelfile_key).await?.is_none() {
        let model = checkpoint_model_name(&job_model, checkpoint.step);
        build(&state, &principal, &model, quant, &stem, &gguf_key, &modelfile_key).await?;
    }
    let (key, name) = if want_modelfile {
        (modelfile_key, "Modelfile".to_string())
    } else {
        (gguf_key, format!("{stem}.gguf"))
    };
    if redirect {
        let url = state.store.presign_get(&key, PRESIGN_TTL).await?;
        return Ok((StatusCode::FOUND, [(LOCATION, url)]).into_response());
    }
    let size = state
        .store
        .head(&key)
        .await?
        .ok_or_else(|| ApiError::internal("GGUF export", format!("{key} vanished")))?
        .size;
    stream_object(&state, &key, size, &name).await
}

/// Builds the export of `model` and puts the GGUF, then the Modelfile (whose presence marks a
/// finished export), under the keys given; one export at a time.
async fn build(
    state: &AppState,
    principal: &Principal,
    model: &str,
    quant: GgufQuant,
    stem: &str,
    gguf_key: &str,
    modelfile_key: &str,
) -> ApiResult<()> {
    let exports = state.exports.clone();
    let _permit =
        exports.permit.acquire().await.map_err(|e| ApiError::internal("GGUF export", e))?;
    if state.store.head(modelfile_key).await?.is_some() {
        return Ok(()); // another request made it while this one waited
    }
    let stack = verity_core::lineage::resolve_stack(&state.pool, principal.org_id, model)
        .await
        .map_err(|e| ApiError::database("resolving the checkpoint's model", e))?
        .ok_or_else(|| ApiError::not_found("model", model))?;
    let fetched = verity_worker::checkpoint::stack::fetch_stack(
        state.store.as_ref(),
        &stack,
        &exports.cache_dir,
    )
    .await
    .map_err(|e| ApiError::unavailable("fetching the checkpoint's model", format!("{e:#}")))?;
    let work = exports.cache_dir.join(".gguf-exports").join(uuid::Uuid::new_v4().to_string());
    std::fs::create_dir_all(&work).map_err(|e| ApiError::internal("GGUF export folder", e))?;
    let gguf_path = work.join(format!("{stem}.gguf"));
    let (path, name) = (gguf_path.clone(), model.to_string());
    let built =
        tokio::task::spawn_blocking(move || export_stack(&fetched, &name, quant, &path)).await;
    let uploaded = match built {
        Err(e) => Err(ApiError::internal("GGUF export", e)),
        Ok(Err(verity_worker::WorkerError::InvalidArgument(msg))) => Err(ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            ..ApiError::bad_request(msg).with_code("gguf_unsupported")
        }),
        Ok(Err(other)) => Err(ApiError::internal("GGUF export", other)),
        Ok(Ok((_, text))) => upload(state, &gguf_path, gguf_key, modelfile_key, text).await,
    };
    let _ = std::fs::remove_dir_all(&work);
    uploaded?;
    tracing::info!(model, %quant, key = gguf_key, "checkpoint exported as GGUF");
    Ok(())
}

/// Puts the GGUF file, then the Modelfile that marks the export finished.
async fn upload(
    state: &AppState,
    gguf_path: &std::path::Path,
    gguf_key: &str,
    modelfile_key: &str,
    modelfile: String,
) -> ApiResult<()> {
    state.store.put_file(gguf_key, gguf_path).await?;
    state.store.put_bytes(modelfile_key, modelfile.into_bytes().into()).await?;
    Ok(())
}
