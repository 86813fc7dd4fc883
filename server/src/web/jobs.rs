//! Jobs: the list (search and filters, status, progress, ETA, reward sparkline, failure
//! reason), a job's page (live charts, other runs overlaid, warnings, events, state-aware
//! cancel / pause / resume with confirmation), its events as JSONL and its checkpoints.

use super::page::{render, script_json, when, Nav, WebResult, WebUser};
use super::progress::JobProgress;
use super::warnings::{job_items, WarningItem};
use crate::api::error::ApiError;
use crate::api::jobs::budget::update_budget;
use crate::api::jobs::checkpoints::is_trainer_state;
use crate::api::jobs::view::{checkpoint_model_name, EventObject};
use crate::api::jobs::{control_job, find_job, Control};
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use verity_core::jobs::JobRecord;
use verity_core::JobState;

/// Jobs shown on the list.
const LIST_LIMIT: i64 = 50;
/// Events shown on a job's page.
pub const EVENT_LIMIT: i64 = 100;
/// Runs a job page draws at once: the job and up to three others (`?compare=a,b,c`).
const MAX_COMPARED: usize = 4;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/jobs", get(jobs_page))
        .route("/jobs/{job_id}", get(job_page))
        .route("/jobs/{job_id}/control/{action}", post(control))
        .route("/jobs/{job_id}/budget", post(budget_form))
        .route("/jobs/{job_id}/events.jsonl", get(events_jsonl))
        .route("/jobs/{job_id}/checkpoints", get(checkpoints_page))
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
    name: String,
    status: String,
    phase: String,
    failure: String,
    model: String,
    created: String,
    step_text: String,
    percent: u64,
    eta: String,
    spark: String,
    last_reward: String,
    created_by: String,
}

/// Jobs the list reads before filtering (newest first).
const LIST_SCAN: i64 = 1000;

/// The list's search and filters (`?q=&status=&model=&from=&to=`; dates `YYYY-MM-DD`, UTC).
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
}

/// A `YYYY-MM-DD` filter date, or a 400 naming the parameter.
fn filter_date(param: &str, text: &str) -> Result<Option<chrono::NaiveDate>, ApiError> {
    if text.is_empty() {
        return Ok(None);
    }
    chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d").map(Some).map_err(|_| {
        ApiError::invalid(param, format!("expected a date like 2026-01-31, got {text:?}"))
    })
}

impl ListQuery {
    /// Whether `job` passes every filter.
    fn keeps(
        &self,
        job: &JobRecord,
        from: Option<chrono::NaiveDate>,
        to: Option<chrono::NaiveDate>,
    ) -> bool {
        let q = self.q.trim().to_lowercase();
        let text = format!(
            "{} {} {} {}",
            job.id,
            job.suffix.as_deref().unwrap_or(""),
            job.model,
            job.metadata.as_ref().map(Value::to_string).unwrap_or_default()
        )
        .to_lowercase();
        let day = job.created_at.date_naive();
        (q.is_empty() || text.contains(&q))
            && (self.status.is_empty() || job.state.as_str() == self.status)
            && (self.model.is_empty() || job.model == self.model)
            && from.is_none_or(|d| day >= d)
            && to.is_none_or(|d| day <= d)
    }
}

/// The jobs list.
#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    nav: Nav,
    jobs: Vec<JobRow>,
    /// Jobs in the org before filtering (0: none at all yet).
    any: bool,
    query: ListQuery,
    statuses: Vec<&'static str>,
    models: Vec<String>,
}

/// The first line of a failure message, at most 160 characters.
fn short_reason(message: &str) -> String {
    let line = message.lines().next().unwrap_or("");
    let mut short: String = line.chars().take(160).collect();
    if short.len() < line.len() {
        short.push('…');
    }
    short
}

async fn jobs_page(
    State(state): State<AppState>,
    user: WebUser,
    Query(query): Query<ListQuery>,
) -> WebResult<Response> {
    let (from, to) = (filter_date("from", &query.from)?, filter_date("to", &query.to)?);
    let all = verity_core::jobs::list_jobs(&state.pool, user.0.org_id, None, LIST_SCAN).await?;
    let mut models: Vec<String> = all.iter().map(|j| j.model.clone()).collect();
    models.sort();
    models.dedup();
    let any = !all.is_empty();
    let records: Vec<JobRecord> =
        all.into_iter().filter(|j| query.keeps(j, from, to)).take(LIST_LIMIT as usize).collect();
    let ids: Vec<String> = records.iter().map(|j| j.id.clone()).collect();
    let mut created_by: HashMap<String, String> =
        verity_core::jobs::job_creators(&state.pool, user.0.org_id, &ids)
            .await?
            .into_iter()
            .collect();
    let now = chrono::Utc::now().timestamp();
    let mut jobs = Vec::with_capacity(records.len());
    for job in records {
        let rows = metric_values(&state, &job.id).await?;
        let rewards: Vec<f64> = rows
            .iter()
            .filter(|r| !skipped(r))
            .filter_map(|r| r.get("reward_mean").and_then(Value::as_f64))
            .collect();
        let progress = JobProgress::of(&job, last_step(&rows), now);
        jobs.push(JobRow {
            eta: progress.eta.clone(),
            step_text: progress.step_text(),
            percent: progress.percent,
            phase: if job.state == JobState::Running {
                progress.phase.clone()
            } else {
                String::new()
            },
            failure: progress.error.as_deref().map(short_reason).unwrap_or_default(),
            spark: sparkline(&rewards),
            last_reward: rewards.last().map(|r| format!("{r:.3}")).unwrap_or_default(),
            created: when(job.created_at),
            created_by: created_by.remove(&job.id).unwrap_or_default(),
            name: job.suffix.clone().unwrap_or_default(),
            status: job.state.to_string(),
            model: job.model,
            id: job.id,
        });
    }
    Ok(render(&JobsPage {
        nav: Nav::new("Jobs", "jobs"),
        jobs,
        any,
        query,
        statuses: JobState::ALL.iter().map(|s| s.as_str()).collect(),
        models,
    }))
}

/// Whether a metrics row is of a step that trained on nothing (dynamic sampling kept no group):
/// its reward fields describe no completion.
pub fn skipped(row: &Value) -> bool {
    row.get("groups_kept").and_then(Value::as_u64) == Some(0)
}

/// The last step of metrics rows in step order.
pub fn last_step(rows: &[Value]) -> Option<i64> {
    rows.last().and_then(|r| r.get("step")).and_then(Value::as_i64)
}

/// An event as shown.
pub struct EventRow {
    /// Event id (the number of `ftevent-N`).
    pub id: i64,
    /// `YYYY-MM-DD HH:MM` UTC.
    pub time: String,
    /// info | warn | error.
    pub level: String,
    /// Text.
    pub message: String,
}

impl From<verity_core::jobs::EventRecord> for EventRow {
    fn from(event: verity_core::jobs::EventRecord) -> EventRow {
        let id = event.id;
        let e = EventObject::from(event);
        EventRow {
            id,
            time: chrono::DateTime::from_timestamp(e.created_at, 0).map(when).unwrap_or_default(),
            level: e.level,
            message: e.message,
        }
    }
}

/// A job's page.
#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    nav: Nav,
    job: JobRecord,
    progress: JobProgress,
    /// The progress as JSON, for the script (the same object the stream sends).
    progress_json: String,
    terminal: bool,
    /// What the charts area says while there are no steps.
    no_metrics: String,
    hyperparameters: String,
    method: String,
    grader: String,
    metrics_json: String,
    /// Other runs drawn over this one: `[{id, label, rows}]`.
    compare_json: String,
    /// The compare box's text as the user typed it.
    compare_input: String,
    /// Why the compare list could not be drawn (a typo, too many jobs).
    compare_error: Option<String>,
    warnings: Vec<WarningItem>,
    events: Vec<EventRow>,
    /// The baseline before training (pass@k of the base at step 0), as text.
    baseline: Option<String>,
    /// Evaluation reports created for this job, as `(id, state)`.
    evaluations: Vec<(String, String)>,
    /// Whether the job's training / validation file has been deleted since (shown as such, not
    /// linked).
    training_deleted: bool,
    validation_deleted: bool,
}

/// Whether the org's file `id` (when the job names one) no longer exists.
async fn file_deleted(
    state: &AppState,
    user: &WebUser,
    id: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let Some(id) = id else { return Ok(false) };
    Ok(verity_core::files::get_file(&state.pool, user.0.org_id, id).await?.is_none())
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

/// `?compare=a,b`: other jobs of the org to overlay.
#[derive(Debug, Default, Deserialize)]
pub struct JobQuery {
    compare: Option<String>,
}

/// The chart rows of job `id`: its metrics rows, and its baseline evaluation as step 0.
async fn chart_rows(state: &AppState, id: &str) -> WebResult<(Vec<Value>, Option<Value>)> {
    let rows = metric_values(state, id).await?;
    let baseline = verity_core::sampling_runs::job_baseline(&state.pool, id).await?;
    let mut chart = rows;
    if let Some(data) = &baseline {
        chart.insert(0, json!({"step": 0, "eval": data}));
    }
    Ok((chart, baseline))
}

async fn job_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    Query(query): Query<JobQuery>,
) -> WebResult<Response> {
    let job = find_job(&state, &user.0, &id).await?;
    let rows = metric_values(&state, &id).await?;
    let events = verity_core::jobs::list_events(&state.pool, &id, None, EVENT_LIMIT)
        .await?
        .into_iter()
        .map(EventRow::from)
        .collect();
    let method = job.spec.get("method").cloned().unwrap_or(Value::Null);
    let pretty = |v: Option<&Value>| {
        v.map(|v| serde_json::to_string_pretty(v).unwrap_or_default()).unwrap_or_default()
    };
    let progress = JobProgress::of(&job, last_step(&rows), chrono::Utc::now().timestamp());
    let (chart, baseline) = chart_rows(&state, &id).await?;
    // A bad compare list draws the page without the overlay and says why next to the box (a
    // typo must not replace the page with an error).
    let mut compare = Vec::new();
    let mut compared = Vec::new();
    let mut compare_error = None;
    for other in query.compare.as_deref().unwrap_or("").split(',').map(str::trim) {
        if other.is_empty() || other == id || compare.iter().any(|c| c == other) {
            continue;
        }
        if compare.len() + 1 >= MAX_COMPARED {
            compare_error =
                Some(format!("at most {} other jobs can be drawn with this one", MAX_COMPARED - 1));
            break;
        }
        let Ok(found) = find_job(&state, &user.0, other).await else {
            compare_error = Some(format!("no job {other} in your org"));
            break;
        };
        let (rows, _) = chart_rows(&state, other).await?;
        let label = found.suffix.clone().unwrap_or_else(|| other.to_string());
        compared.push(json!({"id": other, "label": label, "rows": rows}));
        compare.push(other.to_string());
    }
    let evaluations =
        verity_core::sampling_runs::job_evaluations(&state.pool, user.0.org_id, &id).await?;
    let warnings = job_items(&state.pool, &job, &rows).await?;
    let terminal = job.state.is_terminal();
    let no_metrics = match job.state.as_str() {
        "failed" => "The job failed before its first step.",
        "cancelled" => "The job was cancelled before its first step.",
        "succeeded" => "The job recorded no steps.",
        "paused" => "Paused before the first step.",
        _ => "Waiting for the first step…",
    };
    let training_deleted = file_deleted(&state, &user, job.training_file.as_deref()).await?;
    let validation_deleted = file_deleted(&state, &user, job.validation_file.as_deref()).await?;
    let page = JobPage {
        training_deleted,
        validation_deleted,
        nav: Nav::new(format!("Job {id}"), "jobs"),
        progress_json: script_json(&serde_json::to_value(&progress).unwrap_or(Value::Null)),
        progress,
        terminal,
        no_metrics: no_metrics.to_string(),
        hyperparameters: pretty(
            method
                .get(method.get("type").and_then(Value::as_str).unwrap_or("reinforcement"))
                .and_then(|settings| settings.get("hyperparameters")),
        ),
        method: method.get("type").and_then(Value::as_str).unwrap_or("reinforcement").to_string(),
        grader: pretty(method.pointer("/reinforcement/grader")),
        metrics_json: script_json(&Value::Array(chart)),
        compare_json: script_json(&Value::Array(compared)),
        compare_input: query.compare.clone().unwrap_or_default(),
        compare_error,
        baseline: baseline.as_ref().map(baseline_text),
        evaluations,
        warnings,
        events,
        job,
    };
    Ok(render(&page))
}

/// A control's form: `confirm=yes` once the user confirmed a destructive one.
#[derive(Debug, Default, Deserialize)]
pub struct ConfirmForm {
    confirm: Option<String>,
}

impl ConfirmForm {
    /// Whether the user confirmed.
    pub fn confirmed(&self) -> bool {
        self.confirm.as_deref() == Some("yes")
    }
}

/// The page that asks before a destructive action (shown when the request came without
/// `confirm=yes`, e.g. with scripts off).
#[derive(Template)]
#[template(path = "confirm.html")]
pub struct ConfirmPage {
    /// Layout.
    pub nav: Nav,
    /// What will happen.
    pub question: String,
    /// Where the confirmed form posts.
    pub action: String,
    /// The confirm button's label.
    pub button: String,
    /// Where "Keep" goes back to.
    pub back: String,
    /// Things the action affects, listed under the question: `(text, link)` (empty link: none).
    pub affected: Vec<(String, String)>,
}

async fn control(
    State(state): State<AppState>,
    user: WebUser,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<ConfirmForm>,
) -> WebResult<Response> {
    let control =
        Control::from_name(&action).ok_or_else(|| ApiError::not_found("action", &action))?;
    if matches!(control, Control::Cancel) && !form.confirmed() {
        find_job(&state, &user.0, &id).await?;
        return Ok(render(&ConfirmPage {
            nav: Nav::new("Cancel job", "jobs"),
            question: format!("Cancel job {id}? It stops for good; its checkpoints are kept."),
            action: format!("/jobs/{id}/control/cancel"),
            button: "Cancel job".into(),
            back: format!("/jobs/{id}"),
            affected: Vec::new(),
        }));
    }
    control_job(&state, &user.0, &id, control).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

/// The job page's budget form: each cap a whole number, or empty for no cap (a field the form
/// did not send keeps its cap).
#[derive(Debug, Default, Deserialize)]
pub struct BudgetForm {
    max_wall_seconds: Option<String>,
    max_tokens: Option<String>,
}

impl BudgetForm {
    /// The form as a budget body: an empty field is `null`, a number a number, anything else
    /// left as text for the budget check to name.
    fn body(&self) -> Value {
        let fields =
            [("max_wall_seconds", &self.max_wall_seconds), ("max_tokens", &self.max_tokens)];
        let map = fields
            .into_iter()
            .filter_map(|(key, value)| {
                let text = value.as_deref()?.trim();
                let value = match text.parse::<i64>() {
                    _ if text.is_empty() => Value::Null,
                    Ok(n) => json!(n),
                    Err(_) => json!(text),
                };
                Some((key.to_string(), value))
            })
            .collect();
        Value::Object(map)
    }
}

async fn budget_form(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    Form(form): Form<BudgetForm>,
) -> WebResult<Response> {
    update_budget(&state, &user.0, &id, &form.body()).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")).into_response())
}

/// Every event of a job, oldest first, one `fine_tuning.job.event` object a line.
async fn events_jsonl(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    find_job(&state, &user.0, &id).await?;
    let mut events = Vec::new();
    let mut before = None;
    loop {
        let page = verity_core::jobs::list_events(&state.pool, &id, before, 1000).await?;
        let done = page.len() < 1000;
        before = page.last().map(|e| e.id);
        events.extend(page);
        if done {
            break;
        }
    }
    let mut body = String::new();
    for event in events.into_iter().rev() {
        body.push_str(&serde_json::to_string(&EventObject::from(event)).unwrap_or_default());
        body.push('\n');
    }
    let disposition = format!("attachment; filename=\"{id}-events.jsonl\"");
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        body,
    )
        .into_response())
}

/// A checkpoint row.
struct CheckpointRow {
    id: String,
    step: i32,
    name: String,
    created: String,
    /// What **Download .tar** fetches: the weights, without the optimizer state.
    size: String,
    /// Bytes of the weights, and of the whole folder with the optimizer state.
    weights_bytes: i64,
    total_bytes: i64,
    /// The whole folder's size, readable.
    total: String,
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

/// Bytes of a published checkpoint's weights (its manifest less the optimizer state): the size
/// of a weights-only download. `None` when the manifest cannot be read.
async fn weights_bytes(state: &AppState, prefix: &str) -> Option<i64> {
    let prefix = prefix.trim_end_matches('/');
    let manifest =
        verity_core::storage::read_manifest(state.store.as_ref(), prefix).await.ok()??;
    let weights = manifest.only(|f| !is_trainer_state(&f.path));
    i64::try_from(weights.total_bytes).ok()
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
    // One small manifest read per checkpoint, all at once.
    let weights = futures::future::join_all(
        rows.iter()
            .map(|c| async { weights_bytes(&state, &c.storage_prefix).await.unwrap_or(c.bytes) }),
    )
    .await;
    let checkpoints = rows
        .into_iter()
        .zip(weights)
        .map(|(c, weights_bytes)| {
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
                size: size(weights_bytes),
                weights_bytes,
                total_bytes: c.bytes,
                total: size(c.bytes),
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

    #[test]
    fn the_budget_form_sends_numbers_nulls_and_text_to_check() {
        let form =
            BudgetForm { max_wall_seconds: Some(" 1200 ".into()), max_tokens: Some("".into()) };
        assert_eq!(form.body(), json!({"max_wall_seconds": 1200, "max_tokens": null}));
        let partial = BudgetForm { max_wall_seconds: Some("ten".into()), max_tokens: None };
        assert_eq!(partial.body(), json!({"max_wall_seconds": "ten"}));
    }
}
