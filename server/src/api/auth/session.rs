//! The dashboard's session: a random session id in an HttpOnly, SameSite=Strict cookie (and
//! `Secure` when the public URL is https), backed by a row (`verity_core::sessions`) that
//! signing out revokes; accepted wherever a bearer credential is, and a guard refusing
//! cross-origin writes made with it. Every request re-reads the session with its user's and
//! key's current state, so a revoked key, a demoted or deleted user, or a sign-out takes effect
//! at the next request.

use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::keys;
use super::routes::SignedIn;
use super::{Principal, Via};
use crate::api::error::ApiError;
use crate::api::state::AppState;

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

/// `Set-Cookie` value holding session id `id` for `max_age_secs` (`Secure` when `secure`).
pub fn session_cookie(id: &str, max_age_secs: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{secure}"
    )
}

/// `Set-Cookie` value that removes the session.
pub fn clear_cookie(secure: bool) -> String {
    session_cookie("", 0, secure)
}

/// Characters of a session id after its `vs-` prefix (about 238 random bits).
const SESSION_ID_LEN: usize = 40;

/// The stored form of session id `id`: its SHA-256 (a leaked table opens no session).
fn id_hash(id: &str) -> [u8; 32] {
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&Sha256::digest(id.as_bytes()));
    digest
}

/// Opens a session for whoever just signed in, valid for the token lifetime; returns its id.
pub async fn open_session(state: &AppState, signed_in: &SignedIn) -> Result<String, ApiError> {
    let id = format!("vs-{}", keys::random_chars(SESSION_ID_LEN));
    let ttl = chrono::Duration::from_std(state.tokens.ttl())
        .map_err(|e| ApiError::internal("session lifetime", e))?;
    verity_core::sessions::create_session(
        &state.pool,
        &id_hash(&id),
        signed_in.user_id,
        signed_in.key_id,
        chrono::Utc::now() + ttl,
    )
    .await?;
    Ok(id)
}

/// The principal of session `id` as it stands now: 401 when the session is unknown, signed out
/// or expired, its user deleted, or its key revoked or expired.
pub async fn authenticate_session(state: &AppState, id: &str) -> Result<Principal, ApiError> {
    let session = verity_core::sessions::find_session(&state.pool, &id_hash(id))
        .await?
        .ok_or_else(|| ApiError::unauthorized("no such session (signed out or expired)"))?;
    if session.key_revoked {
        return Err(ApiError::unauthorized("this API key was revoked"));
    }
    if let Some(at) = session.key_expires_at.filter(|at| *at <= chrono::Utc::now()) {
        return Err(super::expired(at));
    }
    let role = session.role.parse().map_err(|e| ApiError::internal("session role", e))?;
    Ok(Principal {
        user_id: session.user_id,
        org_id: session.org_id,
        role,
        key_id: session.key_id,
        via: match session.key_id {
            Some(_) => Via::ApiKey,
            None => Via::PasswordToken { issued_at: session.created_at.timestamp() },
        },
    })
}

/// Revokes session `id` (signing out); false when it was not live.
pub async fn close_session(state: &AppState, id: &str) -> Result<bool, ApiError> {
    Ok(verity_core::sessions::revoke_session(&state.pool, &id_hash(id)).await?)
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
