//! `/v1/api_keys`: list keys (admins: the org's; members: their own), create one (its secret
//! shown once), revoke one. Creating needs the admin role and an API key or a fresh password
//! sign-in; revoking needs the admin role and takes effect at once on every server.

use super::{keys, Principal};
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::{reject_nul, ApiJson};
use crate::api::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;
use verity_core::tenancy::{self, ApiKeyInfo, Role};

/// Longest key name.
const MAX_NAME_LEN: usize = 100;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/api_keys", get(list_keys).post(create_key))
        .route("/v1/api_keys/{key_id}", delete(revoke_key))
        .route("/v1/api_keys/{key_id}/revoke", post(revoke_key))
}

/// An API key as listed (never its secret).
#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyObject {
    /// Key id.
    #[schema(value_type = String)]
    pub id: Uuid,
    /// Always `api_key`.
    pub object: &'static str,
    /// Label.
    pub name: String,
    /// First characters of the key, to recognise it.
    pub prefix: String,
    /// What the key may do: the role chosen at creation, never above its owner's.
    pub role: String,
    /// Owning user.
    #[schema(value_type = String)]
    pub user_id: Uuid,
    /// Creation (Unix seconds).
    pub created_at: i64,
    /// Last verification (Unix seconds).
    pub last_used_at: Option<i64>,
    /// Revocation (Unix seconds).
    pub revoked_at: Option<i64>,
    /// True once revoked.
    pub revoked: bool,
    /// When the key stops working (Unix seconds; null: never).
    pub expires_at: Option<i64>,
    /// True once past `expires_at`: the API refuses it.
    pub expired: bool,
}

impl From<ApiKeyInfo> for ApiKeyObject {
    fn from(key: ApiKeyInfo) -> ApiKeyObject {
        ApiKeyObject {
            id: key.id,
            object: "api_key",
            name: key.name,
            prefix: key.prefix,
            role: key.role,
            user_id: key.user_id,
            created_at: key.created_at.timestamp(),
            last_used_at: key.last_used_at.map(|t| t.timestamp()),
            revoked: key.revoked_at.is_some(),
            revoked_at: key.revoked_at.map(|t| t.timestamp()),
            expires_at: key.expires_at.map(|t| t.timestamp()),
            expired: key.expires_at.is_some_and(|t| t <= chrono::Utc::now()),
        }
    }
}

/// Body of `POST /v1/api_keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// A label: 1 to 100 characters, not only spaces (a missing or empty name is a 400 naming
    /// `name`).
    #[schema(required = true)]
    pub name: Option<String>,
    /// `admin` or `member` (default: the creator's role, which is admin).
    pub role: Option<String>,
    /// When the key stops working (Unix seconds, in the future; default: never).
    pub expires_at: Option<i64>,
}

impl CreateKeyRequest {
    /// The grant asked for, or a 400 naming the field.
    pub fn grant(&self) -> ApiResult<tenancy::KeyGrant> {
        let role = match self.role.as_deref() {
            None | Some("") => None,
            Some(name) => {
                Some(name.parse::<Role>().map_err(|e| ApiError::invalid("role", e.to_string()))?)
            }
        };
        let expires_at = match self.expires_at {
            None => None,
            Some(at) => {
                let at = chrono::DateTime::from_timestamp(at, 0)
                    .ok_or_else(|| ApiError::invalid("expires_at", "not a valid Unix time"))?;
                if at <= chrono::Utc::now() {
                    return Err(ApiError::invalid("expires_at", "must be in the future"));
                }
                Some(at)
            }
        };
        Ok(tenancy::KeyGrant { role, expires_at })
    }
}

/// A new key: the listing plus the secret, shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedKey {
    /// The key's listing.
    #[serde(flatten)]
    pub key: ApiKeyObject,
    /// The whole key (`vt-…`); it cannot be shown again.
    pub secret: String,
    /// The same key in the form the Tinker SDK accepts (`tml-vt-…`; docs/tinker.md).
    pub tinker_secret: String,
}

/// The list of keys.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyList {
    /// Always `list`.
    pub object: &'static str,
    /// Keys, newest first.
    pub data: Vec<ApiKeyObject>,
}

/// The keys the caller may see: all of the org's for an admin, a member's own otherwise.
pub async fn org_keys(state: &AppState, principal: &Principal) -> ApiResult<Vec<ApiKeyObject>> {
    let only_user = (principal.role != Role::Admin).then_some(principal.user_id);
    let keys = tenancy::list_api_keys(&state.pool, principal.org_id, only_user)
        .await
        .map_err(|e| ApiError::tenancy("listing api keys", e))?;
    Ok(keys.into_iter().map(ApiKeyObject::from).collect())
}

/// Creates a key for the calling user with `grant` (admins only, signed in with a key or a
/// fresh password).
pub async fn new_key(
    state: &AppState,
    principal: &Principal,
    name: &str,
    grant: tenancy::KeyGrant,
) -> ApiResult<CreatedKey> {
    principal.require_admin()?;
    principal.require_key_minting()?;
    reject_nul("name", name)?;
    let name = name.trim();
    if name.is_empty() {
        return Err(ApiError::invalid("name", "must not be empty: name the key after its use"));
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Err(ApiError::invalid("name", format!("at most {MAX_NAME_LEN} characters")));
    }
    let user = tenancy::find_user_by_id(&state.pool, principal.user_id)
        .await
        .map_err(|e| ApiError::tenancy("user lookup", e))?
        .ok_or_else(|| ApiError::unauthorized("the signed-in user no longer exists"))?;
    let key = keys::generate_key();
    let hash = state.hasher.hash(key.key.clone()).await?;
    let id = tenancy::insert_api_key(&state.pool, &user, name, &key.lookup, &hash, grant)
        .await
        .map_err(|e| ApiError::tenancy("storing the key", e))?;
    tracing::info!(key_id = %id, org_id = %principal.org_id, "api key created");
    let listed = org_keys(state, principal).await?.into_iter().find(|k| k.id == id);
    let listed = listed.ok_or_else(|| ApiError::internal("api key", "created key not listed"))?;
    let tinker_secret = format!("{}{}", super::TINKER_KEY_PREFIX, key.key);
    Ok(CreatedKey { key: listed, secret: key.key, tinker_secret })
}

/// Revokes the org's key `id` (admins only) and forgets it from this server's key cache; the
/// database announces the revocation to the other servers, which forget it too.
pub async fn revoke(state: &AppState, principal: &Principal, id: Uuid) -> ApiResult<ApiKeyObject> {
    principal.require_admin()?;
    let found = tenancy::revoke_api_key(&state.pool, principal.org_id, id)
        .await
        .map_err(|e| ApiError::tenancy("revoking the key", e))?;
    if !found {
        return Err(ApiError::not_found("api key", &id.to_string()));
    }
    state.key_cache.evict_key(id);
    tracing::info!(key_id = %id, org_id = %principal.org_id, "api key revoked");
    org_keys(state, principal)
        .await?
        .into_iter()
        .find(|k| k.id == id)
        .ok_or_else(|| ApiError::not_found("api key", &id.to_string()))
}

/// Lists API keys: the org's for an admin, the caller's own for a member.
#[utoipa::path(get, path = "/v1/api_keys", tag = "auth", responses((status = 200, body = KeyList), (status = 401)))]
pub async fn list_keys(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<KeyList>> {
    Ok(Json(KeyList { object: "list", data: org_keys(&state, &principal).await? }))
}

/// Creates an API key for the caller (admins, with an API key or a password sign-in at most 5
/// minutes old; a token minted from a key answers 403); the secret is in this response only.
#[utoipa::path(post, path = "/v1/api_keys", tag = "auth", request_body = CreateKeyRequest,
    responses((status = 200, body = CreatedKey), (status = 400), (status = 401), (status = 403)))]
pub async fn create_key(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateKeyRequest>,
) -> ApiResult<Json<CreatedKey>> {
    let grant = request.grant()?;
    Ok(Json(new_key(&state, &principal, request.name.as_deref().unwrap_or(""), grant).await?))
}

/// Revokes an API key; it stops working at once.
#[utoipa::path(delete, path = "/v1/api_keys/{key_id}", tag = "auth", params(("key_id" = String, Path)),
    responses((status = 200, body = ApiKeyObject), (status = 401), (status = 403), (status = 404)))]
pub async fn revoke_key(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ApiKeyObject>> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::not_found("api key", &id))?;
    Ok(Json(revoke(&state, &principal, id).await?))
}
