//! OpenAI's request bodies of `/v1/chat/completions` and `/v1/completions`, checked into the
//! sampling settings an inference worker runs. Every field OpenAI documents is accepted; those
//! Verity does not implement answer 400 naming the field when set to anything but their default.

use crate::api::error::ApiError;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::ToSchema;
use verity_core::sampling;
use verity_worker::inference::request::GenerationParams;
use verity_worker::ChatMessage;

/// Most choices per request.
pub const MAX_N: u32 = 16;
/// Most alternatives per token in `top_logprobs` (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Up to four stop strings.
    Many(Vec<String>),
}

/// A part of a message's content (only `text` parts are supported).
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    /// `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One input message.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct InputMessage {
    /// `system`, `developer` (treated as `system`), `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: Option<MessageContent>,
    /// Ignored.
    pub name: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and no choices).
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields shared by both endpoints.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct Sampling {
    /// 0 to 2 (default 1); 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1] (default 1).
    pub top_p: Option<f32>,
    /// Longest completion (default: up to the model's context).
    pub max_tokens: Option<i64>,
    /// Choices to sample (1 to 16, default 1).
    pub n: Option<i64>,
    /// Up to four strings that end a completion (not included in it).
    pub stop: Option<Stop>,
    /// Same seed, same request, same model: same text (default: random).
    pub seed: Option<i64>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage`.
    pub stream_options: Option<StreamOptions>,
    /// Token id (as a string) → bias in [-100, 100] added to its logit.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Not supported (must be 0).
    pub presence_penalty: Option<f32>,
    /// Not supported (must be 0).
    pub frequency_penalty: Option<f32>,
    /// Ignored.
    pub user: Option<String>,
}

/// Body of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    /// A base model, a job's `fine_tuned_model`, or a `fine_tuned_model_checkpoint`.
    pub model: String,
    /// The conversation; rendered with the model's chat template.
    pub messages: Vec<InputMessage>,
    /// Sampling settings.
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Same as `max_tokens` (wins when both are given).
    pub max_completion_tokens: Option<i64>,
    /// Return the log-probability of each output token.
    pub logprobs: Option<bool>,
    /// Alternatives per token (0 to 20; needs `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Not supported.
    #[schema(value_type = Option<Object>)]
    pub tools: Option<Value>,
    /// Not supported.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// OpenAI's `text`, `json_object` or `json_schema` (checked; not yet enforced by
    /// constrained decoding, see docs/inference.md).
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
}

/// `prompt`: a string or a list holding one string.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptText {
    /// The prompt.
    One(String),
    /// A list of prompts (exactly one is supported).
    Many(Vec<String>),
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct CompletionRequest {
    /// A base model, a job's `fine_tuned_model`, or a `fine_tuned_model_checkpoint`.
    pub model: String,
    /// The text to continue (no chat template).
    pub prompt: PromptText,
    /// Sampling settings.
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Alternatives per token to return (0 to 20; with the sampled token's).
    pub logprobs: Option<i64>,
    /// Not supported (must be false).
    pub echo: Option<bool>,
    /// Not supported (must be 1 or equal to `n`).
    pub best_of: Option<i64>,
    /// Not supported.
    pub suffix: Option<String>,
}

/// What a request asks for once checked.
#[derive(Debug, Clone)]
pub struct Checked {
    /// Sampling settings for the worker.
    pub params: GenerationParams,
    /// Stream server-sent events.
    pub stream: bool,
    /// Send the usage chunk at the end of a stream.
    pub include_usage: bool,
    /// The request field that set the completion budget (`max_tokens` or
    /// `max_completion_tokens`), named by errors about it.
    pub max_tokens_field: &'static str,
}

fn unsupported(param: &str) -> ApiError {
    ApiError::invalid(param, format!("{param} is not supported by Verity's inference"))
}

impl Sampling {
    /// Checks the shared fields; `max_tokens` and `logprobs` come from the endpoint.
    fn check(&self, max_tokens: Option<i64>, logprobs: Option<usize>) -> Result<Checked, ApiError> {
        let temperature = self.temperature.unwrap_or(1.0);
        sampling::check_temperature(temperature.into())
            .map_err(|m| ApiError::invalid("temperature", m))?;
        let top_p = self.top_p.unwrap_or(1.0);
        sampling::check_top_p(top_p.into()).map_err(|m| ApiError::invalid("top_p", m))?;
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N as i64).contains(&n) {
            return Err(ApiError::invalid("n", format!("must be between 1 and {MAX_N}")));
        }
        let max_tokens = match max_tokens {
            Some(m) if m < 1 => return Err(ApiError::invalid("max_tokens", "must be at least 1")),
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            None => None,
        };
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(list)) => list.clone(),
        };
        sampling::check_stop(&stop).map_err(|m| ApiError::invalid("stop", m))?;
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return Err(unsupported(param));
            }
        }
        let mut logit_bias = BTreeMap::new();
        for (id, bias) in self.logit_bias.iter().flatten() {
            let id: u32 =
                id.parse().map_err(|_| ApiError::invalid("logit_bias", "keys are token ids"))?;
            if !(-100.0..=100.0).contains(bias) {
                return Err(ApiError::invalid("logit_bias", "biases are between -100 and 100"));
            }
            logit_bias.insert(id, *bias);
        }
        let stream = self.stream.unwrap_or(false);
        let include_usage = self.stream_options.as_ref().is_some_and(|o| o.include_usage);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid("stream_options", "only with stream: true"));
        }
        Ok(Checked {
            params: GenerationParams {
                n: n as usize,
                temperature,
                top_p,
                max_tokens,
                stop,
                seed: self.seed.map_or_else(rand::random, |s| s as u64),
                logprobs,
                logit_bias,
                ..GenerationParams::default()
            },
            stream,
            include_usage,
            max_tokens_field: "max_tokens",
        })
    }
}

impl ChatCompletionRequest {
    /// The messages for the chat template and the checked settings.
    pub fn check(&self) -> Result<(Vec<ChatMessage>, Checked), ApiError> {
        for (param, set) in [
            ("tools", self.tools.as_ref().is_some_and(|t| !t.is_null())),
            ("tool_choice", self.tool_choice.as_ref().is_some_and(|t| !t.is_null() && t != "none")),
        ] {
            if set {
                return Err(unsupported(param));
            }
        }
        let response_format = match self.response_format.as_ref().filter(|f| !f.is_null()) {
            Some(format) => {
                let format: verity_core::response_format::ResponseFormat =
                    serde_json::from_value(format.clone())
                        .map_err(|e| ApiError::invalid("response_format", e.to_string()))?;
                crate::api::jobs::validate::validate_response_format("response_format", &format)?;
                Some(format)
            }
            None => None,
        };
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "at least one message"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant") => r,
                other => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!("{other:?} is not supported (system, developer, user, assistant)"),
                    ))
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), &part.text) {
                            ("text", Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    format!("messages[{i}].content"),
                                    "only text content parts are supported",
                                ))
                            }
                        }
                    }
                    text
                }
            };
            messages.push(ChatMessage::new(role, content));
        }
        let top = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(k)) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                return Err(ApiError::invalid("top_logprobs", "must be between 0 and 20"))
            }
            (false, Some(k)) if k > 0 => {
                return Err(ApiError::invalid("top_logprobs", "needs logprobs: true"))
            }
            (true, k) => Some(k.unwrap_or(0) as usize),
            (false, _) => None,
        };
        let max_tokens = self.max_completion_tokens.or(self.sampling.max_tokens);
        let field = if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let mut checked = self.sampling.check(max_tokens, top).map_err(|mut e| {
            if e.param.as_deref() == Some("max_tokens") {
                e.param = Some(field.into());
            }
            e
        })?;
        checked.max_tokens_field = field;
        checked.params.response_format = response_format;
        Ok((messages, checked))
    }
}

impl CompletionRequest {
    /// The prompt and the checked settings.
    pub fn check(&self) -> Result<(String, Checked), ApiError> {
        if self.echo.unwrap_or(false) {
            return Err(unsupported("echo"));
        }
        if self.suffix.is_some() {
            return Err(unsupported("suffix"));
        }
        if self.best_of.is_some_and(|b| b != 1 && Some(b) != self.sampling.n) {
            return Err(unsupported("best_of"));
        }
        let prompt = match &self.prompt {
            PromptText::One(p) => p.clone(),
            PromptText::Many(list) if list.len() == 1 => list[0].clone(),
            PromptText::Many(_) => {
                return Err(ApiError::invalid("prompt", "exactly one prompt per request"))
            }
        };
        let top = match self.logprobs {
            Some(k) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                return Err(ApiError::invalid("logprobs", "must be between 0 and 20"))
            }
            Some(k) => Some(k as usize),
            None => None,
        };
        // OpenAI's default for this endpoint.
        Ok((prompt, self.sampling.check(self.sampling.max_tokens.or(Some(16)), top)?))
    }
}
