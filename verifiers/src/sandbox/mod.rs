//! The bubblewrap sandbox that runs untrusted programs.

/// Where the sandbox finds its tools.
#[derive(Debug, Clone, Default)]
pub struct SandboxConfig {}
