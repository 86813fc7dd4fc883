//! Supervised fine-tuning: OpenAI's chat rows (`messages`, optional `tools`, a `weight` of 0 or
//! 1 per assistant message) as token sequences whose labels cover exactly the trained assistant
//! messages, and the loss: mean next-token cross-entropy over those tokens only.

use super::chat_rows::{messages, objects, parse_turns, segments, tokenize, tools};
use super::dataset::{Dataset, Example};
use super::error::{Result, TrainerError};
use crate::model::Transformer;
use crate::optim::policy_optimizer::PolicyOptimizer;
use crate::tokenizer::ChatTokenizer;
use candle_core::{DType, Tensor};
use serde_json::Value;

/// One tokenized conversation of a supervised file.
#[derive(Debug, Clone, PartialEq)]
pub struct SupervisedExample {
    /// Every token of the rendered conversation.
    pub ids: Vec<u32>,
    /// Whether each token is trained on: the tokens of assistant messages with weight 1
    /// (their content and the template's end of turn); system, user, tool and template tokens
    /// and weight-0 assistant messages are not.
    pub labels: Vec<bool>,
    /// The last trained assistant message's text (shown beside the samples).
    pub target: String,
}

impl SupervisedExample {
    /// Tokens trained on.
    pub fn label_count(&self) -> usize {
        self.labels.iter().filter(|&&l| l).count()
    }

    /// The scoring split: the tokens before the first trained one (a prompt, never empty), the
    /// rest, and the rest's label mask (1.0 on trained tokens).
    pub fn scoring_parts(&self) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
        let split = self.labels.iter().position(|&l| l).unwrap_or(self.ids.len()).max(1);
        let mask = self.labels[split..].iter().map(|&l| if l { 1.0 } else { 0.0 }).collect();
        (self.ids[..split].to_vec(), self.ids[split..].to_vec(), mask)
    }
}

/// Parses one supervised row: its example and, for the samples, its prompt (the chat before
/// its last trained assistant message, with the generation prompt).
pub fn supervised_row(
    item: &Value,
    tokenizer: &ChatTokenizer,
    max_tokens: usize,
) -> std::result::Result<(SupervisedExample, Example), String> {
    let turns = parse_turns(item.get("messages"), "messages")?;
    let tools = tools(item, "tools")?;
    let Some(last) = turns.iter().rposition(|t| t.trained) else {
        return Err(if turns.iter().any(|t| t.assistant) {
            "`messages`: every assistant message has weight 0; nothing to train on".into()
        } else {
            "`messages`: no assistant message to train on".into()
        });
    };
    let segments = segments(tokenizer, &turns, tools.as_ref())?;
    let (ids, labels) = tokenize(tokenizer, &segments).map_err(|e| e.to_string())?;
    if ids.len() > max_tokens {
        return Err(format!(
            "the conversation has {} tokens; the model allows at most {max_tokens}",
            ids.len()
        ));
    }
    if labels.first() == Some(&true) {
        return Err("`messages` must not start with a trained assistant message".into());
    }
    let prompt_text = tokenizer
        .render_chat(&messages(&turns[..last]), tools.as_ref(), true)
        .map_err(|e| format!("chat template failed: {e}"))?;
    let prompt_ids = tokenizer.encode(&prompt_text).map_err(|e| e.to_string())?;
    let target = turns[last].content().to_string();
    let example = Example { item: item.clone(), prompt_text, prompt_ids };
    Ok((SupervisedExample { ids, labels, target }, example))
}

/// Parses a supervised JSONL file (`file` names it in errors): the rows' prompts (for samples)
/// and their examples. Conversations may hold at most `max_tokens` tokens.
pub fn load_supervised(
    text: &str,
    file: &str,
    tokenizer: &ChatTokenizer,
    max_tokens: usize,
) -> Result<(Dataset, Vec<SupervisedExample>)> {
    let mut prompts = Vec::new();
    let mut examples = Vec::new();
    for row in objects(text, file) {
        let (line, item) = row?;
        let (example, prompt) = supervised_row(&item, tokenizer, max_tokens)
            .map_err(|message| TrainerError::Data { file: file.into(), line, message })?;
        examples.push(example);
        prompts.push(prompt);
    }
    if examples.is_empty() {
        return Err(TrainerError::Data { file: file.into(), line: 0, message: "no rows".into() });
    }
    Ok((Dataset { examples: prompts }, examples))
}

/// Sum of the cross-entropy `−log p` over the tokens where `labels` is 1 (`logprobs` and
/// `labels` shaped alike).
pub fn masked_nll_sum(logprobs: &Tensor, labels: &Tensor) -> Result<Tensor> {
    Ok(logprobs.mul(labels)?.sum_all()?.neg()?)
}

/// What one supervised update measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct SupervisedUpdate {
    /// Mean cross-entropy per trained token.
    pub loss: f64,
    /// Trained (assistant) tokens.
    pub label_tokens: u64,
    /// Every token scored (prompt and completion).
    pub tokens: u64,
}

/// Token sequences of a micro-batch: one per example.
type TokenRows = Vec<Vec<u32>>;

/// The micro-batch inputs of `examples`: prompts, completions and the `[n, T]` label mask.
fn scoring_batch(
    examples: &[&SupervisedExample],
    device: &candle_core::Device,
) -> Result<(TokenRows, TokenRows, Tensor)> {
    let parts: Vec<_> = examples.iter().map(|e| e.scoring_parts()).collect();
    let width = parts.iter().map(|(_, rest, _)| rest.len()).max().unwrap_or(0);
    let mut mask = vec![0f32; parts.len() * width];
    for (i, (_, _, labels)) in parts.iter().enumerate() {
        mask[i * width..i * width + labels.len()].copy_from_slice(labels);
    }
    let mask = Tensor::from_vec(mask, (parts.len(), width), device)?;
    let (prompts, rests) = parts.into_iter().map(|(p, r, _)| (p, r)).unzip();
    Ok((prompts, rests, mask))
}

/// One accumulation pass over `examples` in micro-batches of `micro`, the loss normalised by
/// every trained token of the batch (a token-level mean, as TRL's); the optimizer step is the
/// caller's.
pub fn supervised_backward(
    model: &Transformer,
    optimizer: &mut PolicyOptimizer,
    examples: &[&SupervisedExample],
    micro: usize,
    pad: u32,
) -> Result<SupervisedUpdate> {
    let label_tokens: usize = examples.iter().map(|e| e.label_count()).sum();
    let normaliser = label_tokens.max(1) as f64;
    let mut loss = 0.0;
    for chunk in examples.chunks(micro.max(1)) {
        let (prompts, rests, mask) = scoring_batch(chunk, model.device())?;
        let (scored, tape) = model.completion_logprobs_layered(&prompts, &rests, &[], 1.0, pad)?;
        let micro_loss = (masked_nll_sum(&scored.logprobs, &mask)? / normaliser)?;
        loss += micro_loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        optimizer.backward_layered(&micro_loss, tape, 1.0)?;
    }
    Ok(SupervisedUpdate {
        loss,
        label_tokens: label_tokens as u64,
        tokens: examples.iter().map(|e| e.ids.len() as u64).sum(),
    })
}

/// Validation loss (mean cross-entropy per trained token) and token accuracy (the share of
/// trained tokens that are the argmax of the model's next-token logits), from full logits.
pub fn supervised_eval(
    model: &Transformer,
    examples: &[SupervisedExample],
    pad: u32,
) -> Result<(f64, f64)> {
    let (mut nll, mut correct, mut count) = (0.0f64, 0usize, 0usize);
    for example in examples {
        let logits = model.sequence_logits(&[example.ids.as_slice()], pad)?.squeeze(0)?;
        // row t - 1 predicts token t
        let positions: Vec<u32> =
            (1..example.ids.len()).filter(|&t| example.labels[t]).map(|t| (t - 1) as u32).collect();
        if positions.is_empty() {
            continue;
        }
        let rows = logits
            .index_select(&Tensor::new(positions.as_slice(), logits.device())?, 0)?
            .to_dtype(DType::F64)?
            .to_vec2::<f64>()?;
        for (row, &p) in rows.iter().zip(&positions) {
            let target = example.ids[p as usize + 1] as usize;
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            nll += log_z - row[target];
            let argmax =
                row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i);
            correct += usize::from(argmax == target);
            count += 1;
        }
    }
    let count = count.max(1) as f64;
    Ok((nll / count, correct as f64 / count))
}
