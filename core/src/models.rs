//! Registered models: base models (shared or per org) and fine-tuned ones.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// A model row.
#[derive(Debug, Clone)]
pub struct ModelRecord {
    /// The model's name, used as `model` in job requests.
    pub id: String,
    /// Owning org; `None` for a base model every org sees.
    pub org_id: Option<Uuid>,
    /// `base`, `fine_tuned` or `embedding`.
    pub kind: String,
    /// Folder in the object store.
    pub storage_prefix: String,
    /// `hf`, `gguf` or `peft`.
    pub format: String,
    /// Extra facts (architecture, size, …).
    pub config: Value,
    /// Job that produced it (fine-tuned models).
    pub job_id: Option<String>,
    /// Registration time.
    pub created_at: DateTime<Utc>,
    /// The hub id (`OWNER/NAME`) that names it too ([`model_for_hub_id`]), if any.
    pub hub_id: Option<String>,
}

/// Models `org_id` can see (shared ones and its own), by name.
pub async fn list_models(pool: &PgPool, org_id: Uuid) -> Result<Vec<ModelRecord>, sqlx::Error> {
    sqlx::query_as!(
        ModelRecord,
        r#"SELECT id, org_id, kind, storage_prefix, format, config, job_id, created_at, hub_id
           FROM models
           WHERE org_id IS NULL OR org_id = $1 ORDER BY id"#,
        org_id
    )
    .fetch_all(pool)
    .await
}

/// The model `id` if `org_id` can see it.
pub async fn get_model(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<ModelRecord>, sqlx::Error> {
    sqlx::query_as!(
        ModelRecord,
        r#"SELECT id, org_id, kind, storage_prefix, format, config, job_id, created_at, hub_id
           FROM models
           WHERE id = $2 AND (org_id IS NULL OR org_id = $1)"#,
        org_id,
        id
    )
    .fetch_optional(pool)
    .await
}

/// The model `id` whoever owns it (workers and admin commands; API handlers use [`get_model`],
/// which checks the caller's org).
pub async fn model_by_id(pool: &PgPool, id: &str) -> Result<Option<ModelRecord>, sqlx::Error> {
    sqlx::query_as!(
        ModelRecord,
        r#"SELECT id, org_id, kind, storage_prefix, format, config, job_id, created_at, hub_id
           FROM models
           WHERE id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await
}

/// Longest part of a hub id the hub accepts.
const MAX_HUB_ID_PART: usize = 96;

/// Checks a hub id against the hub's rules for repository ids: `OWNER/NAME`, two parts of 1 to
/// 96 letters, digits, `-`, `_` or `.`, not starting or ending with `-` or `.`, without `--` or
/// `..`. The message is safe to show (it never repeats the id).
pub fn check_hub_id(id: &str) -> Result<(), &'static str> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= MAX_HUB_ID_PART
            && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("--")
            && !p.contains("..")
    };
    match id.split_once('/') {
        Some((owner, name)) if part_ok(owner) && part_ok(name) => Ok(()),
        _ => Err("a hub id is OWNER/NAME, each part 1 to 96 letters, digits, `-`, `_` or `.`, \
                  not starting or ending with `-` or `.`, without `--` or `..`"),
    }
}

/// The name of the model `org_id` can see whose hub id is `hub_id`, if there is one: the org's
/// own before a shared one. A name without `/` is never a hub id (so the lookup is skipped).
pub async fn model_for_hub_id(
    pool: &PgPool,
    org_id: Uuid,
    hub_id: &str,
) -> Result<Option<String>, sqlx::Error> {
    if !hub_id.contains('/') {
        return Ok(None);
    }
    sqlx::query_scalar!(
        "SELECT id FROM models WHERE hub_id = $1 AND (org_id IS NULL OR org_id = $2)
         ORDER BY org_id IS NULL LIMIT 1",
        hub_id,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// The model holding hub id `hub_id` in one scope: org `org_id`'s models, or the shared ones
/// (`None`). Hub ids are unique per scope.
pub async fn hub_id_holder(
    pool: &PgPool,
    org_id: Option<Uuid>,
    hub_id: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT id FROM models WHERE hub_id = $1 AND org_id IS NOT DISTINCT FROM $2",
        hub_id,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// What [`set_hub_id`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubIdSet {
    /// The model now answers to the hub id too.
    Set,
    /// Another model of the same scope has that hub id: its name.
    Taken(String),
    /// No model of that name.
    NoModel,
}

/// Gives model `id` the hub id `hub_id` (checked with [`check_hub_id`] by the caller), unless
/// another model of its scope (its org's, or the shared ones) has it.
pub async fn set_hub_id(pool: &PgPool, id: &str, hub_id: &str) -> Result<HubIdSet, sqlx::Error> {
    let scope = sqlx::query_scalar!("SELECT org_id FROM models WHERE id = $1", id)
        .fetch_optional(pool)
        .await?;
    let Some(org_id) = scope else { return Ok(HubIdSet::NoModel) };
    if let Some(holder) = hub_id_holder(pool, org_id, hub_id).await? {
        if holder != id {
            return Ok(HubIdSet::Taken(holder));
        }
    }
    let updated =
        sqlx::query!("UPDATE models SET hub_id = $2 WHERE id = $1", id, hub_id).execute(pool).await;
    match updated {
        Ok(done) if done.rows_affected() == 0 => Ok(HubIdSet::NoModel),
        Ok(_) => Ok(HubIdSet::Set),
        // Two registrations raced for one hub id: the other won.
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            Ok(match hub_id_holder(pool, org_id, hub_id).await? {
                Some(holder) => HubIdSet::Taken(holder),
                None => HubIdSet::NoModel,
            })
        }
        Err(e) => Err(e),
    }
}

/// `OWNER/NAME[@REVISION]` split into the hub id (checked with [`check_hub_id`]) and the
/// revision (a branch, tag or commit; `main` when none is given). The message is safe to show.
pub fn parse_hub_ref(spec: &str) -> Result<(String, String), String> {
    let (id, revision) = match spec.rsplit_once('@') {
        Some((id, revision)) => (id, revision),
        None => (spec, "main"),
    };
    if let Err(rule) = check_hub_id(id) {
        return Err(format!("not a hub model name OWNER/NAME[@REVISION]: {rule}"));
    }
    let revision_ok = !revision.is_empty()
        && revision.len() <= 255
        && !revision.contains("..")
        && !revision.starts_with('/')
        && revision.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if !revision_ok {
        return Err("the part after `@` is not a revision (a branch, tag or commit)".to_string());
    }
    Ok((id.to_string(), revision.to_string()))
}

/// The name a pulled model gets when none is given: the part of its checked hub id
/// (`OWNER/NAME`) after the `/`.
pub fn default_pull_name(hub_id: &str) -> String {
    hub_id.rsplit('/').next().unwrap_or(hub_id).to_string()
}

/// Checks a new model's name: the one name rule ([`crate::names::check_name`]: 1 to 200 bytes,
/// not `.` or `..`, no `/`, `\` or control characters), and no whitespace, not starting with
/// `ft:`.
pub fn check_model_name(id: &str) -> Result<(), String> {
    crate::names::check_name(id).map_err(|e| format!("invalid name: {e}"))?;
    if id.chars().any(char::is_whitespace) || id.starts_with("ft:") {
        return Err("a name without whitespace, not starting with ft:".to_string());
    }
    Ok(())
}

/// Registers a base model; returns false when the name is taken.
pub async fn insert_base_model(
    pool: &PgPool,
    org_id: Option<Uuid>,
    id: &str,
    storage_prefix: &str,
    format: &str,
    config: &Value,
) -> Result<bool, sqlx::Error> {
    let folder = StoredModel { storage_prefix, format, config };
    insert_model(pool, org_id, BASE, id, &folder).await
}

/// Kind of a base model (trainable, servable, a judge).
pub const BASE: &str = "base";
/// Kind of an embedding model (a sentence-transformers folder for `cosine` graders).
pub const EMBEDDING: &str = "embedding";

/// Where a model's files are and what they hold.
#[derive(Debug, Clone, Copy)]
pub struct StoredModel<'a> {
    /// Folder in the object store.
    pub storage_prefix: &'a str,
    /// `hf` or `gguf`.
    pub format: &'a str,
    /// Extra facts (architecture, size, …).
    pub config: &'a Value,
}

/// Registers a model of `kind` ([`BASE`] or [`EMBEDDING`]); returns false when the name is
/// taken.
pub async fn insert_model(
    pool: &PgPool,
    org_id: Option<Uuid>,
    kind: &str,
    id: &str,
    folder: &StoredModel<'_>,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query!(
        r#"INSERT INTO models (id, org_id, kind, storage_prefix, format, config)
           VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING"#,
        id,
        org_id,
        kind,
        folder.storage_prefix,
        folder.format,
        folder.config
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(inserted > 0)
}

/// What [`delete_org_model`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelDeletion {
    /// The org's model is gone.
    Deleted,
    /// No model of that name that the org can see.
    NotFound,
    /// A shared model: only the operator may remove it.
    Shared,
    /// Jobs not yet finished (queued, running or paused) train from it: their ids, oldest first.
    InUse(Vec<String>),
}

/// Deletes the org's own model `id` (OpenAI's `DELETE /v1/models/{model}`): its registration
/// only — the stored folder stays, as do the checkpoints and the job that made it. Refused
/// while unfinished jobs of the org start from it.
pub async fn delete_org_model(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<ModelDeletion, sqlx::Error> {
    let Some(model) = get_model(pool, org_id, id).await? else {
        return Ok(ModelDeletion::NotFound);
    };
    if model.org_id.is_none() {
        return Ok(ModelDeletion::Shared);
    }
    let users = sqlx::query_scalar!(
        r#"SELECT id FROM jobs WHERE org_id = $1 AND model = $2
             AND state IN ('queued', 'running', 'paused')
           ORDER BY created_at, id LIMIT 10"#,
        org_id,
        id
    )
    .fetch_all(pool)
    .await?;
    if !users.is_empty() {
        return Ok(ModelDeletion::InUse(users));
    }
    let deleted = sqlx::query!("DELETE FROM models WHERE id = $1 AND org_id = $2", id, org_id)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(if deleted > 0 { ModelDeletion::Deleted } else { ModelDeletion::NotFound })
}

/// Prefix of every fine-tuned model name (OpenAI's convention).
pub const FINE_TUNED_PREFIX: &str = "ft:";

/// An org name as it appears in model names: lowercase ASCII letters and digits, every other run
/// of characters one `-`.
pub fn org_slug(name: &str) -> String {
    let mut slug = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        "org".to_string()
    } else {
        slug.to_string()
    }
}

/// The root base model of `model`: itself, or for a fine-tuned name
/// (`ft:{base}:{org}:{suffix}:{job}`, or a checkpoint name: that then `:ckpt-step-N`) the base
/// it names, so that fine-tuning a fine-tuned model or checkpoint does not nest names. The base
/// may contain `:`; the other segments never do.
pub fn root_base_model(model: &str) -> &str {
    match model.strip_prefix(FINE_TUNED_PREFIX) {
        Some(rest) => {
            let rest = match rest.rsplit_once(":ckpt-step-") {
                Some((head, step)) if step.parse::<i32>().is_ok() => head,
                _ => rest,
            };
            rest.rsplitn(4, ':').nth(3).unwrap_or(model)
        }
        None => model,
    }
}

/// The name of the model a job produces, OpenAI's shape: `ft:{base}:{org}:{suffix}:{job_id}`
/// (an empty suffix segment when the job has none), with the root base model and the org's slug.
pub fn fine_tuned_model_name(
    model: &str,
    org_name: &str,
    suffix: Option<&str>,
    job_id: &str,
) -> String {
    format!(
        "{FINE_TUNED_PREFIX}{}:{}:{}:{job_id}",
        root_base_model(model),
        org_slug(org_name),
        suffix.unwrap_or("")
    )
}

/// The name of a job's checkpoint at `step`: the job's model name then `:ckpt-step-{step}`.
pub fn checkpoint_model_name(fine_tuned_model: &str, step: i32) -> String {
    format!("{fine_tuned_model}:ckpt-step-{step}")
}

/// Why a storage prefix cannot even be considered for registration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPrefix(pub &'static str);

/// The canonical form of a storage prefix a caller sent: one trailing `/` dropped, and nothing
/// that could mean another key once decoded or joined (`..`, `.`, empty segments, a leading
/// `/`, `%`, `\`, whitespace or control characters).
pub fn normalize_prefix(raw: &str) -> Result<String, BadPrefix> {
    let prefix = raw.strip_suffix('/').unwrap_or(raw);
    if prefix.chars().any(|c| c == '%' || c == '\\' || c.is_whitespace() || c.is_control()) {
        return Err(BadPrefix("no %, backslash, whitespace or control characters"));
    }
    crate::storage::validate_key(prefix)
        .map_err(|_| BadPrefix("a relative key without empty, . or .. segments"))?;
    Ok(prefix.to_string())
}

/// True when `inner` is `outer` or lies under the folder `outer`.
fn within(inner: &str, outer: &str) -> bool {
    inner == outer || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether org `org_id` may register a model stored at `prefix` (already normalised with
/// [`normalize_prefix`]): a folder under `models/` that the operator published (a shared model
/// is stored there) or, if unpublished, that no other org registered privately, a file the org uploaded (`files/…`), or a checkpoint of one of the org's jobs
/// (`jobs/<id>/checkpoints/step-N`, or a file inside it). Ownership comes from the database,
/// not from the shape of the key; anything else (samples, metrics, another org's objects) is
/// refused. Whether objects exist under the prefix is the caller's next check.
pub async fn org_may_register(
    pool: &PgPool,
    org_id: Uuid,
    prefix: &str,
) -> Result<bool, sqlx::Error> {
    let segments: Vec<&str> = prefix.split('/').collect();
    match segments.as_slice() {
        ["models", _, ..] => {
            let registered = sqlx::query!(
                r#"SELECT storage_prefix, org_id IS NULL AS "shared!" FROM models
                   WHERE org_id IS NULL OR org_id <> $1"#,
                org_id
            )
            .fetch_all(pool)
            .await?;
            // A folder the operator published (shared) is every org's to register; an
            // unpublished one that another org registered privately stays that org's.
            let published = registered
                .iter()
                .any(|model| model.shared && within(prefix, &model.storage_prefix));
            let held_elsewhere = registered.iter().any(|model| {
                !model.shared
                    && (within(prefix, &model.storage_prefix)
                        || within(&model.storage_prefix, prefix))
            });
            Ok(published || !held_elsewhere)
        }
        ["files", _] => {
            sqlx::query_scalar!(
                r#"SELECT EXISTS (SELECT 1 FROM files WHERE org_id = $1 AND storage_key = $2)
               AS "found!""#,
                org_id,
                prefix
            )
            .fetch_one(pool)
            .await
        }
        ["jobs", job_id, "checkpoints", _, ..] => {
            let checkpoints = sqlx::query_scalar!(
                r#"SELECT c.storage_prefix FROM checkpoints c JOIN jobs j ON j.id = c.job_id
                   WHERE c.job_id = $1 AND j.org_id = $2"#,
                job_id,
                org_id
            )
            .fetch_all(pool)
            .await?;
            Ok(checkpoints.iter().any(|checkpoint| within(prefix, checkpoint)))
        }
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fine_tuned_names_follow_openai_and_do_not_nest() {
        let first = fine_tuned_model_name("tiny", "Acme Labs!", Some("mine"), "ftjob-1");
        assert_eq!(first, "ft:tiny:acme-labs:mine:ftjob-1");
        let second = fine_tuned_model_name(&first, "acme", None, "ftjob-2");
        assert_eq!(second, "ft:tiny:acme::ftjob-2");
        let colon = fine_tuned_model_name("llama:7b", "a", Some("s"), "ftjob-3");
        assert_eq!(root_base_model(&colon), "llama:7b");
        assert_eq!(checkpoint_model_name(&second, 4), "ft:tiny:acme::ftjob-2:ckpt-step-4");
        let from_checkpoint = checkpoint_model_name(&colon, 2);
        assert_eq!(root_base_model(&from_checkpoint), "llama:7b");
        let third = fine_tuned_model_name(&from_checkpoint, "a", None, "ftjob-4");
        assert_eq!(third, "ft:llama:7b:a::ftjob-4", "a checkpoint's chain names its root base");
        assert_eq!(org_slug("--"), "org");
    }

    #[test]
    fn prefixes_are_normalised_or_refused() {
        assert_eq!(normalize_prefix("models/a/").unwrap(), "models/a");
        assert_eq!(
            normalize_prefix("jobs/j/checkpoints/step-1").unwrap(),
            "jobs/j/checkpoints/step-1"
        );
        for bad in [
            "",
            "/",
            "/models/a",
            "models//a",
            "models/a//",
            "models/../jobs/x",
            "models/./a",
            "models/%2e%2e/jobs",
            "models/a%2Fb",
            "models\\a",
            "models/a b",
            "models/a\n",
        ] {
            assert!(normalize_prefix(bad).is_err(), "{bad:?} accepted");
        }
        assert!(within("jobs/j/checkpoints/step-1/model.gguf", "jobs/j/checkpoints/step-1"));
        assert!(!within("jobs/j/checkpoints/step-10", "jobs/j/checkpoints/step-1"));
    }
}
