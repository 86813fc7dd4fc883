//! Authentication (API keys and JWTs behind `Authorization: Bearer`), roles and rate limits.

pub mod api_keys;
pub mod client;
pub mod hashing;
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
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;
use verity_core::tenancy::{KeyRevocation, Role};

/// Who is calling.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The user.
    pub user_id: Uuid,
    /// Their org: every resource the request touches must belong to it.
    pub org_id: Uuid,
    /// Their role.
    pub role: Role,
    /// The API key behind the credential: sent as is, or the one a token was minted from.
    pub key_id: Option<Uuid>,
    /// How the caller signed in.
    pub via: Via,
}

/// How a caller proved who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An API key, sent as is or through a dashboard session opened with it (which ends with
    /// the key).
    ApiKey,
    /// A token minted from an API key: it dies with the key.
    KeyToken,
    /// A token minted from (or a dashboard session opened by) an e-mail and password sign-in at
    /// `issued_at` (Unix seconds).
    PasswordToken {
        /// When the password was checked.
        issued_at: i64,
    },
}

/// How recent a password sign-in must be for its token to create API keys.
pub const FRESH_LOGIN: Duration = Duration::from_secs(5 * 60);

impl Principal {
    /// Fails with 403 unless the caller is an org admin.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Member => Err(ApiError::forbidden("this operation needs the admin role")),
        }
    }

    /// Fails with 403 unless the credential may create API keys: an API key, or a token from a
    /// password sign-in at most [`FRESH_LOGIN`] old. A token minted from a key may not (else a
    /// leaked key's token would outlive the key through the keys it made).
    pub fn require_key_minting(&self) -> Result<(), ApiError> {
        match self.via {
            Via::ApiKey => Ok(()),
            Via::KeyToken => Err(ApiError::forbidden(
                "a token minted from an API key cannot create API keys: use the key itself, or sign in with your password",
            )),
            Via::PasswordToken { issued_at } => {
                // A minute of clock skew between replicas is tolerated.
                let age = chrono::Utc::now().timestamp().saturating_sub(issued_at);
                if (-60..=FRESH_LOGIN.as_secs() as i64).contains(&age) {
                    Ok(())
                } else {
                    Err(ApiError::forbidden(format!(
                        "creating an API key needs a recent sign-in (within {} minutes): sign in with your password again",
                        FRESH_LOGIN.as_secs() / 60
                    )))
                }
            }
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

/// Verified API keys, the keys known to be unrevoked and users' current roles, remembered
/// briefly so that argon2 and the lookups run once per key (or user) and interval. The unrevoked
/// verdicts and roles are trusted only while the revocation listener is subscribed
/// ([`AppState::start_key_revocation_listener`]): every server then evicts a revoked key, or a
/// changed or deleted user, at once; without it each use reads the rows.
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: Mutex<HashMap<[u8; 32], (Principal, Instant)>>,
    live: Mutex<HashMap<Uuid, Instant>>,
    roles: Mutex<HashMap<Uuid, (Role, Instant)>>,
    listening: AtomicBool,
    /// Bumped by every eviction: a verdict read before one is not cached after it.
    evictions: AtomicU64,
}

/// How long a verified key, or a key's unrevoked verdict, is kept.
const KEY_CACHE_TTL: Duration = Duration::from_secs(30);

impl KeyCache {
    fn get(&self, digest: &[u8; 32]) -> Option<Principal> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(digest).filter(|(_, at)| at.elapsed() < KEY_CACHE_TTL).map(|(p, _)| p.clone())
    }

    fn put(&self, digest: [u8; 32], principal: Principal, generation: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if self.evictions.load(Ordering::SeqCst) != generation {
            return;
        }
        entries.retain(|_, (_, at)| at.elapsed() < KEY_CACHE_TTL);
        entries.insert(digest, (principal, Instant::now()));
    }

    fn known_live(&self, key_id: Uuid) -> bool {
        if !self.listening.load(Ordering::SeqCst) {
            return false;
        }
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.get(&key_id).is_some_and(|at| at.elapsed() < KEY_CACHE_TTL)
    }

    fn put_live(&self, key_id: Uuid, generation: u64) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if !self.listening.load(Ordering::SeqCst)
            || self.evictions.load(Ordering::SeqCst) != generation
        {
            return;
        }
        live.retain(|_, at| at.elapsed() < KEY_CACHE_TTL);
        live.insert(key_id, Instant::now());
    }

    fn known_role(&self, user_id: Uuid) -> Option<Role> {
        if !self.listening.load(Ordering::SeqCst) {
            return None;
        }
        let roles = self.roles.lock().unwrap_or_else(|p| p.into_inner());
        roles.get(&user_id).filter(|(_, at)| at.elapsed() < KEY_CACHE_TTL).map(|(r, _)| *r)
    }

    fn put_role(&self, user_id: Uuid, role: Role, generation: u64) {
        let mut roles = self.roles.lock().unwrap_or_else(|p| p.into_inner());
        if !self.listening.load(Ordering::SeqCst)
            || self.evictions.load(Ordering::SeqCst) != generation
        {
            return;
        }
        roles.retain(|_, (_, at)| at.elapsed() < KEY_CACHE_TTL);
        roles.insert(user_id, (role, Instant::now()));
    }

    /// Forgets everything about user `user_id`: their verified keys, their role, and every
    /// unrevoked verdict (a deleted user's keys are deleted with them).
    pub fn evict_user(&self, user_id: Uuid) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut roles = self.roles.lock().unwrap_or_else(|p| p.into_inner());
        self.evictions.fetch_add(1, Ordering::SeqCst);
        entries.retain(|_, (principal, _)| principal.user_id != user_id);
        live.clear();
        roles.remove(&user_id);
    }

    fn generation(&self) -> u64 {
        self.evictions.load(Ordering::SeqCst)
    }

    /// Forgets key `key_id`, so that its next use re-reads its row (e.g. after a revoke).
    pub fn evict_key(&self, key_id: Uuid) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        self.evictions.fetch_add(1, Ordering::SeqCst);
        entries.retain(|_, (principal, _)| principal.key_id != Some(key_id));
        live.remove(&key_id);
    }

    /// Forgets every key.
    pub fn clear(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut roles = self.roles.lock().unwrap_or_else(|p| p.into_inner());
        self.evictions.fetch_add(1, Ordering::SeqCst);
        entries.clear();
        live.clear();
        roles.clear();
    }

    /// Acts on what the revocation listener learnt.
    pub fn apply(&self, event: KeyRevocation) {
        match event {
            KeyRevocation::Revoked(key_id) => self.evict_key(key_id),
            KeyRevocation::UserChanged(user_id) => self.evict_user(user_id),
            KeyRevocation::Lost => {
                self.listening.store(false, Ordering::SeqCst);
                self.clear();
            }
            KeyRevocation::Subscribed => {
                self.clear();
                self.listening.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// Whether a key that expires at `expires_at` may be cached: only while it stays valid for a
/// whole [`KEY_CACHE_TTL`], so that no cached verdict outlives the expiry.
fn cacheable_until(expires_at: Option<chrono::DateTime<chrono::Utc>>) -> bool {
    let ttl = chrono::Duration::from_std(KEY_CACHE_TTL).unwrap_or_default();
    expires_at.is_none_or(|at| at > chrono::Utc::now() + ttl)
}

/// The 401 of a key that expired at `at`.
fn expired(at: chrono::DateTime<chrono::Utc>) -> ApiError {
    ApiError::unauthorized(format!("this API key expired at {}", at.format("%Y-%m-%d %H:%M UTC")))
}

/// Fails with 401 unless API key `key_id` exists, is not revoked and has not expired (a cached
/// verdict while the revocation listener runs, else the key's row).
pub async fn require_live_key(state: &AppState, key_id: Uuid) -> Result<(), ApiError> {
    if state.key_cache.known_live(key_id) {
        return Ok(());
    }
    let generation = state.key_cache.generation();
    let live = verity_core::tenancy::api_key_live(&state.pool, key_id)
        .await
        .map_err(|e| ApiError::tenancy("api key lookup", e))?;
    match live {
        Some(key) if key.revoked => Err(ApiError::unauthorized("this API key was revoked")),
        Some(key) if !key.usable_at(chrono::Utc::now()) => {
            Err(expired(key.expires_at.unwrap_or_default()))
        }
        Some(key) => {
            if cacheable_until(key.expires_at) {
                state.key_cache.put_live(key_id, generation);
            }
            Ok(())
        }
        None => Err(ApiError::unauthorized("this API key no longer exists")),
    }
}

/// The current role of user `user_id` (a cached verdict while the listener runs, else the
/// user's row); 401 when the user no longer exists.
async fn current_role(state: &AppState, user_id: Uuid) -> Result<Role, ApiError> {
    if let Some(role) = state.key_cache.known_role(user_id) {
        return Ok(role);
    }
    let generation = state.key_cache.generation();
    let user = verity_core::tenancy::find_user_by_id(&state.pool, user_id)
        .await
        .map_err(|e| ApiError::tenancy("user lookup", e))?
        .ok_or_else(|| ApiError::unauthorized("the signed-in user no longer exists"))?;
    let role: Role = user.role.parse().map_err(|e| ApiError::internal("user role", e))?;
    state.key_cache.put_role(user_id, role, generation);
    Ok(role)
}

/// `principal` with its role capped by its user's current one, so that a demoted or deleted
/// user loses their role at their next request whatever credential they hold (401 when the
/// user no longer exists).
pub async fn cap_role(state: &AppState, mut principal: Principal) -> Result<Principal, ApiError> {
    if current_role(state, principal.user_id).await? == Role::Member {
        principal.role = Role::Member;
    }
    Ok(principal)
}

/// The 429 of a credential check refused by the sign-in throttle.
pub fn throttled(retry_after: throttle::RetryAfter) -> ApiError {
    ApiError {
        message: "too many failed or pending sign-in attempts from this address; retry later"
            .into(),
        ..ApiError::rate_limited(retry_after)
    }
}

/// Checks an API key against its stored hash. A key not verified recently costs a hash, so the
/// check is first reserved with the sign-in throttle for the key's prefix and `addr` (an
/// unknown prefix is counted as a failure too).
pub async fn authenticate_key(
    state: &AppState,
    key: &str,
    addr: Option<IpAddr>,
) -> Result<Principal, ApiError> {
    let invalid = || ApiError::unauthorized("invalid API key");
    let lookup = keys::lookup_of(key).ok_or_else(invalid)?;
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&Sha256::digest(key.as_bytes()));
    if let Some(principal) = state.key_cache.get(&digest) {
        if let Some(key_id) = principal.key_id {
            require_live_key(state, key_id).await?;
        }
        return cap_role(state, principal).await;
    }
    let account = format!("key:{lookup}");
    let generation = state.key_cache.generation();
    let record = verity_core::tenancy::find_api_key(&state.pool, lookup)
        .await
        .map_err(|e| ApiError::tenancy("api key lookup", e))?;
    let Some(record) = record else {
        // No hash to run, but a guess all the same: counted against the address.
        state.auth_throttle.reserve(&account, addr).map_err(throttled)?.failed();
        return Err(invalid());
    };
    // A revoked or expired key is a stale credential, not a guess: refused without a hash.
    if record.revoked_at.is_some() {
        return Err(ApiError::unauthorized("this API key was revoked"));
    }
    if let Some(at) = record.expires_at.filter(|at| *at <= chrono::Utc::now()) {
        return Err(expired(at));
    }
    let attempt = state.auth_throttle.reserve(&account, addr).map_err(throttled)?;
    if !state.hasher.verify(key.to_string(), Some(record.key_hash.clone())).await? {
        attempt.failed();
        return Err(invalid());
    }
    attempt.succeeded();
    let role = record.role.parse().map_err(|e| ApiError::internal("api key role", e))?;
    let principal = Principal {
        user_id: record.user_id,
        org_id: record.org_id,
        role,
        key_id: Some(record.id),
        via: Via::ApiKey,
    };
    if let Err(error) = verity_core::tenancy::touch_api_key(&state.pool, record.id).await {
        tracing::warn!(%error, "could not record the API key's last use");
    }
    if cacheable_until(record.expires_at) {
        state.key_cache.put(digest, principal.clone(), generation);
    }
    Ok(principal)
}

/// The principal behind a credential: an API key (`vt-…`) or a token minted by this server;
/// a token minted from a key is refused once that key is revoked. `addr` is the client's
/// address, for the sign-in throttle.
pub async fn authenticate(
    state: &AppState,
    credential: &str,
    addr: Option<IpAddr>,
) -> Result<Principal, ApiError> {
    if credential.starts_with(keys::KEY_PREFIX) {
        return authenticate_key(state, credential, addr).await;
    }
    let claims =
        state.tokens.verify(credential).map_err(|e| ApiError::unauthorized(e.to_string()))?;
    let via = match claims.kid {
        Some(key_id) => {
            require_live_key(state, key_id).await.map_err(|e| match e.status {
                axum::http::StatusCode::UNAUTHORIZED => ApiError::unauthorized(format!(
                    "invalid access token: minted from an API key that no longer works ({})",
                    e.message
                )),
                _ => e,
            })?;
            Via::KeyToken
        }
        None => Via::PasswordToken { issued_at: claims.iat },
    };
    let principal = Principal {
        user_id: claims.sub,
        org_id: claims.org,
        role: claims.role,
        key_id: claims.kid,
        via,
    };
    cap_role(state, principal).await
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
            // The Tinker SDK's header: a key in its `tml-` form (the same key behind the prefix)
            // or a token.
            None if parts.headers.contains_key(TINKER_KEY_HEADER) => {
                let header = parts.headers[TINKER_KEY_HEADER]
                    .to_str()
                    .map_err(|_| ApiError::unauthorized("malformed X-API-Key header"))?
                    .trim();
                let credential = header.strip_prefix(TINKER_KEY_PREFIX).unwrap_or(header);
                if credential.is_empty() {
                    return Err(ApiError::unauthorized("empty X-API-Key header"));
                }
                credential
            }
            // The dashboard's session cookie (cross-origin writes are refused by `session::guard`).
            None => {
                let id = session::session_token(&parts.headers).ok_or_else(|| {
                    ApiError::unauthorized("missing Authorization: Bearer header")
                })?;
                let renewal = parts.extensions.get::<session::RenewalSlot>();
                let principal = session::authenticate_session(state, id, renewal).await?;
                state.limiter.check(&principal.bucket()).map_err(ApiError::rate_limited)?;
                return Ok(principal);
            }
        };
        let addr = state.trusted_proxies.client_addr(&parts.extensions, &parts.headers);
        let principal = authenticate(state, credential, addr).await?;
        state.limiter.check(&principal.bucket()).map_err(ApiError::rate_limited)?;
        Ok(principal)
    }
}

/// The header the Tinker SDK sends its credential in.
pub const TINKER_KEY_HEADER: &str = "x-api-key";

/// The prefix the Tinker SDK requires of a key that is not a JWT: `tml-` followed by a Verity
/// key is that key.
pub const TINKER_KEY_PREFIX: &str = "tml-";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_user_is_forgotten_with_their_keys() {
        let cache = KeyCache::default();
        cache.apply(KeyRevocation::Subscribed);
        let (user, key) = (Uuid::new_v4(), Uuid::new_v4());
        let principal = Principal {
            user_id: user,
            org_id: Uuid::new_v4(),
            role: Role::Admin,
            key_id: Some(key),
            via: Via::ApiKey,
        };
        let generation = cache.generation();
        cache.put([1; 32], principal, generation);
        cache.put_live(key, generation);
        cache.put_role(user, Role::Admin, generation);
        assert!(cache.get(&[1; 32]).is_some() && cache.known_live(key));
        assert_eq!(cache.known_role(user), Some(Role::Admin));
        cache.apply(KeyRevocation::UserChanged(user));
        assert!(cache.get(&[1; 32]).is_none());
        assert!(!cache.known_live(key), "a deleted user's keys are deleted too");
        assert_eq!(cache.known_role(user), None);
        // A verdict read before the change is not cached after it.
        cache.put_role(user, Role::Admin, generation);
        assert_eq!(cache.known_role(user), None);
    }
}
