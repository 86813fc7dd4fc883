//! Static assets (CSS, scripts, vendored htmx and uPlot with their licences), compiled into the
//! binary and served with long-lived cache headers (names carry the crate version).

use crate::api::state::AppState;
use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Name, content type and bytes of every asset.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.css", "text/css; charset=utf-8", include_bytes!("../../../web/static/app.css")),
    ("favicon.svg", "image/svg+xml", include_bytes!("../../../web/static/favicon.svg")),
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../../../web/static/app.js")),
    ("job.js", "text/javascript; charset=utf-8", include_bytes!("../../../web/static/job.js")),
    (
        "playground.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/playground.js"),
    ),
    (
        "evaluation.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/evaluation.js"),
    ),
    (
        "rejection_sampling.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/rejection_sampling.js"),
    ),
    (
        "recipe.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/recipe.js"),
    ),
    (
        "profile.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/profile.js"),
    ),
    (
        "new_job.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/new_job.js"),
    ),
    (
        "vendor/htmx.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/vendor/htmx.min.js"),
    ),
    (
        "vendor/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/static/vendor/uPlot.iife.min.js"),
    ),
    (
        "vendor/uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../../../web/static/vendor/uPlot.min.css"),
    ),
    (
        "vendor/htmx.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("../../../web/static/vendor/htmx.LICENSE"),
    ),
    (
        "vendor/uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("../../../web/static/vendor/uPlot.LICENSE"),
    ),
];

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/static/{*name}", get(asset))
        .route("/favicon.ico", get(|| asset(Path("favicon.svg".to_string()))))
}

/// One asset, cached for a day (revalidated on version change by the `?v=` in page links).
async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "public, max-age=86400"),
            ],
            *bytes,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
