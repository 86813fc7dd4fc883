//! Sampling runs (Verity extensions, under `/v1/verity/`): evaluation reports
//! (`/v1/verity/evaluations`), rejection sampling (`/v1/verity/rejection_sampling`) and difficulty
//! profiles (`/v1/verity/difficulty_profiles`). All are
//! queued as rows of the job queue of their own kind (`evaljob-…`, `rsjob-…`, `dpjob-…`), run by the
//! training workers' sample-and-grade engine, and never listed as fine-tuning jobs.

pub mod difficulty_profiles;
pub mod evaluations;
pub mod rejection_sampling;

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::reject_nul_json;
use crate::api::files::jsonl::JsonlValidator;
use crate::api::jobs::samples::{load_samples, SampleObject, SampleQuery};
use crate::api::jobs::validate::{
    check_sample_fields, validate_file, validate_judges, validate_rows,
};
use crate::api::pagination::{Page, PageQuery};
use crate::api::state::AppState;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use verity_core::jobs::JobRecord;
use verity_core::queue::NewJob;
use verity_core::response_format::ResponseFormat;
use verity_core::sampling_runs::{RunKind, RunModel, RunSpec, SamplingSettings};
use verity_verifiers::Grader;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .merge(evaluations::router())
        .merge(rejection_sampling::router())
        .merge(difficulty_profiles::router())
}

/// Sampling parameters of a run's request (OpenAI's names; one set for every model).
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SamplingRequest {
    /// Softmax temperature, 0–2 (default 1).
    pub temperature: Option<f64>,
    /// Nucleus mass, (0, 1] (default 1).
    pub top_p: Option<f64>,
    /// Longest completion in tokens, 1–32768 (default 256).
    pub max_tokens: Option<usize>,
    /// Up to 4 texts that end a completion.
    pub stop: Option<Vec<String>>,
    /// OpenAI's `response_format` (`text`, `json_object`, `json_schema`): with a JSON format
    /// the grader reads `sample.output_json`.
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<ResponseFormat>,
}

impl SamplingRequest {
    /// The settings, defaults filled in and ranges checked.
    pub fn settings(&self, defaults: SamplingSettings) -> ApiResult<SamplingSettings> {
        let settings = SamplingSettings {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            max_tokens: self.max_tokens.unwrap_or(defaults.max_tokens),
            stop: self.stop.clone().unwrap_or(defaults.stop),
            response_format: self.response_format.clone().or(defaults.response_format),
        };
        settings.validate().map_err(|e| ApiError::invalid(e.param, e.message))?;
        Ok(settings)
    }
}

/// Resolves model `name` (at `param`) as inference does: a base, a `fine_tuned_model` or a
/// checkpoint name of the caller's org; a 400 naming `param` otherwise.
pub async fn resolve_run_model(
    state: &AppState,
    principal: &Principal,
    param: &str,
    name: &str,
) -> ApiResult<RunModel> {
    let name = &crate::api::jobs::validate::model_name_param(state, principal, param, name).await?;
    let served = verity_core::inference::resolve_model(&state.pool, principal.org_id, name)
        .await?
        .ok_or_else(|| {
            ApiError::invalid(param, format!("model {name:?} does not exist (see GET /v1/models)"))
                .with_code("model_not_found")
        })?;
    let base = if served.checkpoint_prefix.is_some() { served.base.id } else { name.to_string() };
    Ok(RunModel { name: name.to_string(), base })
}

/// Checks the grader at `grader` and the file at `file` (processed, of the caller's org, every
/// row with a prompt and the fields the grader reads); the compiled grader.
pub async fn validate_file_and_grader(
    state: &AppState,
    principal: &Principal,
    file: &str,
    grader: &Value,
    format: Option<&ResponseFormat>,
) -> ApiResult<Grader> {
    reject_nul_json("grader", grader)?;
    if let Some(format) = format {
        crate::api::jobs::validate::validate_response_format("response_format", format)?;
    }
    let compiled = crate::api::graders::parse_grader("grader", grader)?;
    let tools_reader = check_sample_fields(&compiled, "grader", format, false)?;
    validate_judges(state, principal, "grader", &compiled).await?;
    crate::api::graders::validate_embedding_models(state, principal, "grader", &compiled).await?;
    let record = validate_file(state, principal, "file", file).await?;
    let rows = JsonlValidator::requiring(compiled.item_fields()).with_tools_for(tools_reader);
    validate_rows(state, "file", &record, rows).await?;
    Ok(compiled)
}

/// A checked run request: what to enqueue.
pub struct PreparedRun {
    /// What the worker runs.
    pub spec: RunSpec,
    /// The prompts' file.
    pub file: String,
    /// Seed of the sampling (random when absent).
    pub seed: Option<i64>,
}

impl PreparedRun {
    /// Queues the run (as `id` when given, else a fresh id of its kind); the stored row.
    pub async fn enqueue(
        &self,
        state: &AppState,
        principal: &Principal,
        id: Option<String>,
    ) -> ApiResult<JobRecord> {
        enqueue_run(state, principal, &self.spec, &self.file, self.seed, id).await
    }
}

/// Queues a run of `spec` over `file` (as `id` when given); the stored row.
async fn enqueue_run(
    state: &AppState,
    principal: &Principal,
    spec: &RunSpec,
    file: &str,
    seed: Option<i64>,
    id: Option<String>,
) -> ApiResult<JobRecord> {
    let kind = spec.kind();
    let value = serde_json::to_value(spec).map_err(|e| ApiError::internal("encoding a run", e))?;
    let first = spec.models().first().map(|m| m.name.clone()).unwrap_or_default();
    let mut job = NewJob::new(principal.org_id, first, value);
    job.id = id.unwrap_or_else(|| kind.new_id());
    job.created_by = Some(principal.user_id);
    job.training_file = Some(file.to_string());
    job.seed = seed.unwrap_or_else(|| rand::random::<u32>() as i64);
    let id = state.queue.enqueue_run(&job, kind).await?;
    tracing::info!(run_id = %id, kind = kind.as_str(), org_id = %principal.org_id, "sampling run created");
    find_run(state, principal, kind, &id).await
}

/// What a run's kind is called in errors.
fn kind_name(kind: RunKind) -> &'static str {
    match kind {
        RunKind::Evaluation => "evaluation",
        RunKind::RejectionSampling => "rejection-sampling run",
        RunKind::DifficultyProfile => "difficulty profile",
    }
}

/// One page of the org's runs of `kind`, newest first, each turned into its API object.
pub async fn list_page<T>(
    state: &AppState,
    principal: &Principal,
    kind: RunKind,
    query: &PageQuery,
    object: impl Fn(JobRecord) -> ApiResult<T>,
    id_of: impl Fn(&T) -> String,
) -> ApiResult<Page<T>> {
    let limit = query.limit()?;
    let after = query.after.as_deref();
    let rows = verity_core::sampling_runs::list_runs(
        &state.pool,
        principal.org_id,
        kind,
        after,
        limit + 1,
    )
    .await?;
    let items = rows.into_iter().map(object).collect::<ApiResult<_>>()?;
    Ok(Page::from_fetched(items, limit, id_of))
}

/// The org's run `id` of `kind`, or 404.
pub async fn find_run(
    state: &AppState,
    principal: &Principal,
    kind: RunKind,
    id: &str,
) -> ApiResult<JobRecord> {
    verity_core::sampling_runs::get_run(&state.pool, principal.org_id, kind, id)
        .await?
        .ok_or_else(|| ApiError::not_found(kind_name(kind), id))
}

/// Cancels the org's run `id` of `kind` (a running one once its worker sees the request).
pub async fn cancel_run(
    state: &AppState,
    principal: &Principal,
    kind: RunKind,
    id: &str,
) -> ApiResult<JobRecord> {
    find_run(state, principal, kind, id).await?;
    state.queue.cancel(id).await?;
    find_run(state, principal, kind, id).await
}

/// A run's error.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunError {
    /// Machine-readable code.
    pub code: String,
    /// What happened.
    pub message: String,
}

/// The parts every run object shows: status, times, error, progress.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunStatus {
    /// queued | running | succeeded | failed | cancelled.
    pub status: String,
    /// Creation time (Unix seconds).
    pub created_at: i64,
    /// End time (Unix seconds).
    pub finished_at: Option<i64>,
    /// Why it failed.
    pub error: Option<RunError>,
    /// The worker's last progress report (`model_index`, `models`, `prompts_done`, `prompts`).
    #[schema(value_type = Option<Object>)]
    pub progress: Option<Value>,
    /// A cancel the worker has yet to act on.
    pub pending_control: Option<String>,
    /// Seed of the sampling.
    pub seed: i64,
}

impl RunStatus {
    /// The status parts of a run row.
    pub fn of(job: &JobRecord) -> RunStatus {
        let error = job.failure("run").map(|f| RunError { code: f.code, message: f.message });
        RunStatus {
            status: job.state.to_string(),
            created_at: job.created_at.timestamp(),
            finished_at: job.finished_at.map(|t| t.timestamp()),
            error,
            progress: job.progress.clone(),
            pending_control: (job.control != "none").then(|| job.control.clone()),
            seed: job.seed,
        }
    }
}

/// Checks that the list is within `max`, each string a name ([`check_name_param`]) or a hub id
/// (which [`resolve_run_model`] resolves), none listed twice.
///
/// [`check_name_param`]: crate::api::jobs::validate::check_name_param
fn check_names(param: &str, names: &[String], max: usize) -> ApiResult<()> {
    if names.is_empty() {
        return Err(ApiError::invalid(param, "must name at least one model"));
    }
    if names.len() > max {
        return Err(ApiError::invalid(param, format!("at most {max} models")));
    }
    for (i, name) in names.iter().enumerate() {
        if verity_core::models::check_hub_id(name).is_err() {
            crate::api::jobs::validate::check_name_param(&format!("{param}[{i}]"), name)?;
        }
        if names[..i].contains(name) {
            return Err(ApiError::invalid(
                format!("{param}[{i}]"),
                format!("{name:?} is listed twice"),
            ));
        }
    }
    Ok(())
}

/// Samples of the org's run `id` of `kind` (step = the model's index in the run), filtered and
/// paged as a fine-tuning job's.
pub async fn run_samples(
    state: &AppState,
    principal: &Principal,
    kind: RunKind,
    id: &str,
    query: &SampleQuery,
) -> ApiResult<Page<SampleObject>> {
    let (filter, limit) = query.filter()?;
    find_run(state, principal, kind, id).await?;
    let items = load_samples(state, id, &filter, limit).await?;
    Ok(Page::from_fetched(items, limit, |s: &SampleObject| s.id.clone()))
}
