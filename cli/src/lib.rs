//! The `verity` command: `serve`, `worker`, `inference`, `up` (laptop mode), the client commands
//! against a running server, administration, model conversion and benchmarks.

pub mod allocator;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod logging;
