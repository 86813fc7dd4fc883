//! The `verity` binary.
fn main() {}
