//! `verity models convert`: a GGUF file to an HF folder that transformers loads unchanged.

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Model commands.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Convert a GGUF file (dequantised; q/k un-permuted) into an HF folder: config.json,
    /// tokenizer.json, tokenizer_config.json (chat template), generation_config.json,
    /// model.safetensors.
    Convert(ConvertArgs),
}

/// Options of `verity models convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The GGUF file.
    #[arg(long)]
    pub gguf: PathBuf,
    /// Output folder (created).
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs a model subcommand.
pub async fn run(command: &ModelsCommand) -> anyhow::Result<()> {
    match command {
        ModelsCommand::Convert(args) => {
            let (gguf, out) = (args.gguf.clone(), args.out.clone());
            tokio::task::spawn_blocking(move || verity_worker::convert_gguf(&gguf, &out))
                .await?
                .with_context(|| format!("converting {}", args.gguf.display()))?;
            println!("{}", serde_json::json!({ "converted": args.gguf, "out": args.out }));
            Ok(())
        }
    }
}
