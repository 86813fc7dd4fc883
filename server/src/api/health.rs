//! Liveness and readiness probes.

use super::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::time::Duration;
use verity_core::storage::PROBE_PREFIX;

/// Longest a readiness check waits for the database or the object store.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200)))]
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

// 200 `{"status": "ready", "checks": {...}}`, or 503 `{"status": "unavailable", "reason":
// "...", "checks": {...}}`. The database check runs a query; the store check writes, reads
// back and deletes a small object under `.readyz/` (leftovers of a failed delete are swept by
// `verity_core::storage::spawn_temp_sweeper`), so a full disk, a read-only mount or a
// vanished store root is 503, not only an unreachable one. Both run concurrently, each for at
// most two seconds; the worker check (only in a process that runs one, `verity up`) reads the
// claim loop's liveness: dead, stopped, stuck, or failing to reach the queue for a while is 503.
/// The database and object store answer (and the embedded worker runs).
#[utoipa::path(get, path = "/readyz", tag = "health", responses((status = 200), (status = 503)))]
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let database = async {
        match tokio::time::timeout(CHECK_TIMEOUT, verity_core::db::ping(&state.pool)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())),
        }
    };
    let store = async {
        // A fresh key per probe: concurrent probes (and servers sharing a store) never meet.
        let key = format!("{PROBE_PREFIX}/{}", uuid::Uuid::new_v4().simple());
        match tokio::time::timeout(CHECK_TIMEOUT, state.store.probe_write(&key)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => {
                // The probe was cancelled part-way; remove what it may have written.
                let store = state.store.clone();
                tokio::spawn(async move { store.delete(&key).await });
                Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs()))
            }
        }
    };
    let (database, store) = tokio::join!(database, store);
    let mut reasons = Vec::new();
    let mut checks = serde_json::Map::new();
    for (name, result) in [("database", database), ("object_store", store)] {
        match result {
            Ok(()) => {
                checks.insert(name.into(), json!("ok"));
            }
            Err(error) => {
                // The cause goes to the log only: it may name hosts and paths.
                tracing::warn!(check = name, %error, "not ready");
                checks.insert(name.into(), json!("unavailable"));
                reasons.push(format!("{} unavailable", name.replace('_', " ")));
            }
        }
    }
    if let Some(worker) = &state.worker {
        let health = worker.health();
        if let (false, Some(reason)) = (health.ready, &health.reason) {
            tracing::warn!(check = "worker", status = health.status, %reason, "not ready");
            reasons.push(format!("worker {}: {reason}", health.status));
        }
        checks.insert("worker".into(), json!(health));
    }
    if reasons.is_empty() {
        (StatusCode::OK, Json(json!({"status": "ready", "checks": checks})))
    } else {
        let body = json!({"status": "unavailable", "reason": reasons.join("; "), "checks": checks});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body))
    }
}
