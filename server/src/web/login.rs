//! Sign in (API key, or e-mail and password; throttled like `/v1/auth/token`) and sign out.

use super::page::{render, Nav};
use crate::api::auth::routes::{sign_in, TokenRequest};
use crate::api::auth::session::{
    clear_cookie, close_session, open_session, session_cookie, session_token,
};
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Query, State};
use axum::http::{header, Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/login", get(login_page).post(login)).route("/logout", post(logout))
}

/// The sign-in page.
#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    nav: Nav,
    next: String,
    error: Option<String>,
    email: String,
}

/// `?next=` of the sign-in page.
#[derive(Debug, Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

/// Where a refused `next` leads: the dashboard's first page.
const DEFAULT_NEXT: &str = "/jobs";

/// Only same-origin absolute paths are followed after sign-in: one leading `/` (not `//`), no
/// backslash, whitespace or control character (a tab or newline could make `/\t/evil.example`
/// another host, or break the header). Anything else leads to [`DEFAULT_NEXT`].
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.chars().any(|c| c == '\\' || c.is_control() || c.is_whitespace()) =>
        {
            n.to_string()
        }
        _ => DEFAULT_NEXT.to_string(),
    }
}

fn page(next: String, error: Option<String>, email: String) -> LoginPage {
    LoginPage {
        nav: Nav { title: "Sign in".into(), active: "", signed_in: false },
        next,
        error,
        email,
    }
}

async fn login_page(Query(query): Query<NextQuery>) -> Response {
    render(&page(safe_next(query.next.as_deref()), None, String::new()))
}

/// The sign-in form.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    api_key: Option<String>,
    email: Option<String>,
    password: Option<String>,
    next: Option<String>,
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

async fn login(
    State(state): State<AppState>,
    extensions: Extensions,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let next = safe_next(form.next.as_deref());
    let api_key = non_empty(form.api_key);
    let email = non_empty(form.email);
    let request = match api_key {
        Some(key) => TokenRequest { email: None, password: None, api_key: Some(key) },
        None => TokenRequest {
            email: email.clone(),
            password: form.password.filter(|p| !p.is_empty()),
            api_key: None,
        },
    };
    let addr = state.trusted_proxies.client_addr(&extensions, &headers);
    // The cookie holds a random session id, never the key: its row names the user and the key,
    // whose current state every request reads (so revoking the key ends the session at once).
    let opened = match sign_in(&state, request, addr).await {
        Ok(signed_in) => open_session(&state, &signed_in).await,
        Err(error) => Err(error),
    };
    match opened {
        Ok((id, max_age)) => {
            let cookie = session_cookie(&id, max_age, state.secure_cookies);
            ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
        }
        Err(error) => {
            let mut response =
                render(&page(next, Some(error.message.clone()), email.unwrap_or_default()));
            *response.status_mut() = if error.status == StatusCode::BAD_REQUEST {
                StatusCode::UNAUTHORIZED
            } else {
                error.status
            };
            if let Some(seconds) = error.retry_after {
                if let Ok(value) = seconds.to_string().parse() {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
            }
            response
        }
    }
}

/// Signs out: revokes the session's row (the old cookie stops working everywhere) and drops
/// the cookie.
async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(id) = session_token(&headers) {
        if let Err(error) = close_session(&state, id).await {
            tracing::error!(message = %error.message, "could not revoke a session at sign-out");
        }
    }
    let cookie = clear_cookie(state.secure_cookies);
    ([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn next_is_a_same_origin_path_or_the_default() {
        for ok in ["/jobs", "/jobs/ftjob-1?tab=metrics", "/", "/a%09b"] {
            assert_eq!(safe_next(Some(ok)), ok);
        }
        for refused in [
            "/\t/evil.example",
            "/\n/evil.example",
            "/x\r\nset-cookie: a=b",
            "//evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "https://evil.example",
            "evil.example",
            "/ /evil.example",
            "/\u{0}",
            "",
        ] {
            assert_eq!(safe_next(Some(refused)), "/jobs", "{refused:?}");
        }
        assert_eq!(safe_next(None), "/jobs");
    }
}
