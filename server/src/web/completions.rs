//! The completions explorer: a job's sampled completions keyed by dataset row (the `row` a
//! sample records, the same at every step; shown and filtered numbered from 1), filtered by step, score, finish reason, row and
//! text; each prompt shown once per group with its chat turns as roles, its dataset row on
//! every completion; paged server-side ([`GROUPS_PER_PAGE`] prompts a page, next / previous
//! keeping the filters). The validation samples its evaluations during training kept (see
//! `VALIDATION_SAMPLES_KEPT` in the worker) are a source (`validation, step N`; step 0 is the
//! base before training), and so is an evaluation report made for the job: its
//! validation-set completions per row, one column per model (the base and each checkpoint side
//! by side).

use super::chat_text::{turns, Turn};
use super::page::{render, Nav, WebResult, WebUser};
use crate::api::error::ApiError;
use crate::api::jobs::find_job;
use crate::api::jobs::samples::{load_samples, SampleObject};
use crate::api::sampling_runs::find_run;
use crate::api::state::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use verity_core::jobs::SampleFilter;
use verity_core::sampling_runs::{RunKind, RunSpec};

/// Prompt groups shown per page unless `per_page` says otherwise.
pub const GROUPS_PER_PAGE: usize = 20;
/// The `source` of the validation samples kept by evaluations during training.
pub const VALIDATION: &str = "validation";
/// Most prompt groups a page may show.
const MAX_PER_PAGE: usize = 100;
/// Samples read per request (filtered and paged after reading; narrow by step beyond this).
const WIDE: i64 = 2000;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/jobs/{job_id}/completions", get(completions_page))
}

/// Filters of the explorer (empty fields mean "any").
#[derive(Debug, Deserialize, Default)]
pub struct Filters {
    step: Option<String>,
    min_score: Option<String>,
    max_score: Option<String>,
    finish_reason: Option<String>,
    /// Dataset row, numbered from 1 (as shown).
    row: Option<String>,
    /// Text searched in prompt and completion (case-insensitive).
    q: Option<String>,
    /// Empty: the job's training samples; else one of its evaluation reports.
    source: Option<String>,
    /// Page number (1-based).
    page: Option<String>,
    /// Prompt groups a page (1 to 100, default 20).
    per_page: Option<String>,
}

fn parse<T: std::str::FromStr>(param: &str, value: &Option<String>) -> Result<Option<T>, ApiError> {
    match value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| ApiError::invalid(param, format!("{v:?} is not a number"))),
    }
}

/// One turn of a tool episode as shown: its role and text, the call it made (`name(arguments)`)
/// or, for a tool result, its timing and whether it failed.
struct EpisodeTurn {
    role: &'static str,
    content: String,
    call: String,
    meta: String,
    error: bool,
}

/// A completion as shown.
struct Completion {
    index: i32,
    score: String,
    advantage: String,
    finish_reason: String,
    turns: Vec<Turn>,
    /// A tool episode turn by turn (empty for a plain completion), and how it ended.
    episode: Vec<EpisodeTurn>,
    episode_end: String,
    graders: Vec<(String, String)>,
    reason: String,
}

/// One model's (or one step's) completions of a prompt.
struct Column {
    label: String,
    completions: Vec<Completion>,
}

/// A prompt, shown once, and its completions.
struct Group {
    /// `step 3`, or `validation` for an evaluation.
    title: String,
    step: i32,
    /// The dataset row, when the samples recorded it.
    row: Option<i64>,
    prompt: Vec<Turn>,
    columns: Vec<Column>,
}

/// The explorer page.
#[derive(Template)]
#[template(path = "completions.html")]
struct CompletionsPage {
    nav: Nav,
    job_id: String,
    steps: Vec<i32>,
    step: String,
    min_score: String,
    max_score: String,
    finish_reason: String,
    row: String,
    q: String,
    source: String,
    /// The job's evaluation reports: `(id, state)`.
    sources: Vec<(String, String)>,
    groups: Vec<Group>,
    shown: usize,
    /// This page (1-based), the number of pages, and whether more samples matched than were
    /// read (then the last page is not the end).
    page: usize,
    pages: usize,
    /// `per_page` as asked (empty: the default).
    per_page: String,
    capped: bool,
}

fn number(value: Option<f64>) -> String {
    value.map(|v| format!("{v:.3}")).unwrap_or_else(|| "–".into())
}

fn text(body: &Value, key: &str) -> String {
    body.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A sample's dataset row: the `row` it recorded (training samples before rows were recorded
/// have none); evaluation samples' prompt index is their row.
fn sample_row(s: &SampleObject, evaluation: bool) -> Option<i64> {
    let recorded = s.sample.as_ref().and_then(|b| b.get("row")).and_then(Value::as_i64);
    recorded.or(evaluation.then_some(i64::from(s.prompt_index)))
}

/// The turns of a sample's tool episode (its `episode` record: OpenAI messages and calls).
fn episode_turns(episode: &Value) -> Vec<EpisodeTurn> {
    let calls = episode["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut results = calls.iter();
    let mut out = Vec::new();
    for message in episode["messages"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let content = text(message, "content");
        if message["role"] == "tool" {
            let call = results.next();
            let seconds = call.and_then(|c| c["seconds"].as_f64()).unwrap_or(0.0);
            let error = call.is_some_and(|c| c["error"] == true);
            let meta = format!("{}{seconds:.3} s", if error { "error · " } else { "" });
            out.push(EpisodeTurn { role: "tool", content, call: String::new(), meta, error });
            continue;
        }
        // every call of the turn (several with parallel calls or a Mistral call list)
        let call = message["tool_calls"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|c| {
                format!("{}({})", text(&c["function"], "name"), text(&c["function"], "arguments"))
            })
            .collect::<Vec<_>>()
            .join("\n→ ");
        out.push(EpisodeTurn {
            role: "assistant",
            content,
            call,
            meta: String::new(),
            error: false,
        });
    }
    out
}

fn completion(s: &SampleObject) -> Completion {
    let body = s.sample.clone().unwrap_or(Value::Null);
    let graders = body
        .get("per_grader")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), number(v.as_f64()))).collect())
        .unwrap_or_default();
    Completion {
        index: s.index,
        score: number(s.score),
        advantage: number(s.advantage),
        finish_reason: s.finish_reason.clone().unwrap_or_default(),
        turns: turns(&text(&body, "completion")),
        episode: episode_turns(&body["episode"]),
        episode_end: body["episode"]["tool_limit"]
            .as_str()
            .or(body["episode"]["end"].as_str())
            .unwrap_or("")
            .replace('_', " "),
        graders,
        reason: text(&body, "reason"),
    }
}

/// Whether `s` passes the finish-reason, row and text filters.
fn keep(
    s: &SampleObject,
    evaluation: bool,
    finish: Option<&str>,
    row: Option<i64>,
    q: &str,
) -> bool {
    let body = s.sample.as_ref();
    let has = |key: &str| {
        body.and_then(|b| b.get(key))
            .and_then(Value::as_str)
            .is_some_and(|t| t.to_lowercase().contains(q))
    };
    finish.is_none_or(|f| s.finish_reason.as_deref() == Some(f))
        && row.is_none_or(|r| sample_row(s, evaluation) == Some(r))
        && (q.is_empty() || has("prompt") || has("completion"))
}

/// Training samples (or, with `validation`, the validation samples of evaluations during
/// training) grouped by (step, row) in sample order.
fn training_groups(samples: &[&SampleObject], validation: bool) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut last_key = None;
    for s in samples {
        let row = sample_row(s, false);
        // Samples without a recorded row fall back to their group in the step.
        let key = (s.step, row.unwrap_or(-1 - i64::from(s.prompt_index)));
        if last_key != Some(key) {
            last_key = Some(key);
            let prompt = s.sample.as_ref().map(|b| text(b, "prompt")).unwrap_or_default();
            let title = if validation {
                format!("validation, step {}", s.step)
            } else {
                format!("step {}", s.step)
            };
            groups.push(Group {
                title: title.clone(),
                step: s.step,
                row,
                prompt: turns(&prompt),
                columns: vec![Column { label: title, completions: Vec::new() }],
            });
        }
        if let Some(g) = groups.last_mut() {
            g.columns[0].completions.push(completion(s));
        }
    }
    groups
}

/// Evaluation samples grouped by row, one column per model (`step` = the model's index).
fn evaluation_groups(samples: &[&SampleObject], models: &[String]) -> Vec<Group> {
    let mut by_row: BTreeMap<i64, BTreeMap<i32, Vec<&SampleObject>>> = BTreeMap::new();
    for s in samples {
        let row = sample_row(s, true).unwrap_or(i64::from(s.prompt_index));
        by_row.entry(row).or_default().entry(s.step).or_default().push(s);
    }
    by_row
        .into_iter()
        .map(|(row, by_model)| {
            let prompt = by_model
                .values()
                .flatten()
                .find_map(|s| s.sample.as_ref().map(|b| text(b, "prompt")))
                .unwrap_or_default();
            let columns = by_model
                .into_iter()
                .map(|(model, samples)| Column {
                    label: usize::try_from(model)
                        .ok()
                        .and_then(|i| models.get(i).cloned())
                        .unwrap_or_else(|| format!("model {model}")),
                    completions: samples.into_iter().map(completion).collect(),
                })
                .collect();
            Group {
                title: "validation".into(),
                step: 0,
                row: Some(row),
                prompt: turns(&prompt),
                columns,
            }
        })
        .collect()
}

async fn completions_page(
    State(state): State<AppState>,
    user: WebUser,
    Path(id): Path<String>,
    Query(filters): Query<Filters>,
) -> WebResult<Response> {
    find_job(&state, &user.0, &id).await?;
    // Rows are shown and asked for from 1 (as file lines); samples record them from 0.
    let row: Option<i64> = match parse::<i64>("row", &filters.row)? {
        Some(shown) if shown < 1 => {
            return Err(ApiError::invalid("row", "rows are numbered from 1").into());
        }
        shown => shown.map(|r| r - 1),
    };
    let min_score: Option<f64> = parse("min_score", &filters.min_score)?;
    let max_score: Option<f64> = parse("max_score", &filters.max_score)?;
    let q = filters.q.clone().unwrap_or_default().trim().to_lowercase();
    let finish = filters.finish_reason.clone().filter(|f| !f.is_empty());
    let source = filters.source.clone().unwrap_or_default();
    let sources =
        verity_core::sampling_runs::job_evaluations(&state.pool, user.0.org_id, &id).await?;
    let steps: Vec<i32> = verity_core::jobs::metrics_rows(&state.pool, &id)
        .await?
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let page: usize = parse::<usize>("page", &filters.page)?.unwrap_or(1);
    if page == 0 {
        return Err(ApiError::invalid("page", "pages start at 1").into());
    }
    let per_page: usize = parse::<usize>("per_page", &filters.per_page)?.unwrap_or(GROUPS_PER_PAGE);
    if !(1..=MAX_PER_PAGE).contains(&per_page) {
        return Err(ApiError::invalid("per_page", format!("from 1 to {MAX_PER_PAGE}")).into());
    }
    let wide = row.is_some() || !q.is_empty();
    let validation = source == VALIDATION;
    let (groups, step, capped) = if source.is_empty() || validation {
        // Training samples default to the latest step, unless following a row or searching
        // across steps; validation samples to every evaluation.
        let step: Option<i32> = match parse("step", &filters.step)? {
            Some(s) => Some(s),
            None if !wide && !validation && filters.step.is_none() => steps.last().copied(),
            None => None,
        };
        let filter =
            SampleFilter { step, min_score, max_score, after: None, validation: Some(validation) };
        let samples = load_samples(&state, &id, &filter, WIDE).await?;
        let kept: Vec<&SampleObject> = samples
            .iter()
            .filter(|s| s.sample.is_some() && keep(s, false, finish.as_deref(), row, &q))
            .collect();
        (training_groups(&kept, validation), step, samples.len() > WIDE as usize)
    } else {
        if !sources.iter().any(|(run, _)| *run == source) {
            return Err(ApiError::not_found("evaluation of this job", &source).into());
        }
        let run = find_run(&state, &user.0, RunKind::Evaluation, &source).await?;
        let models: Vec<String> = match RunSpec::of_job(&run.spec) {
            Some(Ok(spec)) => spec.models().into_iter().map(|m| m.name.clone()).collect(),
            _ => Vec::new(),
        };
        let filter = SampleFilter { step: None, min_score, max_score, ..SampleFilter::default() };
        let samples = load_samples(&state, &source, &filter, WIDE).await?;
        let kept: Vec<&SampleObject> = samples
            .iter()
            .filter(|s| s.sample.is_some() && keep(s, true, finish.as_deref(), row, &q))
            .collect();
        (evaluation_groups(&kept, &models), None, samples.len() > WIDE as usize)
    };
    let pages = groups.len().div_ceil(per_page).max(1);
    let groups: Vec<Group> =
        groups.into_iter().skip((page - 1) * per_page).take(per_page).collect();
    let shown = groups.iter().flat_map(|g| &g.columns).map(|c| c.completions.len()).sum();
    let show = |v: Option<String>| v.unwrap_or_default();
    Ok(render(&CompletionsPage {
        nav: Nav::new(format!("Completions of {id}"), "jobs"),
        job_id: id,
        steps,
        step: step.map(|s| s.to_string()).unwrap_or_default(),
        min_score: show(filters.min_score),
        max_score: show(filters.max_score),
        finish_reason: show(filters.finish_reason),
        row: show(filters.row),
        q: show(filters.q),
        source,
        sources,
        groups,
        shown,
        page,
        pages,
        per_page: show(filters.per_page),
        capped,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_episode_shows_each_turn_its_call_and_the_result_with_timing() {
        let episode = json!({
            "messages": [
                {"role": "assistant", "content": "Let me compute.", "tool_calls": [{"id": "call_0", "type": "function",
                  "function": {"name": "calculator", "arguments": "{\"expression\":\"12*12\"}"}}]},
                {"role": "tool", "tool_call_id": "call_0", "content": "144"},
                {"role": "assistant", "content": "\\boxed{144}"}],
            "tool_calls": [{"name": "calculator", "arguments": {"expression": "12*12"},
                            "output": "144", "error": false, "seconds": 0.0123}],
            "end": "answer"});
        let turns = episode_turns(&episode);
        let shown: Vec<(&str, &str, &str, &str, bool)> = turns
            .iter()
            .map(|t| (t.role, t.content.as_str(), t.call.as_str(), t.meta.as_str(), t.error))
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "assistant",
                    "Let me compute.",
                    "calculator({\"expression\":\"12*12\"})",
                    "",
                    false
                ),
                ("tool", "144", "", "0.012 s", false),
                ("assistant", "\\boxed{144}", "", "", false),
            ]
        );
        assert!(episode_turns(&Value::Null).is_empty(), "a plain completion has no episode");
    }

    #[test]
    fn a_turn_with_several_calls_shows_each_and_each_result() {
        let call = |id: &str, e: &str| {
            json!({"id": id, "type": "function",
            "function": {"name": "calculator", "arguments": format!("{{\"expression\":\"{e}\"}}")}})
        };
        let record = |output: &str, error: bool| {
            json!({"name": "calculator", "arguments": {},
            "output": output, "error": error, "seconds": 0.001})
        };
        let episode = json!({
            "messages": [
                {"role": "assistant", "content": "", "tool_calls": [call("call_0", "6*7"), call("call_1", "1/0")]},
                {"role": "tool", "tool_call_id": "call_0", "content": "42"},
                {"role": "tool", "tool_call_id": "call_1", "content": "Error: division by zero"}],
            "tool_calls": [record("42", false), record("Error: division by zero", true)],
            "end": "turn_limit"});
        let turns = episode_turns(&episode);
        assert_eq!(
            turns[0].call,
            "calculator({\"expression\":\"6*7\"})\n→ calculator({\"expression\":\"1/0\"})"
        );
        assert_eq!((turns[1].error, turns[2].error), (false, true), "each result its own timing");
    }
}
