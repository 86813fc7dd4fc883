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
    Serve(Box<verity_server::api::state::ServeConfig>),
    /// Manage users and API keys.
    #[command(subcommand)]
    Admin(crate::commands::admin::AdminCommand),
    /// Claim training jobs from the queue and run them.
    Worker(crate::commands::worker::WorkerArgs),
    /// Try graders on local files.
    #[command(subcommand)]
    Graders(crate::commands::graders::GradersCommand),
    /// Convert and manage model files.
    #[command(subcommand)]
    Models(crate::commands::models::ModelsCommand),
    /// Print the API description: OpenAPI JSON, or the Markdown reference (`--markdown`).
    Openapi(crate::commands::openapi::OpenapiArgs),
    /// Serve OpenAI-compatible inference for the API servers (registers itself in Postgres).
    Inference(verity_server::inference::InferenceArgs),
    /// Sample completions from a local model (chat template applied).
    Generate(crate::commands::generate::GenerateArgs),
    /// Everything on this machine: API and dashboard, one worker, a local object store, and a
    /// private Postgres cluster in the data dir unless DATABASE_URL is set.
    Up(crate::commands::up::UpArgs),
    /// `verity up --demo`: train SmolLM2-135M on the arithmetic example and follow it.
    Demo(crate::commands::up::UpArgs),
    /// What this machine has for Verity (BLAS, the grader sandbox, Postgres, memory, disk,
    /// models) and the command that fixes each missing piece.
    Doctor(crate::commands::doctor::DoctorArgs),
    /// Upload and list dataset files on a running server (VERITY_URL, VERITY_API_KEY).
    Files(crate::commands::client::files::FilesArgs),
    /// Create, list, show, control and watch fine-tuning jobs on a running server.
    Jobs(crate::commands::client::jobs::JobsArgs),
    /// Download a job's checkpoints from a running server.
    Checkpoints(crate::commands::client::checkpoints::CheckpointsArgs),
    /// Evaluation reports (pass@k of models on a file) on a running server.
    Evaluations(crate::commands::client::runs::RunsArgs),
    /// Rejection-sampling runs (graded samples kept as a supervised file) on a running server.
    RejectionSampling(crate::commands::client::runs::RunsArgs),
    /// Multi-stage recipes (SFT → RL → rejection sampling → SFT → evaluation) on a running
    /// server.
    Recipes(crate::commands::client::recipes::RecipesArgs),
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
    /// Jobs per hour and claim latency with 1, 2, 4, 8 `verity worker` processes on tiny jobs,
    /// Postgres connections per process, and API requests/s through 1 and 2 replicas.
    Cluster(crate::bench::cluster::ClusterBenchArgs),
    /// Math and sandboxed-code gradings per second.
    Graders(crate::bench::model::GradersBenchArgs),
    /// Decode throughput (tokens/s) and peak RSS of batched sampling with a KV cache.
    Rollout(crate::bench::model::RolloutArgs),
    /// Seconds and peak RSS of one forward + backward + AdamW step.
    TrainStep(crate::bench::model::TrainStepArgs),
    /// Seconds per GRPO step (sampling, grading, training) on arithmetic prompts, math grader.
    GrpoStep(crate::bench::model::GrpoStepArgs),
    /// A learning-quality run: validation pass@1 before and after a recipe, with the curve
    /// (defaults: the arithmetic example set and `examples/arithmetic/recipe.json`); with
    /// `--seeds`/`--set`, a resumable sweep over seeds and settings with a table and plots.
    Learn(crate::bench::learn::LearnArgs),
    /// Serving throughput at 1, 8 and 32 concurrent chat clients: requests/s, tokens/s, time
    /// to first token and latency (an in-process inference engine, or `--url` a server).
    Serve(crate::bench::serve::ServeBenchArgs),
}
