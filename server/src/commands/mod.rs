//! Subcommand implementations.

mod migrate;

use crate::cli::{BenchCommand, Command};

/// Runs one subcommand.
pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Migrate(db) => migrate::run(&db).await,
        Command::Bench(BenchCommand::Queue(args)) => crate::bench::queue::run(&args).await,
    }
}
