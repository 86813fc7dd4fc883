//! Liveness and readiness probes.

use super::error::ApiError;
use super::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200)))]
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// The database and object store answer.
#[utoipa::path(get, path = "/readyz", tag = "health", responses((status = 200), (status = 503)))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    sqlx::query("SELECT 1")
        .execute(&state.pool)
        .await
        .map_err(|e| ApiError::unavailable("readiness: database", e))?;
    state
        .store
        .head("readyz-probe")
        .await
        .map_err(|e| ApiError::unavailable("readiness: object store", e))?;
    Ok(Json(json!({"status": "ready"})))
}
