//! The part of Weights & Biases' run protocol an exporter needs, as W&B's own SDK speaks it:
//! create or update a run (`upsertBucket` on `{base}/graphql`) and append to its files
//! (`{base}/files/{entity}/{project}/{run}/file_stream`: history lines at an offset, the summary,
//! and the closing message), with HTTP basic auth `api:{key}`.

use clap::Args;
use serde_json::{json, Value};
use std::time::Duration;

/// W&B's hosted service.
pub const DEFAULT_BASE_URL: &str = "https://api.wandb.ai";
/// Longest one request to W&B may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where jobs with a `wandb` integration are exported (the variables W&B's own tools read).
#[derive(Debug, Clone, Args)]
pub struct WandbArgs {
    /// API key of the Weights & Biases account that jobs with a `wandb` integration log to;
    /// unset, such jobs are refused at creation.
    #[arg(long = "wandb-api-key", env = "WANDB_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The W&B server: W&B's cloud or a self-hosted one.
    #[arg(long = "wandb-base-url", env = "WANDB_BASE_URL", default_value = DEFAULT_BASE_URL)]
    pub base_url: String,
}

impl Default for WandbArgs {
    fn default() -> Self {
        WandbArgs { api_key: None, base_url: DEFAULT_BASE_URL.to_string() }
    }
}

/// What went wrong talking to W&B.
#[derive(Debug, thiserror::Error)]
pub enum WandbError {
    /// The request did not get an answer.
    #[error("W&B did not answer: {0}")]
    Http(#[from] reqwest::Error),
    /// W&B answered with an error status.
    #[error("W&B answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// W&B's GraphQL answer held errors or lacked the run.
    #[error("W&B refused the run: {0}")]
    Refused(String),
}

/// The run a job is exported to: the path segments of its file stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPath {
    /// Entity (user or team) the run lives in.
    pub entity: String,
    /// Project.
    pub project: String,
    /// The run's id (Verity uses the job id).
    pub run: String,
}

/// What a run is created with.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// The run's id.
    pub run: &'a str,
    /// Project.
    pub project: &'a str,
    /// Entity (`None`: the API key's default entity).
    pub entity: Option<&'a str>,
    /// Display name.
    pub display_name: &'a str,
    /// Tags.
    pub tags: &'a [String],
    /// The run's config (`{key: value}`; sent as W&B's `{key: {"value": value}}`).
    pub config: &'a serde_json::Map<String, Value>,
}

const UPSERT_RUN: &str = "mutation UpsertBucket($name: String, $project: String, $entity: String, \
     $displayName: String, $config: JSONString, $tags: [String!], $jobType: String) {
  upsertBucket(input: {name: $name, modelName: $project, entityName: $entity, \
     displayName: $displayName, config: $config, tags: $tags, jobType: $jobType}) {
    bucket { id name project { name entity { name } } }
    inserted
  }
}";

/// A client of one W&B server with one API key.
#[derive(Debug, Clone)]
pub struct WandbClient {
    http: reqwest::Client,
    base: reqwest::Url,
    api_key: String,
}

impl WandbClient {
    /// The client `args` configure; `None` without an API key; an error for a base URL that is
    /// not http(s).
    pub fn new(args: &WandbArgs) -> Result<Option<Self>, String> {
        let Some(api_key) = args.api_key.clone().filter(|k| !k.trim().is_empty()) else {
            return Ok(None);
        };
        let base = reqwest::Url::parse(args.base_url.trim_end_matches('/'))
            .map_err(|e| format!("WANDB_BASE_URL {:?}: {e}", args.base_url))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(format!("WANDB_BASE_URL {:?}: not an http(s) URL", args.base_url));
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the W&B client: {e}"))?;
        Ok(Some(WandbClient { http, base, api_key }))
    }

    /// `{base}/segment/…`, each segment percent-encoded (names never become other paths).
    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    async fn post(&self, url: reqwest::Url, body: &Value) -> Result<Value, WandbError> {
        let response =
            self.http.post(url).basic_auth("api", Some(&self.api_key)).json(body).send().await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            let body: String = text.chars().take(300).collect();
            return Err(WandbError::Status { status: status.as_u16(), body });
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Creates the run (or updates it: the same id twice is one run); where it lives.
    pub async fn upsert_run(&self, run: &NewRun<'_>) -> Result<RunPath, WandbError> {
        let config: serde_json::Map<String, Value> =
            run.config.iter().map(|(k, v)| (k.clone(), json!({"value": v}))).collect();
        let body = json!({
            "query": UPSERT_RUN,
            "variables": {
                "name": run.run, "project": run.project, "entity": run.entity,
                "displayName": run.display_name, "tags": run.tags,
                "config": Value::Object(config).to_string(), "jobType": "fine-tuning",
            },
        });
        let answer = self.post(self.url(&["graphql"]), &body).await?;
        if let Some(errors) =
            answer.get("errors").and_then(Value::as_array).filter(|e| !e.is_empty())
        {
            let messages: Vec<&str> = errors.iter().filter_map(|e| e["message"].as_str()).collect();
            return Err(WandbError::Refused(messages.join("; ")));
        }
        let project = &answer["data"]["upsertBucket"]["bucket"]["project"];
        match (project["name"].as_str(), project["entity"]["name"].as_str()) {
            (Some(name), Some(entity)) => Ok(RunPath {
                entity: entity.to_string(),
                project: name.to_string(),
                run: run.run.to_string(),
            }),
            _ => Err(WandbError::Refused(format!("no run in the answer: {answer}"))),
        }
    }

    /// Posts one message of the run's file stream (history lines, summary, or the close).
    pub async fn stream(&self, run: &RunPath, message: &Value) -> Result<(), WandbError> {
        let url = self.url(&["files", &run.entity, &run.project, &run.run, "file_stream"]);
        self.post(url, message).await.map(|_| ())
    }
}
