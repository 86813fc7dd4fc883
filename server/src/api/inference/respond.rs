//! OpenAI's answers built from a worker's events: one `chat.completion` / `text_completion`
//! object, or server-sent chunks in the same format OpenAI streams.

use super::forward::Forwarded;
use super::openai::Checked;
use crate::api::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;
use verity_worker::inference::request::{GenerationEvent, StopReason, TokenLogprob};

/// Which endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct Usage {
    /// Tokens of the prompt (after the chat template).
    pub prompt_tokens: usize,
    /// Tokens generated, all choices together.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

/// The assistant's message.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text.
    pub content: String,
    /// Always null.
    pub refusal: Option<String>,
}

/// One choice of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    /// Its index.
    pub index: usize,
    /// The message.
    pub message: AssistantMessage,
    /// `{"content": [{token, logprob, bytes, top_logprobs}]}` when asked for.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    /// `stop` (end of sequence or a stop string) or `length`.
    pub finish_reason: String,
}

/// OpenAI's `chat.completion`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// The model as requested.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// Always null.
    pub system_fingerprint: Option<String>,
}

/// One choice of a text completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct TextChoice {
    /// Its index.
    pub index: usize,
    /// The generated text.
    pub text: String,
    /// `{tokens, token_logprobs, top_logprobs, text_offset}` when asked for.
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    /// `stop` or `length`.
    pub finish_reason: String,
}

/// OpenAI's `text_completion`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TextCompletion {
    /// `cmpl-…`.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// The model as requested.
    pub model: String,
    /// The choices.
    pub choices: Vec<TextChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// The answer being built for one request.
pub struct Reply {
    shape: Shape,
    id: String,
    created: i64,
    model: String,
    checked: Checked,
}

fn reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Stop => "stop",
        StopReason::Length => "length",
    }
}

fn broke_off(message: &str) -> ApiError {
    let mut e = ApiError::internal("inference", message);
    e.status = StatusCode::BAD_GATEWAY;
    e.message = format!("the generation failed: {message}");
    e
}

/// Chat `logprobs.content` entries.
fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|a| entry(&a.token, a.logprob)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Legacy completion `logprobs`, offsets counted from `offset` bytes into the text.
fn text_logprobs(tokens: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(offset);
        offset += t.token.len();
    }
    json!({
        "tokens": tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| t.top.iter().map(|a| (a.token.clone(), json!(a.logprob))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Vec<TokenLogprob>,
    finish: Option<StopReason>,
    tokens: usize,
}

impl Reply {
    /// A reply in `shape` for `model`.
    pub fn new(shape: Shape, model: String, checked: Checked) -> Reply {
        let prefix = if shape == Shape::Chat { "chatcmpl" } else { "cmpl" };
        Reply {
            shape,
            id: format!("{prefix}-{}", uuid::Uuid::new_v4().simple()),
            created: chrono::Utc::now().timestamp(),
            model,
            checked,
        }
    }

    /// Whether the client asked for server-sent events.
    pub fn stream(&self) -> bool {
        self.checked.stream
    }

    fn usage(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }

    /// Reads every event and answers one JSON object.
    pub async fn collect(self, mut forwarded: Forwarded) -> ApiResult<Response> {
        let n = self.checked.params.n;
        let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
        while let Some(event) = forwarded.events.next().await {
            match event {
                GenerationEvent::Delta { index, text, logprobs } => {
                    if let Some(c) = choices.get_mut(index) {
                        c.text.push_str(&text);
                        c.logprobs.extend(logprobs);
                    }
                }
                GenerationEvent::Finished { index, reason, completion_tokens } => {
                    if let Some(c) = choices.get_mut(index) {
                        c.finish = Some(reason);
                        c.tokens = completion_tokens;
                    }
                }
                GenerationEvent::Failed { message } => return Err(broke_off(&message)),
                GenerationEvent::Refused { param, message } => {
                    return Err(ApiError::invalid(param, message))
                }
                GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs { .. } => {}
            }
        }
        if choices.iter().any(|c| c.finish.is_none()) {
            return Err(broke_off("the inference worker closed the stream early"));
        }
        let usage = Self::usage(forwarded.prompt_tokens, choices.iter().map(|c| c.tokens).sum());
        let wants_logprobs = self.checked.params.logprobs.is_some();
        let finish = |c: &Choice| reason(c.finish.unwrap_or(StopReason::Length)).to_string();
        Ok(match self.shape {
            Shape::Chat => Json(ChatCompletion {
                id: self.id,
                object: "chat.completion",
                created: self.created,
                model: self.model,
                choices: choices
                    .into_iter()
                    .enumerate()
                    .map(|(index, c)| ChatChoice {
                        index,
                        finish_reason: finish(&c),
                        logprobs: wants_logprobs.then(|| chat_logprobs(&c.logprobs)),
                        message: AssistantMessage {
                            role: "assistant",
                            content: c.text,
                            refusal: None,
                        },
                    })
                    .collect(),
                usage,
                system_fingerprint: None,
            })
            .into_response(),
            Shape::Text => Json(TextCompletion {
                id: self.id,
                object: "text_completion",
                created: self.created,
                model: self.model,
                choices: choices
                    .into_iter()
                    .enumerate()
                    .map(|(index, c)| TextChoice {
                        index,
                        finish_reason: finish(&c),
                        logprobs: wants_logprobs.then(|| text_logprobs(&c.logprobs, 0)),
                        text: c.text,
                    })
                    .collect(),
                usage,
            })
            .into_response(),
        })
    }

    /// One chunk object around `choices`.
    fn chunk(&self, choices: Value, usage: Option<Usage>) -> Value {
        let object =
            if self.shape == Shape::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut chunk = json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": choices,
        });
        if self.shape == Shape::Chat {
            chunk["system_fingerprint"] = Value::Null;
        }
        if self.checked.include_usage {
            chunk["usage"] = json!(usage);
        }
        chunk
    }

    /// The chunk of one event (`None`: nothing to send).
    fn event_chunk(&self, event: &GenerationEvent, offsets: &mut [usize]) -> Option<Value> {
        let wants_logprobs = self.checked.params.logprobs.is_some();
        let choice = match (self.shape, event) {
            (Shape::Chat, GenerationEvent::Delta { index, text, logprobs }) => json!({
                "index": index, "delta": {"content": text},
                "logprobs": if wants_logprobs { chat_logprobs(logprobs) } else { Value::Null },
                "finish_reason": null,
            }),
            (Shape::Text, GenerationEvent::Delta { index, text, logprobs }) => {
                let offset = offsets.get(*index).copied().unwrap_or(0);
                if let Some(o) = offsets.get_mut(*index) {
                    *o += text.len();
                }
                json!({
                    "index": index, "text": text,
                    "logprobs": if wants_logprobs { text_logprobs(logprobs, offset) } else { Value::Null },
                    "finish_reason": null,
                })
            }
            (Shape::Chat, GenerationEvent::Finished { index, reason: r, .. }) => {
                json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason(*r)})
            }
            (Shape::Text, GenerationEvent::Finished { index, reason: r, .. }) => {
                json!({"index": index, "text": "", "logprobs": null, "finish_reason": reason(*r)})
            }
            _ => return None,
        };
        Some(self.chunk(json!([choice]), None))
    }

    /// Server-sent events: a role chunk per choice (chat), a chunk per delta and per end, the
    /// usage chunk when asked for, then `[DONE]`. Dropping the response (the client went away)
    /// drops the worker's stream, which stops the generation.
    pub fn stream_response(self, forwarded: Forwarded) -> Response {
        let n = self.checked.params.n;
        let data =
            |v: &Value| Ok::<_, std::convert::Infallible>(Event::default().data(v.to_string()));
        let mut opening = Vec::new();
        if self.shape == Shape::Chat {
            for index in 0..n {
                let choice = json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                opening.push(data(&self.chunk(json!([choice]), None)));
            }
        }
        let prompt_tokens = forwarded.prompt_tokens;
        let state = (self, forwarded.events, vec![0usize; n], 0usize, false);
        let body = futures::stream::unfold(
            state,
            move |(reply, mut events, mut offsets, mut tokens, ended)| async move {
                if ended {
                    return None;
                }
                loop {
                    match events.next().await {
                        Some(GenerationEvent::Failed { message }) => {
                            tracing::error!(%message, "inference stream failed");
                            let error = json!({"error": {"message": format!("the generation failed: {message}"), "type": "server_error", "param": null, "code": null}});
                            return Some((
                                vec![data(&error)],
                                (reply, events, offsets, tokens, true),
                            ));
                        }
                        Some(GenerationEvent::Refused { param, message }) => {
                            let error = json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": null}});
                            return Some((
                                vec![data(&error)],
                                (reply, events, offsets, tokens, true),
                            ));
                        }
                        Some(event) => {
                            if let GenerationEvent::Finished { completion_tokens, .. } = &event {
                                tokens += completion_tokens;
                            }
                            if let Some(chunk) = reply.event_chunk(&event, &mut offsets) {
                                return Some((
                                    vec![data(&chunk)],
                                    (reply, events, offsets, tokens, false),
                                ));
                            }
                        }
                        None => {
                            let mut out = Vec::new();
                            if reply.checked.include_usage {
                                out.push(data(
                                    &reply
                                        .chunk(json!([]), Some(Self::usage(prompt_tokens, tokens))),
                                ));
                            }
                            out.push(Ok(Event::default().data("[DONE]")));
                            return Some((out, (reply, events, offsets, tokens, true)));
                        }
                    }
                }
            },
        );
        let events = futures::stream::iter(opening).chain(body.flat_map(futures::stream::iter));
        Sse::new(events).into_response()
    }
}
