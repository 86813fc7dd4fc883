//! Checkpoints: writing a trained model's folder and restoring it ([`folder`]), the local cache
//! that published folders are fetched into ([`cache`]), and the model stacks (a base and the
//! checkpoints of chained jobs over it) that a job, a judge or the inference engine starts from
//! ([`stack`]). Publishing a job's checkpoint to the store is the job loop's step
//! (`job/checkpoint.rs`).

pub mod cache;
pub mod folder;
pub mod stack;

pub use folder::{restore_optimizer, restore_weights, save_checkpoint, TRAINER_STATE};
