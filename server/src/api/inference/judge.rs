//! The judges of model graders graded in the API process (`graders/run`, the probes of
//! `graders/validate`, pre-flight): asked through a live inference worker, the engine that
//! serves `/v1/chat/completions`, so the API process never loads a judge model (its memory stays
//! bounded and a judge shares the weights the playground already loaded). Judges routed to an
//! endpoint (`VERITY_JUDGE_ENDPOINTS`) are asked there, as on a training worker.

use super::forward::{forward, no_worker};
use crate::api::error::ApiResult;
use crate::api::state::AppState;
use crate::inference::registry::FRESH_SECS;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;
use verity_verifiers::{Grader, Judge, JudgeError, JudgePrompt, JudgeReply, TokenUsage};
use verity_worker::inference::request::{
    GenerationEvent, GenerationParams, GenerationRequest, ModelSource, PromptInput,
};
use verity_worker::judge::local::chat_messages;

/// The judge answering every model `grader` (at JSON path `param`) names for org `org_id`:
/// a 400 naming the grader's `model` field when the org has no such model, 503 when no inference
/// worker is live to ask.
pub async fn judge_for(
    state: &AppState,
    org_id: Uuid,
    param: &str,
    grader: &Grader,
) -> ApiResult<Arc<dyn Judge>> {
    let mut models = BTreeMap::new();
    for (path, name) in grader.judge_models() {
        if state.judges.settings().endpoint(&name).is_some() || models.contains_key(&name) {
            continue;
        }
        let source = super::source_at(state, org_id, &format!("{param}.{path}"), &name).await?;
        models.insert(name, source);
    }
    if !models.is_empty()
        && verity_core::inference::live_inference_workers(&state.pool, FRESH_SECS).await?.is_empty()
    {
        let mut e = no_worker();
        e.message =
            format!("a model grader's judge is asked through an inference worker: {}", e.message);
        return Err(e);
    }
    let runtime = tokio::runtime::Handle::current();
    let cap = Duration::from_millis(state.limits.grader_run_max_ms);
    let asked = WorkerJudge { state: state.clone(), models, runtime, cap };
    Ok(state.judges.route(grader, Box::new(asked)))
}

/// Judge models asked through inference workers, one generation per prompt, all at once (the
/// worker batches them), within `cap` in all (`VERITY_GRADER_RUN_MAX_MS`, the cap of every
/// grading in the API process).
struct WorkerJudge {
    state: AppState,
    models: BTreeMap<String, ModelSource>,
    runtime: tokio::runtime::Handle,
    cap: Duration,
}

impl Judge for WorkerJudge {
    // Called on a blocking thread (a grading never runs on the async threads). Past the cap the
    // generations are dropped, which stops them on the worker.
    fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
        let asked = futures::future::join_all(prompts.iter().map(|p| self.ask(p)));
        match self.runtime.block_on(tokio::time::timeout(self.cap, asked)) {
            Ok(replies) => replies,
            Err(_) => {
                let ms = self.cap.as_millis();
                let late =
                    format!("the judge gave no reply within {ms} ms (VERITY_GRADER_RUN_MAX_MS)");
                prompts.iter().map(|_| Err(JudgeError::Failed(late.clone()))).collect()
            }
        }
    }
}

impl WorkerJudge {
    /// The reply of one prompt, sampled as a training worker's judge samples it (the same
    /// rendering, per-prompt seed and reply budget cut to the context).
    async fn ask(&self, prompt: &JudgePrompt) -> Result<JudgeReply, JudgeError> {
        let model = self
            .models
            .get(&prompt.model)
            .ok_or_else(|| JudgeError::UnknownModel(prompt.model.clone()))?;
        let request = GenerationRequest {
            model: model.clone(),
            prompt: PromptInput::Judge(chat_messages(prompt)),
            params: GenerationParams::from(prompt),
        };
        let forwarded = forward(&self.state, &request).await.map_err(|e| {
            if e.status.is_client_error() {
                JudgeError::Failed(e.message)
            } else {
                JudgeError::Unavailable(e.message)
            }
        })?;
        let mut events = forwarded.events;
        let mut text = String::new();
        while let Some(event) = events.next().await {
            match event {
                GenerationEvent::Delta { text: more, .. } => text.push_str(&more),
                GenerationEvent::Finished { completion_tokens, .. } => {
                    let usage = TokenUsage {
                        prompt_tokens: forwarded.prompt_tokens as u64,
                        completion_tokens: completion_tokens as u64,
                    };
                    return Ok(JudgeReply { text, usage });
                }
                GenerationEvent::Failed { message } => return Err(JudgeError::Failed(message)),
                GenerationEvent::Refused { param, message } => {
                    return Err(JudgeError::Failed(format!("{param}: {message}")))
                }
                GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs { .. } => {}
            }
        }
        Err(JudgeError::Unavailable("the inference worker ended the reply early".into()))
    }
}
