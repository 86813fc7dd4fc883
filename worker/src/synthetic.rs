//! The synthetic task `verity bench cluster` runs and the tests train on: a tiny random model
//! of any family (2 layers, vocabulary 64) with a word-level tokenizer, written as an HF folder,
//! and rows whose answer is one token, graded by `string_check`. Shipped because the benchmark
//! needs it; the tests' other fixtures live in `testing` (feature `testing`).

use crate::config::{Family, ModelConfig};
use crate::error::{Result, WorkerError};
use crate::model::Transformer;
use crate::tokenizer::{ChatTokenizer, SpecialTokens};
use crate::weights::random_weights;
use candle_core::Device;
use serde_json::json;
use std::path::Path;

/// A tiny config of the given family (2 layers, vocab 64, GQA 4:2 heads; SmolLM3's second
/// layer without RoPE, Mistral's window 4 tokens wide, Gemma 3's first layer local with that
/// window and its own RoPE base, the second global).
pub fn tiny_config(family: Family) -> ModelConfig {
    ModelConfig {
        family,
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        long_rope: None,
        rotary_dim: if family == Family::Phi3 { 6 } else { 8 },
        max_position_embeddings: 256,
        tie_word_embeddings: family != Family::Qwen3,
        attention_bias: family == Family::Qwen2,
        nope_layers: if family == Family::SmolLM3 { vec![1] } else { vec![] },
        sliding_window: matches!(family, Family::Mistral | Family::Gemma3 | Family::Phi3)
            .then_some(4),
        full_attention_layers: if family == Family::Gemma3 { vec![1] } else { vec![] },
        local_rope_theta: (family == Family::Gemma3).then_some(1_000.0),
        query_pre_attn_scalar: (family == Family::Gemma3).then_some(16),
        bos_token_id: Some(1),
        pad_token_id: None,
        eos_token_ids: vec![2],
        torch_dtype: "float32".into(),
    }
}

/// A tiny random transformer of the given family on the CPU.
pub fn tiny_model(family: Family, seed: u64) -> Result<Transformer> {
    let config = tiny_config(family);
    let weights = random_weights(&config, seed, &Device::Cpu)?;
    Transformer::from_weights(config, weights, &Device::Cpu)
}

/// Vocabulary size of the tiny model ([`tiny_config`]).
pub const TINY_VOCAB: usize = 64;

/// A word-level tokenizer over `<unk>`, `<s>`, `</s>` and `t3` … `t63` (ids = positions) with a
/// chat template that concatenates message contents.
pub fn tiny_tokenizer() -> Result<ChatTokenizer> {
    word_tokenizer(&[], CONCAT_TEMPLATE, &[])
}

/// The chat template of [`tiny_tokenizer`]: message contents, each followed by a space.
pub(crate) const CONCAT_TEMPLATE: &str = "{% for m in messages %}{{ m.content }} {% endfor %}";

/// Whether a word of a tiny tokenizer is a special token: spelled `<|…|>` (Llama 3) or `[…]`
/// in capitals (Mistral's `[TOOL_CALLS]`).
fn is_control_word(word: &str) -> bool {
    let bracketed = word.len() > 2
        && word.starts_with('[')
        && word.ends_with(']')
        && word[1..word.len() - 1].chars().all(|c| c.is_ascii_uppercase() || c == '_' || c == '/');
    bracketed || (word.starts_with("<|") && word.ends_with("|>"))
}

/// The word-level tokenizer of [`tiny_tokenizer`]; `words` replace `t3`, `t4`, … in order (as
/// added tokens, special when [`is_control_word`]), with a chat `template`; `</s>` and the words in
/// `eos` end a sequence.
pub(crate) fn word_tokenizer(
    words: &[&str],
    template: &str,
    eos: &[&str],
) -> Result<ChatTokenizer> {
    let mut vocab = serde_json::Map::new();
    let special = ["<unk>", "<s>", "</s>"];
    for (id, token) in special.iter().enumerate() {
        vocab.insert(token.to_string(), json!(id));
    }
    for id in special.len()..TINY_VOCAB {
        let word = words.get(id - special.len()).map_or(format!("t{id}"), |w| w.to_string());
        vocab.insert(word, json!(id));
    }
    let entry = |id: usize, content: &str, special: bool| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": special});
    let added: Vec<_> = special
        .iter()
        .enumerate()
        .map(|(id, t)| entry(id, t, true))
        .chain(
            words.iter().enumerate().map(|(i, w)| entry(special.len() + i, w, is_control_word(w))),
        )
        .collect();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let tokenizer: tokenizers::Tokenizer = spec
        .to_string()
        .parse()
        .map_err(|e| WorkerError::Tokenizer(format!("tiny tokenizer: {e}")))?;
    let special = SpecialTokens {
        bos: Some("<s>".into()),
        eos: Some("</s>".into()),
        pad: None,
        unk: Some("<unk>".into()),
    };
    let eos_ids = std::iter::once(Ok(2))
        .chain(eos.iter().map(|word| {
            tokenizer.token_to_id(word).ok_or_else(|| {
                WorkerError::Tokenizer(format!("tiny tokenizer: no end token {word}"))
            })
        }))
        .collect::<std::result::Result<Vec<u32>, WorkerError>>()?;
    Ok(ChatTokenizer::new(tokenizer, Some(template.to_string()), special, eos_ids))
}

/// Writes a tiny random model of `family` with [`tiny_tokenizer`] as an HF folder in `dir`.
pub fn write_tiny_model_dir(dir: &Path, family: Family, seed: u64) -> Result<()> {
    let model = tiny_model(family, seed)?;
    let tokenizer = tiny_tokenizer()?;
    crate::checkpoint::save_checkpoint(dir, &model, Some(&tokenizer), None, "tiny")?;
    Ok(())
}

/// The answer token of the synthetic task (the same for every prompt).
pub const TARGET_TOKEN: &str = "t7";

/// JSONL of the synthetic task: `prompts` rows whose answer is [`TARGET_TOKEN`].
pub fn target_token_jsonl(prompts: usize) -> String {
    (0..prompts)
        .map(|i| {
            json!({"prompt": format!("t{} t{}", 3 + i, 10 + 2 * i), "answer": TARGET_TOKEN})
                .to_string()
                + "\n"
        })
        .collect()
}

/// A `string_check` grader: reward 1 when the completion's first word is the row's answer.
pub fn first_token_grader() -> serde_json::Value {
    json!({"type": "string_check", "name": "first_token", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "eq"})
}
