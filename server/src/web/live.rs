//! `GET /jobs/{id}/stream`: server-sent events of a job as it runs. `metrics` carries the new
//! metrics rows (steps after `?after=`), `events` the new job events (ids after
//! `?events_after=`, oldest first), `status` the [`JobProgress`] (computed from the same rows,
//! so its step never lags the charts) and warnings; the stream ends with `end` once the job is
//! final.

use super::jobs::{last_step, metric_values, EventRow};
use super::page::{WebResult, WebUser};
use super::progress::JobProgress;
use super::warnings::job_items;
use crate::api::jobs::find_job;
use crate::api::state::AppState;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::stream::{self, Stream};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::time::Duration;

/// How often the database is polled for new rows.
pub const POLL: Duration = Duration::from_millis(700);

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/jobs/{job_id}/stream", get(stream_job))
}

/// `?after=`: the last step the page has.
#[derive(Debug, Deserialize)]
pub struct StreamQuery {
    after: Option<i32>,
    events_after: Option<i64>,
}

/// New events read per poll (a page that falls further behind catches up over a few polls).
const EVENTS_PER_POLL: i64 = 50;

/// Where the stream is.
struct Cursor {
    state: AppState,
    org: uuid::Uuid,
    job_id: String,
    after: i32,
    events_after: i64,
    first: bool,
    done: bool,
    /// The job's metrics rows as last read, and their fingerprint: rows are re-read only when
    /// the fingerprint changes, not on every poll.
    rows: Vec<Value>,
    version: Option<verity_core::jobs::MetricsVersion>,
}

async fn stream_job(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    Query(query): Query<StreamQuery>,
) -> WebResult<Response> {
    find_job(&state, &user.0, &id).await?;
    let cursor = Cursor {
        state,
        org: user.0.org_id,
        job_id: id,
        after: query.after.unwrap_or(0),
        events_after: query.events_after.unwrap_or(0),
        first: true,
        done: false,
        rows: Vec::new(),
        version: None,
    };
    Ok(Sse::new(events(cursor)).keep_alive(KeepAlive::default()).into_response())
}

fn events(cursor: Cursor) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        if !cursor.first {
            tokio::time::sleep(POLL).await;
        }
        cursor.first = false;
        let batch = match poll(&mut cursor).await {
            Ok(batch) => batch,
            Err(error) => {
                tracing::warn!(%error, job_id = %cursor.job_id, "live stream poll failed");
                vec![Event::default().event("error").data("temporarily unavailable")]
            }
        };
        Some((stream::iter(batch.into_iter().map(Ok)), cursor))
    })
    .flatten()
}

/// The events of one poll.
async fn poll(cursor: &mut Cursor) -> Result<Vec<Event>, sqlx::Error> {
    let mut out = Vec::new();
    let Some(job) =
        verity_core::jobs::get_job(&cursor.state.pool, cursor.org, &cursor.job_id).await?
    else {
        cursor.done = true;
        return Ok(vec![Event::default().event("end").data("gone")]);
    };
    let version = verity_core::jobs::metrics_version(&cursor.state.pool, &cursor.job_id).await?;
    if cursor.version != Some(version) {
        cursor.rows = metric_values(&cursor.state, &cursor.job_id).await?;
        cursor.version = Some(version);
    }
    let all = &cursor.rows;
    let new: Vec<&Value> = all
        .iter()
        .filter(|r| r.get("step").and_then(Value::as_i64).unwrap_or(0) > i64::from(cursor.after))
        .collect();
    if let Some(last) = new.iter().filter_map(|r| r.get("step").and_then(Value::as_i64)).max() {
        cursor.after = i32::try_from(last).unwrap_or(i32::MAX);
        out.push(
            Event::default()
                .event("metrics")
                .data(Value::from(new.into_iter().cloned().collect::<Vec<_>>()).to_string()),
        );
    }
    let mut fresh =
        verity_core::jobs::list_events(&cursor.state.pool, &cursor.job_id, None, EVENTS_PER_POLL)
            .await?;
    fresh.retain(|e| e.id > cursor.events_after);
    if let Some(last) = fresh.first().map(|e| e.id) {
        cursor.events_after = last;
        let rows: Vec<Value> = fresh
            .into_iter()
            .rev()
            .map(EventRow::from)
            .map(|e| json!({"id": e.id, "time": e.time, "level": e.level, "message": e.message}))
            .collect();
        out.push(Event::default().event("events").data(Value::from(rows).to_string()));
    }
    let progress = JobProgress::of(&job, last_step(all), chrono::Utc::now().timestamp());
    let mut status = serde_json::to_value(&progress).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut status {
        map.insert("step_text".into(), json!(progress.step_text()));
        let warnings = job_items(&cursor.state.pool, &job, all).await?;
        map.insert("warnings".into(), json!(warnings));
    }
    out.push(Event::default().event("status").data(status.to_string()));
    if job.state.is_terminal() {
        cursor.done = true;
        out.push(Event::default().event("end").data(job.state.as_str()));
    }
    Ok(out)
}
