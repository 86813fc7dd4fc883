//! Jobs: the list (status, progress, ETA, reward sparkline), a job's page (live charts, warnings,
//! events, cancel / pause / resume) and its checkpoints.

use super::page::{render, script_json, when, Nav, WebResult, WebUser};
use super::warnings::warnings;
use crate::api::error::ApiError;
use crate::api::jobs::view::{checkpoint_model_name, EventObject};
use crate::api::jobs::{control_job, find_job, Control};
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::collections::HashMap;
use verity_core::jobs::JobRecord;

/// Jobs shown on the list.
const LIST_LIMIT: i64 = 50;
/// Events shown on a job's page.
const EVENT_LIMIT: i64 = 100;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/jobs", get(jobs_page))
        .route("/jobs/{job_id}", get(job_page))
        .route("/jobs/{job_id}/control/{action}", post(control))
        .route("/jobs/{job_id}/checkpoints", get(checkpoints_page))
}

/// Step, total steps and percent done from a job's progress report.
pub fn progress(job: &JobRecord) -> (u64, u64, u64) {
    let get = |key: &str| {
        job.progress.as_ref().and_then(|p| p.get(key)).and_then(Value::as_u64).unwrap_or(0)
    };
    let (mut step, total) = (get("step"), get("total_steps"));
    // The worker's last heartbeat may predate its final step.
    if job.state == "succeeded" {
        step = step.max(total);
    }
    let percent = if job.state == "succeeded" {
        100
    } else {
        (step * 100).checked_div(total).map_or(0, |p| p.min(100))
    };
    (step, total, percent)
}

/// Seconds a step took on average (sampling + grading + training) times the steps left.
fn eta(rows: &[Value], step: u64, total: u64, running: bool) -> String {
    let spent: Vec<f64> = rows
        .iter()
        .map(|r| {
            ["sampling_seconds", "grading_seconds", "training_seconds"]
                .iter()
                .filter_map(|k| r.get(*k).and_then(Value::as_f64))
                .sum()
        })
        .collect();
    if !running || spent.is_empty() || total <= step {
        return String::new();
    }
    let seconds = spent.iter().sum::<f64>() / spent.len() as f64 * (total - step) as f64;
    match seconds as u64 {
        s if s < 90 => format!("~{s} s left"),
        s if s < 5400 => format!("~{} min left", s / 60),
        s => format!("~{:.1} h left", s as f64 / 3600.0),
    }
}

/// An SVG polyline (`points`) of `values` in a 120×28 box.
pub fn sparkline(values: &[f64]) -> String {
    if values.is_empty() {
        return String::new();
    }
    let (lo, hi) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let span = if hi > lo { hi - lo } else { 1.0 };
    let dx = if values.len() > 1 { 118.0 / (values.len() - 1) as f64 } else { 0.0 };
    values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", 1.0 + dx * i as f64, 27.0 - 26.0 * (v - lo) / span))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The metrics rows of a job in step order, each with its `step`.
pub async fn metric_values(state: &AppState, job_id: &str) -> Result<Vec<Value>, sqlx::Error> {
    Ok(verity_core::jobs::metrics_rows(&state.pool, job_id)
        .await?
        .into_iter()
        .map(|(step, mut data)| {
            if let Value::Object(map) = &mut data {
                map.insert("step".into(), json!(step));
            }
            data
        })
        .collect())
}

/// A job row of the list.
struct JobRow {
    id: String,
    status: String,
    model: String,
    created: String,
    step: u64,
    total: u64,
    percent: u64,
    eta: String,
    spark: String,
    last_reward: String,
    created_by: String,
}

/// The jobs list.
#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    nav: Nav,
    jobs: Vec<JobRow>,
}

async fn jobs_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let records =
        verity_core::jobs::list_jobs(&state.pool, user.0.org_id, None, LIST_LIMIT).await?;
    let ids: Vec<String> = records.iter().map(|j| j.id.clone()).collect();
    let mut created_by: HashMap<String, String> =
        verity_core::jobs::job_creators(&state.pool, user.0.org_id, &ids)
            .await?
            .into_iter()
            .collect();
    let mut jobs = Vec::with_capacity(records.len());
    for job in records {
        let rows = metric_values(&state, &job.id).await?;
        let rewards: Vec<f64> =
            rows.iter().filter_map(|r| r.get("reward_mean").and_then(Value::as_f64)).collect();
        let (step, total, percent) = progress(&job);
        jobs.push(JobRow {
            eta: eta(&rows, step, total, job.state == "running"),
            spark: sparkline(&rewards),
            last_reward: rewards.last().map(|r| format!("{r:.3}")).unwrap_or_default(),
            created: when(job.created_at),
            created_by: created_by.remove(&job.id).unwrap_or_default(),
            status: job.state,
            model: job.model,
            id: job.id,
            step,
            total,
            percent,
        });
    }
    Ok(render(&JobsPage { nav: Nav::new("Jobs", "jobs"), jobs }))
}

/// An event as shown.
struct EventRow {
    time: String,
    level: String,
    message: String,
}

/// A job's page.
#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    nav: Nav,
    job: JobRecord,
    step: u64,
    total: u64,
    percent: u64,
    terminal: bool,
    error: Option<String>,
    hyperparameters: String,
    method: String,
    grader: String,
    metrics_json: String,
    warnings: Vec<String>,
    events: Vec<EventRow>,
    /// The baseline before training (pass@k of the base at step 0), as text.
    baseline: Option<String>,
    /// Evaluation reports created for this job, as `(id, state)`.
    evaluations: Vec<(String, String)>,
}

/// A baseline `eval` event's data as `pass@1 0.250 · pass@4 0.600 · mean reward 0.310`.
fn baseline_text(data: &Value) -> String {
    let mut parts: Vec<(usize, String)> = data
        .get("pass_at_k")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(key, v)| {
                    let k: usize = key.strip_prefix("pass@")?.parse().ok()?;
                    Some((k, format!("{key} {:.3}", v.as_f64()?)))
                })
                .collect()
        })
        .unwrap_or_default();
    parts.sort_by_key(|(k, _)| *k);
    let mut text: Vec<String> = parts.into_iter().map(|(_, t)| t).collect();
    if let Some(mean) = data.get("mean_reward").and_then(Value::as_f64) {
        text.push(format!("mean reward {mean:.3}"));
    }
    text.join(" · ")
}

/// Whether `state` is final.
pub fn is_terminal(state: &str) -> bool {
    matches!(state, "succeeded" | "failed" | "cancelled")
}

async fn job_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    let job = find_job(&state, &user.0, &id).await?;
    let rows = metric_values(&state, &id).await?;
    let events = verity_core::jobs::list_events(&state.pool, &id, None, EVENT_LIMIT)
        .await?
        .into_iter()
        .map(|e| {
            let e = EventObject::from(e);
            EventRow {
                time: chrono::DateTime::from_timestamp(e.created_at, 0)
                    .map(when)
                    .unwrap_or_default(),
                level: e.level,
                message: e.message,
            }
        })
        .collect();
    let method = job.spec.get("method").cloned().unwrap_or(Value::Null);
    let pretty = |v: Option<&Value>| {
        v.map(|v| serde_json::to_string_pretty(v).unwrap_or_default()).unwrap_or_default()
    };
    let (step, total, percent) = progress(&job);
    let baseline = verity_core::sampling_runs::job_baseline(&state.pool, &id).await?;
    // The baseline is the eval pass@k chart's point at step 0.
    let mut chart_rows = rows.clone();
    if let Some(data) = &baseline {
        chart_rows.insert(0, json!({"step": 0, "eval": data}));
    }
    let evaluations =
        verity_core::sampling_runs::job_evaluations(&state.pool, user.0.org_id, &id).await?;
    let page = JobPage {
        nav: Nav::new(format!("Job {id}"), "jobs"),
        step,
        total,
        percent,
        terminal: is_terminal(&job.state),
        error: job.error.as_ref().filter(|_| job.state == "failed").map(|e| {
            e.get("message").and_then(Value::as_str).unwrap_or("the job failed").to_string()
        }),
        hyperparameters: pretty(
            method
                .get(method.get("type").and_then(Value::as_str).unwrap_or("reinforcement"))
                .and_then(|settings| settings.get("hyperparameters")),
        ),
        method: method.get("type").and_then(Value::as_str).unwrap_or("reinforcement").to_string(),
        grader: pretty(method.pointer("/reinforcement/grader")),
        metrics_json: script_json(&Value::Array(chart_rows)),
        baseline: baseline.as_ref().map(baseline_text),
        evaluations,
        warnings: warnings(&rows),
        events,
        job,
    };
    Ok(render(&page))
}

async fn control(
    State(state): State<AppState>,
    user: WebUser,
    Path((id, action)): Path<(String, String)>,
) -> WebResult<Response> {
    let action =
        Control::from_name(&action).ok_or_else(|| ApiError::not_found("action", &action))?;
    control_job(&state, &user.0, &id, action).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

/// A checkpoint row.
struct CheckpointRow {
    id: String,
    step: i32,
    name: String,
    created: String,
    size: String,
    reward: String,
    eval: String,
}

/// A job's checkpoints.
#[derive(Template)]
#[template(path = "checkpoints.html")]
struct CheckpointsPage {
    nav: Nav,
    job: JobRecord,
    checkpoints: Vec<CheckpointRow>,
}

/// Bytes in a readable unit.
pub fn size(bytes: i64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB", b as f64 / 1024.0),
        b if b < 1024 * 1024 * 1024 => format!("{:.1} MiB", b as f64 / 1048576.0),
        b => format!("{:.2} GiB", b as f64 / 1073741824.0),
    }
}

async fn checkpoints_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    let job = find_job(&state, &user.0, &id).await?;
    let rows = verity_core::jobs::list_checkpoints(&state.pool, &id, None, 1000).await?;
    let checkpoints = rows
        .into_iter()
        .map(|c| {
            let metric = |path: &str| {
                c.metrics
                    .as_ref()
                    .and_then(|m| m.pointer(path))
                    .and_then(Value::as_f64)
                    .map(|v| format!("{v:.3}"))
                    .unwrap_or_default()
            };
            CheckpointRow {
                name: checkpoint_model_name(&job.output_model_name(), c.step),
                created: when(c.created_at),
                size: size(c.bytes),
                reward: metric("/reward_mean"),
                eval: metric("/eval/pass_at_k/pass@1"),
                id: c.id,
                step: c.step,
            }
        })
        .collect();
    Ok(render(&CheckpointsPage {
        nav: Nav::new(format!("Checkpoints of {id}"), "jobs"),
        job,
        checkpoints,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_spans_the_box() {
        assert_eq!(sparkline(&[]), "");
        assert_eq!(sparkline(&[0.0, 1.0]), "1.0,27.0 119.0,1.0");
        assert_eq!(size(2048), "2.0 KiB");
    }
}
