//! What Verity's tests share (a dev-dependency only; nothing here ships in a binary): a TCP
//! proxy that injects outages ([`proxy`]), the per-test database's URL for child processes
//! ([`db`]), serving on free loopback ports ([`serve`]), the deploy images' runtime stages
//! with podman ([`images`]), a loopback Hugging Face hub ([`hub`]), a WebDriver client for the browser tests ([`webdriver`]), and a
//! loopback server speaking W&B's run protocol ([`wandb`]).

pub mod db;
pub mod hub;
pub mod images;
pub mod proxy;
pub mod serve;
pub mod wandb;
pub mod webdriver;
