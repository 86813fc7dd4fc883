//! The inference role (`verity inference`, also inside `verity up`): an internal HTTP service
//! over a [`verity_worker::inference::Engine`] that registers itself in Postgres with a heartbeat;
//! API servers forward chat and completion requests to a live one
//! ([`crate::api::inference::forward`]).

pub mod registry;
pub mod service;

use anyhow::Context;
use clap::Args;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use verity_core::config::{DatabaseConfig, StorageConfig};
use verity_worker::inference::{Engine, EngineConfig};

/// Options of `verity inference`.
#[derive(Debug, Clone, Args)]
pub struct InferenceArgs {
    /// Database (the worker registers itself there).
    #[command(flatten)]
    pub database: DatabaseConfig,
    /// Object storage (models and checkpoints are read from it).
    #[command(flatten)]
    pub storage: StorageConfig,
    /// Address to listen on (internal; API servers connect to it).
    #[arg(long, env = "VERITY_INFERENCE_BIND", default_value = "127.0.0.1:8090")]
    pub bind: String,
    /// Base URL API servers reach this worker at (default: `http://` + the bound address).
    #[arg(long = "advertise-url", env = "VERITY_INFERENCE_URL")]
    pub advertise_url: Option<String>,
    /// The device models run on.
    #[command(flatten)]
    pub device: verity_core::config::DeviceArgs,
    /// Local cache of downloaded models.
    #[command(flatten)]
    pub cache: verity_core::config::CacheArgs,
    /// Parameter memory for loaded models (MiB); least recently used idle models are unloaded
    /// to stay under it.
    #[arg(long = "memory-budget-mib", env = "VERITY_INFERENCE_MEMORY_MIB", default_value_t = 8192)]
    pub memory_budget_mib: usize,
    /// Most sequences decoded together per model (continuous batch size).
    #[arg(long = "max-batch", env = "VERITY_INFERENCE_MAX_BATCH", default_value_t = 32)]
    pub max_batch: usize,
    /// Precision of the weights decoding reads on a CPU: f32, or bf16 or int8 copies made once
    /// per loaded model (faster decoding, slightly different outputs; docs/inference.md).
    #[arg(
        long = "decode-dtype",
        env = "VERITY_INFERENCE_DECODE_DTYPE",
        value_enum,
        default_value_t
    )]
    pub decode_dtype: verity_core::spec::RolloutDtype,
    /// Seconds after which a model no request used is unloaded and its memory returned
    /// (0: keep models loaded until the memory budget needs the room).
    #[arg(
        long = "idle-unload-seconds",
        env = "VERITY_INFERENCE_IDLE_UNLOAD_SECONDS",
        default_value_t = 600
    )]
    pub idle_unload_seconds: u64,
}

/// The engine configuration of the command's options.
pub fn engine_config(args: &InferenceArgs) -> anyhow::Result<EngineConfig> {
    Ok(EngineConfig {
        cache_dir: args.cache.dir.clone(),
        device: verity_worker::parse_device(&args.device.name)?,
        memory_budget_bytes: args.memory_budget_mib.saturating_mul(1 << 20),
        max_batch: args.max_batch.max(1),
        decode_dtype: args.decode_dtype,
        idle_unload: (args.idle_unload_seconds > 0)
            .then(|| std::time::Duration::from_secs(args.idle_unload_seconds)),
    })
}

/// Runs `verity inference` until ctrl-c or SIGTERM.
pub async fn run(args: InferenceArgs) -> anyhow::Result<()> {
    let pool = verity_core::db::connect_with_timeout(
        &args.database.database_url,
        args.database.max_connections,
        args.database.acquire_timeout(),
    )
    .await?;
    verity_core::db::migrate(&pool).await.context("migrating the database")?;
    let store = verity_core::storage::open_store(&args.storage)
        .await
        .context("opening the object store")?;
    let engine = Arc::new(Engine::new(store, engine_config(&args)?));
    let listener = tokio::net::TcpListener::bind(&args.bind)
        .await
        .with_context(|| format!("binding {}", args.bind))?;
    let address = listener.local_addr()?;
    let url = args.advertise_url.clone().unwrap_or_else(|| format!("http://{address}"));
    println!("{{\"inference_listening\": \"{url}\"}}");
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        crate::app::shutdown_signal().await;
        trigger.cancel();
    });
    serve(pool, engine, listener, url, shutdown).await
}

/// Serves `engine` on `listener`, registered as reachable at `url`, until `shutdown`.
pub async fn serve(
    pool: sqlx::PgPool,
    engine: Arc<Engine>,
    listener: tokio::net::TcpListener,
    url: String,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let registration = registry::Registration::new(url);
    let router = service::router(engine.clone(), registration.token.clone());
    let heartbeat = tokio::spawn(registry::heartbeat_loop(
        pool.clone(),
        engine,
        registration.clone(),
        shutdown.clone(),
    ));
    tracing::info!(url = registration.url, "inference worker listening");
    let stop = shutdown.clone();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .context("serving inference");
    shutdown.cancel();
    let _ = heartbeat.await;
    if let Err(error) =
        verity_core::inference::remove_inference_worker(&pool, registration.id).await
    {
        tracing::warn!(%error, "could not deregister the inference worker");
    }
    served
}
