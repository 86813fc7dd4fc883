//! The answer of `graders/run` in OpenAI's shape, field for field (`reward`, `metadata.{name,
//! type, errors, execution_time, scores, token_usage, sampled_model_name}`, `sub_rewards`,
//! `model_grader_token_usage_per_model`), with Verity's detail under `metadata.verity`.

use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;
use verity_verifiers::{ErrorKind, GradeError, GradeResult, Grader};

/// OpenAI's error flags of a grading: every flag present, all false on success.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct GraderErrors {
    /// A `multi` grader's formula could not be evaluated.
    pub formula_parse_error: bool,
    /// The sample could not be read as the grader needs (`sample.output_json` of a completion
    /// that is not JSON).
    pub sample_parse_error: bool,
    /// Never set by Verity (OpenAI's multi-turn observations).
    pub truncated_observation_error: bool,
    /// The grader ran past its time limit.
    pub unresponsive_reward_error: bool,
    /// A template named a field the item or sample lacks.
    pub invalid_variable_error: bool,
    /// Any other failure (see `metadata.verity.error`).
    pub other_error: bool,
    /// The sandbox running a python or code grader failed.
    pub python_grader_server_error: bool,
    /// What kind of sandbox failure.
    pub python_grader_server_error_type: Option<String>,
    /// The python grader's own code failed.
    pub python_grader_runtime_error: bool,
    /// How it failed.
    pub python_grader_runtime_error_details: Option<String>,
    /// The judge of a model grader gave no reply.
    pub model_grader_server_error: bool,
    /// Never set by Verity (a judge's refusal reads as an unparsable reply).
    pub model_grader_refusal_error: bool,
    /// The judge replied without a score or label in the grader's terms.
    pub model_grader_parse_error: bool,
    /// Why the judge gave no reply.
    pub model_grader_server_error_details: Option<String>,
}

impl GraderErrors {
    /// The flags of a grading result (one per failure class, see [`ErrorKind`]).
    pub fn of(result: &GradeResult) -> Self {
        let mut errors = GraderErrors {
            sample_parse_error: result.sample_parse_error.is_some(),
            ..GraderErrors::default()
        };
        let Some(GradeError { kind, message }) = &result.error else { return errors };
        let details = Some(message.clone());
        match kind {
            ErrorKind::MissingField => errors.invalid_variable_error = true,
            ErrorKind::Formula => errors.formula_parse_error = true,
            ErrorKind::Timeout => errors.unresponsive_reward_error = true,
            ErrorKind::Sandbox => {
                errors.python_grader_server_error = true;
                errors.python_grader_server_error_type = Some("sandbox".into());
            }
            ErrorKind::GraderCode => {
                errors.python_grader_runtime_error = true;
                errors.python_grader_runtime_error_details = details;
            }
            ErrorKind::Judge | ErrorKind::JudgeUnavailable => {
                errors.model_grader_server_error = true;
                errors.model_grader_server_error_details = details;
            }
            ErrorKind::JudgeReply => errors.model_grader_parse_error = true,
            ErrorKind::BadItem | ErrorKind::Embedding | ErrorKind::Internal => {
                errors.other_error = true
            }
        }
        errors
    }
}

/// Verity's detail of a grading, beside OpenAI's fields.
#[derive(Debug, Serialize, ToSchema)]
pub struct VerityDetail {
    /// Why this score.
    pub reason: String,
    /// The infrastructure error, when the grading failed: `{kind, message}`.
    #[schema(value_type = Option<Object>)]
    pub error: Option<GradeError>,
    /// Why the sample could not be read, when it could not (`sample_parse_error`).
    pub sample_parse_error: Option<String>,
    /// Every component score (a multi's graders and their own sub-scores, checks, tests).
    pub sub_scores: BTreeMap<String, f64>,
}

/// `metadata` of a grader run.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunMetadata {
    /// The grader's name (`""` when it has none).
    pub name: String,
    /// The grader's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Every error flag.
    pub errors: GraderErrors,
    /// Seconds the grading took.
    pub execution_time: f64,
    /// The score of each sub-grader of a `multi` (empty for the other graders).
    pub scores: BTreeMap<String, f64>,
    /// Tokens the judges of model graders spent (prompt and reply; `null` without a judge).
    pub token_usage: Option<u64>,
    /// The judge model of a model grader (its first, for a `multi` holding several).
    pub sampled_model_name: Option<String>,
    /// Verity's detail.
    pub verity: VerityDetail,
}

/// Result of a grader run, in OpenAI's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunGraderResponse {
    /// The score in [0, 1].
    pub reward: f64,
    /// Details, in OpenAI's fields, and Verity's under `verity`.
    pub metadata: RunMetadata,
    /// Named component scores: a multi's sub-graders (and their own sub-scores, dotted), a
    /// grader's checks.
    pub sub_rewards: BTreeMap<String, f64>,
    /// Judge tokens per judge model: `{prompt_tokens, completion_tokens, total_tokens}` (empty
    /// without a model grader).
    #[schema(value_type = Object)]
    pub model_grader_token_usage_per_model: BTreeMap<String, serde_json::Value>,
}

impl RunGraderResponse {
    /// The answer for `result`, graded by `grader` in `execution_time` seconds.
    pub fn of(grader: &Grader, result: GradeResult, execution_time: f64) -> Self {
        let spec = grader.spec();
        let scores = match spec.kind() {
            "multi" => result
                .sub_scores
                .iter()
                .filter(|(k, _)| !k.contains('.'))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            _ => BTreeMap::new(),
        };
        let usage = &result.judge_usage;
        let token_usage = (!usage.is_empty()).then(|| usage.values().map(|u| u.total()).sum());
        let per_model = usage
            .iter()
            .map(|(model, u)| {
                let counts = serde_json::json!({"prompt_tokens": u.prompt_tokens,
                    "completion_tokens": u.completion_tokens, "total_tokens": u.total()});
                (model.clone(), counts)
            })
            .collect();
        RunGraderResponse {
            reward: result.score,
            metadata: RunMetadata {
                name: spec.name().unwrap_or_default().to_string(),
                kind: spec.kind().to_string(),
                errors: GraderErrors::of(&result),
                execution_time,
                scores,
                token_usage,
                sampled_model_name: grader.judge_models().into_iter().next().map(|(_, m)| m),
                verity: VerityDetail {
                    reason: result.reason,
                    error: result.error,
                    sample_parse_error: result.sample_parse_error,
                    sub_scores: result.sub_scores.clone(),
                },
            },
            sub_rewards: result.sub_scores,
            model_grader_token_usage_per_model: per_model,
        }
    }
}
