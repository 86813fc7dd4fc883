//! Files: the list, a file's preview (first rows, or its validation error by line), delete
//! (asked first; a file that jobs use only when forced).

use super::jobs::size;
use super::jobs::{ConfirmForm, ConfirmPage};
use super::page::{render, when, Nav, WebResult, WebUser};
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiQuery;
use crate::api::files::{
    describe_use, file_lines, file_uses, find_file, head_lines, remove_file, DeleteFileQuery,
    FileObject, USES_NAMED,
};
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde_json::{json, Value};

/// Rows shown in a preview.
pub const PREVIEW_ROWS: usize = 5;
/// Files shown on the list.
const LIST_LIMIT: i64 = 200;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/files", get(files_page))
        .route("/files/{file_id}", get(file_page))
        .route("/files/{file_id}/preview", get(preview_fragment))
        .route("/files/{file_id}/rows/{index}", get(row))
        .route("/files/{file_id}/delete", post(delete))
}

/// A file as shown.
pub struct FileRow {
    /// The API object.
    pub file: FileObject,
    /// Its size, readable.
    pub size: String,
    /// Upload time.
    pub created: String,
}

impl From<verity_core::files::FileRecord> for FileRow {
    fn from(record: verity_core::files::FileRecord) -> FileRow {
        FileRow { size: size(record.bytes), created: when(record.created_at), file: record.into() }
    }
}

/// The org's files, newest first.
pub async fn org_files(state: &AppState, user: &WebUser) -> Result<Vec<FileRow>, sqlx::Error> {
    let rows =
        verity_core::files::list_files(&state.pool, user.0.org_id, None, None, LIST_LIMIT).await?;
    Ok(rows.into_iter().map(FileRow::from).collect())
}

/// The files list.
#[derive(Template)]
#[template(path = "files.html")]
struct FilesPage {
    nav: Nav,
    files: Vec<FileRow>,
}

async fn files_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let files = org_files(&state, &user).await?;
    Ok(render(&FilesPage { nav: Nav::new("Files", "files"), files }))
}

/// A file's preview: status, validation error and first rows.
#[derive(Template)]
#[template(path = "file_preview.html")]
pub struct Preview {
    /// The file.
    pub row: FileRow,
    /// Its first rows.
    pub lines: Vec<String>,
}

/// The preview of the org's file `id`.
pub async fn preview(state: &AppState, user: &WebUser, id: &str) -> WebResult<Preview> {
    let (record, lines) = head_lines(state, &user.0, id, PREVIEW_ROWS).await?;
    let lines = lines
        .into_iter()
        .map(|l| if l.truncated { format!("{} …", l.text) } else { l.text })
        .collect();
    Ok(Preview { row: record.into(), lines })
}

/// One file's page.
#[derive(Template)]
#[template(path = "file.html")]
struct FilePage {
    nav: Nav,
    preview: Preview,
}

async fn file_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    let preview = preview(&state, &user, &id).await?;
    Ok(render(&FilePage { nav: Nav::new(format!("File {id}"), "files"), preview }))
}

async fn preview_fragment(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    Ok(render(&preview(&state, &user, &id).await?))
}

/// The page of a job or run that reads a file (empty: it has none).
fn use_link(u: &verity_core::files::FileUse) -> String {
    match u.kind.as_str() {
        "fine_tuning" => format!("/jobs/{}", u.job_id),
        "evaluation" => format!("/evaluations/{}", u.job_id),
        "rejection_sampling" => format!("/rejection-sampling/{}", u.job_id),
        _ => String::new(),
    }
}

/// Deletes a file once confirmed (`confirm=yes`; without it, a page asks). A file that jobs or
/// runs read is refused (409) on a page that names them and offers to delete it anyway
/// (`?force=true`).
async fn delete(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeleteFileQuery>,
    Form(form): Form<ConfirmForm>,
) -> WebResult<Response> {
    let force = query.force.unwrap_or(false);
    if !form.confirmed() {
        let file = find_file(&state, &user.0, &id).await?;
        return Ok(render(&ConfirmPage {
            nav: Nav::new("Delete file", "files"),
            question: format!(
                "Delete file {id} ({})? Its content is removed for good.",
                file.filename
            ),
            action: format!("/files/{id}/delete{}", if force { "?force=true" } else { "" }),
            button: "Delete file".into(),
            back: "/files".into(),
            affected: Vec::new(),
        }));
    }
    match remove_file(&state, &user.0, &id, force).await {
        Ok(()) => Ok(Redirect::to("/files").into_response()),
        Err(error) if error.code == Some("file_in_use") => {
            let uses = file_uses(&state, &user.0, &id).await?;
            let mut affected: Vec<(String, String)> =
                uses.iter().take(USES_NAMED).map(|u| (describe_use(u), use_link(u))).collect();
            if uses.len() > USES_NAMED {
                affected.push(("and more".into(), String::new()));
            }
            let mut response = render(&ConfirmPage {
                nav: Nav::new("File in use", "files"),
                question: format!(
                    "File {id} was not deleted: these jobs use it. Deleting it anyway removes its \
                     content for good; their pages then show it as deleted, and Continue \
                     training starts without it."
                ),
                action: format!("/files/{id}/delete?force=true"),
                button: "Delete anyway".into(),
                back: "/files".into(),
                affected,
            });
            *response.status_mut() = StatusCode::CONFLICT;
            Ok(response)
        }
        Err(error) => Err(error.into()),
    }
}

/// Row `index` (0-based, blank lines not counted) of a file, as JSON: `{file, index, records,
/// row, truncated}` (the playground's "Try a validation row"); an index past the end is a 400
/// naming it. A row longer than `VERITY_MAX_ROW_BYTES` is not returned whole: `row` is null,
/// `truncated` true, and `text` holds its first bytes.
async fn row(
    State(state): State<AppState>,
    user: WebUser,
    Path((id, index)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let index: usize = index
        .parse()
        .map_err(|_| ApiError::invalid("index", format!("{index:?} is not a row number")))?;
    let cap = state.limits.max_row_bytes;
    let (record, lines) = file_lines(&state, &user.0, &id, (index, 1), u64::MAX, cap).await?;
    let Some(line) = lines.first() else {
        let rows = record.line_count.unwrap_or(0);
        return Err(ApiError::invalid("index", format!("{id} has {rows} rows, numbered from 0")));
    };
    if line.truncated {
        return Ok(Json(json!({
            "file": id, "index": index, "records": record.line_count, "row": null,
            "truncated": true, "max_bytes": cap, "text": line.text,
        })));
    }
    let row: Value = serde_json::from_str(&line.text)
        .map_err(|e| ApiError::invalid("index", format!("row {index} is not JSON: {e}")))?;
    Ok(Json(json!({
        "file": id, "index": index, "records": record.line_count, "row": row, "truncated": false,
    })))
}
