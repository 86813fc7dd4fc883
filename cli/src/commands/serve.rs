//! `verity serve`: the REST API.

use anyhow::Context;
use verity_server::api::state::ServeConfig;

/// Connects, migrates, and serves until ctrl-c or SIGTERM.
pub async fn run(config: &ServeConfig) -> anyhow::Result<()> {
    let state = verity_server::app::build_state(config).await?;
    let listener = tokio::net::TcpListener::bind(&config.bind)
        .await
        .with_context(|| format!("binding {}", config.bind))?;
    let address = listener.local_addr().context("reading the bound address")?;
    tracing::info!(%address, "verity API listening");
    println!("{{\"listening\": \"http://{address}\"}}");
    verity_server::app::serve(listener, verity_server::app::app(state))
        .await
        .context("serving HTTP")
}
