//! `GET /v1/objects/{key}`: downloads through the signed URLs the local store hands out.

use super::error::{ApiError, ApiResult};
use super::extract::ApiQuery;
use super::state::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tokio_util::io::ReaderStream;
use utoipa::IntoParams;
use verity_core::storage::StorageError;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/objects/{*key}", get(get_object))
}

/// The signature of a download URL.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SignedQuery {
    /// Expiry (Unix seconds).
    pub expires: i64,
    /// Hex HMAC of key and expiry.
    pub signature: String,
}

/// Streams an object when the URL's signature is valid and unexpired.
#[utoipa::path(get, path = "/v1/objects/{key}", tag = "objects", params(("key" = String, Path), SignedQuery),
    responses((status = 200, content_type = "application/octet-stream"), (status = 400), (status = 403), (status = 404)))]
pub async fn get_object(
    State(state): State<AppState>,
    Path(key): Path<String>,
    ApiQuery(query): ApiQuery<SignedQuery>,
) -> ApiResult<Response> {
    let signer = state.signer.as_ref().ok_or_else(|| ApiError::not_found("object", &key))?;
    if !signer.verify(&key, query.expires, &query.signature, chrono::Utc::now().timestamp()) {
        return Err(
            ApiError::forbidden("invalid or expired signature").with_code("invalid_signature")
        );
    }
    let meta = state.store.head(&key).await?.ok_or_else(|| ApiError::not_found("object", &key))?;
    let reader = match state.store.get_reader(&key).await {
        Ok(reader) => reader,
        Err(StorageError::NotFound(_)) => return Err(ApiError::not_found("object", &key)),
        Err(e) => return Err(e.into()),
    };
    Ok((
        [
            (CONTENT_TYPE, "application/octet-stream".to_string()),
            (CONTENT_LENGTH, meta.size.to_string()),
        ],
        Body::from_stream(ReaderStream::new(reader)),
    )
        .into_response())
}
