//! `/v1/verity/rejection_sampling`: k completions per prompt of a file from one model, graded;
//! the kept ones (`best` per prompt, or `all_passing` de-duplicated) written as a new supervised
//! chat file (`{"messages": [… prompt, {"role": "assistant", …}]}`, purpose `fine-tune`), with a
//! per-prompt pass-rate summary.

use super::{
    cancel_run, find_run, list_page, resolve_run_model, run_samples, validate_file_and_grader,
    PreparedRun, RunStatus, SamplingRequest,
};
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::{reject_nul, ApiJson, ApiQuery};
use crate::api::jobs::samples::{SampleObject, SampleQuery};
use crate::api::pagination::{Page, PageQuery};
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use verity_core::jobs::JobRecord;
use verity_core::sampling_runs::{
    validate_samples, RejectionSamplingSpec, RunKind, RunModel, RunSpec, SelectionPolicy,
};
use verity_core::JobState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/verity/rejection_sampling", get(list_runs).post(create_run))
        .route("/v1/verity/rejection_sampling/{run_id}", get(get_run))
        .route("/v1/verity/rejection_sampling/{run_id}/cancel", post(cancel))
        .route("/v1/verity/rejection_sampling/{run_id}/samples", get(run_samples_endpoint))
}

/// Body of `POST /v1/verity/rejection_sampling`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRejectionSamplingRequest {
    /// The sampler: a base, a fine-tuned model or a checkpoint name.
    pub model: Option<String>,
    /// File id of the prompts.
    pub file: Option<String>,
    /// A grader as the reinforcement jobs take it.
    #[schema(value_type = Option<Object>)]
    pub grader: Option<Value>,
    /// Completions per prompt, 1–1024 (default 4).
    pub k: Option<usize>,
    /// `best` (default: the highest-scoring passing completion per prompt) or `all_passing`
    /// (every passing completion, identical texts once).
    pub policy: Option<String>,
    /// Lowest score a kept completion has, 0–1 (default 1: correct).
    pub min_score: Option<f64>,
    /// Seed of the sampling (random when absent).
    pub seed: Option<i64>,
    /// Sampling parameters.
    #[serde(flatten)]
    pub sampling: SamplingRequest,
}

/// A rejection-sampling run (`verity.rejection_sampling`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RejectionSamplingObject {
    /// `rsjob-…`.
    pub id: String,
    /// Always `verity.rejection_sampling`.
    pub object: &'static str,
    /// Status, times, error, progress.
    #[serde(flatten)]
    pub status: RunStatus,
    /// The sampler and its base.
    #[schema(value_type = Object)]
    pub model: RunModel,
    /// The prompts' file.
    pub file: String,
    /// The grader.
    #[schema(value_type = Object)]
    pub grader: Value,
    /// Completions per prompt.
    pub k: usize,
    /// `best` or `all_passing`.
    #[schema(value_type = String)]
    pub policy: SelectionPolicy,
    /// Lowest score kept.
    pub min_score: f64,
    /// Sampling settings.
    #[schema(value_type = Object)]
    pub sampling: Value,
    /// Once succeeded: the id of the file of kept samples (null when none passed).
    pub output_file: Option<String>,
    /// Once succeeded: `prompts`, `samples`, `kept`, `prompts_with_a_pass`, `mean_pass_rate`
    /// and `per_prompt` (`prompt_index`, `samples`, `passing`, `pass_rate`, `kept`).
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Value>,
}

impl RejectionSamplingObject {
    /// The object of a stored rejection-sampling run.
    pub fn of(job: JobRecord) -> ApiResult<RejectionSamplingObject> {
        let Some(Ok(RunSpec::RejectionSampling(spec))) = RunSpec::of_job(&job.spec) else {
            return Err(ApiError::internal("reading a rejection-sampling run", "bad spec"));
        };
        let summary = job.result.clone().filter(|_| job.state == JobState::Succeeded);
        let output_file = summary
            .as_ref()
            .and_then(|s| s.get("output_file"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(RejectionSamplingObject {
            status: RunStatus::of(&job),
            object: "verity.rejection_sampling",
            model: spec.model,
            file: job.training_file.clone().unwrap_or_default(),
            grader: spec.grader,
            k: spec.k,
            policy: spec.policy,
            min_score: spec.min_score,
            sampling: serde_json::to_value(spec.sampling).unwrap_or(Value::Null),
            output_file,
            summary,
            id: job.id,
        })
    }
}

/// Default completions per prompt.
pub const DEFAULT_K: usize = 4;

/// Creates a rejection-sampling run and queues it.
#[utoipa::path(post, path = "/v1/verity/rejection_sampling", tag = "verity", request_body = CreateRejectionSamplingRequest,
    responses((status = 200, body = RejectionSamplingObject), (status = 400), (status = 401)))]
pub async fn create_run(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateRejectionSamplingRequest>,
) -> ApiResult<Json<RejectionSamplingObject>> {
    let job = prepare(&state, &principal, request).await?.enqueue(&state, &principal, None).await?;
    Ok(Json(RejectionSamplingObject::of(job)?))
}

/// Checks a rejection-sampling request; what to enqueue. Nothing is written.
pub async fn prepare(
    state: &AppState,
    principal: &Principal,
    request: CreateRejectionSamplingRequest,
) -> ApiResult<PreparedRun> {
    let model = request.model.ok_or_else(|| ApiError::invalid("model", "missing `model`"))?;
    reject_nul("model", &model)?;
    let file = request.file.ok_or_else(|| ApiError::invalid("file", "missing `file`"))?;
    reject_nul("file", &file)?;
    let grader = request.grader.ok_or_else(|| ApiError::invalid("grader", "missing `grader`"))?;
    let k = request.k.unwrap_or(DEFAULT_K);
    validate_samples("k", k).map_err(|e| ApiError::invalid(e.param, e.message))?;
    let min_score = request.min_score.unwrap_or(1.0);
    if !(min_score.is_finite() && (0.0..=1.0).contains(&min_score)) {
        return Err(ApiError::invalid("min_score", "must be between 0 and 1"));
    }
    let policy = match request.policy.as_deref() {
        None => SelectionPolicy::Best,
        Some(name) => SelectionPolicy::parse(name).ok_or_else(|| {
            ApiError::invalid("policy", format!("unknown policy {name:?}; use best or all_passing"))
        })?,
    };
    let sampling = request.sampling.settings(Default::default())?;
    let model = resolve_run_model(state, principal, "model", &model).await?;
    validate_file_and_grader(state, principal, &file, &grader, sampling.response_format.as_ref())
        .await?;
    // Graded scores below 1 only pass a `min_score` below 1.
    let min_score = if min_score >= 1.0 { verity_verifiers::SUCCESS_THRESHOLD } else { min_score };
    let spec = RunSpec::RejectionSampling(RejectionSamplingSpec {
        model,
        grader,
        k,
        policy,
        min_score,
        sampling,
    });
    Ok(PreparedRun { spec, file, seed: request.seed })
}

/// Lists rejection-sampling runs, newest first.
#[utoipa::path(get, path = "/v1/verity/rejection_sampling", tag = "verity", params(PageQuery),
    responses((status = 200, body = Page<RejectionSamplingObject>), (status = 400), (status = 401)))]
pub async fn list_runs(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<RejectionSamplingObject>>> {
    let kind = RunKind::RejectionSampling;
    let id_of = |r: &RejectionSamplingObject| r.id.clone();
    Ok(Json(list_page(&state, &principal, kind, &query, RejectionSamplingObject::of, id_of).await?))
}

/// One rejection-sampling run.
#[utoipa::path(get, path = "/v1/verity/rejection_sampling/{run_id}", tag = "verity", params(("run_id" = String, Path)),
    responses((status = 200, body = RejectionSamplingObject), (status = 401), (status = 404)))]
pub async fn get_run(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<RejectionSamplingObject>> {
    let job = find_run(&state, &principal, RunKind::RejectionSampling, &id).await?;
    Ok(Json(RejectionSamplingObject::of(job)?))
}

/// Cancels a rejection-sampling run.
#[utoipa::path(post, path = "/v1/verity/rejection_sampling/{run_id}/cancel", tag = "verity", params(("run_id" = String, Path)),
    responses((status = 200, body = RejectionSamplingObject), (status = 401), (status = 404), (status = 409)))]
pub async fn cancel(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<RejectionSamplingObject>> {
    let job = cancel_run(&state, &principal, RunKind::RejectionSampling, &id).await?;
    Ok(Json(RejectionSamplingObject::of(job)?))
}

/// Every graded completion of a run (kept or not), with its score (`step` 0).
#[utoipa::path(get, path = "/v1/verity/rejection_sampling/{run_id}/samples", tag = "verity", params(("run_id" = String, Path), SampleQuery),
    responses((status = 200, body = Page<SampleObject>), (status = 400), (status = 401), (status = 404)))]
pub async fn run_samples_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<SampleQuery>,
) -> ApiResult<Json<Page<SampleObject>>> {
    Ok(Json(run_samples(&state, &principal, RunKind::RejectionSampling, &id, &query).await?))
}
