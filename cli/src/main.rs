//! The `verity` binary: one executable for the server, workers, administration and benchmarks.

use clap::Parser;
use verity_cli::{cli, commands, logging};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    logging::init(cli.log_json);
    let policy = verity_cli::allocator::retain_freed_memory();
    tracing::debug!(?policy, "malloc policy");
    commands::run(cli.command).await
}
