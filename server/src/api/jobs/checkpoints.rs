//! Checkpoints of a job: list, delete, and download as a tar archive built on the fly from the
//! published folder's manifest (weights only unless the optimizer state is asked for), one file
//! streamed, or a redirect to a presigned URL of one file.

use super::find_job;
use super::view::{checkpoint_object, CheckpointObject};
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::extract::ApiQuery;
use crate::api::files::Deleted;
use crate::api::pagination::{Page, PageQuery};
use crate::api::state::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::io::ReaderStream;
use utoipa::IntoParams;
use verity_core::storage::{read_manifest, validate_key, Manifest, ObjectStore, MANIFEST};

/// Tar block size.
const BLOCK: u64 = 512;
/// Lifetime of presigned download URLs.
pub(super) const PRESIGN_TTL: Duration = Duration::from_secs(15 * 60);

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/fine_tuning/jobs/{job_id}/checkpoints", get(list_checkpoints))
        .route(
            "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}",
            get(get_checkpoint).delete(delete_checkpoint),
        )
        .route(
            "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}/content",
            get(checkpoint_content),
        )
}

/// Checkpoints of a job, latest step first.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/checkpoints", tag = "fine_tuning", params(("job_id" = String, Path), PageQuery),
    responses((status = 200, body = Page<CheckpointObject>), (status = 400), (status = 401), (status = 404)))]
pub async fn list_checkpoints(
    State(state): State<AppState>,
    principal: Principal,
    Path(job_id): Path<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<CheckpointObject>>> {
    let limit = query.limit()?;
    let job = find_job(&state, &principal, &job_id).await?;
    let before_step = match query.after.as_deref() {
        None => None,
        Some(after) => Some(
            verity_core::jobs::get_checkpoint(&state.pool, &job_id, after)
                .await?
                .ok_or_else(|| {
                    ApiError::invalid("after", format!("no checkpoint {after:?} in this job"))
                })?
                .step,
        ),
    };
    let rows =
        verity_core::jobs::list_checkpoints(&state.pool, &job_id, before_step, limit + 1).await?;
    let name = job.output_model_name();
    let items = rows.into_iter().map(|c| checkpoint_object(c, &name)).collect();
    Ok(Json(Page::from_fetched(items, limit, |c: &CheckpointObject| c.id.clone())))
}

pub(super) async fn find_checkpoint(
    state: &AppState,
    principal: &Principal,
    job_id: &str,
    checkpoint_id: &str,
) -> ApiResult<(verity_core::jobs::CheckpointRecord, String)> {
    let job = find_job(state, principal, job_id).await?;
    let checkpoint = verity_core::jobs::get_checkpoint(&state.pool, job_id, checkpoint_id)
        .await?
        .ok_or_else(|| ApiError::not_found("checkpoint", checkpoint_id))?;
    Ok((checkpoint, job.output_model_name()))
}

/// One checkpoint.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}", tag = "fine_tuning",
    params(("job_id" = String, Path), ("checkpoint_id" = String, Path)),
    responses((status = 200, body = CheckpointObject), (status = 401), (status = 404)))]
pub async fn get_checkpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path((job_id, checkpoint_id)): Path<(String, String)>,
) -> ApiResult<Json<CheckpointObject>> {
    let (checkpoint, model) = find_checkpoint(&state, &principal, &job_id, &checkpoint_id).await?;
    Ok(Json(checkpoint_object(checkpoint, &model)))
}

/// Deletes a checkpoint and its files.
#[utoipa::path(delete, path = "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}", tag = "fine_tuning",
    params(("job_id" = String, Path), ("checkpoint_id" = String, Path)),
    responses((status = 200, body = Deleted), (status = 401), (status = 404)))]
pub async fn delete_checkpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path((job_id, checkpoint_id)): Path<(String, String)>,
) -> ApiResult<Json<Deleted>> {
    let (checkpoint, _) = find_checkpoint(&state, &principal, &job_id, &checkpoint_id).await?;
    if !verity_core::jobs::delete_checkpoint(&state.pool, &job_id, &checkpoint_id).await? {
        return Err(ApiError::not_found("checkpoint", &checkpoint_id));
    }
    verity_core::storage::delete_folder(state.store.as_ref(), &checkpoint.storage_prefix).await?;
    Ok(Json(Deleted { id: checkpoint_id, object: "fine_tuning.job.checkpoint", deleted: true }))
}

/// Query of the download.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ContentQuery {
    /// `1` or `true`: answer 302 to a presigned URL of one file instead of streaming a tar.
    pub redirect: Option<String>,
    /// One file of the checkpoint: streamed as it is, or with `redirect` the file the URL
    /// points at (default `manifest.json`).
    pub path: Option<String>,
    /// `trainer_state`: put the optimizer state (`trainer_state.safetensors`, about twice the
    /// weights) in the archive too; by default the archive holds the weights only.
    pub include: Option<String>,
}

/// The `redirect` query parameter of a download: `1`/`true` (answer 302 to a presigned URL),
/// absent or `0`/`false` (stream); anything else is a 400 naming it.
pub(super) fn wants_redirect(value: Option<&str>) -> ApiResult<bool> {
    match value {
        None | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(_) => Err(ApiError::invalid("redirect", "use 1 or true")),
    }
}

/// Whether a checkpoint file is the optimizer state (left out of weights-only downloads).
pub fn is_trainer_state(path: &str) -> bool {
    path == verity_core::storage::TRAINER_STATE
}

/// The checkpoint's folder as a tar archive (weights only unless `include=trainer_state`), one
/// of its files (`path`), or a redirect to one of its files.
#[utoipa::path(get, path = "/v1/fine_tuning/jobs/{job_id}/checkpoints/{checkpoint_id}/content", tag = "fine_tuning",
    params(("job_id" = String, Path), ("checkpoint_id" = String, Path), ContentQuery),
    responses((status = 200, content_type = "application/x-tar", description = "The archive, or with `path` that file"), (status = 302), (status = 400), (status = 401), (status = 404), (status = 409)))]
pub async fn checkpoint_content(
    State(state): State<AppState>,
    principal: Principal,
    Path((job_id, checkpoint_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<ContentQuery>,
) -> ApiResult<Response> {
    let redirect = wants_redirect(query.redirect.as_deref())?;
    let with_trainer_state = match query.include.as_deref() {
        None | Some("") => false,
        Some("trainer_state") => true,
        Some(_) => return Err(ApiError::invalid("include", "the only value is trainer_state")),
    };
    let (checkpoint, _) = find_checkpoint(&state, &principal, &job_id, &checkpoint_id).await?;
    let prefix = checkpoint.storage_prefix.trim_end_matches('/').to_string();
    let manifest = read_manifest(state.store.as_ref(), &prefix).await?.ok_or_else(|| {
        ApiError::conflict(
            "checkpoint_incomplete",
            "the checkpoint's folder is not completely published",
        )
    })?;
    if redirect {
        let path = query.path.unwrap_or_else(|| MANIFEST.to_string());
        if path != MANIFEST && !manifest.files.iter().any(|f| f.path == path) {
            return Err(ApiError::invalid("path", format!("no file {path:?} in this checkpoint")));
        }
        let url = state.store.presign_get(&format!("{prefix}/{path}"), PRESIGN_TTL).await?;
        return Ok((StatusCode::FOUND, [(LOCATION, url)]).into_response());
    }
    if let Some(path) = query.path {
        return one_file(&state, &prefix, &manifest, &path).await;
    }
    let manifest = manifest.only(|f| with_trainer_state || !is_trainer_state(&f.path));
    for entry in &manifest.files {
        validate_key(&entry.path).map_err(|e| ApiError::internal("checkpoint manifest", e))?;
    }
    let length = archive_length(&manifest);
    let (mut writer, reader) = tokio::io::duplex(256 * 1024);
    let store = state.store.clone();
    let root = checkpoint_id.clone();
    tokio::spawn(async move {
        if let Err(error) =
            write_archive(store.as_ref(), &prefix, &root, &manifest, &mut writer).await
        {
            tracing::warn!(%error, prefix = %prefix, "checkpoint archive aborted");
        }
    });
    let disposition = format!("attachment; filename=\"{checkpoint_id}.tar\"");
    Ok((
        [
            (CONTENT_TYPE, "application/x-tar".to_string()),
            (CONTENT_DISPOSITION, disposition),
            (CONTENT_LENGTH, length.to_string()),
        ],
        Body::from_stream(ReaderStream::new(reader)),
    )
        .into_response())
}

/// One file of a published checkpoint, streamed from the store.
async fn one_file(
    state: &AppState,
    prefix: &str,
    manifest: &Manifest,
    path: &str,
) -> ApiResult<Response> {
    let Some(entry) = manifest.files.iter().find(|f| f.path == path) else {
        return Err(ApiError::invalid("path", format!("no file {path:?} in this checkpoint")));
    };
    validate_key(&entry.path).map_err(|e| ApiError::internal("checkpoint manifest", e))?;
    let name = entry.path.rsplit('/').next().unwrap_or(&entry.path);
    stream_object(state, &format!("{prefix}/{}", entry.path), entry.size, name).await
}

/// The stored object `key` of `size` bytes as a download named `name`, streamed from the store.
pub(super) async fn stream_object(
    state: &AppState,
    key: &str,
    size: u64,
    name: &str,
) -> ApiResult<Response> {
    let reader = state.store.get_reader(key).await?;
    Ok((
        [
            (CONTENT_TYPE, "application/octet-stream".to_string()),
            (CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
            (CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(ReaderStream::new(reader.take(size))),
    )
        .into_response())
}

fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK) * BLOCK
}

/// Exact size of the archive: a header and padded data per file, then two zero blocks.
fn archive_length(manifest: &Manifest) -> u64 {
    manifest.files.iter().map(|f| BLOCK + padded(f.size)).sum::<u64>() + 2 * BLOCK
}

/// Writes every file of the manifest as a tar entry under `root/`, checking sizes.
async fn write_archive(
    store: &dyn ObjectStore,
    prefix: &str,
    root: &str,
    manifest: &Manifest,
    out: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mtime = chrono::DateTime::parse_from_rfc3339(&manifest.created_at)
        .map_or(0, |t| t.timestamp().max(0) as u64);
    for entry in &manifest.files {
        let mut header = tar::Header::new_gnu();
        header.set_path(format!("{root}/{}", entry.path))?;
        header.set_size(entry.size);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        out.write_all(header.as_bytes()).await?;
        let key = format!("{prefix}/{}", entry.path);
        let reader = store.get_reader(&key).await.map_err(std::io::Error::other)?;
        let copied = tokio::io::copy(&mut reader.take(entry.size), out).await?;
        if copied != entry.size {
            return Err(std::io::Error::other(format!(
                "{key}: {copied} bytes, manifest says {}",
                entry.size
            )));
        }
        let padding = padded(entry.size) - entry.size;
        out.write_all(&vec![0u8; padding as usize]).await?;
    }
    out.write_all(&[0u8; 2 * BLOCK as usize]).await?;
    out.shutdown().await
}
