//! The REST API: one router per module, merged here with tracing and request metrics.

pub mod auth;
pub mod error;
pub mod extract;
pub mod files;
pub mod grader_run;
pub mod graders;
pub mod health;
pub mod inference;
pub mod jobs;
pub mod limits;
pub mod loss_presets;
pub mod model_pulls;
pub mod models;
pub mod objects;
pub mod openapi;
pub mod pagination;
pub mod preflight;
pub mod recipes;
pub mod reference;
pub mod sampling_runs;
pub mod state;
pub mod telemetry;
pub mod tinker;
