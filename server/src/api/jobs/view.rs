//! OpenAI-shaped JSON objects of jobs, events and checkpoints.

use serde::Serialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;
use verity_core::jobs::{CheckpointRecord, EventRecord, JobRecord};
pub use verity_core::models::checkpoint_model_name;
use verity_core::spec::Method;
use verity_core::JobState;

/// A job's error.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobError {
    /// Machine-readable code.
    pub code: String,
    /// What happened.
    pub message: String,
    /// The parameter at fault, if any.
    pub param: Option<String>,
}

/// OpenAI's `fine_tuning.job` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobObject {
    /// `ftjob-…`.
    pub id: String,
    /// Always `fine_tuning.job`.
    pub object: &'static str,
    /// Creation time (Unix seconds).
    pub created_at: i64,
    /// Why the job failed.
    pub error: Option<JobError>,
    /// The resulting model, once succeeded: `ft:{base}:{org}:{suffix}:{job_id}`, usable as
    /// `model` of a new job.
    pub fine_tuned_model: Option<String>,
    /// End time (Unix seconds).
    pub finished_at: Option<i64>,
    /// The hyperparameters the job trains with, every default resolved (OpenAI's and Verity's).
    #[schema(value_type = Object)]
    pub hyperparameters: Value,
    /// The model the job started from, as given: a base model, a `fine_tuned_model` or a
    /// checkpoint name (`…:ckpt-step-N`).
    pub model: String,
    /// The root base model under `model`, which names `fine_tuned_model` (Verity extension).
    pub base_model: String,
    /// Owning org.
    pub organization_id: String,
    /// Once succeeded, the id of the results file: the per-step metrics CSV.
    pub result_files: Vec<String>,
    /// Seed.
    pub seed: i64,
    /// queued | running | succeeded | failed | cancelled | paused.
    pub status: String,
    /// Prompt plus completion tokens trained on so far (null before the first step).
    pub trained_tokens: Option<i64>,
    /// Training file id.
    pub training_file: String,
    /// Validation file id.
    pub validation_file: Option<String>,
    /// The method, its hyperparameters resolved as in `hyperparameters`.
    #[schema(value_type = Object)]
    pub method: Value,
    /// User metadata.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Suffix of the model name.
    pub suffix: Option<String>,
    /// The same suffix under OpenAI's response name.
    pub user_provided_suffix: Option<String>,
    /// While running: when the job should finish (Unix seconds), from its measured step times.
    pub estimated_finish: Option<i64>,
    /// The job's W&B run (`[{type: "wandb", wandb: {project, name, entity, tags, run_id}}]`,
    /// the run id being the job id), or null.
    #[schema(value_type = Option<Vec<Object>>)]
    pub integrations: Option<Vec<Value>>,
    /// A cancel or pause the worker has yet to act on (Verity extension).
    pub pending_control: Option<String>,
    /// Last progress report of the worker (Verity extension).
    #[schema(value_type = Option<Object>)]
    pub progress: Option<Value>,
    /// The job's budget (Verity extension): `max_wall_seconds` and `max_tokens` (null: no
    /// cap), `used_wall_seconds` and `used_tokens` (generated completion tokens) so far.
    #[schema(value_type = Object)]
    pub budget: Value,
}

/// The job's method with its hyperparameters resolved (jobs stored before resolution existed
/// are resolved when shown; a method that no longer parses is shown as stored). A
/// reinforcement method always shows `response_format`, `null` for free text, as OpenAI's job
/// object does.
fn resolved_method(spec: &Value) -> Value {
    let method = spec.get("method").cloned().unwrap_or(Value::Null);
    let mut resolved = serde_json::from_value::<Method>(method.clone())
        .ok()
        .and_then(|parsed| serde_json::to_value(parsed.resolved()).ok())
        .unwrap_or(method);
    if let Some(Value::Object(settings)) = resolved.get_mut("reinforcement") {
        settings.entry("response_format").or_insert(Value::Null);
    }
    resolved
}

/// A whole number field of the worker's progress or result.
fn count_field(value: Option<&Value>, field: &str) -> Option<i64> {
    value.and_then(|v| v.get(field)).and_then(Value::as_i64)
}

/// The job's `budget` object: its caps and what it used.
fn budget_object(job: &JobRecord) -> Value {
    let (caps, usage) = (job.caps(), job.usage());
    json!({
        "max_wall_seconds": caps.max_wall_seconds,
        "max_tokens": caps.max_tokens,
        "used_wall_seconds": (usage.wall_seconds * 10.0).round() / 10.0,
        "used_tokens": usage.tokens,
    })
}

impl From<JobRecord> for JobObject {
    fn from(job: JobRecord) -> JobObject {
        let method = resolved_method(&job.spec);
        let kind = method.get("type").and_then(Value::as_str).unwrap_or("reinforcement");
        let hyperparameters = method
            .get(kind)
            .and_then(|settings| settings.get("hyperparameters"))
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()));
        let result_files = job
            .result
            .as_ref()
            .and_then(|r| r.get("result_files"))
            .and_then(Value::as_array)
            .map(|files| files.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        let trained_tokens = count_field(job.result.as_ref(), "trained_tokens")
            .or_else(|| count_field(job.progress.as_ref(), "trained_tokens"));
        let estimated_finish = (job.state == JobState::Running)
            .then(|| count_field(job.progress.as_ref(), "estimated_finish"))
            .flatten();
        let budget = budget_object(&job);
        let error = job.failure("job").map(|f| JobError {
            code: f.code,
            message: f.message,
            param: f.param,
        });
        JobObject {
            object: "fine_tuning.job",
            created_at: job.created_at.timestamp(),
            error,
            fine_tuned_model: job.fine_tuned_model,
            finished_at: job.finished_at.map(|t| t.timestamp()),
            hyperparameters,
            base_model: verity_core::models::root_base_model(&job.model).to_string(),
            model: job.model,
            organization_id: job.org_id.to_string(),
            result_files,
            seed: job.seed,
            status: job.state.to_string(),
            trained_tokens,
            training_file: job.training_file.unwrap_or_default(),
            validation_file: job.validation_file,
            method,
            metadata: job.metadata,
            user_provided_suffix: job.suffix.clone(),
            suffix: job.suffix,
            estimated_finish,
            integrations: verity_core::integrations::view(&job.spec, &job.id),
            pending_control: (job.control != "none").then_some(job.control),
            progress: job.progress,
            budget,
            id: job.id,
        }
    }
}

/// OpenAI's `fine_tuning.job.event` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventObject {
    /// `ftevent-<n>`.
    pub id: String,
    /// Always `fine_tuning.job.event`.
    pub object: &'static str,
    /// When (Unix seconds).
    pub created_at: i64,
    /// info | warn | error.
    pub level: String,
    /// Text.
    pub message: String,
    /// `message` or `metrics`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Structured details, including Verity's event kind.
    #[schema(value_type = Object)]
    pub data: Value,
}

/// Prefix of event ids.
pub const EVENT_PREFIX: &str = "ftevent-";

impl From<EventRecord> for EventObject {
    fn from(event: EventRecord) -> EventObject {
        let level = if event.level == "debug" { "info".to_string() } else { event.level };
        let kind = if event.kind == "metrics" { "metrics" } else { "message" };
        let mut data = match event.data {
            Some(Value::Object(map)) => map,
            Some(other) => Map::from_iter([("value".to_string(), other)]),
            None => Map::new(),
        };
        data.insert("kind".to_string(), Value::String(event.kind));
        EventObject {
            id: format!("{EVENT_PREFIX}{}", event.id),
            object: "fine_tuning.job.event",
            created_at: event.created_at.timestamp(),
            level,
            message: event.message,
            kind,
            data: Value::Object(data),
        }
    }
}

/// OpenAI's `fine_tuning.job.checkpoint` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckpointObject {
    /// `ftckpt-…`.
    pub id: String,
    /// Always `fine_tuning.job.checkpoint`.
    pub object: &'static str,
    /// When (Unix seconds).
    pub created_at: i64,
    /// The checkpoint's model name: the job's `fine_tuned_model` name then `:ckpt-step-N`.
    pub fine_tuned_model_checkpoint: String,
    /// The job.
    pub fine_tuning_job_id: String,
    /// Metrics at that step (with `step`).
    #[schema(value_type = Object)]
    pub metrics: Value,
    /// Training step.
    pub step_number: i32,
    /// Size in bytes (Verity extension).
    pub bytes: i64,
}

/// Builds the checkpoint object of `checkpoint`, a checkpoint of a job producing the model
/// named `job_model` ([`JobRecord::output_model_name`]).
pub fn checkpoint_object(checkpoint: CheckpointRecord, job_model: &str) -> CheckpointObject {
    let mut metrics = match checkpoint.metrics {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    metrics.insert("step".to_string(), json!(checkpoint.step));
    CheckpointObject {
        object: "fine_tuning.job.checkpoint",
        created_at: checkpoint.created_at.timestamp(),
        fine_tuned_model_checkpoint: checkpoint_model_name(job_model, checkpoint.step),
        fine_tuning_job_id: checkpoint.job_id,
        metrics: Value::Object(metrics),
        step_number: checkpoint.step,
        bytes: checkpoint.bytes,
        id: checkpoint.id,
    }
}
