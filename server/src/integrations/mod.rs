//! Exports of jobs to the experiment trackers their `integrations` name: Weights & Biases, over
//! W&B's own run protocol (`wandb`), by a loop every API server runs (`export`).

pub mod export;
pub mod wandb;

pub use wandb::{WandbArgs, WandbClient};
