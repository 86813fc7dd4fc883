//! What every page shares: the signed-in user extractor, rendering, errors as HTML pages.

use crate::api::auth::session::{authenticate_session, session_token, RenewalSlot};
use crate::api::auth::Principal;
use crate::api::error::ApiError;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use verity_core::tenancy::Role;

/// The signed-in user of a dashboard request; without a valid session, a redirect to sign-in.
#[derive(Debug, Clone)]
pub struct WebUser(pub Principal);

impl WebUser {
    /// True for org admins.
    pub fn is_admin(&self) -> bool {
        self.0.role == Role::Admin
    }
}

impl FromRequestParts<AppState> for WebUser {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<WebUser, Response> {
        let principal = match session_token(&parts.headers) {
            Some(id) => {
                let renewal = parts.extensions.get::<RenewalSlot>();
                authenticate_session(state, id, renewal).await.ok()
            }
            None => None,
        };
        match principal {
            Some(principal) => Ok(WebUser(principal)),
            None => {
                let next = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
                let target = format!("/login?next={}", urlencode(next));
                Err(Redirect::to(&target).into_response())
            }
        }
    }
}

/// Percent-encodes everything but unreserved characters.
pub fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Fields the layout reads.
#[derive(Debug, Clone)]
pub struct Nav {
    /// Page title.
    pub title: String,
    /// Which top-level section is active (`jobs`, `files`, `keys`).
    pub active: &'static str,
    /// Whether a user is signed in (shows the menu and sign-out).
    pub signed_in: bool,
}

impl Nav {
    /// Navigation of a signed-in page.
    pub fn new(title: impl Into<String>, active: &'static str) -> Nav {
        Nav { title: title.into(), active, signed_in: true }
    }
}

/// A page failure shown as HTML.
#[derive(Debug)]
pub struct WebError(pub ApiError);

impl From<ApiError> for WebError {
    fn from(error: ApiError) -> WebError {
        WebError(error)
    }
}

impl From<sqlx::Error> for WebError {
    fn from(error: sqlx::Error) -> WebError {
        WebError(error.into())
    }
}

/// The error page.
#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    nav: Nav,
    status: u16,
    message: String,
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        let page = ErrorPage {
            nav: Nav::new("Error", ""),
            status: status.as_u16(),
            message: self.0.message.clone(),
        };
        let mut response = render(&page);
        if response.status() == StatusCode::OK {
            *response.status_mut() = status;
        }
        if let Some(seconds) = self.0.retry_after {
            if let Ok(value) = seconds.to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// Result of page handlers.
pub type WebResult<T> = Result<T, WebError>;

/// Renders a template as an HTML response.
pub fn render<T: Template>(template: &T) -> Response {
    match template.render() {
        Ok(html) => ([(header::CACHE_CONTROL, "no-store")], Html(html)).into_response(),
        Err(error) => {
            tracing::error!(%error, "template rendering failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "page rendering failed").into_response()
        }
    }
}

/// Embeds a JSON document in a `<script type="application/json">` element safely.
pub fn script_json(value: &serde_json::Value) -> String {
    value.to_string().replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026")
}

/// A Unix-seconds time as `YYYY-MM-DD HH:MM` UTC.
pub fn when(time: chrono::DateTime<chrono::Utc>) -> String {
    time.format("%Y-%m-%d %H:%M").to_string()
}

/// What answers a path no route has: the HTML 404 page for a browser outside `/v1/`, the JSON
/// error otherwise.
pub async fn fallback(headers: axum::http::HeaderMap, uri: axum::http::Uri) -> Response {
    let error = ApiError::not_found("route", "this path");
    let html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    if html && !uri.path().starts_with("/v1/") {
        WebError(error).into_response()
    } else {
        error.into_response()
    }
}
