//! The exporter: every few seconds each API server looks for jobs whose W&B run is behind,
//! takes one (a row lock: two servers never send the same job), creates its run once, sends the
//! metrics rows it has not sent as history lines, and when the job has ended sends the summary
//! and closes the run. Progress is committed after each job, so a server that dies resends from
//! the last committed line (W&B overwrites lines at the same offset: nothing doubles). A failure
//! is written to the job's events once and retried with a growing wait.

use super::wandb::{NewRun, RunPath, WandbClient, WandbError};
use serde_json::{json, Map, Value};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;
use verity_core::integrations::{self, MetricsLine, WandbExport};
use verity_core::jobs::JobRecord;
use verity_core::JobState;

/// How often the exporter looks for work.
pub const PASS_INTERVAL: Duration = Duration::from_secs(5);
/// Jobs looked at in one pass.
const JOBS_PER_PASS: i64 = 50;
/// History lines sent in one message.
const LINES_PER_MESSAGE: i64 = 100;
/// Tags every run gets besides the user's (OpenAI adds its own the same way).
const VERITY_TAG: &str = "verity/fine-tuning";

/// What one look at a job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exported {
    /// Another server holds it, or it is done.
    Skipped,
    /// These many history lines were sent; `closed` when the run was finished too.
    Sent {
        /// History lines sent.
        lines: i32,
        /// The run was closed.
        closed: bool,
    },
    /// W&B failed; retried later.
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error(transparent)]
    Wandb(#[from] WandbError),
    #[error("reading the job: {0}")]
    Db(#[from] sqlx::Error),
}

/// Looks at every job whose export is due once; a database failure ends the pass (the next one
/// retries).
pub async fn export_due(
    pool: &PgPool,
    client: &WandbClient,
) -> Result<Vec<(String, Exported)>, sqlx::Error> {
    let mut done = Vec::new();
    for (job_id, org_id) in integrations::due_exports(pool, JOBS_PER_PASS).await? {
        let outcome = export_job(pool, client, org_id, &job_id).await?;
        done.push((job_id, outcome));
    }
    Ok(done)
}

/// Spawns the loop that runs [`export_due`] every [`PASS_INTERVAL`].
pub fn spawn(pool: PgPool, client: WandbClient) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PASS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(error) = export_due(&pool, &client).await {
                tracing::warn!(%error, "exporting jobs to W&B failed; retrying");
            }
        }
    })
}

/// Brings job `job_id`'s W&B run up to date (see the module's description).
pub async fn export_job(
    pool: &PgPool,
    client: &WandbClient,
    org_id: Uuid,
    job_id: &str,
) -> Result<Exported, sqlx::Error> {
    let Some((mut tx, mut export)) = integrations::hold_export(pool, job_id).await? else {
        return Ok(Exported::Skipped);
    };
    let Some(job) = verity_core::jobs::get_job(pool, org_id, job_id).await? else {
        return Ok(Exported::Skipped);
    };
    let before = export.history_lines;
    match send(pool, client, &job, &mut export).await {
        Ok(closed) => {
            integrations::record_progress(&mut tx, &export).await?;
            tx.commit().await?;
            if closed {
                tracing::info!(job_id, lines = export.history_lines, "W&B run closed");
            }
            Ok(Exported::Sent { lines: export.history_lines - before, closed })
        }
        Err(ExportError::Db(error)) => Err(error),
        Err(ExportError::Wandb(error)) => {
            drop(tx);
            let message = error.to_string();
            let failures = integrations::record_failure(pool, &export, &message).await?;
            tracing::warn!(job_id, failures, error = %message, "exporting to W&B failed; retrying");
            if failures == 1 {
                let note = format!("exporting metrics to W&B failed (retrying): {message}");
                integrations::export_event(pool, job_id, "warn", &note).await?;
            }
            Ok(Exported::Failed(message))
        }
    }
}

/// Sends what `export` has not sent; whether the run is closed now. `export` records what was
/// sent, also when a later message fails.
async fn send(
    pool: &PgPool,
    client: &WandbClient,
    job: &JobRecord,
    export: &mut WandbExport,
) -> Result<bool, ExportError> {
    let Some(wandb) = integrations::of_spec(&job.spec).into_iter().next() else {
        export.finished = true;
        return Ok(true);
    };
    let run = match (&export.entity, &export.project) {
        (Some(entity), Some(project)) => {
            RunPath { entity: entity.clone(), project: project.clone(), run: job.id.clone() }
        }
        _ => {
            let mut tags = wandb.tags.clone();
            tags.extend(verity_tags(job));
            let config = run_config(job);
            let display_name = wandb.name.as_deref().unwrap_or(&job.id);
            let new = NewRun {
                run: &job.id,
                project: &wandb.project,
                entity: wandb.entity.as_deref(),
                display_name,
                tags: &tags,
                config: &config,
            };
            let run = client.upsert_run(&new).await?;
            export.entity = Some(run.entity.clone());
            export.project = Some(run.project.clone());
            run
        }
    };
    let ended = job.state.is_terminal();
    // While the job runs, its newest row may still gain its evaluation: it is sent next time.
    let newest = verity_core::jobs::last_metric_step(pool, &job.id).await?;
    loop {
        let rows =
            integrations::metrics_after(pool, &job.id, export.exported_step, LINES_PER_MESSAGE)
                .await?;
        let full = rows.len() as i64 == LINES_PER_MESSAGE;
        let rows: Vec<MetricsLine> =
            rows.into_iter().filter(|r| ended || Some(r.step) < newest).collect();
        let Some(last) = rows.last().map(|r| r.step) else { break };
        let started = job.created_at.timestamp() as f64;
        let lines: Vec<String> =
            rows.iter().map(|r| history_line(r, started).to_string()).collect();
        let count = lines.len() as i32;
        let message = json!({
            "files": {"wandb-history.jsonl": {"offset": export.history_lines, "content": lines}},
            "dropped": 0,
        });
        client.stream(&run, &message).await?;
        export.exported_step = last;
        export.history_lines += count;
        if !full {
            break;
        }
    }
    if !ended {
        return Ok(false);
    }
    let summary = summary(pool, job).await?;
    let message = json!({
        "files": {"wandb-summary.json": {"offset": 0, "content": [summary.to_string()]}},
        "dropped": 0,
    });
    client.stream(&run, &message).await?;
    let exitcode = if job.state == JobState::Succeeded { 0 } else { 1 };
    let close = json!({"complete": true, "exitcode": exitcode, "dropped": 0, "uploaded": []});
    client.stream(&run, &close).await?;
    export.finished = true;
    Ok(true)
}

/// Verity's tags on a run (each within W&B's 64 characters).
fn verity_tags(job: &JobRecord) -> Vec<String> {
    let cut = |tag: String| tag.chars().take(integrations::MAX_TAG_CHARS).collect::<String>();
    vec![
        VERITY_TAG.to_string(),
        cut(format!("verity/{}", job.model)),
        cut(format!("verity/{}", job.id)),
    ]
}

/// The run's config: what the job was created with.
fn run_config(job: &JobRecord) -> Map<String, Value> {
    let mut config = Map::new();
    config.insert("model".into(), json!(job.model));
    config.insert("seed".into(), json!(job.seed));
    config.insert("training_file".into(), json!(job.training_file));
    config.insert("validation_file".into(), json!(job.validation_file));
    config.insert("suffix".into(), json!(job.suffix));
    if let Some(method) = job.spec.get("method") {
        config.insert("method".into(), method.clone());
    }
    config
}

/// One history line: the row's numbers, nested keys joined by `/` (`eval/pass@1`), with W&B's
/// `_step`, `_timestamp` and `_runtime` (seconds since the job was created).
pub fn history_line(row: &MetricsLine, started: f64) -> Value {
    let mut line = Map::new();
    flatten("", &row.data, &mut line);
    line.insert("_step".into(), json!(row.step));
    line.insert("_timestamp".into(), json!(row.written_at));
    line.insert("_runtime".into(), json!((row.written_at - started).max(0.0)));
    Value::Object(line)
}

/// Numbers and booleans of `value`, their keys joined by `/`; strings, lists and nulls left out.
fn flatten(prefix: &str, value: &Value, out: &mut Map<String, Value>) {
    match value {
        Value::Object(fields) => {
            for (key, value) in fields {
                let key = if prefix.is_empty() { key.clone() } else { format!("{prefix}/{key}") };
                flatten(&key, value, out);
            }
        }
        Value::Number(_) | Value::Bool(_) if !prefix.is_empty() => {
            out.insert(prefix.to_string(), value.clone());
        }
        _ => {}
    }
}

/// The run's summary: every metric's last value, the job's state, model and tokens.
async fn summary(pool: &PgPool, job: &JobRecord) -> Result<Value, sqlx::Error> {
    let mut summary = Map::new();
    for (step, data) in verity_core::jobs::metrics_rows(pool, &job.id).await? {
        flatten("", &data, &mut summary);
        summary.insert("_step".into(), json!(step));
    }
    summary.insert("state".into(), json!(job.state.as_str()));
    if let Some(model) = &job.fine_tuned_model {
        summary.insert("fine_tuned_model".into(), json!(model));
    }
    if let Some(tokens) = job.result.as_ref().and_then(|r| r.get("trained_tokens")) {
        summary.insert("trained_tokens".into(), tokens.clone());
    }
    Ok(Value::Object(summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_row_becomes_a_history_line_of_numbers() {
        let row = MetricsLine {
            step: 3,
            data: json!({"reward_mean": 0.5, "truncated": false, "note": "x", "lengths": [1, 2],
                         "eval": {"pass_at_k": {"pass@1": 0.25}, "grader": null}}),
            written_at: 1010.0,
        };
        assert_eq!(
            history_line(&row, 1000.0),
            json!({"reward_mean": 0.5, "truncated": false, "eval/pass_at_k/pass@1": 0.25,
                   "_step": 3, "_timestamp": 1010.0, "_runtime": 10.0})
        );
    }
}
