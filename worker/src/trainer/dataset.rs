//! Training and validation rows: JSONL with `messages` (a chat) or `prompt` (a string) plus the
//! fields graders read, rendered with the model's chat template; and the seeded data order.

use super::error::{Result, TrainerError};
use crate::chat_template::ChatMessage;
use crate::tokenizer::ChatTokenizer;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One prompt of a dataset, ready for sampling and grading.
#[derive(Debug, Clone)]
pub struct Example {
    /// The whole row, as graders see it (`{{item.…}}`).
    pub item: Value,
    /// The rendered prompt text.
    pub prompt_text: String,
    /// Its token ids.
    pub prompt_ids: Vec<u32>,
}

/// The rows of one JSONL file.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Rows in file order.
    pub examples: Vec<Example>,
}

fn data_error(file: &str, line: usize, message: impl Into<String>) -> TrainerError {
    TrainerError::Data { file: file.to_string(), line, message: message.into() }
}

/// The chat of a row: its `messages`, or its `prompt` as one user message.
fn row_messages(row: &Value, file: &str, line: usize) -> Result<Vec<ChatMessage>> {
    if let Some(messages) = row.get("messages") {
        let messages: Vec<ChatMessage> = serde_json::from_value(messages.clone()).map_err(|e| {
            data_error(file, line, format!("`messages` must be a list of {{role, content}}: {e}"))
        })?;
        if messages.is_empty() {
            return Err(data_error(file, line, "`messages` is empty"));
        }
        return Ok(messages);
    }
    match row.get("prompt") {
        Some(Value::String(prompt)) if !prompt.is_empty() => {
            Ok(vec![ChatMessage::new("user", prompt.clone())])
        }
        Some(_) => Err(data_error(file, line, "`prompt` must be a non-empty string")),
        None => Err(data_error(file, line, "the row has neither `messages` nor `prompt`")),
    }
}

impl Dataset {
    /// Parses JSONL `text` (blank lines skipped); `file` names it in errors. Prompts are
    /// rendered with the chat template (raw text when the model has none) and must be shorter
    /// than `max_prompt_tokens`.
    pub fn from_jsonl(
        text: &str,
        file: &str,
        tokenizer: &ChatTokenizer,
        max_prompt_tokens: usize,
    ) -> Result<Dataset> {
        let mut examples = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let item: Value = serde_json::from_str(raw)
                .map_err(|e| data_error(file, line, format!("not valid JSON: {e}")))?;
            if !item.is_object() {
                return Err(data_error(file, line, "each line must be a JSON object"));
            }
            let messages = row_messages(&item, file, line)?;
            let offers_tools =
                item.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
            let rendered = if offers_tools {
                // The row's functions, shown as its chat template (or the Hermes text) shows
                // them; the completion's calls become `sample.output_tools`.
                crate::episodes::format::render_prompt(tokenizer, &item, &[])
                    .map_err(|e| e.to_string())
            } else {
                tokenizer.apply_chat_template(&messages, true).map_err(|e| e.to_string())
            };
            let prompt_text = match rendered {
                Ok(text) => text,
                Err(_) if tokenizer.chat_template_source.is_none() => {
                    messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n")
                }
                Err(e) => return Err(data_error(file, line, format!("chat template failed: {e}"))),
            };
            let prompt_ids = tokenizer.encode(&prompt_text)?;
            if prompt_ids.is_empty() {
                return Err(data_error(file, line, "the prompt renders to no tokens"));
            }
            if prompt_ids.len() >= max_prompt_tokens {
                return Err(data_error(
                    file,
                    line,
                    format!(
                        "the prompt has {} tokens; the model allows at most {}",
                        prompt_ids.len(),
                        max_prompt_tokens.saturating_sub(1)
                    ),
                ));
            }
            examples.push(Example { item, prompt_text, prompt_ids });
        }
        if examples.is_empty() {
            return Err(data_error(file, 0, "the file holds no rows"));
        }
        Ok(Dataset { examples })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }
}

/// Position in the data order: which epoch, and how many of its rows were used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DataCursor {
    /// 0-based epoch.
    pub epoch: u64,
    /// Rows of this epoch already handed out.
    pub index: usize,
}

/// A seeded order over the rows: each epoch is a fresh permutation derived from the seed and
/// the epoch number, so a cursor alone restores the exact sequence.
#[derive(Debug, Clone)]
pub struct DataOrder {
    seed: u64,
    len: usize,
    cursor: DataCursor,
    permutation: Vec<usize>,
}

impl DataOrder {
    /// The order of `len` rows seeded with `seed`, starting at `cursor`.
    pub fn new(seed: u64, len: usize, cursor: DataCursor) -> DataOrder {
        let permutation = Self::permutation(seed, len, cursor.epoch);
        DataOrder { seed, len, cursor, permutation }
    }

    fn permutation(seed: u64, len: usize, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..len).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(super::mix_seed(seed, &[0x0da7a, epoch]));
        order.shuffle(&mut rng);
        order
    }

    /// The next row index (moving to the next epoch after the last row).
    pub fn next_index(&mut self) -> usize {
        if self.cursor.index >= self.len {
            self.cursor = DataCursor { epoch: self.cursor.epoch + 1, index: 0 };
            self.permutation = Self::permutation(self.seed, self.len, self.cursor.epoch);
        }
        let row = self.permutation[self.cursor.index];
        self.cursor.index += 1;
        row
    }

    /// Where the order stands.
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_a_permutation_per_epoch_and_resumes_from_a_cursor() {
        let mut order = DataOrder::new(7, 5, DataCursor::default());
        let first: Vec<usize> = (0..5).map(|_| order.next_index()).collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        let _ = order.next_index();
        let cursor = order.cursor();
        assert_eq!(cursor, DataCursor { epoch: 1, index: 1 });
        let rest: Vec<usize> = (0..7).map(|_| order.next_index()).collect();
        let mut resumed = DataOrder::new(7, 5, cursor);
        let again: Vec<usize> = (0..7).map(|_| resumed.next_index()).collect();
        assert_eq!(rest, again);
    }
}
