//! Fixtures for trainer tests: word-level tokenizers with tool and chat tokens for the tiny
//! random model, and a trainer over the synthetic task ([`crate::synthetic`], re-exported here).

use super::error::Result;
use crate::config::Family;
use crate::synthetic::{word_tokenizer, CONCAT_TEMPLATE};
use crate::tokenizer::ChatTokenizer;
use serde_json::json;

pub use crate::synthetic::{
    first_token_grader, target_token_jsonl, tiny_tokenizer, write_tiny_model_dir, TARGET_TOKEN,
    TINY_VOCAB,
};

/// [`tiny_tokenizer`] with `<tool_call>` and `</tool_call>` as tokens 3 and 4 (instead of `t3`
/// and `t4`), so that the tiny model can call tools (and mostly make malformed calls).
pub fn tiny_tool_tokenizer() -> Result<ChatTokenizer> {
    tiny_word_tokenizer(&["<tool_call>", "</tool_call>"])
}

/// [`tiny_tokenizer`] with `words` (added tokens, which may contain spaces) instead of `t3`,
/// `t4`, … in order.
pub fn tiny_word_tokenizer(words: &[&str]) -> Result<ChatTokenizer> {
    Ok(word_tokenizer(words, CONCAT_TEMPLATE, &[])?)
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
    .map_err(Into::into)
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
    .map_err(Into::into)
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

/// The files of a [`write_tiny_model_dir`] folder by name, as a hub repository holds them.
pub fn tiny_model_files(
    family: Family,
    seed: u64,
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<u8>>> {
    let dir = std::env::temp_dir().join(format!("verity-tiny-files-{}", uuid::Uuid::new_v4()));
    let read = || -> anyhow::Result<std::collections::BTreeMap<String, Vec<u8>>> {
        write_tiny_model_dir(&dir, family, seed)?;
        let mut files = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            files.insert(name, std::fs::read(&path)?);
        }
        Ok(files)
    };
    let files = read();
    let _ = std::fs::remove_dir_all(&dir);
    files
}
