//! Verity worker: models, sampler, trainable forward, GRPO-family losses, optimizer, claim loop.
//!
//! The model core: [`loader`] opens HF folders and GGUF files, [`model::Transformer`] is the
//! trainable forward, [`sampler`] generates completions, [`optim`] holds AdamW and gradient
//! accumulation, [`checkpoint`] saves and restores everything, [`api`] hosts the entry points
//! the `verity` CLI wires in.

pub mod api;
pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod device;
pub mod error;
pub mod gguf;
pub mod grpo;
pub mod job;
pub mod kernels;
pub mod loader;
pub mod model;
pub mod optim;
pub mod sampler;
pub mod testing;
pub mod tokenizer;
pub mod trainer;
pub mod weights;

pub use chat_template::ChatMessage;
pub use config::{Family, ModelConfig};
pub use convert::convert_gguf;
pub use device::parse_device;
pub use error::{Result, WorkerError};
pub use loader::{load_model, LoadedModel};
pub use model::{CompletionLogprobs, Kernels, Transformer};
pub use tokenizer::ChatTokenizer;
pub use sampler::{sample, Completion, FinishReason, SamplingParams};
pub use optim::{AdamW, AdamWConfig, GradAccumulator, LrSchedule};
pub use api::{bench_rollout, bench_train_step, generate, GenerateOptions, GeneratedText};
