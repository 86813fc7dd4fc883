//! Verity server: the REST API (`api`), the web dashboard (`web`), the inference service
//! (`inference`), and the application that assembles them (`app`). The `verity` command that
//! runs it is the `verity-cli` crate.

pub mod api;
pub mod app;
pub mod inference;
pub mod integrations;
pub mod web;
