//! Verity core: domain types, the Postgres job queue, object storage and configuration.

pub mod config;
pub mod db;
pub mod ids;
pub mod job;
pub mod queue;
pub mod spec;
pub mod storage;

pub use job::{ControlSignal, JobState};
