//! The bubblewrap sandbox that runs untrusted programs.
//!
//! Layers, in order: namespaces (`--unshare-all`, no network, own pid namespace so nothing
//! outlives the run), a read-only root with only `/usr` and the interpreter's prefix, size-capped
//! tmpfs `/work` and `/tmp`, a cleared environment; rlimits (CPU, address space, processes, file
//! size, no core) and, when Verity runs as root, a dedicated uid per concurrent run so the process
//! limit holds; a seccomp filter ([`seccomp`]) refusing the system calls graders never need
//! (namespaces, mounts, tracing, keyrings, bpf, perf, userfaultfd, io_uring, module loading);
//! a wall-clock SIGKILL of the whole process group; capped stdout/stderr. Inputs
//! (program, tests) travel through a pipe the harness reads before untrusted code runs, and the
//! verdict travels back on a separate pipe in nonce-tagged lines, so exit codes and printed text
//! cannot forge it. Inside, the harness (`harness.py`) never runs untrusted code: the program or
//! a user's `grade()` runs in a child process (`child.py`) that has neither the verdict pipe nor
//! the nonce and answers only in plain data (`wire.py`); the tests run in the harness's clean
//! interpreter on that data (docs/security.md, "Grader integrity"). A [`SandboxSession`] keeps
//! one sandbox open across exchanges (a tool's session over an episode), with the same layers.
//! A python grader also gets the grader image's packages ([`packages`]), one more read-only
//! bind.

mod config;
pub mod container_profile;
pub mod packages;
mod run;
pub mod seccomp;
mod session;

use thiserror::Error;

pub use config::SandboxConfig;
pub use run::{run_harness, RunLimits, RunOutcome};
pub use session::{Exchange, SandboxSession};

/// The sandbox could not run (an infrastructure failure, never a wrong answer).
#[derive(Debug, Error)]
pub enum SandboxError {
    /// bwrap or Python is missing or broken.
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
    /// bwrap could not be started.
    #[error("cannot start the sandbox: {0}")]
    Spawn(std::io::Error),
    /// Pipes or randomness failed.
    #[error("sandbox I/O failed: {0}")]
    Io(std::io::Error),
    /// The seccomp filter could not be built or passed to bwrap (nothing runs without it).
    #[error("sandbox unavailable: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
}
