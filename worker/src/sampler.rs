//! Batched sampling: B prompts x G samples with a shared prefill and a KV cache.
//!
//! Each prompt is prefilled once (left-padded batch) and its cache rows are repeated for its G
//! samples. Every sequence has its own RNG seeded from `(seed, prompt, sample)`, so results do not
//! depend on batch composition. Finished sequences are dropped from the cache (in batches, so
//! the copy stays cheap) and stop costing compute.
//!
//! **Continuous batching** (`max_batch_rows > 0`): at most that many rows decode at once; the
//! other prompts wait in a queue, and between decode steps, as soon as finished rows leave room
//! for a waiting prompt's G samples, the waiting prompts that fit are prefilled together and
//! join the running rows ([`DecodeBatch::append`]), so the long tail of one prompt's samples
//! overlaps the next prompts' decoding instead of idling the batch. With the default 0 every
//! prompt is prefilled at once, as before. [`sample_stream`] lets the queue grow while it
//! decodes: each prompt's samples are handed over as soon as they have all ended, and the caller
//! may add prompts then (DAPO's dynamic sampling refills the batch this way).

use crate::constrained::{mask_logits, OutputConstraint, SequenceConstraint, VocabMask};
use crate::error::{Result, WorkerError};
use crate::model::compact::{CompactWeights, RolloutDtype};
use crate::model::decode::DecodeBatch;
use crate::model::Transformer;
use crate::tokenizer::ChatTokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use verity_core::sampling::SamplingSettings;
use verity_verifiers::judge::JudgeSampling;

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
    /// Most sequences decoded at once (continuous batching; at least `n`); 0 decodes every
    /// prompt's samples together.
    #[serde(default)]
    pub max_batch_rows: usize,
    /// The grammar completions must follow (a JSON `response_format`); none is free text.
    #[serde(skip)]
    pub constraint: Option<OutputConstraint>,
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
            max_batch_rows: 0,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_new_tokens` tokens: one completion per prompt, seed 0.
    pub fn greedy(max_new_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_new_tokens, ..SamplingParams::default() }
    }
}

/// A sampling run's settings: one completion per prompt and seed 0 until the run sets them.
impl From<&SamplingSettings> for SamplingParams {
    fn from(s: &SamplingSettings) -> Self {
        SamplingParams {
            temperature: s.temperature as f32,
            top_p: s.top_p as f32,
            max_new_tokens: s.max_tokens,
            stop_strings: s.stop.clone(),
            ..SamplingParams::default()
        }
    }
}

/// A model grader's judge settings: one reply of at most its budget, from its seed.
impl From<&JudgeSampling> for SamplingParams {
    fn from(s: &JudgeSampling) -> Self {
        SamplingParams {
            temperature: s.temperature as f32,
            top_p: s.top_p as f32,
            max_new_tokens: s.max_completion_tokens,
            seed: s.seed,
            ..SamplingParams::default()
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
    /// Under constrained decoding, the tokens each position could take (one mask per token,
    /// the distribution `logprobs` were computed under); empty for free sampling. Kept in
    /// memory only.
    #[serde(skip)]
    pub token_masks: Vec<VocabMask>,
}

struct Sequence {
    prompt_index: usize,
    sample_index: usize,
    rng: StdRng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
    /// Where the sequence stands in the output grammar, and the mask of each token so far.
    constraint: Option<SequenceConstraint>,
    masks: Vec<VocabMask>,
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

/// Picks the next token a grammar allows: masks `logits` with the constraint's current mask,
/// picks as [`pick_token`] does, and advances the grammar. Returns the token, its
/// log-probability under the mask, and the mask (the trainer scores the token under it).
pub fn pick_constrained(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut StdRng,
    constraint: &mut SequenceConstraint,
) -> Result<(u32, f32, VocabMask)> {
    let mask = constraint.allowed()?;
    let mut masked = logits.to_vec();
    mask_logits(&mut masked, &mask);
    let (token, logprob) = pick_token(&masked, params, rng);
    constraint.commit(token)?;
    Ok((token, logprob, mask))
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
    // A token of probability 0 (masked out by a grammar) is never chosen, even when r is 0.
    let mut chosen = cand.iter().rev().copied().find(|&i| probs[i as usize] > 0.0).unwrap_or(0);
    for &i in &cand {
        r -= probs[i as usize];
        if r <= 0.0 && probs[i as usize] > 0.0 {
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

/// Like [`sample`], telling `progress` how many prompts have all their samples finished each
/// time that number grows (an evaluation's progress).
pub fn sample_with_progress(
    model: &Transformer,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    (eos_ids, pad_id): (&[u32], u32),
    tokenizer: Option<&ChatTokenizer>,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<Completion>> {
    let rng = |p: usize, s: usize| sequence_rng(params.seed, p, s);
    let run =
        Run { model, params, eos_ids, pad_id, tokenizer, rng_of: &rng, progress: Some(progress) };
    run.sample(prompts)
}

/// Told that all samples of the prompt at a stream index have ended (in sample order); returns
/// the prompts to add to the stream.
pub type GroupSink<'a, E> =
    dyn FnMut(usize, Vec<Completion>) -> std::result::Result<Vec<Vec<u32>>, E> + Send + 'a;

/// Samples `params.n` completions of a stream of prompts with continuous batching: it starts
/// with `prompts`; as soon as every sample of a prompt has ended, the prompt's completions go to
/// `on_group` with its index in the stream, and the prompts `on_group` returns join the queue,
/// taking rows as they free up (at most `params.max_batch_rows`). Sampling ends when no row is
/// live and no prompt waits. Sequence RNGs are keyed by stream index, as in [`sample`]: the
/// first prompts sample what [`sample`] gives them, whatever joins later.
pub fn sample_stream<E: From<WorkerError> + Send>(
    model: &Transformer,
    prompts: Vec<Vec<u32>>,
    params: &SamplingParams,
    (eos_ids, pad_id): (&[u32], u32),
    (tokenizer, progress): (Option<&ChatTokenizer>, Option<&(dyn Fn(usize) + Sync)>),
    on_group: &mut GroupSink<'_, E>,
) -> std::result::Result<(), E> {
    let rng = |p: usize, s: usize| sequence_rng(params.seed, p, s);
    let run = Run { model, params, eos_ids, pad_id, tokenizer, rng_of: &rng, progress };
    let mut prompts = prompts;
    run.decode(&mut prompts, Some(on_group)).map(drop)
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
    Run { model, params, eos_ids, pad_id, tokenizer, rng_of, progress: None }.sample(prompts)
}

/// Everything one sampling call reads besides its prompts.
struct Run<'a> {
    model: &'a Transformer,
    params: &'a SamplingParams,
    eos_ids: &'a [u32],
    pad_id: u32,
    tokenizer: Option<&'a ChatTokenizer>,
    /// The RNG of sample `s` of prompt `p`.
    rng_of: &'a (dyn Fn(usize, usize) -> StdRng + Sync),
    /// Told the number of fully sampled prompts as it grows.
    progress: Option<&'a (dyn Fn(usize) + Sync)>,
}

impl Run<'_> {
    fn validate(&self) -> Result<()> {
        let params = self.params;
        if params.n == 0 || params.max_new_tokens == 0 {
            return Err(WorkerError::InvalidArgument(
                "n and max_new_tokens must be at least 1".into(),
            ));
        }
        if !params.stop_strings.is_empty() && self.tokenizer.is_none() {
            return Err(WorkerError::InvalidArgument("stop strings need a tokenizer".into()));
        }
        if !(params.top_p > 0.0 && params.top_p <= 1.0) {
            return Err(WorkerError::InvalidArgument(format!(
                "top_p must be in (0, 1], got {}",
                params.top_p
            )));
        }
        Ok(())
    }

    /// Samples every prompt through one continuous batch ([`Slots`]); results prompt-major.
    fn sample(&self, prompts: &[Vec<u32>]) -> Result<Vec<Completion>> {
        let seqs = self.decode::<WorkerError>(&mut prompts.to_vec(), None)?;
        Ok(seqs.into_iter().map(Sequence::into_completion).collect())
    }

    /// The decode loop: samples `params.n` sequences of every prompt, admitting waiting prompts
    /// as rows free up. With a `sink`, each prompt whose samples have all ended is handed to it
    /// at once, and the prompts it returns join the queue.
    fn decode<E: From<WorkerError> + Send>(
        &self,
        prompts: &mut Vec<Vec<u32>>,
        mut sink: Option<&mut GroupSink<'_, E>>,
    ) -> std::result::Result<Vec<Sequence>, E> {
        let device = self.model.device();
        // The caller's stop flag (a cancelled job raises it), checked before each decode step.
        let stop = verity_verifiers::stop::current();
        let stopped = || stop.as_ref().is_some_and(verity_verifiers::StopFlag::is_raised);
        let on_pool = || -> std::result::Result<Vec<Sequence>, E> {
            if stopped() {
                return Err(WorkerError::Stopped.into());
            }
            self.validate()?;
            let g = self.params.n;
            // One set of weight copies serves every prefill of the call.
            let compact = CompactWeights::for_rollouts(self.model, self.params.rollout_dtype)?;
            let mut slots = Slots::new(self.params.max_batch_rows, g, prompts.len(), compact);
            let mut seqs: Vec<Sequence> = Vec::with_capacity(prompts.len() * g);
            slots.admit(self, prompts, &mut seqs)?;
            let stop_len = self.params.stop_strings.iter().map(|s| s.len()).max().unwrap_or(0);
            while !slots.rows.is_empty() {
                if stopped() {
                    return Err(WorkerError::Stopped.into());
                }
                let mut row_seqs: Vec<&mut Sequence> = Vec::with_capacity(slots.rows.len());
                {
                    let mut by_index: Vec<Option<&mut Sequence>> =
                        seqs.iter_mut().map(Some).collect();
                    for &r in &slots.rows {
                        if let Some(s) = by_index[r].take() {
                            row_seqs.push(s);
                        }
                    }
                }
                row_seqs
                    .par_iter_mut()
                    .zip(slots.logits.par_iter())
                    .try_for_each(|(seq, logits)| seq.advance(logits, self, stop_len))?;
                let ended = slots.count_finished(self, &seqs);
                if let Some(sink) = sink.as_mut() {
                    for prompt in ended {
                        // Prompt p's samples were admitted together: sequences p·G .. (p+1)·G.
                        let group = seqs[prompt * g..(prompt + 1) * g].iter();
                        prompts.extend(sink(prompt, group.map(Sequence::completion).collect())?);
                    }
                    slots.grow(prompts.len());
                }
                slots.step(self, prompts, &mut seqs)?;
            }
            Ok(seqs)
        };
        // The model's forward checks the flag between layers on the pool's thread too.
        verity_kernels::on_pool_for_decoding(device, || {
            verity_verifiers::stop::within(stop.as_ref(), on_pool)
        })
    }
}

impl Sequence {
    /// Picks the next token from `logits` unless the sequence is finished, and ends it at EOS,
    /// a stop string or the length limit.
    fn advance(&mut self, logits: &[f32], run: &Run<'_>, stop_len: usize) -> Result<()> {
        if self.finish.is_some() {
            return Ok(());
        }
        let params = run.params;
        let (tok, lp) = match self.constraint.as_mut() {
            None => pick_token(logits, params, &mut self.rng),
            Some(constraint) => {
                let (token, logprob, mask) =
                    pick_constrained(logits, params, &mut self.rng, constraint)?;
                self.masks.push(mask);
                (token, logprob)
            }
        };
        self.tokens.push(tok);
        self.logprobs.push(lp);
        if run.eos_ids.contains(&tok) {
            self.finish = Some(FinishReason::Eos);
        } else if let (Some(t), true) = (run.tokenizer, stop_len > 0) {
            // Only the tail can contain a stop string that was not there before.
            let tail_tokens = &self.tokens[self.tokens.len().saturating_sub(stop_len + 8)..];
            let text = t.decode(tail_tokens, false)?;
            if params.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                self.finish = Some(FinishReason::Stop);
            }
        }
        if self.finish.is_none() && self.tokens.len() >= params.max_new_tokens {
            self.finish = Some(FinishReason::Length);
        }
        Ok(())
    }

    fn completion(&self) -> Completion {
        Completion {
            prompt_index: self.prompt_index,
            sample_index: self.sample_index,
            token_ids: self.tokens.clone(),
            logprobs: self.logprobs.clone(),
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            token_masks: self.masks.clone(),
        }
    }

    fn into_completion(self) -> Completion {
        Completion {
            prompt_index: self.prompt_index,
            sample_index: self.sample_index,
            token_ids: self.tokens,
            logprobs: self.logprobs,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            token_masks: self.masks,
        }
    }
}

/// The continuous batch of one sampling call: the rows decoding now (at most `limit`), and the
/// prompts waiting for rows. Between decode steps finished rows leave, and when a waiting
/// prompt's `g` samples fit, the waiting prompts that fit are prefilled together (their prompt
/// computed once, its cache rows repeated for the samples) and join the running rows.
struct Slots {
    /// Most rows at once (at least `g`, so that a prompt always fits an empty batch).
    limit: usize,
    g: usize,
    /// The next prompt to admit; prompts `next..` wait.
    next: usize,
    prompts: usize,
    batch: Option<DecodeBatch>,
    /// `rows[k]`: the sequence in batch row k; `logits[k]`: its next-token logits.
    rows: Vec<usize>,
    logits: Vec<Vec<f32>>,
    /// Finished samples per prompt, prompts with every sample finished, and which sequences
    /// were counted.
    finished: Vec<usize>,
    done: usize,
    counted: Vec<bool>,
    compact: Option<Arc<CompactWeights>>,
}

impl Slots {
    fn new(
        max_rows: usize,
        g: usize,
        prompts: usize,
        compact: Option<Arc<CompactWeights>>,
    ) -> Self {
        let limit = if max_rows == 0 { usize::MAX } else { max_rows.max(g) };
        Slots {
            limit,
            g,
            next: 0,
            prompts,
            batch: None,
            rows: Vec::new(),
            logits: Vec::new(),
            finished: vec![0; prompts],
            done: 0,
            counted: Vec::new(),
            compact,
        }
    }

    /// Prefills the waiting prompts that fit the free rows, together, and adds their samples.
    fn admit(
        &mut self,
        run: &Run<'_>,
        prompts: &[Vec<u32>],
        seqs: &mut Vec<Sequence>,
    ) -> Result<()> {
        let free = self.limit.saturating_sub(self.rows.len());
        let count = (free / self.g).min(self.prompts - self.next);
        if count == 0 {
            return Ok(());
        }
        let start = self.next;
        self.next += count;
        let refs: Vec<&[u32]> = prompts[start..self.next].iter().map(Vec::as_slice).collect();
        let (mut joining, prompt_logits) = DecodeBatch::prefill(
            run.model,
            &refs,
            run.pad_id,
            run.params.max_new_tokens,
            self.compact.clone(),
        )?;
        let expand: Vec<usize> = (0..count * self.g).map(|r| r / self.g).collect();
        joining.select_rows(&expand)?;
        for (p, logits) in (start..self.next).zip(prompt_logits) {
            for s in 0..self.g {
                self.rows.push(seqs.len());
                self.logits.push(logits.clone());
                self.counted.push(false);
                seqs.push(Sequence {
                    prompt_index: p,
                    sample_index: s,
                    rng: (run.rng_of)(p, s),
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    finish: None,
                    constraint: run.params.constraint.as_ref().map(OutputConstraint::start),
                    masks: Vec::new(),
                });
            }
        }
        match self.batch.as_mut() {
            Some(batch) => batch.append(joining),
            None => {
                self.batch = Some(joining);
                Ok(())
            }
        }
    }

    /// After every row picked a token: counts finished samples, drops finished rows when that
    /// frees room for a waiting prompt (or, as always, once an eighth of the rows are done, so
    /// the copy stays cheap), feeds the live rows' tokens through one forward and admits
    /// waiting prompts into the free rows.
    fn step(
        &mut self,
        run: &Run<'_>,
        prompts: &[Vec<u32>],
        seqs: &mut Vec<Sequence>,
    ) -> Result<()> {
        let live: Vec<usize> =
            (0..self.rows.len()).filter(|&k| seqs[self.rows[k]].finish.is_none()).collect();
        let waiting = self.next < self.prompts;
        let dead = self.rows.len() - live.len();
        let refill = waiting && self.limit - live.len() >= self.g;
        if live.is_empty() {
            self.batch = None;
            self.rows.clear();
            self.logits.clear();
        } else if dead > 0 && (refill || dead * 8 >= self.rows.len()) {
            if let Some(batch) = self.batch.as_mut() {
                batch.select_rows(&live)?;
                if refill {
                    // Rows that joined later are padded in front; drop what nobody needs.
                    batch.trim()?;
                }
            }
            self.rows = live.iter().map(|&k| self.rows[k]).collect();
        }
        if let Some(batch) = self.batch.as_mut() {
            let ids: Vec<u32> =
                self.rows.iter().map(|&r| *seqs[r].tokens.last().unwrap_or(&run.pad_id)).collect();
            self.logits = batch.step(run.model, &ids)?;
        }
        if waiting {
            self.admit(run, prompts, seqs)?;
        }
        Ok(())
    }

    /// Counts the samples that finished this step and returns the prompts whose samples have
    /// now all ended; tells the progress hook, if any, when there are such prompts.
    fn count_finished(&mut self, run: &Run<'_>, seqs: &[Sequence]) -> Vec<usize> {
        let mut ended = Vec::new();
        for &r in &self.rows {
            if seqs[r].finish.is_none() || self.counted[r] {
                continue;
            }
            self.counted[r] = true;
            let prompt = seqs[r].prompt_index;
            self.finished[prompt] += 1;
            if self.finished[prompt] == self.g {
                ended.push(prompt);
            }
        }
        self.done += ended.len();
        if let (Some(progress), false) = (run.progress, ended.is_empty()) {
            progress(self.done);
        }
        ended
    }

    /// The queue now holds `prompts` prompts in all (a stream added some).
    fn grow(&mut self, prompts: usize) {
        self.prompts = prompts;
        self.finished.resize(prompts, 0);
    }
}

#[cfg(test)]
mod conversion_tests {
    use super::*;

    #[test]
    fn a_sampling_run_s_settings_keep_their_stops_and_leave_n_and_seed_to_the_run() {
        let settings = SamplingSettings {
            temperature: 0.7,
            top_p: 0.95,
            max_tokens: 64,
            stop: vec!["###".into()],
            response_format: None,
        };
        let params = SamplingParams { n: 4, seed: 11, ..(&settings).into() };
        assert_eq!((params.n, params.seed, params.max_new_tokens), (4, 11, 64));
        assert_eq!((params.temperature, params.top_p), (0.7, 0.95));
        assert_eq!(params.stop_strings, vec!["###".to_string()]);
        assert_eq!(params.top_k, 0);
    }

    #[test]
    fn greedy_is_one_completion_at_temperature_zero() {
        let greedy = SamplingParams::greedy(5);
        assert_eq!((greedy.n, greedy.temperature, greedy.max_new_tokens), (1, 0.0, 5));
        assert_eq!(greedy.rollout_dtype, RolloutDtype::F32);
    }
}
