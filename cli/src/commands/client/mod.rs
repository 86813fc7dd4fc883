//! Client commands that talk to a running server over HTTP: `files`, `jobs`, `checkpoints`,
//! `evaluations` and `rejection-sampling`.

pub mod checkpoints;
pub mod files;
pub mod jobs;
pub mod preflight;
pub mod profile;
pub mod recipes;
pub mod runs;

use anyhow::{anyhow, Context};
use clap::Args;
use reqwest::{RequestBuilder, Response};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// File in the data dir of `verity up` holding the admin API key.
pub const ADMIN_KEY_FILE: &str = "admin-key";

/// Where the server is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Base URL of the Verity server.
    #[arg(
        long = "url",
        env = "VERITY_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// API key (when unset and the server is local, the key `verity up` wrote to its data dir).
    #[arg(long = "api-key", env = "VERITY_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// Data dir of `verity up`, for its admin key.
    #[arg(long = "data-dir", env = "VERITY_DATA_DIR", default_value = "./.verity", global = true)]
    pub data_dir: PathBuf,
    /// Print the server's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// An authenticated HTTP client of the REST API.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    /// A client of the server at `base` using API key `key`.
    pub fn new(base: &str, key: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_string(),
            key: key.to_string(),
        }
    }

    /// A client from the command's options; the key falls back to `<data-dir>/admin-key` for a
    /// local server.
    pub fn from_args(args: &ClientArgs) -> anyhow::Result<Client> {
        let key = match &args.api_key {
            Some(key) if !key.is_empty() => key.clone(),
            _ if is_local(&args.url) => read_admin_key(&args.data_dir)?,
            _ => anyhow::bail!("set VERITY_API_KEY (or --api-key) to talk to {}", args.url),
        };
        Ok(Client::new(&args.url, &key))
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request to `path` (starting with `/`) with the key attached.
    pub fn request(&self, method: reqwest::Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.key)
    }

    /// `GET path` as JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        json_of(self.send(self.request(reqwest::Method::GET, path)).await?).await
    }

    /// `POST path` with a JSON body, answered with JSON.
    pub async fn post_json(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        json_of(self.send(self.request(reqwest::Method::POST, path).json(body)).await?).await
    }

    /// Sends `request`; a non-2xx answer becomes an error carrying the API's message.
    pub async fn send(&self, request: RequestBuilder) -> anyhow::Result<Response> {
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the Verity server at {}", self.base))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        Err(anyhow!("{}", api_error_message(status, &body)))
    }
}

/// `HTTP 400: message (param x)` from an API error body (or the raw body).
fn api_error_message(status: reqwest::StatusCode, body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    match error.and_then(|e| e.get("message")).and_then(Value::as_str) {
        Some(message) => match error.and_then(|e| e.get("param")).and_then(Value::as_str) {
            Some(param) => format!("HTTP {status}: {message} (param `{param}`)"),
            None => format!("HTTP {status}: {message}"),
        },
        None => format!("HTTP {status}: {}", body.trim()),
    }
}

async fn json_of(response: Response) -> anyhow::Result<Value> {
    response.json().await.context("reading the server's JSON answer")
}

/// Whether `url` names this machine.
fn is_local(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1")
}

/// The admin key `verity up` wrote into `data_dir`.
pub fn read_admin_key(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join(ADMIN_KEY_FILE);
    let key = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no API key: set VERITY_API_KEY, or run `verity up` (which writes {})",
            path.display()
        )
    })?;
    Ok(key.trim().to_string())
}

/// The JSON document in file `path` (a request body); errors name the file.
pub fn read_json(path: &std::path::Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// Prints `value` as pretty JSON.
pub fn print_json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()));
}

/// A string field of `value`, or `-`.
pub fn field<'a>(value: &'a Value, name: &str) -> &'a str {
    value.get(name).and_then(Value::as_str).unwrap_or("-")
}

/// A byte-progress bar of `total` bytes (a spinner when unknown); hidden when stderr is no terminal.
pub fn byte_bar(total: Option<u64>, message: &str) -> indicatif::ProgressBar {
    let bar = match total {
        Some(total) => indicatif::ProgressBar::new(total),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let style = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(message.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_urls_are_recognised() {
        assert!(is_local("http://127.0.0.1:8080"));
        assert!(is_local("http://localhost/"));
        assert!(is_local("http://[::1]:9000/v1"));
        assert!(!is_local("https://verity.example.com"));
        assert!(!is_local("http://10.0.0.5:8080"));
    }

    #[test]
    fn api_errors_show_message_and_param() {
        let body = r#"{"error": {"message": "missing `model`", "type": "invalid_request_error", "param": "model", "code": null}}"#;
        assert_eq!(
            api_error_message(reqwest::StatusCode::BAD_REQUEST, body),
            "HTTP 400 Bad Request: missing `model` (param `model`)"
        );
        assert_eq!(
            api_error_message(reqwest::StatusCode::BAD_GATEWAY, "oops"),
            "HTTP 502 Bad Gateway: oops"
        );
    }
}
