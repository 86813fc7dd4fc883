//! The dashboard's session: an access token in an HttpOnly, SameSite=Strict cookie, accepted
//! wherever a bearer credential is, and a guard refusing cross-origin writes made with it.

use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "verity_session";

/// The session token carried by the request's cookies, if any.
pub fn session_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
}

/// `Set-Cookie` value holding `token` for `max_age_secs`.
pub fn session_cookie(token: &str, max_age_secs: u64) -> String {
    format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}")
}

/// `Set-Cookie` value that removes the session.
pub fn clear_cookie() -> String {
    format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// True unless the browser says the request came from another site: `Sec-Fetch-Site` must be
/// `same-origin` or `none`; without it, `Origin` must name the `Host`; with neither (not a
/// browser), the request is allowed.
pub fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return matches!(site, "same-origin" | "none");
    }
    let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) else { return true };
    let host = headers.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, rest)| rest).unwrap_or("");
    !host.is_empty() && origin_host == host
}

/// Refuses (403) state-changing requests from another origin that would act with the session
/// cookie, or that target the dashboard (its sign-in included).
pub async fn guard(request: Request, next: Next) -> Response {
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let headers = request.headers();
    let uses_cookie = headers.get(AUTHORIZATION).is_none()
        && (session_token(headers).is_some() || !request.uri().path().starts_with("/v1/"));
    if !safe && uses_cookie && !same_origin(headers) {
        tracing::warn!(path = %request.uri().path(), "cross-origin write refused");
        return (StatusCode::FORBIDDEN, "cross-origin request refused").into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cookie_and_judges_origins() {
        let mut headers = HeaderMap::new();
        headers.insert(COOKIE, "a=b; verity_session=tok; c=d".parse().unwrap());
        assert_eq!(session_token(&headers), Some("tok"));
        headers.insert(HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert(ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert(ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&headers));
        headers.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(same_origin(&headers));
        headers.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(!same_origin(&headers));
    }
}
