//! `/v1/fine_tuning/jobs`: create (validated, then enqueued), list, read, cancel / pause /
//! resume, and what a job writes: events, checkpoints, metrics, samples.

pub mod budget;
pub mod cache;
pub mod checkpoints;
pub mod gguf;
pub mod metrics;
pub mod metrics_doc;
pub mod samples;
pub mod validate;
pub mod view;
pub mod warnings;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{reject_nul, reject_nul_json, ApiJson, ApiQuery};
use super::pagination::{page_limit, Page, PageQuery};
use super::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;
pub use validate::validate_grader;
use verity_core::budget::Caps;
use verity_core::files::FileRecord;
use verity_core::integrations::WandbIntegration;
use verity_core::jobs::{JobRecord, MetadataFilter};
use verity_core::queue::NewJob;
use verity_core::JobState;
use view::{EventObject, JobObject, EVENT_PREFIX};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/fine_tuning/jobs", get(list_jobs).post(create_job))
        .route("/v1/fine_tuning/jobs/{job_id}", get(get_job))
        .route("/v1/fine_tuning/jobs/{job_id}/cancel", post(cancel_job))
        .route("/v1/fine_tuning/jobs/{job_id}/pause", post(pause_job))
        .route("/v1/fine_tuning/jobs/{job_id}/resume", post(resume_job))
        .route("/v1/fine_tuning/jobs/{job_id}/events", get(list_events))
        .merge(budget::router())
        .merge(checkpoints::router())
        .merge(gguf::router())
        .merge(metrics::router())
        .merge(samples::router())
        .merge(warnings::router())
}

/// Body of `POST /v1/fine_tuning/jobs`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CreateJobRequest {
    /// Model to train: a base model, or a fine-tuned model (`ft:…`) of the org.
    pub model: Option<String>,
    /// Training file id (`file-…`, processed).
    pub training_file: Option<String>,
    /// Validation file id.
    pub validation_file: Option<String>,
    /// Suffix of the fine-tuned model's name.
    pub suffix: Option<String>,
    /// Seed (random when absent).
    pub seed: Option<i64>,
    /// `{type: "reinforcement", reinforcement: {grader, hyperparameters}}`, `{type:
    /// "supervised", supervised: {hyperparameters}}` or `{type: "dpo", dpo: {hyperparameters}}`.
    #[schema(value_type = Object)]
    pub method: Option<Value>,
    /// Up to 16 string pairs (keys up to 64 characters, values up to 512).
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `[{type: "wandb", wandb: {project, name?, entity?, tags?}}]`: the job's metrics go to
    /// this W&B run (the server needs `WANDB_API_KEY`); null or `[]`: none.
    #[schema(value_type = Option<Vec<Object>>)]
    pub integrations: Option<Value>,
    /// OpenAI's legacy shape: without `method`, the job is supervised with these
    /// hyperparameters; beside a `method`, refused unless null (use
    /// `method.{type}.hyperparameters`).
    #[schema(value_type = Option<Object>)]
    pub hyperparameters: Option<Value>,
    /// Verity extension: `{max_wall_seconds, max_tokens}`, caps at which the job pauses
    /// itself (changeable later with `POST /v1/verity/jobs/{id}/budget`).
    #[schema(value_type = Option<Object>)]
    pub budget: Option<Value>,
    /// Any other field: refused by name (OpenAI answers "Unrecognized request argument"), never
    /// dropped silently.
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: std::collections::BTreeMap<String, Value>,
}

/// The org's job `id`, or 404.
/// Served from the job cache when it holds a current copy.
pub async fn find_job(state: &AppState, principal: &Principal, id: &str) -> ApiResult<JobRecord> {
    let not_found = || ApiError::not_found("fine-tuning job", id);
    if let Some(job) = state.job_cache.get(id) {
        return if job.org_id == principal.org_id { Ok(job) } else { Err(not_found()) };
    }
    let ticket = state.job_cache.ticket();
    let job = verity_core::jobs::get_job(&state.pool, principal.org_id, id)
        .await?
        .ok_or_else(not_found)?;
    if let Some(ticket) = ticket {
        state.job_cache.put(ticket, id, job.clone());
    }
    Ok(job)
}

/// A job request that passed every check but the row check of its files.
pub struct CheckedRequest {
    /// The request's model.
    pub model: String,
    /// The checked method.
    pub method: validate::CheckedMethod,
    /// The training file.
    pub training: FileRecord,
    /// The validation file, when named.
    pub validation: Option<FileRecord>,
    /// The budget's caps (none when not asked for).
    pub budget: Caps,
    /// Where its metrics are exported (`integrations`).
    pub integrations: Vec<WandbIntegration>,
}

impl CheckedRequest {
    /// The files to check row by row, with the request field naming each.
    pub fn files(&self) -> Vec<(&'static str, &FileRecord)> {
        let mut files = vec![("training_file", &self.training)];
        if let Some(validation) = &self.validation {
            files.push(("validation_file", validation));
        }
        files
    }
}

/// A job request's checked fields, its files not yet looked up.
pub struct CheckedFields {
    /// The request's model.
    pub model: String,
    /// The checked method.
    pub method: validate::CheckedMethod,
    /// The budget's caps (none when not asked for).
    pub budget: Caps,
    /// Where its metrics are exported (`integrations`).
    pub integrations: Vec<WandbIntegration>,
}

/// Every check of a job request (fields, model, grader, files) but the row check, cheapest
/// first; the first problem is a 400 naming its field. Shared by job creation and pre-flight.
pub async fn check_request(
    state: &AppState,
    principal: &Principal,
    request: &CreateJobRequest,
) -> ApiResult<CheckedRequest> {
    let CheckedFields { model, method, budget, integrations } =
        check_fields(state, principal, request).await?;
    let training_file = request.training_file.as_deref().unwrap_or_default();
    let training =
        validate::validate_file(state, principal, "training_file", training_file).await?;
    let validation = match &request.validation_file {
        Some(id) => Some(validate::validate_file(state, principal, "validation_file", id).await?),
        None => None,
    };
    Ok(CheckedRequest { model, method, training, validation, budget, integrations })
}

/// Every check of a job request, rows included, but those of the files named in `deferred`
/// (the fields whose file an earlier recipe stage has yet to write).
pub async fn check_request_deferring(
    state: &AppState,
    principal: &Principal,
    request: &CreateJobRequest,
    deferred: &[String],
) -> ApiResult<()> {
    let checked = check_fields(state, principal, request).await?;
    let files =
        [("training_file", &request.training_file), ("validation_file", &request.validation_file)];
    for (param, id) in files {
        let Some(id) = id.as_deref().filter(|_| !deferred.iter().any(|d| d == param)) else {
            continue;
        };
        let file = validate::validate_file(state, principal, param, id).await?;
        validate::validate_rows(state, param, &file, checked.method.rows()).await?;
    }
    Ok(())
}

/// Every check of a job request but its files' (which must only be named).
pub async fn check_fields(
    state: &AppState,
    principal: &Principal,
    request: &CreateJobRequest,
) -> ApiResult<CheckedFields> {
    if let Some(field) = request.unknown.keys().next() {
        return Err(ApiError::invalid(
            field.as_str(),
            format!(
                "Unrecognized request argument supplied: {field} (a job takes model, \
                 training_file, validation_file, suffix, seed, method, metadata, integrations, \
                 hyperparameters and Verity's budget)"
            ),
        ));
    }
    let model =
        request.model.clone().ok_or_else(|| ApiError::invalid("model", "missing `model`"))?;
    let training_file = request
        .training_file
        .as_ref()
        .ok_or_else(|| ApiError::invalid("training_file", "missing `training_file`"))?;
    for (param, value) in [
        ("model", Some(&model)),
        ("training_file", Some(training_file)),
        ("validation_file", request.validation_file.as_ref()),
        ("suffix", request.suffix.as_ref()),
    ] {
        if let Some(value) = value {
            reject_nul(param, value)?;
        }
    }
    if let Some(method) = &request.method {
        reject_nul_json("method", method)?;
    }
    if let Some(metadata) = &request.metadata {
        reject_nul_json("metadata", metadata)?;
    }
    let method = match request.method.as_ref().filter(|m| !m.is_null()) {
        Some(method) => {
            let hyperparameters = request.hyperparameters.as_ref();
            validate::refuse_top_level_hyperparameters(hyperparameters)?;
            validate::validate_method(Some(method))?
        }
        None => validate::legacy_method(request.hyperparameters.as_ref())?,
    };
    let integrations = validate::validate_integrations(state, request.integrations.as_ref())?;
    validate::validate_suffix(request.suffix.as_deref())?;
    validate::validate_metadata(request.metadata.as_ref())?;
    let budget = match request.budget.as_ref().filter(|b| !b.is_null()) {
        Some(body) => {
            budget::checked_caps(Caps::default(), body, "budget", method.grader.is_some())?
        }
        None => Caps::default(),
    };
    let model = validate::model_name_param(state, principal, "model", &model).await?;
    validate::validate_model(state, principal, &model).await?;
    if let Some(grader) = &method.grader {
        validate::validate_judges(state, principal, "method.reinforcement.grader", grader).await?;
        let embedding = crate::api::graders::validate_embedding_models;
        embedding(state, principal, "method.reinforcement.grader", grader).await?;
    }
    Ok(CheckedFields { model, method, budget, integrations })
}

/// Creates a job and queues it.
#[utoipa::path(post, path = "/v1/fine_tuning/jobs", tag = "fine_tuning", request_body = CreateJobRequest,
    responses((status = 200, body = JobObject), (status = 400), (status = 401)))]
pub async fn create_job(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateJobRequest>,
) -> ApiResult<Json<JobObject>> {
    let id = create(&state, &principal, request, None).await?;
    Ok(Json(find_job(&state, &principal, &id).await?.into()))
}

/// Checks `request` and queues the job (as `id` when given); its id. Nothing is written when a
/// check fails.
pub async fn create(
    state: &AppState,
    principal: &Principal,
    request: CreateJobRequest,
    id: Option<String>,
) -> ApiResult<String> {
    let checked = check_request(state, principal, &request).await?;
    // Rows are read last: the cheap checks above answer first.
    for (param, file) in checked.files() {
        validate::validate_rows(state, param, file, checked.method.rows()).await?;
    }
    let seed = request.seed.unwrap_or_else(|| rand::random::<u32>() as i64);
    let mut resolved = json!({ "method": checked.method.resolved });
    if !checked.integrations.is_empty() {
        resolved["integrations"] = verity_core::integrations::to_spec(&checked.integrations);
    }
    let mut job = NewJob::new(principal.org_id, checked.model, resolved);
    if let Some(id) = id {
        job.id = id;
    }
    job.created_by = Some(principal.user_id);
    job.training_file = request.training_file;
    job.validation_file = request.validation_file;
    job.suffix = request.suffix;
    job.seed = seed;
    job.metadata = request.metadata.filter(|m| !m.is_null());
    let id = state.queue.enqueue(&job).await?;
    if checked.budget != Caps::default() {
        // The worker reads the caps at every step boundary, so one set now holds from the start.
        verity_core::budget::set_caps(&state.pool, principal.org_id, &id, checked.budget).await?;
    }
    tracing::info!(job_id = %id, org_id = %principal.org_id, "job created");
    Ok(id)
}

/// Lists jobs, newest first; `metadata[k]=v` keeps the jobs whose metadata has `k` = `v` (every
/// pair given), `metadata=null` those without metadata, as OpenAI's filter.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs", tag = "fine_tuning",
    params(PageQuery, ("metadata[key]" = Option<String>, Query,
        description = "Keep the jobs whose metadata has `key` = this value (repeat for more pairs); `metadata=null` keeps the jobs without metadata")),
    responses((status = 200, body = Page<JobObject>), (status = 400), (status = 401)))]
pub async fn list_jobs(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<PageQuery>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> ApiResult<Json<Page<JobObject>>> {
    let limit = query.limit()?;
    let filter = metadata_filter(&pairs)?;
    let rows = verity_core::jobs::list_jobs_matching(
        &state.pool,
        principal.org_id,
        query.after.as_deref(),
        limit + 1,
        &filter,
    )
    .await?;
    let jobs = rows.into_iter().map(JobObject::from).collect();
    Ok(Json(Page::from_fetched(jobs, limit, |j: &JobObject| j.id.clone())))
}

/// The metadata filter of a job listing's query pairs: `metadata[k]=v` (each pair must match)
/// or `metadata=null` (no metadata); both at once, or `metadata=` anything else, is a 400.
fn metadata_filter(pairs: &[(String, String)]) -> ApiResult<MetadataFilter> {
    let mut holds = serde_json::Map::new();
    let mut without = false;
    for (name, value) in pairs {
        if name.starts_with("metadata") {
            reject_nul("metadata", name)?;
            reject_nul("metadata", value)?;
        }
        if name == "metadata" {
            if value != "null" {
                return Err(ApiError::invalid(
                    "metadata",
                    "filter with metadata[key]=value, or metadata=null for jobs without metadata",
                ));
            }
            without = true;
        } else if let Some(key) = name.strip_prefix("metadata[").and_then(|k| k.strip_suffix(']')) {
            holds.insert(key.to_string(), Value::String(value.clone()));
        }
    }
    match (without, holds.is_empty()) {
        (true, false) => Err(ApiError::invalid(
            "metadata",
            "metadata=null (jobs without metadata) cannot be combined with metadata[key]=value",
        )),
        (true, true) => Ok(MetadataFilter::Without),
        (false, false) => Ok(MetadataFilter::Holds(holds)),
        (false, true) => Ok(MetadataFilter::Any),
    }
}

/// One job.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}", tag = "fine_tuning", params(("job_id" = String, Path)),
    responses((status = 200, body = JobObject), (status = 401), (status = 404)))]
pub async fn get_job(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<JobObject>> {
    Ok(Json(find_job(&state, &principal, &id).await?.into()))
}

/// A control request on a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Stop for good.
    Cancel,
    /// Stop after a checkpoint, resumable.
    Pause,
    /// Continue a paused job.
    Resume,
}

impl Control {
    /// The control named `name` (`cancel`, `pause`, `resume`).
    pub fn from_name(name: &str) -> Option<Control> {
        match name {
            "cancel" => Some(Control::Cancel),
            "pause" => Some(Control::Pause),
            "resume" => Some(Control::Resume),
            _ => None,
        }
    }
}

/// Applies `action` to the org's job `id`; the job afterwards.
pub async fn control_job(
    state: &AppState,
    principal: &Principal,
    id: &str,
    action: Control,
) -> ApiResult<JobRecord> {
    let job = find_job(state, principal, id).await?;
    if action == Control::Resume && job.state == JobState::Paused {
        budget::refuse_exhausted(&job)?;
    }
    match action {
        Control::Cancel => state.queue.cancel(id).await?,
        Control::Pause => state.queue.pause(id).await?,
        Control::Resume => state.queue.resume(id).await?,
    };
    // Our own change must show at once, not when the announcement arrives.
    state.job_cache.evict(id);
    find_job(state, principal, id).await
}

async fn control(
    state: AppState,
    principal: Principal,
    id: String,
    action: Control,
) -> ApiResult<Json<JobObject>> {
    Ok(Json(control_job(&state, &principal, &id, action).await?.into()))
}

/// Cancels a job (a running one once its worker sees the request).
#[utoipa::path(post, path = "/v1/fine_tuning/jobs/{job_id}/cancel", tag = "fine_tuning", params(("job_id" = String, Path)),
    responses((status = 200, body = JobObject), (status = 401), (status = 404), (status = 409)))]
pub async fn cancel_job(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<JobObject>> {
    control(state, principal, id, Control::Cancel).await
}

/// Pauses a job (a running one after its worker checkpoints).
#[utoipa::path(post, path = "/v1/fine_tuning/jobs/{job_id}/pause", tag = "fine_tuning", params(("job_id" = String, Path)),
    responses((status = 200, body = JobObject), (status = 401), (status = 404), (status = 409)))]
pub async fn pause_job(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<JobObject>> {
    control(state, principal, id, Control::Pause).await
}

/// Resumes a paused job.
#[utoipa::path(post, path = "/v1/fine_tuning/jobs/{job_id}/resume", tag = "fine_tuning", params(("job_id" = String, Path)),
    responses((status = 200, body = JobObject), (status = 401), (status = 404), (status = 409)))]
pub async fn resume_job(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<JobObject>> {
    control(state, principal, id, Control::Resume).await
}

/// Events of a job, newest first; `after` is the last event id of the previous page.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/events", tag = "fine_tuning", params(("job_id" = String, Path), PageQuery),
    responses((status = 200, body = Page<EventObject>), (status = 400), (status = 401), (status = 404)))]
pub async fn list_events(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<EventObject>>> {
    let limit = page_limit(query.limit, 1000)?;
    let before = match query.after.as_deref() {
        None => None,
        Some(after) => {
            Some(after.strip_prefix(EVENT_PREFIX).and_then(|n| n.parse::<i64>().ok()).ok_or_else(
                || {
                    ApiError::invalid(
                        "after",
                        format!("expected an event id like {EVENT_PREFIX}42"),
                    )
                },
            )?)
        }
    };
    find_job(&state, &principal, &id).await?;
    let rows = verity_core::jobs::list_events(&state.pool, &id, before, limit + 1).await?;
    let events = rows.into_iter().map(EventObject::from).collect();
    Ok(Json(Page::from_fetched(events, limit, |e: &EventObject| e.id.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(query: &[(&str, &str)]) -> ApiResult<MetadataFilter> {
        let pairs: Vec<(String, String)> =
            query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        metadata_filter(&pairs)
    }

    #[test]
    fn metadata_filters_read_openai_query_syntax() {
        assert_eq!(filter(&[("limit", "2")]).unwrap(), MetadataFilter::Any);
        let pairs = json!({"key": "value", "team": "rl"});
        let Value::Object(pairs) = pairs else { unreachable!() };
        let query = [("metadata[key]", "value"), ("limit", "2"), ("metadata[team]", "rl")];
        assert_eq!(filter(&query).unwrap(), MetadataFilter::Holds(pairs));
        assert_eq!(filter(&[("metadata", "null")]).unwrap(), MetadataFilter::Without);
        for bad in [&[("metadata", "x")][..], &[("metadata", "null"), ("metadata[k]", "v")]] {
            assert_eq!(filter(bad).unwrap_err().param.as_deref(), Some("metadata"), "{bad:?}");
        }
        assert!(filter(&[("metadata[k]", "a\0b")]).is_err());
    }
}
