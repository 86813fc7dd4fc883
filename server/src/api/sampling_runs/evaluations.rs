//! `/v1/verity/evaluations`: evaluation reports — n completions per prompt of a file from each
//! of several models (bases, fine-tuned models, checkpoints), graded; per model the mean reward
//! and the unbiased pass@k for k = 1, 2, 4, … n, as JSON or CSV, with a flag on every
//! checkpoint whose pass@k at the largest k falls below its base's.

use super::{
    cancel_run, check_names, find_run, list_page, resolve_run_model, run_samples,
    validate_file_and_grader, PreparedRun, RunStatus, SamplingRequest,
};
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::{ApiJson, ApiQuery};
use crate::api::jobs::samples::{SampleObject, SampleQuery};
use crate::api::pagination::{Page, PageQuery};
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use verity_core::jobs::JobRecord;
use verity_core::sampling_runs::{
    validate_samples, EvaluationReport, EvaluationSpec, RunKind, RunModel, RunSpec,
    SamplingSettings,
};
use verity_core::spec::Method;

/// Most models in one evaluation.
pub const MAX_MODELS: usize = 32;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/verity/evaluations", get(list_evaluations).post(create_evaluation))
        .route("/v1/verity/evaluations/{evaluation_id}", get(get_evaluation))
        .route("/v1/verity/evaluations/{evaluation_id}/cancel", post(cancel_evaluation))
        .route("/v1/verity/evaluations/{evaluation_id}/results", get(evaluation_results))
        .route("/v1/verity/evaluations/{evaluation_id}/samples", get(evaluation_samples))
}

/// Body of `POST /v1/verity/evaluations`. With `job`, the fields left out default to that
/// fine-tuning job's: its base and every checkpoint, its validation file (else its training
/// file), its grader, its `eval_samples`, temperature and `max_completion_tokens`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEvaluationRequest {
    /// Models to evaluate, in report order: base models, fine-tuned models, checkpoint names
    /// (`…:ckpt-step-N`); at most 32.
    pub models: Option<Vec<String>>,
    /// File id of the prompts (a processed file with the fields the grader reads).
    pub file: Option<String>,
    /// A grader as the reinforcement jobs take it.
    #[schema(value_type = Option<Object>)]
    pub grader: Option<Value>,
    /// Completions per prompt, 1–1024 (default 8).
    pub n: Option<usize>,
    /// Seed of the sampling (random when absent); every model samples the same streams.
    pub seed: Option<i64>,
    /// A fine-tuning job to take the defaults from (base vs its checkpoints).
    pub job: Option<String>,
    /// Sampling parameters.
    #[serde(flatten)]
    pub sampling: SamplingRequest,
}

/// An evaluation (`verity.evaluation`).
#[derive(Debug, Serialize, ToSchema)]
pub struct EvaluationObject {
    /// `evaljob-…`.
    pub id: String,
    /// Always `verity.evaluation`.
    pub object: &'static str,
    /// Status, times, error, progress.
    #[serde(flatten)]
    pub status: RunStatus,
    /// The models with the base each is compared with.
    #[schema(value_type = Vec<Object>)]
    pub models: Vec<RunModel>,
    /// The prompts' file.
    pub file: String,
    /// The grader.
    #[schema(value_type = Object)]
    pub grader: Value,
    /// Completions per prompt.
    pub n: usize,
    /// Sampling settings.
    #[schema(value_type = Object)]
    pub sampling: Value,
    /// The fine-tuning job it was created for.
    pub job: Option<String>,
    /// Results of the models finished so far (only on `GET` of one evaluation).
    #[schema(value_type = Option<Object>)]
    pub results: Option<EvaluationReport>,
}

impl EvaluationObject {
    fn of(job: JobRecord, results: Option<EvaluationReport>) -> ApiResult<EvaluationObject> {
        let Some(Ok(RunSpec::Evaluation(spec))) = RunSpec::of_job(&job.spec) else {
            return Err(ApiError::internal("reading an evaluation", "its spec does not parse"));
        };
        Ok(EvaluationObject {
            status: RunStatus::of(&job),
            object: "verity.evaluation",
            models: spec.models,
            file: job.training_file.clone().unwrap_or_default(),
            grader: spec.grader,
            n: spec.n,
            sampling: serde_json::to_value(spec.sampling).unwrap_or(Value::Null),
            job: spec.job_id,
            results,
            id: job.id,
        })
    }
}

/// The defaults a fine-tuning job gives an evaluation.
struct JobDefaults {
    models: Vec<String>,
    file: String,
    grader: Value,
    n: usize,
    sampling: SamplingSettings,
}

async fn job_defaults(state: &AppState, principal: &Principal, id: &str) -> ApiResult<JobDefaults> {
    let job = verity_core::jobs::get_job(&state.pool, principal.org_id, id)
        .await?
        .ok_or_else(|| ApiError::invalid("job", format!("no fine-tuning job with id {id:?}")))?;
    let method: Method = serde_json::from_value(
        job.spec.get("method").cloned().unwrap_or_default(),
    )
    .map_err(|e| ApiError::invalid("job", format!("job {id} has no reinforcement method: {e}")))?;
    let rl = method.reinforcement().ok_or_else(|| {
        ApiError::invalid("job", format!("job {id} is not a reinforcement job; name a grader"))
    })?;
    let mut checkpoints =
        verity_core::jobs::list_checkpoints(&state.pool, &job.id, None, MAX_MODELS as i64 - 1)
            .await?;
    checkpoints.reverse();
    let model = job.output_model_name();
    let mut models = vec![job.model.clone()];
    models.extend(
        checkpoints.iter().map(|c| verity_core::models::checkpoint_model_name(&model, c.step)),
    );
    let file =
        job.validation_file.clone().or_else(|| job.training_file.clone()).unwrap_or_default();
    let hp = &rl.hyperparameters;
    Ok(JobDefaults {
        models,
        file,
        grader: rl.grader.clone(),
        n: hp.eval_samples(),
        sampling: SamplingSettings::of_recipe(hp, rl.response_format.clone()),
    })
}

/// Default completions per prompt.
pub const DEFAULT_N: usize = 8;

/// Creates an evaluation and queues it.
#[utoipa::path(post, path = "/v1/verity/evaluations", tag = "verity", request_body = CreateEvaluationRequest,
    responses((status = 200, body = EvaluationObject), (status = 400), (status = 401)))]
pub async fn create_evaluation(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateEvaluationRequest>,
) -> ApiResult<Json<EvaluationObject>> {
    let job = create(&state, &principal, request).await?;
    Ok(Json(EvaluationObject::of(job, None)?))
}

impl CreateEvaluationRequest {
    /// The request that compares fine-tuning job `id`'s base with its checkpoints, every
    /// setting taken from the job.
    pub fn for_job(id: &str) -> CreateEvaluationRequest {
        CreateEvaluationRequest {
            models: None,
            file: None,
            grader: None,
            n: None,
            seed: None,
            job: Some(id.to_string()),
            sampling: SamplingRequest::default(),
        }
    }
}

/// Checks `request` and queues the evaluation; its row. Nothing is written when a check fails.
pub async fn create(
    state: &AppState,
    principal: &Principal,
    request: CreateEvaluationRequest,
) -> ApiResult<JobRecord> {
    prepare(state, principal, request).await?.enqueue(state, principal, None).await
}

/// Checks an evaluation request; what to enqueue. Nothing is written.
pub async fn prepare(
    state: &AppState,
    principal: &Principal,
    request: CreateEvaluationRequest,
) -> ApiResult<PreparedRun> {
    let defaults = match &request.job {
        Some(id) => {
            crate::api::extract::reject_nul("job", id)?;
            Some(job_defaults(state, principal, id).await?)
        }
        None => None,
    };
    let names = request
        .models
        .or_else(|| defaults.as_ref().map(|d| d.models.clone()))
        .ok_or_else(|| ApiError::invalid("models", "missing `models` (a list of model names)"))?;
    check_names("models", &names, MAX_MODELS)?;
    let n = request.n.or(defaults.as_ref().map(|d| d.n)).unwrap_or(DEFAULT_N);
    validate_samples("n", n).map_err(|e| ApiError::invalid(e.param, e.message))?;
    let sampling = request
        .sampling
        .settings(defaults.as_ref().map(|d| d.sampling.clone()).unwrap_or_default())?;
    let file = request
        .file
        .or_else(|| defaults.as_ref().map(|d| d.file.clone()))
        .ok_or_else(|| ApiError::invalid("file", "missing `file` (a file id)"))?;
    crate::api::extract::reject_nul("file", &file)?;
    let grader = request
        .grader
        .or_else(|| defaults.as_ref().map(|d| d.grader.clone()))
        .ok_or_else(|| ApiError::invalid("grader", "missing `grader`"))?;
    let mut models = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let model = resolve_run_model(state, principal, &format!("models[{i}]"), name).await?;
        if models.iter().any(|m: &verity_core::sampling_runs::RunModel| m.name == model.name) {
            let why = format!("{name:?} is {:?}, listed before", model.name);
            return Err(ApiError::invalid(format!("models[{i}]"), why));
        }
        models.push(model);
    }
    validate_file_and_grader(state, principal, &file, &grader, sampling.response_format.as_ref())
        .await?;
    let spec =
        RunSpec::Evaluation(EvaluationSpec { models, grader, n, sampling, job_id: request.job });
    Ok(PreparedRun { spec, file, seed: request.seed })
}

/// Lists evaluations, newest first.
#[utoipa::path(get, path = "/v1/verity/evaluations", tag = "verity", params(PageQuery),
    responses((status = 200, body = Page<EvaluationObject>), (status = 400), (status = 401)))]
pub async fn list_evaluations(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<EvaluationObject>>> {
    let object = |j| EvaluationObject::of(j, None);
    let id_of = |e: &EvaluationObject| e.id.clone();
    Ok(Json(list_page(&state, &principal, RunKind::Evaluation, &query, object, id_of).await?))
}

/// The report of an evaluation's finished models.
pub async fn report(state: &AppState, id: &str) -> ApiResult<EvaluationReport> {
    let rows = verity_core::jobs::metrics_rows(&state.pool, id).await?;
    Ok(EvaluationReport::from_rows(&rows))
}

/// One evaluation, with the results of its models finished so far.
#[utoipa::path(get, path = "/v1/verity/evaluations/{evaluation_id}", tag = "verity", params(("evaluation_id" = String, Path)),
    responses((status = 200, body = EvaluationObject), (status = 401), (status = 404)))]
pub async fn get_evaluation(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<EvaluationObject>> {
    let job = find_run(&state, &principal, RunKind::Evaluation, &id).await?;
    let results = report(&state, &id).await?;
    Ok(Json(EvaluationObject::of(job, Some(results))?))
}

/// Cancels an evaluation.
#[utoipa::path(post, path = "/v1/verity/evaluations/{evaluation_id}/cancel", tag = "verity", params(("evaluation_id" = String, Path)),
    responses((status = 200, body = EvaluationObject), (status = 401), (status = 404), (status = 409)))]
pub async fn cancel_evaluation(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<EvaluationObject>> {
    let job = cancel_run(&state, &principal, RunKind::Evaluation, &id).await?;
    Ok(Json(EvaluationObject::of(job, None)?))
}

/// The graded completions of an evaluation: `step` is the model's index in `models`, `index`
/// = prompt × n + sample; filter by `step` and score as for a job's samples.
#[utoipa::path(get, path = "/v1/verity/evaluations/{evaluation_id}/samples", tag = "verity", params(("evaluation_id" = String, Path), SampleQuery),
    responses((status = 200, body = Page<SampleObject>), (status = 400), (status = 401), (status = 404)))]
pub async fn evaluation_samples(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<SampleQuery>,
) -> ApiResult<Json<Page<SampleObject>>> {
    Ok(Json(run_samples(&state, &principal, RunKind::Evaluation, &id, &query).await?))
}

/// Query of the results endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ResultsQuery {
    /// `json` (default) or `csv`.
    pub format: Option<String>,
}

/// The results document (`verity.evaluation.results`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ResultsObject {
    /// Always `verity.evaluation.results`.
    pub object: &'static str,
    /// The evaluation.
    pub evaluation_id: String,
    /// Its status (results are partial until `succeeded`).
    pub status: String,
    /// Per model: `model`, `base`, `prompts`, `samples_per_prompt`, `mean_reward`,
    /// `pass_at_k` (`{"pass@1": …}`), `grader_errors`; every k reported; the narrowing flags.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub report: EvaluationReport,
}

/// The results: JSON, or CSV (one row per model: mean reward, pass@k columns, and
/// `narrower_than_base`).
#[utoipa::path(get, path = "/v1/verity/evaluations/{evaluation_id}/results", tag = "verity", params(("evaluation_id" = String, Path), ResultsQuery),
    responses((status = 200, body = ResultsObject), (status = 200, content_type = "text/csv"), (status = 400), (status = 401), (status = 404)))]
pub async fn evaluation_results(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ResultsQuery>,
) -> ApiResult<Response> {
    let csv = crate::api::jobs::metrics::wants_csv(query.format.as_deref())?;
    let job = find_run(&state, &principal, RunKind::Evaluation, &id).await?;
    let report = report(&state, &id).await?;
    if csv {
        let disposition = format!("attachment; filename=\"{id}.csv\"");
        return Ok((
            [
                (CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                (CONTENT_DISPOSITION, disposition),
            ],
            report.to_csv(),
        )
            .into_response());
    }
    let body = ResultsObject {
        object: "verity.evaluation.results",
        evaluation_id: id,
        status: job.state.to_string(),
        report,
    };
    Ok(Json(body).into_response())
}
