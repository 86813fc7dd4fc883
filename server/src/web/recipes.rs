//! Recipes in the dashboard: the list, the "new recipe" page (a template to start from, the
//! org's files and models beside it; its script posts to `POST /v1/verity/recipes`, so
//! validation is the API's own and names the stage and field), and a recipe's page: the stages
//! as a line, each with its status, link and key figure, and the evaluations' pass@k side by side.

use super::files::org_files;
use super::new_job::language_models;
use super::page::{render, when, Nav, WebResult, WebUser};
use crate::api::recipes::templates::{Template, TEMPLATES};
use crate::api::recipes::{find, recipe_object, RecipeObject, StageObject};
use crate::api::state::AppState;
use askama::Template as Askama;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde_json::Value;

/// Recipes shown on the list.
const LIST_LIMIT: i64 = 50;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/recipes", get(list_page))
        .route("/recipes/new", get(new_page))
        .route("/recipes/{recipe_id}", get(recipe_page))
}

/// A recipe of the list.
struct RecipeRow {
    id: String,
    name: String,
    status: String,
    stages: Vec<(String, String)>,
    created: String,
}

/// The list.
#[derive(Askama)]
#[template(path = "recipes.html")]
struct ListPage {
    nav: Nav,
    recipes: Vec<RecipeRow>,
}

async fn list_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let rows =
        verity_core::recipes::list_recipes(&state.pool, user.0.org_id, None, LIST_LIMIT).await?;
    let mut recipes = Vec::with_capacity(rows.len());
    for row in rows {
        let created = when(row.created_at);
        let recipe = recipe_object(&state, row, false).await?;
        recipes.push(RecipeRow {
            name: recipe.name.clone().unwrap_or_default(),
            status: recipe.status.clone(),
            stages: recipe.stages.iter().map(|s| (s.name.clone(), s.status.clone())).collect(),
            created,
            id: recipe.id,
        });
    }
    Ok(render(&ListPage { nav: Nav::new("Recipes", "recipes"), recipes }))
}

/// The form.
#[derive(Askama)]
#[template(path = "recipe_new.html")]
struct NewPage {
    nav: Nav,
    templates: Vec<Template>,
    files: Vec<(String, String)>,
    models: Vec<String>,
}

async fn new_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let files = org_files(&state, &user)
        .await?
        .into_iter()
        .filter(|f| f.file.status == "processed" && f.file.purpose == "fine-tune")
        .map(|f| (f.file.id, f.file.filename))
        .collect();
    let models = language_models(&state, &user, "").await?;
    Ok(render(&NewPage {
        nav: Nav::new("New recipe", "recipes"),
        templates: TEMPLATES.to_vec(),
        files,
        models,
    }))
}

/// A stage as its page shows it.
struct StageView {
    name: String,
    kind: String,
    status: String,
    id: String,
    link: String,
    figure: String,
    outputs: Vec<(String, String)>,
    fresh_base: bool,
    guard: String,
}

/// An evaluation's report as a table: one row per model, pass@k at each k.
struct ReportView {
    stage: String,
    ks: Vec<u64>,
    rows: Vec<(String, String, Vec<String>)>,
}

/// The recipe's page.
#[derive(Askama)]
#[template(path = "recipe.html")]
struct RecipePage {
    nav: Nav,
    recipe: RecipeObject,
    running: bool,
    budget: String,
    cancellable: bool,
    stopped: bool,
    error: String,
    stages: Vec<StageView>,
    reports: Vec<ReportView>,
}

/// Where a stage's queue row has its page.
fn link(stage: &StageObject) -> String {
    let Some(id) = &stage.id else { return String::new() };
    match stage.kind.as_str() {
        "fine_tuning_job" => format!("/jobs/{id}"),
        "rejection_sampling" => format!("/rejection-sampling/{id}"),
        _ => format!("/evaluations/{id}"),
    }
}

/// A number with three decimals, or `–`.
fn number(value: Option<&Value>) -> String {
    value.and_then(Value::as_f64).map_or_else(|| "–".into(), |x| format!("{x:.3}"))
}

/// The stage's key figure as a line of text.
fn figure(stage: &StageObject) -> String {
    let Some(summary) = &stage.summary else { return String::new() };
    match stage.kind.as_str() {
        "fine_tuning_job" => {
            let step = summary.get("step").and_then(Value::as_i64).unwrap_or(0);
            match summary.get("reward_mean") {
                Some(reward) => format!("step {step} · reward {}", number(Some(reward))),
                None => format!("step {step} · loss {}", number(summary.get("loss"))),
            }
        }
        "rejection_sampling" => {
            let int = |k: &str| summary.get(k).and_then(Value::as_u64).unwrap_or(0);
            let rate = summary.get("mean_pass_rate").and_then(Value::as_f64).unwrap_or(0.0);
            format!(
                "kept {} · {} of {} prompts with a pass · pass rate {:.1}%",
                int("kept"),
                int("prompts_with_a_pass"),
                int("prompts"),
                rate * 100.0
            )
        }
        _ => {
            let models = summary.get("models").and_then(Value::as_array).map_or(0, Vec::len);
            format!("{models} models reported")
        }
    }
}

/// The recipe's budget and what its stages used, as a line of text (empty without a budget).
fn budget_line(recipe: &RecipeObject) -> String {
    let (caps, used) = (recipe.budget, recipe.usage);
    let mut parts = Vec::new();
    if let Some(cap) = caps.max_wall_seconds {
        parts.push(format!("{:.0} of {cap} s", used.wall_seconds));
    }
    if let Some(cap) = caps.max_tokens {
        parts.push(format!("{} of {cap} tokens", used.tokens));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("budget: {}", parts.join(" · "))
    }
}

/// A reinforcement stage's guard as a line of text: its profile's prediction and verdict.
fn guard_line(stage: &StageObject) -> String {
    let Some(guard) = &stage.guard else { return String::new() };
    let id = guard.get("id").and_then(Value::as_str).unwrap_or_default();
    match guard.get("predicted_zero_advantage_fraction").and_then(Value::as_f64) {
        Some(fraction) => {
            let verdict =
                if guard.get("passed") == Some(&Value::Bool(true)) { "passed" } else { "held" };
            format!(
                "guard {id}: {:.0}% zero-advantage groups predicted · {verdict}",
                fraction * 100.0
            )
        }
        None => format!("guard {id}: profiling the model it starts from…"),
    }
}

/// The pass@k table of an evaluation stage's report.
fn report(stage: &StageObject) -> Option<ReportView> {
    let summary = stage.summary.as_ref().filter(|_| stage.kind == "evaluation")?;
    let ks: Vec<u64> = summary.get("ks")?.as_array()?.iter().filter_map(Value::as_u64).collect();
    let rows = summary
        .get("models")?
        .as_array()?
        .iter()
        .map(|model| {
            let name = model.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
            let by_k = model.get("pass_at_k");
            let cells =
                ks.iter().map(|k| number(by_k.and_then(|p| p.get(format!("pass@{k}"))))).collect();
            (name, number(model.get("mean_reward")), cells)
        })
        .collect();
    Some(ReportView { stage: stage.name.clone(), ks, rows })
}

async fn recipe_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    let recipe = find(&state, &user.0, &id, true).await?;
    let stages = recipe
        .stages
        .iter()
        .map(|stage| StageView {
            name: stage.name.clone(),
            kind: stage.kind.replace('_', " "),
            status: stage.status.clone(),
            id: stage.id.clone().unwrap_or_default(),
            link: link(stage),
            figure: figure(stage),
            outputs: stage
                .outputs
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect(),
            fresh_base: stage.fresh_base,
            guard: guard_line(stage),
        })
        .collect();
    let reports = recipe.stages.iter().filter_map(report).collect();
    let error = recipe
        .error
        .as_ref()
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let page = RecipePage {
        nav: Nav::new(format!("Recipe {id}"), "recipes"),
        running: recipe.status == "running",
        budget: budget_line(&recipe),
        cancellable: recipe.status == "running" || recipe.status == "paused",
        stopped: ["paused", "failed", "cancelled"].contains(&recipe.status.as_str()),
        error,
        stages,
        reports,
        recipe,
    };
    Ok(render(&page))
}
