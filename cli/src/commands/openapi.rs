//! `verity openapi [--markdown]`: the API description without a running server.

use clap::Args;
use utoipa::OpenApi;

/// Options of `verity openapi`.
#[derive(Debug, Args)]
pub struct OpenapiArgs {
    /// Print the Markdown reference (docs/api-reference.md) instead of the OpenAPI JSON.
    #[arg(long)]
    pub markdown: bool,
}

/// The OpenAPI document as JSON.
pub fn spec_json() -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::to_value(verity_server::api::openapi::ApiDoc::openapi())?)
}

/// Prints the description.
pub fn run(args: &OpenapiArgs) -> anyhow::Result<()> {
    let spec = spec_json()?;
    if args.markdown {
        print!("{}", verity_server::api::reference::reference_markdown(&spec));
    } else {
        println!("{}", serde_json::to_string_pretty(&spec)?);
    }
    Ok(())
}
