//! Verity core: domain types, the Postgres job queue, object storage and configuration.

pub mod budget;
pub mod change_feed;
pub mod config;
pub mod db;
pub mod difficulty;
pub mod environment;
pub mod files;
pub mod ids;
pub mod inference;
pub mod integrations;
pub mod job_state;
pub mod jobs;
pub mod keys;
pub mod lineage;
pub mod metrics_csv;
pub mod model_pulls;
pub mod models;
pub mod monitor;
pub mod names;
pub mod queue;
pub mod recipes;
pub mod response_format;
pub mod sampling;
pub mod sampling_runs;
pub mod sessions;
pub mod spec;
pub mod storage;
pub mod tenancy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tinker;
pub mod urls;

pub use job_state::{ControlSignal, JobState};
