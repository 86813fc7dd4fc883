//! The REST API: one router per module, merged here with tracing and request metrics.

pub mod auth;
pub mod error;
pub mod extract;
pub mod files;
pub mod grader_run;
pub mod graders;
pub mod health;
pub mod inference;
pub mod jobs;
pub mod loss_presets;
pub mod models;
pub mod objects;
pub mod openapi;
pub mod pagination;
pub mod preflight;
pub mod reference;
pub mod sampling_runs;
pub mod state;
pub mod telemetry;

use axum::routing::get;
use axum::Router;
use state::AppState;
use tower_http::trace::TraceLayer;

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
        .merge(models::router())
        .merge(objects::router())
        .merge(preflight::router())
        .merge(sampling_runs::router())
        .merge(openapi::router())
        .merge(extra)
        .merge(crate::web::router())
        .route("/metrics", get(telemetry::prometheus))
        .fallback(crate::web::page::fallback)
        .layer(axum::middleware::from_fn(auth::session::guard))
        .layer(axum::middleware::from_fn(extract::refuse_nul_in_uri))
        .layer(axum::middleware::from_fn_with_state(state.clone(), telemetry::track))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `app` on `listener` until ctrl-c or SIGTERM.
pub async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(shutdown_signal())
        .await
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
