//! A job's `integrations` (OpenAI's field): Weights & Biases, the one type OpenAI offers. Checked
//! at creation, kept in the job's spec, shown on the job object, and exported by the server's
//! W&B exporter, whose progress per job lives in `wandb_exports` (read and written here).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

/// Longest project, entity and run name (W&B's own limit on project names).
pub const MAX_NAME_CHARS: usize = 128;
/// Longest tag (W&B refuses longer ones).
pub const MAX_TAG_CHARS: usize = 64;
/// Most tags a run is given by the job (Verity's own tags come on top).
pub const MAX_TAGS: usize = 50;
/// Characters W&B refuses in project and entity names (they are path segments of its URLs).
const FORBIDDEN_NAME_CHARS: &[char] = &['/', '\\', '#', '?', '%', ':'];

/// The W&B run a job's metrics are exported to (`integrations[i].wandb`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WandbIntegration {
    /// W&B project.
    pub project: String,
    /// The run's display name (default: the job id).
    #[serde(default)]
    pub name: Option<String>,
    /// W&B entity (user or team; default: the API key's default entity).
    #[serde(default)]
    pub entity: Option<String>,
    /// Tags given to the run.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// Why a job's `integrations` was refused: the JSON path of the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct IntegrationError {
    /// JSON path, e.g. `integrations[0].wandb.project`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> IntegrationError {
    IntegrationError { field: field.into(), message: message.into() }
}

/// The W&B integrations of a request's `integrations` (null or `[]`: none), each checked with
/// the JSON path of what is wrong. At most one W&B run per job.
pub fn parse(value: Option<&Value>) -> Result<Vec<WandbIntegration>, IntegrationError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(refuse("integrations", "must be a list of integrations")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at = format!("integrations[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        if kind != Some("wandb") {
            return Err(refuse(
                format!("{at}.type"),
                "the only integration type is \"wandb\" (Weights & Biases)",
            ));
        }
        if let Some(key) =
            item.as_object().and_then(|o| o.keys().find(|k| *k != "type" && *k != "wandb"))
        {
            return Err(refuse(
                format!("{at}.{key}"),
                "unknown field; an integration has type and wandb",
            ));
        }
        let body =
            item.get("wandb").ok_or_else(|| refuse(format!("{at}.wandb"), "missing `wandb`"))?;
        out.push(parse_wandb(body, &format!("{at}.wandb"))?);
    }
    if out.len() > 1 {
        return Err(refuse(
            "integrations",
            "a job exports to one W&B run; give one wandb integration",
        ));
    }
    Ok(out)
}

fn parse_wandb(body: &Value, at: &str) -> Result<WandbIntegration, IntegrationError> {
    let Some(fields) = body.as_object() else {
        return Err(refuse(at, "must be an object with project, name, entity and tags"));
    };
    if let Some(key) =
        fields.keys().find(|k| !["project", "name", "entity", "tags"].contains(&k.as_str()))
    {
        return Err(refuse(
            format!("{at}.{key}"),
            "unknown field; wandb takes project, name, entity and tags",
        ));
    }
    let text = |key: &str| -> Result<Option<String>, IntegrationError> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(refuse(format!("{at}.{key}"), "must be a string")),
        }
    };
    let project =
        text("project")?.ok_or_else(|| refuse(format!("{at}.project"), "missing `project`"))?;
    check_path_name(&project, &format!("{at}.project"))?;
    let entity = text("entity")?;
    if let Some(entity) = &entity {
        check_path_name(entity, &format!("{at}.entity"))?;
    }
    let name = text("name")?;
    if let Some(name) = &name {
        if name.is_empty()
            || name.chars().count() > MAX_NAME_CHARS
            || name.chars().any(char::is_control)
        {
            return Err(refuse(
                format!("{at}.name"),
                format!("1 to {MAX_NAME_CHARS} characters, no control characters"),
            ));
        }
    }
    let tags = match fields.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            if items.len() > MAX_TAGS {
                return Err(refuse(format!("{at}.tags"), format!("at most {MAX_TAGS} tags")));
            }
            let mut tags = Vec::with_capacity(items.len());
            for (j, tag) in items.iter().enumerate() {
                let field = format!("{at}.tags[{j}]");
                let tag = tag.as_str().ok_or_else(|| refuse(&field, "must be a string"))?;
                if tag.is_empty()
                    || tag.chars().count() > MAX_TAG_CHARS
                    || tag.chars().any(char::is_control)
                {
                    return Err(refuse(
                        field,
                        format!("1 to {MAX_TAG_CHARS} characters, no control characters"),
                    ));
                }
                tags.push(tag.to_string());
            }
            tags
        }
        Some(_) => return Err(refuse(format!("{at}.tags"), "must be a list of strings")),
    };
    Ok(WandbIntegration { project, name, entity, tags })
}

/// A project or entity name: it becomes a path segment of W&B's URLs, so W&B's own rule.
fn check_path_name(name: &str, field: &str) -> Result<(), IntegrationError> {
    let bad = name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.trim() != name
        || name.chars().any(|c| c.is_control() || FORBIDDEN_NAME_CHARS.contains(&c))
        || name == "."
        || name == "..";
    if bad {
        return Err(refuse(
            field,
            format!(
                "1 to {MAX_NAME_CHARS} characters without surrounding spaces, control characters \
                 or any of / \\ # ? % : (W&B's rule for names)"
            ),
        ));
    }
    Ok(())
}

/// The spec value that stores `integrations` (OpenAI's shape, without the run id).
pub fn to_spec(integrations: &[WandbIntegration]) -> Value {
    Value::Array(integrations.iter().map(|w| json!({"type": "wandb", "wandb": w})).collect())
}

/// The W&B integrations stored in a job's spec (none when it has none or they do not parse).
pub fn of_spec(spec: &Value) -> Vec<WandbIntegration> {
    parse(spec.get("integrations")).unwrap_or_default()
}

/// The job object's `integrations` (OpenAI's shape: the run id is the job id), or `None` for
/// a job without any.
pub fn view(spec: &Value, job_id: &str) -> Option<Vec<Value>> {
    let integrations = of_spec(spec);
    if integrations.is_empty() {
        return None;
    }
    let view = integrations
        .into_iter()
        .map(|w| {
            json!({"type": "wandb", "wandb": {
                "project": w.project, "name": w.name, "entity": w.entity, "tags": w.tags,
                "run_id": job_id,
            }})
        })
        .collect();
    Some(view)
}

/// A job's export to W&B as it stands (`wandb_exports`).
#[derive(Debug, Clone, PartialEq)]
pub struct WandbExport {
    /// The job.
    pub job_id: String,
    /// The entity the run was created in (`None` until it was).
    pub entity: Option<String>,
    /// The project it was created in.
    pub project: Option<String>,
    /// The last metrics step sent (-1: none).
    pub exported_step: i32,
    /// History lines sent (the next line's offset).
    pub history_lines: i32,
    /// The run was closed (nothing more to send).
    pub finished: bool,
    /// Failed attempts in a row.
    pub failures: i32,
    /// The last failure.
    pub last_error: Option<String>,
}

/// Jobs whose W&B export has more to do and is due (a failing one waits 2^failures seconds, at
/// most five minutes, between tries), the longest unvisited first (so that every job gets its
/// turn however many there are), at most `limit`: each job's id and org.
pub async fn due_exports(pool: &PgPool, limit: i64) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT j.id, j.org_id FROM jobs j LEFT JOIN wandb_exports e ON e.job_id = j.id
           WHERE j.spec ? 'integrations' AND NOT coalesce(e.finished, false)
             AND (coalesce(e.failures, 0) = 0
                  OR e.updated_at < now() - make_interval(secs => least(300, power(2, e.failures))))
           ORDER BY e.updated_at ASC NULLS FIRST, j.created_at LIMIT $1"#,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.org_id)).collect())
}

/// A job's export, locked for this server until `commit` (`None` when another server holds it
/// or it is finished). The row is created on first use.
pub async fn hold_export(
    pool: &PgPool,
    job_id: &str,
) -> Result<Option<(sqlx::Transaction<'static, sqlx::Postgres>, WandbExport)>, sqlx::Error> {
    sqlx::query!("INSERT INTO wandb_exports (job_id) VALUES ($1) ON CONFLICT DO NOTHING", job_id)
        .execute(pool)
        .await?;
    let mut tx = pool.begin().await?;
    let row = sqlx::query_as!(
        WandbExport,
        "SELECT job_id, entity, project, exported_step, history_lines, finished, failures, last_error
         FROM wandb_exports WHERE job_id = $1 AND NOT finished FOR UPDATE SKIP LOCKED",
        job_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    Ok(row.map(|row| (tx, row)))
}

/// Records a held export's progress (clearing any failure).
pub async fn record_progress(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    export: &WandbExport,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE wandb_exports SET entity = $2, project = $3, exported_step = $4, history_lines = $5,
                finished = $6, failures = 0, last_error = NULL, updated_at = now()
         WHERE job_id = $1",
        export.job_id,
        export.entity,
        export.project,
        export.exported_step,
        export.history_lines,
        export.finished,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records a failed attempt (its progress so far kept); the number of failures in a row.
pub async fn record_failure(
    pool: &PgPool,
    export: &WandbExport,
    error: &str,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        "UPDATE wandb_exports SET entity = $2, project = $3, exported_step = $4, history_lines = $5,
                failures = failures + 1, last_error = $6, updated_at = now()
         WHERE job_id = $1 RETURNING failures",
        export.job_id,
        export.entity,
        export.project,
        export.exported_step,
        export.history_lines,
        error,
    )
    .fetch_one(pool)
    .await
}

/// A job's export as it stands (`None` before the exporter first looked at it).
pub async fn get_export(pool: &PgPool, job_id: &str) -> Result<Option<WandbExport>, sqlx::Error> {
    sqlx::query_as!(
        WandbExport,
        "SELECT job_id, entity, project, exported_step, history_lines, finished, failures, last_error
         FROM wandb_exports WHERE job_id = $1",
        job_id
    )
    .fetch_optional(pool)
    .await
}

/// Adds an event about the export to the job's log (`level`: `info` or `warn`).
pub async fn export_event(
    pool: &PgPool,
    job_id: &str,
    level: &str,
    message: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO job_events (job_id, level, kind, message) VALUES ($1, $2, 'wandb_export', $3)",
        job_id,
        level,
        message
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// One metrics row to export: its step, data and when it was written (Unix seconds).
#[derive(Debug, Clone)]
pub struct MetricsLine {
    /// Step.
    pub step: i32,
    /// The row (`{"reward_mean": …, "eval": {…}}`).
    pub data: Value,
    /// When it was written.
    pub written_at: f64,
}

/// A job's metrics rows after `after_step`, by step, at most `limit`.
pub async fn metrics_after(
    pool: &PgPool,
    job_id: &str,
    after_step: i32,
    limit: i64,
) -> Result<Vec<MetricsLine>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT step, data, extract(epoch FROM created_at)::float8 AS "written_at!"
           FROM job_metrics WHERE job_id = $1 AND step > $2 ORDER BY step LIMIT $3"#,
        job_id,
        after_step,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| MetricsLine { step: r.step, data: r.data, written_at: r.written_at })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(value: Value) -> String {
        parse(Some(&value)).unwrap_err().field
    }

    #[test]
    fn openai_s_documented_integration_parses() {
        let body = json!([{"type": "wandb", "wandb": {"project": "my-wandb-project",
            "name": "ft-run-display-name", "tags": ["first-experiment", "v2"]}}]);
        let parsed = parse(Some(&body)).unwrap();
        assert_eq!(
            parsed,
            vec![WandbIntegration {
                project: "my-wandb-project".into(),
                name: Some("ft-run-display-name".into()),
                entity: None,
                tags: vec!["first-experiment".into(), "v2".into()],
            }]
        );
        assert_eq!(parse(Some(&json!([]))).unwrap(), vec![]);
        assert_eq!(parse(Some(&Value::Null)).unwrap(), vec![]);
        let spec = json!({"integrations": to_spec(&parsed)});
        assert_eq!(of_spec(&spec), parsed);
        let view = view(&spec, "ftjob-1").unwrap();
        assert_eq!(view[0]["wandb"]["run_id"], "ftjob-1");
        assert_eq!(view[0]["wandb"]["entity"], Value::Null);
        assert!(super::view(&json!({}), "ftjob-1").is_none());
    }

    #[test]
    fn bad_integrations_are_refused_naming_the_field() {
        assert_eq!(field_of(json!({"type": "wandb"})), "integrations");
        assert_eq!(field_of(json!([{"type": "mlflow"}])), "integrations[0].type");
        assert_eq!(field_of(json!([{"type": "wandb"}])), "integrations[0].wandb");
        assert_eq!(
            field_of(json!([{"type": "wandb", "wandb": {}}])),
            "integrations[0].wandb.project"
        );
        let wandb = |w: Value| json!([{"type": "wandb", "wandb": w}]);
        assert_eq!(field_of(wandb(json!({"project": "a/b"}))), "integrations[0].wandb.project");
        assert_eq!(field_of(wandb(json!({"project": ".."}))), "integrations[0].wandb.project");
        assert_eq!(
            field_of(wandb(json!({"project": "p", "entity": "x?y"}))),
            "integrations[0].wandb.entity"
        );
        assert_eq!(
            field_of(wandb(json!({"project": "p", "tags": ["ok", ""]}))),
            "integrations[0].wandb.tags[1]"
        );
        assert_eq!(
            field_of(wandb(json!({"project": "p", "tags": "t"}))),
            "integrations[0].wandb.tags"
        );
        assert_eq!(
            field_of(wandb(json!({"project": "p", "name": 3}))),
            "integrations[0].wandb.name"
        );
        assert_eq!(
            field_of(wandb(json!({"project": "p", "group": "g"}))),
            "integrations[0].wandb.group"
        );
        let long = "x".repeat(MAX_TAG_CHARS + 1);
        assert_eq!(
            field_of(wandb(json!({"project": "p", "tags": [long]}))),
            "integrations[0].wandb.tags[0]"
        );
        let two = json!([{"type": "wandb", "wandb": {"project": "a"}}, {"type": "wandb", "wandb": {"project": "b"}}]);
        assert_eq!(field_of(two), "integrations");
    }
}
