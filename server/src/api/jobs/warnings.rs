//! `GET /v1/verity/jobs/{job_id}/warnings` (Verity extension): the reward-hacking and collapse
//! monitor's warnings for a job now (`verity_core::monitor`), with the kinds that pause it.

use super::find_job;
use crate::api::auth::Principal;
use crate::api::error::ApiResult;
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/verity/jobs/{job_id}/warnings", get(job_warnings))
}

/// The reward-hacking and collapse monitor's warnings for the job now (Verity extension):
/// `{"object": "list", "job_id", "data": [{"kind", "metric", "value", "threshold", "step",
/// "message"}], "auto_pause_on": [kind, …]}`; kinds are `length_drift`,
/// `sub_grader_divergence`, `validation_gap`, `entropy_collapse`, `zero_advantage`,
/// `grader_errors`.
#[utoipa::path(get, path = "/v1/verity/jobs/{job_id}/warnings", tag = "verity", params(("job_id" = String, Path)),
    responses((status = 200, content_type = "application/json"), (status = 401), (status = 404)))]
pub async fn job_warnings(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let job = find_job(&state, &principal, &job_id).await?;
    let warnings = verity_core::monitor::job_warnings(&state.pool, &job_id).await?;
    let auto_pause_on = job
        .spec
        .pointer("/method/reinforcement/hyperparameters/auto_pause_on")
        .cloned()
        .unwrap_or_else(|| json!([]));
    Ok(Json(
        json!({"object": "list", "job_id": job_id, "data": warnings, "auto_pause_on": auto_pause_on}),
    ))
}
