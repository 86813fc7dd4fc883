//! Extractors whose rejections use the API's error shape.

use super::error::ApiError;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

/// A JSON body; a malformed one is a 400 naming the body.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let message = rejection.body_text();
    let mut error = ApiError::invalid("body", message);
    error.status = rejection.status();
    if error.status.is_server_error() {
        error.status = axum::http::StatusCode::BAD_REQUEST;
    }
    error
}

/// Query parameters; malformed ones are a 400 naming the query.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(query_rejection(rejection)),
        }
    }
}

fn query_rejection(rejection: QueryRejection) -> ApiError {
    ApiError::invalid("query", rejection.body_text())
}

/// Fails when `text` holds a NUL character, which Postgres cannot store in text or jsonb.
pub fn reject_nul(param: &str, text: &str) -> Result<(), ApiError> {
    if text.contains('\0') {
        return Err(ApiError::invalid(param, "must not contain NUL characters"));
    }
    Ok(())
}

/// Fails when any string (or key) inside `value` holds a NUL character.
pub fn reject_nul_json(param: &str, value: &serde_json::Value) -> Result<(), ApiError> {
    use serde_json::Value;
    match value {
        Value::String(s) => reject_nul(param, s),
        Value::Array(items) => items.iter().try_for_each(|v| reject_nul_json(param, v)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            reject_nul(param, k)?;
            reject_nul_json(param, v)
        }),
        _ => Ok(()),
    }
}

/// Middleware: a path or query with an encoded NUL is refused before any handler runs.
pub async fn refuse_nul_in_uri(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let uri = request.uri();
    let has_nul = |s: &str| s.to_ascii_lowercase().contains("%00");
    if has_nul(uri.path()) || uri.query().is_some_and(has_nul) {
        return ApiError::invalid("path", "the URL must not contain NUL characters")
            .into_response();
    }
    next.run(request).await
}
