//! `POST /v1/auth/token`: trade a password or an API key for a JWT.

use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiJson;
use crate::api::state::AppState;
use axum::extract::State;
use axum::http::{Extensions, HeaderMap};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use utoipa::ToSchema;
use verity_core::tenancy::Role;

/// Credentials: `email` + `password`, or `api_key`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Login e-mail.
    pub email: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// An API key (`vt-…`).
    pub api_key: Option<String>,
}

/// A minted access token.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenResponse {
    /// The JWT.
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Lifetime in seconds.
    pub expires_in: u64,
}

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/auth/token", post(create_token)).merge(super::api_keys::router())
}

/// Mints an access token; one minted from an API key stops working when the key is revoked.
#[utoipa::path(post, path = "/v1/auth/token", request_body = TokenRequest, tag = "auth",
    responses((status = 200, body = TokenResponse), (status = 400), (status = 401), (status = 429)))]
pub async fn create_token(
    State(state): State<AppState>,
    extensions: Extensions,
    headers: HeaderMap,
    ApiJson(request): ApiJson<TokenRequest>,
) -> ApiResult<Json<TokenResponse>> {
    for (param, value) in
        [("email", &request.email), ("password", &request.password), ("api_key", &request.api_key)]
    {
        if let Some(value) = value {
            crate::api::extract::reject_nul(param, value)?;
        }
    }
    let addr = state.trusted_proxies.client_addr(&extensions, &headers);
    let signed_in = sign_in(&state, request, addr).await?;
    let access_token = state
        .tokens
        .mint(signed_in.user_id, signed_in.org_id, signed_in.role, signed_in.key_id)
        .map_err(|e| ApiError::internal("minting token", e))?;
    Ok(Json(TokenResponse {
        access_token,
        token_type: "Bearer",
        expires_in: state.tokens.ttl().as_secs(),
    }))
}

/// Who signed in.
#[derive(Debug, Clone, Copy)]
pub struct SignedIn {
    /// The user.
    pub user_id: uuid::Uuid,
    /// Their org.
    pub org_id: uuid::Uuid,
    /// Their role.
    pub role: Role,
    /// The API key used (`None`: a password).
    pub key_id: Option<uuid::Uuid>,
}

/// Checks a password or an API key from client address `addr`. Each check that costs a hash is
/// first reserved with the sign-in throttle (per account and address, and per address), so
/// that parallel guesses are counted before any of them is checked: refused ones answer 429
/// with `Retry-After`.
pub async fn sign_in(
    state: &AppState,
    request: TokenRequest,
    addr: Option<IpAddr>,
) -> ApiResult<SignedIn> {
    let outcome = match (request.email, request.password, request.api_key) {
        (None, None, Some(key)) => {
            super::authenticate_key(state, &key, addr).await.map(|principal| SignedIn {
                user_id: principal.user_id,
                org_id: principal.org_id,
                role: principal.role,
                key_id: principal.key_id,
            })
        }
        (Some(email), Some(password), None) => check_password(state, &email, password, addr).await,
        _ => Err(ApiError::invalid("body", "send either email and password, or api_key")),
    };
    if let Err(error) = &outcome {
        if error.status == axum::http::StatusCode::UNAUTHORIZED {
            tracing::warn!(client = ?addr, "failed sign-in");
        }
    }
    outcome
}

/// Checks `email` and `password`. An unknown e-mail (or a user without a password) is checked
/// against a dummy hash, so the answer takes as long as a wrong password's and is the same.
async fn check_password(
    state: &AppState,
    email: &str,
    password: String,
    addr: Option<IpAddr>,
) -> ApiResult<SignedIn> {
    let attempt =
        state.auth_throttle.reserve(&format!("email:{email}"), addr).map_err(super::throttled)?;
    let user = verity_core::tenancy::find_user_by_email(&state.pool, email)
        .await
        .map_err(|e| ApiError::tenancy("user lookup", e))?;
    let hash = user.as_ref().and_then(|u| u.password_hash.clone());
    let matches = state.hasher.verify(password, hash).await?;
    let Some(user) = user.filter(|_| matches) else {
        attempt.failed();
        return Err(
            ApiError::unauthorized("wrong e-mail or password").with_code("invalid_credentials")
        );
    };
    attempt.succeeded();
    let role: Role = user.role.parse().map_err(|e| ApiError::internal("user role", e))?;
    Ok(SignedIn { user_id: user.id, org_id: user.org_id, role, key_id: None })
}
