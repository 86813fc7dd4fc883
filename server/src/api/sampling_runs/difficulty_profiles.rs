//! `/v1/verity/difficulty_profiles`: before a GRPO job is launched, k completions per prompt of
//! an evenly spaced subset of its training file, sampled with the job's model and sampling
//! hyperparameters and graded by its grader; the report holds the pass-rate histogram, the
//! predicted zero-advantage fraction at the job's group size, the prompts the base always or
//! never solves, and the cost and time estimate from the measured throughput and one measured
//! training step (`verity_core::difficulty`). `POST …/{id}/filtered_file` writes the training
//! file without those prompts as a new file.

use super::{
    cancel_run, find_run, list_page, resolve_run_model, run_samples, PreparedRun, RunStatus,
};
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::files::upload::PURPOSE_FINE_TUNE;
use crate::api::files::{find_file, FileObject};
use crate::api::jobs::samples::{SampleObject, SampleQuery};
use crate::api::jobs::validate::validate_rows;
use crate::api::jobs::{check_request, CreateJobRequest};
use crate::api::pagination::{Page, PageQuery};
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use verity_core::difficulty::{
    filter_jsonl, filtered_filename, ProfileReport, DEFAULT_PROMPTS, MAX_PROMPTS,
};
use verity_core::files::FileRecord;
use verity_core::jobs::JobRecord;
use verity_core::sampling_runs::{
    validate_samples, DifficultyProfileSpec, RunKind, RunModel, RunSpec, SamplingSettings,
};
use verity_core::spec::{Method, MethodKind};
use verity_core::JobState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/verity/difficulty_profiles", get(list_profiles).post(create_profile))
        .route("/v1/verity/difficulty_profiles/{run_id}", get(get_profile))
        .route("/v1/verity/difficulty_profiles/{run_id}/cancel", post(cancel))
        .route("/v1/verity/difficulty_profiles/{run_id}/samples", get(profile_samples))
        .route("/v1/verity/difficulty_profiles/{run_id}/filtered_file", post(filtered_file))
}

/// Body of `POST /v1/verity/difficulty_profiles`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDifficultyProfileRequest {
    /// The reinforcement job to profile, as `POST /v1/fine_tuning/jobs` takes it.
    pub job: Option<CreateJobRequest>,
    /// Prompts profiled, 1–4096 (default 32), evenly spaced over the file.
    pub prompts: Option<usize>,
    /// Completions per prompt, 1–1024 (default: the job's group size).
    pub k: Option<usize>,
    /// Run and time one training step of the job for the estimate (default true).
    pub measure_step: Option<bool>,
    /// Seed of the sampling (default: the job's seed, else random).
    pub seed: Option<i64>,
}

/// A difficulty profile (`verity.difficulty_profile`).
#[derive(Debug, Serialize, ToSchema)]
pub struct DifficultyProfileObject {
    /// `dpjob-…`.
    pub id: String,
    /// Always `verity.difficulty_profile`.
    pub object: &'static str,
    /// Status, times, error, progress (`phase`, `prompts_done`, `prompts`).
    #[serde(flatten)]
    pub status: RunStatus,
    /// The job's model and its base.
    #[schema(value_type = Object)]
    pub model: RunModel,
    /// The job's training file.
    pub file: String,
    /// The job's grader.
    #[schema(value_type = Object)]
    pub grader: Value,
    /// Completions per prompt.
    pub k: usize,
    /// Prompts asked for.
    pub prompts: usize,
    /// Whether a training step is measured.
    pub measure_step: bool,
    /// The job's resolved reinforcement hyperparameters.
    #[schema(value_type = Object)]
    pub hyperparameters: Value,
    /// Once succeeded: the histogram, the predicted zero-advantage fraction, per-row pass
    /// rates, throughput, the measured step and the estimate.
    #[schema(value_type = Option<Object>)]
    pub report: Option<ProfileReport>,
}

impl DifficultyProfileObject {
    /// The object of a stored difficulty profile.
    pub fn of(job: JobRecord) -> ApiResult<DifficultyProfileObject> {
        let Some(Ok(RunSpec::DifficultyProfile(spec))) = RunSpec::of_job(&job.spec) else {
            return Err(ApiError::internal("reading a difficulty profile", "bad spec"));
        };
        let report = job
            .result
            .clone()
            .filter(|_| job.state == JobState::Succeeded)
            .and_then(|r| serde_json::from_value(r).ok());
        Ok(DifficultyProfileObject {
            status: RunStatus::of(&job),
            object: "verity.difficulty_profile",
            model: spec.model,
            file: job.training_file.clone().unwrap_or_default(),
            grader: spec.grader,
            k: spec.k,
            prompts: spec.prompts,
            measure_step: spec.measure_step,
            hyperparameters: serde_json::to_value(spec.hyperparameters).unwrap_or(Value::Null),
            report,
            id: job.id,
        })
    }
}

/// Names `job.<param>` in an error about the nested job request.
fn under_job(mut error: ApiError) -> ApiError {
    error.param = error.param.take().map(|param| format!("job.{param}"));
    error
}

/// Creates a difficulty profile of a reinforcement job request and queues it.
#[utoipa::path(post, path = "/v1/verity/difficulty_profiles", tag = "verity", request_body = CreateDifficultyProfileRequest,
    responses((status = 200, body = DifficultyProfileObject), (status = 400), (status = 401)))]
pub async fn create_profile(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateDifficultyProfileRequest>,
) -> ApiResult<Json<DifficultyProfileObject>> {
    let run = prepare(&state, &principal, request).await?.enqueue(&state, &principal, None).await?;
    Ok(Json(DifficultyProfileObject::of(run)?))
}

/// Checks a difficulty-profile request; what to enqueue. Nothing is written.
pub async fn prepare(
    state: &AppState,
    principal: &Principal,
    request: CreateDifficultyProfileRequest,
) -> ApiResult<PreparedRun> {
    let job = request.job.ok_or_else(|| {
        ApiError::invalid("job", "missing `job` (the body of POST /v1/fine_tuning/jobs)")
    })?;
    let prompts = request.prompts.unwrap_or(DEFAULT_PROMPTS);
    if !(1..=MAX_PROMPTS).contains(&prompts) {
        return Err(ApiError::invalid("prompts", format!("must be between 1 and {MAX_PROMPTS}")));
    }
    let checked = check_request(state, principal, &job).await.map_err(under_job)?;
    if checked.method.kind != MethodKind::Reinforcement {
        return Err(ApiError::invalid(
            "job.method.type",
            "a difficulty profile samples and grades: it needs a reinforcement job (a grader)",
        ));
    }
    let method: Method = serde_json::from_value(checked.method.resolved.clone())
        .map_err(|e| ApiError::internal("reading the resolved method", e))?;
    let hyperparameters = method.training_hyperparameters();
    let k = request.k.unwrap_or(hyperparameters.group_size());
    validate_samples("k", k).map_err(|e| ApiError::invalid(e.param, e.message))?;
    let grader = job
        .method
        .as_ref()
        .and_then(|m| m.get("reinforcement"))
        .and_then(|r| r.get("grader"))
        .cloned()
        .ok_or_else(|| ApiError::invalid("job.method.reinforcement.grader", "missing grader"))?;
    validate_rows(state, "job.training_file", &checked.training, checked.method.rows()).await?;
    let model = resolve_run_model(state, principal, "job.model", &checked.model).await?;
    let sampling = SamplingSettings::of_recipe(
        &hyperparameters,
        method.reinforcement().and_then(|r| r.response_format.clone()),
    );
    let spec = RunSpec::DifficultyProfile(DifficultyProfileSpec {
        model,
        grader,
        k,
        prompts,
        sampling,
        hyperparameters: Box::new(hyperparameters),
        measure_step: request.measure_step.unwrap_or(true),
    });
    let seed = request.seed.or(job.seed);
    Ok(PreparedRun { spec, file: checked.training.id, seed })
}

/// Lists difficulty profiles, newest first.
#[utoipa::path(get, path = "/v1/verity/difficulty_profiles", tag = "verity", params(PageQuery),
    responses((status = 200, body = Page<DifficultyProfileObject>), (status = 400), (status = 401)))]
pub async fn list_profiles(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<DifficultyProfileObject>>> {
    let kind = RunKind::DifficultyProfile;
    let id_of = |r: &DifficultyProfileObject| r.id.clone();
    Ok(Json(list_page(&state, &principal, kind, &query, DifficultyProfileObject::of, id_of).await?))
}

/// One difficulty profile.
#[utoipa::path(get, path = "/v1/verity/difficulty_profiles/{run_id}", tag = "verity", params(("run_id" = String, Path)),
    responses((status = 200, body = DifficultyProfileObject), (status = 401), (status = 404)))]
pub async fn get_profile(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<DifficultyProfileObject>> {
    let job = find_run(&state, &principal, RunKind::DifficultyProfile, &id).await?;
    Ok(Json(DifficultyProfileObject::of(job)?))
}

/// Cancels a difficulty profile.
#[utoipa::path(post, path = "/v1/verity/difficulty_profiles/{run_id}/cancel", tag = "verity", params(("run_id" = String, Path)),
    responses((status = 200, body = DifficultyProfileObject), (status = 401), (status = 404), (status = 409)))]
pub async fn cancel(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<DifficultyProfileObject>> {
    let job = cancel_run(&state, &principal, RunKind::DifficultyProfile, &id).await?;
    Ok(Json(DifficultyProfileObject::of(job)?))
}

/// Every graded completion of a profile (`step` 0).
#[utoipa::path(get, path = "/v1/verity/difficulty_profiles/{run_id}/samples", tag = "verity", params(("run_id" = String, Path), SampleQuery),
    responses((status = 200, body = Page<SampleObject>), (status = 400), (status = 401), (status = 404)))]
pub async fn profile_samples(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<SampleQuery>,
) -> ApiResult<Json<Page<SampleObject>>> {
    Ok(Json(run_samples(&state, &principal, RunKind::DifficultyProfile, &id, &query).await?))
}

/// Body of `POST /v1/verity/difficulty_profiles/{id}/filtered_file`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterRequest {
    /// Drop the profiled prompts every sample solved (default true).
    pub drop_always_solved: Option<bool>,
    /// Drop the profiled prompts no sample solved (default true).
    pub drop_never_solved: Option<bool>,
}

/// The filtered copy of a profiled training file.
#[derive(Debug, Serialize, ToSchema)]
pub struct FilteredFileObject {
    /// The new file (`<name>.filtered.jsonl`, purpose `fine-tune`).
    pub file: FileObject,
    /// The file it was filtered from.
    pub source_file: String,
    /// The profile that chose the rows.
    pub profile: String,
    /// Rows (0-based) dropped, in file order.
    pub dropped_rows: Vec<usize>,
    /// Rows kept.
    pub kept_rows: usize,
}

/// The id of the filtered file a profile writes for a choice: one file per profile and choice,
/// so asking twice returns the same file.
fn filtered_file_id(run_id: &str, drop_always: bool, drop_never: bool) -> String {
    let which = match (drop_always, drop_never) {
        (true, true) => "both",
        (true, false) => "always",
        _ => "never",
    };
    format!("file-{run_id}-drop-{which}")
}

/// Writes the profiled training file without the prompts the base always (or never) solves:
/// every other row unchanged and in order, as a new processed file.
#[utoipa::path(post, path = "/v1/verity/difficulty_profiles/{run_id}/filtered_file", tag = "verity", params(("run_id" = String, Path)),
    request_body = FilterRequest,
    responses((status = 200, body = FilteredFileObject), (status = 400), (status = 401), (status = 404), (status = 409)))]
pub async fn filtered_file(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<FilterRequest>,
) -> ApiResult<Json<FilteredFileObject>> {
    let (drop_always, drop_never) =
        (request.drop_always_solved.unwrap_or(true), request.drop_never_solved.unwrap_or(true));
    if !drop_always && !drop_never {
        return Err(ApiError::invalid(
            "drop_always_solved",
            "drop_always_solved and drop_never_solved are both false: nothing to filter",
        ));
    }
    let run = find_run(&state, &principal, RunKind::DifficultyProfile, &id).await?;
    let profile = DifficultyProfileObject::of(run)?;
    let report = profile.report.ok_or_else(|| {
        ApiError::conflict("profile_not_finished", format!("profile {id} has not succeeded"))
    })?;
    let dropped = report.difficulty.dropped_rows(drop_always, drop_never);
    let source = find_file(&state, &principal, &profile.file).await?;
    let file_id = filtered_file_id(&id, drop_always, drop_never);
    let record = match verity_core::files::get_file(&state.pool, principal.org_id, &file_id).await?
    {
        Some(existing) => existing,
        None => write_filtered(&state, &principal, &source, &file_id, &dropped).await?,
    };
    tracing::info!(profile = %id, source = %source.id, file_id = %record.id,
        dropped = dropped.len(), "filtered training file");
    Ok(Json(FilteredFileObject {
        kept_rows: record.line_count.unwrap_or_default().max(0) as usize,
        file: record.into(),
        source_file: source.id,
        profile: id,
        dropped_rows: dropped.into_iter().collect(),
    }))
}

/// Stores `source` without rows `dropped` as file `file_id`.
async fn write_filtered(
    state: &AppState,
    principal: &Principal,
    source: &FileRecord,
    file_id: &str,
    dropped: &std::collections::BTreeSet<usize>,
) -> ApiResult<FileRecord> {
    let bytes = state.store.get_bytes(&source.storage_key).await?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| ApiError::invalid("file", format!("the training file is not UTF-8: {e}")))?;
    let (filtered, kept) = filter_jsonl(text, dropped);
    let key = verity_core::keys::dataset_file(file_id);
    let record = FileRecord {
        id: file_id.to_string(),
        org_id: principal.org_id,
        filename: filtered_filename(&source.filename),
        purpose: PURPOSE_FINE_TUNE.to_string(),
        bytes: filtered.len() as i64,
        line_count: Some(kept as i64),
        status: "processed".to_string(),
        status_details: None,
        storage_key: key.clone(),
        created_at: chrono::Utc::now(),
    };
    state.store.put_bytes(&key, Bytes::from(filtered)).await?;
    verity_core::files::insert_file(&state.pool, &record).await?;
    Ok(record)
}
