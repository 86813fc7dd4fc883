//! Serving on free loopback ports: an in-process router, or a spawned `verity serve`.

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;

/// A free TCP port on 127.0.0.1 (bound, read and released; for a child process to bind).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Serves `app` on a free loopback port in the background, with client addresses recorded as
/// `verity serve` does; its base URL (`http://127.0.0.1:PORT`).
pub async fn spawn_app(app: axum::Router) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let service = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    Ok(base)
}

/// The base URL a spawned `verity serve` announces on its first stdout line
/// (`{"listening": "http://…"}`).
pub async fn listening_address(stdout: ChildStdout) -> anyhow::Result<String> {
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    let listening: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| anyhow::anyhow!("unexpected first line {line:?}: {e}"))?;
    listening["listening"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no \"listening\" in the first line {line:?}"))
}
