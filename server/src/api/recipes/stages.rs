//! One stage's body as a request: read into the request type its own endpoint takes, checked by
//! that endpoint's checks (at creation, with stand-ins for what earlier stages have yet to make),
//! and enqueued under the id the recipe planned for it.

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::jobs::CreateJobRequest;
use crate::api::sampling_runs::difficulty_profiles::{self, CreateDifficultyProfileRequest};
use crate::api::sampling_runs::evaluations::{self, CreateEvaluationRequest};
use crate::api::sampling_runs::rejection_sampling::{self, CreateRejectionSamplingRequest};
use crate::api::state::AppState;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use verity_core::recipes::{Guard, StageKind};

/// Reads `body` as a `T`; a field of the wrong shape is a 400 naming its path in the body.
fn read<T: DeserializeOwned>(body: Map<String, Value>) -> ApiResult<T> {
    serde_path_to_error::deserialize(Value::Object(body)).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { "body".to_string() } else { path };
        ApiError::invalid(param, e.inner().to_string())
    })
}

/// Rewrites `error`'s parameter as the path from the recipe's root (`stages[2].evaluation.file`)
/// and says which stage it is about.
pub fn under_stage(mut error: ApiError, position: usize, name: &str, kind: StageKind) -> ApiError {
    let at = format!("stages[{position}].{}", kind.as_str());
    error.param = Some(match error.param.take() {
        Some(param) if param != "body" => format!("{at}.{param}"),
        _ => at,
    });
    error.message = format!("stage {name:?}: {}", error.message);
    error
}

/// Checks a stage body as its endpoint would, except the rows of the files in `deferred` (fields
/// whose file an earlier stage has yet to write). Nothing is written.
pub async fn check(
    state: &AppState,
    principal: &Principal,
    kind: StageKind,
    body: Map<String, Value>,
    deferred: &[String],
) -> ApiResult<()> {
    match kind {
        StageKind::FineTuningJob => {
            let request: CreateJobRequest = read(body)?;
            crate::api::jobs::check_request_deferring(state, principal, &request, deferred).await
        }
        StageKind::RejectionSampling => {
            let request: CreateRejectionSamplingRequest = read(body)?;
            rejection_sampling::prepare(state, principal, request).await.map(|_| ())
        }
        StageKind::Evaluation => {
            let request: CreateEvaluationRequest = read(body)?;
            evaluations::prepare(state, principal, request).await.map(|_| ())
        }
    }
}

/// Checks a stage body with everything filled in and queues it as `id`.
pub async fn enqueue(
    state: &AppState,
    principal: &Principal,
    kind: StageKind,
    body: Map<String, Value>,
    id: &str,
) -> ApiResult<()> {
    let id = Some(id.to_string());
    match kind {
        StageKind::FineTuningJob => {
            let request: CreateJobRequest = read(body)?;
            crate::api::jobs::create(state, principal, request, id).await.map(|_| ())
        }
        StageKind::RejectionSampling => {
            let request: CreateRejectionSamplingRequest = read(body)?;
            let run = rejection_sampling::prepare(state, principal, request).await?;
            run.enqueue(state, principal, id).await.map(|_| ())
        }
        StageKind::Evaluation => {
            let request: CreateEvaluationRequest = read(body)?;
            let run = evaluations::prepare(state, principal, request).await?;
            run.enqueue(state, principal, id).await.map(|_| ())
        }
    }
}

/// Queues, as `id`, the difficulty profile that guards a reinforcement stage: its filled-in body's
/// training file sampled on the model it starts from, `guard.prompts` prompts, no step measured.
pub async fn enqueue_guard(
    state: &AppState,
    principal: &Principal,
    body: Map<String, Value>,
    guard: &Guard,
    id: &str,
) -> ApiResult<()> {
    let job: CreateJobRequest = read(body)?;
    let request = CreateDifficultyProfileRequest {
        job: Some(job),
        prompts: Some(guard.prompts),
        k: None,
        measure_step: Some(false),
        seed: None,
    };
    let run = difficulty_profiles::prepare(state, principal, request).await.map_err(|mut e| {
        // The stage's body is `job` in the profile's request.
        e.param = e.param.map(|p| p.strip_prefix("job.").map(str::to_string).unwrap_or(p));
        e
    })?;
    run.enqueue(state, principal, Some(id.to_string())).await.map(|_| ())
}
