//! The application: the API, the pages and `/metrics` assembled into one router over one state,
//! the state built from `verity serve`'s settings, and serving until a shutdown signal.

use crate::api::state::{AppState, ServeConfig};
use crate::api::{
    auth, extract, files, graders, health, inference, jobs, loss_presets, model_pulls, models,
    objects, openapi, preflight, recipes, sampling_runs, telemetry, tinker,
};
use anyhow::Context;
use axum::routing::get;
use axum::Router;
use tower_http::trace::TraceLayer;
use verity_core::queue::QueueSettings;

/// The whole application.
pub fn app(state: AppState) -> Router {
    app_with(state, Router::new())
}

/// The application with `extra` routes (e.g. the grader endpoints) merged in.
pub fn app_with(state: AppState, extra: Router<AppState>) -> Router {
    Router::new()
        .merge(health::router())
        .merge(auth::routes::router())
        .merge(files::router())
        .merge(graders::router())
        .merge(inference::router())
        .merge(jobs::router())
        .merge(loss_presets::router())
        .merge(model_pulls::router())
        .merge(models::router())
        .merge(objects::router())
        .merge(preflight::router())
        .merge(recipes::router())
        .merge(sampling_runs::router())
        .merge(tinker::router())
        .merge(openapi::router())
        .merge(extra)
        .merge(crate::web::router())
        .route("/metrics", get(telemetry::prometheus))
        .fallback(crate::web::page::fallback)
        .layer(axum::middleware::from_fn(auth::session::renew_cookie))
        .layer(axum::middleware::from_fn(auth::session::guard))
        .layer(axum::middleware::from_fn(extract::refuse_nul_in_uri))
        .layer(axum::middleware::from_fn_with_state(state.clone(), telemetry::track))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// `app` as a service that records each connection's peer address (the client address that
/// sign-in throttling and lockout count against); `verity serve` and `verity up` both use it.
pub fn service(
    app: Router,
) -> axum::extract::connect_info::IntoMakeServiceWithConnectInfo<Router, std::net::SocketAddr> {
    app.into_make_service_with_connect_info::<std::net::SocketAddr>()
}

/// Serves `app` on `listener` until ctrl-c or SIGTERM.
pub async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(listener, service(app)).with_graceful_shutdown(shutdown_signal()).await
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
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
    // The listeners stop with the state (see `AppState::background`).
    if let Some(listener) = state.start_job_change_listener().await {
        state.background.hold(listener);
    }
    if let Some(listener) = state.start_key_revocation_listener().await {
        state.background.hold(listener);
    }
    // The loop's copy of the state holds no background tasks, so that it does not keep its
    // own task alive once every other copy has dropped.
    let mut detached = state.clone();
    detached.background = Default::default();
    state.background.hold(recipes::advance::spawn(detached));
    if let Some(client) = state.wandb.clone() {
        state.background.hold(crate::integrations::export::spawn(state.pool.clone(), client));
    }
    if config.api.tinker_session_timeout_secs > 0 {
        let timeout = std::time::Duration::from_secs(config.api.tinker_session_timeout_secs);
        state.background.hold(tinker::spawn_expiry(state.pool.clone(), timeout));
    }
    state.background.hold(tinker::spawn_weight_expiry(state.pool.clone(), state.store.clone()));
    Ok(state)
}
