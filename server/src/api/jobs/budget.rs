//! `POST /v1/verity/jobs/{job_id}/budget` (Verity extension): changes the caps of a job's
//! budget ([`verity_core::budget`]) while it has not ended. The caps are not hyperparameters
//! (those are fixed at creation): they decide when the job pauses itself, not what it computes,
//! so a job paused by its budget continues once a cap is raised above what it used and it is
//! resumed (`POST /v1/fine_tuning/jobs/{job_id}/resume`, which refuses while a cap is reached).

use super::find_job;
use super::view::JobObject;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiJson;
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::Value;
use utoipa::ToSchema;
use verity_core::budget::Caps;
use verity_core::jobs::JobRecord;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/verity/jobs/{job_id}/budget", post(set_budget))
}

/// Body of `POST /v1/verity/jobs/{job_id}/budget` (read as JSON, so that an absent field, which
/// keeps its cap, differs from `null`, which removes it).
#[derive(Debug, ToSchema)]
pub struct BudgetRequest {
    /// Wall seconds the job's attempts may spend (1 to 2592000).
    pub max_wall_seconds: Option<i64>,
    /// Completion tokens its policy may generate in training steps (reinforcement jobs only;
    /// 1 to 10¹²).
    pub max_tokens: Option<i64>,
}

/// The caps `body` sets over `current` (fields named under `path`); `max_tokens` only for a
/// reinforcement job (`reinforcement`), the one method that generates tokens.
pub fn checked_caps(
    current: Caps,
    body: &Value,
    path: &str,
    reinforcement: bool,
) -> ApiResult<Caps> {
    let caps = current.apply(body, path).map_err(|e| ApiError::invalid(e.field, e.message))?;
    if caps.max_tokens.is_some() && !reinforcement {
        let field =
            if path.is_empty() { "max_tokens".into() } else { format!("{path}.max_tokens") };
        return Err(ApiError::invalid(
            field,
            "only reinforcement jobs generate tokens; cap a supervised or DPO job with \
             max_wall_seconds",
        ));
    }
    Ok(caps)
}

/// 409 when a cap of the paused `job` is reached: resuming would pause it again at once.
pub fn refuse_exhausted(job: &JobRecord) -> ApiResult<()> {
    match job.caps().reached(job.usage()) {
        None => Ok(()),
        Some(reached) => Err(ApiError::conflict(
            "budget_reached",
            format!(
                "the job's {}; raise {} with POST /v1/verity/jobs/{}/budget before resuming it",
                reached.summary(),
                reached.cap.field(),
                job.id
            ),
        )),
    }
}

/// Whether the job is a reinforcement job (the default method).
fn is_reinforcement(job: &JobRecord) -> bool {
    job.spec.pointer("/method/type").and_then(Value::as_str).unwrap_or("reinforcement")
        == "reinforcement"
}

/// Changes the job's budget: `{"max_wall_seconds": 1200}` raises one cap and keeps the other,
/// `null` removes a cap. 400 names a bad field; 409 once the job has ended.
#[utoipa::path(post, path = "/v1/verity/jobs/{job_id}/budget", tag = "verity", params(("job_id" = String, Path)),
    request_body = BudgetRequest,
    responses((status = 200, body = JobObject), (status = 400), (status = 401), (status = 404), (status = 409)))]
pub async fn set_budget(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<Json<JobObject>> {
    Ok(Json(update_budget(&state, &principal, &id, &body).await?.into()))
}

/// Applies `body` (`{max_wall_seconds?, max_tokens?}`) to the caps of the org's job `id`; the
/// job afterwards. Shared by the API and the dashboard's budget form.
pub async fn update_budget(
    state: &AppState,
    principal: &Principal,
    id: &str,
    body: &Value,
) -> ApiResult<JobRecord> {
    let job = find_job(state, principal, id).await?;
    let caps = checked_caps(job.caps(), body, "", is_reinforcement(&job))?;
    if !verity_core::budget::set_caps(&state.pool, principal.org_id, id, caps).await? {
        return Err(ApiError::conflict(
            "invalid_state",
            format!("job {id} is {} and its budget can no longer change", job.state),
        ));
    }
    tracing::info!(job_id = %id, ?caps, "budget changed");
    // Our own change must show at once, not when the announcement arrives.
    state.job_cache.evict(id);
    find_job(state, principal, id).await
}
