//! Verity graders: the reward spec, verifiable graders and the code sandbox (no DB, no network).
