//! Subcommand implementations.

pub mod admin;
pub mod client;
pub mod demo;
pub mod doctor;
pub mod generate;
pub mod graders;
mod migrate;
pub mod models;
pub mod openapi;
pub mod postgres_cluster;
pub mod serve;
pub mod up;
pub mod worker;

use crate::cli::{BenchCommand, Command};

/// Runs one subcommand.
pub async fn run(command: Command) -> anyhow::Result<()> {
    // Matrix products open OpenBLAS on first use; a machine without one gets SciPy's build
    // from PyPI then (`verity doctor` only reports). Commands that train or serve open it at
    // start, so the one fetch happens before any work and is logged there.
    verity_worker::pypi_blas::register(!matches!(command, Command::Doctor(_)));
    if computes(&command) {
        tokio::task::spawn_blocking(verity_kernels::blas_in_use).await?;
    }
    match command {
        Command::Migrate(db) => migrate::run(&db).await,
        Command::Serve(config) => serve::run(&config).await,
        Command::Admin(admin) => admin::run(&admin).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Graders(graders) => {
            tokio::task::spawn_blocking(move || graders::run(&graders)).await?
        }
        Command::Models(models) => models::run(&models).await,
        Command::Generate(args) => generate::run(&args).await,
        Command::Inference(args) => verity_server::inference::run(args).await,
        Command::Openapi(args) => openapi::run(&args),
        Command::Up(args) => up::run(args).await,
        Command::Demo(args) => up::run(up::UpArgs { demo: true, ..args }).await,
        Command::Doctor(args) => tokio::task::spawn_blocking(move || doctor::run(&args)).await?,
        Command::Files(args) => client::files::run(&args).await,
        Command::Jobs(args) => client::jobs::run(&args).await,
        Command::Checkpoints(args) => client::checkpoints::run(&args).await,
        Command::Evaluations(args) => {
            client::runs::run(client::runs::RunKind::Evaluation, &args).await
        }
        Command::RejectionSampling(args) => {
            client::runs::run(client::runs::RunKind::RejectionSampling, &args).await
        }
        Command::Recipes(args) => client::recipes::run(&args).await,
        Command::Bench(BenchCommand::Queue(args)) => crate::bench::queue::run(&args).await,
        Command::Bench(BenchCommand::Cluster(args)) => crate::bench::cluster::run(&args).await,
        Command::Bench(BenchCommand::Graders(args)) => crate::bench::model::graders(&args).await,
        Command::Bench(BenchCommand::Rollout(args)) => crate::bench::model::rollout(&args).await,
        Command::Bench(BenchCommand::TrainStep(args)) => {
            crate::bench::model::train_step(&args).await
        }
        Command::Bench(BenchCommand::GrpoStep(args)) => crate::bench::model::grpo_step(&args).await,
        Command::Bench(BenchCommand::Learn(args)) => crate::bench::learn::learn(&args).await,
        Command::Bench(BenchCommand::Serve(args)) => crate::bench::serve::run(&args).await,
    }
}

/// Whether the command trains, samples or serves models (and so multiplies matrices).
fn computes(command: &Command) -> bool {
    matches!(
        command,
        Command::Worker(_)
            | Command::Generate(_)
            | Command::Inference(_)
            | Command::Up(_)
            | Command::Demo(_)
            | Command::Bench(
                BenchCommand::Rollout(_)
                    | BenchCommand::TrainStep(_)
                    | BenchCommand::GrpoStep(_)
                    | BenchCommand::Learn(_)
                    | BenchCommand::Serve(_)
            )
    )
}
