//! OpenAI-compatible inference: `POST /v1/chat/completions` and `POST /v1/completions` for any
//! model the caller's org can use (a base model, a job's fine-tuned model, a checkpoint). The
//! API server checks the request and resolves the model
//! ([`verity_core::inference::resolve_model`]), then forwards it to an inference worker
//! ([`forward`]) and relays its events as one JSON answer or as server-sent events in OpenAI's
//! chunk format, ending with `data: [DONE]`. A client that goes away stops the generation.

pub mod forward;
pub mod judge;
pub mod openai;
mod respond;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::state::AppState;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use openai::{ChatCompletionRequest, Checked, CompletionRequest};
use respond::Shape;
use verity_worker::inference::request::{GenerationRequest, ModelSource, PromptInput};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
}

/// Where the weights of `model` are, for the caller's org: 404 naming it when the org has no
/// such model.
async fn model_source(
    state: &AppState,
    principal: &Principal,
    model: &str,
) -> Result<ModelSource, ApiError> {
    let named = crate::api::jobs::validate::model_name_param(state, principal, "model", model);
    // A missing model is a 404 here, as OpenAI answers it (a hub id no model has too).
    let model = &named.await.map_err(|mut e| {
        if e.code == Some("model_not_found") {
            e.status = axum::http::StatusCode::NOT_FOUND;
        }
        e
    })?;
    match servable(state, principal.org_id, model).await? {
        Some(Ok(source)) => Ok(source),
        Some(Err(why)) => Err(ApiError::invalid("model", why)),
        None => {
            let mut e = ApiError::not_found("model", model);
            e.message =
                format!("the model {model:?} does not exist or you do not have access to it");
            e.param = Some("model".into());
            e.code = Some("model_not_found");
            Err(e)
        }
    }
}

/// Where the weights of `model` are for org `org_id`, or a 400 naming `param` (a judge's
/// `model`, a Tinker sampler's `base_model`) when the org has no such servable model.
pub(crate) async fn source_at(
    state: &AppState,
    org_id: uuid::Uuid,
    param: &str,
    model: &str,
) -> Result<ModelSource, ApiError> {
    match servable(state, org_id, model).await? {
        Some(Ok(source)) => Ok(source),
        Some(Err(why)) => Err(ApiError::invalid(param, why)),
        None => Err(ApiError::invalid(
            param,
            format!("the model {model:?} does not exist or you do not have access to it"),
        )),
    }
}

/// Where the weights of `model` are for org `org_id`: `None` when the org has no such model,
/// `Some(Err(why))` when it is stored in a format that cannot be served.
pub(crate) async fn servable(
    state: &AppState,
    org_id: uuid::Uuid,
    model: &str,
) -> Result<Option<Result<ModelSource, String>>, ApiError> {
    let Some(served) = verity_core::inference::resolve_model(&state.pool, org_id, model).await?
    else {
        return Ok(None);
    };
    if !matches!(served.base.format.as_str(), "hf" | "gguf") {
        return Ok(Some(Err(format!(
            "{model:?} is stored as {:?}, which cannot be served",
            served.base.format
        ))));
    }
    Ok(Some(Ok(ModelSource {
        base_prefix: served.base.storage_prefix,
        base_format: served.base.format,
        merged: served.merged,
        checkpoint_prefix: served.checkpoint_prefix,
    })))
}

async fn run(
    state: AppState,
    principal: Principal,
    model: String,
    prompt: PromptInput,
    checked: Checked,
    shape: Shape,
) -> ApiResult<Response> {
    let source = model_source(&state, &principal, &model).await?;
    let request = GenerationRequest { model: source, prompt, params: checked.params.clone() };
    let forwarded = forward::forward(&state, &request).await.map_err(|mut e| {
        // The worker checks the budget against the context; name the field the client used.
        if e.param.as_deref() == Some("max_tokens") {
            e.param = Some(checked.max_tokens_field.to_string());
            e.message = e.message.replace("max_tokens", checked.max_tokens_field);
        }
        e
    })?;
    let reply = respond::Reply::new(shape, model, checked);
    if reply.stream() {
        Ok(reply.stream_response(forwarded))
    } else {
        reply.collect(forwarded).await
    }
}

/// Creates a chat completion (OpenAI's `chat.completion`, or `chat.completion.chunk` events
/// with `stream`).
#[utoipa::path(post, path = "/v1/chat/completions", tag = "inference", request_body = ChatCompletionRequest,
    responses((status = 200, body = respond::ChatCompletion, description = "JSON, or with `stream` server-sent `chat.completion.chunk` events ending with `data: [DONE]`"),
        (status = 400), (status = 401), (status = 404), (status = 429), (status = 503)))]
pub async fn chat_completions(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<ChatCompletionRequest>,
) -> ApiResult<Response> {
    let (messages, checked) = request.check()?;
    run(state, principal, request.model, PromptInput::Chat(messages), checked, Shape::Chat).await
}

/// Creates a text completion of a raw prompt (OpenAI's legacy `text_completion`).
#[utoipa::path(post, path = "/v1/completions", tag = "inference", request_body = CompletionRequest,
    responses((status = 200, body = respond::TextCompletion, description = "JSON, or with `stream` server-sent `text_completion` events ending with `data: [DONE]`"),
        (status = 400), (status = 401), (status = 404), (status = 429), (status = 503)))]
pub async fn completions(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CompletionRequest>,
) -> ApiResult<Response> {
    let (prompt, checked) = request.check()?;
    run(state, principal, request.model, PromptInput::Text(prompt), checked, Shape::Text).await
}
