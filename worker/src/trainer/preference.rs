//! Direct preference optimisation: OpenAI's preference rows (`input.messages` with optional
//! `tools`, `preferred_output`, `non_preferred_output`) as a prompt and two responses, sequence
//! log-probs summed over each response's tokens, and the DPO loss
//! `−log σ(β·((log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))))` against the
//! reference log-probs of the start model, computed once per pair and cached
//! ([`ReferenceLogprobs`], saved in checkpoints).

use super::chat_rows::{messages, objects, parse_turns, tools, Turn};
use super::dataset::{Dataset, Example};
use super::error::{Result, TrainerError};
use crate::model::Transformer;
use crate::optim::policy_optimizer::PolicyOptimizer;
use crate::tokenizer::ChatTokenizer;
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One tokenized preference pair.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePair {
    /// The input chat rendered with the generation prompt.
    pub prompt: Vec<u32>,
    /// The preferred response's tokens (what the template renders after the prompt).
    pub chosen: Vec<u32>,
    /// The non-preferred response's tokens.
    pub rejected: Vec<u32>,
    /// The preferred response's text (shown beside the samples).
    pub target: String,
}

/// The response `outputs` (assistant messages at JSON path `field`) as tokens after `prompt`.
fn response(
    tokenizer: &ChatTokenizer,
    (input, tools): (&[Turn], Option<&Value>),
    prompt: &str,
    outputs: &[Turn],
    field: &str,
) -> std::result::Result<Vec<u32>, String> {
    if let Some(i) = outputs.iter().position(|t| !t.assistant) {
        return Err(format!("`{field}[{i}].role` must be \"assistant\""));
    }
    let chat: Vec<Turn> = input.iter().chain(outputs).cloned().collect();
    let full = tokenizer
        .render_chat(&messages(&chat), tools, false)
        .map_err(|e| format!("chat template failed: {e}"))?;
    let Some(rest) = full.strip_prefix(prompt) else {
        return Err(format!(
            "the chat template does not render `{field}` as a continuation of the input"
        ));
    };
    let ids = tokenizer.encode(rest).map_err(|e| e.to_string())?;
    if ids.is_empty() {
        return Err(format!("`{field}` renders to no tokens"));
    }
    Ok(ids)
}

/// Parses one DPO row: its pair and, for the samples, its prompt.
pub fn preference_row(
    item: &Value,
    tokenizer: &ChatTokenizer,
    max_tokens: usize,
) -> std::result::Result<(PreferencePair, Example), String> {
    let Some(input) = item.get("input").filter(|i| i.is_object()) else {
        return Err("`input` is missing or not an object (`{\"messages\": […]}`)".into());
    };
    let turns = parse_turns(input.get("messages"), "input.messages")?;
    let tools = tools(input, "input.tools")?;
    let preferred = parse_turns(item.get("preferred_output"), "preferred_output")?;
    let non_preferred = parse_turns(item.get("non_preferred_output"), "non_preferred_output")?;
    let prompt_text = tokenizer
        .render_chat(&messages(&turns), tools.as_ref(), true)
        .map_err(|e| format!("chat template failed: {e}"))?;
    let prompt = tokenizer.encode(&prompt_text).map_err(|e| e.to_string())?;
    if prompt.is_empty() {
        return Err("`input.messages` renders to no tokens".into());
    }
    let context = (turns.as_slice(), tools.as_ref());
    let chosen = response(tokenizer, context, &prompt_text, &preferred, "preferred_output")?;
    let rejected =
        response(tokenizer, context, &prompt_text, &non_preferred, "non_preferred_output")?;
    let longest = prompt.len() + chosen.len().max(rejected.len());
    if longest > max_tokens {
        return Err(format!(
            "the pair has {longest} tokens; the model allows at most {max_tokens}"
        ));
    }
    let target = preferred.iter().map(Turn::content).collect::<Vec<_>>().join("\n");
    let example = Example { item: item.clone(), prompt_text, prompt_ids: prompt.clone() };
    Ok((PreferencePair { prompt, chosen, rejected, target }, example))
}

/// Parses a DPO JSONL file (`file` names it in errors): the rows' prompts and pairs.
pub fn load_preferences(
    text: &str,
    file: &str,
    tokenizer: &ChatTokenizer,
    max_tokens: usize,
) -> Result<(Dataset, Vec<PreferencePair>)> {
    let mut prompts = Vec::new();
    let mut pairs = Vec::new();
    for row in objects(text, file) {
        let (line, item) = row?;
        let (pair, prompt) = preference_row(&item, tokenizer, max_tokens)
            .map_err(|message| TrainerError::Data { file: file.into(), line, message })?;
        pairs.push(pair);
        prompts.push(prompt);
    }
    if pairs.is_empty() {
        return Err(TrainerError::Data { file: file.into(), line: 0, message: "no rows".into() });
    }
    Ok((Dataset { examples: prompts }, pairs))
}

/// Reference log-probs `[chosen, rejected]` of every pair, from the start model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceLogprobs {
    /// Of the training pairs, in file order.
    pub train: Vec<[f64; 2]>,
    /// Of the validation pairs.
    pub validation: Vec<[f64; 2]>,
}

/// The per-pair terms of the DPO loss.
pub struct DpoTerms {
    /// `−log σ(chosen_reward − rejected_reward)` per pair (differentiable).
    pub losses: Tensor,
    /// `β (log π(y_w) − log π_ref(y_w))` per pair (detached).
    pub chosen_rewards: Tensor,
    /// `β (log π(y_l) − log π_ref(y_l))` per pair (detached).
    pub rejected_rewards: Tensor,
}

/// `−log σ(x)` computed stably: `max(−x, 0) + log(1 + e^{−|x|})`.
fn neg_log_sigmoid(x: &Tensor) -> Result<Tensor> {
    let softplus_tail = x.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?;
    Ok((x.neg()?.relu()? + softplus_tail)?)
}

/// The DPO loss per pair from sequence log-probs (`[n]` tensors) of the policy and reference.
pub fn dpo_loss(
    policy: (&Tensor, &Tensor),
    reference: (&Tensor, &Tensor),
    beta: f64,
) -> Result<DpoTerms> {
    let chosen = ((policy.0 - reference.0)? * beta)?;
    let rejected = ((policy.1 - reference.1)? * beta)?;
    let losses = neg_log_sigmoid(&(&chosen - &rejected)?)?;
    Ok(DpoTerms { losses, chosen_rewards: chosen.detach(), rejected_rewards: rejected.detach() })
}

/// Prompts and completions of `pairs` as one scoring batch: rows chosen₀, rejected₀, chosen₁…
fn scoring_batch(pairs: &[&PreferencePair]) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    pairs
        .iter()
        .flat_map(|p| {
            [(p.prompt.clone(), p.chosen.clone()), (p.prompt.clone(), p.rejected.clone())]
        })
        .unzip()
}

/// `[n, 2]` summed log-probs (chosen, rejected) of a scored batch from [`scoring_batch`].
fn pair_sums(scored: &crate::model::CompletionLogprobs, pairs: usize) -> Result<Tensor> {
    Ok(scored.logprobs.mul(&scored.mask)?.sum(1)?.reshape((pairs, 2))?)
}

/// Sequence log-probs `[chosen, rejected]` of each pair under `model` (no gradient), in
/// micro-batches of `micro` pairs.
pub fn sequence_logprobs(
    model: &Transformer,
    pairs: &[PreferencePair],
    micro: usize,
    pad: u32,
) -> Result<Vec<[f64; 2]>> {
    let mut out = Vec::with_capacity(pairs.len());
    let refs: Vec<&PreferencePair> = pairs.iter().collect();
    for chunk in refs.chunks(micro.max(1)) {
        let (prompts, completions) = scoring_batch(chunk);
        let scored = model.completion_logprobs(&prompts, &completions, 1.0, pad, false)?;
        let sums = pair_sums(&scored, chunk.len())?.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        out.extend(sums.into_iter().map(|row| [row[0], row[1]]));
    }
    Ok(out)
}

/// Means over the pairs of a step or an evaluation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DpoStats {
    /// Mean loss.
    pub loss: f64,
    /// Mean `chosen_reward − rejected_reward`.
    pub reward_margin: f64,
    /// Share of pairs whose chosen reward exceeds the rejected one.
    pub preference_accuracy: f64,
    /// Mean summed log-prob of the preferred responses.
    pub chosen_logprob: f64,
    /// Mean summed log-prob of the non-preferred responses.
    pub rejected_logprob: f64,
    /// Mean `β (log π(y_w) − log π_ref(y_w))`.
    pub chosen_reward: f64,
    /// Mean `β (log π(y_l) − log π_ref(y_l))`.
    pub rejected_reward: f64,
}

/// Running sums behind [`DpoStats`].
#[derive(Default)]
struct DpoSums {
    pairs: usize,
    loss: f64,
    correct: usize,
    chosen_logprob: f64,
    rejected_logprob: f64,
    chosen_reward: f64,
    rejected_reward: f64,
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

impl DpoSums {
    fn add(&mut self, terms: &DpoTerms, policy: (&Tensor, &Tensor)) -> Result<()> {
        let (chosen, rejected) = (values(&terms.chosen_rewards)?, values(&terms.rejected_rewards)?);
        self.pairs += chosen.len();
        self.loss += values(&terms.losses.detach())?.iter().sum::<f64>();
        self.correct += chosen.iter().zip(&rejected).filter(|(c, r)| c > r).count();
        self.chosen_reward += chosen.iter().sum::<f64>();
        self.rejected_reward += rejected.iter().sum::<f64>();
        self.chosen_logprob += values(&policy.0.detach())?.iter().sum::<f64>();
        self.rejected_logprob += values(&policy.1.detach())?.iter().sum::<f64>();
        Ok(())
    }

    fn stats(&self) -> DpoStats {
        let n = self.pairs.max(1) as f64;
        DpoStats {
            loss: self.loss / n,
            reward_margin: (self.chosen_reward - self.rejected_reward) / n,
            preference_accuracy: self.correct as f64 / n,
            chosen_logprob: self.chosen_logprob / n,
            rejected_logprob: self.rejected_logprob / n,
            chosen_reward: self.chosen_reward / n,
            rejected_reward: self.rejected_reward / n,
        }
    }
}

/// The `(chosen, rejected)` columns of `[n, 2]` log-probs.
fn columns(sums: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok((sums.narrow(1, 0, 1)?.squeeze(1)?, sums.narrow(1, 1, 1)?.squeeze(1)?))
}

/// One accumulation pass of the DPO loss (mean over `pairs`) in micro-batches of `micro`
/// sequences; `reference` holds each pair's reference log-probs. The optimizer step is the
/// caller's. Returns the step's stats and its tokens.
pub fn dpo_backward(
    model: &Transformer,
    optimizer: &mut PolicyOptimizer,
    pairs: &[(&PreferencePair, [f64; 2])],
    (beta, micro, pad): (f64, usize, u32),
) -> Result<(DpoStats, u64)> {
    let device = model.device().clone();
    let n = pairs.len().max(1) as f64;
    let mut sums = DpoSums::default();
    for chunk in pairs.chunks((micro / 2).max(1)) {
        let batch: Vec<&PreferencePair> = chunk.iter().map(|(p, _)| *p).collect();
        let (prompts, completions) = scoring_batch(&batch);
        let (scored, tape) =
            model.completion_logprobs_layered(&prompts, &completions, &[], 1.0, pad)?;
        let policy = columns(&pair_sums(&scored, chunk.len())?)?;
        let reference: Vec<f32> =
            chunk.iter().flat_map(|(_, r)| [r[0] as f32, r[1] as f32]).collect();
        let reference = columns(&Tensor::from_vec(reference, (chunk.len(), 2), &device)?)?;
        let terms = dpo_loss((&policy.0, &policy.1), (&reference.0, &reference.1), beta)?;
        sums.add(&terms, (&policy.0, &policy.1))?;
        let loss = (terms.losses.sum_all()? / n)?;
        optimizer.backward_layered(&loss, tape, 1.0)?;
    }
    let tokens = pairs
        .iter()
        .map(|(p, _)| (p.prompt.len() + p.chosen.len() + p.rejected.len()) as u64)
        .sum();
    Ok((sums.stats(), tokens))
}

/// The DPO stats of `pairs` under `model` (no gradient) against their `reference` log-probs.
pub fn dpo_eval(
    model: &Transformer,
    pairs: &[PreferencePair],
    reference: &[[f64; 2]],
    (beta, micro, pad): (f64, usize, u32),
) -> Result<DpoStats> {
    let policy = sequence_logprobs(model, pairs, micro, pad)?;
    let device = candle_core::Device::Cpu;
    let column = |rows: &[[f64; 2]], j: usize| {
        Tensor::from_vec(rows.iter().map(|r| r[j]).collect::<Vec<_>>(), rows.len(), &device)
    };
    let (pc, pr) = (column(&policy, 0)?, column(&policy, 1)?);
    let (rc, rr) = (column(reference, 0)?, column(reference, 1)?);
    let terms = dpo_loss((&pc, &pr), (&rc, &rr), beta)?;
    let mut sums = DpoSums::default();
    sums.add(&terms, (&pc, &pr))?;
    Ok(sums.stats())
}
