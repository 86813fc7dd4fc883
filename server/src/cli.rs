//! Command-line interface definition.

use clap::{Parser, Subcommand};
use verity_core::config::DatabaseConfig;

/// Verity: reinforcement fine-tuning of language models with verifiable rewards.
#[derive(Debug, Parser)]
#[command(name = "verity", version, about)]
pub struct Cli {
    /// Log as JSON lines.
    #[arg(long, global = true, env = "VERITY_LOG_JSON")]
    pub log_json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply database migrations.
    Migrate(DatabaseConfig),
    /// Serve the REST API.
    Serve(crate::api::state::ServeConfig),
    /// Manage users and API keys.
    #[command(subcommand)]
    Admin(crate::commands::admin::AdminCommand),
    /// Run a benchmark and print JSON lines.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Queue throughput: claims per second and claim latency at several worker counts, in a
    /// scratch database created (and dropped) on the server of DATABASE_URL.
    Queue(crate::bench::queue::QueueBenchArgs),
}
