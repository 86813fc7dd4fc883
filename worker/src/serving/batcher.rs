//! The continuous batch of one loaded model: a thread that decodes every admitted sequence one
//! token per step over a shared KV cache ([`DecodeBatch`], the rollout sampler's step loop).
//! New requests are prefilled and join between steps; finished or abandoned sequences (their
//! client went away) leave, freeing their rows.

use super::request::{GenerationEvent, GenerationParams, StopReason, TokenLogprob, TopLogprob};
use super::text::StopTextTracker;
use crate::error::Result;
use crate::kernels::on_pool;
use crate::model::decode::DecodeBatch;
use crate::model::Transformer;
use crate::sampler::{pick_token, sequence_rng, SamplingParams};
use crate::tokenizer::ChatTokenizer;
use rand::rngs::StdRng;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

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

struct Row {
    request: usize,
    choice: usize,
    rng: StdRng,
    tokens: Vec<u32>,
    text: StopTextTracker,
    done: bool,
}

/// The decode loop of one model; returns when `admissions` is closed and nothing is left.
pub(crate) fn run_batcher(
    model: Arc<Transformer>,
    tokenizer: Arc<ChatTokenizer>,
    max_batch: usize,
    counters: Arc<[Arc<BatchCounters>; 2]>,
    admissions: Receiver<Admission>,
) {
    let mut state = Batcher {
        model,
        tokenizer,
        max_batch: max_batch.max(1),
        counters,
        batch: None,
        rows: Vec::new(),
        logits: Vec::new(),
        requests: Vec::new(),
        waiting: VecDeque::new(),
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

struct Batcher {
    model: Arc<Transformer>,
    tokenizer: Arc<ChatTokenizer>,
    max_batch: usize,
    /// The model's counters and the engine's.
    counters: Arc<[Arc<BatchCounters>; 2]>,
    batch: Option<DecodeBatch>,
    rows: Vec<Row>,
    logits: Vec<Vec<f32>>,
    requests: Vec<Option<Live>>,
    waiting: VecDeque<Admission>,
}

impl Batcher {
    fn count(&self, f: impl Fn(&BatchCounters)) {
        for c in self.counters.iter() {
            f(c);
        }
    }

    /// Prefills waiting requests while the batch has room (one request always fits).
    fn admit(&mut self) {
        while let Some(next) = self.waiting.front() {
            let n = next.params.n.max(1);
            if !self.rows.is_empty() && self.rows.len() + n > self.max_batch {
                return;
            }
            let Some(a) = self.waiting.pop_front() else { return };
            if a.events.is_closed() {
                self.count(|c| {
                    c.requests.fetch_sub(1, Ordering::SeqCst);
                });
                continue;
            }
            let pad = self.tokenizer.pad_id();
            let model = &self.model;
            let prefilled = on_pool(|| -> Result<(DecodeBatch, Vec<Vec<f32>>)> {
                let (mut b, logits) =
                    DecodeBatch::prefill(model, &[&a.prompt], pad, a.max_tokens, None)?;
                b.select_rows(&vec![0; n])?;
                Ok((b, logits))
            });
            let (b, logits) = match prefilled {
                Ok(p) => p,
                Err(e) => {
                    let _ = a.events.send(GenerationEvent::Failed { message: e.to_string() });
                    self.count(|c| {
                        c.requests.fetch_sub(1, Ordering::SeqCst);
                    });
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
                let _ = a.events.send(GenerationEvent::Failed { message: e.to_string() });
                self.count(|c| {
                    c.requests.fetch_sub(1, Ordering::SeqCst);
                });
                continue;
            }
            let index = self.requests.len();
            for choice in 0..n {
                self.rows.push(Row {
                    request: index,
                    choice,
                    rng: sequence_rng(a.params.seed, 0, choice),
                    tokens: Vec::new(),
                    text: StopTextTracker::default(),
                    done: false,
                });
                self.logits.push(logits[0].clone());
            }
            self.count(|c| {
                c.rows.fetch_add(n, Ordering::SeqCst);
            });
            let sampling = SamplingParams {
                n,
                temperature: a.params.temperature,
                top_p: a.params.top_p,
                top_k: 0,
                max_new_tokens: a.max_tokens,
                stop_strings: vec![],
                seed: a.params.seed,
                rollout_dtype: Default::default(),
            };
            self.requests.push(Some(Live {
                params: a.params,
                sampling,
                max_tokens: a.max_tokens,
                events: a.events,
                remaining: n,
            }));
        }
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
        let picks: Vec<Option<(u32, Option<TokenLogprob>)>> = {
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
                    let (token, _) = pick_token(logits, &live.sampling, &mut row.rng);
                    let lp =
                        live.params.logprobs.map(|k| token_logprob(tokenizer, logits, token, k));
                    Some((token, lp))
                })
                .collect()
        };
        for (k, pick) in picks.into_iter().enumerate() {
            let Some((token, logprob)) = pick else { continue };
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
            self.logits = on_pool(|| batch.step(model, &tokens))?;
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
        let eos = self.tokenizer.eos_token_ids.contains(&token);
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
        token: text(token),
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |z| z - log_total),
        top: best
            .into_iter()
            .map(|id| TopLogprob { token: text(id), logprob: logits[id as usize] - log_total })
            .collect(),
    }
}
