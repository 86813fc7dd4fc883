//! The training job handler for the queue, and the worker entry point (`verity worker`).
//!
//! A claimed job is parsed ([`verity_core::spec::Method`]), its files and base model fetched
//! from the object store (the model cached locally), resumed from its latest checkpoint, and
//! trained step by step while the heartbeat is watched: cancel stops (within seconds, even
//! mid-step or mid-evaluation: [`cancellable`]), pause checkpoints then
//! stops, a lost lease stops writing. Each step writes its metrics row, a line of
//! `jobs/{id}/metrics.jsonl`, its samples and an event; checkpoints are published atomically.

pub(crate) mod artifacts;
mod budget;
mod cancellable;
mod checkpoint;
mod handler;
mod pause;
mod profile;
mod progress;
mod pull;
mod records;
mod runs;
mod stop;
mod tinker;
mod watch;
mod worker;

pub use artifacts::write_results_file;
pub use handler::{TrainingHandler, TrainingHandlerConfig};
pub use worker::{default_tinker_clients, run_training_worker, TrainingWorkerConfig};
