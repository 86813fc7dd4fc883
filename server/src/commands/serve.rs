//! `verity serve`: the REST API.

use crate::api::state::{AppState, ServeConfig};
use anyhow::Context;
use verity_core::queue::QueueSettings;

/// Connects, migrates, and serves until ctrl-c or SIGTERM.
pub async fn run(config: &ServeConfig) -> anyhow::Result<()> {
    let state = build_state(config).await?;
    let listener = tokio::net::TcpListener::bind(&config.bind)
        .await
        .with_context(|| format!("binding {}", config.bind))?;
    let address = listener.local_addr().context("reading the bound address")?;
    tracing::info!(%address, "verity API listening");
    println!("{{\"listening\": \"http://{address}\"}}");
    crate::api::serve(listener, router(state)).await.context("serving HTTP")
}

/// Everything `verity serve` answers (also served by `verity up`).
pub fn router(state: AppState) -> axum::Router {
    crate::api::app(state)
}

/// Opens the database (running migrations) and the object store, and builds the state.
pub async fn build_state(config: &ServeConfig) -> anyhow::Result<AppState> {
    let pool = verity_core::db::connect_with_timeout(
        &config.db.database_url,
        config.db.max_connections,
        config.db.acquire_timeout(),
    )
    .await?;
    verity_core::db::migrate(&pool).await.context("migrating the database")?;
    let store = verity_core::storage::open_store(&config.storage)
        .await
        .context("opening the object store")?;
    verity_core::storage::spawn_temp_sweeper(store.clone());
    let state = AppState::new(
        pool,
        store,
        QueueSettings::from(&config.queue),
        &config.storage,
        &config.api,
    )?;
    state.start_job_change_listener().await;
    state.start_key_revocation_listener().await;
    Ok(state)
}
