//! Benchmarks behind `verity bench …`: they print JSON lines and assert nothing.

pub mod cluster;
pub mod learn;
pub mod model;
pub mod queue;
pub mod serve;
