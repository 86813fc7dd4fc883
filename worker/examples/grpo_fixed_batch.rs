//! One GRPO step on a fixed batch, through the trainer's own code, for comparing against TRL
//! (`bench/peers/trl_fixed_batch.py`, docs/training.md "Why TRL learned more").
//!
//!     grpo_fixed_batch MODEL RECIPE TRAIN GRADER draw OUT
//!         samples and grades the first step's groups as `verity bench learn` would, and writes
//!         them (prompt and completion token ids, sampler log-probs, rewards) to OUT as JSON;
//!     grpo_fixed_batch MODEL RECIPE TRAIN GRADER train BATCH OUT [--steps K] [WEIGHT…]
//!         takes one optimisation step (K steps, BATCH trained on again at each) on BATCH from
//!         MODEL's weights and writes the advantages, per-token log-probs and loss mask, each
//!         step's loss, gradient norm and learning rate, and the update of every weight over
//!         the steps (the named WEIGHTs element by element) to OUT.
//!
//! RECIPE is a hyperparameters JSON (e.g. examples/arithmetic/recipe.json).

use anyhow::{bail, Context, Result};
use std::path::Path;
use verity_core::spec::Hyperparameters;
use verity_worker::trainer::{Dataset, FixedBatch, Trainer, TrainerOptions};

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {path}"))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 6 {
        bail!(
            "usage: grpo_fixed_batch MODEL RECIPE TRAIN GRADER (draw OUT | train BATCH OUT [--steps K] [WEIGHT…])"
        );
    }
    let (model_dir, recipe, train, grader) = (&args[0], &args[1], &args[2], &args[3]);
    let hp: Hyperparameters =
        serde_json::from_str(&read(recipe)?).with_context(|| format!("recipe {recipe}"))?;
    let grader = verity_verifiers::Grader::from_json(&read(grader)?)
        .map_err(|e| anyhow::anyhow!("grader: {e}"))?;
    let loaded =
        verity_worker::loader::load_model(Path::new(model_dir), &candle_core::Device::Cpu)?;
    let train = Dataset::from_jsonl(&read(train)?, "train", &loaded.tokenizer, 2048)?;
    let options = TrainerOptions {
        seed: 0,
        base_model: model_dir.clone(),
        graders: verity_verifiers::GraderPool::new(0),
    };
    let mut trainer =
        Trainer::new(loaded.model, loaded.tokenizer, grader, hp, train, None, options)?;
    match args[4].as_str() {
        "draw" => {
            let batch = trainer.draw_fixed_batch()?;
            std::fs::write(&args[5], serde_json::to_string(&batch)?)?;
        }
        "train" if args.len() >= 7 => {
            let batch: FixedBatch = serde_json::from_str(&read(&args[5])?)
                .with_context(|| format!("batch {}", args[5]))?;
            let (steps, watch) = match args.get(7).map(String::as_str) {
                Some("--steps") => {
                    let k = args.get(8).context("--steps needs a number")?;
                    (k.parse().with_context(|| format!("--steps {k}"))?, &args[9.min(args.len())..])
                }
                _ => (1, &args[7..]),
            };
            let report = trainer.train_on_fixed_batch(&batch, watch, steps)?;
            std::fs::write(&args[6], serde_json::to_string(&report)?)?;
        }
        other => {
            bail!("unknown command {other:?}: draw OUT | train BATCH OUT [--steps K] [WEIGHT…]")
        }
    }
    Ok(())
}
