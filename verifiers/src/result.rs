//! The outcome of one grading: a score in [0, 1], a reason, sub-scores and an infrastructure error.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Score at or above which a graded completion counts as correct (accuracy, pass@k, a kept
/// rejection sample, a solved prompt of a difficulty profile).
pub const SUCCESS_THRESHOLD: f64 = 1.0 - 1e-9;

/// Why a grading could not be done (never a wrong answer; counted and reported upstream).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A template named a field the item or sample lacks.
    MissingField,
    /// The sandbox could not start or crashed outside the graded program.
    Sandbox,
    /// The grader itself ran past its time limit.
    Timeout,
    /// The user's grader code failed (exception, non-numeric result).
    GraderCode,
    /// The item holds data the grader cannot use (e.g. malformed cases).
    BadItem,
    /// A formula could not be evaluated (division by zero, NaN).
    Formula,
    /// The embedding model of a `cosine` grader is not configured or failed to run.
    Embedding,
    /// The judge model of a model grader gave no reply (not available, failed, outage).
    Judge,
    /// The judge is down (endpoint unreachable after retries): an outage, not a verdict.
    JudgeUnavailable,
    /// The judge replied, but its reply holds no score or label in the grader's terms.
    JudgeReply,
    /// A bug in Verity itself (a grading panicked); never expected.
    Internal,
}

/// An infrastructure error attached to a grading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GradeError {
    /// The class of failure.
    pub kind: ErrorKind,
    /// A human-readable explanation.
    pub message: String,
}

/// The result of one grading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GradeResult {
    /// The reward, always in [0, 1] (0 when `error` is set).
    pub score: f64,
    /// Why this score.
    pub reason: String,
    /// Named component scores (graders of a `multi`, checks, tests).
    pub sub_scores: BTreeMap<String, f64>,
    /// `null` unless the grading itself failed.
    pub error: Option<GradeError>,
    /// Set when the grader read `sample.output_json` and the completion is not valid JSON:
    /// the sample's fault, scored 0 (not an infrastructure error), OpenAI's `sample_parse_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_parse_error: Option<String>,
    /// Tokens the judges of model graders spent on this grading, per judge model.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub judge_usage: BTreeMap<String, crate::judge::TokenUsage>,
}

impl GradeResult {
    /// A successful grading; the score is clamped into [0, 1].
    pub fn scored(score: f64, reason: impl Into<String>) -> Self {
        let score = if score.is_nan() { 0.0 } else { score.clamp(0.0, 1.0) };
        Self {
            score,
            reason: reason.into(),
            sub_scores: BTreeMap::new(),
            error: None,
            sample_parse_error: None,
            judge_usage: BTreeMap::new(),
        }
    }

    /// A pass (1) or fail (0).
    pub fn pass_fail(passed: bool, reason: impl Into<String>) -> Self {
        Self::scored(if passed { 1.0 } else { 0.0 }, reason)
    }

    /// A failed grading (score 0, `error` set).
    pub fn failed(kind: ErrorKind, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            score: 0.0,
            reason: format!("grading failed: {message}"),
            sub_scores: BTreeMap::new(),
            error: Some(GradeError { kind, message }),
            sample_parse_error: None,
            judge_usage: BTreeMap::new(),
        }
    }

    /// A sample that cannot be read as the grader needs (its completion is not the JSON
    /// `sample.output_json` asks for): score 0, `sample_parse_error` set, not an error.
    pub fn unparsable_sample(message: impl Into<String>) -> Self {
        let message = message.into();
        Self { sample_parse_error: Some(message.clone()), ..Self::scored(0.0, message) }
    }

    /// Adds named sub-scores.
    pub fn with_sub_scores(mut self, sub_scores: BTreeMap<String, f64>) -> Self {
        self.sub_scores = sub_scores;
        self
    }

    /// Adds the tokens judge `model` spent (a model grader's reply, or a sub-grader's).
    pub fn with_judge_usage(mut self, model: &str, usage: crate::judge::TokenUsage) -> Self {
        self.judge_usage.entry(model.to_string()).or_default().add(usage);
        self
    }

    /// Adds every judge's tokens of `other` (a sub-grader's result) to these.
    pub fn with_usage_of(mut self, other: &BTreeMap<String, crate::judge::TokenUsage>) -> Self {
        crate::judge::merge_usage(&mut self.judge_usage, other);
        self
    }

    /// Whether the grading itself failed.
    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }
}
