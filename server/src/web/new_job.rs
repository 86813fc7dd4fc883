//! The new-job page: base model, method (reinforcement, supervised or DPO), training and
//! validation files (upload with preview and line errors), grader editor with templates and a
//! Test grader panel (reinforcement only), the method's hyperparameters with presets
//! (the losses from `verity_core::spec::Loss`, their values from `GET /v1/verity/loss_presets`).
//! The page's script submits to the REST API (`/v1/files`, `/v1/fine_tuning/alpha/graders/run`,
//! `/v1/fine_tuning/jobs`) with the session cookie, so validation is the API's own.
//! `/jobs/new?from_job=ID[&checkpoint=STEP]` ("Continue training") prefills the form from that
//! job: its model or checkpoint as `model`, its files and grader;
//! `/jobs/new?training_file=ID&method=supervised` ("Train on this file") preselects both.

use super::files::{org_files, FileRow};
use super::page::{render, Nav, WebResult, WebUser};
use crate::api::error::ApiError;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use verity_core::queue::RESULTS_PURPOSE;
use verity_core::spec::{Hyperparameters, Loss, Method, MethodKind};

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/jobs/new", get(new_job_page))
}

/// A hyperparameter field: name and one-line help.
pub struct Field {
    /// JSON name.
    pub name: &'static str,
    /// Help line.
    pub help: &'static str,
}

/// A field as shown, with its resolved default per method that has it (the resolved
/// hyperparameters of each method's defaults, for the default loss) as placeholder; the page
/// shows a field only for the methods listed.
struct FieldRow {
    name: &'static str,
    help: &'static str,
    default: String,
    defaults: Vec<(&'static str, String)>,
    /// The API's range of the field, checked by the form before sending: `min`, `max` (empty:
    /// no range) and whether `min` itself is refused.
    min: String,
    max: String,
    min_exclusive: bool,
}

/// The range the API accepts for hyperparameter `name`, where the form checks one:
/// `(min, min excluded, max)`.
fn bounds(name: &str) -> Option<(f64, bool, f64)> {
    match name {
        "temperature" => Some((0.0, true, verity_core::sampling::MAX_TEMPERATURE)),
        _ => None,
    }
}

/// The resolved default hyperparameters of each method (`method.{type}.hyperparameters`).
fn method_defaults() -> Vec<(&'static str, serde_json::Value)> {
    [MethodKind::Reinforcement, MethodKind::Supervised, MethodKind::Dpo]
        .into_iter()
        .map(|kind| {
            let name = kind.as_str();
            let method = match kind {
                MethodKind::Reinforcement => serde_json::json!({"type": name,
                    "reinforcement": {"grader": {}, "hyperparameters": Hyperparameters::default()}}),
                _ => serde_json::json!({ "type": name }),
            };
            let resolved = serde_json::from_value::<Method>(method)
                .ok()
                .and_then(|m| serde_json::to_value(m.resolved()).ok())
                .and_then(|m| m.get(name).and_then(|s| s.get("hyperparameters")).cloned())
                .unwrap_or_default();
            (name, resolved)
        })
        .collect()
}

fn field_rows() -> Vec<FieldRow> {
    let methods = method_defaults();
    let shown = |value: &serde_json::Value| match value {
        serde_json::Value::Null => "auto".to_string(),
        value => value.to_string(),
    };
    FIELDS
        .iter()
        .map(|f| {
            let defaults: Vec<(&'static str, String)> = methods
                .iter()
                .filter_map(|(name, hp)| hp.get(f.name).map(|v| (*name, shown(v))))
                .collect();
            let range = bounds(f.name);
            FieldRow {
                name: f.name,
                help: f.help,
                default: defaults.first().map(|(_, d)| d.clone()).unwrap_or_default(),
                defaults,
                min: range.map(|(min, _, _)| min.to_string()).unwrap_or_default(),
                max: range.map(|(_, _, max)| max.to_string()).unwrap_or_default(),
                min_exclusive: range.is_some_and(|(_, exclusive, _)| exclusive),
            }
        })
        .collect()
}

/// The hyperparameters the form offers (others keep their defaults).
pub const FIELDS: &[Field] = &[
    Field {
        name: "max_steps",
        help: "Stop after this many steps (empty: one pass over the data).",
    },
    Field { name: "batch_size", help: "Prompts (supervised: chats; DPO: pairs) per step." },
    Field {
        name: "group_size",
        help: "Completions sampled per prompt; advantages compare within a group.",
    },
    Field {
        name: "learning_rate",
        help: "Peak learning rate. The defaults are sized for billion-parameter models: in a \
               reinforcement job a small model such as the demo's SmolLM2-135M moves visibly at \
               1e-5 to 2e-5 (the demo uses 2e-5), where the default 1e-6 changes little in a few steps.",
    },
    Field { name: "max_completion_tokens", help: "Longest completion, in tokens." },
    Field {
        name: "temperature",
        help: "Sampling temperature, above 0 and at most 2; lower explores less.",
    },
    Field {
        name: "beta",
        help: "Reinforcement: KL coefficient to the reference (0 = none). DPO: β, how far the \
               policy may move from the start model.",
    },
    Field { name: "epsilon_low", help: "Lower clip range (loss-dependent default)." },
    Field { name: "epsilon_high", help: "Upper clip range (DAPO raises it: clip-higher)." },
    Field { name: "micro_batch_size", help: "Completions per forward/backward pass (memory)." },
    Field {
        name: "checkpoint_interval",
        help: "Save a checkpoint every N steps (and at the end).",
    },
    Field { name: "eval_interval", help: "Evaluate on the validation file every N steps." },
    Field {
        name: "eval_samples",
        help: "Completions per validation prompt (pass@k for k up to this).",
    },
];

/// A loss as the page offers it: a preset button and a `loss` option (the preset's values come
/// from `GET /v1/verity/loss_presets`).
struct LossRow {
    id: &'static str,
    label: &'static str,
}

/// What "Continue training" asks for: the job to start from, and one of its checkpoints; or
/// what "Train on this file" asks for: a training file and a method.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ContinueQuery {
    /// The job whose model the new job starts from.
    pub(super) from_job: Option<String>,
    /// A step of one of its checkpoints (else its `fine_tuned_model`, or its latest checkpoint).
    pub(super) checkpoint: Option<i32>,
    /// A training file to preselect (overrides the continued job's).
    pub(super) training_file: Option<String>,
    /// The method to preselect (`reinforcement`, `supervised` or `dpo`).
    pub(super) method: Option<String>,
}

/// The form's prefilled values (empty: none).
#[derive(Debug, Default)]
pub(super) struct Prefill {
    /// The job continued.
    pub(super) from_job: String,
    /// Its model or checkpoint name, the new job's `model`.
    pub(super) model: String,
    /// Its training file id.
    pub(super) training_file: String,
    /// Its validation file id.
    pub(super) validation_file: String,
    /// Its grader, pretty JSON.
    pub(super) grader: String,
    /// The method preselected (`reinforcement` when empty).
    pub(super) method: String,
}

/// The model name a job continues from: the checkpoint at `step`, or the job's
/// `fine_tuned_model`, or its latest checkpoint; 400 naming the field when there is none.
async fn continue_model(
    state: &AppState,
    job: &verity_core::jobs::JobRecord,
    step: Option<i32>,
) -> Result<String, ApiError> {
    if let (None, Some(model)) = (step, &job.fine_tuned_model) {
        return Ok(model.clone());
    }
    let before = step.and_then(|s| s.checked_add(1));
    let found = verity_core::jobs::list_checkpoints(&state.pool, &job.id, before, 1)
        .await?
        .into_iter()
        .next()
        .filter(|c| step.is_none_or(|s| s == c.step));
    match found {
        Some(c) => Ok(verity_core::models::checkpoint_model_name(&job.output_model_name(), c.step)),
        None => Err(match step {
            Some(s) => ApiError::invalid(
                "checkpoint",
                format!("job {} has no checkpoint at step {s}", job.id),
            ),
            None => ApiError::invalid(
                "from_job",
                format!("job {} has no model or checkpoint yet", job.id),
            ),
        }),
    }
}

/// The prefill of "Continue training" from the org's job `query.from_job` (404 if not the org's),
/// with the training file and method the query names, if any.
pub(super) async fn prefill(
    state: &AppState,
    user: &WebUser,
    query: ContinueQuery,
) -> WebResult<Prefill> {
    let method = match query.method.as_deref() {
        Some(m @ ("reinforcement" | "supervised" | "dpo")) => m.to_string(),
        Some(other) => {
            return Err(ApiError::invalid(
                "method",
                format!("unknown method {other:?}; use reinforcement, supervised or dpo"),
            )
            .into())
        }
        None => String::new(),
    };
    let mut prefill = continued(state, user, &query).await?;
    if let Some(file) = query.training_file {
        prefill.training_file = file;
    }
    prefill.method = method;
    Ok(prefill)
}

/// The prefill of "Continue training" from the org's job `query.from_job` (404 if not the org's).
async fn continued(state: &AppState, user: &WebUser, query: &ContinueQuery) -> WebResult<Prefill> {
    let Some(id) = &query.from_job else { return Ok(Prefill::default()) };
    let job = crate::api::jobs::find_job(state, &user.0, id).await?;
    let model = continue_model(state, &job, query.checkpoint).await?;
    let grader = job
        .spec
        .pointer("/method/reinforcement/grader")
        .map(|g| serde_json::to_string_pretty(g).unwrap_or_default())
        .unwrap_or_default();
    Ok(Prefill {
        from_job: job.id,
        model,
        training_file: job.training_file.unwrap_or_default(),
        validation_file: job.validation_file.unwrap_or_default(),
        grader,
        method: String::new(),
    })
}

/// The new-job page.
#[derive(Template)]
#[template(path = "new_job.html")]
struct NewJobPage {
    nav: Nav,
    prefill: Prefill,
    models: Vec<String>,
    files: Vec<FileRow>,
    fields: Vec<FieldRow>,
    losses: Vec<LossRow>,
    default_loss: &'static str,
    /// Prefilled files that are gone (deleted since the continued job used them).
    missing_files: Vec<String>,
}

/// The language models (not embedding models) the org may name, with `extra` (a prefilled
/// checkpoint or fine-tuned model, when not empty) first if the registry list lacks it.
pub(super) async fn language_models(
    state: &AppState,
    user: &WebUser,
    extra: &str,
) -> Result<Vec<String>, sqlx::Error> {
    let mut models: Vec<String> = verity_core::models::list_models(&state.pool, user.0.org_id)
        .await?
        .into_iter()
        .filter(|m| m.kind != "embedding")
        .map(|m| m.id)
        .collect();
    if !extra.is_empty() && !models.iter().any(|m| m == extra) {
        models.insert(0, extra.to_string());
    }
    Ok(models)
}

async fn new_job_page(
    State(state): State<AppState>,
    user: WebUser,
    Query(query): Query<ContinueQuery>,
) -> WebResult<Response> {
    let prefill = prefill(&state, &user, query).await?;
    let models = language_models(&state, &user, &prefill.model).await?;
    let files: Vec<FileRow> = org_files(&state, &user)
        .await?
        .into_iter()
        // A job's results file (`step_metrics.csv`) is a report, not something to train on.
        .filter(|f| f.file.status == "processed" && f.file.purpose != RESULTS_PURPOSE)
        .collect();
    let missing_files = [&prefill.training_file, &prefill.validation_file]
        .into_iter()
        .filter(|id| !id.is_empty() && !files.iter().any(|f| f.file.id == **id))
        .cloned()
        .collect();
    Ok(render(&NewJobPage {
        nav: Nav::new("New job", "jobs"),
        prefill,
        models,
        files,
        fields: field_rows(),
        losses: Loss::ALL
            .into_iter()
            .map(|l| LossRow { id: l.as_str(), label: l.label() })
            .collect(),
        default_loss: Loss::default().as_str(),
        missing_files,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_show_for_the_methods_that_have_them() {
        let rows = super::field_rows();
        let methods = |name: &str| -> Vec<&str> {
            let row = rows.iter().find(|r| r.name == name).expect("field");
            row.defaults.iter().map(|(m, _)| *m).collect()
        };
        assert_eq!(methods("group_size"), vec!["reinforcement"]);
        assert_eq!(methods("batch_size"), vec!["reinforcement", "supervised", "dpo"]);
        assert_eq!(methods("beta"), vec!["reinforcement", "dpo"]);
        let beta = rows.iter().find(|r| r.name == "beta").expect("beta");
        assert_eq!(beta.defaults[1], ("dpo", "0.1".to_string()));
    }
}
