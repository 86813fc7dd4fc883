//! `/v1/files`: upload (streamed to the object store and validated on the way), list, read,
//! download, delete.

pub mod jsonl;
pub mod upload;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::ApiQuery;
use super::pagination::{page_limit, Page, MAX_LIMIT};
use super::state::AppState;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio_util::io::ReaderStream;
use utoipa::{IntoParams, ToSchema};
use verity_core::files::FileRecord;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/files",
            get(list_files).post(upload::upload_file).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/files/{file_id}", get(get_file).delete(delete_file))
        .route("/v1/files/{file_id}/content", get(file_content))
}

/// OpenAI's `file` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileObject {
    /// `file-…`.
    pub id: String,
    /// Always `file`.
    pub object: &'static str,
    /// Size in bytes.
    pub bytes: i64,
    /// Upload time (Unix seconds).
    pub created_at: i64,
    /// Name given at upload.
    pub filename: String,
    /// `fine-tune`.
    pub purpose: String,
    /// `processed` or `error`.
    pub status: String,
    /// Why validation failed (`line N: field `f`: reason`).
    pub status_details: Option<String>,
    /// Number of records (Verity extension).
    pub records: Option<i64>,
}

impl From<FileRecord> for FileObject {
    fn from(file: FileRecord) -> FileObject {
        let status_details =
            file.status_details.as_ref().map(|details| match details.get("message") {
                Some(serde_json::Value::String(message)) => message.clone(),
                _ => details.to_string(),
            });
        FileObject {
            id: file.id,
            object: "file",
            bytes: file.bytes,
            created_at: file.created_at.timestamp(),
            filename: file.filename,
            purpose: file.purpose,
            status: file.status,
            status_details,
            records: file.line_count,
        }
    }
}

/// Answer to a delete.
#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    /// The id.
    pub id: String,
    /// The object type.
    pub object: &'static str,
    /// Always true.
    pub deleted: bool,
}

/// Query of the file list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileListQuery {
    /// Only files with this purpose.
    pub purpose: Option<String>,
    /// Id of the last file of the previous page.
    pub after: Option<String>,
    /// Page size (1–100, default 20).
    pub limit: Option<i64>,
}

/// The org's file `id`, or 404.
pub async fn find_file(state: &AppState, principal: &Principal, id: &str) -> ApiResult<FileRecord> {
    verity_core::files::get_file(&state.pool, principal.org_id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("file", id))
}

/// Lists files, newest first.
#[utoipa::path(get, path = "/v1/files", tag = "files", params(FileListQuery),
    responses((status = 200, body = Page<FileObject>), (status = 400), (status = 401)))]
pub async fn list_files(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<FileListQuery>,
) -> ApiResult<Json<Page<FileObject>>> {
    let limit = page_limit(query.limit, MAX_LIMIT)?;
    let rows = verity_core::files::list_files(
        &state.pool,
        principal.org_id,
        query.purpose.as_deref(),
        query.after.as_deref(),
        limit + 1,
    )
    .await?;
    let files = rows.into_iter().map(FileObject::from).collect();
    Ok(Json(Page::from_fetched(files, limit, |f: &FileObject| f.id.clone())))
}

/// One file.
#[utoipa::path(get, path = "/v1/files/{file_id}", tag = "files", params(("file_id" = String, Path)),
    responses((status = 200, body = FileObject), (status = 401), (status = 404)))]
pub async fn get_file(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<FileObject>> {
    Ok(Json(find_file(&state, &principal, &id).await?.into()))
}

/// The file's content, streamed.
#[utoipa::path(get, path = "/v1/files/{file_id}/content", tag = "files", params(("file_id" = String, Path)),
    responses((status = 200, content_type = "application/jsonl"), (status = 401), (status = 404)))]
pub async fn file_content(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let file = find_file(&state, &principal, &id).await?;
    let reader = state.store.get_reader(&file.storage_key).await?;
    let disposition =
        format!("attachment; filename=\"{}\"", file.filename.replace(['"', '\\', '\r', '\n'], "_"));
    Ok((
        [(CONTENT_TYPE, "application/jsonl".to_string()), (CONTENT_DISPOSITION, disposition)],
        Body::from_stream(ReaderStream::new(reader)),
    )
        .into_response())
}

/// Query of a file delete.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteFileQuery {
    /// Delete the file even though jobs or runs read it (their pages then show it as deleted).
    pub force: Option<bool>,
}

/// Deletes a file and its content. A file that a job or run names as its training or
/// validation file is kept (409 `file_in_use`, naming them) unless `?force=true`.
#[utoipa::path(delete, path = "/v1/files/{file_id}", tag = "files",
    params(("file_id" = String, Path), DeleteFileQuery),
    responses((status = 200, body = Deleted), (status = 401), (status = 404), (status = 409)))]
pub async fn delete_file(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeleteFileQuery>,
) -> ApiResult<Json<Deleted>> {
    remove_file(&state, &principal, &id, query.force.unwrap_or(false)).await?;
    Ok(Json(Deleted { id, object: "file", deleted: true }))
}

/// Jobs and runs named in a `file_in_use` refusal (the rest counted).
pub const USES_NAMED: usize = 10;

/// How a job or run uses a file, as a refusal names it: `ftjob-… (training file, succeeded)`.
pub fn describe_use(u: &verity_core::files::FileUse) -> String {
    let role = match (u.kind.as_str(), u.training, u.validation) {
        ("fine_tuning", true, true) => "training and validation file",
        ("fine_tuning", true, false) => "training file",
        ("fine_tuning", false, _) => "validation file",
        ("evaluation", ..) => "evaluation's file",
        ("rejection_sampling", ..) => "rejection sampling's prompts",
        ("difficulty_profile", ..) => "difficulty profile's prompts",
        _ => "file",
    };
    format!("{} ({role}, {})", u.job_id, u.state)
}

/// The jobs and runs that read the org's file `id` (at most [`USES_NAMED`] + 1).
pub async fn file_uses(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> ApiResult<Vec<verity_core::files::FileUse>> {
    let limit = i64::try_from(USES_NAMED).unwrap_or(10) + 1;
    Ok(verity_core::files::file_uses(&state.pool, principal.org_id, id, limit).await?)
}

/// Deletes the org's file `id` (row, then object); 404 when there is none, 409 `file_in_use`
/// naming the jobs and runs that read it unless `force`.
pub async fn remove_file(
    state: &AppState,
    principal: &Principal,
    id: &str,
    force: bool,
) -> ApiResult<()> {
    let Some(key) =
        verity_core::files::delete_file(&state.pool, principal.org_id, id, force).await?
    else {
        find_file(state, principal, id).await?;
        let uses = file_uses(state, principal, id).await?;
        let mut named: Vec<String> = uses.iter().take(USES_NAMED).map(describe_use).collect();
        if uses.len() > USES_NAMED {
            named.push("more".to_string());
        }
        if named.is_empty() {
            named.push("a job".to_string());
        }
        return Err(ApiError::conflict(
            "file_in_use",
            format!(
                "file {id} is used by {}: delete it with force=true to delete it anyway (their \
                 pages then show it as deleted)",
                named.join(", ")
            ),
        ));
    };
    if force {
        tracing::info!(file = %id, org_id = %principal.org_id, "file deleted with force");
    }
    if let Err(error) = state.store.delete(&key).await {
        tracing::warn!(%error, key = %key, "file row deleted but its object was not");
    }
    Ok(())
}

/// Bytes of one line kept in a preview.
pub const PREVIEW_LINE_BYTES: usize = 64 * 1024;

/// One line of a file as read: its first bytes, and whether more were cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLine {
    /// The line (its kept bytes, lossily decoded), without the line break.
    pub text: String,
    /// Whether the line was longer than the cap and was cut.
    pub truncated: bool,
}

/// The first `lines` non-blank lines of the org's file `id` (for previews, within its first
/// MiB, each cut at [`PREVIEW_LINE_BYTES`]), or 404.
pub async fn head_lines(
    state: &AppState,
    principal: &Principal,
    id: &str,
    lines: usize,
) -> ApiResult<(FileRecord, Vec<FileLine>)> {
    file_lines(state, principal, id, (0, lines), 1024 * 1024, PREVIEW_LINE_BYTES).await
}

/// Non-blank lines `skip .. skip + take` of the org's file `id` (blank lines are not counted,
/// as records are not), read from at most its first `byte_limit` bytes, each kept up to
/// `line_cap` bytes (the rest read past, never held); or 404.
pub async fn file_lines(
    state: &AppState,
    principal: &Principal,
    id: &str,
    (skip, take): (usize, usize),
    byte_limit: u64,
    line_cap: usize,
) -> ApiResult<(FileRecord, Vec<FileLine>)> {
    let file = find_file(state, principal, id).await?;
    let reader = state.store.get_reader(&file.storage_key).await?;
    let mut reader = tokio::io::BufReader::new(reader.take(byte_limit));
    let (mut out, mut seen) = (Vec::new(), 0usize);
    let mut line = Vec::new();
    while out.len() < take {
        line.clear();
        match read_line_capped(&mut reader, &mut line, line_cap).await {
            Ok((0, _)) => break,
            Ok(_) if line.iter().all(u8::is_ascii_whitespace) => {}
            Ok((_, truncated)) => {
                if seen >= skip {
                    let text = String::from_utf8_lossy(&line).trim_end().to_string();
                    out.push(FileLine { text, truncated });
                }
                seen += 1;
            }
            Err(error) => {
                tracing::warn!(%error, file = %id, "reading lines stopped");
                break;
            }
        }
    }
    Ok((file, out))
}

/// Reads one line (up to and including `\n`, or to the end) from `reader`, keeping at most
/// `cap` bytes of it in `out` (without the `\n`); the bytes consumed, and whether the line was
/// longer than `cap`.
pub async fn read_line_capped<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    out: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<(usize, bool)> {
    use tokio::io::AsyncBufReadExt;
    let (mut consumed, mut truncated) = (0, false);
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok((consumed, truncated));
        }
        let newline = buffer.iter().position(|&b| b == b'\n');
        let content = &buffer[..newline.unwrap_or(buffer.len())];
        let room = cap.saturating_sub(out.len());
        out.extend_from_slice(&content[..content.len().min(room)]);
        truncated |= content.len() > room;
        let used = newline.map_or(buffer.len(), |i| i + 1);
        reader.consume(used);
        consumed += used;
        if newline.is_some() {
            return Ok((consumed, truncated));
        }
    }
}
