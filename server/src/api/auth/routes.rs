//! `POST /v1/auth/token`: trade a password or an API key for a JWT.

use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiJson;
use crate::api::state::AppState;
use axum::extract::State;
use axum::http::Extensions;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
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
    ApiJson(request): ApiJson<TokenRequest>,
) -> ApiResult<Json<TokenResponse>> {
    for (param, value) in
        [("email", &request.email), ("password", &request.password), ("api_key", &request.api_key)]
    {
        if let Some(value) = value {
            crate::api::extract::reject_nul(param, value)?;
        }
    }
    let ip = super::throttle::client_ip(&extensions);
    let signed_in = sign_in(&state, request, ip.as_deref()).await?;
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

/// Checks a password or an API key, throttled per user name and client address: after too
/// many failures the answer is 429 with `Retry-After`.
pub async fn sign_in(
    state: &AppState,
    request: TokenRequest,
    ip: Option<&str>,
) -> ApiResult<SignedIn> {
    let user_name = request.email.clone().or_else(|| {
        request.api_key.as_deref().and_then(super::keys::lookup_of).map(str::to_string)
    });
    state.login_throttle.check(user_name.as_deref(), ip).map_err(ApiError::rate_limited)?;
    let outcome = check_credentials(state, request).await;
    match &outcome {
        Err(error) if error.status == axum::http::StatusCode::UNAUTHORIZED => {
            tracing::warn!(user = user_name.as_deref().unwrap_or(""), "failed sign-in");
            state.login_throttle.failed(user_name.as_deref(), ip);
        }
        Ok(_) => state.login_throttle.succeeded(user_name.as_deref()),
        Err(_) => {}
    }
    outcome
}

async fn check_credentials(state: &AppState, request: TokenRequest) -> ApiResult<SignedIn> {
    match (request.email, request.password, request.api_key) {
        (None, None, Some(key)) => {
            let principal = super::authenticate_key(state, &key).await?;
            Ok(SignedIn {
                user_id: principal.user_id,
                org_id: principal.org_id,
                role: principal.role,
                key_id: principal.key_id,
            })
        }
        (Some(email), Some(password), None) => {
            let denied = || {
                ApiError::unauthorized("wrong e-mail or password").with_code("invalid_credentials")
            };
            let user = verity_core::tenancy::find_user_by_email(&state.pool, &email)
                .await
                .map_err(|e| ApiError::tenancy("user lookup", e))?;
            let Some(user) = user else { return Err(denied()) };
            let Some(hash) = user.password_hash.clone() else { return Err(denied()) };
            let ok =
                tokio::task::spawn_blocking(move || super::keys::verify_secret(&password, &hash))
                    .await
                    .map_err(|e| ApiError::internal("password verification", e))?;
            if !ok {
                return Err(denied());
            }
            let role: Role = user.role.parse().map_err(|e| ApiError::internal("user role", e))?;
            Ok(SignedIn { user_id: user.id, org_id: user.org_id, role, key_id: None })
        }
        _ => Err(ApiError::invalid("body", "send either email and password, or api_key")),
    }
}
