//! The multi-turn rollout engine: B prompts × G episodes decoded together over one KV cache.
//!
//! Each episode samples until its turn closes a tool call (`</tool_call>`), answers (EOS or a
//! stop string), or runs out of budget. At every decode step, the tool calls that closed in that
//! step run concurrently (one thread each) while the batch waits; each result, wrapped in the
//! template's tool turn, is then fed into the episode's cache rows one token per step, in the
//! same forwards in which the other episodes keep sampling — the history is never prefilled
//! again. Fed tokens are not the model's: their mask is 0 and they carry no log-probability.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use verity_core::environment::Environment;

use super::format::{ToolFormat, CALL_CLOSE};
use super::tools::{EpisodeTools, ToolCallRecord, ToolHost};
use crate::error::{Result, WorkerError};
use crate::model::compact::{CompactWeights, RolloutDtype};
use crate::model::decode::DecodeBatch;
use crate::model::Transformer;
use crate::sampler::{pick_token, sequence_rng, Completion, FinishReason, SamplingParams};
use crate::tokenizer::ChatTokenizer;

/// Why an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodeEnd {
    /// The model answered without a tool call (EOS).
    Answer,
    /// A stop string appeared.
    Stop,
    /// The model called a tool in its last allowed turn.
    TurnLimit,
    /// A turn reached `max_completion_tokens`, or the trajectory `max_episode_tokens`.
    TokenBudget,
    /// A tool hung, flooded its output, or an episode tool limit was reached.
    ToolLimit,
}

impl EpisodeEnd {
    /// Whether the episode was cut off rather than answered (counted as truncated).
    pub fn truncated(self) -> bool {
        !matches!(self, EpisodeEnd::Answer | EpisodeEnd::Stop)
    }

    /// The completion's finish reason: `length` when truncated.
    pub fn finish_reason(self) -> FinishReason {
        match self {
            EpisodeEnd::Answer => FinishReason::Eos,
            EpisodeEnd::Stop => FinishReason::Stop,
            _ => FinishReason::Length,
        }
    }
}

/// One assistant turn: its model tokens `start..end` in the trajectory, and the tool call it
/// ended with (an index into [`Episode::tool_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// First token of the turn.
    pub start: usize,
    /// One past its last model token.
    pub end: usize,
    /// The call the turn ended with, if any.
    pub call: Option<usize>,
}

/// One sampled episode: the trajectory after the prompt, with the mask of the model's tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// Index of its prompt.
    pub prompt_index: usize,
    /// Index among the prompt's episodes.
    pub sample_index: usize,
    /// Every token after the prompt: the model's and the fed tool turns.
    pub token_ids: Vec<u32>,
    /// Sampling log-probability of each token (0 for fed tokens).
    pub logprobs: Vec<f32>,
    /// Whether each token was sampled by the model (only those are trained on).
    pub model_mask: Vec<bool>,
    /// The assistant turns.
    pub turns: Vec<Turn>,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCallRecord>,
    /// Why it ended.
    pub end: EpisodeEnd,
    /// Why a tool ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_limit: Option<String>,
}

impl Episode {
    /// The trajectory as a completion (every token; masks come from [`Episode::model_mask`]).
    pub fn completion(&self) -> Completion {
        Completion {
            prompt_index: self.prompt_index,
            sample_index: self.sample_index,
            token_ids: self.token_ids.clone(),
            logprobs: self.logprobs.clone(),
            finish_reason: self.end.finish_reason(),
        }
    }
}

/// What the engine needs besides the prompts.
pub struct EpisodeRunner<'a> {
    /// The policy.
    pub model: &'a Transformer,
    /// Its tokenizer.
    pub tokenizer: &'a ChatTokenizer,
    /// The environment (tools, limits, end conditions).
    pub environment: &'a Environment,
    /// Where the tools run (the sandbox, the HTTP allow-list).
    pub host: ToolHost<'a>,
}

struct Live<'a> {
    episode: Episode,
    rng: rand::rngs::StdRng,
    tools: EpisodeTools<'a>,
    /// Trajectory tokens already in the cache.
    fed: usize,
    /// First token of the current assistant turn.
    turn_start: usize,
    /// The current turn closed a tool call this step.
    calling: bool,
    done: bool,
}

impl Live<'_> {
    fn push(&mut self, token: u32, logprob: f32, model: bool) {
        self.episode.token_ids.push(token);
        self.episode.logprobs.push(logprob);
        self.episode.model_mask.push(model);
    }

    fn end_turn(&mut self, call: Option<usize>) {
        let end = self.episode.token_ids.len();
        self.episode.turns.push(Turn { start: self.turn_start, end, call });
    }

    fn finish(&mut self, end: EpisodeEnd) {
        self.episode.end = end;
        self.done = true;
    }
}

impl EpisodeRunner<'_> {
    /// Samples `params.n` episodes for each prompt (prompt-major order). `params.max_new_tokens`
    /// bounds each assistant turn.
    pub fn run(&self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Episode>> {
        crate::kernels::on_pool(|| self.run_on_pool(prompts, params))
    }

    fn run_on_pool(&self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Episode>> {
        if params.n == 0 || params.max_new_tokens == 0 {
            return Err(WorkerError::InvalidArgument(
                "n and max_new_tokens must be at least 1".into(),
            ));
        }
        let tokenizer = self.tokenizer;
        let format = ToolFormat::of(tokenizer);
        let budget = self.environment.max_episode_tokens(params.max_new_tokens);
        let eos = &tokenizer.eos_token_ids;
        let pad = tokenizer.pad_id();
        let compact = if params.rollout_dtype == RolloutDtype::Bf16 && self.model.device().is_cpu()
        {
            Some(Arc::new(CompactWeights::of(self.model)?))
        } else {
            None
        };
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let (mut batch, prompt_logits) =
            DecodeBatch::prefill(self.model, &refs, pad, budget, compact)?;
        let g = params.n;
        let mut live: Vec<Live> = (0..prompts.len() * g)
            .map(|r| Live {
                episode: Episode {
                    prompt_index: r / g,
                    sample_index: r % g,
                    token_ids: Vec::new(),
                    logprobs: Vec::new(),
                    model_mask: Vec::new(),
                    turns: Vec::new(),
                    tool_calls: Vec::new(),
                    end: EpisodeEnd::TokenBudget,
                    tool_limit: None,
                },
                rng: sequence_rng(params.seed, r / g, r % g),
                tools: EpisodeTools::new(self.environment, self.host),
                fed: 0,
                turn_start: 0,
                calling: false,
                done: false,
            })
            .collect();
        let expand: Vec<usize> = (0..live.len()).map(|r| r / g).collect();
        batch.select_rows(&expand)?;
        let mut rows: Vec<usize> = (0..live.len()).collect();
        let mut logits: Vec<Vec<f32>> = expand.iter().map(|&p| prompt_logits[p].clone()).collect();
        let stop_len =
            params.stop_strings.iter().map(String::len).max().unwrap_or(0).max(CALL_CLOSE.len());
        loop {
            // 1. Sample for every episode whose last fed token was its newest one.
            let mut row_live = rows_of(&mut live, &rows);
            row_live.par_iter_mut().zip(logits.par_iter()).try_for_each(
                |(seq, row_logits)| -> Result<()> {
                    if seq.done || seq.fed < seq.episode.token_ids.len() {
                        return Ok(());
                    }
                    let (token, logprob) = pick_token(row_logits, params, &mut seq.rng);
                    seq.push(token, logprob, true);
                    let len = seq.episode.token_ids.len();
                    if eos.contains(&token) {
                        // a Llama-style call ends its turn as an answer does (decoded only then)
                        let turn = &seq.episode.token_ids[seq.turn_start..];
                        if format.calls_by_whole_turns()
                            && format.calls_at_end_of_turn(&tokenizer.decode(turn, false)?)
                        {
                            seq.calling = true;
                            return Ok(());
                        }
                        seq.end_turn(None);
                        seq.finish(EpisodeEnd::Answer);
                        return Ok(());
                    }
                    let tail = &seq.episode.token_ids
                        [seq.turn_start.max(len.saturating_sub(stop_len + 8))..];
                    let text = tokenizer.decode(tail, false)?;
                    if text.contains(CALL_CLOSE) {
                        seq.calling = true;
                    } else if params.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                        seq.end_turn(None);
                        seq.finish(EpisodeEnd::Stop);
                    } else if len - seq.turn_start >= params.max_new_tokens || len >= budget {
                        seq.end_turn(None);
                        seq.finish(EpisodeEnd::TokenBudget);
                    }
                    Ok(())
                },
            )?;
            drop(row_live);
            // 2. Run the tool calls that closed in this step, concurrently.
            self.run_calls(&mut live, format, budget)?;
            // 3. Drop finished episodes from the batch now and then; feed the rest one token.
            let still: Vec<usize> = (0..rows.len()).filter(|&k| !live[rows[k]].done).collect();
            if still.is_empty() {
                break;
            }
            let dead = rows.len() - still.len();
            if dead > 0 && dead * 8 >= rows.len() {
                batch.select_rows(&still)?;
                rows = still.iter().map(|&k| rows[k]).collect();
            }
            let ids: Vec<u32> = rows
                .iter()
                .map(|&r| {
                    let seq = &mut live[r];
                    if seq.done {
                        return pad;
                    }
                    let id = seq.episode.token_ids[seq.fed];
                    seq.fed += 1;
                    id
                })
                .collect();
            logits = batch.step(self.model, &ids)?;
        }
        Ok(live.into_iter().map(|l| l.episode).collect())
    }

    /// Runs every pending call (one thread each) and queues its tool turn to be fed.
    fn run_calls(&self, live: &mut [Live], format: ToolFormat, budget: usize) -> Result<()> {
        let max_turns = self.environment.max_turns;
        let pending: Vec<&mut Live> = live.iter_mut().filter(|l| l.calling && !l.done).collect();
        if pending.is_empty() {
            return Ok(());
        }
        let tokenizer = self.tokenizer;
        std::thread::scope(|scope| -> Result<()> {
            let handles: Vec<_> = pending
                .into_iter()
                .map(|seq| {
                    scope.spawn(move || -> Result<()> {
                        seq.calling = false;
                        let ids = &seq.episode.token_ids[seq.turn_start..];
                        let turn = tokenizer.decode(ids, false)?;
                        if seq.episode.turns.len() + 1 >= max_turns {
                            seq.end_turn(None);
                            seq.finish(EpisodeEnd::TurnLimit);
                            return Ok(());
                        }
                        let outcome = seq.tools.call(&turn);
                        let call = seq.episode.tool_calls.len();
                        let output = outcome.record.output.clone();
                        seq.episode.tool_calls.push(outcome.record);
                        seq.end_turn(Some(call));
                        if let Some(why) = outcome.fatal {
                            seq.episode.tool_limit = Some(why);
                            seq.finish(EpisodeEnd::ToolLimit);
                            return Ok(());
                        }
                        let fed = tokenizer.encode(&format.tool_turn(&output))?;
                        if seq.episode.token_ids.len() + fed.len() >= budget {
                            seq.finish(EpisodeEnd::TokenBudget);
                            return Ok(());
                        }
                        for id in fed {
                            seq.push(id, 0.0, false);
                        }
                        seq.turn_start = seq.episode.token_ids.len();
                        Ok(())
                    })
                })
                .collect();
            for handle in handles {
                handle
                    .join()
                    .map_err(|_| WorkerError::InvalidArgument("a tool thread panicked".into()))??;
            }
            Ok(())
        })
    }
}

/// The live episodes held in batch rows `rows`, in row order.
fn rows_of<'l, 'a>(live: &'l mut [Live<'a>], rows: &[usize]) -> Vec<&'l mut Live<'a>> {
    let mut by_index: Vec<Option<&mut Live<'a>>> = live.iter_mut().map(Some).collect();
    rows.iter().filter_map(|&r| by_index[r].take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::trainer::testing::tiny_tool_tokenizer;
    use serde_json::json;

    fn argmax(row: &[f32]) -> u32 {
        row.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
            as u32
    }

    /// Appending fed (tool) tokens to a decoding row, one per step beside another row that
    /// keeps sampling, leaves its cache as a full prefill of the whole history would: the next
    /// logits agree.
    #[test]
    fn a_resumed_cache_after_tool_tokens_gives_the_logits_of_a_full_prefill() {
        let model = crate::testing::tiny_model(Family::Llama, 9).unwrap();
        let (prompt, other) = ([5u32, 9, 12, 40], [33u32, 3, 17, 8, 21, 6]);
        let tool_tokens = [50u32, 51, 52, 53, 54, 55, 56];
        let (mut batch, logits) =
            DecodeBatch::prefill(&model, &[&prompt, &other], 0, 4, None).unwrap();
        let mut history = prompt.to_vec();
        let mut rows = logits;
        // three sampled tokens, then the tool tokens fed while the other row samples
        for step in 0..3 + tool_tokens.len() {
            let first = if step < 3 { argmax(&rows[0]) } else { tool_tokens[step - 3] };
            history.push(first);
            rows = batch.step(&model, &[first, argmax(&rows[1])]).unwrap();
        }
        let (_, fresh) = DecodeBatch::prefill(&model, &[&history], 0, 1, None).unwrap();
        let gap = rows[0].iter().zip(&fresh[0]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(gap < 1e-4, "resumed and re-prefilled logits differ by {gap}");
    }

    /// Episodes of a tiny model with tool-call tokens: calls are run (malformed here: the tiny
    /// vocabulary has no JSON), their results fed with mask 0, and the recorded log-probs of the
    /// model's tokens after a tool turn are what the trainer recomputes from the whole history.
    #[test]
    fn episodes_feed_tool_results_and_keep_the_logprobs_of_a_full_forward() {
        // (a seed whose random model emits `</tool_call>` now and then)
        let model = crate::testing::tiny_model(Family::Llama, 1).unwrap();
        let tokenizer = tiny_tool_tokenizer().unwrap();
        let environment: Environment =
            serde_json::from_value(json!({"max_turns": 3, "tools": [{"type": "calculator"}]}))
                .unwrap();
        let sandbox = verity_verifiers::SandboxConfig::not_needed();
        let allow = verity_core::environment::HttpAllowList::default();
        let runner = EpisodeRunner {
            model: &model,
            tokenizer: &tokenizer,
            environment: &environment,
            host: ToolHost { sandbox: &sandbox, http_allow: &allow },
        };
        let params =
            SamplingParams { n: 16, max_new_tokens: 24, seed: 3, ..SamplingParams::default() };
        let prompts = vec![vec![1u32, 10, 11], vec![1u32, 20]];
        let episodes = runner.run(&prompts, &params).unwrap();
        assert_eq!(episodes.len(), 32);
        let format = ToolFormat::of(&tokenizer);
        let mut calls = 0;
        for e in &episodes {
            assert_eq!(e.token_ids.len(), e.logprobs.len());
            assert_eq!(e.token_ids.len(), e.model_mask.len());
            assert!(e.turns.len() <= 3 && !e.turns.is_empty());
            assert!(e.token_ids.len() <= environment.max_episode_tokens(24));
            for (k, turn) in e.turns.iter().enumerate() {
                assert!(
                    e.model_mask[turn.start..turn.end].iter().all(|&m| m),
                    "turns are the model's"
                );
                if let (Some(call), Some(next)) = (turn.call, e.turns.get(k + 1)) {
                    calls += 1;
                    let record = &e.tool_calls[call];
                    assert!(record.error, "the tiny vocabulary makes no valid call: {record:?}");
                    let fed = tokenizer.encode(&format.tool_turn(&record.output)).unwrap();
                    assert_eq!(&e.token_ids[turn.end..next.start], fed.as_slice());
                    assert!(
                        e.model_mask[turn.end..next.start].iter().all(|&m| !m),
                        "fed tokens are masked"
                    );
                }
            }
            let scored = model
                .completion_logprobs(
                    std::slice::from_ref(&prompts[e.prompt_index]),
                    std::slice::from_ref(&e.token_ids),
                    1.0,
                    0,
                    false,
                )
                .unwrap();
            let trainer: Vec<f32> = scored.logprobs.to_vec2().unwrap().remove(0);
            for (t, &sampled) in e.model_mask.iter().enumerate() {
                if sampled {
                    assert!(
                        (trainer[t] - e.logprobs[t]).abs() < 1e-3,
                        "token {t}: {} vs {}",
                        trainer[t],
                        e.logprobs[t]
                    );
                }
            }
        }
        let ends: Vec<_> =
            episodes.iter().map(|e| (e.end, e.tool_calls.len(), e.token_ids.len())).collect();
        assert!(calls > 0, "some episode called a tool and went on: {ends:?}");
        let metrics = crate::episodes::EpisodeMetrics::of(&episodes).unwrap();
        assert!(metrics.tool_calls_per_episode > 0.0 && metrics.tool_errors_per_episode > 0.0);
    }
}
