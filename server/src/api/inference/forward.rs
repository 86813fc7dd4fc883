//! Forwarding a resolved generation to a live inference worker (found in `inference_workers`,
//! preferring one that has the model loaded, then the least busy) and reading its event stream.

use crate::api::error::ApiError;
use crate::api::state::AppState;
use crate::inference::registry::FRESH_SECS;
use axum::http::StatusCode;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;
use verity_worker::inference::request::{GenerationEvent, GenerationRequest};

/// The events of a generation after `started`; ends when the worker closes the stream.
pub type Events = Pin<Box<dyn Stream<Item = GenerationEvent> + Send>>;

/// A generation accepted by a worker.
pub struct Forwarded {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// The events that follow.
    pub events: Events,
}

/// 503: no inference worker is live.
pub(crate) fn no_worker() -> ApiError {
    let mut e = ApiError::unavailable("inference", "no live inference worker");
    e.message = "no inference worker is available; start one with `verity inference`".into();
    e.retry_after = Some(5);
    e
}

/// Sends `request` to a live inference worker; its refusals come back as the API's errors (a
/// 400 names the field, e.g. `max_tokens` beyond the model's context).
pub async fn forward(state: &AppState, request: &GenerationRequest) -> Result<Forwarded, ApiError> {
    let mut workers =
        verity_core::inference::live_inference_workers(&state.pool, FRESH_SECS).await?;
    let key = request.model.cache_key();
    // Stable: the least busy worker that has the model loaded, else the least busy one.
    workers.sort_by_key(|w| {
        !w.models.as_array().is_some_and(|m| m.iter().any(|k| k.as_str() == Some(key.as_str())))
    });
    for worker in workers {
        let url = format!("{}/internal/v1/generate", worker.address.trim_end_matches('/'));
        let sent =
            state.inference_http.post(&url).bearer_auth(&worker.token).json(request).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, worker = %worker.id, "inference worker unreachable; trying the next");
                continue;
            }
        };
        if !response.status().is_success() {
            return Err(worker_error(response.status(), response.json::<Value>().await.ok()));
        }
        let mut events = event_lines(response);
        return match events.next().await {
            Some(GenerationEvent::Started { prompt_tokens, .. }) => {
                Ok(Forwarded { prompt_tokens, events })
            }
            other => Err(ApiError::unavailable("inference", format!("unexpected start {other:?}"))),
        };
    }
    Err(no_worker())
}

/// The API error of a worker's refusal.
fn worker_error(status: reqwest::StatusCode, body: Option<Value>) -> ApiError {
    let error = body.as_ref().and_then(|b| b.get("error"));
    let message =
        error.and_then(|e| e.get("message")).and_then(Value::as_str).unwrap_or("inference failed");
    let param = error.and_then(|e| e.get("param")).and_then(Value::as_str);
    match status.as_u16() {
        400 => ApiError::invalid(param.unwrap_or("body"), message),
        503 => {
            let mut e = ApiError::unavailable("inference", message);
            e.message = message.to_string();
            e.retry_after = Some(5);
            e
        }
        _ => {
            let mut e = ApiError::internal("inference worker", message);
            e.status = StatusCode::BAD_GATEWAY;
            e.message = message.to_string();
            e
        }
    }
}

/// The worker's newline-delimited JSON events; a broken stream ends with `failed`.
fn event_lines(response: reqwest::Response) -> Events {
    let bytes = Box::pin(response.bytes_stream());
    let state = (bytes, Vec::<u8>::new(), false);
    Box::pin(futures::stream::unfold(state, |(mut bytes, mut buf, mut done)| async move {
        loop {
            if let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                let event = serde_json::from_slice(&line).unwrap_or_else(|e| {
                    GenerationEvent::Failed { message: format!("bad event from the worker: {e}") }
                });
                return Some((event, (bytes, buf, done)));
            }
            if done {
                return None;
            }
            match bytes.next().await {
                Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    done = true;
                    buf.clear();
                    let failed = GenerationEvent::Failed {
                        message: format!("the inference worker broke off: {e}"),
                    };
                    return Some((failed, (bytes, buf, done)));
                }
                None => done = true,
            }
        }
    }))
}
