//! `POST /v1/files`: the multipart `file` part is piped to the object store chunk by chunk
//! while it is counted against the size limit and validated as JSONL.

use super::jsonl::{JsonlValidator, LineError};
use super::FileObject;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::state::AppState;
use axum::extract::multipart::{Field, MultipartError, MultipartRejection};
use axum::extract::{Multipart, State};
use axum::http::StatusCode;
use axum::Json;
use bytes::Bytes;
use serde_json::json;
use tokio_util::io::StreamReader;
use verity_core::files::FileRecord;

/// The only purpose Verity accepts.
pub const PURPOSE_FINE_TUNE: &str = "fine-tune";

/// Longest file name kept (longer ones are cut).
const MAX_FILENAME_CHARS: usize = 255;

/// A multipart text field read whole only up to `cap` bytes: a longer one is a 400 naming
/// `param` (and the cap), never repeating what was sent.
async fn text_field(mut field: Field<'_>, param: &str, cap: usize) -> ApiResult<String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        if bytes.len() + chunk.len() > cap {
            return Err(ApiError::invalid(param, format!("longer than {cap} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| ApiError::invalid(param, "must be UTF-8 text"))
}

/// What streaming a part produced.
struct Streamed {
    bytes: u64,
    validation: Result<u64, LineError>,
}

/// Why a part could not be stored.
enum PumpError {
    TooLarge,
    Multipart(MultipartError),
}

fn multipart_error(error: MultipartError) -> ApiError {
    if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
        let mut e = ApiError::invalid("file", error.body_text());
        e.status = StatusCode::PAYLOAD_TOO_LARGE;
        return e;
    }
    ApiError::invalid("file", format!("malformed multipart body: {}", error.body_text()))
}

/// Uploads a dataset.
#[utoipa::path(post, path = "/v1/files", tag = "files",
    request_body(content_type = "multipart/form-data", description = "`file` (JSONL) and `purpose` (`fine-tune`)"),
    responses((status = 200, body = FileObject), (status = 400), (status = 401), (status = 413)))]
pub async fn upload_file(
    State(state): State<AppState>,
    principal: Principal,
    multipart: Result<Multipart, MultipartRejection>,
) -> ApiResult<Json<FileObject>> {
    let mut multipart = multipart.map_err(|e| {
        ApiError::invalid("file", format!("expected a multipart/form-data body: {}", e.body_text()))
    })?;
    let id = verity_core::ids::file_id();
    let key = verity_core::keys::dataset_file(&id);
    let mut purpose: Option<String> = None;
    let mut stored: Option<(String, Streamed)> = None;
    let outcome: ApiResult<()> = async {
        while let Some(field) = multipart.next_field().await.map_err(multipart_error)? {
            let name = field.name().map(str::to_string);
            match name.as_deref() {
                Some("purpose") => {
                    let cap = state.limits.max_form_field_bytes;
                    purpose = Some(text_field(field, "purpose", cap).await?);
                }
                Some("file") if stored.is_some() => {
                    return Err(ApiError::invalid("file", "send exactly one file per upload"))
                }
                Some("file") => {
                    let filename: String = field
                        .file_name()
                        .unwrap_or("upload.jsonl")
                        .chars()
                        .take(MAX_FILENAME_CHARS)
                        .map(|c| if c.is_control() { '_' } else { c })
                        .collect();
                    stored = Some((filename, stream_to_store(&state, &key, field).await?));
                }
                _ => {}
            }
        }
        Ok::<(), ApiError>(())
    }
    .await;
    let result = finish_upload(&state, &principal, id, &key, outcome, purpose, stored).await;
    if result.is_err() {
        if let Err(error) = state.store.delete(&key).await {
            tracing::warn!(%error, key = %key, "could not remove a rejected upload");
        }
    }
    result.map(Json)
}

async fn finish_upload(
    state: &AppState,
    principal: &Principal,
    id: String,
    key: &str,
    outcome: ApiResult<()>,
    purpose: Option<String>,
    stored: Option<(String, Streamed)>,
) -> ApiResult<FileObject> {
    outcome?;
    let purpose = purpose.ok_or_else(|| {
        ApiError::invalid("purpose", "missing form field `purpose` (use \"fine-tune\")")
    })?;
    if purpose != PURPOSE_FINE_TUNE {
        // Never echoed: what the caller sent stays out of the answer.
        return Err(ApiError::invalid(
            "purpose",
            format!("unsupported purpose; use \"{PURPOSE_FINE_TUNE}\""),
        ));
    }
    let (filename, streamed) =
        stored.ok_or_else(|| ApiError::invalid("file", "missing form field `file`"))?;
    let (status, line_count, status_details) = match streamed.validation {
        Ok(records) => ("processed", Some(i64::try_from(records).unwrap_or(i64::MAX)), None),
        Err(error) => (
            "error",
            None,
            Some(
                json!({"message": error.to_string(), "line": error.line, "field": error.field, "reason": error.reason}),
            ),
        ),
    };
    let record = FileRecord {
        id,
        org_id: principal.org_id,
        filename,
        purpose,
        bytes: i64::try_from(streamed.bytes).unwrap_or(i64::MAX),
        line_count,
        status: status.to_string(),
        status_details,
        storage_key: key.to_string(),
        created_at: chrono::Utc::now(),
    };
    verity_core::files::insert_file(&state.pool, &record).await?;
    Ok(record.into())
}

/// Pipes one multipart part into `key`, counting and validating it.
async fn stream_to_store(state: &AppState, key: &str, mut field: Field<'_>) -> ApiResult<Streamed> {
    let limit = state.limits.max_upload_bytes;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    let chunks =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let upload = state.store.put_reader(key, Box::pin(StreamReader::new(chunks)));
    let pump = async move {
        let mut validator = JsonlValidator::default();
        let mut total = 0u64;
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => {
                    total += chunk.len() as u64;
                    if total > limit {
                        let _ = tx.send(Err(std::io::Error::other("upload too large"))).await;
                        return Err(PumpError::TooLarge);
                    }
                    validator.feed(&chunk);
                    if tx.send(Ok(chunk)).await.is_err() {
                        // The store stopped reading; its own error explains why.
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    let _ = tx.send(Err(std::io::Error::other("upload interrupted"))).await;
                    return Err(PumpError::Multipart(error));
                }
            }
        }
        drop(tx);
        Ok(Streamed { bytes: total, validation: validator.finish() })
    };
    let (stored, pumped) = tokio::join!(upload, pump);
    let streamed = match pumped {
        Err(PumpError::TooLarge) => return Err(ApiError::too_large("file", limit)),
        Err(PumpError::Multipart(error)) => return Err(multipart_error(error)),
        Ok(streamed) => streamed,
    };
    let written = stored?;
    if written != streamed.bytes {
        return Err(ApiError::internal(
            "upload",
            format!("received {} bytes but stored {written}", streamed.bytes),
        ));
    }
    Ok(streamed)
}
