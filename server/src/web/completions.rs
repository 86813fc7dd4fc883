//! The completions explorer: a job's sampled completions by step, filtered by score, finish
//! reason and prompt; prompt, completion, per-grader scores and advantage side by side. Picking a
//! prompt index across all steps compares the same prompt over training.

use super::page::{render, Nav, WebResult, WebUser};
use crate::api::error::ApiError;
use crate::api::jobs::find_job;
use crate::api::jobs::samples::load_samples;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use verity_core::jobs::SampleFilter;

/// Samples read per page.
const PAGE: i64 = 100;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/jobs/{job_id}/completions", get(completions_page))
}

/// Filters of the explorer (empty fields mean "any").
#[derive(Debug, Deserialize, Default)]
pub struct Filters {
    step: Option<String>,
    min_score: Option<String>,
    max_score: Option<String>,
    finish_reason: Option<String>,
    prompt: Option<String>,
}

fn parse<T: std::str::FromStr>(param: &str, value: &Option<String>) -> Result<Option<T>, ApiError> {
    match value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| ApiError::invalid(param, format!("{v:?} is not a number"))),
    }
}

/// A completion as shown.
struct Row {
    step: i32,
    index: i32,
    prompt_index: i32,
    score: String,
    advantage: String,
    finish_reason: String,
    prompt: String,
    completion: String,
    graders: Vec<(String, String)>,
    reason: String,
}

/// The explorer page.
#[derive(Template)]
#[template(path = "completions.html")]
struct CompletionsPage {
    nav: Nav,
    job_id: String,
    steps: Vec<i32>,
    step: String,
    min_score: String,
    max_score: String,
    finish_reason: String,
    prompt: String,
    rows: Vec<Row>,
}

fn number(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.3}")).unwrap_or_else(|| "–".into())
}

async fn completions_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    Query(filters): Query<Filters>,
) -> WebResult<Response> {
    find_job(&state, &user.0, &id).await?;
    let prompt: Option<i32> = parse("prompt", &filters.prompt)?;
    let min_score: Option<f64> = parse("min_score", &filters.min_score)?;
    let max_score: Option<f64> = parse("max_score", &filters.max_score)?;
    let steps: Vec<i32> = verity_core::jobs::metrics_rows(&state.pool, &id)
        .await?
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    // Default to the latest step, unless comparing one prompt across steps.
    let step: Option<i32> = match parse("step", &filters.step)? {
        Some(s) => Some(s),
        None if prompt.is_none() && filters.step.is_none() => steps.last().copied(),
        None => None,
    };
    let finish = filters.finish_reason.clone().filter(|f| !f.is_empty());
    let filter = SampleFilter { step, min_score, max_score, after: None };
    let samples = load_samples(&state, &id, &filter, PAGE).await?;
    let rows = samples
        .into_iter()
        .take(PAGE as usize)
        .filter(|s| prompt.is_none_or(|p| s.prompt_index == p))
        .filter(|s| finish.as_deref().is_none_or(|f| s.finish_reason.as_deref() == Some(f)))
        .map(|s| {
            let body = s.sample.unwrap_or(Value::Null);
            let text = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or("").to_string();
            let graders = body
                .get("per_grader")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), number(v.as_f64()))).collect())
                .unwrap_or_default();
            Row {
                step: s.step,
                index: s.index,
                prompt_index: s.prompt_index,
                score: number(s.score),
                advantage: number(s.advantage),
                finish_reason: s.finish_reason.unwrap_or_default(),
                prompt: text("prompt"),
                completion: text("completion"),
                reason: text("reason"),
                graders,
            }
        })
        .collect();
    let show = |v: Option<String>| v.unwrap_or_default();
    Ok(render(&CompletionsPage {
        nav: Nav::new(format!("Completions of {id}"), "jobs"),
        job_id: id,
        steps,
        step: step.map(|s| s.to_string()).unwrap_or_default(),
        min_score: show(filters.min_score),
        max_score: show(filters.max_score),
        finish_reason: show(filters.finish_reason),
        prompt: show(filters.prompt),
        rows,
    }))
}
