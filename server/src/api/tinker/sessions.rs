//! Tinker sessions: opening one (`create_session`), keeping it alive (`session_heartbeat`),
//! closing it (`sessions/{id}/finish`), and the SDK's `RestClient.list_sessions` and
//! `get_session` (what a session opened: its training runs and samplers). Sessions belong to the
//! caller's org; another org's look like unknown ones.

use super::runs::Page;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::{reject_nul, reject_nul_json, ApiJson, ApiQuery};
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;
use verity_core::tinker::{NewSession, SessionRecord, MAX_DISPLAY_NAME_CHARS};

/// Body of `create_session` (the SDK's `CreateSessionRequest`; `sdk_version`, `project_id` and
/// `type` are accepted and not kept).
#[derive(Debug, Deserialize)]
pub(super) struct CreateSession {
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    user_metadata: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    display_name: Option<String>,
}

/// `POST /api/v1/create_session`: `{"session_id"}`.
pub(super) async fn create_session(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateSession>,
) -> ApiResult<Json<Value>> {
    let tags = json!(body.tags);
    let user_metadata = Value::Object(body.user_metadata.unwrap_or_default());
    reject_nul_json("tags", &tags)?;
    reject_nul_json("user_metadata", &user_metadata)?;
    // An empty name is no name (the SDK sends `null` when none is given).
    let display_name = body.display_name.filter(|name| !name.is_empty());
    if let Some(name) = &display_name {
        reject_nul("display_name", name)?;
        if name.chars().count() > MAX_DISPLAY_NAME_CHARS {
            return Err(ApiError::invalid(
                "display_name",
                format!("must be at most {MAX_DISPLAY_NAME_CHARS} characters"),
            ));
        }
    }
    let session = NewSession { tags, user_metadata, display_name };
    let session_id = verity_core::tinker::create_session(
        &state.pool,
        principal.org_id,
        Some(principal.user_id),
        &session,
    )
    .await?;
    tracing::info!(org_id = %principal.org_id, session_id, "tinker session opened");
    Ok(Json(json!({ "session_id": session_id, "type": "create_session" })))
}

/// Body of `session_heartbeat`.
#[derive(Debug, Deserialize)]
pub(super) struct Heartbeat {
    session_id: String,
}

/// A heartbeat; 410 (the SDK stops beating) for a session that is closed or not the org's.
pub(super) async fn session_heartbeat(
    principal: Principal,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Heartbeat>,
) -> ApiResult<Json<Value>> {
    if !verity_core::tinker::heartbeat(&state.pool, principal.org_id, &body.session_id).await? {
        return Err(ApiError {
            status: StatusCode::GONE,
            ..ApiError::not_found("session", &body.session_id)
        });
    }
    Ok(Json(json!({ "type": "session_heartbeat" })))
}

/// Body of `sessions/{id}/finish`.
#[derive(Debug, Deserialize)]
pub(super) struct Finish {
    #[serde(default)]
    reason: Option<Value>,
}

/// `POST /api/v1/sessions/{id}/finish`: closes the session (its parked clients end with it).
pub(super) async fn finish_session(
    principal: Principal,
    State(state): State<AppState>,
    Path(session_id): Path<String>,
    ApiJson(body): ApiJson<Finish>,
) -> ApiResult<Json<Value>> {
    let reason = body
        .reason
        .as_ref()
        .and_then(|r| r.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("success")
        .chars()
        .take(64)
        .collect::<String>();
    if !verity_core::tinker::finish_session(&state.pool, principal.org_id, &session_id, &reason)
        .await?
    {
        return Err(ApiError::not_found("session", &session_id));
    }
    Ok(Json(json!({})))
}

/// `?access_scope=` of the session reads: `owned` or `accessible`. Both are the caller's org's
/// sessions: Verity shares no session across orgs.
#[derive(Debug, Deserialize)]
pub(super) struct Scope {
    #[serde(default)]
    access_scope: Option<String>,
}

impl Scope {
    fn check(&self) -> ApiResult<()> {
        match self.access_scope.as_deref() {
            None | Some("owned" | "accessible") => Ok(()),
            Some(other) => Err(ApiError::invalid(
                "access_scope",
                format!("must be `owned` or `accessible`, got `{other}`"),
            )),
        }
    }
}

/// `GET /api/v1/sessions?limit=&offset=`: the org's session ids, newest first (the SDK's
/// `ListSessionsResponse`), with Verity's detail of each under `verity_sessions`.
pub(super) async fn list_sessions(
    principal: Principal,
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
    ApiQuery(scope): ApiQuery<Scope>,
) -> ApiResult<Json<Value>> {
    page.check()?;
    scope.check()?;
    let (sessions, total) =
        verity_core::tinker::list_sessions(&state.pool, principal.org_id, page.limit, page.offset)
            .await?;
    Ok(Json(json!({
        "sessions": sessions.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        "cursor": {"offset": page.offset, "limit": page.limit, "total_count": total},
        "verity_sessions": sessions.iter().map(session_json).collect::<Vec<_>>(),
    })))
}

/// `GET /api/v1/sessions/{id}`: the SDK's `GetSessionResponse` (training runs, samplers, the
/// user's metadata, the display name) and Verity's detail (times, state, tags).
pub(super) async fn get_session(
    principal: Principal,
    State(state): State<AppState>,
    Path(session_id): Path<String>,
    ApiQuery(scope): ApiQuery<Scope>,
) -> ApiResult<Json<Value>> {
    scope.check()?;
    let session = verity_core::tinker::session(&state.pool, principal.org_id, &session_id)
        .await?
        .ok_or_else(|| ApiError::not_found("session", &session_id))?;
    Ok(Json(session_json(&session)))
}

/// A session as `GetSessionResponse` (plus `verity_*` fields). The SDK types `user_metadata` as
/// strings by key: a value sent as another JSON type comes back as its JSON text.
fn session_json(session: &SessionRecord) -> Value {
    let metadata: serde_json::Map<String, Value> = session
        .user_metadata
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                    (k.clone(), Value::String(text))
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "session_id": session.id,
        "training_run_ids": session.training_run_ids,
        "sampler_ids": session.sampler_ids,
        "user_metadata": metadata,
        "display_name": session.display_name,
        "verity_tags": session.tags,
        "verity_created_at": session.created_at,
        "verity_last_heartbeat_at": session.last_heartbeat_at,
        "verity_finished_at": session.finished_at,
        "verity_finish_reason": session.finish_reason,
    })
}

/// Spawns the loop that closes the sessions whose client sent no heartbeat for `timeout`
/// ([`verity_core::tinker::expire_sessions`]). It counts from its own start, so that clients
/// whose heartbeats failed while the server was down get a whole `timeout` to beat again.
pub fn spawn_expiry(pool: sqlx::PgPool, timeout: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let every = (timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if started.elapsed() < timeout {
                continue;
            }
            if let Err(error) = verity_core::tinker::expire_sessions(&pool, timeout).await {
                tracing::warn!(%error, "closing tinker sessions without a heartbeat failed; retrying");
            }
        }
    })
}
