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
    word_tokenizer(&[], CONCAT_TEMPLATE, &[])
}

/// The chat template of [`tiny_tokenizer`]: message contents, each followed by a space.
const CONCAT_TEMPLATE: &str = "{% for m in messages %}{{ m.content }} {% endfor %}";

/// [`tiny_tokenizer`] with `<tool_call>` and `</tool_call>` as tokens 3 and 4 (instead of `t3`
/// and `t4`), so that the tiny model can call tools (and mostly make malformed calls).
pub fn tiny_tool_tokenizer() -> Result<ChatTokenizer> {
    tiny_word_tokenizer(&["<tool_call>", "</tool_call>"])
}

/// [`tiny_tokenizer`] with `words` (added tokens, which may contain spaces) instead of `t3`,
/// `t4`, … in order.
pub fn tiny_word_tokenizer(words: &[&str]) -> Result<ChatTokenizer> {
    word_tokenizer(words, CONCAT_TEMPLATE, &[])
}

/// A call of the calculator in Llama 3's syntax (a whole turn of JSON): one token of
/// [`tiny_llama3_tokenizer`], so that a scripted model can emit it.
pub const LLAMA_CALL: &str = r#"{"name": "calculator", "parameters": {"expression": "6*7"}}"#;

/// A word-level tokenizer with Llama 3's special tokens (`<|python_tag|>`, `<|eom_id|>`,
/// `<|eot_id|>` — both end a turn —, the header tokens), the words `ipython`, `assistant`, `42`,
/// `go`, `done`, [`LLAMA_CALL`] as one token, and a Llama 3 style chat template; for the
/// tool-call engine with `testing::scripted_model` (look tokens up with `encode`).
pub fn tiny_llama3_tokenizer() -> Result<ChatTokenizer> {
    word_tokenizer(
        &[
            "<|python_tag|>",
            "<|eom_id|>",
            "<|eot_id|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "ipython",
            "assistant",
            LLAMA_CALL,
            "42",
            "go",
            "done",
        ],
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n",
        &["<|eom_id|>", "<|eot_id|>"],
    )
}

/// Whether a word of a tiny tokenizer is a special token: spelled `<|…|>` (Llama 3) or `[…]`
/// in capitals (Mistral's `[TOOL_CALLS]`).
fn is_control_word(word: &str) -> bool {
    let bracketed = word.len() > 2
        && word.starts_with('[')
        && word.ends_with(']')
        && word[1..word.len() - 1].chars().all(|c| c.is_ascii_uppercase() || c == '_' || c == '/');
    bracketed || (word.starts_with("<|") && word.ends_with("|>"))
}

/// A Mistral-style word-level tokenizer: `[TOOL_CALLS]`, `[TOOL_RESULTS]` and
/// `[/TOOL_RESULTS]` as special tokens, then `words`, with a chat template that names
/// `[TOOL_CALLS]` (so the tool format is Mistral's); `</s>` ends a turn.
pub fn tiny_mistral_tokenizer(words: &[&str]) -> Result<ChatTokenizer> {
    let mut all = vec!["[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"];
    all.extend(words);
    word_tokenizer(
        &all,
        "{% for m in messages %}[INST] {{ m.content }}[/INST]{% endfor %}{# [TOOL_CALLS] #}",
        &[],
    )
}

/// The word-level tokenizer of [`tiny_tokenizer`]; `words` replace `t3`, `t4`, … in order (as
/// added tokens, special when [`is_control_word`]), with a chat `template`; `</s>` and the words in
/// `eos` end a sequence.
fn word_tokenizer(words: &[&str], template: &str, eos: &[&str]) -> Result<ChatTokenizer> {
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
