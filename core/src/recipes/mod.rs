//! Recipes (Verity extension): ordered stages — fine-tuning jobs, rejection-sampling runs,
//! evaluations — each written as the body it has on its own, later stages naming earlier
//! stages' outputs (`"{{stages.rl.fine_tuned_model}}"`). The server checks a recipe whole at
//! creation and enqueues each stage as an ordinary queue row when the stage before it succeeds;
//! this module holds the spec ([`spec`]) and the rows (`recipes`, `recipe_stages`).

pub mod spec;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

pub use spec::{Guard, RecipeError, RecipeSpec, Reference, Stage, StageKind, ValueType};

/// The states of a recipe.
pub mod state {
    /// Its stages are running (or the next one is about to be enqueued).
    pub const RUNNING: &str = "running";
    /// A guard stopped it before a stage (`error` says why and what to change); resuming starts
    /// the stage anyway.
    pub const PAUSED: &str = "paused";
    /// Every stage succeeded.
    pub const SUCCEEDED: &str = "succeeded";
    /// A stage failed, or could not be enqueued: `error` says which and why.
    pub const FAILED: &str = "failed";
    /// Cancelled by a user (or a stage was).
    pub const CANCELLED: &str = "cancelled";
}

/// A new recipe id (`recipe-…`).
pub fn recipe_id() -> String {
    crate::ids::new_id("recipe")
}

/// A recipe to insert.
#[derive(Debug, Clone)]
pub struct NewRecipe {
    /// `recipe-…`.
    pub id: String,
    /// Owning org.
    pub org_id: Uuid,
    /// Who created it (stages are created on their behalf).
    pub created_by: Option<Uuid>,
    /// A name for people.
    pub name: Option<String>,
    /// The checked spec.
    pub spec: RecipeSpec,
    /// The root base of its first model.
    pub base_model: String,
}

/// A stage row: which queue row runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRecord {
    /// Its index in the recipe.
    pub position: i32,
    /// Its name.
    pub name: String,
    /// Its kind (`fine_tuning_job`, …).
    pub kind: String,
    /// The queue row of its latest attempt, once reached.
    pub job_id: Option<String>,
    /// Queue rows of earlier attempts.
    pub earlier_job_ids: Vec<String>,
    /// The difficulty profile guarding a reinforcement stage, once planned.
    pub guard_job_id: Option<String>,
    /// Whether the guard let the stage start (or a user resumed past it).
    pub guard_passed: bool,
}

/// A recipe row with its stages.
#[derive(Debug, Clone)]
pub struct RecipeRecord {
    /// `recipe-…`.
    pub id: String,
    /// Owning org.
    pub org_id: Uuid,
    /// Who created it.
    pub created_by: Option<Uuid>,
    /// A name for people.
    pub name: Option<String>,
    /// The spec as stored ([`RecipeSpec::from_stored`]).
    pub spec: Value,
    /// The root base of its first model.
    pub base_model: String,
    /// `running`, `paused`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// Why it stopped (`{stage, message, …}`).
    pub error: Option<Value>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// End time, for terminal states.
    pub finished_at: Option<DateTime<Utc>>,
    /// Its stages, in order.
    pub stages: Vec<StageRecord>,
}

struct RecipeRow {
    id: String,
    org_id: Uuid,
    created_by: Option<Uuid>,
    name: Option<String>,
    spec: Value,
    base_model: String,
    state: String,
    error: Option<Value>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

impl RecipeRow {
    fn with(self, stages: Vec<StageRecord>) -> RecipeRecord {
        RecipeRecord {
            id: self.id,
            org_id: self.org_id,
            created_by: self.created_by,
            name: self.name,
            spec: self.spec,
            base_model: self.base_model,
            state: self.state,
            error: self.error,
            created_at: self.created_at,
            finished_at: self.finished_at,
            stages,
        }
    }
}

/// Inserts a running recipe and its stage rows.
pub async fn insert_recipe(pool: &PgPool, recipe: &NewRecipe) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO recipes (id, org_id, created_by, name, spec, base_model)
         VALUES ($1, $2, $3, $4, $5, $6)",
        recipe.id,
        recipe.org_id,
        recipe.created_by,
        recipe.name,
        recipe.spec.to_value(),
        recipe.base_model
    )
    .execute(&mut *tx)
    .await?;
    for (position, stage) in recipe.spec.stages.iter().enumerate() {
        sqlx::query!(
            "INSERT INTO recipe_stages (recipe_id, position, name, kind) VALUES ($1, $2, $3, $4)",
            recipe.id,
            position as i32,
            stage.name,
            stage.kind.as_str()
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

async fn stages_of<'e, E>(executor: E, recipe_id: &str) -> Result<Vec<StageRecord>, sqlx::Error>
where
    E: sqlx::PgExecutor<'e>,
{
    sqlx::query_as!(
        StageRecord,
        "SELECT position, name, kind, job_id, earlier_job_ids, guard_job_id, guard_passed
         FROM recipe_stages
         WHERE recipe_id = $1 ORDER BY position",
        recipe_id
    )
    .fetch_all(executor)
    .await
}

/// The org's recipe `id`, with its stages.
pub async fn get_recipe(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<RecipeRecord>, sqlx::Error> {
    let row = sqlx::query_as!(
        RecipeRow,
        "SELECT id, org_id, created_by, name, spec, base_model, state, error, created_at, finished_at
         FROM recipes WHERE org_id = $1 AND id = $2",
        org_id,
        id
    )
    .fetch_optional(pool)
    .await?;
    match row {
        Some(row) => {
            let stages = stages_of(pool, &row.id).await?;
            Ok(Some(row.with(stages)))
        }
        None => Ok(None),
    }
}

/// The org's recipes, newest first, after recipe `after` (exclusive); at most `limit`.
pub async fn list_recipes(
    pool: &PgPool,
    org_id: Uuid,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<RecipeRecord>, sqlx::Error> {
    let rows = sqlx::query_as!(
        RecipeRow,
        "SELECT id, org_id, created_by, name, spec, base_model, state, error, created_at, finished_at
         FROM recipes r
         WHERE org_id = $1 AND ($2::text IS NULL OR (created_at, id) <
               (SELECT created_at, id FROM recipes WHERE org_id = $1 AND id = $2))
         ORDER BY created_at DESC, id DESC LIMIT $3",
        org_id,
        after,
        limit
    )
    .fetch_all(pool)
    .await?;
    let mut recipes = Vec::with_capacity(rows.len());
    for row in rows {
        let stages = stages_of(pool, &row.id).await?;
        recipes.push(row.with(stages));
    }
    Ok(recipes)
}

/// Ids of the running recipes of every org, oldest first.
pub async fn running_recipe_ids(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!("SELECT id FROM recipes WHERE state = 'running' ORDER BY created_at, id")
        .fetch_all(pool)
        .await
}

/// A running recipe held for advancing: the transaction keeps its row locked, so that one
/// server at a time advances it; `None` when it is not running or another server holds it.
pub struct HeldRecipe {
    /// The lock.
    pub tx: Transaction<'static, Postgres>,
    /// The recipe as it stood when locked.
    pub recipe: RecipeRecord,
}

/// Locks running recipe `id` for advancing (skipping it when another server holds it).
pub async fn hold_running(pool: &PgPool, id: &str) -> Result<Option<HeldRecipe>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query_as!(
        RecipeRow,
        "SELECT id, org_id, created_by, name, spec, base_model, state, error, created_at, finished_at
         FROM recipes WHERE id = $1 AND state = 'running' FOR UPDATE SKIP LOCKED",
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let stages = stages_of(&mut *tx, id).await?;
    Ok(Some(HeldRecipe { tx, recipe: row.with(stages) }))
}

impl HeldRecipe {
    /// Records `job_id` as the queue row of stage `position` (before it is enqueued).
    pub async fn plan_stage(&mut self, position: i32, job_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE recipe_stages SET job_id = $3 WHERE recipe_id = $1 AND position = $2",
            self.recipe.id,
            position,
            job_id
        )
        .execute(&mut *self.tx)
        .await?;
        sqlx::query!("UPDATE recipes SET updated_at = now() WHERE id = $1", self.recipe.id)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    /// Records `job_id` as the difficulty profile guarding stage `position` (before it is
    /// enqueued).
    pub async fn plan_guard(&mut self, position: i32, job_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE recipe_stages SET guard_job_id = $3 WHERE recipe_id = $1 AND position = $2",
            self.recipe.id,
            position,
            job_id
        )
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Lets stage `position` start: its guard passed.
    pub async fn pass_guard(&mut self, position: i32) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE recipe_stages SET guard_passed = true WHERE recipe_id = $1 AND position = $2",
            self.recipe.id,
            position
        )
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Pauses the recipe with `error` (a guard's warning) and releases it.
    pub async fn pause(mut self, error: Value) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE recipes SET state = 'paused', error = $2, updated_at = now() WHERE id = $1",
            self.recipe.id,
            error
        )
        .execute(&mut *self.tx)
        .await?;
        self.tx.commit().await
    }

    /// Forgets the queue row planned for stage `position` (it was refused, never inserted).
    pub async fn forget_plan(&mut self, position: i32) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE recipe_stages SET job_id = NULL WHERE recipe_id = $1 AND position = $2",
            self.recipe.id,
            position
        )
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Ends the recipe in `state` (with `error` for failed and cancelled ones) and releases it.
    pub async fn finish(mut self, state: &str, error: Option<Value>) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE recipes SET state = $2, error = $3, updated_at = now(), finished_at = now()
             WHERE id = $1",
            self.recipe.id,
            state,
            error
        )
        .execute(&mut *self.tx)
        .await?;
        self.tx.commit().await
    }

    /// Releases the recipe, keeping what was planned.
    pub async fn release(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

/// Cancels the org's running or paused recipe `id`: the queue rows of its current stage (its
/// job and its guard), returned, are for the caller to cancel. `None` when there is no such
/// recipe.
pub async fn cancel_recipe(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<Vec<String>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let found = sqlx::query_scalar!(
        "UPDATE recipes SET state = 'cancelled', updated_at = now(), finished_at = now(),
                error = jsonb_build_object('message', 'cancelled by a user')
         WHERE org_id = $1 AND id = $2 AND state IN ('running', 'paused') RETURNING id",
        org_id,
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    if found.is_none() {
        return Ok(None);
    }
    let current = sqlx::query!(
        "SELECT job_id, guard_job_id FROM recipe_stages
         WHERE recipe_id = $1 AND (job_id IS NOT NULL OR guard_job_id IS NOT NULL)
         ORDER BY position DESC LIMIT 1",
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(
        current
            .map(|row| row.job_id.into_iter().chain(row.guard_job_id).collect())
            .unwrap_or_default(),
    ))
}

/// Resumes the org's paused, failed or cancelled recipe `id`. A paused recipe starts the stage
/// its guard held back. A failed or cancelled one keeps the stages that succeeded (their queue
/// rows in `succeeded_jobs`); the others forget their row (kept among the earlier attempts) and
/// run again, a guard that did not pass included. False when there is no such stopped recipe.
pub async fn resume_recipe(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
    succeeded_jobs: &[String],
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let previous = sqlx::query_scalar!(
        "SELECT state FROM recipes WHERE org_id = $1 AND id = $2 FOR UPDATE",
        org_id,
        id
    )
    .fetch_optional(&mut *tx)
    .await?
    .filter(|s| [state::PAUSED, state::FAILED, state::CANCELLED].contains(&s.as_str()));
    if previous.is_some() {
        sqlx::query!(
            "UPDATE recipes SET state = 'running', error = NULL, updated_at = now(),
                    finished_at = NULL WHERE id = $1",
            id
        )
        .execute(&mut *tx)
        .await?;
    }
    match previous.as_deref() {
        None => return Ok(false),
        Some(state::PAUSED) => {
            sqlx::query!(
                "UPDATE recipe_stages SET guard_passed = true
                 WHERE recipe_id = $1 AND guard_job_id IS NOT NULL AND NOT guard_passed",
                id
            )
            .execute(&mut *tx)
            .await?;
        }
        Some(_) => {
            sqlx::query!(
                "UPDATE recipe_stages SET earlier_job_ids = earlier_job_ids || job_id, job_id = NULL
                 WHERE recipe_id = $1 AND job_id IS NOT NULL AND NOT (job_id = ANY($2))",
                id,
                succeeded_jobs
            )
            .execute(&mut *tx)
            .await?;
            sqlx::query!(
                "UPDATE recipe_stages SET guard_job_id = NULL WHERE recipe_id = $1 AND NOT guard_passed",
                id
            )
            .execute(&mut *tx)
            .await?;
        }
    }
    tx.commit().await?;
    Ok(true)
}
