//! What a model name stands for in the object store, org checked: a registered base model, or
//! a job's model or checkpoint stacked over the model that job started from (recursively, so
//! that jobs chain from any model). The one place that turns a `model` name into weights, for
//! training, judges and inference alike.

use crate::models::ModelRecord;
use sqlx::PgPool;
use uuid::Uuid;

/// Most checkpoints one stack may hold (a chain of jobs longer than this is refused).
pub const MAX_STACK_DEPTH: usize = 64;

/// One checkpoint folder of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackLayer {
    /// The model name it stands for (a `fine_tuned_model` or a checkpoint name).
    pub name: String,
    /// Its published folder: a PEFT adapter or full weights.
    pub storage_prefix: String,
}

/// The weights a model name stands for: a registered base model and the checkpoint folders
/// over it. A full-weights folder replaces everything below it; an adapter is merged into the
/// weights below it (`W + scale · B A`, as its forward computes it).
#[derive(Debug, Clone)]
pub struct ModelStack {
    /// The registered base model at the bottom (the root base that names fine-tuned models).
    pub base: ModelRecord,
    /// Checkpoint folders over the base, bottom first; empty for a base model itself.
    pub layers: Vec<StackLayer>,
}

/// Resolves `name` for `org_id`: a base model the org can see (by its name or its hub id,
/// [`crate::models::model_for_hub_id`]), one of its jobs' checkpoint names, or one of its jobs'
/// `fine_tuned_model` (that job's latest checkpoint), each over the stack of the model its job
/// started from. `None` when the name (or a model under it) does
/// not exist in the org: another org's model looks the same, and an embedding model is no
/// language model.
pub async fn resolve_stack(
    pool: &PgPool,
    org_id: Uuid,
    name: &str,
) -> Result<Option<ModelStack>, sqlx::Error> {
    let mut layers = Vec::new();
    let mut name = match crate::models::model_for_hub_id(pool, org_id, name).await? {
        Some(model) => model,
        None => name.to_string(),
    };
    while layers.len() <= MAX_STACK_DEPTH {
        // A registered fine-tuned model (a job's result) resolves through its job, below: its
        // folder may be an adapter only.
        if let Some(base) = crate::models::get_model(pool, org_id, &name).await? {
            if base.kind == crate::models::EMBEDDING {
                return Ok(None);
            }
            if base.job_id.is_none() {
                layers.reverse();
                return Ok(Some(ModelStack { base, layers }));
            }
        }
        let Some((started_from, storage_prefix)) = checkpoint_of(pool, org_id, &name).await? else {
            return Ok(None);
        };
        layers.push(StackLayer { name, storage_prefix });
        name = started_from;
    }
    Ok(None)
}

/// The checkpoint folder `name` (a checkpoint name or a `fine_tuned_model`) stands for in
/// `org_id`, with the `model` its job started from.
async fn checkpoint_of(
    pool: &PgPool,
    org_id: Uuid,
    name: &str,
) -> Result<Option<(String, String)>, sqlx::Error> {
    Ok(match crate::inference::parse_checkpoint_model_name(name) {
        Some((job_id, step)) => sqlx::query!(
            r#"SELECT j.model, c.storage_prefix, j.id AS job_id, c.step, j.suffix,
                      o.name AS org_name
               FROM checkpoints c
               JOIN jobs j ON j.id = c.job_id
               JOIN orgs o ON o.id = j.org_id
               WHERE j.org_id = $1 AND c.job_id = $2 AND c.step = $3"#,
            org_id,
            job_id,
            step
        )
        .fetch_optional(pool)
        .await?
        .filter(|row| {
            let model = crate::models::fine_tuned_model_name(
                &row.model,
                &row.org_name,
                row.suffix.as_deref(),
                &row.job_id,
            );
            crate::models::checkpoint_model_name(&model, row.step) == name
        })
        .map(|row| (row.model, row.storage_prefix)),
        None => sqlx::query!(
            r#"SELECT j.model, c.storage_prefix FROM jobs j
               JOIN checkpoints c ON c.job_id = j.id
               WHERE j.org_id = $1 AND j.fine_tuned_model = $2
               ORDER BY c.step DESC LIMIT 1"#,
            org_id,
            name
        )
        .fetch_optional(pool)
        .await?
        .map(|row| (row.model, row.storage_prefix)),
    })
}
