//! `/v1/verity/recipes` (Verity extension): multi-stage recipes such as DeepSeek-R1's — cold-start
//! SFT → reinforcement → rejection sampling → SFT of a fresh base → evaluation — as one object.
//! Each stage is written as the body its own endpoint takes; later stages name earlier stages'
//! outputs (`"{{stages.rl.fine_tuned_model}}"`, `"{{stages.rs.file}}"`). The whole recipe is
//! checked at creation (every body through its endpoint's checks, references by type), then the
//! queue runs it one stage after another ([`advance`]).

pub mod advance;
pub mod stages;
pub mod templates;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{reject_nul, ApiJson, ApiQuery};
use super::pagination::{Page, PageQuery};
use super::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use verity_core::recipes::{self, RecipeRecord, RecipeSpec, StageKind};
use verity_core::JobState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/verity/recipes", get(list_recipes).post(create_recipe))
        .route("/v1/verity/recipes/{recipe_id}", get(get_recipe))
        .route("/v1/verity/recipes/{recipe_id}/cancel", post(cancel_recipe))
        .route("/v1/verity/recipes/{recipe_id}/resume", post(resume_recipe))
}

/// Body of `POST /v1/verity/recipes`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRecipeRequest {
    /// A name for people (1–200 characters).
    pub name: Option<String>,
    /// The stages in order, 1–16: `{"name", "type", "<type>": body, "fresh_base"}` with `type`
    /// `fine_tuning_job`, `rejection_sampling` or `evaluation` and the body its endpoint takes.
    #[schema(value_type = Vec<Object>)]
    pub stages: Option<Value>,
    /// The seed of every stage whose body sets none (random per stage when absent).
    pub seed: Option<i64>,
    /// The check before each reinforcement stage: `{max_zero_advantage_fraction (default 0.9),
    /// prompts (default 16)}`, or `false` for none (default: on).
    #[schema(value_type = Option<Object>)]
    pub guard: Option<Value>,
    /// Caps on the whole recipe, as a job's budget: `{max_wall_seconds?, max_tokens?}`, the wall
    /// seconds and generated tokens its stages' jobs use together. Each fine-tuning stage's job
    /// is capped at what is left when it starts (and pauses itself there); a stage is not
    /// started once the budget is spent.
    #[schema(value_type = Option<Object>)]
    pub budget: Option<Value>,
}

/// A stage of a recipe as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StageObject {
    /// Its name.
    pub name: String,
    /// `fine_tuning_job`, `rejection_sampling` or `evaluation`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `pending` (not reached), `guarding` (its guard's profile is under way or paused the
    /// recipe), then its queue row's status (`queued`, `running`, `paused`, `succeeded`,
    /// `failed`, `cancelled`).
    pub status: String,
    /// The id of the job or run of its latest attempt, once reached.
    pub id: Option<String>,
    /// Ids of earlier attempts (a resumed recipe runs a failed stage again).
    pub earlier_ids: Vec<String>,
    /// Once succeeded: what later stages can name (`fine_tuned_model`, `file`).
    #[schema(value_type = Object)]
    pub outputs: BTreeMap<String, Value>,
    /// The key figures: a job's last `reward_mean` or `loss` and `step`; a rejection-sampling
    /// run's `kept`, `prompts_with_a_pass`, `mean_pass_rate`; an evaluation's report (pass@k
    /// per model). Only on `GET` of one recipe.
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Value>,
    /// Whether it trains the recipe's base model afresh.
    pub fresh_base: bool,
    /// A reinforcement stage's guard once reached: `id` (its difficulty profile), `status`,
    /// `predicted_zero_advantage_fraction` (once done) and `passed`.
    #[schema(value_type = Option<Object>)]
    pub guard: Option<Value>,
    /// The body as submitted, references and all, under the stage's type.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub body: Map<String, Value>,
}

/// A recipe (`verity.recipe`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RecipeObject {
    /// `recipe-…`.
    pub id: String,
    /// Always `verity.recipe`.
    pub object: &'static str,
    /// Its name.
    pub name: Option<String>,
    /// `running`, `paused` (by a guard: `error` says why), `succeeded`, `failed` or
    /// `cancelled`.
    pub status: String,
    /// Creation time (Unix seconds).
    pub created_at: i64,
    /// End time (Unix seconds).
    pub finished_at: Option<i64>,
    /// The root base of its first model (what `fresh_base` stages train).
    pub base_model: String,
    /// The seed of stages that set none.
    pub seed: Option<i64>,
    /// The check before each reinforcement stage (`false` when off).
    #[schema(value_type = Object)]
    pub guard: Value,
    /// Caps on the whole recipe (`max_wall_seconds`, `max_tokens`; null: none).
    #[schema(value_type = Object)]
    pub budget: verity_core::budget::Caps,
    /// What its stages' jobs have used together (`wall_seconds`, `tokens`).
    #[schema(value_type = Object)]
    pub usage: verity_core::budget::Usage,
    /// Why it stopped: `stage`, `position`, `job`, `param` (the field at fault, from the
    /// recipe's root) and `message`.
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    /// The stages, in order.
    pub stages: Vec<StageObject>,
}

/// The key figures of a stage's queue row.
async fn stage_summary(
    state: &AppState,
    kind: StageKind,
    job: &verity_core::jobs::JobRecord,
) -> ApiResult<Option<Value>> {
    Ok(match kind {
        StageKind::FineTuningJob => {
            let rows = verity_core::jobs::metrics_rows(&state.pool, &job.id).await?;
            rows.last().map(|(step, row)| {
                let mut summary = Map::new();
                summary.insert("step".into(), Value::from(*step));
                for key in ["reward_mean", "accuracy", "loss"] {
                    if let Some(value) = row.get(key).filter(|v| v.is_number()) {
                        summary.insert(key.into(), value.clone());
                    }
                }
                Value::Object(summary)
            })
        }
        StageKind::RejectionSampling => job.result.as_ref().map(|result| {
            let keep = ["prompts", "samples", "kept", "prompts_with_a_pass", "mean_pass_rate"];
            let mut summary = Map::new();
            for key in keep {
                if let Some(value) = result.get(key) {
                    summary.insert(key.into(), value.clone());
                }
            }
            Value::Object(summary)
        }),
        StageKind::Evaluation => {
            let report = crate::api::sampling_runs::evaluations::report(state, &job.id).await?;
            serde_json::to_value(report).ok()
        }
    })
}

/// The API object of `recipe`; with `summaries`, each reached stage's key figures.
pub async fn recipe_object(
    state: &AppState,
    recipe: RecipeRecord,
    summaries: bool,
) -> ApiResult<RecipeObject> {
    let spec = RecipeSpec::from_stored(&recipe.spec)
        .map_err(|e| ApiError::internal("reading a recipe", e))?;
    // The latest attempts' rows are read below; only the earlier ones are read here.
    let records = &recipe.stages;
    let mut usage = advance::recipe_usage(state, recipe.org_id, &spec, records, true).await?;
    let mut stages = Vec::with_capacity(spec.stages.len());
    for (stage, record) in spec.stages.iter().zip(&recipe.stages) {
        let job = match &record.job_id {
            Some(id) => {
                let kind = stage.kind.job_kind();
                verity_core::jobs::get_job_of_kind(&state.pool, recipe.org_id, kind, id).await?
            }
            None => None,
        };
        if let Some(job) = &job {
            advance::add_usage(&mut usage, job);
        }
        let guard = match &record.guard_job_id {
            Some(id) => {
                let kind = verity_core::sampling_runs::RunKind::DifficultyProfile.as_str();
                let profile =
                    verity_core::jobs::get_job_of_kind(&state.pool, recipe.org_id, kind, id)
                        .await?;
                let fraction = profile
                    .as_ref()
                    .and_then(advance::guard_report)
                    .map(|r| r.difficulty.predicted_zero_advantage_fraction);
                Some(serde_json::json!({
                    "id": id,
                    "status": profile.map_or(JobState::Queued, |p| p.state),
                    "predicted_zero_advantage_fraction": fraction,
                    "passed": record.guard_passed,
                }))
            }
            None => None,
        };
        let status = match (&job, &record.job_id, &record.guard_job_id) {
            (Some(job), _, _) => job.state.to_string(),
            (None, Some(_), _) => "queued".to_string(),
            (None, None, Some(_)) => "guarding".to_string(),
            (None, None, None) => "pending".to_string(),
        };
        let outputs = job
            .as_ref()
            .filter(|j| j.state == JobState::Succeeded)
            .map(|j| advance::outputs_of(stage.kind, j))
            .unwrap_or_default();
        let summary = match (&job, summaries) {
            (Some(job), true) => stage_summary(state, stage.kind, job).await?,
            _ => None,
        };
        let mut body = Map::new();
        body.insert(stage.kind.as_str().into(), Value::Object(stage.body.clone()));
        stages.push(StageObject {
            name: stage.name.clone(),
            kind: stage.kind.as_str().to_string(),
            status,
            id: record.job_id.clone(),
            earlier_ids: record.earlier_job_ids.clone(),
            outputs,
            summary,
            fresh_base: stage.fresh_base,
            guard,
            body,
        });
    }
    Ok(RecipeObject {
        id: recipe.id,
        object: "verity.recipe",
        name: recipe.name,
        status: recipe.state,
        created_at: recipe.created_at.timestamp(),
        finished_at: recipe.finished_at.map(|t| t.timestamp()),
        base_model: recipe.base_model,
        seed: spec.seed,
        guard: recipes::spec::Guard::to_value(spec.guard.as_ref()),
        budget: spec.budget,
        usage,
        error: recipe.error,
        stages,
    })
}

/// Checks every stage of `spec` as its endpoint would, references filled in with stand-ins:
/// an earlier stage's fine-tuned model by the model that stage starts from (same architecture
/// and tokenizer), a file an earlier stage will write left unchecked but for its type. The
/// recipe's base model (the root base of its first model).
pub async fn check_recipe(
    state: &AppState,
    principal: &Principal,
    spec: &RecipeSpec,
) -> ApiResult<String> {
    let Some((first, model)) = spec.first_model() else {
        return Err(ApiError::invalid("stages[0]", "the first stage must name its model"));
    };
    let stage = &spec.stages[first];
    let field = if stage.kind == StageKind::Evaluation { "models[0]" } else { "model" };
    let at = format!("stages[{first}].{}.{field}", stage.kind.as_str());
    crate::api::jobs::validate::model_name_param(state, principal, &at, model).await?;
    let stack = verity_core::lineage::resolve_stack(&state.pool, principal.org_id, model)
        .await?
        .ok_or_else(|| {
            ApiError::invalid(&at, format!("model {model:?} does not exist (see GET /v1/models)"))
                .with_code("model_not_found")
        })?;
    let base = stack.base.id;
    let stand_ins = spec.stand_in_models(&base);
    for (position, (stage, stand_ins)) in spec.stages.iter().zip(&stand_ins).enumerate() {
        let under = |e| stages::under_stage(e, position, &stage.name, stage.kind);
        let fill =
            |path: &str, _: &recipes::Reference| stand_ins.get(path).cloned().map(Value::String);
        let (mut body, deferred) = stage.render(&base, spec.seed, fill);
        if stage.kind == StageKind::Evaluation {
            distinct_models(&stage.body, &mut body).map_err(under)?;
        }
        stages::check(state, principal, stage.kind, body, &deferred).await.map_err(under)?;
    }
    Ok(base)
}

/// Refuses an evaluation stage that lists a model (or reference) twice in `written`, then keeps
/// the first of the models in `filled` that stand-ins made equal.
fn distinct_models(written: &Map<String, Value>, filled: &mut Map<String, Value>) -> ApiResult<()> {
    if let Some(Value::Array(models)) = written.get("models") {
        for (i, model) in models.iter().enumerate() {
            if models[..i].contains(model) {
                return Err(ApiError::invalid(
                    format!("models[{i}]"),
                    format!("{model} is listed twice"),
                ));
            }
        }
    }
    if let Some(Value::Array(models)) = filled.get_mut("models") {
        let mut seen: Vec<Value> = Vec::with_capacity(models.len());
        for model in models.iter() {
            if !seen.contains(model) {
                seen.push(model.clone());
            }
        }
        *models = seen;
    }
    Ok(())
}

/// Creates a recipe, checked whole, and starts its first stage.
#[utoipa::path(post, path = "/v1/verity/recipes", tag = "verity", request_body = CreateRecipeRequest,
    responses((status = 200, body = RecipeObject), (status = 400), (status = 401)))]
pub async fn create_recipe(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateRecipeRequest>,
) -> ApiResult<Json<RecipeObject>> {
    if let Some(name) = &request.name {
        reject_nul("name", name)?;
        if name.is_empty() || name.chars().count() > 200 {
            return Err(ApiError::invalid("name", "must be 1-200 characters"));
        }
    }
    let stages = request.stages.unwrap_or(Value::Null);
    crate::api::extract::reject_nul_json("stages", &stages)?;
    let spec = RecipeSpec::parse(&stages, request.seed, request.guard.as_ref())
        .and_then(|spec| spec.with_budget(request.budget.as_ref()))
        .map_err(|e| ApiError::invalid(e.param, e.message))?;
    let base_model = check_recipe(&state, &principal, &spec).await?;
    let recipe = recipes::NewRecipe {
        id: recipes::recipe_id(),
        org_id: principal.org_id,
        created_by: Some(principal.user_id),
        name: request.name,
        spec,
        base_model,
    };
    recipes::insert_recipe(&state.pool, &recipe).await?;
    tracing::info!(recipe_id = %recipe.id, org_id = %principal.org_id, "recipe created");
    // The first stage starts now rather than at the next pass.
    if let Err(error) = advance::advance(&state, &recipe.id).await {
        tracing::warn!(recipe_id = %recipe.id, %error, "starting a recipe's first stage failed; the next pass retries");
    }
    Ok(Json(find(&state, &principal, &recipe.id, true).await?))
}

/// The org's recipe `id` as the API shows it (with key figures when `summaries`), or 404.
pub async fn find(
    state: &AppState,
    principal: &Principal,
    id: &str,
    summaries: bool,
) -> ApiResult<RecipeObject> {
    reject_nul("recipe_id", id)?;
    let recipe = recipes::get_recipe(&state.pool, principal.org_id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("recipe", id))?;
    recipe_object(state, recipe, summaries).await
}

/// Lists recipes, newest first.
#[utoipa::path(get, path = "/v1/verity/recipes", tag = "verity", params(PageQuery),
    responses((status = 200, body = Page<RecipeObject>), (status = 400), (status = 401)))]
pub async fn list_recipes(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> ApiResult<Json<Page<RecipeObject>>> {
    let limit = query.limit()?;
    if let Some(after) = &query.after {
        reject_nul("after", after)?;
    }
    let rows =
        recipes::list_recipes(&state.pool, principal.org_id, query.after.as_deref(), limit + 1)
            .await?;
    let mut data = Vec::with_capacity(rows.len());
    for recipe in rows {
        data.push(recipe_object(&state, recipe, false).await?);
    }
    Ok(Json(Page::from_fetched(data, limit, |r: &RecipeObject| r.id.clone())))
}

/// One recipe, with each reached stage's key figures.
#[utoipa::path(get, path = "/v1/verity/recipes/{recipe_id}", tag = "verity", params(("recipe_id" = String, Path)),
    responses((status = 200, body = RecipeObject), (status = 404)))]
pub async fn get_recipe(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<RecipeObject>> {
    Ok(Json(find(&state, &principal, &id, true).await?))
}

/// Cancels a running or paused recipe and its current stage.
#[utoipa::path(post, path = "/v1/verity/recipes/{recipe_id}/cancel", tag = "verity", params(("recipe_id" = String, Path)),
    responses((status = 200, body = RecipeObject), (status = 400), (status = 404)))]
pub async fn cancel_recipe(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<RecipeObject>> {
    let current = find(&state, &principal, &id, false).await?;
    let Some(job_ids) = recipes::cancel_recipe(&state.pool, principal.org_id, &id).await? else {
        return Err(ApiError::invalid(
            "recipe_id",
            format!("recipe {id} is {} and cannot be cancelled", current.status),
        ));
    };
    for job_id in job_ids {
        // A stage that already ended stays as it is.
        state.queue.cancel(&job_id).await?;
    }
    tracing::info!(recipe_id = %id, "recipe cancelled");
    Ok(Json(find(&state, &principal, &id, true).await?))
}

/// Resumes a stopped recipe: a paused one starts the stage its guard held back; a failed or
/// cancelled one keeps the stages that succeeded, runs the one that stopped it again (its
/// earlier attempt listed in `earlier_ids`), and the rest follow.
#[utoipa::path(post, path = "/v1/verity/recipes/{recipe_id}/resume", tag = "verity", params(("recipe_id" = String, Path)),
    responses((status = 200, body = RecipeObject), (status = 400), (status = 404)))]
pub async fn resume_recipe(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<RecipeObject>> {
    let current = find(&state, &principal, &id, false).await?;
    let succeeded: Vec<String> = current
        .stages
        .iter()
        .filter(|s| s.status == "succeeded")
        .filter_map(|s| s.id.clone())
        .collect();
    if !recipes::resume_recipe(&state.pool, principal.org_id, &id, &succeeded).await? {
        return Err(ApiError::invalid(
            "recipe_id",
            format!(
                "recipe {id} is {}; only a paused, failed or cancelled recipe resumes",
                current.status
            ),
        ));
    }
    tracing::info!(recipe_id = %id, "recipe resumed");
    if let Err(error) = advance::advance(&state, &id).await {
        tracing::warn!(recipe_id = %id, %error, "resuming a recipe's stage failed; the next pass retries");
    }
    Ok(Json(find(&state, &principal, &id, true).await?))
}
