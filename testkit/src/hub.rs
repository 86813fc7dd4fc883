//! A loopback server speaking a Hugging Face hub's protocol, for the tests of `verity models
//! pull` and of the API's pulls: the two endpoints hf-hub uses, `GET
//! /api/models/{owner}/{name}/revision/{revision}` (`?blobs=true`: the commit and the files, each
//! safetensors file with its SHA-256) and `GET /{owner}/{name}/resolve/{revision}/{file}` with
//! `Range`, answering `X-Repo-Commit`, `ETag`/`X-Linked-Etag` and `Content-Range` as the hub
//! does (built from the hub's documentation of its HTTP API and hf-hub's client).

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The commit every repository is at.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// The token gated repositories ask for.
pub const TOKEN: &str = "hf_secret";

/// One repository: its files, and whether it needs the token.
pub struct HubRepo {
    /// File name → bytes.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Whether it answers only with [`TOKEN`].
    pub gated: bool,
    /// Serve this file's bytes altered (its listed SHA-256 stays the true one).
    pub damaged: Option<String>,
}

impl HubRepo {
    /// An open repository of `files`.
    pub fn open(files: BTreeMap<String, Vec<u8>>) -> HubRepo {
        HubRepo { files, gated: false, damaged: None }
    }
}

/// What the server serves, and how many file requests it answered.
pub struct HubState {
    repos: BTreeMap<String, HubRepo>,
    /// File (`resolve`) requests answered.
    pub resolves: AtomicUsize,
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn authorised(repo: &HubRepo, headers: &HeaderMap) -> bool {
    let bearer = format!("Bearer {TOKEN}");
    !repo.gated || headers.get(header::AUTHORIZATION).is_some_and(|v| v == bearer.as_str())
}

async fn revision(
    State(hub): State<Arc<HubState>>,
    UrlPath((owner, name, _revision)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(repo) = hub.repos.get(&format!("{owner}/{name}")) else {
        return (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "Repository not found"})))
            .into_response();
    };
    if !authorised(repo, &headers) {
        return (StatusCode::UNAUTHORIZED, "Access to this model is restricted").into_response();
    }
    let siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|(file, bytes)| {
            let mut sibling = serde_json::json!({"rfilename": file, "size": bytes.len()});
            if file.ends_with(".safetensors") {
                sibling["lfs"] = serde_json::json!({"sha256": sha256(bytes), "size": bytes.len()});
            }
            sibling
        })
        .collect();
    Json(serde_json::json!({"id": format!("{owner}/{name}"), "sha": COMMIT, "siblings": siblings}))
        .into_response()
}

async fn resolve(
    State(hub): State<Arc<HubState>>,
    UrlPath((owner, name, _revision, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    hub.resolves.fetch_add(1, Ordering::SeqCst);
    let Some(repo) = hub.repos.get(&format!("{owner}/{name}")) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !authorised(repo, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some(bytes) = repo.files.get(&file) else { return StatusCode::NOT_FOUND.into_response() };
    let mut bytes = bytes.clone();
    let etag = sha256(&bytes);
    if repo.damaged.as_deref() == Some(file.as_str()) {
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
    }
    let size = bytes.len();
    let (start, end) = headers
        .get(header::RANGE)
        .and_then(|r| {
            r.to_str().ok()?.strip_prefix("bytes=")?.split_once('-').map(|(a, b)| {
                (
                    a.parse::<usize>().unwrap_or(0),
                    b.parse::<usize>().unwrap_or(size - 1).min(size - 1),
                )
            })
        })
        .unwrap_or((0, size - 1));
    let mut response = bytes[start..=end].to_vec().into_response();
    *response.status_mut() = StatusCode::PARTIAL_CONTENT;
    let headers = response.headers_mut();
    headers.insert("x-repo-commit", HeaderValue::from_static(COMMIT));
    let tag = HeaderValue::from_str(&format!("\"{etag}\"")).unwrap();
    headers.insert(if file.ends_with(".safetensors") { "x-linked-etag" } else { "etag" }, tag);
    let range = format!("bytes {start}-{end}/{size}");
    headers.insert(header::CONTENT_RANGE, HeaderValue::from_str(&range).unwrap());
    response
}

/// Serves the repositories on a loopback port; the hub's base URL and its state.
pub async fn serve_hub(repos: BTreeMap<String, HubRepo>) -> (String, Arc<HubState>) {
    let state = Arc::new(HubState { repos, resolves: AtomicUsize::new(0) });
    let app = Router::new()
        .route("/api/models/{owner}/{name}/revision/{revision}", get(revision))
        .route("/{owner}/{name}/resolve/{revision}/{file}", get(resolve))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, state)
}
