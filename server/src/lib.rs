//! Verity server: the REST API (`api`), the web dashboard (`web`), the command line (`cli`,
//! `commands`) and benchmarks.

pub mod allocator;
pub mod api;
pub mod bench;
pub mod cli;
pub mod commands;
pub mod inference;
pub mod logging;
pub mod web;
