//! Authentication (API keys and JWTs behind `Authorization: Bearer`), roles and rate limits.

pub mod api_keys;
pub mod keys;
pub mod ratelimit;
pub mod routes;
pub mod session;
pub mod throttle;
pub mod tokens;

use super::error::ApiError;
use super::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;
use verity_core::tenancy::Role;

/// Who is calling.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The user.
    pub user_id: Uuid,
    /// Their org: every resource the request touches must belong to it.
    pub org_id: Uuid,
    /// Their role.
    pub role: Role,
    /// The API key used, when not a JWT.
    pub key_id: Option<Uuid>,
}

impl Principal {
    /// Fails with 403 unless the caller is an org admin.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Member => Err(ApiError::forbidden("this operation needs the admin role")),
        }
    }

    /// The rate-limit bucket of this credential.
    fn bucket(&self) -> String {
        match self.key_id {
            Some(key) => format!("key:{key}"),
            None => format!("user:{}", self.user_id),
        }
    }
}

/// Verified API keys, remembered briefly so that argon2 runs once per key and interval.
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: Mutex<HashMap<[u8; 32], (Principal, Instant)>>,
}

/// How long a verified key is trusted without re-reading its row (revocation delay).
const KEY_CACHE_TTL: Duration = Duration::from_secs(30);

impl KeyCache {
    fn get(&self, digest: &[u8; 32]) -> Option<Principal> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(digest).filter(|(_, at)| at.elapsed() < KEY_CACHE_TTL).map(|(p, _)| p.clone())
    }

    fn put(&self, digest: [u8; 32], principal: Principal) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, (_, at)| at.elapsed() < KEY_CACHE_TTL);
        entries.insert(digest, (principal, Instant::now()));
    }

    /// Forgets key `key_id`, so that its next use re-reads its row (e.g. after a revoke).
    pub fn evict_key(&self, key_id: uuid::Uuid) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, (principal, _)| principal.key_id != Some(key_id));
    }
}

/// Checks an API key against its stored hash.
pub async fn authenticate_key(state: &AppState, key: &str) -> Result<Principal, ApiError> {
    let invalid = || ApiError::unauthorized("invalid API key");
    let lookup = keys::lookup_of(key).ok_or_else(invalid)?;
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&Sha256::digest(key.as_bytes()));
    if let Some(principal) = state.key_cache.get(&digest) {
        return Ok(principal);
    }
    let record = verity_core::tenancy::find_api_key(&state.pool, lookup)
        .await
        .map_err(|e| ApiError::internal("api key lookup", e))?
        .ok_or_else(invalid)?;
    if record.revoked_at.is_some() {
        return Err(ApiError::unauthorized("this API key was revoked"));
    }
    let (secret, hash) = (key.to_string(), record.key_hash.clone());
    let matches = tokio::task::spawn_blocking(move || keys::verify_secret(&secret, &hash))
        .await
        .map_err(|e| ApiError::internal("api key verification", e))?;
    if !matches {
        return Err(invalid());
    }
    let role = record.role.parse().map_err(|e| ApiError::internal("api key role", e))?;
    let principal =
        Principal { user_id: record.user_id, org_id: record.org_id, role, key_id: Some(record.id) };
    if let Err(error) = verity_core::tenancy::touch_api_key(&state.pool, record.id).await {
        tracing::warn!(%error, "could not record the API key's last use");
    }
    state.key_cache.put(digest, principal.clone());
    Ok(principal)
}

/// The principal behind a credential: an API key (`vt-…`) or a token minted by this server.
pub async fn authenticate(state: &AppState, credential: &str) -> Result<Principal, ApiError> {
    if credential.starts_with(keys::KEY_PREFIX) {
        authenticate_key(state, credential).await
    } else {
        let claims =
            state.tokens.verify(credential).map_err(|e| ApiError::unauthorized(e.to_string()))?;
        Ok(Principal { user_id: claims.sub, org_id: claims.org, role: claims.role, key_id: None })
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Principal, ApiError> {
        let credential = match parts.headers.get(AUTHORIZATION) {
            Some(header) => {
                let header = header
                    .to_str()
                    .map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
                header
                    .strip_prefix("Bearer ")
                    .or_else(|| header.strip_prefix("bearer "))
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| {
                        ApiError::unauthorized("expected Authorization: Bearer <API key or token>")
                    })?
            }
            // The dashboard's session cookie (cross-origin writes are refused by `session::guard`).
            None => session::session_token(&parts.headers)
                .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer header"))?,
        };
        let principal = authenticate(state, credential).await?;
        state.limiter.check(&principal.bucket()).map_err(ApiError::rate_limited)?;
        Ok(principal)
    }
}
