//! What the inference tests share: a tiny random Llama with a long context, and a real
//! inference worker (engine + internal HTTP service) registered through Postgres.
use serde_json::{json, Value};
use sqlx::PgPool;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use verity_core::spec::RolloutDtype;
use verity_core::storage::ObjectStore;
use verity_worker::inference::{Engine, EngineConfig};
use verity_worker::trainer::testing::write_tiny_model_dir;
use verity_worker::Family;

/// Writes a tiny random Llama (weights from `seed`) whose context is `context` tokens.
pub fn tiny_model(dir: &Path, seed: u64, context: usize) {
    write_tiny_model_dir(dir, Family::Llama, seed).unwrap();
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(context);
    std::fs::write(&path, config.to_string()).unwrap();
}

/// Starts an inference worker over `store` (CPU, 1 GiB budget, `max_batch` rows, decoding from
/// `decode_dtype` weights) on a free loopback port and waits until it is registered; cancel the
/// token to stop it.
pub async fn start_worker(
    pool: &PgPool,
    store: Arc<dyn ObjectStore>,
    cache_dir: &Path,
    (max_batch, decode_dtype): (usize, RolloutDtype),
) -> (Arc<Engine>, CancellationToken) {
    let engine = Arc::new(Engine::new(
        store,
        EngineConfig {
            cache_dir: cache_dir.to_path_buf(),
            device: candle_core::Device::Cpu,
            memory_budget_bytes: 1 << 30,
            max_batch,
            decode_dtype,
            idle_unload: None,
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(verity_server::inference::serve(
        pool.clone(),
        engine.clone(),
        listener,
        url,
        shutdown.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while verity_core::inference::live_inference_workers(pool, 10.0).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the inference worker never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (engine, shutdown)
}
