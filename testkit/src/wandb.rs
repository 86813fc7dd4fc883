//! A loopback server speaking the part of Weights & Biases' run protocol that Verity's exporter
//! uses (`upsertBucket` on `/graphql`, `/files/{entity}/{project}/{run}/file_stream`), keeping
//! what it was sent the way W&B does (history lines written at their offset, the summary, the
//! exit code), for tests; no W&B server is reachable from the test machines.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The entity runs land in when the request names none (the API key's default entity).
pub const DEFAULT_ENTITY: &str = "default-entity";

/// One run as the server holds it.
#[derive(Debug, Clone, Default)]
pub struct RecordedRun {
    /// Entity.
    pub entity: String,
    /// Project.
    pub project: String,
    /// Display name.
    pub display_name: Option<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// Config (W&B's `{key: {"value": …}}`).
    pub config: Value,
    /// `upsertBucket` calls for this run.
    pub upserts: usize,
    /// History lines, parsed, at their offsets.
    pub history: Vec<Value>,
    /// The last summary.
    pub summary: Option<Value>,
    /// The exit code of the closing message.
    pub exitcode: Option<i64>,
}

#[derive(Debug, Default)]
struct Recorded {
    api_key: String,
    runs: BTreeMap<String, RecordedRun>,
    failures_to_answer: usize,
    unauthorised: usize,
}

/// The server: its base URL and what it was sent.
#[derive(Clone)]
pub struct WandbServer {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    state: Arc<Mutex<Recorded>>,
}

impl WandbServer {
    /// Starts a server that accepts `api_key` only.
    pub async fn start(api_key: &str) -> std::io::Result<WandbServer> {
        let state =
            Arc::new(Mutex::new(Recorded { api_key: api_key.into(), ..Default::default() }));
        let app = Router::new()
            .route("/graphql", post(graphql))
            .route("/files/{entity}/{project}/{run}/file_stream", post(file_stream))
            .with_state(state.clone());
        let base_url = crate::serve::spawn_app(app).await?;
        Ok(WandbServer { base_url, state })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The run with id `run`, as it stands.
    pub fn run(&self, run: &str) -> Option<RecordedRun> {
        self.with(|r| r.runs.get(run).cloned())
    }

    /// Every run, by id.
    pub fn runs(&self) -> Vec<(String, RecordedRun)> {
        self.with(|r| r.runs.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Makes the next `n` requests fail with a 503.
    pub fn fail_next(&self, n: usize) {
        self.with(|r| r.failures_to_answer = n);
    }

    /// Requests refused for a wrong API key.
    pub fn unauthorised(&self) -> usize {
        self.with(|r| r.unauthorised)
    }
}

type Shared = State<Arc<Mutex<Recorded>>>;

/// Checks the key and the injected failures; the error status to answer, if any.
fn admit(recorded: &mut Recorded, headers: &HeaderMap) -> Option<StatusCode> {
    if recorded.failures_to_answer > 0 {
        recorded.failures_to_answer -= 1;
        return Some(StatusCode::SERVICE_UNAVAILABLE);
    }
    let expected =
        base64::engine::general_purpose::STANDARD.encode(format!("api:{}", recorded.api_key));
    let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
    if sent != Some(format!("Basic {expected}").as_str()) {
        recorded.unauthorised += 1;
        return Some(StatusCode::UNAUTHORIZED);
    }
    None
}

async fn graphql(
    State(state): Shared,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut recorded = state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(status) = admit(&mut recorded, &headers) {
        return (status, Json(json!({"errors": [{"message": "refused"}]})));
    }
    let query = body["query"].as_str().unwrap_or_default();
    if !query.contains("upsertBucket") {
        return (StatusCode::OK, Json(json!({"errors": [{"message": "unknown operation"}]})));
    }
    let v = &body["variables"];
    let (Some(name), Some(project)) = (v["name"].as_str(), v["project"].as_str()) else {
        return (
            StatusCode::OK,
            Json(json!({"errors": [{"message": "name and project are required"}]})),
        );
    };
    let entity = v["entity"].as_str().unwrap_or(DEFAULT_ENTITY).to_string();
    let config =
        v["config"].as_str().and_then(|c| serde_json::from_str(c).ok()).unwrap_or(Value::Null);
    let tags = v["tags"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t.as_str().map(String::from)).collect());
    let run = recorded.runs.entry(name.to_string()).or_default();
    let inserted = run.upserts == 0;
    run.upserts += 1;
    run.entity = entity.clone();
    run.project = project.to_string();
    run.display_name = v["displayName"].as_str().map(String::from);
    run.tags = tags.unwrap_or_default();
    run.config = config;
    let bucket = json!({"id": format!("bucket-{name}"), "name": name,
                        "project": {"name": project, "entity": {"name": entity}}});
    (
        StatusCode::OK,
        Json(json!({"data": {"upsertBucket": {"bucket": bucket, "inserted": inserted}}})),
    )
}

async fn file_stream(
    State(state): Shared,
    Path((entity, project, run)): Path<(String, String, String)>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut recorded = state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(status) = admit(&mut recorded, &headers) {
        return (status, Json(json!({"error": "refused"})));
    }
    let Some(held) =
        recorded.runs.get_mut(&run).filter(|r| r.entity == entity && r.project == project)
    else {
        return (StatusCode::NOT_FOUND, Json(json!({"error": "no such run"})));
    };
    if let Some(files) = body["files"].as_object() {
        for (file, chunk) in files {
            let offset = chunk["offset"].as_u64().unwrap_or(0) as usize;
            let lines: Vec<Value> = chunk["content"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter_map(|l| l.as_str().and_then(|l| serde_json::from_str(l).ok()))
                        .collect()
                })
                .unwrap_or_default();
            match file.as_str() {
                "wandb-history.jsonl" => {
                    if offset > held.history.len() {
                        return (
                            StatusCode::BAD_REQUEST,
                            Json(json!({"error": "offset past the end"})),
                        );
                    }
                    held.history.truncate(offset);
                    held.history.extend(lines);
                }
                "wandb-summary.json" => held.summary = lines.into_iter().last(),
                _ => {}
            }
        }
    }
    if body["complete"].as_bool() == Some(true) {
        held.exitcode = body["exitcode"].as_i64();
    }
    (StatusCode::OK, Json(json!({"limits": {}})))
}
