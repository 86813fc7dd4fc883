//! The dashboard's session: a random session id in an HttpOnly, SameSite=Strict cookie (and
//! `Secure` when the public URL is https), backed by a row (`verity_core::sessions`) that
//! signing out revokes; accepted wherever a bearer credential is, and a guard refusing
//! cross-origin writes made with it. Every request re-reads the session with its user's and
//! key's current state, so a revoked key, a demoted or deleted user, or a sign-out takes effect
//! at the next request. Activity renews a session (sliding expiry, up to a maximum from
//! sign-in): the row at most about once a minute, the cookie's `Max-Age` with it.

use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// How long dashboard sessions last: `idle` after the last request (the token lifetime,
/// `VERITY_TOKEN_TTL_SECONDS`), and never more than `max` after signing in
/// (`VERITY_SESSION_MAX_HOURS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    /// Lifetime without activity; each request moves the expiry to this far ahead.
    pub idle: Duration,
    /// Longest lifetime from sign-in, whatever the activity.
    pub max: Duration,
}

/// The longest wait between two renewals of an active session (each renewal is a write).
const RENEW_AT_MOST_EVERY: Duration = Duration::from_secs(60);

fn delta(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or_else(|_| chrono::Duration::days(366))
}

impl SessionPolicy {
    /// The expiry of a session opened `now`.
    pub fn first_expiry(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + delta(self.idle.min(self.max))
    }

    /// The expiry a session opened at `created_at`, expiring at `expires_at`, gets from a
    /// request at `now`: `now + idle`, capped at `created_at + max`; `None` when that moves it
    /// by less than a minute (or a quarter of `idle`, when shorter), so that an active session
    /// is written at most about once a minute.
    pub fn renewal(
        &self,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let target = (now + delta(self.idle)).min(created_at + delta(self.max));
        let step =
            delta((self.idle / 4).min(RENEW_AT_MOST_EVERY)).max(chrono::Duration::seconds(1));
        (target - expires_at >= step).then_some(target)
    }
}

/// Where a request's session renewal leaves its new cookie, for [`renew_cookie`] to send with
/// the response (the extractors that authenticate a session fill it).
#[derive(Debug, Clone, Default)]
pub struct RenewalSlot(Arc<Mutex<Option<String>>>);

impl RenewalSlot {
    fn put(&self, cookie: String) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(cookie);
    }

    fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Sends the cookie of a session the request renewed (see [`RenewalSlot`]) with its response,
/// unless the response sets the session cookie itself (sign-in, sign-out).
pub async fn renew_cookie(mut request: Request, next: Next) -> Response {
    let slot = RenewalSlot::default();
    request.extensions_mut().insert(slot.clone());
    let mut response = next.run(request).await;
    if let Some(cookie) = slot.take() {
        let prefix = format!("{SESSION_COOKIE}=");
        let sets_own = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.starts_with(&prefix)));
        if let (false, Ok(value)) = (sets_own, HeaderValue::from_str(&cookie)) {
            response.headers_mut().append(SET_COOKIE, value);
        }
    }
    response
}

/// Opens a session for whoever just signed in (expiring after the idle lifetime); returns its
/// id and its lifetime in seconds, the cookie's `Max-Age`.
pub async fn open_session(
    state: &AppState,
    signed_in: &SignedIn,
) -> Result<(String, u64), ApiError> {
    let id = format!("vs-{}", keys::random_chars(SESSION_ID_LEN));
    let now = chrono::Utc::now();
    let expires_at = state.sessions.first_expiry(now);
    verity_core::sessions::create_session(
        &state.pool,
        &id_hash(&id),
        signed_in.user_id,
        signed_in.key_id,
        expires_at,
    )
    .await?;
    Ok((id, seconds_until(expires_at, now)))
}

/// Whole seconds from `now` to `at` (0 when past).
fn seconds_until(at: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    u64::try_from((at - now).num_seconds()).unwrap_or(0)
}

/// The principal of session `id` as it stands now: 401 when the session is unknown, signed out
/// or expired, its user deleted, or its key revoked or expired. An active session is renewed
/// (see [`SessionPolicy::renewal`]); its new cookie goes into `renewal` when given.
pub async fn authenticate_session(
    state: &AppState,
    id: &str,
    renewal: Option<&RenewalSlot>,
) -> Result<Principal, ApiError> {
    let hash = id_hash(id);
    let session = verity_core::sessions::find_session(&state.pool, &hash)
        .await?
        .ok_or_else(|| ApiError::unauthorized("no such session (signed out or expired)"))?;
    if session.key_revoked {
        return Err(ApiError::unauthorized("this API key was revoked"));
    }
    let now = chrono::Utc::now();
    if let Some(at) = session.key_expires_at.filter(|at| *at <= now) {
        return Err(super::expired(at));
    }
    if let Some(expires_at) = state.sessions.renewal(session.created_at, session.expires_at, now) {
        match verity_core::sessions::renew_session(&state.pool, &hash, expires_at).await {
            Ok(true) => {
                let max_age = seconds_until(expires_at, now);
                if let Some(slot) = renewal {
                    slot.put(session_cookie(id, max_age, state.secure_cookies));
                }
            }
            Ok(false) => {}
            // The session still holds until its current expiry; the next request tries again.
            Err(error) => tracing::warn!(%error, "could not renew a session"),
        }
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
    fn activity_slides_the_expiry_up_to_the_maximum_writing_at_most_once_a_minute() {
        let policy =
            SessionPolicy { idle: Duration::from_secs(900), max: Duration::from_secs(12 * 3600) };
        let opened = DateTime::from_timestamp(1_000_000, 0).unwrap();
        let first = policy.first_expiry(opened);
        assert_eq!(first, opened + chrono::Duration::seconds(900));
        let at = |s: i64| opened + chrono::Duration::seconds(s);
        // Within the first minute: nothing to write.
        assert_eq!(policy.renewal(opened, first, at(59)), None);
        // A minute later: 15 minutes from now.
        assert_eq!(policy.renewal(opened, first, at(60)), Some(at(960)));
        // Near the maximum: capped at 12 h from sign-in, then never renewed again.
        let late = at(12 * 3600 - 300);
        assert_eq!(policy.renewal(opened, at(12 * 3600 - 400), late), Some(at(12 * 3600)));
        assert_eq!(policy.renewal(opened, at(12 * 3600), late), None);
        // A short idle lifetime renews after a quarter of it.
        let short = SessionPolicy { idle: Duration::from_secs(8), max: Duration::from_secs(60) };
        assert_eq!(short.renewal(opened, at(8), at(1)), None);
        assert_eq!(short.renewal(opened, at(8), at(2)), Some(at(10)));
    }

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
