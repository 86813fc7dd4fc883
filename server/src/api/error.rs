//! The API's error type: OpenAI's `{"error": {"message", "type", "param", "code"}}` body with
//! the right status. Client errors name the parameter; server errors are logged and generic.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use verity_core::queue::QueueError;
use verity_core::storage::StorageError;
use verity_core::tenancy::TenancyError;

/// An error answered to the client.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a human.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, `authentication_error`, …).
    pub kind: &'static str,
    /// The request parameter at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (429, 503).
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the parameter `param` is wrong.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 404: no `what` called `id` (in the caller's org).
    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError {
            code: Some("not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no {what} with id {id:?}"),
            )
        }
    }

    /// 401: missing or invalid credentials.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
        }
    }

    /// 403: authenticated but not allowed.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "permission_error", message)
    }

    /// 409: the resource is in a state that does not allow the operation.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some(code),
            ..ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message)
        }
    }

    /// 413: the upload is larger than `limit` bytes.
    pub fn too_large(param: &str, limit: u64) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            code: Some("file_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("upload exceeds the limit of {limit} bytes"),
            )
        }
    }

    /// 429: slow down for `retry_after` seconds.
    pub fn rate_limited(retry_after: u64) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after.max(1)),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "too many requests for this key; retry later",
            )
        }
    }

    /// 500: logs `error` with its context; the client sees a generic message.
    pub fn internal(context: &str, error: impl std::fmt::Display) -> ApiError {
        tracing::error!(context, %error, "internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal server error")
    }

    /// 503: a dependency is down.
    pub fn unavailable(context: &str, error: impl std::fmt::Display) -> ApiError {
        tracing::warn!(context, %error, "service unavailable");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "service temporarily unavailable",
        )
    }

    /// A database failure: 503 `database_unavailable` with `Retry-After` when the database
    /// cannot be reached (no pooled connection within the acquire timeout, a refused or broken
    /// connection, a server shutting down or out of connections), else 500. The one place
    /// that decides which database errors are outages.
    pub fn database(context: &str, error: sqlx::Error) -> ApiError {
        if !is_database_outage(&error) {
            return ApiError::internal(context, error);
        }
        tracing::warn!(context, %error, "database unavailable");
        ApiError {
            code: Some("database_unavailable"),
            retry_after: Some(DATABASE_RETRY_AFTER_SECONDS),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the database is unavailable; retry later",
            )
        }
    }

    /// A tenancy failure: its database errors as [`ApiError::database`], the rest 500.
    pub fn tenancy(context: &str, error: TenancyError) -> ApiError {
        match error {
            TenancyError::Db(error) => ApiError::database(context, error),
            other => ApiError::internal(context, other),
        }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// `Retry-After` of a 503 answered while the database is unreachable (seconds).
const DATABASE_RETRY_AFTER_SECONDS: u64 = 5;

/// True when `error` means the database cannot be used right now rather than that a query is
/// wrong: pool timeouts, I/O and TLS failures, a closed pool, and the server's connection
/// exception (`08…`), shutdown (`57P01`–`57P03`) and too-many-connections (`53300`) codes.
fn is_database_outage(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> ApiError {
        ApiError::database("database", error)
    }
}

impl From<StorageError> for ApiError {
    fn from(error: StorageError) -> ApiError {
        ApiError::internal("object store", error)
    }
}

impl From<QueueError> for ApiError {
    fn from(error: QueueError) -> ApiError {
        match error {
            QueueError::NotFound(id) => ApiError::not_found("fine-tuning job", &id),
            QueueError::InvalidState { job_id, state, action } => ApiError::conflict(
                "invalid_job_state",
                format!("job {job_id} is {state}; cannot {action}"),
            ),
            QueueError::OrgQueueFull { .. } => ApiError {
                message: error.to_string(),
                code: Some("queue_limit_exceeded"),
                ..ApiError::rate_limited(60)
            },
            QueueError::Db(e) => e.into(),
            other => ApiError::internal("queue", other),
        }
    }
}

/// The result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_outages_are_503_with_retry_after_and_other_database_errors_500() {
        for outage in
            [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed, sqlx::Error::WorkerCrashed]
        {
            let error = ApiError::database("test", outage);
            assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(error.code, Some("database_unavailable"));
            assert_eq!(error.retry_after, Some(DATABASE_RETRY_AFTER_SECONDS));
            let response = error.into_response();
            assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            ApiError::from(sqlx::Error::Io(refused)).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let error = ApiError::from(sqlx::Error::RowNotFound);
        assert_eq!(error.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(error.retry_after, None);
        let error = ApiError::tenancy("test", TenancyError::Db(sqlx::Error::PoolTimedOut));
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        let error = ApiError::tenancy("test", TenancyError::NoSuchUser("a@x.io".into()));
        assert_eq!(error.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
