//! `/v1/fine_tuning/alpha/graders/run|validate`: try a grader on one sample before paying for a
//! job (OpenAI's grader endpoints, backed by the verity-verifiers crate).

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
pub use super::grader_run::RunGraderResponse;
use super::jobs::validate::{check_name_param, validate_judges};
use super::state::{AppState, GraderSlot, SlotsBusy};
use crate::api::inference::judge::judge_for;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Instant;
use utoipa::ToSchema;
use verity_verifiers::{probes, Grader, Sample};
use verity_worker::embedding_models::{EmbeddingModels, EmbeddingSetupError};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/fine_tuning/alpha/graders/run", post(run_grader))
        .route("/v1/fine_tuning/alpha/graders/validate", post(validate_grader_endpoint))
}

/// Parses a grader, mapping the first problem to a 400 naming its JSON path under `param`; a
/// `cosine` grader that names no model is refused, naming its `evaluation_metric`, when the
/// process has no default embedding model (`VERITY_EMBEDDING_MODEL`). Nothing is loaded or
/// fetched here (this runs on the request's async thread): [`load_grader_models`] does that, on
/// a blocking thread.
pub fn parse_grader(param: &str, grader: &Value) -> ApiResult<Grader> {
    let grader = compile_grader(param, grader)?;
    verity_worker::embedding::configured()
        .check(&grader)
        .map_err(|(path, e)| ApiError::invalid(format!("{param}.{path}"), e.to_string()))?;
    Ok(grader)
}

/// Checks that every embedding model the grader's `cosine` graders name (by its name or its hub
/// id) is registered (kind `embedding`) for the caller's org; a missing one is a 400 naming its
/// JSON path under `param`.
pub async fn validate_embedding_models(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: &Grader,
) -> ApiResult<()> {
    for (path, name) in grader.embedding_models() {
        // A hub id (`OWNER/NAME`) is looked up, never used as a path.
        let hub_id = |name: &str| verity_core::models::check_hub_id(name).is_ok();
        if let Some(name) = name.filter(|n| !hub_id(n)) {
            check_name_param(&format!("{param}.{path}"), &name)?;
        }
    }
    let missing = EmbeddingModels::missing(&state.pool, principal.org_id, grader).await?;
    match missing {
        None => Ok(()),
        Some((path, name)) => Err(ApiError::invalid(
            format!("{param}.{path}"),
            format!(
                "embedding model {name:?} does not exist (register it with `verity models \
                 import --kind embedding`)"
            ),
        )
        .with_code("model_not_found")),
    }
}

/// `grader` with the registered embedding models it names loaded (in this process) and given
/// to its `cosine` graders; an unknown one is a 400 naming its JSON path under `param`.
async fn attach_embeddings(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: Grader,
) -> ApiResult<Grader> {
    validate_embedding_models(state, principal, param, &grader).await?;
    state
        .embeddings
        .attach(&state.pool, state.store.as_ref(), principal.org_id, grader)
        .await
        .map_err(|(path, e)| match e {
            EmbeddingSetupError::Database(e) => ApiError::database("embedding model lookup", e),
            EmbeddingSetupError::Load { .. } => ApiError::internal("embedding model", e),
            e => ApiError::invalid(format!("{param}.{path}"), e.to_string()),
        })
}

/// `grader` (at JSON path `param`) parsed and checked (its names, judges and embedding models
/// exist for the caller's org), nothing loaded yet.
pub async fn checked_grader(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: &Value,
) -> ApiResult<Grader> {
    let grader = parse_grader(param, grader)?;
    validate_judges(state, principal, param, &grader).await?;
    validate_embedding_models(state, principal, param, &grader).await?;
    Ok(grader)
}

/// A checked `grader` made ready to grade in this process, by a request holding a grading slot
/// (loading a judge or embedding model is the expensive part): its models attached, and each
/// sandboxed run capped at `VERITY_GRADER_RUN_MAX_MS`.
pub async fn load_grader_models(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: Grader,
) -> ApiResult<Grader> {
    let grader = attach_embeddings(state, principal, param, grader).await?;
    let grader = attach_judge(state, principal, param, grader).await?;
    Ok(grader.with_run_cap(state.limits.grader_run_max_ms))
}

/// `grader` (at JSON path `param`) checked, then a grading slot taken, then its models loaded:
/// the slot and the grader ready to grade with [`grade_in_slot`].
pub async fn ready_grader(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: &Value,
) -> ApiResult<(GraderSlot, Grader)> {
    let grader = checked_grader(state, principal, param, grader).await?;
    let slot = grader_slot(state, principal).await?;
    let grader = load_grader_models(state, principal, param, grader).await?;
    Ok((slot, grader))
}

/// A model grader's judge: asked through an inference worker (or the endpoint it is routed
/// to), never loaded in this process; see [`crate::api::inference::judge`].
async fn attach_judge(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: Grader,
) -> ApiResult<Grader> {
    if !grader.uses_judge() {
        return Ok(grader);
    }
    let judge = judge_for(state, principal.org_id, param, &grader).await?;
    Ok(grader.with_judge(judge))
}

/// A grading slot for the caller's org: 429 when the org already runs as many gradings as it
/// may (`VERITY_GRADER_ORG_CONCURRENCY`), 503 when every slot stayed taken for the whole wait.
pub async fn grader_slot(state: &AppState, principal: &Principal) -> ApiResult<GraderSlot> {
    state.grader_slots.acquire(principal.org_id).await.map_err(|busy| {
        tracing::warn!(org_id = %principal.org_id, ?busy, wait = ?state.grader_slots.wait, "no grader slot");
        match busy {
            SlotsBusy::Org => org_graders_busy(state.grader_slots.org_limit),
            SlotsBusy::All => graders_busy(),
        }
    })
}

/// Runs `work` on a blocking thread holding `slot`; the slot goes with the work, so a grading
/// whose client gave up still holds it.
pub async fn grade_in_slot<T: Send + 'static>(
    slot: GraderSlot,
    work: impl FnOnce() -> T + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(move || {
        let result = work();
        drop(slot);
        result
    })
    .await
    .map_err(|e| ApiError::internal("grader task", e))
}

fn compile_grader(param: &str, grader: &Value) -> ApiResult<Grader> {
    let text =
        serde_json::to_string(grader).map_err(|e| ApiError::invalid(param, e.to_string()))?;
    Grader::from_json(&text).map_err(|invalid| {
        let mut problems = invalid.0.into_iter();
        match problems.next() {
            Some(first) => {
                let path = first.path.trim_start_matches('.');
                let param =
                    if path.is_empty() { param.to_string() } else { format!("{param}.{path}") };
                let more = problems.count();
                let suffix =
                    if more > 0 { format!(" (and {more} more problem(s))") } else { String::new() };
                ApiError::invalid(param, format!("{}{suffix}", first.message))
            }
            None => ApiError::invalid(param, "invalid grader"),
        }
    })
}

/// Body of `POST /v1/fine_tuning/alpha/graders/run`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunGraderRequest {
    /// The grader spec.
    #[schema(value_type = Object)]
    pub grader: Value,
    /// The completion to grade (its text; when it is JSON, also `sample.output_json`).
    pub model_sample: String,
    /// The dataset row the grader's `{{item.…}}` templates read.
    #[schema(value_type = Option<Object>)]
    pub item: Option<Value>,
}

/// Seconds a client is told to wait when every grader slot is taken.
const BUSY_RETRY_AFTER_SECS: u64 = 1;

/// 503: every grader slot stayed taken for the whole wait.
fn graders_busy() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "the server is grading as many samples as it allows at once; retry later".into(),
        kind: "server_error",
        param: None,
        code: Some("graders_busy"),
        retry_after: Some(BUSY_RETRY_AFTER_SECS),
    }
}

/// 429: the caller's org already runs `limit` gradings.
fn org_graders_busy(limit: usize) -> ApiError {
    ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message: format!(
            "your organization is already grading {limit} sample(s) at once, the most it may; retry later"
        ),
        kind: "rate_limit_error",
        param: None,
        code: Some("org_graders_busy"),
        retry_after: Some(BUSY_RETRY_AFTER_SECS),
    }
}

/// Grades one sample.
#[utoipa::path(post, path = "/v1/fine_tuning/alpha/graders/run", tag = "graders", request_body = RunGraderRequest,
    responses((status = 200, body = RunGraderResponse), (status = 400), (status = 401),
        (status = 503, description = "every grader slot is taken; retry after `Retry-After` seconds")))]
pub async fn run_grader(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(request): ApiJson<RunGraderRequest>,
) -> ApiResult<Json<RunGraderResponse>> {
    let item = request.item.unwrap_or_else(|| json!({}));
    if !item.is_object() {
        return Err(ApiError::invalid("item", "must be a JSON object (a dataset row)"));
    }
    // The slot is taken before any judge or embedding model is loaded.
    let (slot, grader) = ready_grader(&state, &principal, "grader", &request.grader).await?;
    // As OpenAI does: a `model_sample` that is JSON is also `sample.output_json`.
    let sample = Sample::from_text(request.model_sample).with_output_json();
    let started = Instant::now();
    // Grading is CPU work or a sandboxed process: keep it off the async threads.
    let graded = grader.clone();
    let result = grade_in_slot(slot, move || graded.grade(&item, &sample)).await?;
    Ok(Json(RunGraderResponse::of(&grader, result, started.elapsed().as_secs_f64())))
}

/// Body of `POST /v1/fine_tuning/alpha/graders/validate`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateGraderRequest {
    /// The grader spec.
    #[schema(value_type = Object)]
    pub grader: Value,
    /// Verity extension: a dataset row to try the exploit probes on (see `verity_probes`).
    #[schema(value_type = Option<Object>)]
    pub item: Option<Value>,
}

/// Runs each `python` grader of `grader` once (on `item`, else an empty row, and an empty
/// sample), as OpenAI's validation does: a source that does not load (a syntax error, an import
/// that fails, no `grade`) is a 400 naming its `source`; a `grade()` failing on the trial data
/// is not.
async fn python_trial(
    state: &AppState,
    principal: &Principal,
    grader: &Grader,
    item: Option<&Value>,
) -> ApiResult<()> {
    if !grader.runs_python() {
        return Ok(());
    }
    let item = match item {
        Some(item) if item.is_object() => item.clone(),
        _ => json!({}),
    };
    let slot = grader_slot(state, principal).await?;
    let grader = grader.clone().with_run_cap(state.limits.grader_run_max_ms);
    let tried = grade_in_slot(slot, move || grader.python_trial(&item)).await?;
    tried.map_err(|(path, why)| ApiError::invalid(format!("grader.{path}"), why))
}

/// Checks a grader; answers it back when valid, else a 400 naming the JSON path; a `python`
/// grader is run once first (a source that does not load is a 400). Verity adds
/// `verity_probes`: known reward hacks graded by it (`verity_verifiers::probes`), on `item` or,
/// when the grader reads no `item` field, on an empty row; otherwise `verity_probes` is null
/// and `verity_probes_skipped` says why.
#[utoipa::path(post, path = "/v1/fine_tuning/alpha/graders/validate", tag = "graders", request_body = ValidateGraderRequest,
    responses((status = 200, body = Object), (status = 400), (status = 401),
        (status = 503, description = "every grader slot is taken; retry after `Retry-After` seconds")))]
pub async fn validate_grader_endpoint(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(request): ApiJson<ValidateGraderRequest>,
) -> ApiResult<Json<Value>> {
    // Validation is the grader's own checks; the probes below then need it ready to grade here
    // (a model grader's judge loaded), which only a probe run pays for.
    let parsed = checked_grader(&state, &principal, "grader", &request.grader).await?;
    python_trial(&state, &principal, &parsed, request.item.as_ref()).await?;
    let item = match request.item {
        Some(item) if !item.is_object() => {
            return Err(ApiError::invalid("item", "must be a JSON object (a dataset row)"))
        }
        Some(item) => Some(item),
        None if parsed.item_fields().is_empty() => Some(json!({})),
        None => None,
    };
    let skipped = |why: String| {
        Json(
            json!({ "grader": request.grader, "verity_probes": null, "verity_probes_skipped": why }),
        )
    };
    let Some(item) = item else {
        let fields: Vec<String> =
            parsed.item_fields().iter().map(|p| format!("item.{}", p.join("."))).collect();
        return Ok(skipped(format!(
            "pass `item` (a dataset row) to try the exploit probes: the grader reads {}",
            fields.join(", ")
        )));
    };
    let slot = grader_slot(&state, &principal).await?;
    let grader = match load_grader_models(&state, &principal, "grader", parsed).await {
        Ok(grader) => grader,
        // The grader is valid; only its models could not be made ready in this process.
        Err(e) if e.status.is_server_error() => {
            return Ok(skipped(format!("the probes need the grader's models here: {}", e.message)))
        }
        Err(e) => return Err(e),
    };
    let probes = grade_in_slot(slot, move || probes::run_probes(&grader, &item, None)).await?;
    Ok(Json(json!({ "grader": request.grader, "verity_probes": probes })))
}
