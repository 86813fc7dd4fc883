//! Sign in (API key, or e-mail and password; throttled like `/v1/auth/token`) and sign out.

use super::page::{render, Nav};
use crate::api::auth::routes::{sign_in, TokenRequest};
use crate::api::auth::session::{clear_cookie, session_cookie};
use crate::api::auth::throttle::client_ip;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Query, State};
use axum::http::{header, Extensions, StatusCode};
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
    Form(form): Form<LoginForm>,
) -> Response {
    let next = safe_next(form.next.as_deref());
    let api_key = non_empty(form.api_key);
    let email = non_empty(form.email);
    let request = match api_key.clone() {
        Some(key) => TokenRequest { email: None, password: None, api_key: Some(key) },
        None => TokenRequest {
            email: email.clone(),
            password: form.password.filter(|p| !p.is_empty()),
            api_key: None,
        },
    };
    let ip = client_ip(&extensions);
    let outcome = sign_in(&state, request, ip.as_deref()).await;
    // Signed in with a key: the session carries the key itself, so revoking the key ends the
    // session at once. With a password: a minted token that expires.
    let minted = outcome.and_then(|signed_in| match api_key {
        Some(key) => Ok(key),
        None => state
            .tokens
            .mint(signed_in.user_id, signed_in.org_id, signed_in.role, None)
            .map_err(|e| crate::api::error::ApiError::internal("minting token", e)),
    });
    match minted {
        Ok(token) => {
            let cookie = session_cookie(&token, state.tokens.ttl().as_secs());
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

async fn logout() -> Response {
    ([(header::SET_COOKIE, clear_cookie())], Redirect::to("/login")).into_response()
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
