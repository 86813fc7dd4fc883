//! `verity bench learn` without the server crate: the same learning run
//! (`verity_worker::trainer::learning_run`), one JSON line per step and evaluation, then the
//! summary.
//!
//!     learn MODEL RECIPE [TRAIN VALIDATION GRADER]
//!
//! The files default to `examples/arithmetic/{train,validation}.jsonl` and `grader.json`.

use anyhow::{bail, Context, Result};
use std::path::Path;
use verity_core::spec::Hyperparameters;
use verity_worker::trainer::{learning_run, LearningRun};

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {path}"))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 2 && args.len() != 5 {
        bail!("usage: learn MODEL RECIPE [TRAIN VALIDATION GRADER]");
    }
    let file = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.to_string());
    let hyperparameters: Hyperparameters =
        serde_json::from_str(&read(&args[1])?).with_context(|| format!("recipe {}", args[1]))?;
    hyperparameters.validate("hyperparameters").map_err(|e| anyhow::anyhow!("{e}"))?;
    let grader =
        verity_verifiers::Grader::from_json(&read(&file(4, "examples/arithmetic/grader.json"))?)
            .map_err(|e| anyhow::anyhow!("grader: {e}"))?;
    let run = LearningRun {
        model_dir: Path::new(&args[0]),
        train_jsonl: &read(&file(2, "examples/arithmetic/train.jsonl"))?,
        validation_jsonl: &read(&file(3, "examples/arithmetic/validation.jsonl"))?,
        grader,
        hyperparameters,
    };
    let summary = learning_run(run, |line| println!("{line}"))?;
    println!("{summary}");
    Ok(())
}
