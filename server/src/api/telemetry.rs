//! Request tracing and Prometheus metrics: the middleware that counts requests and the
//! `/metrics` text exposition (requests, latency, jobs by state, queue depth, workers).

use super::error::ApiError;
use super::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 12] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default)]
struct Inner {
    requests: BTreeMap<(String, String, u16), u64>,
    latency: BTreeMap<String, Histogram>,
}

/// Request counters and latency histograms per route.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    inner: Mutex<Inner>,
}

impl HttpMetrics {
    /// Records one request.
    pub fn record(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *inner.requests.entry((method.to_string(), route.to_string(), status)).or_default() += 1;
        let histogram = inner.latency.entry(route.to_string()).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                histogram.counts[i] += 1;
            }
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    fn render(&self, out: &mut String) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str(
            "# HELP verity_http_requests_total HTTP requests by method, route and status.\n",
        );
        out.push_str("# TYPE verity_http_requests_total counter\n");
        for ((method, route, status), n) in &inner.requests {
            let _ = writeln!(out, "verity_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}", escape(route));
        }
        out.push_str("# HELP verity_http_request_duration_seconds Request latency by route.\n");
        out.push_str("# TYPE verity_http_request_duration_seconds histogram\n");
        for (route, h) in &inner.latency {
            let route = escape(route);
            for (bound, count) in BUCKETS.iter().zip(h.counts.iter()) {
                let _ = writeln!(out, "verity_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(
                out,
                "verity_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "verity_http_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "verity_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                h.count
            );
        }
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The `method` label of a request: one of the standard methods, every other one `other` (so
/// that clients cannot grow the label set).
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// Middleware: times each request and records it under its route template (a bounded set:
/// the router's templates, or `unmatched`) and its [`method_label`].
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    state.http_metrics.record(
        method,
        &route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// Window within which a worker counts as alive.
const WORKER_WINDOW_SECS: f64 = 120.0;

/// Whether `headers` carry `Authorization: Bearer {token}` (compared as SHA-256 digests, so the
/// time taken does not depend on how much of the token matched).
fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let sent = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    Sha256::digest(sent.trim().as_bytes()) == Sha256::digest(token.as_bytes())
}

/// `GET /metrics`: Prometheus text exposition; with `VERITY_METRICS_TOKEN` set, only for a
/// request bearing that token (401 otherwise).
pub async fn prometheus(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if let Some(token) = &state.metrics_token {
        if !bearer_matches(&headers, token) {
            let mut refused = ApiError::unauthorized(
                "/metrics needs the metrics token: Authorization: Bearer $VERITY_METRICS_TOKEN",
            )
            .into_response();
            refused.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return Ok(refused);
        }
    }
    let stats = verity_core::jobs::queue_stats(&state.pool, WORKER_WINDOW_SECS).await?;
    let mut out = String::new();
    state.http_metrics.render(&mut out);
    out.push_str("# HELP verity_jobs Jobs by state.\n# TYPE verity_jobs gauge\n");
    for job_state in verity_core::JobState::ALL {
        let n = stats.by_state.iter().find(|(s, _)| s == job_state.as_str()).map_or(0, |(_, n)| *n);
        let _ = writeln!(out, "verity_jobs{{state=\"{job_state}\"}} {n}");
    }
    out.push_str(
        "# HELP verity_queue_depth Queued jobs ready to run.\n# TYPE verity_queue_depth gauge\n",
    );
    let _ = writeln!(out, "verity_queue_depth {}", stats.queue_depth);
    out.push_str("# HELP verity_workers_seen Workers that sent a heartbeat in the last 2 minutes.\n# TYPE verity_workers_seen gauge\n");
    let _ = writeln!(out, "verity_workers_seen {}", stats.workers_seen);
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}
