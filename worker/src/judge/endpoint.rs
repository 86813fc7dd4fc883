//! An operator-routed judge: an OpenAI-compatible `/chat/completions` endpoint (vLLM, SGLang,
//! llama.cpp server, a hosted API), with a timeout per request and retries with backoff. An
//! endpoint that stays down is an outage ([`JudgeError::Unavailable`]), never a score.

use std::time::Duration;

use serde_json::{json, Value};
use verity_verifiers::{Judge, JudgeError, JudgePrompt, JudgeReply, TokenUsage};

/// Requests in flight at once to one endpoint.
const CONCURRENCY: usize = 8;

/// First retry delay; doubled on each retry.
const BACKOFF_BASE: Duration = Duration::from_millis(250);

/// One judge name routed to an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeEndpoint {
    /// The judge name graders use as `model` (sent to the endpoint as its `model`).
    pub name: String,
    /// Base URL, e.g. `http://127.0.0.1:8000/v1` (`/chat/completions` is appended).
    pub base_url: String,
    /// Name of the environment variable holding the API key (read when the judge is built).
    pub key_env: Option<String>,
}

/// How endpoint judges are routed and retried (from `VERITY_JUDGE_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeSettings {
    /// Judge names routed to endpoints.
    pub endpoints: Vec<JudgeEndpoint>,
    /// Time limit of one request.
    pub timeout: Duration,
    /// Retries after a failed request (connection error, timeout, 429 or 5xx).
    pub retries: u32,
    /// Judge models kept loaded in one process.
    pub models_loaded: usize,
}

impl Default for JudgeSettings {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            timeout: Duration::from_secs(60),
            retries: 3,
            models_loaded: 2,
        }
    }
}

/// A malformed `VERITY_JUDGE_ENDPOINTS`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("VERITY_JUDGE_ENDPOINTS entry {entry:?}: {message}")]
pub struct EndpointsError {
    /// The entry.
    pub entry: String,
    /// What is wrong.
    pub message: String,
}

/// Parses `name=url[|KEY_ENV],…` (commas or whitespace between entries).
pub fn parse_endpoints(text: &str) -> Result<Vec<JudgeEndpoint>, EndpointsError> {
    let mut out: Vec<JudgeEndpoint> = Vec::new();
    for entry in text.split(|c: char| c == ',' || c.is_whitespace()).filter(|e| !e.is_empty()) {
        let bad = |message: &str| EndpointsError { entry: entry.into(), message: message.into() };
        let (name, rest) = entry.split_once('=').ok_or_else(|| bad("expected name=url"))?;
        let (url, key_env) = match rest.split_once('|') {
            Some((url, env)) if !env.is_empty() => (url, Some(env.to_string())),
            Some(_) => return Err(bad("empty key variable after '|'")),
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(bad("empty judge name"));
        }
        // The same parser as every outbound allow-list: http(s), a host, no userinfo, no
        // encoded dot segments.
        if let Err(e) = verity_core::urls::OutboundUrl::parse(url) {
            return Err(bad(&format!("the URL must be http:// or https://: {e}")));
        }
        if out.iter().any(|e| e.name == name) {
            return Err(bad("judge name given twice"));
        }
        out.push(JudgeEndpoint {
            name: name.to_string(),
            base_url: url.trim_end_matches('/').to_string(),
            key_env,
        });
    }
    Ok(out)
}

impl JudgeSettings {
    /// The endpoint a judge name is routed to, if any.
    pub fn endpoint(&self, name: &str) -> Option<&JudgeEndpoint> {
        self.endpoints.iter().find(|e| e.name == name)
    }
}

/// A judge that asks one endpoint.
pub struct EndpointJudge {
    endpoint: JudgeEndpoint,
    api_key: Option<String>,
    timeout: Duration,
    retries: u32,
}

impl EndpointJudge {
    /// A judge for `endpoint`; the API key is read from its variable now (never stored in jobs).
    pub fn new(endpoint: JudgeEndpoint, settings: &JudgeSettings) -> Self {
        let api_key = endpoint.key_env.as_deref().and_then(|v| std::env::var(v).ok());
        Self { endpoint, api_key, timeout: settings.timeout, retries: settings.retries }
    }

    fn body(&self, prompt: &JudgePrompt) -> Value {
        let s = &prompt.sampling;
        let mut body = json!({
            "model": self.endpoint.name,
            "messages": prompt.messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": s.seed,
            "max_tokens": s.max_completion_tokens,
        });
        if let Some(effort) = &s.reasoning_effort {
            body["reasoning_effort"] = json!(effort);
        }
        body
    }

    async fn ask(
        &self,
        client: &reqwest::Client,
        prompt: &JudgePrompt,
    ) -> Result<JudgeReply, JudgeError> {
        let url = format!("{}/chat/completions", self.endpoint.base_url);
        let body = self.body(prompt);
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                tokio::time::sleep(BACKOFF_BASE * 2u32.saturating_pow(attempt - 1)).await;
            }
            let mut request = client.post(&url).json(&body).timeout(self.timeout);
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => {
                    last = format!("{url}: {e}");
                    continue;
                }
            };
            let status = response.status();
            if status.as_u16() == 429 || status.is_server_error() {
                last = format!("{url} answered {status}");
                continue;
            }
            let text = match response.text().await {
                Ok(t) => t,
                Err(e) => {
                    last = format!("{url}: reading the reply: {e}");
                    continue;
                }
            };
            if !status.is_success() {
                let excerpt: String = text.chars().take(300).collect();
                return Err(JudgeError::Failed(format!("{url} answered {status}: {excerpt}")));
            }
            let value: Value = serde_json::from_str(&text)
                .map_err(|e| JudgeError::Failed(format!("{url}: reply is not JSON: {e}")))?;
            let text = value["choices"][0]["message"]["content"].as_str().ok_or_else(|| {
                JudgeError::Failed(format!("{url}: reply has no choices[0].message.content"))
            })?;
            // OpenAI's `usage` (absent from some servers: then the cost is unknown, 0)
            let count = |field: &str| value["usage"][field].as_u64().unwrap_or(0);
            let usage = TokenUsage {
                prompt_tokens: count("prompt_tokens"),
                completion_tokens: count("completion_tokens"),
            };
            return Ok(JudgeReply { text: text.to_string(), usage });
        }
        Err(JudgeError::Unavailable(format!(
            "judge '{}' failed {} time(s); last: {last}",
            self.endpoint.name,
            self.retries + 1
        )))
    }

    async fn ask_all(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
        // Redirects are not followed: the operator's URL is the only place a judge prompt goes.
        let client =
            match reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build() {
                Ok(c) => c,
                Err(e) => {
                    let error = JudgeError::Unavailable(format!("HTTP client: {e}"));
                    return prompts.iter().map(|_| Err(error.clone())).collect();
                }
            };
        let semaphore = tokio::sync::Semaphore::new(CONCURRENCY);
        let (client, semaphore) = (&client, &semaphore);
        let asks = prompts.iter().map(|p| async move {
            let _permit = semaphore.acquire().await;
            self.ask(client, p).await
        });
        futures::future::join_all(asks).await
    }
}

impl Judge for EndpointJudge {
    fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
        // Graders call judges from plain threads; the requests run on a runtime of their own,
        // on a thread of their own, whatever runtime (if any) the caller is inside.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(runtime) => runtime.block_on(self.ask_all(prompts)),
                        Err(e) => {
                            let error = JudgeError::Unavailable(format!("judge runtime: {e}"));
                            prompts.iter().map(|_| Err(error.clone())).collect()
                        }
                    }
                })
                .join()
                .unwrap_or_else(|_| {
                    let error = JudgeError::Failed("the endpoint judge panicked".into());
                    prompts.iter().map(|_| Err(error.clone())).collect()
                })
        })
    }
}
