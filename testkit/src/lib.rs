//! What Verity's tests share (a dev-dependency only; nothing here ships in a binary): a TCP
//! proxy that injects outages ([`proxy`]), the per-test database's URL for child processes
//! ([`db`]), and serving on free loopback ports ([`serve`]).

pub mod db;
pub mod proxy;
pub mod serve;
