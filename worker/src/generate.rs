//! `generate`: sample completions from a local model with its chat template applied.

use crate::chat_template::ChatMessage;
use crate::device::parse_device;
use crate::error::Result;
use crate::loader::{load_model, LoadedModel};
use crate::sampler::{sample, FinishReason, SamplingParams};
use serde::Serialize;
use std::path::Path;

/// Options of `verity generate`.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// System message placed before the prompt (else the template's default).
    pub system: Option<String>,
    /// Device spec (`cpu`, `cuda:N`).
    pub device: String,
    /// How to sample (completions, temperature, budget, seed, weight precision).
    pub sampling: SamplingParams,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            system: None,
            device: "cpu".into(),
            sampling: SamplingParams { temperature: 0.7, ..SamplingParams::default() },
        }
    }
}

/// One generated completion.
#[derive(Debug, Clone, Serialize)]
pub struct GeneratedText {
    /// Decoded text (special tokens dropped).
    pub text: String,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Number of generated tokens.
    pub tokens: usize,
}

/// `verity generate`: loads the model (HF folder or GGUF), applies the chat template to
/// `prompt` (after `system` if any) and samples `n` completions.
pub fn generate(model: &Path, prompt: &str, opts: &GenerateOptions) -> Result<Vec<GeneratedText>> {
    let device = parse_device(&opts.device)?;
    let lm = load_model(model, &device)?;
    generate_with(&lm, prompt, opts)
}

/// Like [`generate`] with an already loaded model.
pub fn generate_with(
    lm: &LoadedModel,
    prompt: &str,
    opts: &GenerateOptions,
) -> Result<Vec<GeneratedText>> {
    let mut messages = Vec::new();
    if let Some(system) = &opts.system {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    messages.push(ChatMessage::new("user", prompt));
    let text = lm.tokenizer.apply_chat_template(&messages, true)?;
    let ids = lm.tokenizer.encode(&text)?;
    let out = sample(
        &lm.model,
        &[ids],
        &opts.sampling,
        &lm.tokenizer.eos_token_ids,
        lm.tokenizer.pad_id(),
        Some(&lm.tokenizer),
    )?;
    out.into_iter()
        .map(|c| {
            Ok(GeneratedText {
                text: lm.tokenizer.decode(&c.token_ids, true)?,
                finish_reason: c.finish_reason,
                tokens: c.token_ids.len(),
            })
        })
        .collect()
}
