//! Fixtures for trainer tests: a word-level tokenizer for the tiny random model, an HF folder
//! of it, and a synthetic verifiable task.

use super::error::Result;
use crate::config::Family;
use crate::error::WorkerError;
use crate::tokenizer::{ChatTokenizer, SpecialTokens};
use serde_json::json;
use std::path::Path;

/// Vocabulary size of the tiny model (`testing::tiny_config`).
pub const TINY_VOCAB: usize = 64;

/// A word-level tokenizer over `<unk>`, `<s>`, `</s>` and `t3` … `t63` (ids = positions) with a
/// chat template that concatenates message contents.
pub fn tiny_tokenizer() -> Result<ChatTokenizer> {
    word_tokenizer(&[])
}

/// [`tiny_tokenizer`] with `<tool_call>` and `</tool_call>` as tokens 3 and 4 (instead of `t3`
/// and `t4`), so that the tiny model can call tools (and mostly make malformed calls).
pub fn tiny_tool_tokenizer() -> Result<ChatTokenizer> {
    word_tokenizer(&["<tool_call>", "</tool_call>"])
}

/// The word-level tokenizer of [`tiny_tokenizer`]; `words` replace `t3`, `t4`, … in order
/// (as added, non-special tokens).
fn word_tokenizer(words: &[&str]) -> Result<ChatTokenizer> {
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
        .chain(words.iter().enumerate().map(|(i, w)| entry(special.len() + i, w, false)))
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
    let template = "{% for m in messages %}{{ m.content }} {% endfor %}".to_string();
    Ok(ChatTokenizer::new(tokenizer, Some(template), special, vec![2]))
}

/// Writes a tiny random model of `family` with [`tiny_tokenizer`] as an HF folder in `dir`.
pub fn write_tiny_model_dir(dir: &Path, family: Family, seed: u64) -> Result<()> {
    let model = crate::testing::tiny_model(family, seed)?;
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

/// A GRPO trainer of the tiny Llama of `model_seed` on `prompts` rows of the synthetic task,
/// rewarding completions that contain "t1" (t1, t10–t19: contrast from the first step), with
/// the recipe `hp` (tests of the trainer's rollout machinery).
pub fn tiny_rollout_trainer(
    hp: verity_core::spec::Hyperparameters,
    prompts: usize,
    model_seed: u64,
) -> Result<super::Trainer> {
    let tokenizer = tiny_tokenizer()?;
    let train =
        super::Dataset::from_jsonl(&target_token_jsonl(prompts), "training", &tokenizer, 256)?;
    let grader = json!({"type": "string_check", "name": "has_t1",
        "input": "{{sample.output_text}}", "reference": "t1", "operation": "like"});
    let grader = verity_verifiers::Grader::from_json(&grader.to_string())
        .map_err(|e| super::TrainerError::Grader(e.to_string()))?;
    let options = super::TrainerOptions {
        seed: 1,
        base_model: "tiny".into(),
        graders: verity_verifiers::GraderPool::new(2),
    };
    let model = crate::testing::tiny_model(Family::Llama, model_seed)?;
    super::Trainer::new(model, tokenizer, grader, hp, train, None, options)
}
