//! Rejection sampling in the dashboard: the list of runs, the form that starts one (any model,
//! any processed file, any grader; prefilled from a finished job's page), and a run's page
//! (live progress, the pass-rate summary and histogram, the per-prompt table, the kept file with
//! "Train on this file"). The form's script posts to `POST /v1/verity/rejection_sampling` with
//! the session cookie, so validation is the API's own.

use super::files::{org_files, FileRow};
use super::new_job::{language_models, prefill, ContinueQuery};
use super::page::{render, when, Nav, WebResult, WebUser};
use crate::api::sampling_runs::find_run;
use crate::api::sampling_runs::rejection_sampling::{RejectionSamplingObject, DEFAULT_K};
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use verity_core::sampling_runs::RunKind;

/// Runs shown on the list.
const LIST_LIMIT: i64 = 50;
/// Prompts shown in a run's per-prompt table (the API has them all).
const TABLE_LIMIT: usize = 200;
/// The grader the form starts from when no job prefills one.
const DEFAULT_GRADER: &str = r#"{
  "type": "math",
  "name": "math",
  "reference": "{{item.reference_answer}}"
}"#;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/rejection-sampling", get(list_page))
        .route("/rejection-sampling/new", get(new_page))
        .route("/rejection-sampling/{run_id}", get(run_page))
}

/// A run of the list.
struct RunRow {
    id: String,
    status: String,
    model: String,
    file: String,
    k: usize,
    kept: String,
    created: String,
}

/// The list.
#[derive(Template)]
#[template(path = "rejection_samplings.html")]
struct ListPage {
    nav: Nav,
    runs: Vec<RunRow>,
}

async fn list_page(State(state): State<AppState>, user: WebUser) -> WebResult<Response> {
    let rows = verity_core::sampling_runs::list_runs(
        &state.pool,
        user.0.org_id,
        RunKind::RejectionSampling,
        None,
        LIST_LIMIT,
    )
    .await?;
    let runs = rows
        .into_iter()
        .filter_map(|job| {
            let created = when(job.created_at);
            let run = RejectionSamplingObject::of(job).ok()?;
            Some(RunRow {
                kept: count(run.summary.as_ref(), "kept"),
                model: run.model.name,
                file: run.file,
                k: run.k,
                status: run.status.status,
                created,
                id: run.id,
            })
        })
        .collect();
    Ok(render(&ListPage { nav: Nav::new("Rejection sampling", "rejection-sampling"), runs }))
}

/// `/rejection-sampling/new?from_job=ID` prefills the sampler, file and grader from a job.
#[derive(Debug, Default, Deserialize)]
struct NewQuery {
    /// The job whose model samples.
    from_job: Option<String>,
    /// A file to preselect.
    file: Option<String>,
}

/// The form.
#[derive(Template)]
#[template(path = "rejection_sampling_new.html")]
struct NewPage {
    nav: Nav,
    from_job: String,
    model: String,
    models: Vec<String>,
    file: String,
    files: Vec<FileRow>,
    grader: String,
    default_k: usize,
}

async fn new_page(
    State(state): State<AppState>,
    user: WebUser,
    Query(query): Query<NewQuery>,
) -> WebResult<Response> {
    let continued = ContinueQuery { from_job: query.from_job, ..ContinueQuery::default() };
    let prefill = prefill(&state, &user, continued).await?;
    let models = language_models(&state, &user, &prefill.model).await?;
    let files = org_files(&state, &user)
        .await?
        .into_iter()
        .filter(|f| f.file.status == "processed" && f.file.purpose == "fine-tune")
        .collect();
    let grader =
        if prefill.grader.is_empty() { DEFAULT_GRADER.to_string() } else { prefill.grader };
    Ok(render(&NewPage {
        nav: Nav::new("New rejection-sampling run", "rejection-sampling"),
        from_job: prefill.from_job,
        model: prefill.model,
        models,
        file: query.file.unwrap_or(prefill.training_file),
        files,
        grader,
        default_k: DEFAULT_K,
    }))
}

/// A prompt's row of the run's table.
struct PromptRow {
    index: u64,
    samples: u64,
    passing: u64,
    percent: u64,
    kept: u64,
}

/// A bar of the pass-rate histogram: prompts whose pass rate falls in the bucket.
struct Bucket {
    label: &'static str,
    prompts: usize,
    percent: usize,
}

/// The run's page.
#[derive(Template)]
#[template(path = "rejection_sampling.html")]
struct RunPage {
    nav: Nav,
    run: RejectionSamplingObject,
    terminal: bool,
    policy: &'static str,
    min_score: String,
    grader: String,
    progress: String,
    kept: String,
    prompts: String,
    with_a_pass: String,
    mean_pass_rate: String,
    buckets: Vec<Bucket>,
    rows: Vec<PromptRow>,
    more_rows: usize,
}

/// An integer field of a summary or progress object, as text (`–` when absent).
fn count(object: Option<&Value>, key: &str) -> String {
    object
        .and_then(|o| o.get(key))
        .and_then(Value::as_u64)
        .map_or_else(|| "–".into(), |n| n.to_string())
}

/// A minimum score as the user gave it (the stored `1 − ε` of "correct" shows as 1).
fn shown_score(score: f64) -> String {
    if score >= verity_verifiers::SUCCESS_THRESHOLD {
        "1".into()
    } else {
        format!("{}", (score * 1000.0).round() / 1000.0)
    }
}

/// The per-prompt rows of a summary.
fn prompt_rows(summary: Option<&Value>) -> Vec<PromptRow> {
    let rows = summary.and_then(|s| s.get("per_prompt")).and_then(Value::as_array);
    rows.into_iter()
        .flatten()
        .map(|row| {
            let int = |key: &str| row.get(key).and_then(Value::as_u64).unwrap_or(0);
            let rate = row.get("pass_rate").and_then(Value::as_f64).unwrap_or(0.0);
            PromptRow {
                index: int("prompt_index"),
                samples: int("samples"),
                passing: int("passing"),
                percent: (rate * 100.0).round() as u64,
                kept: int("kept"),
            }
        })
        .collect()
}

/// Prompts by pass rate: never solved, three bands of sometimes, always solved — the two ends
/// are the prompts whose groups have no advantage to learn from.
fn histogram(rows: &[PromptRow]) -> Vec<Bucket> {
    let mut buckets = [("0%", 0usize), ("1–33%", 0), ("34–66%", 0), ("67–99%", 0), ("100%", 0)];
    for row in rows {
        let slot = match (row.passing, row.samples) {
            (0, _) => 0,
            (p, s) if p >= s => 4,
            _ => match row.percent {
                0..=33 => 1,
                34..=66 => 2,
                _ => 3,
            },
        };
        buckets[slot].1 += 1;
    }
    let most = buckets.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    buckets
        .into_iter()
        .map(|(label, prompts)| Bucket { label, prompts, percent: prompts * 100 / most })
        .collect()
}

async fn run_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
) -> WebResult<Response> {
    let job = find_run(&state, &user.0, RunKind::RejectionSampling, &id).await?;
    let terminal = job.state.is_terminal();
    let run = RejectionSamplingObject::of(job)?;
    let summary = run.summary.as_ref();
    let mut rows = prompt_rows(summary);
    let buckets = histogram(&rows);
    let more_rows = rows.len().saturating_sub(TABLE_LIMIT);
    rows.truncate(TABLE_LIMIT);
    let progress = run.status.progress.as_ref();
    let progress = match (count(progress, "prompts_done").as_str(), count(progress, "prompts")) {
        ("–", _) => String::new(),
        (done, total) => format!("{done} / {total} prompts sampled and graded"),
    };
    let page = RunPage {
        nav: Nav::new(format!("Rejection sampling {id}"), "rejection-sampling"),
        terminal,
        policy: run.policy.as_str(),
        min_score: shown_score(run.min_score),
        grader: serde_json::to_string_pretty(&run.grader).unwrap_or_default(),
        progress,
        kept: count(summary, "kept"),
        prompts: count(summary, "prompts"),
        with_a_pass: count(summary, "prompts_with_a_pass"),
        mean_pass_rate: summary
            .and_then(|s| s.get("mean_pass_rate"))
            .and_then(Value::as_f64)
            .map_or_else(|| "–".into(), |r| format!("{:.1}%", r * 100.0)),
        buckets,
        rows,
        more_rows,
        run,
    };
    Ok(render(&page))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(passing: u64, samples: u64) -> PromptRow {
        let percent = (passing * 100) / samples;
        PromptRow { index: 0, samples, passing, percent, kept: 0 }
    }

    #[test]
    fn the_histogram_puts_never_and_always_solved_prompts_at_its_ends() {
        let rows = [row(0, 4), row(0, 4), row(1, 4), row(2, 4), row(3, 4), row(4, 4)];
        let counts: Vec<usize> = histogram(&rows).iter().map(|b| b.prompts).collect();
        assert_eq!(counts, [2, 1, 1, 1, 1]);
        assert_eq!(histogram(&rows)[0].percent, 100);
        assert_eq!(histogram(&[]).iter().map(|b| b.percent).sum::<usize>(), 0);
    }
}
