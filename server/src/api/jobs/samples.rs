//! Sampled completions of a job: index rows from Postgres, full samples from the store.

use super::find_job;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiQuery;
use crate::api::pagination::{page_limit, Page};
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use utoipa::{IntoParams, ToSchema};
use verity_core::jobs::SampleFilter;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/fine_tuning/jobs/{job_id}/samples", get(list_samples))
}

/// Filters and paging of samples.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SampleQuery {
    /// Only this step.
    pub step: Option<i32>,
    /// Score at least this.
    pub min_score: Option<f64>,
    /// Score at most this.
    pub max_score: Option<f64>,
    /// Id of the last sample of the previous page (`sample-<step>-<index>`).
    pub after: Option<String>,
    /// Page size (1–100, default 20).
    pub limit: Option<i64>,
}

/// One sampled completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct SampleObject {
    /// `sample-<step>-<index>`.
    pub id: String,
    /// Always `fine_tuning.job.sample`.
    pub object: &'static str,
    /// Training step.
    pub step: i32,
    /// Index within the step.
    pub index: i32,
    /// Prompt it answers.
    pub prompt_index: i32,
    /// Total reward.
    pub score: Option<f64>,
    /// Advantage.
    pub advantage: Option<f64>,
    /// Why sampling stopped.
    pub finish_reason: Option<String>,
    /// The stored sample (prompt, completion, per-grader scores), or null when unreadable.
    #[schema(value_type = Option<Object>)]
    pub sample: Option<Value>,
}

impl SampleQuery {
    /// The filter and page size the query asks for, checked.
    pub fn filter(&self) -> ApiResult<(SampleFilter, i64)> {
        let limit = page_limit(self.limit, 100)?;
        for (param, value) in [("min_score", self.min_score), ("max_score", self.max_score)] {
            if value.is_some_and(|v| !v.is_finite()) {
                return Err(ApiError::invalid(param, "must be a finite number"));
            }
        }
        let after = match self.after.as_deref() {
            None => None,
            Some(a) => Some(parse_after(a).ok_or_else(|| {
                ApiError::invalid("after", "expected a sample id like sample-3-7")
            })?),
        };
        let filter = SampleFilter {
            step: self.step,
            min_score: self.min_score,
            max_score: self.max_score,
            after,
            validation: None,
        };
        Ok((filter, limit))
    }
}

fn parse_after(after: &str) -> Option<(i32, i32)> {
    let (step, idx) = after.strip_prefix("sample-")?.split_once('-')?;
    Some((step.parse().ok()?, idx.parse().ok()?))
}

/// Samples by step and index, filtered by step and score.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/samples", tag = "fine_tuning", params(("job_id" = String, Path), SampleQuery),
    responses((status = 200, body = Page<SampleObject>), (status = 400), (status = 401), (status = 404)))]
pub async fn list_samples(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
    ApiQuery(query): ApiQuery<SampleQuery>,
) -> ApiResult<Json<Page<SampleObject>>> {
    let (filter, limit) = query.filter()?;
    find_job(&state, &principal, &job_id).await?;
    let items = load_samples(&state, &job_id, &filter, limit).await?;
    Ok(Json(Page::from_fetched(items, limit, |s: &SampleObject| s.id.clone())))
}

/// Up to `limit + 1` samples of `job_id` matching `filter` (the extra one, without its stored
/// body, tells the caller another page exists), with their stored bodies read from the store.
pub async fn load_samples(
    state: &AppState,
    job_id: &str,
    filter: &SampleFilter,
    limit: i64,
) -> ApiResult<Vec<SampleObject>> {
    let rows = verity_core::jobs::list_samples(&state.pool, job_id, filter, limit + 1).await?;
    let mut objects: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut items = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let sample = if i < limit as usize {
            if !objects.contains_key(&row.storage_key) {
                let lines = match state.store.get_bytes(&row.storage_key).await {
                    Ok(bytes) => {
                        Some(String::from_utf8_lossy(&bytes).lines().map(str::to_string).collect())
                    }
                    Err(error) => {
                        tracing::warn!(%error, key = %row.storage_key, "sample object unreadable");
                        None
                    }
                };
                objects.insert(row.storage_key.clone(), lines);
            }
            objects
                .get(&row.storage_key)
                .and_then(|lines| lines.as_ref())
                .and_then(|lines| lines.get(row.line_no as usize))
                .and_then(|line| serde_json::from_str(line).ok())
        } else {
            None
        };
        items.push(SampleObject {
            id: format!("sample-{}-{}", row.step, row.idx),
            object: "fine_tuning.job.sample",
            step: row.step,
            index: row.idx,
            prompt_index: row.prompt_idx,
            score: row.score,
            advantage: row.advantage,
            finish_reason: row.finish_reason,
            sample,
        });
    }
    Ok(items)
}
