//! The `verity` binary: one executable for the server, workers, administration and benchmarks.

mod bench;
mod cli;
mod commands;
mod logging;

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    logging::init(cli.log_json);
    commands::run(cli.command).await
}
