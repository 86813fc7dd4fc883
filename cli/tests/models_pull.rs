//! `verity models pull` against a loopback server speaking the hub's protocol (the two endpoints
//! hf-hub uses: `GET /api/models/{owner}/{name}/revision/{revision}` with `?blobs=true`, and
//! `GET /{owner}/{name}/resolve/{revision}/{file}` with `Range`, answering `X-Repo-Commit`,
//! `ETag`/`X-Linked-Etag` and `Content-Range` as the hub does), serving a tiny model folder:
//! fetched into the HF cache layout, checked, imported and registered; fetched once; a gated
//! model needs its token; bad names, missing models and damaged files are clear errors.

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use verity_cli::commands::models::pull::{fetch, pull, Hub};
use verity_core::storage::LocalStore;
use verity_worker::config::Family;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const TOKEN: &str = "hf_secret";

/// One repository: its files, and whether it needs the token.
struct HubRepo {
    files: BTreeMap<String, Vec<u8>>,
    gated: bool,
    /// Serve this file's bytes altered (its listed SHA-256 stays the true one).
    damaged: Option<String>,
}

struct HubState {
    repos: BTreeMap<String, HubRepo>,
    resolves: AtomicUsize,
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

/// A tiny model folder's files.
fn tiny_model_files() -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    verity_worker::trainer::testing::write_tiny_model_dir(dir.path(), Family::Llama, 5).unwrap();
    std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect()
}

/// Serves the repositories on a loopback port; the hub's base URL and its state.
async fn serve_hub(repos: BTreeMap<String, HubRepo>) -> (String, Arc<HubState>) {
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

fn hub(endpoint: &str, cache: &Path, token: Option<&str>) -> Hub {
    Hub {
        endpoint: endpoint.to_string(),
        cache: cache.to_path_buf(),
        token: token.map(str::to_string),
        progress: false,
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_hub_model_is_fetched_into_the_shared_cache_checked_and_registered(pool: sqlx::PgPool) {
    let files = tiny_model_files();
    let mut extra = files.clone();
    extra.insert("pytorch_model.bin".into(), b"not fetched".to_vec());
    extra.insert("README.md".into(), b"# tiny".to_vec());
    let repos = BTreeMap::from([
        ("acme/tiny-llama".to_string(), HubRepo { files: extra, gated: false, damaged: None }),
        ("acme/gated".to_string(), HubRepo { files: files.clone(), gated: true, damaged: None }),
        (
            "acme/damaged".to_string(),
            HubRepo {
                files: files.clone(),
                gated: false,
                damaged: Some("model.safetensors".into()),
            },
        ),
        (
            "acme/no-weights".to_string(),
            HubRepo {
                files: files
                    .iter()
                    .filter(|(f, _)| !f.ends_with(".safetensors"))
                    .map(|(f, b)| (f.clone(), b.clone()))
                    .collect(),
                gated: false,
                damaged: None,
            },
        ),
    ]);
    let (endpoint, state) = serve_hub(repos).await;
    let cache = tempfile::tempdir().unwrap();
    let objects = tempfile::tempdir().unwrap();
    let store = LocalStore::open(objects.path(), None).await.unwrap();
    let open = hub(&endpoint, cache.path(), None);

    // Pulled: the HF cache layout (refs, snapshots pointing at blobs), only what Verity loads,
    // imported under the repository's name and registered.
    let pulled = pull(&pool, &store, &open, "acme/tiny-llama", None).await.unwrap();
    let fetched = pulled.fetched;
    assert_eq!((pulled.name.as_str(), pulled.prefix.as_str()), ("tiny-llama", "models/tiny-llama"));
    let repo_dir = cache.path().join("models--acme--tiny-llama");
    assert_eq!(fetched.dir, repo_dir.join("snapshots").join(COMMIT));
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap().trim(), COMMIT);
    let mut expected: Vec<String> = files.keys().cloned().collect();
    expected.sort();
    let mut got = fetched.files.clone();
    got.sort();
    assert_eq!(got, expected, "only the model's own files");
    assert_eq!(fetched.downloaded, files.len());
    for (file, bytes) in &files {
        assert_eq!(&std::fs::read(fetched.dir.join(file)).unwrap(), bytes, "{file}");
    }
    assert!(!fetched.dir.join("pytorch_model.bin").exists());
    let record = verity_core::models::model_by_id(&pool, "tiny-llama").await.unwrap().unwrap();
    assert_eq!(record.storage_prefix, "models/tiny-llama");

    // The hub id names the model too, for every org, wherever a model name is resolved.
    assert_eq!(pulled.hub_id.as_deref(), Some("acme/tiny-llama"));
    assert_eq!(record.hub_id.as_deref(), Some("acme/tiny-llama"));
    let any_org = uuid::Uuid::new_v4();
    let by_hub_id = verity_core::models::model_for_hub_id(&pool, any_org, "acme/tiny-llama");
    assert_eq!(by_hub_id.await.unwrap().as_deref(), Some("tiny-llama"));
    let stack = verity_core::lineage::resolve_stack(&pool, any_org, "acme/tiny-llama").await;
    assert_eq!(stack.unwrap().unwrap().base.id, "tiny-llama");

    // Pulled again under another name: nothing is downloaded again.
    let before = state.resolves.load(Ordering::SeqCst);
    let again = pull(&pool, &store, &open, "acme/tiny-llama@main", Some("tiny-2")).await.unwrap();
    assert_eq!((again.fetched.downloaded, state.resolves.load(Ordering::SeqCst)), (0, before));
    assert_eq!(again.hub_id, None, "one model per hub id: the first pull keeps it");
    let taken = pull(&pool, &store, &open, "acme/tiny-llama", None).await.unwrap_err();
    assert!(taken.to_string().contains("already exists"), "{taken}");

    // A gated model: refused without the token, fetched with it.
    let refused = fetch(&open, "acme/gated").await.unwrap_err().to_string();
    assert!(refused.contains("gated or private") && refused.contains("HF_TOKEN"), "{refused}");
    let wrong = fetch(&hub(&endpoint, cache.path(), Some("hf_wrong")), "acme/gated").await;
    assert!(wrong.unwrap_err().to_string().contains("refused the token"));
    fetch(&hub(&endpoint, cache.path(), Some(TOKEN)), "acme/gated").await.unwrap();

    // Damaged bytes fail the SHA-256 check and are not kept.
    let damaged = fetch(&open, "acme/damaged").await.unwrap_err().to_string();
    assert!(damaged.contains("SHA-256") && damaged.contains("model.safetensors"), "{damaged}");
    let kept =
        cache.path().join("models--acme--damaged/snapshots").join(COMMIT).join("model.safetensors");
    assert!(!kept.exists(), "the damaged copy is removed");

    // Names, missing models and models without what Verity loads: clear errors.
    let bad = fetch(&open, "../etc").await.unwrap_err().to_string();
    assert!(bad.contains("OWNER/NAME"), "{bad}");
    let bad = pull(&pool, &store, &open, "acme/", None).await.unwrap_err().to_string();
    assert!(bad.contains("OWNER/NAME"), "the hub's rule, before any name is derived: {bad}");
    let missing = fetch(&open, "acme/nothing").await.unwrap_err().to_string();
    assert!(missing.contains("acme/nothing has no model"), "{missing}");
    let unusable = fetch(&open, "acme/no-weights").await.unwrap_err().to_string();
    assert!(unusable.contains("*.safetensors") && unusable.contains("config.json"), "{unusable}");
}
