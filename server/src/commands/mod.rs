//! Subcommand implementations.

pub mod admin;
mod migrate;
pub mod serve;

use crate::cli::{BenchCommand, Command};

/// Runs one subcommand.
pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Migrate(db) => migrate::run(&db).await,
        Command::Serve(config) => serve::run(&config).await,
        Command::Admin(admin) => admin::run(&admin).await,
        Command::Bench(BenchCommand::Queue(args)) => crate::bench::queue::run(&args).await,
    }
}
