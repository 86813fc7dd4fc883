//! An inference worker's row in `inference_workers`: written at start and on every heartbeat
//! (address, token, loaded models, running requests), so API servers find live workers.

use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use verity_core::inference::{heartbeat_inference_worker, InferenceWorkerRecord};
use verity_worker::inference::Engine;

/// How often a worker refreshes its row.
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// How recent a heartbeat must be for API servers to use the worker (seconds).
pub const FRESH_SECS: f64 = 10.0;

/// Who this worker is: its id, URL and the token API servers must present.
#[derive(Debug, Clone)]
pub struct Registration {
    /// New at each start.
    pub id: Uuid,
    /// Base URL API servers reach it at.
    pub url: String,
    /// Bearer token of its internal endpoint (random, 64 hex characters).
    pub token: Arc<str>,
}

impl Registration {
    /// A new identity reachable at `url`.
    pub fn new(url: String) -> Registration {
        let bytes: [u8; 32] = rand::rng().random();
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Registration { id: Uuid::new_v4(), url, token: token.into() }
    }
}

/// Writes the worker's row now and every [`HEARTBEAT`] until `shutdown`; a failed write is
/// logged and retried at the next beat.
pub async fn heartbeat_loop(
    pool: sqlx::PgPool,
    engine: Arc<Engine>,
    me: Registration,
    shutdown: CancellationToken,
) {
    loop {
        let record = InferenceWorkerRecord {
            id: me.id,
            address: me.url.clone(),
            token: me.token.to_string(),
            models: serde_json::json!(engine.loaded_models().await),
            active: i32::try_from(engine.active_requests()).unwrap_or(i32::MAX),
            last_seen_at: chrono::Utc::now(),
        };
        if let Err(error) = heartbeat_inference_worker(&pool, &record).await {
            tracing::warn!(%error, "inference worker heartbeat failed");
        }
        // Models idle past the engine's `idle_unload` give their memory back (the next
        // heartbeat reports them gone).
        engine.unload_idle().await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
    }
}
