//! Per-step training metrics of a job, as JSON or CSV.

use super::find_job;
use super::metrics_doc::metrics_document;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiQuery;
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use utoipa::IntoParams;
use verity_core::jobs::MetricsWindow;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/fine_tuning/jobs/{job_id}/metrics", get(job_metrics))
}

/// Query of the metrics endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// `json` (default) or `csv`.
    pub format: Option<String>,
    /// Only steps after this one (for incremental polling: pass the last step you have).
    pub after_step: Option<i32>,
    /// At most this many steps (1–10000); all by default. JSON answers say `has_more`.
    pub limit: Option<i64>,
}

/// The largest `limit` of one metrics page.
const MAX_METRICS_LIMIT: i64 = 10_000;

impl MetricsQuery {
    /// The requested window, validated (the whole job by default).
    fn window(&self) -> Result<MetricsWindow, ApiError> {
        if let Some(limit) = self.limit {
            if !(1..=MAX_METRICS_LIMIT).contains(&limit) {
                return Err(ApiError::invalid(
                    "limit",
                    format!("limit must be between 1 and {MAX_METRICS_LIMIT}, got {limit}"),
                ));
            }
        }
        Ok(MetricsWindow {
            after_step: self.after_step.unwrap_or(MetricsWindow::ALL.after_step),
            limit: self.limit.unwrap_or(MetricsWindow::ALL.limit),
        })
    }
}

/// One row per step: `{"object": "list", "job_id", "data": [{"step": n, …}], "has_more"}` or CSV
/// with a header; `after_step` and `limit` select a window (JSON is cut from the job's rendered
/// document, cached while its rows are unchanged).
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/metrics", tag = "fine_tuning", params(("job_id" = String, Path), MetricsQuery),
    responses((status = 200, content_type = "application/json"), (status = 400), (status = 401), (status = 404)))]
pub async fn job_metrics(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> ApiResult<Response> {
    let csv = wants_csv(query.format.as_deref())?;
    let window = query.window()?;
    find_job(&state, &principal, &job_id).await?;
    if csv {
        let rows = verity_core::jobs::metrics_rows_in(&state.pool, &job_id, window).await?;
        return Ok((
            [(CONTENT_TYPE, "text/csv; charset=utf-8")],
            verity_core::metrics_csv::metrics_csv(&rows),
        )
            .into_response());
    }
    let body = match state.metrics_cache.document(&state.pool, &job_id).await? {
        Some(document) => document.window(window),
        None => {
            let (data, has_more) =
                verity_core::jobs::metrics_json(&state.pool, &job_id, window).await?;
            metrics_document(&job_id, &data, has_more)
        }
    };
    Ok(([(CONTENT_TYPE, "application/json")], body).into_response())
}

/// Whether a `format` query parameter asks for CSV (`json`, the default, or `csv`; anything
/// else is a 400 naming `format`).
pub fn wants_csv(format: Option<&str>) -> ApiResult<bool> {
    match format {
        None | Some("json") => Ok(false),
        Some("csv") => Ok(true),
        Some(other) => {
            Err(ApiError::invalid("format", format!("unknown format {other:?}; use json or csv")))
        }
    }
}
