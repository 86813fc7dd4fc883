//! Constrained decoding: a `response_format` (OpenAI's structured outputs) compiled into a token
//! grammar with llguidance, the engine vLLM, SGLang and llama.cpp use. At each decode step a
//! sequence's matcher gives the tokens that keep the output inside the grammar; the sampler draws
//! from the softmax over those tokens only and records the mask, so that the trainer computes
//! the same log-probabilities under the same mask ([`verity_kernels::token_logprobs_masked`]).
//!
//! Formats: `json_object` is any JSON object; `json_schema` follows the schema (`strict: true`
//! refuses schema keywords the engine cannot enforce; otherwise they are ignored, as OpenAI's
//! non-strict mode does not enforce them either); `text` is no constraint. The JSON is written
//! compactly with Python's separators (`", "` and `": "`) and no other whitespace, so that a
//! small model cannot wander into endless blank space.

use crate::error::{Result, WorkerError};
use crate::tokenizer::ChatTokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use verity_core::response_format::ResponseFormat;
pub use verity_kernels::{mask_allows, VocabMask};

/// A compiled `response_format`: the grammar's start state, cloned for each sequence.
#[derive(Clone)]
pub struct OutputConstraint {
    inner: Arc<Compiled>,
}

struct Compiled {
    /// The matcher before any token; each sequence starts from a deep copy.
    start: Matcher,
    /// The ids that end a completion (every one is allowed wherever the grammar may end).
    eos_ids: Vec<u32>,
    /// Size of the model's vocabulary (the logits' length).
    vocab_size: usize,
}

impl std::fmt::Debug for OutputConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputConstraint").field("vocab_size", &self.inner.vocab_size).finish()
    }
}

impl PartialEq for OutputConstraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// The JSON Schema a format constrains the output to, with the compiler's options; `None` for
/// free text.
pub fn format_schema(format: &ResponseFormat) -> Option<Value> {
    let (mut schema, strict) = match format {
        ResponseFormat::Text => return None,
        ResponseFormat::JsonObject => (json!({"type": "object"}), false),
        ResponseFormat::JsonSchema { json_schema } => (
            json_schema.schema.clone().unwrap_or_else(|| json!({"type": "object"})),
            json_schema.strict.unwrap_or(false),
        ),
    };
    let options = json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": !strict,
    });
    if let Some(object) = schema.as_object_mut() {
        object.insert("x-guidance".into(), options);
    }
    Some(schema)
}

/// Checks that a format compiles into a grammar (a schema the engine cannot enforce in strict
/// mode, or one no output can satisfy, is refused); the message says why.
pub fn check_format(format: &ResponseFormat) -> std::result::Result<(), String> {
    let Some(schema) = format_schema(format) else { return Ok(()) };
    let env: llguidance::toktrie::TokEnv = ApproximateTokEnv::single_byte_env();
    let factory = quiet_factory(&env).map_err(|e| e.to_string())?;
    factory.create_parser(TopLevelGrammar::from_json_schema(schema)).map(drop).map_err(|e| {
        let message = e.to_string();
        message.lines().next().unwrap_or(&message).to_string()
    })
}

fn quiet_factory(env: &llguidance::toktrie::TokEnv) -> Result<ParserFactory> {
    let mut factory = ParserFactory::new_simple(env).map_err(grammar_error)?;
    factory.quiet();
    Ok(factory)
}

fn grammar_error(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::InvalidArgument(format!("response_format: {e}"))
}

/// The tokenizer as llguidance sees it: every token's bytes (special tokens marked so that no
/// grammar produces them), the model's vocabulary size and its end-of-sequence ids.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let text = String::from_utf8_lossy(s);
        match self.tokenizer.encode(text.as_ref(), false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles formats for one model: the tokenizer's token trie, built once (a serving engine
/// keeps one per model; building it is the costly part, compiling a schema is cheap).
pub struct GrammarCompiler {
    factory: ParserFactory,
    eos_ids: Vec<u32>,
    vocab_size: usize,
}

impl GrammarCompiler {
    /// The compiler for a model with `vocab_size` logits and this tokenizer.
    pub fn new(tokenizer: &ChatTokenizer, vocab_size: usize) -> Result<Self> {
        let eos_ids = tokenizer.eos_token_ids.clone();
        let first_eos = *eos_ids.first().ok_or_else(|| {
            WorkerError::InvalidArgument(
                "constrained decoding needs an end-of-sequence token".into(),
            )
        })?;
        let serialized = tokenizer
            .tokenizer
            .to_string(false)
            .map_err(|e| WorkerError::Tokenizer(format!("serialising the tokenizer: {e}")))?;
        let json: Value = serde_json::from_str(&serialized)
            .map_err(|e| WorkerError::Tokenizer(format!("reading the tokenizer: {e}")))?;
        // The reader asserts on token names it does not expect: a panic is that model's error.
        let read = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json));
        let unsupported = |e: &dyn std::fmt::Display| {
            grammar_error(format!(
                "this model's tokenizer cannot be constrained (constrained decoding needs a \
                 byte-level or byte-fallback BPE vocabulary): {e}"
            ))
        };
        let mut words = read
            .map_err(|_| unsupported(&"its vocabulary cannot be read"))?
            .map_err(|e| unsupported(&e))?;
        // Ids the model has but the tokenizer does not name stay empty: never allowed.
        words.resize(words.len().max(vocab_size), Vec::new());
        words.truncate(vocab_size);
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_ids);
        let env: llguidance::toktrie::TokEnv =
            Arc::new(VocabEnv { trie, tokenizer: tokenizer.tokenizer.clone() });
        Ok(Self { factory: quiet_factory(&env)?, eos_ids, vocab_size })
    }

    /// `format` compiled; `None` for free text.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<OutputConstraint>> {
        let Some(schema) = format_schema(format) else { return Ok(None) };
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_json_schema(schema))
            .map_err(grammar_error)?;
        let start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(grammar_error(e));
        }
        let compiled =
            Compiled { start, eos_ids: self.eos_ids.clone(), vocab_size: self.vocab_size };
        Ok(Some(OutputConstraint { inner: Arc::new(compiled) }))
    }
}

impl OutputConstraint {
    /// Compiles `format` for a model with `vocab_size` logits and this tokenizer; `None` for
    /// free text.
    pub fn compile(
        format: &ResponseFormat,
        tokenizer: &ChatTokenizer,
        vocab_size: usize,
    ) -> Result<Option<Self>> {
        if format_schema(format).is_none() {
            return Ok(None);
        }
        GrammarCompiler::new(tokenizer, vocab_size)?.compile(format)
    }

    /// A fresh matcher for one sequence.
    pub fn start(&self) -> SequenceConstraint {
        SequenceConstraint {
            matcher: self.inner.start.deep_clone(),
            compiled: self.inner.clone(),
            last: None,
        }
    }
}

/// One sequence's place in the grammar.
pub struct SequenceConstraint {
    matcher: Matcher,
    compiled: Arc<Compiled>,
    /// The previous mask: an equal one is shared rather than stored again (inside a JSON
    /// string most positions allow the same tokens).
    last: Option<VocabMask>,
}

impl SequenceConstraint {
    /// The tokens allowed next: the grammar's, every EOS id where the output may end, and only
    /// the EOS ids once the output is complete.
    pub fn allowed(&mut self) -> Result<VocabMask> {
        let mut mask = self.matcher.compute_mask_or_eos().map_err(grammar_error)?;
        let eos_allowed = self.compiled.eos_ids.iter().any(|&t| mask.is_allowed(t));
        if eos_allowed {
            self.compiled.eos_ids.iter().for_each(|&t| mask.allow_token(t));
        }
        let words = mask.as_slice();
        let needed = self.compiled.vocab_size.div_ceil(32);
        let mut out = words[..needed.min(words.len())].to_vec();
        out.resize(needed, 0);
        if out.iter().all(|&w| w == 0) {
            return Err(grammar_error("the grammar allows no token here"));
        }
        if let Some(last) = self.last.as_ref().filter(|last| ***last == *out) {
            return Ok(last.clone());
        }
        let mask: VocabMask = out.into();
        self.last = Some(mask.clone());
        Ok(mask)
    }

    /// Moves the grammar past `token` (one the last [`SequenceConstraint::allowed`] allowed).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        if self.compiled.eos_ids.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(grammar_error)
    }
}

/// Pushes the logits of tokens `mask` rules out to minus infinity (probability 0).
pub fn mask_logits(logits: &mut [f32], mask: &[u32]) {
    for (t, z) in logits.iter_mut().enumerate() {
        if !mask_allows(mask, t) {
            *z = f32::NEG_INFINITY;
        }
    }
}
