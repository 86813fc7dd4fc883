//! `POST /v1/verity/preflight`: a job request checked as job creation checks it, without
//! enqueuing anything, and reported in full: every row problem of each file (line and field),
//! the grader run on the first rows with their reference answers, and the exploit probes
//! (`verity_verifiers::probes`) on the first row, judged against the job's own completion
//! budget (a hack the job cannot sample is reported, not flagged).

use super::auth::Principal;
use super::error::ApiResult;
use super::extract::ApiJson;
use super::files::jsonl::LineError;
use super::graders::{grade_in_slot, ready_grader};
use super::jobs::validate::{first_rows, row_problems};
use super::jobs::{check_request, CreateJobRequest};
use super::state::AppState;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use verity_verifiers::probes::{self, ProbeResult};
use verity_verifiers::Sample;

/// Rows of the training file the grader is run on.
pub const GRADED_ROWS: usize = 3;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/verity/preflight", post(preflight))
}

/// The row check of one file.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileReport {
    /// The request field naming the file (`training_file`, `validation_file`).
    pub param: &'static str,
    /// The file's id.
    pub file_id: String,
    /// Rows checked, when every row passed.
    pub rows: Option<u64>,
    /// Problems found, in line order (checking stops after a few): `{line, field, reason}`.
    #[schema(value_type = Vec<Object>)]
    pub errors: Vec<LineError>,
}

/// The grader on one row, given the row's reference answer (or an empty answer when the
/// grader has no reference).
#[derive(Debug, Serialize, ToSchema)]
pub struct RowRun {
    /// 1-based line of the training file.
    pub line: u64,
    /// The completion graded.
    pub sample: String,
    /// The score in [0, 1].
    pub score: f64,
    /// The grader's reason.
    pub reason: String,
    /// Set when grading failed (a missing field, the sandbox, the judge).
    pub error: Option<String>,
}

/// The exploit probes on one row.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProbeReport {
    /// 1-based line of the training file the probes used.
    pub line: u64,
    /// One result per probe: `{name, kind, description, score, rewarded, flagged, out_of_reach,
    /// fix, reason, error, …}`.
    #[schema(value_type = Vec<Object>)]
    pub results: Vec<ProbeResult>,
}

/// What `POST /v1/verity/preflight` answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct PreflightReport {
    /// `verity.preflight`.
    pub object: &'static str,
    /// Whether job creation would accept the request (every row passed, no grading failed).
    pub ok: bool,
    /// The row check of each file.
    pub files: Vec<FileReport>,
    /// The grader on the first rows (reinforcement jobs).
    pub grader_runs: Vec<RowRun>,
    /// The exploit probes on the first row (reinforcement jobs).
    pub probes: Option<ProbeReport>,
}

/// Checks a job request as `POST /v1/fine_tuning/jobs` does (same body) and reports instead of
/// enqueuing: a problem outside the rows is the same 400, row problems are listed per file
/// with `ok: false`.
#[utoipa::path(post, path = "/v1/verity/preflight", tag = "fine_tuning", request_body = CreateJobRequest,
    responses((status = 200, body = PreflightReport), (status = 400), (status = 401),
        (status = 503, description = "every grader slot is taken; retry after `Retry-After` seconds")))]
pub async fn preflight(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(request): ApiJson<CreateJobRequest>,
) -> ApiResult<Json<PreflightReport>> {
    let checked = check_request(&state, &principal, &request).await?;
    let mut files = Vec::new();
    for (param, file) in checked.files() {
        let (rows, errors) = match row_problems(&state, file, checked.method.rows()).await? {
            Ok(rows) => (Some(rows), Vec::new()),
            Err(errors) => (None, errors),
        };
        files.push(FileReport { param, file_id: file.id.clone(), rows, errors });
    }
    let (grader_runs, probes) = match (&checked.method.grader, grader_spec(&request)) {
        (Some(_), Some(spec)) => {
            let param = "method.reinforcement.grader";
            let rows = first_rows(&state, &checked.training, GRADED_ROWS).await?;
            let budget = verity_core::spec::method_completion_budget(&checked.method.resolved);
            let (slot, grader) = ready_grader(&state, &principal, param, spec).await?;
            grade_in_slot(slot, move || grade_rows(&grader, &rows, budget)).await?
        }
        _ => (Vec::new(), None),
    };
    let ok =
        files.iter().all(|f| f.errors.is_empty()) && grader_runs.iter().all(|r| r.error.is_none());
    tracing::info!(org_id = %principal.org_id, ok, "pre-flight");
    Ok(Json(PreflightReport { object: "verity.preflight", ok, files, grader_runs, probes }))
}

/// The grader spec of a reinforcement request.
fn grader_spec(request: &CreateJobRequest) -> Option<&Value> {
    request.method.as_ref()?.get("reinforcement")?.get("grader")
}

/// The grader on each row with its reference answer, and the probes on the first row judged
/// against the completion budget.
fn grade_rows(
    grader: &verity_verifiers::Grader,
    rows: &[(u64, Value)],
    max_completion_tokens: Option<usize>,
) -> (Vec<RowRun>, Option<ProbeReport>) {
    let runs = rows
        .iter()
        .map(|(line, item)| {
            let sample = grader.reference_for(item).unwrap_or_default();
            let result = grader.grade(item, &Sample::from_text(sample.clone()));
            RowRun {
                line: *line,
                sample,
                score: result.score,
                reason: result.reason,
                error: result.error.map(|e| e.message),
            }
        })
        .collect();
    let probes = rows.first().map(|(line, item)| ProbeReport {
        line: *line,
        results: probes::run_probes(grader, item, max_completion_tokens),
    });
    (runs, probes)
}
