//! Bounds on what one request may make the server read, return or run, and who may read
//! `/metrics` (docs/security.md lists each with its default and its setting).

use clap::Args;

/// Default cap of a multipart text field (`purpose`), in bytes.
pub const DEFAULT_MAX_FORM_FIELD_BYTES: usize = 4096;
/// Default cap of the bytes `GET /files/{id}/rows/{n}` returns.
pub const DEFAULT_MAX_ROW_BYTES: usize = 1 << 20;
/// Default cap of one sandboxed run of a `graders/run` (or pre-flight, or validate probe)
/// request, in milliseconds.
pub const DEFAULT_GRADER_RUN_MAX_MS: u64 = 30_000;
/// Default cap of the Tinker calls (sampling) one org may have pending at once.
pub const DEFAULT_TINKER_ORG_PENDING: i64 = 2048;

/// Settings of the request bounds and of `/metrics` access.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Bearer token `/metrics` requires (`Authorization: Bearer …`); unset, `/metrics` is open
    /// to whoever reaches the listener.
    #[arg(long = "metrics-token", env = "VERITY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Largest multipart text field (`purpose`), in bytes.
    #[arg(
        long = "max-form-field-bytes",
        env = "VERITY_MAX_FORM_FIELD_BYTES",
        default_value_t = DEFAULT_MAX_FORM_FIELD_BYTES
    )]
    pub max_form_field_bytes: usize,
    /// Most bytes of one row `GET /files/{id}/rows/{n}` returns (longer rows are cut and
    /// marked `truncated`).
    #[arg(long = "max-row-bytes", env = "VERITY_MAX_ROW_BYTES", default_value_t = DEFAULT_MAX_ROW_BYTES)]
    pub max_row_bytes: usize,
    /// Longest sandboxed run of a grading in the API process (`graders/run`, validate
    /// probes, pre-flight), in milliseconds, whatever the grader's `timeout_ms` × cases.
    #[arg(
        long = "grader-run-max-ms",
        env = "VERITY_GRADER_RUN_MAX_MS",
        default_value_t = DEFAULT_GRADER_RUN_MAX_MS
    )]
    pub grader_run_max_ms: u64,
    /// Gradings one org may run at once in the API process (0: half the grader slots,
    /// rounded up).
    #[arg(
        long = "grader-org-concurrency",
        env = "VERITY_GRADER_ORG_CONCURRENCY",
        default_value_t = 0
    )]
    pub grader_org_concurrency: usize,
    /// Tinker calls (`asample` and training calls) one org may have pending at once; beyond,
    /// 429 (the SDK waits and sends again).
    #[arg(
        long = "tinker-org-pending",
        env = "VERITY_TINKER_ORG_PENDING",
        default_value_t = DEFAULT_TINKER_ORG_PENDING
    )]
    pub tinker_org_pending: i64,
}

impl Default for LimitArgs {
    fn default() -> Self {
        LimitArgs {
            metrics_token: None,
            max_form_field_bytes: DEFAULT_MAX_FORM_FIELD_BYTES,
            max_row_bytes: DEFAULT_MAX_ROW_BYTES,
            grader_run_max_ms: DEFAULT_GRADER_RUN_MAX_MS,
            grader_org_concurrency: 0,
            tinker_org_pending: DEFAULT_TINKER_ORG_PENDING,
        }
    }
}
