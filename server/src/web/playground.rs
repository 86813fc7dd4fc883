//! The playground (two models answer one prompt side by side, streamed from
//! `/v1/chat/completions` by `playground.js`; from a job, a validation row fills the prompt and
//! the job's grader scores both answers) and the models page that links to it, where admins
//! pull a model from the hub by its name (`/v1/verity/model_pulls`) and see their pulls.

use super::page::{render, script_json, urlencode, when, Nav, WebResult, WebUser};
use crate::api::jobs::find_job;
use crate::api::model_pulls::{queue_pull, CreatePullRequest, ModelPullObject};
use crate::api::models::{visible_models, ModelObject};
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use verity_core::jobs::JobRecord;
use verity_core::models::checkpoint_model_name;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/playground", get(playground_page))
        .route("/models", get(models_page))
        .route("/models/pull", post(pull_model))
}

/// The model kinds of `/v1/models`, in picker order, with their group labels.
const KINDS: [(&str, &str); 3] =
    [("base", "Base models"), ("fine_tuned", "Fine-tuned models"), ("checkpoint", "Checkpoints")];

/// What the playground opens with (all optional).
#[derive(Debug, Deserialize, Default)]
pub struct PlaygroundQuery {
    /// A job: its base on the left, its fine-tuned model or latest checkpoint on the right, and
    /// its validation rows and grader.
    job: Option<String>,
    /// The left pane's model.
    left: Option<String>,
    /// The right pane's model.
    right: Option<String>,
}

/// One option of a model picker.
struct Choice {
    id: String,
    left: bool,
    right: bool,
}

/// A labelled group of options.
struct Group {
    label: &'static str,
    choices: Vec<Choice>,
}

/// One answer pane.
struct Pane {
    /// `left` or `right` (element ids).
    side: &'static str,
    /// Its heading.
    label: &'static str,
    /// Whether it is the left one (its preselected model is [`Choice::left`]).
    left: bool,
}

/// The two panes.
const PANES: [Pane; 2] = [
    Pane { side: "left", label: "Model A", left: true },
    Pane { side: "right", label: "Model B", left: false },
];

/// The job the playground was opened from.
struct JobContext {
    id: String,
    /// File whose rows fill the prompt (the validation file, else the training file).
    rows_file: Option<String>,
    /// `validation` or `training`.
    rows_kind: &'static str,
    /// Rows in that file.
    records: i64,
    /// The job's grader (JSON), empty when it has none.
    grader_json: String,
    /// The job's completion budget (`max_completion_tokens`), when it has one.
    max_completion_tokens: Option<usize>,
}

/// The playground page.
#[derive(Template)]
#[template(path = "playground.html")]
struct PlaygroundPage {
    nav: Nav,
    panes: &'static [Pane],
    groups: Vec<Group>,
    empty: bool,
    job: Option<JobContext>,
}

/// The playground's answer length when it was not opened from a job with its own budget.
const DEFAULT_MAX_TOKENS: usize = 256;

impl PlaygroundPage {
    /// The answer length the form starts with: the job's completion budget, so both answers are
    /// cut where the job's rollouts were.
    fn max_tokens(&self) -> usize {
        self.job.as_ref().and_then(|j| j.max_completion_tokens).unwrap_or(DEFAULT_MAX_TOKENS)
    }
}

/// The model a job's answers come from now: its fine-tuned model, else its latest checkpoint.
async fn trained_model(state: &AppState, job: &JobRecord) -> Result<Option<String>, sqlx::Error> {
    if let Some(model) = &job.fine_tuned_model {
        return Ok(Some(model.clone()));
    }
    let latest = verity_core::jobs::list_checkpoints(&state.pool, &job.id, None, 1).await?;
    Ok(latest.first().map(|c| checkpoint_model_name(&job.output_model_name(), c.step)))
}

/// The job's prompt rows and grader.
async fn job_context(state: &AppState, user: &WebUser, job: &JobRecord) -> WebResult<JobContext> {
    let (rows_file, rows_kind) = match (&job.validation_file, &job.training_file) {
        (Some(v), _) => (Some(v.clone()), "validation"),
        (None, t) => (t.clone(), "training"),
    };
    let records = match &rows_file {
        Some(id) => verity_core::files::get_file(&state.pool, user.0.org_id, id)
            .await?
            .and_then(|f| f.line_count)
            .unwrap_or(0),
        None => 0,
    };
    let grader = job.spec.pointer("/method/reinforcement/grader").filter(|g| g.is_object());
    Ok(JobContext {
        id: job.id.clone(),
        rows_file,
        rows_kind,
        records,
        grader_json: grader.map(script_json).unwrap_or_default(),
        max_completion_tokens: job
            .spec
            .get("method")
            .and_then(verity_core::spec::method_completion_budget),
    })
}

async fn playground_page(
    State(state): State<AppState>,
    user: WebUser,
    Query(query): Query<PlaygroundQuery>,
) -> WebResult<Response> {
    let models = visible_models(&state, user.0.org_id).await?;
    let (mut left, mut right) = (None, None);
    let job = match query.job.as_deref().filter(|j| !j.is_empty()) {
        Some(id) => {
            let job = find_job(&state, &user.0, id).await?;
            left = Some(job.model.clone());
            right = trained_model(&state, &job).await?;
            Some(job_context(&state, &user, &job).await?)
        }
        None => None,
    };
    let known = |name: &Option<String>| {
        name.as_ref().filter(|n| models.iter().any(|m| &m.id == *n)).cloned()
    };
    // Explicit choices win; then the job's; then the first base and the newest trained model.
    let first = |kinds: &[&str]| {
        models.iter().find(|m| kinds.contains(&m.kind.as_str())).map(|m| m.id.clone())
    };
    let left = known(&query.left).or_else(|| known(&left)).or_else(|| first(&["base"]));
    let right = known(&query.right)
        .or_else(|| known(&right))
        .or_else(|| first(&["fine_tuned", "checkpoint"]))
        .or_else(|| left.clone());
    let groups = KINDS
        .iter()
        .map(|(kind, label)| Group {
            label,
            choices: models
                .iter()
                .filter(|m| m.kind == *kind)
                .map(|m| Choice {
                    left: left.as_deref() == Some(m.id.as_str()),
                    right: right.as_deref() == Some(m.id.as_str()),
                    id: m.id.clone(),
                })
                .collect(),
        })
        .filter(|g| !g.choices.is_empty())
        .collect();
    Ok(render(&PlaygroundPage {
        nav: Nav::new("Playground", "playground"),
        panes: &PANES,
        groups,
        empty: models.is_empty(),
        job,
    }))
}

/// A model row of the models page.
struct ModelRow {
    model: ModelObject,
    created: String,
    /// The playground, opened on this model.
    playground: String,
}

/// The pulls the models page lists, newest first.
const PULLS_SHOWN: i64 = 10;

/// One pull on the models page.
struct PullRow {
    pull: ModelPullObject,
    created: String,
}

/// The models page.
#[derive(Template)]
#[template(path = "models.html")]
struct ModelsPage {
    nav: Nav,
    models: Vec<ModelRow>,
    /// The org's latest pulls.
    pulls: Vec<PullRow>,
    /// Whether the pull form is offered (admins).
    admin: bool,
    /// Why the last pull was refused.
    error: Option<String>,
    /// What was typed, kept after a refusal.
    typed: PullForm,
}

/// The pull form.
#[derive(Debug, Deserialize, Default)]
pub struct PullForm {
    /// `OWNER/NAME[@REVISION]`.
    #[serde(default)]
    model: String,
    /// The name to register it under (empty: the hub name's last part).
    #[serde(default)]
    name: String,
}

async fn models_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    models_view(&state, &user, None, PullForm::default()).await
}

/// Queues a pull typed into the form, then shows the models page (the pull listed); a refusal
/// shows the page again with the reason and what was typed.
async fn pull_model(
    State(state): State<AppState>,
    user: WebUser,
    Form(form): Form<PullForm>,
) -> WebResult<Response> {
    let name = Some(form.name.trim().to_string()).filter(|n| !n.is_empty());
    let request = CreatePullRequest { model: form.model.trim().to_string(), name };
    match queue_pull(&state, &user.0, &request).await {
        Ok(_) => Ok(Redirect::to("/models").into_response()),
        Err(error) if error.status.is_client_error() => {
            let status = error.status;
            let mut response = models_view(&state, &user, Some(error.message), form).await?;
            *response.status_mut() = status;
            Ok(response)
        }
        Err(error) => Err(error.into()),
    }
}

async fn models_view(
    state: &AppState,
    user: &WebUser,
    error: Option<String>,
    typed: PullForm,
) -> WebResult<Response> {
    let models = visible_models(state, user.0.org_id)
        .await?
        .into_iter()
        .map(|model| {
            let name = urlencode(&model.id);
            let playground = match (&model.job_id, model.kind.as_str()) {
                (_, "base") => format!("/playground?left={name}"),
                (Some(job), _) => format!("/playground?job={}&right={name}", urlencode(job)),
                (None, _) => format!("/playground?right={name}"),
            };
            ModelRow {
                created: chrono::DateTime::from_timestamp(model.created, 0)
                    .map(when)
                    .unwrap_or_default(),
                playground,
                model,
            }
        })
        .collect();
    let rows =
        verity_core::model_pulls::list_pulls(&state.pool, user.0.org_id, None, PULLS_SHOWN).await?;
    let mut pulls = Vec::with_capacity(rows.len());
    for row in rows {
        let created = when(row.created_at);
        pulls.push(PullRow { pull: ModelPullObject::of(row)?, created });
    }
    Ok(render(&ModelsPage {
        nav: Nav::new("Models", "models"),
        models,
        pulls,
        admin: user.is_admin(),
        error,
        typed,
    }))
}
