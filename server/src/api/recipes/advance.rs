//! Running recipes: each pass looks at every running recipe's stages in order, takes the outputs
//! of those that succeeded, stops the recipe at one that failed or was cancelled, and enqueues
//! the first stage not yet started with its references filled in — a reinforcement stage after
//! its guard (a difficulty profile on the model it starts from) predicted enough groups with an
//! advantage, else the recipe pauses with a warning that names the fixes. A queue row's id is
//! recorded before the row is inserted, so a server that dies between the two inserts that same
//! id on the next pass (a second server racing it finds the row there) — never a second row.

use super::stages;
use crate::api::auth::{Principal, Via};
use crate::api::error::ApiError;
use crate::api::state::AppState;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use verity_core::budget::{Caps, Usage};
use verity_core::difficulty::ProfileReport;
use verity_core::jobs::JobRecord;
use verity_core::recipes::{self, Guard, HeldRecipe, RecipeSpec, Reference, StageKind};
use verity_core::sampling_runs::RunKind;
use verity_core::tenancy::Role;
use verity_core::JobState;

/// How often the running recipes are looked at (a job change wakes the loop sooner).
pub const PASS_INTERVAL: Duration = Duration::from_secs(2);

/// What [`advance`] did to a recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advance {
    /// Not running, or another server holds it.
    Skipped,
    /// Its current stage is queued or running.
    Waiting,
    /// Stage `position` was enqueued.
    Started(usize),
    /// The guard of stage `position` (a difficulty profile) was enqueued.
    Guarding(usize),
    /// The guard of stage `position` paused the recipe.
    Paused(usize),
    /// It ended in this state.
    Finished(&'static str),
}

/// Advances every running recipe once; failures of one recipe (a lost connection) are logged
/// and left for the next pass.
pub async fn advance_all(state: &AppState) -> Result<Vec<(String, Advance)>, sqlx::Error> {
    let mut done = Vec::new();
    for id in recipes::running_recipe_ids(&state.pool).await? {
        match advance(state, &id).await {
            Ok(step) => done.push((id, step)),
            Err(error) => {
                tracing::warn!(recipe_id = %id, %error, "advancing a recipe failed; retrying at the next pass")
            }
        }
    }
    Ok(done)
}

/// Spawns the loop that advances running recipes every [`PASS_INTERVAL`] until the state's
/// background tasks stop.
pub fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PASS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(error) = advance_all(&state).await {
                tracing::warn!(%error, "listing running recipes failed; retrying");
            }
        }
    })
}

/// The caller stages run as: the recipe's creator, in its org.
fn creator(recipe: &recipes::RecipeRecord) -> Option<Principal> {
    Some(Principal {
        user_id: recipe.created_by?,
        org_id: recipe.org_id,
        role: Role::Member,
        key_id: None,
        via: Via::ApiKey,
    })
}

/// The outputs of a stage whose queue row succeeded (`fine_tuned_model`, `file`).
pub fn outputs_of(kind: StageKind, job: &JobRecord) -> BTreeMap<String, Value> {
    let mut outputs = BTreeMap::new();
    match kind {
        StageKind::FineTuningJob => {
            if let Some(model) = &job.fine_tuned_model {
                outputs.insert("fine_tuned_model".to_string(), Value::String(model.clone()));
            }
        }
        StageKind::RejectionSampling => {
            let file =
                job.result.as_ref().and_then(|r| r.get("output_file")).filter(|f| f.is_string());
            if let Some(file) = file {
                outputs.insert("file".to_string(), file.clone());
            }
        }
        StageKind::Evaluation => {}
    }
    outputs
}

/// What the queue rows of a recipe's stages have used together: every attempt, or with
/// `earlier_only` only the earlier ones (the caller has the latest attempts' rows).
pub async fn recipe_usage(
    state: &AppState,
    org_id: uuid::Uuid,
    spec: &RecipeSpec,
    records: &[recipes::StageRecord],
    earlier_only: bool,
) -> Result<Usage, sqlx::Error> {
    let mut used = Usage::default();
    for (stage, record) in spec.stages.iter().zip(records) {
        let latest = record.job_id.iter().filter(|_| !earlier_only);
        for id in latest.chain(&record.earlier_job_ids) {
            let kind = stage.kind.job_kind();
            if let Some(job) =
                verity_core::jobs::get_job_of_kind(&state.pool, org_id, kind, id).await?
            {
                add_usage(&mut used, &job);
            }
        }
    }
    Ok(used)
}

/// Adds what `job` has used to `used`.
pub fn add_usage(used: &mut Usage, job: &JobRecord) {
    let job = job.usage();
    used.wall_seconds += job.wall_seconds;
    used.tokens += job.tokens;
}

/// A guard's difficulty-profile report, once its row succeeded.
pub fn guard_report(profile: &JobRecord) -> Option<ProfileReport> {
    let result = profile.result.clone().filter(|_| profile.state == JobState::Succeeded)?;
    serde_json::from_value(result).ok()
}

/// Why a stage may not start under the recipe's budget (`None`: it may), and what is left.
fn budget_spent(spec: &RecipeSpec, used: Usage) -> (Option<String>, Caps) {
    let left = spec.budget.left_after(used);
    let spent = [
        (
            "max_wall_seconds",
            spec.budget.max_wall_seconds,
            left.max_wall_seconds,
            format!("{:.0} s", used.wall_seconds),
        ),
        ("max_tokens", spec.budget.max_tokens, left.max_tokens, format!("{} tokens", used.tokens)),
    ]
    .into_iter()
    .find(|(_, cap, left, _)| cap.is_some() && *left == Some(0))
    .map(|(field, cap, _, used)| {
        format!(
            "the recipe's budget is spent: its stages used {used} of budget.{field} = {}",
            cap.unwrap_or_default()
        )
    });
    (spent, left)
}

/// The message of a queue row's error, if it has one.
fn error_message(job: &JobRecord) -> Option<String> {
    job.error.as_ref()?.get("message")?.as_str().map(str::to_string)
}

/// Why a reference cannot be filled in although its stage succeeded.
fn missing_output(reference: &Reference) -> String {
    match reference.output.as_str() {
        "file" => format!(
            "{reference} is empty: stage {:?} kept no samples (no completion passed its grader), \
             so there is nothing to train on",
            reference.stage
        ),
        _ => format!("{reference} is empty: stage {:?} produced no such output", reference.stage),
    }
}

/// The error a recipe stops with.
fn stop_error(
    position: usize,
    name: &str,
    job: Option<&str>,
    param: Option<String>,
    message: String,
) -> Value {
    json!({"stage": name, "position": position, "job": job, "param": param, "message": message})
}

/// Advances recipe `id` by at most one stage start (see the module docs).
pub async fn advance(state: &AppState, id: &str) -> Result<Advance, sqlx::Error> {
    let Some(mut held) = recipes::hold_running(&state.pool, id).await? else {
        return Ok(Advance::Skipped);
    };
    let spec = match RecipeSpec::from_stored(&held.recipe.spec) {
        Ok(spec) => spec,
        Err(e) => {
            let error = json!({"message": format!("its stored spec no longer reads: {e}")});
            held.finish(recipes::state::FAILED, Some(error)).await?;
            return Ok(Advance::Finished(recipes::state::FAILED));
        }
    };
    let Some(principal) = creator(&held.recipe) else {
        let error = json!({"message": "the user who created the recipe no longer exists"});
        held.finish(recipes::state::FAILED, Some(error)).await?;
        return Ok(Advance::Finished(recipes::state::FAILED));
    };
    let mut outputs: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for (position, stage) in spec.stages.iter().enumerate() {
        let Some(record) = held.recipe.stages.get(position).cloned() else {
            let error = json!({"message": format!("stage {} has no row", stage.name)});
            held.finish(recipes::state::FAILED, Some(error)).await?;
            return Ok(Advance::Finished(recipes::state::FAILED));
        };
        let planned = record.job_id.clone();
        let job = match &planned {
            Some(job_id) => {
                let kind = stage.kind.job_kind();
                verity_core::jobs::get_job_of_kind(&state.pool, principal.org_id, kind, job_id)
                    .await?
            }
            None => None,
        };
        if let Some(job) = job {
            match job.state.as_str() {
                "succeeded" => {
                    outputs.insert(stage.name.clone(), outputs_of(stage.kind, &job));
                    continue;
                }
                "failed" | "cancelled" => {
                    let message = error_message(&job).unwrap_or_else(|| {
                        format!("its {} was {}", stage.kind.as_str(), job.state)
                    });
                    let (end, message) = if job.state == JobState::Failed {
                        (
                            recipes::state::FAILED,
                            format!("stage {:?} failed: {message}", stage.name),
                        )
                    } else {
                        (recipes::state::CANCELLED, format!("stage {:?} was cancelled", stage.name))
                    };
                    let error = stop_error(position, &stage.name, Some(&job.id), None, message);
                    held.finish(end, Some(error)).await?;
                    return Ok(Advance::Finished(end));
                }
                _ => {
                    held.release().await?;
                    return Ok(Advance::Waiting);
                }
            }
        }
        // The first stage not started (or planned but never inserted): fill in its references.
        let resolve =
            |_: &str, r: &Reference| outputs.get(&r.stage).and_then(|o| o.get(&r.output)).cloned();
        let (body, unresolved) = stage.render(&held.recipe.base_model, spec.seed, resolve);
        if let Some(path) = unresolved.first() {
            let reference = stage.references.iter().find(|(p, _)| p == path).map(|(_, r)| r);
            let message = reference.map(missing_output).unwrap_or_default();
            let param = format!("stages[{position}].{}.{path}", stage.kind.as_str());
            let error = stop_error(position, &stage.name, None, Some(param), message);
            held.finish(recipes::state::FAILED, Some(error)).await?;
            return Ok(Advance::Finished(recipes::state::FAILED));
        }
        let mut left = Caps::default();
        if planned.is_none() && spec.budget.any() {
            let records = &held.recipe.stages;
            let used = recipe_usage(state, principal.org_id, &spec, records, false).await?;
            let (spent, remaining) = budget_spent(&spec, used);
            if let Some(message) = spent {
                let message = format!("stage {:?} was not started: {message}", stage.name);
                let error = stop_error(position, &stage.name, None, Some("budget".into()), message);
                held.finish(recipes::state::FAILED, Some(error)).await?;
                return Ok(Advance::Finished(recipes::state::FAILED));
            }
            left = remaining;
        }
        if let (Some(guard), None, false) = (&spec.guard, &planned, record.guard_passed) {
            if stage.is_reinforcement() {
                match check_guard(state, &principal, &mut held, position, stage, guard, &record)
                    .await?
                {
                    GuardVerdict::Pass => held.pass_guard(position as i32).await?,
                    GuardVerdict::Start(guard_id) => {
                        held.release().await?;
                        let what = What::Guard(*guard);
                        return start(
                            state, &principal, id, position, stage, body, &guard_id, what,
                        )
                        .await;
                    }
                    GuardVerdict::Wait => {
                        held.release().await?;
                        return Ok(Advance::Waiting);
                    }
                    GuardVerdict::Stop(end, error) => {
                        if end == recipes::state::PAUSED {
                            held.pause(error).await?;
                            return Ok(Advance::Paused(position));
                        }
                        held.finish(end, Some(error)).await?;
                        return Ok(Advance::Finished(end));
                    }
                }
            }
        }
        let job_id = match planned {
            Some(job_id) => job_id,
            None => {
                let job_id = stage.kind.new_job_id();
                held.plan_stage(position as i32, &job_id).await?;
                job_id
            }
        };
        // The plan is committed before the row is inserted (see the module docs).
        held.release().await?;
        let advance =
            start(state, &principal, id, position, stage, body, &job_id, What::Stage).await?;
        if left.any() && stage.kind == StageKind::FineTuningJob {
            cap_stage(state, &principal, &job_id, left).await?;
        }
        return Ok(advance);
    }
    held.finish(recipes::state::SUCCEEDED, None).await?;
    Ok(Advance::Finished(recipes::state::SUCCEEDED))
}

/// Caps fine-tuning stage job `job_id` at what the recipe's budget has `left` (its own caps
/// kept where tighter): the job pauses itself there, as at its own budget.
async fn cap_stage(
    state: &AppState,
    principal: &Principal,
    job_id: &str,
    left: Caps,
) -> Result<(), sqlx::Error> {
    let kind = StageKind::FineTuningJob.job_kind();
    let job =
        verity_core::jobs::get_job_of_kind(&state.pool, principal.org_id, kind, job_id).await?;
    if let Some(job) = job {
        let caps = job.caps().tightest(left);
        verity_core::budget::set_caps(&state.pool, principal.org_id, job_id, caps).await?;
    }
    Ok(())
}

/// What [`check_guard`] found.
enum GuardVerdict {
    /// The stage may start.
    Pass,
    /// The guard's profile (this id) is to be enqueued.
    Start(String),
    /// The profile is queued or running.
    Wait,
    /// The recipe ends or pauses (`paused`, `failed`, `cancelled`) with this error.
    Stop(&'static str, Value),
}

/// Where the guard of reinforcement stage `position` stands: its profile planned (and to be
/// enqueued), under way, or done — passing when the predicted zero-advantage fraction is within
/// the guard's limit, else pausing the recipe with a warning that names the fixes.
async fn check_guard(
    state: &AppState,
    principal: &Principal,
    held: &mut HeldRecipe,
    position: usize,
    stage: &recipes::Stage,
    guard: &Guard,
    record: &recipes::StageRecord,
) -> Result<GuardVerdict, sqlx::Error> {
    let Some(guard_id) = record.guard_job_id.clone() else {
        let guard_id = RunKind::DifficultyProfile.new_id();
        held.plan_guard(position as i32, &guard_id).await?;
        return Ok(GuardVerdict::Start(guard_id));
    };
    let kind = RunKind::DifficultyProfile.as_str();
    let profile =
        verity_core::jobs::get_job_of_kind(&state.pool, principal.org_id, kind, &guard_id).await?;
    let Some(profile) = profile else { return Ok(GuardVerdict::Start(guard_id)) };
    match profile.state.as_str() {
        "succeeded" => {
            let Some(report) = guard_report(&profile) else {
                let message =
                    format!("the guard of stage {:?} ({guard_id}) wrote no report", stage.name);
                let error = stop_error(position, &stage.name, Some(&guard_id), None, message);
                return Ok(GuardVerdict::Stop(recipes::state::FAILED, error));
            };
            let difficulty = &report.difficulty;
            let fraction = difficulty.predicted_zero_advantage_fraction;
            if fraction <= guard.max_zero_advantage_fraction {
                tracing::info!(stage = %stage.name, guard = %guard_id, fraction, "recipe guard passed");
                return Ok(GuardVerdict::Pass);
            }
            let model = profile.model.clone();
            let message = format!(
                "stage {:?} paused before it started: its difficulty profile ({guard_id}) on {model} \
                 predicts {:.0}% of its groups would score alike — no advantage, so those steps \
                 cannot move the weights (the guard allows {:.0}%; {} prompts always solved, {} \
                 never). Fixes: a larger group_size or a higher temperature in the stage; a \
                 filtered training file (POST /v1/verity/difficulty_profiles/{guard_id}/filtered_file \
                 drops the always- and never-solved prompts); a lighter warm start in the stage \
                 before (fewer epochs, a lower learning rate, LoRA). Resume the recipe to run the \
                 stage anyway, or cancel it and create it again with the change.",
                stage.name,
                fraction * 100.0,
                guard.max_zero_advantage_fraction * 100.0,
                difficulty.always_solved,
                difficulty.never_solved,
            );
            let error = json!({"stage": stage.name, "position": position, "guard": guard_id,
                "predicted_zero_advantage_fraction": fraction,
                "max_zero_advantage_fraction": guard.max_zero_advantage_fraction,
                "always_solved": difficulty.always_solved, "never_solved": difficulty.never_solved,
                "message": message});
            Ok(GuardVerdict::Stop(recipes::state::PAUSED, error))
        }
        "failed" | "cancelled" => {
            let why = error_message(&profile).unwrap_or_else(|| "no reason given".into());
            let (end, message) = if profile.state == JobState::Failed {
                let message =
                    format!("the guard of stage {:?} ({guard_id}) failed: {why}", stage.name);
                (recipes::state::FAILED, message)
            } else {
                let message =
                    format!("the guard of stage {:?} ({guard_id}) was cancelled", stage.name);
                (recipes::state::CANCELLED, message)
            };
            Ok(GuardVerdict::Stop(
                end,
                stop_error(position, &stage.name, Some(&guard_id), None, message),
            ))
        }
        _ => Ok(GuardVerdict::Wait),
    }
}

/// What [`start`] enqueues for a stage.
#[derive(Debug, Clone, Copy)]
enum What {
    /// The stage itself.
    Stage,
    /// The difficulty profile guarding it.
    Guard(Guard),
}

/// Enqueues stage `position` (or its guard) as `job_id`; a refusal (the stage's own checks, on
/// the filled-in body) stops the recipe, naming the field; a server-side failure is left for the
/// next pass.
#[allow(clippy::too_many_arguments)]
async fn start(
    state: &AppState,
    principal: &Principal,
    recipe_id: &str,
    position: usize,
    stage: &recipes::Stage,
    body: serde_json::Map<String, Value>,
    job_id: &str,
    what: What,
) -> Result<Advance, sqlx::Error> {
    let (result, kind, started) = match what {
        What::Stage => (
            stages::enqueue(state, principal, stage.kind, body, job_id).await,
            stage.kind.job_kind(),
            Advance::Started(position),
        ),
        What::Guard(guard) => (
            stages::enqueue_guard(state, principal, body, &guard, job_id).await,
            RunKind::DifficultyProfile.as_str(),
            Advance::Guarding(position),
        ),
    };
    let exists = || async {
        verity_core::jobs::get_job_of_kind(&state.pool, principal.org_id, kind, job_id)
            .await
            .map(|job| job.is_some())
    };
    match result {
        Ok(()) => {
            tracing::info!(recipe_id, stage = %stage.name, job_id, "recipe stage started");
            Ok(started)
        }
        // A server racing this one inserted it first.
        Err(_) if exists().await? => Ok(started),
        Err(error) if error.status.is_client_error() => {
            let error: ApiError = stages::under_stage(error, position, &stage.name, stage.kind);
            tracing::info!(recipe_id, stage = %stage.name, message = %error.message, "recipe stage refused; the recipe fails");
            let Some(held) = recipes::hold_running(&state.pool, recipe_id).await? else {
                return Ok(Advance::Skipped);
            };
            let stopped = stop_error(position, &stage.name, None, error.param, error.message);
            match what {
                What::Stage => finish_unless_started(held, position, stopped).await,
                What::Guard(_) => {
                    held.finish(recipes::state::FAILED, Some(stopped)).await?;
                    Ok(Advance::Finished(recipes::state::FAILED))
                }
            }
        }
        Err(error) => {
            tracing::warn!(recipe_id, stage = %stage.name, message = %error.message, "starting a recipe stage failed; retrying at the next pass");
            Ok(Advance::Waiting)
        }
    }
}

/// Fails the held recipe with `error` unless stage `position` moved on meanwhile.
async fn finish_unless_started(
    mut held: HeldRecipe,
    position: usize,
    error: Value,
) -> Result<Advance, sqlx::Error> {
    if held.recipe.stages.get(position).and_then(|s| s.job_id.as_ref()).is_none() {
        held.release().await?;
        return Ok(Advance::Skipped);
    }
    held.forget_plan(position as i32).await?;
    held.finish(recipes::state::FAILED, Some(error)).await?;
    Ok(Advance::Finished(recipes::state::FAILED))
}
