//! Batched sampling: B prompts x G samples with a shared prefill and a KV cache.
//!
//! Each prompt is prefilled once (left-padded batch) and its cache rows are repeated for its G
//! samples. Every sequence has its own RNG seeded from `(seed, prompt, sample)`, so results do not
//! depend on batch composition. Finished sequences are dropped from the cache (in batches, so
//! the copy stays cheap) and stop costing compute.

use crate::error::{Result, WorkerError};
use crate::model::compact::{CompactWeights, RolloutDtype};
use crate::model::decode::DecodeBatch;
use crate::model::Transformer;
use crate::tokenizer::ChatTokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How to sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Samples per prompt (G).
    pub n: usize,
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass kept (1.0 disables).
    pub top_p: f32,
    /// Most likely tokens kept (0 disables).
    pub top_k: usize,
    /// Longest completion in tokens.
    pub max_new_tokens: usize,
    /// Texts that end a completion (kept in it).
    pub stop_strings: Vec<String>,
    /// Seed of the whole job; each sequence derives its own stream.
    pub seed: u64,
    /// Precision of the weights the sampler reads.
    #[serde(default)]
    pub rollout_dtype: RolloutDtype,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 256,
            stop_strings: vec![],
            seed: 0,
            rollout_dtype: RolloutDtype::F32,
        }
    }
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An EOS token was sampled (it is the last token).
    Eos,
    /// A stop string appeared.
    Stop,
    /// `max_new_tokens` was reached.
    Length,
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Index of its prompt.
    pub prompt_index: usize,
    /// Index among the prompt's samples.
    pub sample_index: usize,
    /// Sampled token ids (EOS included when it ended the sequence).
    pub token_ids: Vec<u32>,
    /// Log-probability of each token under `softmax(logits / T)` before top-k/top-p
    /// truncation (T = 1 when greedy): what the trainer recomputes as the old policy.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

struct Sequence {
    prompt_index: usize,
    sample_index: usize,
    rng: StdRng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
}

/// SplitMix64 finaliser, to derive independent per-sequence seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The RNG of sample `sample` of prompt `prompt` in a job seeded with `seed`.
pub fn sequence_rng(seed: u64, prompt: usize, sample: usize) -> StdRng {
    StdRng::seed_from_u64(mix(mix(mix(seed) ^ prompt as u64) ^ sample as u64))
}

/// Picks the next token from a logits row; returns it with its log-probability.
pub fn pick_token(logits: &[f32], params: &SamplingParams, rng: &mut StdRng) -> (u32, f32) {
    let greedy = params.temperature <= 0.0;
    let inv_t = if greedy { 1.0 } else { 1.0 / params.temperature };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let probs: Vec<f32> = logits.iter().map(|&z| ((z - max) * inv_t).exp()).collect();
    let total: f32 = probs.iter().sum();
    let logprob_of = |t: usize| (probs[t] / total).ln();
    if greedy {
        let best = probs.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |acc, (i, &p)| {
            if p > acc.1 {
                (i, p)
            } else {
                acc
            }
        });
        return (best.0 as u32, logprob_of(best.0));
    }
    let mut cand: Vec<u32> = (0..probs.len() as u32).collect();
    let by_prob_desc = |a: &u32, b: &u32| probs[*b as usize].total_cmp(&probs[*a as usize]);
    if params.top_k > 0 && params.top_k < cand.len() {
        cand.select_nth_unstable_by(params.top_k - 1, by_prob_desc);
        cand.truncate(params.top_k);
    }
    if params.top_p < 1.0 {
        let mass: f32 = cand.iter().map(|&i| probs[i as usize]).sum();
        let need = params.top_p * mass;
        // Sort only a head of the candidates when it already holds the nucleus.
        let head = 2048.min(cand.len());
        if head < cand.len() {
            cand.select_nth_unstable_by(head - 1, by_prob_desc);
            let head_mass: f32 = cand[..head].iter().map(|&i| probs[i as usize]).sum();
            if head_mass >= need {
                cand.truncate(head);
            }
        }
        cand.sort_unstable_by(by_prob_desc);
        let mut acc = 0f32;
        let mut keep = cand.len();
        for (k, &i) in cand.iter().enumerate() {
            acc += probs[i as usize];
            if acc >= need {
                keep = k + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    let mass: f32 = cand.iter().map(|&i| probs[i as usize]).sum();
    let mut r = rng.random::<f32>() * mass;
    let mut chosen = *cand.last().unwrap_or(&0);
    for &i in &cand {
        r -= probs[i as usize];
        if r <= 0.0 {
            chosen = i;
            break;
        }
    }
    (chosen, logprob_of(chosen as usize))
}

/// Samples `params.n` completions for each prompt. Results are ordered prompt-major
/// (`prompt_index * n + sample_index`). Stop strings need the tokenizer.
pub fn sample(
    model: &Transformer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    eos_ids: &[u32],
    pad_id: u32,
    tokenizer: Option<&ChatTokenizer>,
) -> Result<Vec<Completion>> {
    let rng = |p: usize, s: usize| sequence_rng(params.seed, p, s);
    sample_with_rngs(model, prompts, params, eos_ids, pad_id, tokenizer, &rng)
}

/// Like [`sample`], but prompt `p` draws from its own seed `seeds[p]` (sample `s` of it from
/// `sequence_rng(seeds[p], 0, s)`), so that a prompt samples the same tokens whatever else is
/// in the batch and wherever it stands in it (the judge's batched and one-by-one paths agree).
pub fn sample_seeded(
    model: &Transformer,
    prompts: &[Vec<u32>],
    seeds: &[u64],
    params: &SamplingParams,
    eos_ids: &[u32],
    pad_id: u32,
    tokenizer: Option<&ChatTokenizer>,
) -> Result<Vec<Completion>> {
    if seeds.len() != prompts.len() {
        return Err(WorkerError::InvalidArgument("one seed per prompt is needed".into()));
    }
    let rng = |p: usize, s: usize| sequence_rng(seeds[p], 0, s);
    sample_with_rngs(model, prompts, params, eos_ids, pad_id, tokenizer, &rng)
}

fn sample_with_rngs(
    model: &Transformer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    eos_ids: &[u32],
    pad_id: u32,
    tokenizer: Option<&ChatTokenizer>,
    rng_of: &(dyn Fn(usize, usize) -> StdRng + Sync),
) -> Result<Vec<Completion>> {
    // The whole decode runs on a pool thread (see `kernels::on_pool`).
    crate::kernels::on_pool(|| -> Result<Vec<Completion>> {
        if params.n == 0 || params.max_new_tokens == 0 {
            return Err(WorkerError::InvalidArgument(
                "n and max_new_tokens must be at least 1".into(),
            ));
        }
        if !params.stop_strings.is_empty() && tokenizer.is_none() {
            return Err(WorkerError::InvalidArgument("stop strings need a tokenizer".into()));
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            return Err(WorkerError::InvalidArgument(format!(
                "top_p must be in (0, 1], got {}",
                params.top_p
            )));
        }
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        // The bf16 copies serve the CPU kernels; on a GPU decoding is not bandwidth-starved, and
        // the f32 weights are read as they are.
        let compact = if params.rollout_dtype == RolloutDtype::Bf16 && model.device().is_cpu() {
            Some(CompactWeights::of(model)?)
        } else {
            None
        };
        let (mut batch, prompt_logits) =
            DecodeBatch::prefill(model, &refs, pad_id, params.max_new_tokens, compact)?;

        let g = params.n;
        let mut seqs: Vec<Sequence> = (0..prompts.len() * g)
            .map(|r| {
                let (p, s) = (r / g, r % g);
                Sequence {
                    prompt_index: p,
                    sample_index: s,
                    rng: rng_of(p, s),
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    finish: None,
                }
            })
            .collect();
        let expand: Vec<usize> = (0..seqs.len()).map(|r| r / g).collect();
        batch.select_rows(&expand)?;
        // `rows[k]` is the sequence held in batch row k; `logits[k]` its next-token logits.
        let mut rows: Vec<usize> = (0..seqs.len()).collect();
        let mut logits: Vec<Vec<f32>> = expand.iter().map(|&p| prompt_logits[p].clone()).collect();
        let stop_len = params.stop_strings.iter().map(|s| s.len()).max().unwrap_or(0);

        for _ in 0..params.max_new_tokens {
            let mut row_seqs: Vec<&mut Sequence> = Vec::with_capacity(rows.len());
            {
                let mut by_index: Vec<Option<&mut Sequence>> = seqs.iter_mut().map(Some).collect();
                for &r in &rows {
                    if let Some(s) = by_index[r].take() {
                        row_seqs.push(s);
                    }
                }
            }
            row_seqs.par_iter_mut().zip(logits.par_iter()).try_for_each(
                |(seq, row_logits)| -> Result<()> {
                    if seq.finish.is_some() {
                        return Ok(());
                    }
                    let (tok, lp) = pick_token(row_logits, params, &mut seq.rng);
                    seq.tokens.push(tok);
                    seq.logprobs.push(lp);
                    if eos_ids.contains(&tok) {
                        seq.finish = Some(FinishReason::Eos);
                    } else if let (Some(t), true) = (tokenizer, stop_len > 0) {
                        // Only the tail can contain a stop string that was not there before.
                        let tail_tokens =
                            &seq.tokens[seq.tokens.len().saturating_sub(stop_len + 8)..];
                        let text = t.decode(tail_tokens, false)?;
                        if params.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                            seq.finish = Some(FinishReason::Stop);
                        }
                    }
                    if seq.finish.is_none() && seq.tokens.len() >= params.max_new_tokens {
                        seq.finish = Some(FinishReason::Length);
                    }
                    Ok(())
                },
            )?;
            let live: Vec<usize> =
                (0..rows.len()).filter(|&k| seqs[rows[k]].finish.is_none()).collect();
            if live.is_empty() {
                break;
            }
            let dead = rows.len() - live.len();
            if dead > 0 && dead * 8 >= rows.len() {
                batch.select_rows(&live)?;
                rows = live.iter().map(|&k| rows[k]).collect();
            }
            let ids: Vec<u32> =
                rows.iter().map(|&r| *seqs[r].tokens.last().unwrap_or(&pad_id)).collect();
            logits = batch.step(model, &ids)?;
        }
        Ok(seqs
            .into_iter()
            .map(|s| Completion {
                prompt_index: s.prompt_index,
                sample_index: s.sample_index,
                token_ids: s.tokens,
                logprobs: s.logprobs,
                finish_reason: s.finish.unwrap_or(FinishReason::Length),
            })
            .collect())
    })
}
