//! Training through the Tinker API: `create_model` queues a training client (a queue row a
//! training worker claims and holds, its model and optimizer resident), and each ordered call
//! (`forward_backward`, `forward`, `optim_step`, `save_weights_for_sampler`, …) waits in the
//! client's call queue until that worker runs it; the answer comes back through
//! `retrieve_future` like a sample's.

use super::training_proto::decode_forward_backward;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiJson;
use crate::api::inference::source_at;
use crate::api::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use verity_core::tinker::clients::{self, CreateClientError, EnqueueCallError, NewClient, Restore};
use verity_core::tinker::training::AdamParams;

/// Largest LoRA rank a client may ask for.
pub const MAX_LORA_RANK: u32 = 256;

/// `lora_config` of `create_model`.
#[derive(Debug, Deserialize)]
pub struct LoraSettings {
    rank: u32,
    #[serde(default)]
    seed: Option<u64>,
}

/// `optimizer_config` of `create_model`.
#[derive(Debug, Deserialize)]
pub struct OptimizerSettings {
    #[serde(rename = "type", default = "adamw")]
    kind: String,
}

fn adamw() -> String {
    "adamw".into()
}

/// Body of `create_model`.
#[derive(Debug, Deserialize)]
pub struct CreateModel {
    session_id: String,
    #[serde(default)]
    model_seq_id: i64,
    base_model: String,
    /// Absent: every weight trains (a Verity extension; Tinker's SDK always sends one).
    #[serde(default)]
    lora_config: Option<LoraSettings>,
    #[serde(default)]
    optimizer_config: Option<OptimizerSettings>,
}

/// Queues a training client on `base_model`; the future completes once a worker holds it.
pub async fn create_model(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateModel>,
) -> ApiResult<Json<Value>> {
    let base_model = crate::api::jobs::validate::model_name_param(
        &state,
        &principal,
        "base_model",
        &body.base_model,
    )
    .await?;
    if let Some(lora) = &body.lora_config {
        if lora.rank == 0 || lora.rank > MAX_LORA_RANK {
            return Err(ApiError::invalid(
                "lora_config.rank",
                format!("must be 1 to {MAX_LORA_RANK}"),
            ));
        }
    }
    if let Some(optimizer) = &body.optimizer_config {
        if optimizer.kind != "adamw" {
            return Err(ApiError::invalid(
                "optimizer_config.type",
                format!("{:?} is not served; Verity trains with adamw", optimizer.kind),
            ));
        }
    }
    source_at(&state, principal.org_id, "base_model", &base_model).await?;
    let client = NewClient {
        session_id: &body.session_id,
        seq: body.model_seq_id,
        base_model: &base_model,
        lora_rank: body.lora_config.as_ref().map(|l| l.rank),
        seed: body.lora_config.as_ref().and_then(|l| l.seed).unwrap_or(0),
        user_id: Some(principal.user_id),
        restore: None,
    };
    create(&state, &principal, &client).await
}

/// Queues a new client and answers its future.
async fn create(
    state: &AppState,
    principal: &Principal,
    client: &NewClient<'_>,
) -> ApiResult<Json<Value>> {
    let created = clients::create_client(&state.queue, principal.org_id, client).await.map_err(
        |e| match e {
            CreateClientError::NoSession(id) => ApiError::not_found("session", &id),
            CreateClientError::Queue(e) => e.into(),
            CreateClientError::Db(e) => e.into(),
        },
    )?;
    tracing::info!(org_id = %principal.org_id, model_id = %created.model_id, "tinker training client queued");
    Ok(Json(json!({ "request_id": created.future_id, "model_id": created.model_id })))
}

/// Body of `get_info`.
#[derive(Debug, Deserialize)]
pub struct GetInfo {
    model_id: String,
}

/// A training client's model (`GetInfoResponse`).
pub async fn get_info(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<GetInfo>,
) -> ApiResult<Json<Value>> {
    let client = clients::client(&state.pool, principal.org_id, &body.model_id)
        .await?
        .ok_or_else(|| ApiError::not_found("training client", &body.model_id))?;
    let tokenizer_id = super::tokenizer_name(&state, principal.org_id, &client.base_model).await?;
    Ok(Json(json!({
        "type": "get_info",
        "model_id": client.id,
        "model_name": client.base_model,
        "model_data": {"model_name": client.base_model, "tokenizer_id": tokenizer_id},
        "is_lora": client.lora_rank.is_some(),
        "lora_rank": client.lora_rank,
        "optimizer_config": {"type": "adamw"},
        "training_run_id": client.job_id,
    })))
}

/// Queues one ordered call and answers its future.
async fn enqueue(
    state: &AppState,
    principal: &Principal,
    model_id: &str,
    seq_id: i32,
    kind: &str,
    body: &Value,
) -> ApiResult<Json<Value>> {
    super::check_pending(state, principal.org_id).await?;
    let future_id =
        clients::enqueue_call(&state.pool, principal.org_id, model_id, seq_id, kind, body)
            .await
            .map_err(|e| match e {
                EnqueueCallError::NoClient(id) => ApiError::invalid(
                    "model_id",
                    format!("no training client {id:?} (create one with create_model)"),
                ),
                // 410, not 409: the SDK retries a 409 for five minutes, and an ended client
                // never comes back.
                ended @ EnqueueCallError::Ended { .. } => ApiError {
                    status: axum::http::StatusCode::GONE,
                    ..ApiError::conflict("training_client_ended", ended.to_string())
                },
                EnqueueCallError::Db(e) => e.into(),
            })?;
    Ok(Json(json!({ "request_id": future_id, "model_id": model_id })))
}

/// Answers a refused ordered call: its place in the client's order is filled with a call that
/// fails at once (the SDK has already numbered the calls after it, which would otherwise wait
/// for it forever), then the 400.
async fn refuse(
    state: &AppState,
    principal: &Principal,
    order: Option<(&str, i32)>,
    error: ApiError,
) -> ApiError {
    if let Some((model_id, seq_id)) = order {
        let body = json!({ "error": error.message });
        let pool = &state.pool;
        let org = principal.org_id;
        if let Err(e) =
            clients::enqueue_call(pool, org, model_id, seq_id, clients::REFUSED, &body).await
        {
            tracing::debug!(model_id, seq_id, error = %e, "no place to fill for a refused call");
        }
    }
    error
}

/// `forward_backward` and `forward` (protobuf body): checked here, run by the client's worker.
pub async fn forward_backward(
    principal: Principal,
    State(state): State<AppState>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let decoded = match decode_forward_backward(&body) {
        Ok(decoded) => decoded,
        Err(refused) => {
            let order = refused.order.as_ref().map(|(model, seq)| (model.as_str(), *seq));
            let error = ApiError::invalid(refused.error.field, refused.error.message);
            return Err(refuse(&state, &principal, order, error).await);
        }
    };
    let kind = if decoded.call.forward_only { "forward" } else { "forward_backward" };
    let call = serde_json::to_value(&decoded.call).map_err(|e| ApiError::internal("call", e))?;
    enqueue(&state, &principal, &decoded.model_id, decoded.seq_id, kind, &call).await
}

/// Body of `optim_step`.
#[derive(Debug, Deserialize)]
pub struct OptimStep {
    model_id: String,
    seq_id: i32,
    #[serde(default)]
    adam_params: Option<AdamParams>,
    #[serde(default)]
    optimizer_params: Option<Value>,
}

/// `optim_step` with Adam's settings.
pub async fn optim_step(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<OptimStep>,
) -> ApiResult<Json<Value>> {
    let order = Some((body.model_id.as_str(), body.seq_id));
    if body.optimizer_params.is_some() {
        let error = ApiError::invalid(
            "optimizer_params",
            "only Adam is served; send adam_params (types.AdamParams)",
        );
        return Err(refuse(&state, &principal, order, error).await);
    }
    let adam = body.adam_params.unwrap_or_default();
    if let Err((field, message)) = adam.check() {
        let error = ApiError::invalid(format!("adam_params.{field}"), message);
        return Err(refuse(&state, &principal, order, error).await);
    }
    let call = json!({ "adam_params": adam });
    enqueue(&state, &principal, &body.model_id, body.seq_id, "optim_step", &call).await
}

/// Body of `save_weights_for_sampler` and `save_weights`.
#[derive(Debug, Deserialize)]
pub struct SaveWeights {
    #[serde(default)]
    model_id: Option<String>,
    #[serde(default)]
    seq_id: Option<i32>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    sampling_session_seq_id: Option<i64>,
    #[serde(default)]
    ttl_seconds: Option<i64>,
    /// `save_weights_external`'s encryption: not served.
    #[serde(default)]
    age_encryption_recipients: Option<Vec<String>>,
}

/// A save's `path` (see [`check_save_name`]) and `ttl_seconds` (see [`check_ttl`]).
fn check_save(body: &SaveWeights) -> ApiResult<()> {
    check_save_name(&body.path)?;
    check_ttl(body.ttl_seconds)
}

/// `ttl_seconds` of a save or of `…/ttl`: absent/null (kept until deleted) or within
/// [`clients::TTL_SECONDS`].
pub(super) fn check_ttl(ttl_seconds: Option<i64>) -> ApiResult<()> {
    match ttl_seconds {
        Some(ttl) if !clients::TTL_SECONDS.contains(&ttl) => Err(ApiError::invalid(
            "ttl_seconds",
            format!(
                "must be {} to {} seconds (an hour to ten years), or null to keep the weights \
                 until they are deleted",
                clients::TTL_SECONDS.start(),
                clients::TTL_SECONDS.end()
            ),
        )),
        _ => Ok(()),
    }
}

/// The name a save is stored under: letters, digits, `-`, `_`, `.`, at most 128.
fn check_save_name(path: &Option<String>) -> ApiResult<()> {
    let Some(name) = path else { return Ok(()) };
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid("path", "a name of 1 to 128 letters, digits, '-', '_' or '.'"))
    }
}

/// The `model_id` and `seq_id` every ordered call carries.
fn ordered(body: &SaveWeights) -> ApiResult<(&str, i32)> {
    let model_id =
        body.model_id.as_deref().ok_or_else(|| ApiError::invalid("model_id", "required"))?;
    let seq_id = body.seq_id.ok_or_else(|| ApiError::invalid("seq_id", "required"))?;
    Ok((model_id, seq_id))
}

/// Saves the client's weights as a Verity model (a checkpoint of its training run) and, when
/// asked, opens a sampling session on them.
pub async fn save_weights_for_sampler(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SaveWeights>,
) -> ApiResult<Json<Value>> {
    let (model_id, seq_id) = ordered(&body)?;
    if let Err(error) = check_save(&body) {
        return Err(refuse(&state, &principal, Some((model_id, seq_id)), error).await);
    }
    let call = json!({ "path": body.path, "sampling_session_seq_id": body.sampling_session_seq_id,
                       "ttl_seconds": body.ttl_seconds });
    enqueue(&state, &principal, model_id, seq_id, "save_weights_for_sampler", &call).await
}

/// `save_weights` (`save_state`): the weights and the optimizer's state, saved as a Verity model
/// under `tinker://<run>/weights/<name>`, for `load_state` or a new client to start from.
pub async fn save_weights(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SaveWeights>,
) -> ApiResult<Json<Value>> {
    let (model_id, seq_id) = ordered(&body)?;
    if let Err(error) = check_save(&body) {
        return Err(refuse(&state, &principal, Some((model_id, seq_id)), error).await);
    }
    let call = json!({ "path": body.path, "ttl_seconds": body.ttl_seconds });
    enqueue(&state, &principal, model_id, seq_id, "save_weights", &call).await
}

/// `save_weights_external`: the weights (not the optimizer) as a Hugging Face folder — full
/// weights, or a PEFT adapter for a LoRA client — under `tinker://<run>/external_weights/<name>`,
/// downloadable file by file through `get_external_weights_urls`; also a Verity model.
pub async fn save_weights_external(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SaveWeights>,
) -> ApiResult<Json<Value>> {
    let (model_id, seq_id) = ordered(&body)?;
    let refused = check_save(&body).and_then(|()| {
        if body.path.is_none() {
            return Err(ApiError::invalid(
                "path",
                "the name to save the weights under is required",
            ));
        }
        match &body.age_encryption_recipients {
            Some(recipients) if !recipients.is_empty() => Err(ApiError::invalid(
                "age_encryption_recipients",
                "encrypting saved weights is not served by Verity; save without recipients \
                 (the URLs are signed and expire)",
            )),
            _ => Ok(()),
        }
    });
    if let Err(error) = refused {
        return Err(refuse(&state, &principal, Some((model_id, seq_id)), error).await);
    }
    let call = json!({ "path": body.path, "ttl_seconds": body.ttl_seconds });
    enqueue(&state, &principal, model_id, seq_id, "save_weights_external", &call).await
}

/// Body of `load_weights`.
#[derive(Debug, Deserialize)]
pub struct LoadWeights {
    #[serde(default)]
    model_id: Option<String>,
    #[serde(default)]
    seq_id: Option<i32>,
    path: String,
    #[serde(default)]
    optimizer: bool,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model_seq_id: Option<i64>,
}

/// `load_weights`: into a client (`load_state`, `load_state_with_optimizer`), in its order; or,
/// without `model_id`, a new client that starts from the saved weights
/// (`create_training_client_from_state`), on their model with their adapter rank.
pub async fn load_weights(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<LoadWeights>,
) -> ApiResult<Json<Value>> {
    let source = clients::saved_source(&state.pool, principal.org_id, &body.path).await?;
    let unknown = || {
        ApiError::invalid("path", format!("no weights were saved at {:?} (save_state)", body.path))
    };
    let Some(model_id) = body.model_id.as_deref() else {
        let source = source.ok_or_else(unknown)?;
        // Weights another org published start a client of the caller's org, on the run's base
        // model: one the caller may use (as `create_model` checks), else the 400 comes now.
        source_at(&state, principal.org_id, "path", &source.base_model).await?;
        let session_id = body
            .session_id
            .as_deref()
            .ok_or_else(|| ApiError::invalid("session_id", "required"))?;
        let client = NewClient {
            session_id,
            seq: body.model_seq_id.unwrap_or(0),
            base_model: &source.base_model,
            lora_rank: source.lora_rank.map(|r| r as u32),
            seed: 0,
            user_id: Some(principal.user_id),
            restore: Some(Restore {
                job_id: source.job_id,
                step: source.step,
                optimizer: body.optimizer,
            }),
        };
        return create(&state, &principal, &client).await;
    };
    let seq_id = body.seq_id.ok_or_else(|| ApiError::invalid("seq_id", "required"))?;
    let order = Some((model_id, seq_id));
    let Some(source) = source else {
        return Err(refuse(&state, &principal, order, unknown()).await);
    };
    if let Some(client) = clients::client(&state.pool, principal.org_id, model_id).await? {
        if (client.base_model.as_str(), client.lora_rank)
            != (source.base_model.as_str(), source.lora_rank)
        {
            let error = ApiError::invalid(
                "path",
                format!(
                    "{:?} holds weights of {} ({}); this client trains {} ({})",
                    body.path,
                    source.base_model,
                    adapter(source.lora_rank),
                    client.base_model,
                    adapter(client.lora_rank)
                ),
            );
            return Err(refuse(&state, &principal, order, error).await);
        }
    }
    let call = json!({ "path": body.path, "optimizer": body.optimizer });
    enqueue(&state, &principal, model_id, seq_id, "load_weights", &call).await
}

/// A client's adapter, in words.
fn adapter(lora_rank: Option<i32>) -> String {
    lora_rank.map_or("every weight".into(), |r| format!("LoRA rank {r}"))
}
