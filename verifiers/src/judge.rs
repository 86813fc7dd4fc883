//! The judge behind model graders: a [`Judge`] answers chat prompts in batches, and a
//! [`JudgeCache`] in front of it judges each identical (judge, prompt, sampling) once.
//!
//! The verifiers crate only defines the interface; the worker crate implements it with the
//! candle sampler (a judge model registered in Verity) or an OpenAI-compatible HTTP endpoint.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One chat message of a judge prompt, templates already rendered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JudgeMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// How the judge samples its reply (OpenAI's `sampling_params`, defaults filled in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeSampling {
    /// Softmax temperature; 0 is greedy.
    pub temperature: f64,
    /// Nucleus mass kept.
    pub top_p: f64,
    /// Seed of the reply's random stream.
    pub seed: u64,
    /// Longest reply in tokens.
    pub max_completion_tokens: usize,
    /// Reasoning effort forwarded to an endpoint judge (a local judge has no reasoning mode).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
}

/// A hashable identity of [`JudgeSampling`] (floats by their bits).
pub type SamplingKey = (u64, u64, u64, usize, Option<String>);

impl JudgeSampling {
    /// A hashable identity of the sampling settings.
    pub fn key(&self) -> SamplingKey {
        (
            self.temperature.to_bits(),
            self.top_p.to_bits(),
            self.seed,
            self.max_completion_tokens,
            self.reasoning_effort.clone(),
        )
    }
}

/// One prompt for a judge model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgePrompt {
    /// The judge: a model name registered in Verity (or routed to an endpoint).
    pub model: String,
    /// The chat messages.
    pub messages: Vec<JudgeMessage>,
    /// Sampling settings.
    pub sampling: JudgeSampling,
}

type PromptKey = (String, Vec<JudgeMessage>, SamplingKey);

impl JudgePrompt {
    fn key(&self) -> PromptKey {
        (self.model.clone(), self.messages.clone(), self.sampling.key())
    }
}

/// Why a judge gave no reply.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum JudgeError {
    /// The judge model is not available here (not registered, not configured).
    #[error("judge model '{0}' is not available")]
    UnknownModel(String),
    /// The judge could not answer now (endpoint down, timeouts after retries): an outage.
    #[error("judge unavailable: {0}")]
    Unavailable(String),
    /// The judge failed on this prompt (prompt too long, model error).
    #[error("judge failed: {0}")]
    Failed(String),
}

impl JudgeError {
    /// Whether this is an outage of the judge (the job should stop, not score the samples).
    pub fn is_outage(&self) -> bool {
        matches!(self, JudgeError::Unavailable(_))
    }
}

/// Tokens a judge spent on one reply (OpenAI's `usage` fields).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct TokenUsage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens of the reply.
    pub completion_tokens: u64,
}

impl TokenUsage {
    /// Prompt and reply tokens together.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// Adds `other`'s tokens to these.
    pub fn add(&mut self, other: TokenUsage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// Adds the per-model token counts of `from` to those of `into`.
pub fn merge_usage(
    into: &mut std::collections::BTreeMap<String, TokenUsage>,
    from: &std::collections::BTreeMap<String, TokenUsage>,
) {
    for (model, usage) in from {
        into.entry(model.clone()).or_default().add(*usage);
    }
}

/// A judge's reply: its text and what it cost.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JudgeReply {
    /// The reply text.
    pub text: String,
    /// Tokens spent on it.
    pub usage: TokenUsage,
}

impl JudgeReply {
    /// A reply whose cost is unknown (counted as 0 tokens).
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into(), usage: TokenUsage::default() }
    }
}

/// Something that answers judge prompts, in batches (one call = one batched generation).
pub trait Judge: Send + Sync {
    /// One reply per prompt, in order.
    fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>>;
}

/// Entries a [`JudgeCache`] keeps by default.
pub const DEFAULT_CACHE_ENTRIES: usize = 4096;

/// A [`Judge`] in front of another that judges each distinct prompt once: repeated prompts
/// (in one batch or across batches) take the stored reply. Outages are not stored.
pub struct JudgeCache {
    inner: Arc<dyn Judge>,
    capacity: usize,
    state: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    replies: HashMap<PromptKey, Result<JudgeReply, JudgeError>>,
    order: VecDeque<PromptKey>,
    hits: u64,
    misses: u64,
}

impl std::fmt::Debug for JudgeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (hits, misses) = self.stats();
        f.debug_struct("JudgeCache").field("hits", &hits).field("misses", &misses).finish()
    }
}

impl JudgeCache {
    /// A cache of at most `capacity` replies (oldest dropped first) in front of `inner`.
    pub fn new(inner: Arc<dyn Judge>, capacity: usize) -> Self {
        Self { inner, capacity: capacity.max(1), state: Mutex::new(CacheState::default()) }
    }

    /// Prompts answered from the cache and prompts sent to the judge so far.
    pub fn stats(&self) -> (u64, u64) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.hits, state.misses)
    }
}

impl JudgeCache {
    /// Forgets stored outages, so that the next call asks the judge again (called before each
    /// batch: within a batch an outage is answered from the cache instead of retried per row).
    pub fn forget_outages(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.replies.retain(|_, v| !matches!(v, Err(e) if e.is_outage()));
        let CacheState { replies, order, .. } = &mut *state;
        order.retain(|k| replies.contains_key(k));
    }
}

impl Judge for JudgeCache {
    fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
        let keys: Vec<PromptKey> = prompts.iter().map(JudgePrompt::key).collect();
        let mut misses: Vec<usize> = Vec::new();
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let mut seen = std::collections::HashSet::new();
            for (i, key) in keys.iter().enumerate() {
                if !state.replies.contains_key(key) && seen.insert(key.clone()) {
                    misses.push(i);
                    state.misses += 1;
                } else {
                    state.hits += 1;
                }
            }
        }
        let mut fresh: HashMap<PromptKey, Result<JudgeReply, JudgeError>> = HashMap::new();
        if !misses.is_empty() {
            let batch: Vec<JudgePrompt> = misses.iter().map(|&i| prompts[i].clone()).collect();
            let mut replies = self.inner.complete(&batch).into_iter();
            for &i in &misses {
                let reply = replies.next().unwrap_or_else(|| {
                    Err(JudgeError::Failed("the judge returned fewer replies than prompts".into()))
                });
                fresh.insert(keys[i].clone(), reply);
            }
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let out: Vec<Result<JudgeReply, JudgeError>> = keys
            .iter()
            .map(|k| {
                fresh.get(k).or_else(|| state.replies.get(k)).cloned().unwrap_or_else(|| {
                    Err(JudgeError::Failed("the reply left the cache too early".into()))
                })
            })
            .collect();
        for (key, reply) in fresh {
            if state.replies.insert(key.clone(), reply).is_none() {
                state.order.push_back(key);
            }
        }
        while state.order.len() > self.capacity {
            if let Some(old) = state.order.pop_front() {
                state.replies.remove(&old);
            }
        }
        out
    }
}

/// A judge's reply turned into a number, with the text it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedScore {
    /// The number the judge gave (in the grader's `range`).
    pub value: f64,
    /// Where it was read: `json` (`{"result": …}`) or `text` (the first number).
    pub source: &'static str,
}

/// Reads a score from a judge reply: the `result` (or `score`) number of the first JSON object
/// in the reply — OpenAI's score_model output schema is `{"result": number, "steps": […]}` —
/// else the first number in the text. `None` when the reply holds no number.
pub fn parse_score(reply: &str) -> Option<ParsedScore> {
    for object in json_objects(reply) {
        for key in ["result", "score"] {
            let value = match object.get(key) {
                Some(serde_json::Value::Number(n)) => n.as_f64(),
                Some(serde_json::Value::String(s)) => s.trim().parse::<f64>().ok(),
                _ => None,
            };
            if let Some(value) = value.filter(|v| v.is_finite()) {
                return Some(ParsedScore { value, source: "json" });
            }
        }
    }
    first_number(reply).map(|value| ParsedScore { value, source: "text" })
}

/// Reads a label from a judge reply: the `result` (or `label`) string of the first JSON object
/// in the reply — OpenAI's label_model output schema is `{"result": label}` — else the reply
/// itself when it is one of the labels (case, quotes and trailing punctuation ignored), else the
/// only label that appears in the text as a whole word. `None` when no label or several do.
pub fn parse_label<'a>(reply: &str, labels: &'a [String]) -> Option<&'a str> {
    let find = |text: &str| {
        let t = text.trim().trim_matches(|c: char| c == '"' || c == '\'' || c == '`');
        let t = t.trim_end_matches(['.', '!', ',', ';', ':']).trim();
        labels.iter().find(|l| l.eq_ignore_ascii_case(t)).map(String::as_str)
    };
    for object in json_objects(reply) {
        for key in ["result", "label"] {
            if let Some(serde_json::Value::String(s)) = object.get(key) {
                if let Some(label) = find(s) {
                    return Some(label);
                }
            }
        }
    }
    if let Some(label) = find(reply) {
        return Some(label);
    }
    let lower = reply.to_lowercase();
    let mut found = labels.iter().filter(|l| contains_word(&lower, &l.to_lowercase()));
    match (found.next(), found.next()) {
        (Some(only), None) => Some(only.as_str()),
        _ => None,
    }
}

/// Whether `word` occurs in `text` with no letter or digit right before or after it.
fn contains_word(text: &str, word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Every JSON object embedded in `text` (fenced or inline), in order.
fn json_objects(text: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let mut out = Vec::new();
    for (start, _) in text.match_indices('{') {
        let mut stream =
            serde_json::Deserializer::from_str(&text[start..]).into_iter::<serde_json::Value>();
        if let Some(Ok(serde_json::Value::Object(map))) = stream.next() {
            out.push(map);
        }
    }
    out
}

/// The first decimal number in `text` (sign, digits, optional fraction).
fn first_number(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let mut start = i;
            if start > 0 && bytes[start - 1] == b'-' {
                start -= 1;
            }
            let mut end = i;
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            if end + 1 < bytes.len() && bytes[end] == b'.' && bytes[end + 1].is_ascii_digit() {
                end += 1;
                while end < bytes.len() && bytes[end].is_ascii_digit() {
                    end += 1;
                }
            }
            return text[start..end].parse().ok();
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<String> {
        vec!["correct".into(), "incorrect".into(), "partial".into()]
    }

    #[test]
    fn score_reads_json_result_first_then_first_number() {
        let p = parse_score(r#"Thinking... {"steps": [], "result": 0.75}"#).unwrap();
        assert_eq!((p.value, p.source), (0.75, "json"));
        let p = parse_score("```json\n{\"score\": \"4\"}\n```").unwrap();
        assert_eq!((p.value, p.source), (4.0, "json"));
        let p = parse_score("Score: 7/10").unwrap();
        assert_eq!((p.value, p.source), (7.0, "text"));
        assert_eq!(parse_score("I give it -2.5").unwrap().value, -2.5);
        assert_eq!(parse_score("no idea"), None);
        assert_eq!(parse_score("{\"result\": \"high\"}"), None);
    }

    #[test]
    fn label_reads_json_exact_reply_or_one_word() {
        let l = labels();
        assert_eq!(parse_label(r#"{"result": "Correct"}"#, &l), Some("correct"));
        assert_eq!(parse_label("\"incorrect\".", &l), Some("incorrect"));
        assert_eq!(parse_label("The answer is partial, I think", &l), Some("partial"));
        // "incorrect" contains "correct" but not as a whole word
        assert_eq!(parse_label("This is incorrect.", &l), Some("incorrect"));
        assert_eq!(parse_label("correct or incorrect?", &l), None);
        assert_eq!(parse_label("maybe", &l), None);
    }

    struct Echo(Mutex<usize>);

    impl Judge for Echo {
        fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
            *self.0.lock().unwrap() += prompts.len();
            prompts.iter().map(|p| Ok(JudgeReply::text(p.messages[0].content.clone()))).collect()
        }
    }

    fn prompt(text: &str) -> JudgePrompt {
        JudgePrompt {
            model: "judge".into(),
            messages: vec![JudgeMessage { role: "user".into(), content: text.into() }],
            sampling: JudgeSampling {
                temperature: 0.0,
                top_p: 1.0,
                seed: 0,
                max_completion_tokens: 8,
                reasoning_effort: None,
            },
        }
    }

    /// Answers every prompt with a score of 7 for 10 prompt tokens and 3 reply tokens.
    struct Sevens;

    impl Judge for Sevens {
        fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
            let usage = TokenUsage { prompt_tokens: 10, completion_tokens: 3 };
            prompts.iter().map(|_| Ok(JudgeReply { text: "7".into(), usage })).collect()
        }
    }

    #[test]
    fn a_multi_grader_reports_each_judges_tokens() {
        let judge = |name: &str, model: &str| {
            serde_json::json!({"type": "score_model", "name": name, "model": model,
                "range": [0, 10], "input": [{"role": "user", "content": "{{sample.output_text}}"}]})
        };
        let spec = serde_json::json!({"type": "multi", "calculate_output": "a + b + c",
            "graders": {"a": judge("a", "big"), "b": judge("b", "big"), "c": judge("c", "small")}});
        let grader =
            crate::Grader::from_json(&spec.to_string()).unwrap().with_judge(Arc::new(Sevens));
        let result = grader.grade(&serde_json::json!({}), &crate::Sample::from_text("x"));
        assert!(result.error.is_none(), "{result:?}");
        // the two prompts to "big" are identical: the cache judges them once, but each grading
        // reports what its judgment cost
        assert_eq!(
            result.judge_usage["big"],
            TokenUsage { prompt_tokens: 20, completion_tokens: 6 }
        );
        assert_eq!(result.judge_usage["small"].total(), 13);
        let plain = crate::Grader::from_json(
            r#"{"type": "string_check", "name": "s",
            "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"}"#,
        )
        .unwrap();
        assert!(plain
            .grade(&serde_json::json!({}), &crate::Sample::from_text("x"))
            .judge_usage
            .is_empty());
    }

    #[test]
    fn cache_judges_identical_prompts_once() {
        let inner = Arc::new(Echo(Mutex::new(0)));
        let cache = JudgeCache::new(inner.clone(), 2);
        let out = cache.complete(&[prompt("a"), prompt("b"), prompt("a")]);
        let texts: Vec<String> = out.into_iter().map(|r| r.unwrap().text).collect();
        assert_eq!(texts, ["a", "b", "a"]);
        assert_eq!(*inner.0.lock().unwrap(), 2);
        cache.complete(&[prompt("b")]);
        assert_eq!(*inner.0.lock().unwrap(), 2);
        cache.complete(&[prompt("c"), prompt("a")]);
        assert_eq!(cache.stats(), (3, 3));
    }
}
