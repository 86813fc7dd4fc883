//! The Tinker page: the org's training runs (Tinker training clients) with their state, the
//! calls they ran and the weights they saved (each a Verity model, opened in the playground),
//! the sessions that opened them, and a run's call log (calls, tokens, losses, timings).

use super::jobs::{ConfirmForm, ConfirmPage};
use super::page::{render, urlencode, when, Nav, WebResult, WebUser};
use crate::api::error::ApiError;
use crate::api::extract::ApiQuery;
use crate::api::state::AppState;
use crate::api::tinker::runs::{delete_saved_weights, publish};
use askama::Template;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::response::{IntoResponse, Redirect};
use axum::routing::{get, post};
use axum::Form;
use axum::Router;
use serde::Deserialize;
use verity_core::tinker::clients::{self, CallRecord, RunRecord, SavedRecord};
use verity_core::tinker::{list_sessions, SessionRecord};
use verity_core::JobState;

/// Runs (and sessions) shown on the list.
const LIST_LIMIT: i64 = 100;

/// Calls shown on a run's log.
const LOG_LIMIT: i64 = 500;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tinker", get(list_page))
        .route("/tinker/{run_id}", get(run_page))
        .route("/tinker/{run_id}/saved/delete", post(delete_saved))
        .route("/tinker/{run_id}/saved/publish", post(publish_saved))
}

/// A run as shown.
struct RunRow {
    id: String,
    client: String,
    base_model: String,
    adapter: String,
    state: String,
    /// The state in the run's own words: a `paused` client is parked.
    label: &'static str,
    calls: i32,
    owner: String,
    created: String,
    last_call: String,
}

impl From<&RunRecord> for RunRow {
    fn from(run: &RunRecord) -> Self {
        RunRow {
            id: run.job_id.clone(),
            client: run.model_id.clone(),
            base_model: run.base_model.clone(),
            adapter: run.lora_rank.map_or("full weights".into(), |r| format!("LoRA rank {r}")),
            state: run.state.clone(),
            label: state_label(&run.state),
            calls: run.calls_run,
            owner: run.owner.clone().unwrap_or_default(),
            created: when(run.created_at),
            last_call: run.last_call_at.map_or("none".into(), when),
        }
    }
}

/// A client's queue state as the Tinker page says it: a `paused` client was parked (idle; its
/// next call restores it on a worker).
fn state_label(state: &str) -> &'static str {
    match state.parse::<JobState>() {
        Ok(JobState::Paused) => "parked",
        Ok(JobState::Succeeded) => "ended",
        Ok(other) => other.as_str(),
        Err(_) => "unknown",
    }
}

/// A session as shown: who opened it (by id and name), whether it is open, what it opened.
struct SessionRow {
    id: String,
    name: String,
    opened: String,
    last_heartbeat: String,
    /// `open`, or how it finished.
    status: String,
    open: bool,
    runs: Vec<String>,
    samplers: usize,
}

impl From<&SessionRecord> for SessionRow {
    fn from(session: &SessionRecord) -> Self {
        SessionRow {
            id: session.id.clone(),
            name: session.display_name.clone().unwrap_or_default(),
            opened: when(session.created_at),
            last_heartbeat: when(session.last_heartbeat_at),
            status: match (&session.finished_at, &session.finish_reason) {
                (None, _) => "open".into(),
                (Some(at), Some(reason)) => format!("finished ({reason}) {}", when(*at)),
                (Some(at), None) => format!("finished {}", when(*at)),
            },
            open: session.finished_at.is_none(),
            runs: session.training_run_ids.clone(),
            samplers: session.sampler_ids.len(),
        }
    }
}

/// Saved weights as shown.
struct SavedRow {
    path: String,
    /// Where its Delete form posts.
    delete: String,
    /// Whether every org may read it through its path.
    public: bool,
    /// Where its Publish (or Unpublish) form posts.
    publish: String,
    kind: String,
    model: String,
    /// The playground comparing them with the run's base model.
    playground: String,
    saved: String,
    /// When the path expires (empty: kept until deleted).
    expires: String,
    size: String,
}

impl SavedRow {
    fn new(saved: &SavedRecord, base_model: &str) -> Self {
        SavedRow {
            path: saved.path.clone(),
            delete: format!(
                "/tinker/{}/saved/delete?path={}",
                saved.job_id,
                urlencode(&saved.path)
            ),
            public: saved.public,
            publish: format!(
                "/tinker/{}/saved/publish?path={}&public={}",
                saved.job_id,
                urlencode(&saved.path),
                !saved.public
            ),
            kind: saved.kind.clone(),
            model: saved.model.clone(),
            playground: format!(
                "/playground?left={}&right={}",
                urlencode(base_model),
                urlencode(&saved.model)
            ),
            saved: when(saved.created_at),
            expires: saved.expires_at.map_or(String::new(), when),
            size: saved.bytes.map_or(String::new(), |b| format!("{:.1} MB", b as f64 / 1e6)),
        }
    }
}

/// A call as shown.
struct CallRow {
    seq: i32,
    kind: String,
    arrived: String,
    took: String,
    ran: String,
    tokens: String,
    loss: String,
    outcome: String,
    failed: bool,
}

impl From<&CallRecord> for CallRow {
    fn from(call: &CallRecord) -> Self {
        let seconds = |ms: f64| format!("{:.3} s", ms / 1000.0);
        let took = call.took_ms().map_or("waiting".into(), |ms| seconds(ms as f64));
        CallRow {
            seq: call.seq_id,
            kind: call.kind.clone(),
            arrived: call.created_at.format("%H:%M:%S%.3f").to_string(),
            took,
            ran: call.ran_ms.map_or(String::new(), |ms| seconds(f64::from(ms))),
            tokens: call.tokens.map_or(String::new(), |t| t.to_string()),
            loss: call.loss.map_or(String::new(), |l| format!("{l:.4}")),
            outcome: match (&call.error, call.finished_at) {
                (Some(error), _) => error.clone(),
                (None, Some(_)) => "ok".into(),
                (None, None) => String::new(),
            },
            failed: call.error.is_some(),
        }
    }
}

/// The list.
#[derive(Template)]
#[template(path = "tinker_runs.html")]
struct ListPage {
    nav: Nav,
    runs: Vec<RunRow>,
    saved: Vec<SavedRow>,
    sessions: Vec<SessionRow>,
}

async fn list_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let org = user.0.org_id;
    let (runs, _) =
        clients::list_runs(&state.pool, org, LIST_LIMIT, 0).await.map_err(ApiError::from)?;
    let saved = clients::list_saved(&state.pool, org, None).await.map_err(ApiError::from)?;
    let (sessions, _) =
        list_sessions(&state.pool, org, LIST_LIMIT, 0).await.map_err(ApiError::from)?;
    Ok(render(&ListPage {
        nav: Nav::new("Tinker", "tinker"),
        runs: runs.iter().map(RunRow::from).collect(),
        sessions: sessions.iter().map(SessionRow::from).collect(),
        saved: saved
            .iter()
            .map(|s| {
                let base = runs.iter().find(|r| r.job_id == s.job_id).map_or("", |r| &r.base_model);
                SavedRow::new(s, base)
            })
            .collect(),
    }))
}

/// A run's page.
#[derive(Template)]
#[template(path = "tinker_run.html")]
struct RunPage {
    nav: Nav,
    run: RunRow,
    saved: Vec<SavedRow>,
    calls: Vec<CallRow>,
}

async fn run_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(run_id): Path<String>,
) -> WebResult<Response> {
    let org = user.0.org_id;
    let run = clients::run(&state.pool, org, &run_id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::not_found("training run", &run_id))?;
    let saved =
        clients::list_saved(&state.pool, org, Some(&run_id)).await.map_err(ApiError::from)?;
    let calls = clients::list_calls(&state.pool, org, &run_id, LOG_LIMIT, 0)
        .await
        .map_err(ApiError::from)?;
    Ok(render(&RunPage {
        nav: Nav::new(format!("Tinker run {run_id}"), "tinker"),
        run: RunRow::from(&run),
        saved: saved.iter().map(|s| SavedRow::new(s, &run.base_model)).collect(),
        calls: calls.iter().map(CallRow::from).collect(),
    }))
}

/// `?path=` of a saved weight's delete.
#[derive(Debug, Deserialize)]
struct SavedPath {
    path: String,
}

/// Deletes saved weights of the org (after the user confirmed), then shows the run again.
async fn delete_saved(
    State(state): State<AppState>,
    user: WebUser,
    Path(run_id): Path<String>,
    ApiQuery(query): ApiQuery<SavedPath>,
    Form(form): Form<ConfirmForm>,
) -> WebResult<Response> {
    if !query.path.starts_with(&format!("tinker://{run_id}/")) {
        return Err(ApiError::not_found("checkpoint", &query.path).into());
    }
    if !form.confirmed() {
        return Ok(render(&ConfirmPage {
            nav: Nav::new("Delete saved weights", "tinker"),
            question: format!(
                "Delete {}? The path stops resolving; the weights' files are removed unless \
                 another path of the run holds the same checkpoint.",
                query.path
            ),
            action: format!("/tinker/{run_id}/saved/delete?path={}", urlencode(&query.path)),
            button: "Delete".into(),
            back: format!("/tinker/{run_id}"),
            affected: Vec::new(),
        }));
    }
    delete_saved_weights(&state, &user.0, &query.path).await?;
    Ok(Redirect::to(&format!("/tinker/{run_id}")).into_response())
}

/// `?path=&public=` of a saved weight's publication.
#[derive(Debug, Deserialize)]
struct PublishPath {
    path: String,
    public: bool,
}

/// Publishes saved weights of the org to every org of the server, or makes them private again
/// (after the user confirmed publishing), then shows the run again.
async fn publish_saved(
    State(state): State<AppState>,
    user: WebUser,
    Path(run_id): Path<String>,
    ApiQuery(query): ApiQuery<PublishPath>,
    Form(form): Form<ConfirmForm>,
) -> WebResult<Response> {
    if !query.path.starts_with(&format!("tinker://{run_id}/")) {
        return Err(ApiError::not_found("checkpoint", &query.path).into());
    }
    if query.public && !form.confirmed() {
        return Ok(render(&ConfirmPage {
            nav: Nav::new("Publish saved weights", "tinker"),
            question: format!(
                "Publish {}? Every organization of this server can then sample these weights, \
                 start training clients from them and download them through the path, until \
                 you unpublish or delete it.",
                query.path
            ),
            action: format!(
                "/tinker/{run_id}/saved/publish?path={}&public=true",
                urlencode(&query.path)
            ),
            button: "Publish".into(),
            back: format!("/tinker/{run_id}"),
            affected: Vec::new(),
        }));
    }
    publish(&state, &user.0, &query.path, query.public).await?;
    Ok(Redirect::to(&format!("/tinker/{run_id}")).into_response())
}
