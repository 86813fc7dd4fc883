//! Verity worker: models, sampler, trainable forward, GRPO-family losses, optimizer, claim loop.

pub mod grpo;
