//! Shared helpers of the API tests: an app over a fresh database and a local store, users with
//! keys, and one-shot requests through the router.
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use sqlx::PgPool;
use std::sync::Arc;
use tower::ServiceExt;
use verity_core::config::StorageConfig;
use verity_core::queue::QueueSettings;
use verity_core::storage::{LocalStore, ObjectStore, UrlSigner};
use verity_server::api::state::{ApiConfig, AppState};

/// Secret of test tokens.
pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123";
/// Base URL of signed object URLs in tests.
pub const PUBLIC_URL: &str = "http://verity.test";

/// An app under test.
pub struct TestApp {
    /// The router.
    pub router: Router,
    /// Its state.
    pub state: AppState,
    /// Keeps the store directory alive.
    pub dir: tempfile::TempDir,
}

/// API settings of tests (no rate limit unless asked).
pub fn api_config() -> ApiConfig {
    ApiConfig {
        jwt_secret: JWT_SECRET.to_string(),
        jwt_issuer: "verity".into(),
        jwt_audience: "verity-api".into(),
        token_ttl_seconds: 600,
        session_max_hours: 12,
        max_upload_mib: 512,
        rate_limit_rps: 0.0,
        rate_limit_burst: 1.0,
        trusted_proxies: String::new(),
        auth_failures_per_address: 20,
        auth_checks_per_minute: 60.0,
        hash_concurrency: 0,
        grader_concurrency: 0,
        grader_wait_ms: 2000,
        tinker_session_timeout_secs: 600,
        judge_cache_dir: std::env::temp_dir().join("verity-test-judges"),
        judges: verity_server::api::state::JudgeArgs {
            endpoints: String::new(),
            timeout_seconds: 5,
            retries: 1,
            models_loaded: 1,
        },
        limits: verity_server::api::limits::LimitArgs::default(),
        wandb: verity_server::integrations::WandbArgs::default(),
    }
}

/// A storage config with signed URLs on.
pub fn storage_config(dir: &std::path::Path) -> StorageConfig {
    StorageConfig {
        storage: dir.display().to_string(),
        s3_path_style: true,
        multipart_threshold_mib: 16,
        signing_secret: "signing-secret".into(),
        public_url: Some(PUBLIC_URL.into()),
    }
}

/// An app over `pool`, a fresh local store, and `api`.
pub async fn app_with(pool: PgPool, api: ApiConfig, tweak: impl FnOnce(&mut AppState)) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let storage = storage_config(dir.path());
    let signer = UrlSigner::new(PUBLIC_URL, b"signing-secret");
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path(), Some(signer)).await.unwrap());
    let mut state = AppState::new(pool, store, QueueSettings::default(), &storage, &api).unwrap();
    tweak(&mut state);
    TestApp { router: verity_server::app::app(state.clone()), state, dir }
}

/// An app over `pool` and a given store (signed local URLs off).
pub async fn app_on(pool: PgPool, store: Arc<dyn ObjectStore>) -> AppState {
    let dir = std::env::temp_dir();
    let mut storage = storage_config(&dir);
    storage.public_url = None;
    AppState::new(pool, store, QueueSettings::default(), &storage, &api_config()).unwrap()
}

/// An app with the default test settings.
pub async fn app(pool: PgPool) -> TestApp {
    app_with(pool, api_config(), |_| {}).await
}

/// Creates a user (password `password123`) and returns an API key for it.
pub async fn user(pool: &PgPool, email: &str, org: &str, role: &str) -> String {
    verity_cli::commands::admin::create_user(pool, email, org, role, Some("password123"))
        .await
        .unwrap();
    verity_cli::commands::admin::create_key(pool, email, "test").await.unwrap()
}

/// Signs `email` (made by [`user`]) in to the dashboard; the `name=value` of its session cookie.
pub async fn dashboard_cookie(router: &Router, email: &str) -> String {
    let body = format!("email={}&password=password123&next=%2Fjobs", email.replace('@', "%40"));
    let request = Request::builder()
        .method("POST")
        .uri("/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(body))
        .unwrap();
    let reply = send(router, request).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", String::from_utf8_lossy(&reply.bytes));
    let cookie = reply.headers["set-cookie"].to_str().unwrap();
    cookie.split(';').next().unwrap().to_string()
}

/// A dashboard page as `cookie` sees it: status and HTML.
pub async fn dashboard_page(router: &Router, uri: &str, cookie: &str) -> (StatusCode, String) {
    let request = Request::builder().uri(uri).header("cookie", cookie).body(Body::empty()).unwrap();
    let reply = send(router, request).await;
    (reply.status, String::from_utf8_lossy(&reply.bytes).into_owned())
}

/// A response: status, headers and body (JSON when it parses, else a string).
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: axum::http::HeaderMap,
    /// Raw body.
    pub bytes: bytes::Bytes,
}

impl Reply {
    /// The body as JSON (Null when not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }
}

/// Sends one request through the router.
pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply { status, headers, bytes }
}

/// A JSON request with an optional bearer token.
pub async fn call(
    router: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    let request = match body {
        Some(body) => builder
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    };
    send(router, request).await
}

/// GET with a token.
pub async fn get(router: &Router, uri: &str, token: &str) -> Reply {
    call(router, Method::GET, uri, Some(token), None).await
}

/// POST JSON with a token.
pub async fn post(router: &Router, uri: &str, token: &str, body: Value) -> Reply {
    call(router, Method::POST, uri, Some(token), Some(body)).await
}

/// A multipart body with `purpose` and `file`.
pub fn multipart(filename: &str, purpose: &str, content: &[u8]) -> (String, Vec<u8>) {
    let boundary = "verity-test-boundary-1234";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/jsonl\r\n\r\n")
            .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Uploads a file through the router.
pub async fn upload(router: &Router, token: &str, filename: &str, content: &[u8]) -> Reply {
    upload_for(router, token, filename, "fine-tune", content).await
}

/// Uploads a file with the given `purpose` through the router.
pub async fn upload_for(
    router: &Router,
    token: &str,
    filename: &str,
    purpose: &str,
    content: &[u8],
) -> Reply {
    let (content_type, body) = multipart(filename, purpose, content);
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/files")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap();
    send(router, request).await
}

/// A valid two-record dataset.
pub const DATASET: &[u8] = b"{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"3+3?\"}], \"reference_answer\": \"6\"}\n";

/// A reinforcement method with a string_check grader.
pub fn method() -> Value {
    serde_json::json!({
        "type": "reinforcement",
        "reinforcement": {
            "grader": {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.reference_answer}}", "operation": "eq"},
            "hyperparameters": {"n_epochs": 1, "batch_size": 2}
        }
    })
}

/// Registers the shared base model `tiny` (a folder with one file).
pub async fn base_model(app: &TestApp) {
    verity_core::testing::tiny_base_model(&app.state.pool, app.state.store.as_ref()).await;
}

/// Uploads the dataset and creates a job; returns (file id, job id).
pub async fn file_and_job(app: &TestApp, token: &str) -> (String, String) {
    let file = upload(&app.router, token, "train.jsonl", DATASET).await;
    assert_eq!(file.status, StatusCode::OK, "{:?}", file.json());
    let file_id = file.json()["id"].as_str().unwrap().to_string();
    let job = post(
        &app.router,
        "/v1/fine_tuning/jobs",
        token,
        serde_json::json!({"model": "tiny", "training_file": file_id, "method": method()}),
    )
    .await;
    assert_eq!(job.status, StatusCode::OK, "{:?}", job.json());
    (file_id, job.json()["id"].as_str().unwrap().to_string())
}

/// Asserts an OpenAI-shaped error: its status, a message, a type, and the parameter named.
pub fn assert_error(reply: &Reply, status: StatusCode, param: Option<&str>) {
    assert_eq!(reply.status, status, "{}", String::from_utf8_lossy(&reply.bytes));
    let body = reply.json();
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{body}");
    }
}
