//! Evaluation reports: the list, a report's page (pass@k curves of every model on one chart,
//! the table, the narrowing flags, CSV download), and creating the report of a fine-tuning job
//! (its base vs its checkpoints) from the job's page.

use super::page::{render, script_json, when, Nav, WebResult, WebUser};
use crate::api::sampling_runs::evaluations::{create, report, CreateEvaluationRequest};
use crate::api::sampling_runs::find_run;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;
use verity_core::sampling_runs::{EvaluationReport, RunKind, RunSpec};

/// Evaluations shown on the list.
const LIST_LIMIT: i64 = 50;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/evaluations", get(list_page))
        .route("/evaluations/{evaluation_id}", get(report_page))
        .route("/jobs/{job_id}/evaluate", post(evaluate_job))
}

/// An evaluation row of the list.
struct EvaluationRow {
    id: String,
    status: String,
    models: usize,
    file: String,
    created: String,
}

/// The list.
#[derive(Template)]
#[template(path = "evaluations.html")]
struct ListPage {
    nav: Nav,
    evaluations: Vec<EvaluationRow>,
}

async fn list_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let rows = verity_core::sampling_runs::list_runs(
        &state.pool,
        user.0.org_id,
        RunKind::Evaluation,
        None,
        LIST_LIMIT,
    )
    .await?;
    let evaluations = rows
        .into_iter()
        .map(|job| EvaluationRow {
            models: match RunSpec::of_job(&job.spec) {
                Some(Ok(spec)) => spec.models().len(),
                _ => 0,
            },
            file: job.training_file.unwrap_or_default(),
            created: when(job.created_at),
            status: job.state.to_string(),
            id: job.id,
        })
        .collect();
    Ok(render(&ListPage { nav: Nav::new("Evaluations", "evaluations"), evaluations }))
}

/// A table row: one model.
struct ModelRow {
    model: String,
    base: String,
    mean_reward: String,
    cells: Vec<String>,
    flagged: bool,
}

/// A report's page.
#[derive(Template)]
#[template(path = "evaluation.html")]
struct ReportPage {
    nav: Nav,
    id: String,
    status: String,
    terminal: bool,
    file: String,
    n: usize,
    job: Option<String>,
    pending: Vec<String>,
    error: Option<String>,
    ks: Vec<usize>,
    rows: Vec<ModelRow>,
    flags: Vec<String>,
    report_json: String,
}

fn model_rows(report: &EvaluationReport) -> Vec<ModelRow> {
    report
        .models
        .iter()
        .map(|m| ModelRow {
            model: m.model.clone(),
            base: if m.model == m.base { "(base)".into() } else { m.base.clone() },
            mean_reward: format!("{:.3}", m.mean_reward),
            cells: report
                .ks
                .iter()
                .map(|&k| m.at(k).map(|v| format!("{v:.3}")).unwrap_or_else(|| "–".into()))
                .collect(),
            flagged: report.flags.iter().any(|f| f.model == m.model),
        })
        .collect()
}

async fn report_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    let job = find_run(&state, &user.0, RunKind::Evaluation, &id).await?;
    let report = report(&state, &id).await?;
    let (n, job_id, models) = match RunSpec::of_job(&job.spec) {
        Some(Ok(RunSpec::Evaluation(spec))) => {
            (spec.n, spec.job_id, spec.models.into_iter().map(|m| m.name).collect())
        }
        _ => (0, None, Vec::new()),
    };
    let pending =
        models.into_iter().filter(|m| !report.models.iter().any(|r| &r.model == m)).collect();
    let page = ReportPage {
        nav: Nav::new(format!("Evaluation {id}"), "evaluations"),
        terminal: job.state.is_terminal(),
        status: job.state.to_string(),
        file: job.training_file.clone().unwrap_or_default(),
        n,
        job: job_id,
        pending,
        error: job.failure("run").map(|f| f.message),
        ks: report.ks.clone(),
        rows: model_rows(&report),
        flags: report.flags.iter().map(|f| f.message.clone()).collect(),
        report_json: script_json(&serde_json::to_value(&report).unwrap_or(Value::Null)),
        id,
    };
    Ok(render(&page))
}

async fn evaluate_job(
    State(state): State<AppState>,
    user: WebUser,
    Path(job_id): Path<String>,
) -> WebResult<Response> {
    let run = create(&state, &user.0, CreateEvaluationRequest::for_job(&job_id)).await?;
    Ok(Redirect::to(&format!("/evaluations/{}", run.id)).into_response())
}
