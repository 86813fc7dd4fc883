//! `verity generate`: sample completions from a local model with its chat template.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use verity_worker::{GenerateOptions, SamplingParams};

/// Options of `verity generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// HF folder or GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// The user message.
    #[arg(long)]
    pub prompt: String,
    /// A system message placed first.
    #[arg(long)]
    pub system: Option<String>,
    /// Longest completion in tokens.
    #[arg(long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long = "top-p", default_value_t = 1.0)]
    pub top_p: f32,
    /// Completions to sample.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The device to sample on.
    #[command(flatten)]
    pub device: verity_core::config::DeviceArgs,
    /// Precision of the weights sampling reads: f32, bf16 or int8 (faster decoding on a CPU).
    #[arg(long = "rollout-dtype", value_enum, default_value_t)]
    pub rollout_dtype: verity_core::spec::RolloutDtype,
}

/// Prints one JSON line per completion.
pub async fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let options = GenerateOptions {
        system: args.system.clone(),
        device: args.device.name.clone(),
        sampling: SamplingParams {
            n: args.n,
            temperature: args.temperature,
            top_p: args.top_p,
            max_new_tokens: args.max_tokens,
            seed: args.seed,
            rollout_dtype: args.rollout_dtype,
            ..SamplingParams::default()
        },
    };
    let (model, prompt) = (args.model.clone(), args.prompt.clone());
    let completions =
        tokio::task::spawn_blocking(move || verity_worker::generate(&model, &prompt, &options))
            .await?
            .with_context(|| format!("generating with {}", args.model.display()))?;
    for completion in completions {
        println!("{}", serde_json::to_string(&completion)?);
    }
    Ok(())
}
