//! The continuous batch of one loaded model: a thread that decodes every admitted sequence one
//! token per step over a shared KV cache ([`DecodeBatch`], the rollout sampler's step loop).
//! New requests are prefilled and join between steps — the requests that arrived together in
//! one forward — and finished or abandoned sequences (their client went away) leave, freeing
//! their rows.

use super::request::{GenerationEvent, GenerationParams, StopReason, TokenLogprob, TopLogprob};
use super::text::StopTextTracker;
use crate::constrained::{GrammarCompiler, OutputConstraint, SequenceConstraint};
use crate::error::Result;
use crate::model::compact::CompactWeights;
use crate::model::decode::DecodeBatch;
use crate::model::Transformer;
use crate::sampler::{pick_constrained, pick_token, sequence_rng, SamplingParams};
use crate::tokenizer::ChatTokenizer;
use rand::rngs::StdRng;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use verity_kernels::on_pool_for_decoding;

/// A request handed to a model's batch.
pub(crate) struct Admission {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How to sample.
    pub params: GenerationParams,
    /// Completion budget (already checked against the context).
    pub max_tokens: usize,
    /// Where its events go; once the receiver is dropped the request is abandoned.
    pub events: UnboundedSender<GenerationEvent>,
}

/// How much larger than its real tokens a group prefilled together may be once left-padded to
/// its longest prompt (2: at most half the prefill's positions are padding).
const PREFILL_PADDING_LIMIT: usize = 2;

/// Counters a batch shares with the engine.
#[derive(Debug, Default)]
pub struct BatchCounters {
    /// Requests admitted and not yet finished or abandoned.
    pub requests: AtomicUsize,
    /// Sequences (rows) being decoded.
    pub rows: AtomicUsize,
}

struct Live {
    params: GenerationParams,
    sampling: SamplingParams,
    max_tokens: usize,
    events: UnboundedSender<GenerationEvent>,
    remaining: usize,
}

/// A row's pick of one decode step: its token with the log-probabilities asked for (`None` for a
/// finished row; an error when its grammar fails).
type RowPick = Option<Result<(u32, Option<TokenLogprob>)>>;

struct Row {
    request: usize,
    choice: usize,
    rng: StdRng,
    /// Where the choice stands in the request's output grammar, if it has one.
    constraint: Option<SequenceConstraint>,
    tokens: Vec<u32>,
    text: StopTextTracker,
    done: bool,
}

/// The decode loop of one model; returns when `admissions` is closed and nothing is left.
pub(crate) fn run_batcher(
    (model, compact): (Arc<Transformer>, Option<Arc<CompactWeights>>),
    tokenizer: Arc<ChatTokenizer>,
    max_batch: usize,
    counters: Arc<[Arc<BatchCounters>; 2]>,
    admissions: Receiver<Admission>,
) {
    let mut state = Batcher {
        model,
        compact,
        tokenizer,
        max_batch: max_batch.max(1),
        counters,
        batch: None,
        rows: Vec::new(),
        logits: Vec::new(),
        requests: Vec::new(),
        waiting: VecDeque::new(),
        grammars: None,
    };
    loop {
        if state.rows.is_empty() && state.waiting.is_empty() {
            match admissions.recv() {
                Ok(a) => state.waiting.push_back(a),
                Err(_) => return,
            }
        }
        while let Ok(a) = admissions.try_recv() {
            state.waiting.push_back(a);
        }
        state.admit();
        if let Err(e) = state.step() {
            state.fail_all(&e.to_string());
        }
    }
}

/// Takes from `waiting`, in arrival order, the requests that fit a batch of `rows` rows (one
/// request always fits an empty batch), stopping where a prompt would make the group's left
/// padding exceed its real tokens ([`PREFILL_PADDING_LIMIT`]); abandoned requests (their
/// client went away) are dropped and counted. The group, and how many were dropped.
fn take_admissible(
    waiting: &mut VecDeque<Admission>,
    mut rows: usize,
    max_batch: usize,
) -> (Vec<Admission>, usize) {
    let mut taken: Vec<Admission> = Vec::new();
    let (mut abandoned, mut tokens, mut longest) = (0, 0usize, 0usize);
    while let Some(next) = waiting.front() {
        let n = next.params.n.max(1);
        if (rows > 0 || !taken.is_empty()) && rows + n > max_batch {
            break;
        }
        let len = next.prompt.len();
        let padded = (taken.len() + 1) * longest.max(len);
        if !taken.is_empty() && padded > PREFILL_PADDING_LIMIT * (tokens + len) {
            break;
        }
        let Some(a) = waiting.pop_front() else { break };
        if a.events.is_closed() {
            abandoned += 1;
            continue;
        }
        rows += n;
        tokens += len;
        longest = longest.max(len);
        taken.push(a);
    }
    (taken, abandoned)
}

struct Batcher {
    model: Arc<Transformer>,
    /// The low-precision weight copies decoding reads (`--decode-dtype`), if any.
    compact: Option<Arc<CompactWeights>>,
    tokenizer: Arc<ChatTokenizer>,
    max_batch: usize,
    /// The model's counters and the engine's.
    counters: Arc<[Arc<BatchCounters>; 2]>,
    batch: Option<DecodeBatch>,
    rows: Vec<Row>,
    logits: Vec<Vec<f32>>,
    requests: Vec<Option<Live>>,
    waiting: VecDeque<Admission>,
    /// Compiles requests' `response_format`s; built at the first request that has one.
    grammars: Option<GrammarCompiler>,
}

impl Batcher {
    fn count(&self, f: impl Fn(&BatchCounters)) {
        for c in self.counters.iter() {
            f(c);
        }
    }

    /// The next group of waiting requests to prefill together ([`take_admissible`]).
    fn take_admissible(&mut self) -> Vec<Admission> {
        let (taken, abandoned) =
            take_admissible(&mut self.waiting, self.rows.len(), self.max_batch);
        if abandoned > 0 {
            self.count(|c| {
                c.requests.fetch_sub(abandoned, Ordering::SeqCst);
            });
        }
        taken
    }

    /// The compiled `response_format` of each of `taken`, refusing the requests whose format
    /// does not compile; the requests left, each with its grammar (if any).
    fn with_grammars(
        &mut self,
        taken: Vec<Admission>,
    ) -> Vec<(Admission, Option<OutputConstraint>)> {
        let mut out = Vec::with_capacity(taken.len());
        for a in taken {
            let Some(format) = a.params.response_format.clone() else {
                out.push((a, None));
                continue;
            };
            let compiled = match self.grammars.as_ref() {
                Some(g) => g.compile(&format),
                None => GrammarCompiler::new(&self.tokenizer, self.model.config.vocab_size)
                    .and_then(|g| self.grammars.insert(g).compile(&format)),
            };
            match compiled {
                Ok(constraint) => out.push((a, constraint)),
                Err(e) => {
                    let (param, message) = ("response_format".to_string(), e.to_string());
                    let _ = a.events.send(GenerationEvent::Refused { param, message });
                    self.count(|c| {
                        c.requests.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            }
        }
        out
    }

    /// Ends `requests` (not yet admitted) with a failure.
    fn refuse(&self, requests: Vec<Admission>, message: &str) {
        for a in requests {
            let _ = a.events.send(GenerationEvent::Failed { message: message.to_string() });
            self.count(|c| {
                c.requests.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }

    /// Prefills the waiting requests that fit in one forward (left-padded together, so a burst
    /// of requests gets its first tokens after one prefill, not one prefill each) and adds
    /// their rows to the batch; repeats while requests wait and rows are free.
    fn admit(&mut self) {
        loop {
            let taken = self.take_admissible();
            if taken.is_empty() {
                return;
            }
            let (taken, grammars): (Vec<Admission>, Vec<Option<OutputConstraint>>) =
                self.with_grammars(taken).into_iter().unzip();
            if taken.is_empty() {
                continue;
            }
            let pad = self.tokenizer.pad_id();
            let (model, compact) = (&self.model, &self.compact);
            let prompts: Vec<&[u32]> = taken.iter().map(|a| a.prompt.as_slice()).collect();
            let extra = taken.iter().map(|a| a.max_tokens).max().unwrap_or(0);
            let rows: Vec<usize> = taken
                .iter()
                .enumerate()
                .flat_map(|(i, a)| std::iter::repeat_n(i, a.params.n.max(1)))
                .collect();
            let prefilled = on_pool_for_decoding(model.device(), || -> Result<_> {
                let (mut b, logits) =
                    DecodeBatch::prefill(model, &prompts, pad, extra, compact.clone())?;
                b.select_rows(&rows)?;
                Ok((b, logits))
            });
            let (b, logits) = match prefilled {
                Ok(p) => p,
                Err(e) => {
                    self.refuse(taken, &e.to_string());
                    continue;
                }
            };
            let joined = match self.batch.as_mut() {
                Some(batch) => batch.append(b),
                None => {
                    self.batch = Some(b);
                    Ok(())
                }
            };
            if let Err(e) = joined {
                self.refuse(taken, &e.to_string());
                continue;
            }
            for ((a, logits), grammar) in taken.into_iter().zip(logits).zip(grammars) {
                self.join(a, logits, grammar);
            }
        }
    }

    /// Adds the rows of prefilled request `a` (its `n` choices, all starting from `logits`).
    fn join(&mut self, a: Admission, logits: Vec<f32>, grammar: Option<OutputConstraint>) {
        let n = a.params.n.max(1);
        let index = self.requests.len();
        for choice in 0..n {
            self.rows.push(Row {
                request: index,
                choice,
                rng: sequence_rng(a.params.seed, 0, choice),
                constraint: grammar.as_ref().map(OutputConstraint::start),
                tokens: Vec::new(),
                text: StopTextTracker::default(),
                done: false,
            });
            self.logits.push(logits.clone());
        }
        self.count(|c| {
            c.rows.fetch_add(n, Ordering::SeqCst);
        });
        let sampling = SamplingParams { n, ..a.params.sampling(a.max_tokens) };
        self.requests.push(Some(Live {
            params: a.params,
            sampling,
            max_tokens: a.max_tokens,
            events: a.events,
            remaining: n,
        }));
    }

    /// Picks one token per row, reports it, drops finished rows and runs the next forward.
    fn step(&mut self) -> Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        // Requests whose client went away end now.
        for (i, slot) in self.requests.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|l| l.events.is_closed()) {
                *slot = None;
                for row in self.rows.iter_mut().filter(|r| r.request == i) {
                    row.done = true;
                }
                for c in self.counters.iter() {
                    c.requests.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        let requests = &self.requests;
        let picks: Vec<RowPick> = {
            let tokenizer = &self.tokenizer;
            self.rows
                .par_iter_mut()
                .zip(self.logits.par_iter())
                .map(|(row, logits)| {
                    let live = requests[row.request].as_ref()?;
                    if row.done {
                        return None;
                    }
                    let biased;
                    let logits = if live.params.logit_bias.is_empty() {
                        logits.as_slice()
                    } else {
                        let mut l = logits.clone();
                        for (&id, &b) in &live.params.logit_bias {
                            if let Some(z) = l.get_mut(id as usize) {
                                *z += b;
                            }
                        }
                        biased = l;
                        biased.as_slice()
                    };
                    let token = match row.constraint.as_mut() {
                        None => pick_token(logits, &live.sampling, &mut row.rng).0,
                        Some(constraint) => {
                            match pick_constrained(logits, &live.sampling, &mut row.rng, constraint)
                            {
                                Ok((token, _, _)) => token,
                                Err(e) => return Some(Err(e)),
                            }
                        }
                    };
                    // Reported log-probabilities are the model's own (temperature 1, no mask).
                    let lp =
                        live.params.logprobs.map(|k| token_logprob(tokenizer, logits, token, k));
                    Some(Ok((token, lp)))
                })
                .collect()
        };
        for (k, pick) in picks.into_iter().enumerate() {
            let Some(pick) = pick else { continue };
            let (token, logprob) = pick?;
            self.advance_row(k, token, logprob)?;
        }
        let live: Vec<usize> = (0..self.rows.len()).filter(|&k| !self.rows[k].done).collect();
        if live.len() < self.rows.len() {
            self.count(|c| {
                c.rows.fetch_sub(self.rows.len() - live.len(), Ordering::SeqCst);
            });
            if live.is_empty() {
                self.batch = None;
                self.rows.clear();
                self.logits.clear();
                self.requests.clear();
                return Ok(());
            }
            if let Some(batch) = self.batch.as_mut() {
                batch.select_rows(&live)?;
                batch.trim()?;
            }
            let mut keep = live.iter().peekable();
            let mut k = 0;
            self.rows.retain(|_| {
                let kept = keep.peek() == Some(&&k);
                if kept {
                    keep.next();
                }
                k += 1;
                kept
            });
        }
        let tokens: Vec<u32> = self.rows.iter().map(|r| *r.tokens.last().unwrap_or(&0)).collect();
        let (model, batch) = (&self.model, self.batch.as_mut());
        if let Some(batch) = batch {
            self.logits = on_pool_for_decoding(model.device(), || batch.step(model, &tokens))?;
        }
        Ok(())
    }

    /// Records row `k`'s new token: its text delta, and the end of the choice when it is one.
    fn advance_row(&mut self, k: usize, token: u32, logprob: Option<TokenLogprob>) -> Result<()> {
        let row = &mut self.rows[k];
        let Some(live) = self.requests[row.request].as_mut() else {
            row.done = true;
            return Ok(());
        };
        row.tokens.push(token);
        let eos = self.tokenizer.eos_token_ids.contains(&token)
            || live.params.stop_token_ids.contains(&token);
        let length = row.tokens.len() >= live.max_tokens;
        let shown = if eos { &row.tokens[..row.tokens.len() - 1] } else { &row.tokens[..] };
        let text = self.tokenizer.decode(shown, true)?;
        let update = row.text.update(&text, &live.params.stop, eos || length);
        let reason = if update.stopped || eos {
            Some(StopReason::Stop)
        } else if length {
            Some(StopReason::Length)
        } else {
            None
        };
        let logprobs: Vec<TokenLogprob> = logprob.into_iter().collect();
        if !update.delta.is_empty() || !logprobs.is_empty() {
            let _ = live.events.send(GenerationEvent::Delta {
                index: row.choice,
                text: update.delta,
                logprobs,
            });
        }
        if let Some(reason) = reason {
            row.done = true;
            let _ = live.events.send(GenerationEvent::Finished {
                index: row.choice,
                reason,
                completion_tokens: row.tokens.len(),
            });
            live.remaining -= 1;
            if live.remaining == 0 {
                self.requests[row.request] = None;
                for c in self.counters.iter() {
                    c.requests.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        Ok(())
    }

    /// Ends every request with a failure (the batch's forward broke) and empties the batch.
    fn fail_all(&mut self, message: &str) {
        tracing::error!(error = message, "inference batch failed");
        for live in self.requests.drain(..).flatten() {
            let _ = live.events.send(GenerationEvent::Failed { message: message.to_string() });
            for c in self.counters.iter() {
                c.requests.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.count(|c| {
            c.rows.fetch_sub(self.rows.len(), Ordering::SeqCst);
        });
        self.rows.clear();
        self.logits.clear();
        self.batch = None;
    }
}

/// The log-probability (temperature 1) of `token` and of the `top` most likely tokens.
fn token_logprob(
    tokenizer: &ChatTokenizer,
    logits: &[f32],
    token: u32,
    top: usize,
) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_total = logits.iter().map(|&z| (z - max).exp()).sum::<f32>().ln() + max;
    let text = |id: u32| tokenizer.decode(&[id], false).unwrap_or_default();
    let mut best: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(best.len());
    if top > 0 && top < best.len() {
        best.select_nth_unstable_by(top - 1, |a, b| {
            logits[*b as usize].total_cmp(&logits[*a as usize])
        });
    }
    best.truncate(top);
    best.sort_unstable_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
    TokenLogprob {
        id: token,
        token: text(token),
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |z| z - log_total),
        top: best
            .into_iter()
            .map(|id| TopLogprob { token: text(id), logprob: logits[id as usize] - log_total })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Receiver = tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>;

    fn waiting(prompts: &[(usize, usize)]) -> (VecDeque<Admission>, Vec<Receiver>) {
        let mut queue = VecDeque::new();
        let mut receivers = Vec::new();
        for &(len, n) in prompts {
            let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
            let params = GenerationParams { n, temperature: 0.0, ..GenerationParams::default() };
            queue.push_back(Admission { prompt: vec![7; len], params, max_tokens: 4, events });
            receivers.push(receiver);
        }
        (queue, receivers)
    }

    fn lengths(taken: &[Admission]) -> Vec<usize> {
        taken.iter().map(|a| a.prompt.len()).collect()
    }

    #[test]
    fn a_burst_is_prefilled_together_while_it_fits_the_batch() {
        let (mut queue, _rx) = waiting(&[(5, 1), (6, 2), (4, 1), (5, 1)]);
        let (taken, dropped) = take_admissible(&mut queue, 0, 4);
        assert_eq!((lengths(&taken), dropped), (vec![5, 6, 4], 0));
        assert_eq!(queue.len(), 1, "the fourth request's row does not fit");
        // a running batch leaves fewer rows; a request larger than an empty batch still fits
        let (mut queue, _rx) = waiting(&[(5, 1), (5, 1)]);
        assert_eq!(lengths(&take_admissible(&mut queue, 3, 4).0), vec![5]);
        let (mut queue, _rx) = waiting(&[(5, 8)]);
        assert_eq!(lengths(&take_admissible(&mut queue, 0, 4).0), vec![5]);
        let (mut queue, _rx) = waiting(&[(5, 1)]);
        assert!(take_admissible(&mut queue, 4, 4).0.is_empty());
    }

    #[test]
    fn a_prompt_that_would_make_the_group_mostly_padding_waits_for_the_next_one() {
        let (mut queue, _rx) = waiting(&[(4, 1), (4, 1), (40, 1), (40, 1)]);
        assert_eq!(lengths(&take_admissible(&mut queue, 0, 8).0), vec![4, 4]);
        assert_eq!(lengths(&take_admissible(&mut queue, 0, 8).0), vec![40, 40]);
    }

    #[test]
    fn abandoned_requests_are_dropped_and_counted() {
        let (mut queue, mut rx) = waiting(&[(4, 1), (4, 1), (4, 1)]);
        drop(rx.remove(1));
        let (taken, dropped) = take_admissible(&mut queue, 0, 8);
        assert_eq!((taken.len(), dropped), (2, 1));
    }
}
