//! Saving and restoring the trainer: weights (or adapter) and optimizer through the checkpoint
//! module, plus `trainer_progress.json` (step, data cursor, seed) and, with the asynchronous
//! pipeline, the groups drawn ahead for the next step ([`IN_FLIGHT_FILE`]), with partial
//! rollouts the groups still decoding ([`PARTIAL_FILE`]).

use super::dataset::{DataCursor, DataOrder};
use super::error::{Result, TrainerError};
use super::pipeline::{InFlight, IN_FLIGHT_FILE};
use super::step::Trainer;
use super::tuning::{Objective, PreferenceData};
use super::ReferenceLogprobs;
use crate::checkpoint::{restore_weights, save_checkpoint};
use crate::optim::policy_optimizer::PolicyOptimizer;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// File holding the trainer's progress inside a checkpoint folder.
pub const PROGRESS_FILE: &str = "trainer_progress.json";

/// File holding a DPO job's reference log-probs inside a checkpoint folder.
pub const REFERENCE_FILE: &str = "dpo_reference.json";

/// File holding the groups still decoding under partial rollouts inside a checkpoint folder.
pub const PARTIAL_FILE: &str = "rollouts_partial.json";

/// Everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerProgress {
    /// Steps completed.
    pub step: u64,
    /// Position in the data order.
    pub cursor: DataCursor,
    /// The effective seed (sampling seeds derive from it and the step).
    pub seed: u64,
    /// Steps planned.
    pub total_steps: u64,
    /// Rows of the training file (a resumed run must see the same file).
    pub train_rows: usize,
}

fn checkpoint_error(dir: &Path, message: impl Into<String>) -> TrainerError {
    TrainerError::Checkpoint { path: dir.display().to_string(), message: message.into() }
}

/// Writes `value` as JSON to the file `name` of checkpoint folder `dir`.
fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<()> {
    let json = serde_json::to_vec(value).map_err(|e| checkpoint_error(dir, e.to_string()))?;
    std::fs::write(dir.join(name), json).map_err(|e| checkpoint_error(dir, format!("{name}: {e}")))
}

/// Reads the JSON file `name` of checkpoint folder `dir` (`None` when the folder has none).
fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let raw = std::fs::read(&path).map_err(|e| checkpoint_error(dir, format!("{name}: {e}")))?;
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| checkpoint_error(dir, format!("{name}: {e}")))
}

impl Trainer {
    /// The progress record of the current state.
    pub fn progress(&self) -> TrainerProgress {
        TrainerProgress {
            step: self.step,
            cursor: self.order.cursor(),
            seed: self.seed,
            total_steps: self.total_steps,
            train_rows: self.train.len(),
        }
    }

    /// Writes a checkpoint folder: HF weights (or PEFT adapter), tokenizer, optimizer state and
    /// progress.
    pub fn save(&self, dir: &Path) -> Result<()> {
        save_checkpoint(
            dir,
            &self.model,
            Some(&self.tokenizer),
            Some(&self.optimizer.adamw),
            &self.options.base_model,
        )?;
        let json = serde_json::to_vec_pretty(&self.progress())
            .map_err(|e| checkpoint_error(dir, e.to_string()))?;
        std::fs::write(dir.join(PROGRESS_FILE), json)
            .map_err(|e| checkpoint_error(dir, e.to_string()))?;
        if let Some(in_flight) = &self.in_flight {
            write_json(dir, IN_FLIGHT_FILE, in_flight)?;
        }
        if !self.partial.is_empty() {
            write_json(dir, PARTIAL_FILE, &self.partial)?;
        }
        if let Objective::Dpo(data) = &self.objective {
            if let Some(reference) = &data.reference {
                let json = serde_json::to_vec(reference)
                    .map_err(|e| checkpoint_error(dir, e.to_string()))?;
                std::fs::write(dir.join(REFERENCE_FILE), json)
                    .map_err(|e| checkpoint_error(dir, format!("{REFERENCE_FILE}: {e}")))?;
            }
        }
        Ok(())
    }

    /// Restores a folder written by [`Trainer::save`]: weights, optimizer, step and data order.
    pub fn restore(&mut self, dir: &Path) -> Result<()> {
        let raw = std::fs::read(dir.join(PROGRESS_FILE))
            .map_err(|e| checkpoint_error(dir, format!("{PROGRESS_FILE}: {e}")))?;
        let progress: TrainerProgress = serde_json::from_slice(&raw)
            .map_err(|e| checkpoint_error(dir, format!("{PROGRESS_FILE}: {e}")))?;
        if progress.train_rows != self.train.len() {
            return Err(checkpoint_error(
                dir,
                format!(
                    "it was trained on {} rows, the training file now has {}",
                    progress.train_rows,
                    self.train.len()
                ),
            ));
        }
        if let Objective::Dpo(data) = &mut self.objective {
            data.reference = restore_reference(dir, data)?;
        }
        self.in_flight = restore_in_flight(dir, progress.step)?;
        self.partial = read_json(dir, PARTIAL_FILE)?.unwrap_or_default();
        restore_weights(&mut self.model, dir)?;
        self.optimizer = PolicyOptimizer::restore(
            &self.model,
            dir,
            self.optimizer.schedule.clone(),
            self.optimizer.max_grad_norm,
        )?;
        self.step = progress.step;
        self.seed = progress.seed;
        self.order = DataOrder::new(progress.seed, self.train.len(), progress.cursor);
        Ok(())
    }
}

/// The groups a checkpoint saved for the step after `step` (`None` without them).
fn restore_in_flight(dir: &Path, step: u64) -> Result<Option<InFlight>> {
    let Some(in_flight) = read_json::<InFlight>(dir, IN_FLIGHT_FILE)? else {
        return Ok(None);
    };
    if in_flight.step != step + 1 {
        return Err(checkpoint_error(
            dir,
            format!("its rollouts are for step {}, not step {}", in_flight.step, step + 1),
        ));
    }
    Ok(Some(in_flight))
}

/// The reference log-probs saved beside a DPO checkpoint (`None` when the checkpoint predates
/// them, i.e. was taken before the first step); they must cover the job's pairs.
fn restore_reference(dir: &Path, data: &PreferenceData) -> Result<Option<ReferenceLogprobs>> {
    let path = dir.join(REFERENCE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let raw = std::fs::read(&path)
        .map_err(|e| checkpoint_error(dir, format!("{REFERENCE_FILE}: {e}")))?;
    let reference: ReferenceLogprobs = serde_json::from_slice(&raw)
        .map_err(|e| checkpoint_error(dir, format!("{REFERENCE_FILE}: {e}")))?;
    let validation = data.validation.as_ref().map_or(0, Vec::len);
    if reference.train.len() != data.train.len() || reference.validation.len() != validation {
        return Err(checkpoint_error(dir, "its DPO reference log-probs are for other files"));
    }
    Ok(Some(reference))
}
