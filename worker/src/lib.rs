//! Verity worker: models, sampler, trainable forward, GRPO-family losses, optimizer, claim loop.
//!
//! The model core: [`loader`] opens HF folders and GGUF files, [`model::Transformer`] is the
//! trainable forward, [`sampler`] generates completions, [`optim`] holds AdamW, clipping,
//! gradient accumulation and the trainer's update loop, [`checkpoint`] saves and restores everything,
//! [`generate`] samples text from a local model, [`bench`] holds the model benchmarks `verity
//! bench` runs, [`judge`] runs the judge models of model graders.
//!
//! One RL step with the public API (what the GRPO trainer does):
//!
//! ```no_run
//! use verity_worker::*;
//! # fn main() -> Result<()> {
//! let lm = load_model("model-dir".as_ref(), &parse_device("cpu")?)?;
//! let mut opt = PolicyOptimizer::new(&lm.model, AdamWConfig::default(), LrSchedule::constant(1e-6), 1.0)?;
//! let text = lm.tokenizer.apply_chat_template(&[ChatMessage::new("user", "What is 7 + 5?")], true)?;
//! let prompts = vec![lm.tokenizer.encode(&text)?];
//! let params = SamplingParams { n: 8, temperature: 1.0, max_new_tokens: 64, seed: 7, ..Default::default() };
//! let pad = lm.tokenizer.pad_id();
//! let out = sample(&lm.model, &prompts, &params, &lm.tokenizer.eos_token_ids, pad, Some(&lm.tokenizer))?;
//! // ... grade, compute advantages; `out[i].logprobs` are the old-policy log-probs ...
//! let p: Vec<Vec<u32>> = out.iter().map(|c| prompts[c.prompt_index].clone()).collect();
//! let c: Vec<Vec<u32>> = out.iter().map(|c| c.token_ids.clone()).collect();
//! let lp = lm.model.completion_logprobs(&p, &c, params.temperature, pad, true)?; // (B, L) + mask
//! let loss = (lp.logprobs * lp.mask)?.sum_all()?.neg()?; // the real loss lives in `grpo`
//! opt.backward(&loss, 1.0)?; // once per micro-batch
//! let stats = opt.step()?; // clip + AdamW + zero grads
//! checkpoint::save_checkpoint("ckpt".as_ref(), &lm.model, Some(&lm.tokenizer), Some(&opt.adamw), "base")?;
//! # let _ = stats; Ok(()) }
//! ```

pub mod bench;
pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod constrained;
pub mod convert;
pub mod device;
pub mod embedding;
pub mod embedding_models;
pub mod episodes;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod grpo;
pub mod hub;
pub mod inference;
pub mod job;
pub mod judge;
pub mod loader;
pub mod memory;
pub mod model;
pub mod model_import;
pub mod optim;
pub mod pypi_blas;
pub mod pypi_models;
pub mod runs;
pub mod safetensors_file;
pub mod sampler;
pub mod synthetic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tinker;
pub mod tokenizer;
pub mod trainer;
pub mod weights;

pub use chat_template::ChatMessage;
pub use config::{Family, ModelConfig};
pub use convert::convert_gguf;
pub use device::{default_compute_dtype, parse_device, parse_precision};
pub use error::{Result, WorkerError};
pub use generate::{generate, GenerateOptions, GeneratedText};
pub use loader::{load_model, LoadedModel};
pub use model::{CompletionLogprobs, Kernels, Transformer};
pub use optim::policy_optimizer::{PolicyOptimizer, StepStats};
pub use optim::{AdamW, AdamWConfig, GradAccumulator, LrSchedule, OptimizerPath};
pub use sampler::{sample, Completion, FinishReason, SamplingParams};
pub use tokenizer::ChatTokenizer;
