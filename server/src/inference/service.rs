//! The internal HTTP endpoint of an inference worker: `POST /internal/v1/generate` takes a
//! resolved [`GenerationRequest`] (bearer: the worker's token) and answers newline-delimited
//! JSON [`GenerationEvent`]s, `started` first; a request the model cannot take is a JSON error
//! with its status. Closing the connection abandons the generation (its batch rows are freed).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::json;
use std::sync::Arc;
use verity_worker::inference::request::{GenerationEvent, GenerationRequest};
use verity_worker::inference::{Engine, ServeError};

#[derive(Clone)]
struct Internal {
    engine: Arc<Engine>,
    token: Arc<str>,
}

/// The internal routes of an inference worker.
pub fn router(engine: Arc<Engine>, token: Arc<str>) -> Router {
    Router::new()
        .route("/internal/v1/generate", post(generate))
        .route("/internal/v1/status", get(status))
        .with_state(Internal { engine, token })
}

/// The status and body of an error of the internal endpoint.
fn error(status: StatusCode, message: String, param: Option<&str>) -> Response {
    (status, Json(json!({"error": {"message": message, "param": param}}))).into_response()
}

/// Whether the request carries the worker's token (compared in constant time).
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    given.len() == token.len()
        && given.bytes().zip(token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

async fn generate(
    State(internal): State<Internal>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !authorized(&headers, &internal.token) {
        return error(StatusCode::UNAUTHORIZED, "bad inference token".into(), None);
    }
    let request: GenerationRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return error(StatusCode::BAD_REQUEST, format!("bad generation request: {e}"), None)
        }
    };
    let generation = match internal.engine.generate(request).await {
        Ok(generation) => generation,
        Err(e @ ServeError::InvalidParam { param, .. }) => {
            return error(StatusCode::BAD_REQUEST, e.to_string(), Some(param))
        }
        Err(e @ ServeError::Overloaded(_)) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), None)
        }
        Err(e @ ServeError::ModelUnavailable(_)) => {
            tracing::error!(error = %e, "model unavailable for inference");
            return error(StatusCode::BAD_GATEWAY, e.to_string(), None);
        }
    };
    let started = GenerationEvent::Started {
        prompt_tokens: generation.prompt_tokens,
        max_tokens: generation.max_tokens,
    };
    let events = tokio_stream_of(generation.events);
    let lines = futures::stream::once(async move { started }).chain(events).map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line))
    });
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), None))
}

/// The events of a generation as a stream (dropping it drops the receiver).
fn tokio_stream_of(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>,
) -> impl futures::Stream<Item = GenerationEvent> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn status(State(internal): State<Internal>, headers: HeaderMap) -> Response {
    if !authorized(&headers, &internal.token) {
        return error(StatusCode::UNAUTHORIZED, "bad inference token".into(), None);
    }
    Json(json!({
        "active_requests": internal.engine.active_requests(),
        "active_sequences": internal.engine.active_sequences(),
        "models": internal.engine.loaded_models().await,
    }))
    .into_response()
}
