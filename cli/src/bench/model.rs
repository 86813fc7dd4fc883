//! `verity bench rollout|train-step|grpo-step`: model and grader throughput (JSON lines).

use clap::Args;
use std::path::PathBuf;
use verity_core::spec::RolloutDtype;

/// The model a model benchmark runs, and where.
#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// HF folder or GGUF file (with --random-weights: a folder with config.json and the
    /// tokenizer, e.g. bench/models/qwen2.5-1.5b).
    #[arg(long)]
    pub model: PathBuf,
    /// Device: cpu or cuda:N (a GPU runs bf16 mixed precision unless VERITY_PRECISION=f32).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Draw the weights at random from config.json instead of reading them (same shapes, same
    /// speed; for models whose weights are not at hand).
    #[arg(long = "random-weights")]
    pub random_weights: bool,
}

impl BenchModelArgs {
    fn bench_model(&self) -> verity_worker::bench::BenchModel {
        verity_worker::bench::BenchModel {
            path: self.model.clone(),
            device: self.device.clone(),
            random_weights: self.random_weights,
        }
    }
}

/// Options of `verity bench rollout`.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(flatten)]
    pub model: BenchModelArgs,
    /// Prompts decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens generated per prompt (EOS ignored).
    #[arg(long = "new-tokens", default_value_t = 64)]
    pub new_tokens: usize,
    /// Precision of the weights decoding reads: f32, bf16 or int8.
    #[arg(long = "rollout-dtype", value_enum, default_value_t)]
    pub rollout_dtype: RolloutDtype,
    /// Prompts in all, decoded `batch` rows at a time (0: one batch).
    #[arg(long, default_value_t = 0)]
    pub prompts: usize,
    /// Samples per prompt.
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// End samples at EOS (their lengths then differ).
    #[arg(long = "stop-at-eos")]
    pub stop_at_eos: bool,
    /// Decode the prompts in separate batches of `batch` rows, each waiting for its longest
    /// sample, instead of one continuous batch (the comparison for continuous batching).
    #[arg(long)]
    pub chunked: bool,
    /// Constrain every sample to a JSON object (`response_format: json_object`), to measure
    /// what constrained decoding's masks cost.
    #[arg(long = "json-object")]
    pub json_object: bool,
}

/// Options of `verity bench train-step`.
#[derive(Debug, Args)]
pub struct TrainStepArgs {
    #[command(flatten)]
    pub model: BenchModelArgs,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long = "seq-len", default_value_t = 128)]
    pub seq_len: usize,
    /// Steps measured after the warm-up (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// LoRA rank on every projection (0: full fine-tuning).
    #[arg(long = "lora-rank", default_value_t = 0)]
    pub lora_rank: usize,
}

/// Options of `verity bench grpo-step`.
#[derive(Debug, Args)]
pub struct GrpoStepArgs {
    #[command(flatten)]
    pub model: BenchModelArgs,
    /// Prompts per step.
    #[arg(long, default_value_t = 1)]
    pub prompts: usize,
    /// Completions per prompt.
    #[arg(long, default_value_t = 8)]
    pub group: usize,
    /// Longest completion.
    #[arg(long = "max-tokens", default_value_t = 64)]
    pub max_tokens: usize,
    /// Steps measured (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Precision of the weights rollouts read: f32, bf16 or int8.
    #[arg(long = "rollout-dtype", value_enum, default_value_t)]
    pub rollout_dtype: RolloutDtype,
    /// 1: sample the next step while this one trains (the asynchronous pipeline).
    #[arg(long = "max-staleness", default_value_t = 0)]
    pub max_staleness: u32,
    /// Partial rollouts: tokens decoded per completion and step (unfinished groups carry over).
    #[arg(long = "partial-rollout-tokens")]
    pub partial_rollout_tokens: Option<usize>,
    /// DAPO dynamic sampling: replace groups without reward contrast (up to 3× the batch).
    #[arg(long = "dynamic-sampling")]
    pub dynamic_sampling: bool,
}

/// Options of `verity bench graders`.
#[derive(Debug, Args)]
pub struct GradersBenchArgs {
    /// Parallel gradings (0 = number of cores).
    #[arg(long, default_value_t = 0)]
    pub jobs: usize,
    /// Passes over the math case table.
    #[arg(long = "math-rounds", default_value_t = 20)]
    pub math_rounds: usize,
    /// Sandboxed gradings per code workload.
    #[arg(long = "code-gradings", default_value_t = 40)]
    pub code_gradings: usize,
}

async fn print_blocking<F>(work: F) -> anyhow::Result<()>
where
    F: FnOnce() -> anyhow::Result<serde_json::Value> + Send + 'static,
{
    let line = tokio::task::spawn_blocking(work).await??;
    println!("{line}");
    Ok(())
}

/// Decode throughput with a KV cache.
pub async fn rollout(args: &RolloutArgs) -> anyhow::Result<()> {
    let model = args.model.bench_model();
    let bench = verity_worker::bench::RolloutBench {
        batch: args.batch,
        new_tokens: args.new_tokens,
        rollout_dtype: args.rollout_dtype,
        prompts: args.prompts,
        samples: args.samples,
        stop_at_eos: args.stop_at_eos,
        chunked: args.chunked,
        json_object: args.json_object,
    };
    print_blocking(move || Ok(verity_worker::bench::bench_rollout(&model, &bench)?)).await
}

/// One forward + backward + AdamW step.
pub async fn train_step(args: &TrainStepArgs) -> anyhow::Result<()> {
    let (model, shape, steps, rank) =
        (args.model.bench_model(), (args.batch, args.seq_len), args.steps, args.lora_rank);
    print_blocking(move || Ok(verity_worker::bench::bench_train_step(&model, shape, steps, rank)?))
        .await
}

/// Math and sandboxed-code gradings per second.
pub async fn graders(args: &GradersBenchArgs) -> anyhow::Result<()> {
    let options = crate::commands::graders::files::BenchOptions {
        jobs: args.jobs,
        math_rounds: args.math_rounds,
        code_gradings: args.code_gradings,
    };
    print_blocking(move || Ok(crate::commands::graders::files::bench(&options))).await
}

/// Seconds per GRPO step and its parts.
pub async fn grpo_step(args: &GrpoStepArgs) -> anyhow::Result<()> {
    let (model, shape) =
        (args.model.bench_model(), (args.prompts, args.group, args.max_tokens, args.steps));
    let recipe = verity_worker::bench::grpo_step::GrpoBenchRecipe {
        rollout_dtype: args.rollout_dtype,
        max_staleness: args.max_staleness,
        partial_rollout_tokens: args.partial_rollout_tokens,
        dynamic_sampling: args.dynamic_sampling,
    };
    print_blocking(move || {
        Ok(verity_worker::bench::grpo_step::bench_grpo_step(&model, shape, recipe)?)
    })
    .await
}
