//! The multi-turn rollout engine: B prompts × G episodes decoded together over one KV cache.
//!
//! Each episode samples until its turn closes a tool call (`</tool_call>`), answers (EOS or a
//! stop string), or runs out of budget. An episode whose turn closed a call pauses in the batch
//! ([`DecodeBatch::pause`]: it keeps its row, and the positions written while it waits are
//! hidden from it), and its calls run on a thread of their own while the other episodes keep
//! decoding; when they return, the episode resumes and the results, wrapped in the template's
//! tool turn, are fed into its cache rows one token per step, in the same forwards in which the
//! other episodes keep sampling — the history is never prefilled again. Fed tokens are not the
//! model's: their mask is 0 and they carry no log-probability.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::mpsc;
use std::thread::ScopedJoinHandle;
use verity_core::environment::Environment;

use super::format::{parse_tool_calls, ToolCall, ToolFormat, ToolResult, CALL_CLOSE};
use super::tools::{EpisodeTools, ToolCallRecord, ToolHost};
use crate::error::{Result, WorkerError};
use crate::model::compact::CompactWeights;
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

/// One assistant turn: its model tokens `start..end` in the trajectory, and the tool calls it
/// ended with (indices `first_call..first_call + call_count` of [`Episode::tool_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// First token of the turn.
    pub start: usize,
    /// One past its last model token.
    pub end: usize,
    /// Index of its first call.
    pub first_call: usize,
    /// How many calls it made (0: it answered or was cut off).
    pub call_count: usize,
}

impl Turn {
    /// Indices of its calls in [`Episode::tool_calls`].
    pub fn calls(&self) -> std::ops::Range<usize> {
        self.first_call..self.first_call + self.call_count
    }
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
            token_masks: Vec::new(),
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

    fn end_turn(&mut self, calls: std::ops::Range<usize>) {
        let end = self.episode.token_ids.len();
        let (first_call, call_count) = (calls.start, calls.len());
        self.episode.turns.push(Turn { start: self.turn_start, end, first_call, call_count });
    }

    /// Ends the current turn without a call.
    fn end_answer(&mut self) {
        let next = self.episode.tool_calls.len();
        self.end_turn(next..next);
    }

    fn finish(&mut self, end: EpisodeEnd) {
        self.episode.end = end;
        self.done = true;
    }
}

impl EpisodeRunner<'_> {
    /// Samples `params.n` episodes for each prompt (prompt-major order). `params.max_new_tokens`
    /// bounds each assistant turn. With `params.max_batch_rows`, at most that many episodes
    /// hold a batch row at once (an episode in a tool call keeps its row): the other prompts
    /// wait, and as soon as finished episodes leave room for a prompt's G episodes it is
    /// prefilled and joins the running rows (continuous batching, as the plain sampler's), so
    /// memory stays bounded however many prompts come (an evaluation's) and the long tail of
    /// one group overlaps the next groups' decoding. Each episode draws the random stream it
    /// would draw in one batch.
    pub fn run(&self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Episode>> {
        if params.n == 0 || params.max_new_tokens == 0 {
            return Err(WorkerError::InvalidArgument(
                "n and max_new_tokens must be at least 1".into(),
            ));
        }
        verity_kernels::on_pool_for_decoding(self.model.device(), || {
            self.run_continuous(prompts, params)
        })
    }

    /// A fresh episode of prompt `prompt`'s sample `sample`.
    fn start_episode(&self, prompt: usize, sample: usize, seed: u64) -> Live<'_> {
        Live {
            episode: Episode {
                prompt_index: prompt,
                sample_index: sample,
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                model_mask: Vec::new(),
                turns: Vec::new(),
                tool_calls: Vec::new(),
                end: EpisodeEnd::TokenBudget,
                tool_limit: None,
            },
            rng: sequence_rng(seed, prompt, sample),
            tools: EpisodeTools::new(self.environment, self.host),
            fed: 0,
            turn_start: 0,
            calling: false,
            done: false,
        }
    }

    fn run_continuous(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Episode>> {
        let tokenizer = self.tokenizer;
        let format = ToolFormat::of(tokenizer);
        let budget = self.environment.max_episode_tokens(params.max_new_tokens);
        let eos = &tokenizer.eos_token_ids;
        let pad = tokenizer.pad_id();
        let compact = CompactWeights::for_rollouts(self.model, params.rollout_dtype)?;
        let g = params.n;
        let limit = match params.max_batch_rows {
            0 => usize::MAX,
            rows => rows.max(g),
        };
        // every admitted episode, prompt-major (`None` while its calls run on their thread)
        let mut live: Vec<Option<Live>> = Vec::with_capacity(prompts.len() * g);
        let mut rows = Rows::default();
        // prompts `next..` wait for room
        let mut next = 0;
        let parallel = self.environment.parallel_tool_calls;
        let stop_len =
            params.stop_strings.iter().map(String::len).max().unwrap_or(0).max(CALL_CLOSE.len());
        let stop = verity_verifiers::stop::current();
        std::thread::scope(|scope| -> Result<()> {
            let (wake, woken) = mpsc::channel::<()>();
            let mut calls: Vec<(usize, ScopedJoinHandle<'_, Result<Live>>)> = Vec::new();
            loop {
                // A cancelled job's episodes end here (tool calls still running are joined
                // when the scope closes).
                if stop.as_ref().is_some_and(verity_verifiers::StopFlag::is_raised) {
                    return Err(WorkerError::Stopped);
                }
                // 1. Sample for every episode whose last fed token was its newest one.
                let mut row_live = rows_of(&mut live, &rows.episodes);
                row_live.par_iter_mut().zip(rows.logits.par_iter()).try_for_each(
                    |(seq, row_logits)| -> Result<()> {
                        let Some(seq) = seq else { return Ok(()) };
                        if seq.done || seq.fed < seq.episode.token_ids.len() {
                            return Ok(());
                        }
                        let (token, logprob) = pick_token(row_logits, params, &mut seq.rng);
                        seq.push(token, logprob, true);
                        let len = seq.episode.token_ids.len();
                        if eos.contains(&token) {
                            // a Llama- or Mistral-style call (or a parallel Hermes turn) ends as
                            // an answer does, so such a turn is decoded then
                            let turn = &seq.episode.token_ids[seq.turn_start..];
                            if (format.calls_by_whole_turns() || parallel)
                                && format.calls_at_end_of_turn(&tokenizer.decode(turn, false)?)
                            {
                                seq.calling = true;
                                return Ok(());
                            }
                            seq.end_answer();
                            seq.finish(EpisodeEnd::Answer);
                            return Ok(());
                        }
                        let tail = &seq.episode.token_ids
                            [seq.turn_start.max(len.saturating_sub(stop_len + 8))..];
                        let text = tokenizer.decode(tail, false)?;
                        if !parallel && text.contains(CALL_CLOSE) {
                            seq.calling = true;
                        } else if params.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                            seq.end_answer();
                            seq.finish(EpisodeEnd::Stop);
                        } else if len - seq.turn_start >= params.max_new_tokens || len >= budget {
                            seq.end_answer();
                            seq.finish(EpisodeEnd::TokenBudget);
                        }
                        Ok(())
                    },
                )?;
                drop(row_live);
                // 2. Calls that closed in this step start, each on its own thread; their rows
                // pause (they stay in the batch, fed placeholders they never see) while the
                // other episodes keep decoding.
                for k in 0..rows.episodes.len() {
                    let index = rows.episodes[k];
                    let Some(seq) = live[index].as_mut().filter(|l| l.calling && !l.done) else {
                        continue;
                    };
                    seq.calling = false;
                    if seq.episode.turns.len() + 1 >= self.environment.max_turns {
                        seq.end_answer();
                        seq.finish(EpisodeEnd::TurnLimit);
                        continue;
                    }
                    let Some(seq) = live[index].take() else { continue };
                    rows.batch()?.pause(k)?;
                    let wake = wake.clone();
                    let handle = scope.spawn(move || {
                        let seq = self.call_tool(seq, format, budget);
                        let _ = wake.send(());
                        seq
                    });
                    calls.push((index, handle));
                }
                // 3. Episodes whose calls returned resume, their tool turn queued to be fed;
                // when nothing is left to decode and no waiting prompt fits, wait for a call.
                let (decoding, admit) = loop {
                    while let Some(k) = calls.iter().position(|(_, handle)| handle.is_finished()) {
                        let (index, handle) = calls.swap_remove(k);
                        let seq = handle.join().map_err(|_| {
                            WorkerError::InvalidArgument("a tool thread panicked".into())
                        })??;
                        if !seq.done {
                            if let Some(row) = rows.episodes.iter().position(|&r| r == index) {
                                rows.batch()?.resume(row)?;
                            }
                        }
                        live[index] = Some(seq);
                    }
                    let holding = |r: &usize| live[*r].as_ref().is_none_or(|l| !l.done);
                    let decoding =
                        rows.episodes.iter().any(|&r| live[r].as_ref().is_some_and(|l| !l.done));
                    let free = limit - rows.episodes.iter().filter(|r| holding(r)).count();
                    let admit = if next < prompts.len() { free / g } else { 0 };
                    let admit = admit.min(prompts.len() - next);
                    if decoding || admit > 0 {
                        break (decoding, admit);
                    }
                    if calls.is_empty() {
                        return Ok(());
                    }
                    let _ = woken.recv_timeout(std::time::Duration::from_millis(20));
                };
                // 4. Drop finished episodes from the batch when a waiting prompt joins, else
                // now and then (an episode in a call keeps its row).
                let still: Vec<usize> = (0..rows.episodes.len())
                    .filter(|&k| live[rows.episodes[k]].as_ref().is_none_or(|l| !l.done))
                    .collect();
                let dead = rows.episodes.len() - still.len();
                if dead > 0 && (admit > 0 || dead * 8 >= rows.episodes.len()) {
                    rows.keep(&still, admit > 0)?;
                }
                // 5. Feed every live episode one token.
                if decoding {
                    let ids: Vec<u32> = rows
                        .episodes
                        .iter()
                        .map(|&r| match live[r].as_mut() {
                            Some(seq) if !seq.done => {
                                let id = seq.episode.token_ids[seq.fed];
                                seq.fed += 1;
                                id
                            }
                            _ => pad,
                        })
                        .collect();
                    rows.logits = rows.batch()?.step(self.model, &ids)?;
                }
                // 6. Waiting prompts that fit are prefilled together and join.
                if admit > 0 {
                    let joining = &prompts[next..next + admit];
                    let refs: Vec<&[u32]> = joining.iter().map(Vec::as_slice).collect();
                    let (mut batch, prompt_logits) =
                        DecodeBatch::prefill(self.model, &refs, pad, budget, compact.clone())?;
                    let expand: Vec<usize> = (0..admit * g).map(|r| r / g).collect();
                    batch.select_rows(&expand)?;
                    for (r, &p) in expand.iter().enumerate() {
                        rows.episodes.push(live.len());
                        rows.logits.push(prompt_logits[p].clone());
                        live.push(Some(self.start_episode(next + p, r % g, params.seed)));
                    }
                    rows.join(batch)?;
                    next += admit;
                }
            }
        })?;
        live.into_iter()
            .map(|l| {
                l.map(|l| l.episode).ok_or_else(|| {
                    WorkerError::InvalidArgument("an episode was lost in a tool call".into())
                })
            })
            .collect()
    }

    /// Runs the tool calls of `seq`'s closed turn, in order, and queues the tool turn with
    /// their results to be fed (or ends the episode on a fatal tool error or the token budget).
    fn call_tool<'t>(
        &self,
        mut seq: Live<'t>,
        format: ToolFormat,
        budget: usize,
    ) -> Result<Live<'t>> {
        let ids = &seq.episode.token_ids[seq.turn_start..];
        let turn = self.tokenizer.decode(ids, false)?;
        let turn_ended = ids.last().is_some_and(|id| self.tokenizer.eos_token_ids.contains(id));
        let first = seq.episode.tool_calls.len();
        let mut results = Vec::new();
        let mut fatal = None;
        for parsed in parse_tool_calls(&turn) {
            let call_id = match &parsed {
                Ok(ToolCall { id: Some(id), .. }) => id.clone(),
                _ => format!("call{:05}", first + results.len()),
            };
            let outcome = seq.tools.call(parsed);
            results.push(ToolResult { call_id, content: outcome.record.output.clone() });
            seq.episode.tool_calls.push(outcome.record);
            if outcome.fatal.is_some() {
                fatal = outcome.fatal;
                break;
            }
        }
        seq.end_turn(first..seq.episode.tool_calls.len());
        if let Some(why) = fatal {
            seq.episode.tool_limit = Some(why);
            seq.finish(EpisodeEnd::ToolLimit);
            return Ok(seq);
        }
        let fed = self.tokenizer.encode(&format.tool_turn(&results, turn_ended))?;
        if seq.episode.token_ids.len() + fed.len() >= budget {
            seq.finish(EpisodeEnd::TokenBudget);
            return Ok(seq);
        }
        for id in fed {
            seq.push(id, 0.0, false);
        }
        seq.turn_start = seq.episode.token_ids.len();
        Ok(seq)
    }
}

/// The live episodes held in batch rows `rows`, in row order (`None`: in a tool call).
fn rows_of<'l, 'a>(
    live: &'l mut [Option<Live<'a>>],
    rows: &[usize],
) -> Vec<Option<&'l mut Live<'a>>> {
    let mut by_index: Vec<Option<&mut Live<'a>>> = live.iter_mut().map(Option::as_mut).collect();
    rows.iter().map(|&r| by_index[r].take()).collect()
}

/// The decode batch's rows: the episode each row holds and its next-token logits.
#[derive(Default)]
struct Rows {
    batch: Option<DecodeBatch>,
    episodes: Vec<usize>,
    logits: Vec<Vec<f32>>,
}

impl Rows {
    fn batch(&mut self) -> Result<&mut DecodeBatch> {
        self.batch.as_mut().ok_or_else(|| WorkerError::InvalidArgument("no rows to decode".into()))
    }

    /// Keeps rows `keep` (in order) with their logits; `trim` also drops the front padding no
    /// kept row needs (rows that joined later are padded in front).
    fn keep(&mut self, keep: &[usize], trim: bool) -> Result<()> {
        self.episodes = keep.iter().map(|&k| self.episodes[k]).collect();
        self.logits = keep.iter().map(|&k| std::mem::take(&mut self.logits[k])).collect();
        if keep.is_empty() {
            self.batch = None;
            return Ok(());
        }
        let batch = self.batch()?;
        batch.select_rows(keep)?;
        if trim {
            batch.trim()?;
        }
        Ok(())
    }

    /// Appends the rows of a newly prefilled batch (their episodes and logits already pushed).
    fn join(&mut self, joining: DecodeBatch) -> Result<()> {
        match self.batch.as_mut() {
            Some(batch) => batch.append(joining),
            None => {
                self.batch = Some(joining);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::trainer::testing::{
        tiny_llama3_tokenizer, tiny_mistral_tokenizer, tiny_tool_tokenizer, tiny_word_tokenizer,
        LLAMA_CALL,
    };
    use serde_json::json;

    fn runner<'a>(
        model: &'a Transformer,
        tokenizer: &'a ChatTokenizer,
        environment: &'a Environment,
        sandbox: &'a verity_verifiers::SandboxConfig,
        allow: &'a verity_core::environment::HttpAllowList,
    ) -> EpisodeRunner<'a> {
        EpisodeRunner {
            model,
            tokenizer,
            environment,
            host: ToolHost { sandbox, http_allow: allow },
        }
    }

    /// A loopback HTTP server of two tools: `POST …/wait` answers `released` once `POST
    /// …/release` (answered `ok`) has arrived, or `timed out` after 20 s; each request is served
    /// on its own thread. Returns the server's base URL.
    fn gate_server() -> String {
        use crate::episodes::http::exchange::{answer, read_request};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let gate = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    let (first, _) = read_request(&stream);
                    let (open, opened) = &*gate;
                    let text = if first.contains("/release") {
                        *open.lock().unwrap() = true;
                        opened.notify_all();
                        "ok"
                    } else {
                        let guard = open.lock().unwrap();
                        let wait = std::time::Duration::from_secs(20);
                        let (guard, _) = opened.wait_timeout_while(guard, wait, |o| !*o).unwrap();
                        if *guard {
                            "released"
                        } else {
                            "timed out"
                        }
                    };
                    answer(&stream, 200, text);
                });
            }
        });
        url
    }

    /// A call that waits for its tool takes its episode out of the batch while the others keep
    /// decoding: here the first episode's call returns only once the second episode, 12 tokens
    /// later, has made its own call (which releases the first), so an engine whose batch waited
    /// for every call would end the first episode at its tool's time limit instead.
    #[test]
    fn episodes_keep_decoding_while_another_waits_for_its_tool() {
        let wait = r#"<tool_call>{"name": "wait", "arguments": {}}</tool_call>"#;
        let release = r#"<tool_call>{"name": "release", "arguments": {}}</tool_call>"#;
        let tokenizer =
            tiny_word_tokenizer(&[wait, release, "</tool_response>", "done", "go", "other"])
                .unwrap();
        let id = |word: &str| tokenizer.tokenizer.token_to_id(word).unwrap();
        let chain: Vec<u32> = (20..32).collect();
        let mut script = vec![(id("go"), id(wait)), (id("other"), chain[0])];
        script.extend(chain.windows(2).map(|w| (w[0], w[1])));
        script.extend([(chain[11], id(release)), (id("</tool_response>"), id("done"))]);
        let model = crate::testing::scripted_model(&script).unwrap();
        let url = gate_server();
        let tool = |name: &str| {
            json!({"type": "function", "http": {"url": format!("{url}/{name}"), "retries": 0},
                "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
                "limits": {"timeout_ms": 8000}})
        };
        let environment: Environment = serde_json::from_value(
            json!({"max_turns": 3, "tools": [tool("wait"), tool("release")]}),
        )
        .unwrap();
        let sandbox = verity_verifiers::SandboxConfig::not_needed();
        let allow = verity_core::environment::HttpAllowList::parse(&url);
        let runner = runner(&model, &tokenizer, &environment, &sandbox, &allow);
        let params =
            SamplingParams { n: 1, max_new_tokens: 16, seed: 1, ..SamplingParams::default() };
        let episodes = runner.run(&[vec![1, id("go")], vec![1, id("other")]], &params).unwrap();
        let outputs: Vec<(&str, &str, bool, EpisodeEnd)> = episodes
            .iter()
            .flat_map(|e| {
                e.tool_calls.iter().map(|c| (c.name.as_str(), c.output.as_str(), c.error, e.end))
            })
            .collect();
        assert_eq!(
            outputs,
            vec![
                ("wait", "released", false, EpisodeEnd::Answer),
                ("release", "ok", false, EpisodeEnd::Answer)
            ]
        );
        assert!(episodes.iter().all(|e| e.token_ids.last() == Some(&2)), "both answered `done`");
    }

    /// A host without a sandbox or allowed endpoints (for the calculator).
    fn no_sandbox() -> (verity_verifiers::SandboxConfig, verity_core::environment::HttpAllowList) {
        (verity_verifiers::SandboxConfig::not_needed(), Default::default())
    }

    fn calculator_environment(parallel: bool) -> Environment {
        serde_json::from_value(json!({"max_turns": 3, "tools": [{"type": "calculator"}],
            "parallel_tool_calls": parallel}))
        .unwrap()
    }

    /// A call as the tests compare it: name, result, error.
    type CallSeen = (String, String, bool);

    /// The calls, results and end of each episode.
    fn calls_of(episodes: &[Episode]) -> Vec<(Vec<CallSeen>, EpisodeEnd)> {
        episodes
            .iter()
            .map(|e| {
                let calls = e.tool_calls.iter();
                (calls.map(|c| (c.name.clone(), c.output.clone(), c.error)).collect(), e.end)
            })
            .collect()
    }

    /// With `parallel_tool_calls`, a Hermes turn goes on after `</tool_call>`: the model writes
    /// two calls and ends its turn itself, both calls run, and one tool turn with both results
    /// is fed (without a second end-of-turn); graders see one assistant message with two
    /// `tool_calls` and two `tool` messages. Without it the turn stops at the first call.
    #[test]
    fn parallel_calls_in_one_hermes_turn_all_run() {
        let product =
            r#"<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>"#;
        let sum =
            r#"<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>"#;
        let tokenizer =
            tiny_word_tokenizer(&[product, sum, "</tool_response>", "done", "go"]).unwrap();
        let id = |word: &str| tokenizer.tokenizer.token_to_id(word).unwrap();
        let model = crate::testing::scripted_model(&[
            (id("go"), id(product)),
            (id(product), id(sum)),
            (id("</tool_response>"), id("done")),
        ])
        .unwrap();
        let (sandbox, allow) = no_sandbox();
        let params =
            SamplingParams { n: 1, max_new_tokens: 8, seed: 1, ..SamplingParams::default() };
        let run = |parallel: bool| {
            let environment = calculator_environment(parallel);
            let runner = runner(&model, &tokenizer, &environment, &sandbox, &allow);
            runner.run(&[vec![1, id("go")]], &params).unwrap()
        };
        let call = |output: &str| ("calculator".to_string(), output.to_string(), false);
        let parallel = run(true);
        assert_eq!(calls_of(&parallel), vec![(vec![call("42"), call("4")], EpisodeEnd::Answer)]);
        let episode = &parallel[0];
        let results: Vec<ToolResult> = ["42", "4"]
            .iter()
            .enumerate()
            .map(|(k, c)| ToolResult { call_id: format!("call{k:05}"), content: c.to_string() })
            .collect();
        let fed = tokenizer.encode(&ToolFormat::Plain.tool_turn(&results, true)).unwrap();
        let mut want = vec![id(product), id(sum), 2];
        want.extend(&fed);
        want.extend([id("done"), 2]);
        assert_eq!(episode.token_ids, want, "the model's own end-of-turn closes the calls");
        assert_eq!(episode.turns[0].calls(), 0..2);
        let sample = crate::episodes::grader_sample(&tokenizer, episode).unwrap();
        let messages = sample.extra["messages"].as_array().unwrap();
        assert_eq!(messages[0]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            (&messages[1]["content"], &messages[2]["content"], &messages[2]["tool_call_id"]),
            (&json!("42"), &json!("4"), &json!("call_1"))
        );
        assert_eq!(messages[3]["content"], "done");
        assert_eq!(calls_of(&run(false)), vec![(vec![call("42")], EpisodeEnd::Answer)]);
    }

    /// A Mistral episode through the engine: `[TOOL_CALLS]` and a list of two calls ended by
    /// `</s>`; both run, each result is fed as `[TOOL_RESULTS] {"content": …, "call_id": …}
    /// [/TOOL_RESULTS]` (echoing the id the model gave, or a generated one), and the model's
    /// answer after them ends the episode.
    #[test]
    fn a_mistral_episode_runs_its_list_of_calls_then_answers() {
        let list = r#"[{"name": "calculator", "arguments": {"expression": "6*7"}, "id": "abc123def"}, {"name": "calculator", "arguments": {"expression": "2+2"}}]"#;
        let tokenizer = tiny_mistral_tokenizer(&[list, "done", "go"]).unwrap();
        assert_eq!(ToolFormat::of(&tokenizer), ToolFormat::Mistral);
        let id = |word: &str| tokenizer.tokenizer.token_to_id(word).unwrap();
        let model = crate::testing::scripted_model(&[
            (id("go"), id("[TOOL_CALLS]")),
            (id("[TOOL_CALLS]"), id(list)),
            (id("[/TOOL_RESULTS]"), id("done")),
        ])
        .unwrap();
        let environment = calculator_environment(false);
        let (sandbox, allow) = no_sandbox();
        let runner = runner(&model, &tokenizer, &environment, &sandbox, &allow);
        let params =
            SamplingParams { n: 2, max_new_tokens: 32, seed: 1, ..SamplingParams::default() };
        let episodes = runner.run(&[vec![1, id("go")]], &params).unwrap();
        let call = |output: &str| ("calculator".to_string(), output.to_string(), false);
        let want_calls = (vec![call("42"), call("4")], EpisodeEnd::Answer);
        assert_eq!(calls_of(&episodes), vec![want_calls.clone(), want_calls]);
        let results = [
            ToolResult { call_id: "abc123def".into(), content: "42".into() },
            ToolResult { call_id: "call00001".into(), content: "4".into() },
        ];
        let fed = tokenizer.encode(&ToolFormat::Mistral.tool_turn(&results, true)).unwrap();
        let mut want = vec![id("[TOOL_CALLS]"), id(list), 2];
        want.extend(&fed);
        want.extend([id("done"), 2]);
        for episode in &episodes {
            assert_eq!(episode.token_ids, want);
            let sample = crate::episodes::grader_sample(&tokenizer, episode).unwrap();
            assert_eq!(sample.output_text, "done");
            assert_eq!(sample.extra["messages"][0]["content"], "", "a call list says nothing else");
        }
    }

    /// With `max_batch_rows`, waiting prompts join the running rows as episodes finish: the
    /// greedy episodes are those of a single batch, prompt indices run on across admissions,
    /// and each prompt keeps its own random stream (the same text admitted twice samples
    /// differently).
    #[test]
    fn waiting_prompts_join_as_rows_finish() {
        let model = crate::testing::tiny_model(Family::Llama, 1).unwrap();
        let tokenizer = tiny_tool_tokenizer().unwrap();
        let environment = calculator_environment(false);
        let (sandbox, allow) = no_sandbox();
        let runner = runner(&model, &tokenizer, &environment, &sandbox, &allow);
        let prompts = vec![vec![1u32, 10, 11], vec![1u32, 20, 21], vec![1u32, 10, 11]];
        let greedy = SamplingParams {
            n: 4,
            max_new_tokens: 16,
            temperature: 0.0,
            seed: 3,
            ..SamplingParams::default()
        };
        let seen = |episodes: &[Episode]| -> Vec<(usize, usize, Vec<u32>)> {
            episodes.iter().map(|e| (e.prompt_index, e.sample_index, e.token_ids.clone())).collect()
        };
        let together = runner.run(&prompts, &greedy).unwrap();
        let batched =
            runner.run(&prompts, &SamplingParams { max_batch_rows: 4, ..greedy.clone() }).unwrap();
        assert_eq!(seen(&together), seen(&batched));
        let sampled = SamplingParams { temperature: 1.0, max_batch_rows: 4, ..greedy };
        let episodes = runner.run(&prompts, &sampled).unwrap();
        let order: Vec<usize> = episodes.iter().map(|e| e.prompt_index).collect();
        assert_eq!(order, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        let tokens = |p: usize| -> Vec<Vec<u32>> {
            episodes.iter().filter(|e| e.prompt_index == p).map(|e| e.token_ids.clone()).collect()
        };
        assert_ne!(tokens(0), tokens(2), "one random stream per prompt, not per batch");
    }

    /// A Llama 3 episode through the engine, on a scripted model: the call is a whole turn of
    /// JSON after `<|python_tag|>` ended by `<|eom_id|>`; the calculator runs; its `ipython`
    /// turn is fed with mask 0; the model's answer after it (ended by `<|eot_id|>`) ends the
    /// episode; graders see the call and its result as OpenAI messages.
    #[test]
    fn a_llama3_episode_calls_the_calculator_then_answers() {
        let tokenizer = tiny_llama3_tokenizer().unwrap();
        assert_eq!(ToolFormat::of(&tokenizer), ToolFormat::Llama3);
        let id = |word: &str| {
            let ids = tokenizer.encode(word).unwrap();
            assert_eq!(ids.len(), 1, "{word} is one token");
            ids[0]
        };
        let (go, tag, call, eom, eot) =
            (id("go"), id("<|python_tag|>"), id(LLAMA_CALL), id("<|eom_id|>"), id("<|eot_id|>"));
        let (header_end, done) = (id("<|end_header_id|>"), id("done"));
        let model = crate::testing::scripted_model(&[
            (go, tag),
            (tag, call),
            (call, eom),
            (header_end, done),
            (done, eot),
        ])
        .unwrap();
        let environment = calculator_environment(false);
        let (sandbox, allow) = no_sandbox();
        let runner = runner(&model, &tokenizer, &environment, &sandbox, &allow);
        let params =
            SamplingParams { n: 2, max_new_tokens: 8, seed: 5, ..SamplingParams::default() };
        let episodes = runner.run(&[vec![1, go]], &params).unwrap();
        let result = ToolResult { call_id: "call00000".into(), content: "42".into() };
        let fed = tokenizer.encode(&ToolFormat::Llama3.tool_turn(&[result], true)).unwrap();
        let mut want = vec![tag, call, eom];
        want.extend(&fed);
        want.extend([done, eot]);
        // three prompts through two rows: the later groups join while the earlier ones'
        // calls run, and every episode is the same
        let two_rows = SamplingParams { max_batch_rows: 2, ..params.clone() };
        let through_two_rows = runner.run(&[vec![1, go], vec![1, go], vec![1, go]], &two_rows);
        let through_two_rows = through_two_rows.unwrap();
        let order: Vec<(usize, usize)> =
            through_two_rows.iter().map(|e| (e.prompt_index, e.sample_index)).collect();
        assert_eq!(order, [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
        for episode in episodes.iter().chain(&through_two_rows) {
            assert_eq!(episode.token_ids, want);
            assert_eq!(episode.end, EpisodeEnd::Answer);
            assert_eq!(
                episode.turns,
                vec![
                    Turn { start: 0, end: 3, first_call: 0, call_count: 1 },
                    Turn { start: 3 + fed.len(), end: want.len(), first_call: 1, call_count: 0 }
                ]
            );
            let masked: Vec<bool> = (0..want.len()).map(|t| t < 3 || t >= 3 + fed.len()).collect();
            assert_eq!(episode.model_mask, masked, "only the model's tokens are unmasked");
            let record = &episode.tool_calls[0];
            assert_eq!(
                (record.name.as_str(), &record.arguments, record.output.as_str(), record.error),
                ("calculator", &json!({"expression": "6*7"}), "42", false)
            );
            let sample = crate::episodes::grader_sample(&tokenizer, episode).unwrap();
            assert_eq!(sample.output_text, "done");
            let messages = &sample.extra["messages"];
            assert_eq!(messages[0]["tool_calls"][0]["function"]["name"], "calculator");
            assert_eq!(messages[0]["content"], "");
            assert_eq!(
                messages[1],
                json!({"role": "tool", "tool_call_id": "call_0", "content": "42"})
            );
            assert_eq!(messages[2], json!({"role": "assistant", "content": "done"}));
        }
    }

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
        let environment = calculator_environment(false);
        let (sandbox, allow) = no_sandbox();
        let runner = runner(&model, &tokenizer, &environment, &sandbox, &allow);
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
                if let (1, Some(next)) = (turn.call_count, e.turns.get(k + 1)) {
                    calls += 1;
                    let record = &e.tool_calls[turn.first_call];
                    assert!(record.error, "the tiny vocabulary makes no valid call: {record:?}");
                    let result = ToolResult {
                        call_id: format!("call{:05}", turn.first_call),
                        content: record.output.clone(),
                    };
                    let fed = tokenizer.encode(&format.tool_turn(&[result], false)).unwrap();
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
