//! The web dashboard: server-rendered pages (askama templates in `web/templates/`), htmx for
//! partial updates, server-sent events for live metrics, static assets compiled in.

pub mod assets;
pub mod chat_text;
pub mod completions;
pub mod evaluations;
pub mod files;
pub mod jobs;
pub mod keys;
pub mod live;
pub mod login;
pub mod new_job;
pub mod page;
pub mod playground;
pub mod progress;
pub mod recipes;
pub mod rejection_sampling;
pub mod tinker;
pub mod warnings;

use crate::api::state::AppState;
use axum::response::Redirect;
use axum::routing::get;
use axum::Router;

/// Routes of the dashboard.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/jobs") }))
        .merge(assets::router())
        .merge(login::router())
        .merge(keys::router())
        .merge(jobs::router())
        .merge(live::router())
        .merge(new_job::router())
        .merge(completions::router())
        .merge(files::router())
        .merge(playground::router())
        .merge(evaluations::router())
        .merge(rejection_sampling::router())
        .merge(recipes::router())
        .merge(tinker::router())
}
