//! Checks of a job request before anything is written.

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::files::jsonl::{JsonlValidator, LineError, RowFormat};
use crate::api::state::AppState;
use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;
use verity_core::environment::Environment;
use verity_core::files::FileRecord;
use verity_core::integrations::WandbIntegration;
use verity_core::response_format::ResponseFormat;
use verity_core::spec::{Hyperparameters, Method, MethodKind, TuningHyperparameters};
use verity_verifiers::Grader;

/// Bytes read from the store per step when checking a file's rows.
const READ_CHUNK: usize = 64 * 1024;

/// Most bytes read from the start of a file for its first rows.
pub const FIRST_ROWS_BYTES: usize = 4 * 1024 * 1024;

/// Checks a grader with the verity-verifiers crate (kinds, templates, formulas, sandbox limits).
pub fn validate_grader(grader: &Value) -> Result<Grader, ApiError> {
    crate::api::graders::parse_grader("method.reinforcement.grader", grader)
}

/// Parses an object of the method (its hyperparameters, a tool environment) at JSON path `at`,
/// naming the offending field's path when one fails
/// (`method.reinforcement.hyperparameters.compute_multiplier`, or the object for an unknown
/// field). The method as a whole is an internally tagged enum, through which serde loses the
/// path, so its objects are parsed on their own first.
fn parse_at<T: serde::de::DeserializeOwned>(at: &str, value: Value) -> ApiResult<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param =
            if path == "." || path.is_empty() { at.to_string() } else { format!("{at}.{path}") };
        ApiError::invalid(param, e.into_inner().to_string())
    })
}

/// A checked `method`: resolved, with its grader (reinforcement jobs only).
pub struct CheckedMethod {
    /// The method with every hyperparameter default resolved (what the job stores, runs and
    /// echoes).
    pub resolved: Value,
    /// Which method.
    pub kind: MethodKind,
    /// The compiled grader of a reinforcement job.
    pub grader: Option<Grader>,
    /// The grader that reads `sample.output_tools`, when one does: every row must offer `tools`.
    pub tools_reader: Option<String>,
}

impl CheckedMethod {
    /// The row check of the job's files: a prompt and the fields the grader reads
    /// (reinforcement), a chat with an assistant message (supervised), a preference pair (DPO).
    pub fn rows(&self) -> JsonlValidator {
        match (&self.grader, self.kind) {
            (Some(grader), _) => JsonlValidator::requiring(grader.item_fields())
                .with_tools_for(self.tools_reader.clone()),
            (None, MethodKind::Dpo) => JsonlValidator::for_format(RowFormat::Preference),
            (None, _) => JsonlValidator::for_format(RowFormat::Supervised),
        }
    }
}

/// Checks `method`: `{type: "reinforcement", reinforcement: {grader, hyperparameters?}}`,
/// `{type: "supervised", supervised?: {hyperparameters?}}` or `{type: "dpo", dpo?:
/// {hyperparameters?}}`.
pub fn validate_method(method: Option<&Value>) -> ApiResult<CheckedMethod> {
    let method = method.ok_or_else(|| {
        ApiError::invalid("method", "missing `method` (type reinforcement, supervised or dpo)")
    })?;
    let Value::Object(fields) = method else {
        return Err(ApiError::invalid("method", "must be an object"));
    };
    let kind = match fields.get("type").and_then(Value::as_str) {
        Some("reinforcement") => MethodKind::Reinforcement,
        Some("supervised") => MethodKind::Supervised,
        Some("dpo") => MethodKind::Dpo,
        Some(kind) => {
            return Err(ApiError::invalid(
                "method.type",
                format!(
                    "unsupported method {kind:?}; Verity trains \"reinforcement\", \
                     \"supervised\" and \"dpo\" jobs"
                ),
            ))
        }
        None => {
            return Err(ApiError::invalid(
                "method.type",
                "missing method type (reinforcement, supervised or dpo)",
            ))
        }
    };
    let name = kind.as_str();
    for other in [MethodKind::Reinforcement, MethodKind::Supervised, MethodKind::Dpo] {
        if other != kind && fields.contains_key(other.as_str()) {
            return Err(ApiError::invalid(
                format!("method.{}", other.as_str()),
                format!("a {name} job takes its settings in `method.{name}`"),
            ));
        }
    }
    let settings = match fields.get(name) {
        None if kind != MethodKind::Reinforcement => Map::new(),
        Some(Value::Object(settings)) => settings.clone(),
        _ if kind == MethodKind::Reinforcement => {
            return Err(ApiError::invalid(
                "method.reinforcement",
                "missing object `reinforcement` with `grader`",
            ))
        }
        _ => return Err(ApiError::invalid(format!("method.{name}"), "must be an object")),
    };
    let grader = match (kind, settings.get("grader")) {
        (MethodKind::Reinforcement, Some(grader)) => Some(validate_grader(grader)?),
        (MethodKind::Reinforcement, None) => {
            return Err(ApiError::invalid("method.reinforcement.grader", "missing grader"))
        }
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                format!("method.{name}.grader"),
                format!(
                    "a {name} job has no grader: the file's assistant messages are its targets \
                     (use method.type \"reinforcement\" to train on a grader's rewards)"
                ),
            ))
        }
        (_, None) => None,
    };
    let at = format!("method.{name}.hyperparameters");
    let hyperparameters = match settings.get("hyperparameters") {
        None => Value::Object(Map::new()),
        Some(value @ Value::Object(_)) => value.clone(),
        Some(_) => return Err(ApiError::invalid(at, "must be an object")),
    };
    // Name the hyperparameter when it is what fails to parse, else the method's object.
    let mut tools_reader = None;
    match kind {
        MethodKind::Reinforcement => {
            parse_at::<Hyperparameters>(&at, hyperparameters)?;
            let environment = settings.get("environment").filter(|e| !e.is_null());
            if let Some(environment) = environment {
                parse_at::<Environment>("method.reinforcement.environment", environment.clone())?;
            }
            let format = match settings.get("response_format").filter(|f| !f.is_null()) {
                Some(format) => Some(parse_at::<ResponseFormat>(
                    "method.reinforcement.response_format",
                    format.clone(),
                )?),
                None => None,
            };
            if let Some(format) = format.as_ref() {
                validate_response_format("method.reinforcement.response_format", format)?;
            }
            if let Some(grader) = &grader {
                tools_reader = check_sample_fields(
                    grader,
                    "method.reinforcement.grader",
                    format.as_ref(),
                    environment.is_some(),
                )?;
            }
        }
        MethodKind::Supervised | MethodKind::Dpo => {
            parse_at::<TuningHyperparameters>(&at, hyperparameters)?;
        }
    }
    let parsed: Method = serde_json::from_value(method.clone())
        .map_err(|e| ApiError::invalid(format!("method.{name}"), e.to_string()))?;
    parsed.validate().map_err(|e| ApiError::invalid(e.param, e.message))?;
    let resolved = serde_json::to_value(parsed.resolved())
        .map_err(|e| ApiError::internal("resolving hyperparameters", e))?;
    Ok(CheckedMethod { resolved, kind, grader, tools_reader })
}

/// Checks every `sample.…` reference of `grader` (at JSON path `param`) against what the
/// samples will hold: `output_text` always; `output_json.…` only with a JSON `format` (and,
/// when its schema lists properties, one of them); `output_tools` only for single-turn jobs
/// (their rows must then offer `tools`: the name of the grader reading it is returned for that
/// row check); `messages` and `tool_calls` only with an `environment`. A 400 names the grader
/// and the field.
pub fn check_sample_fields(
    grader: &Grader,
    param: &str,
    format: Option<&ResponseFormat>,
    environment: bool,
) -> ApiResult<Option<String>> {
    let mut tools_reader = None;
    for (name, path) in grader.sample_fields() {
        let field = format!("sample.{}", path.join("."));
        let refuse = |why: String| {
            Err(ApiError::invalid(
                param,
                format!("grader {name:?} reads {{{{{field}}}}}, but {why}"),
            ))
        };
        match path[0].as_str() {
            "output_text" => {}
            "output_json" => match format {
                Some(format) if format.is_json() => {
                    let properties = format.schema_properties();
                    if let (Some(properties), Some(key)) = (properties, path.get(1)) {
                        if !properties.contains(key) {
                            return refuse(format!(
                                "the response_format schema has no property {key:?} (it has {})",
                                properties.join(", ")
                            ));
                        }
                    }
                }
                _ => {
                    return refuse(
                        "sample.output_json is only set with a JSON response_format: set \
                         method.reinforcement.response_format to {\"type\": \"json_schema\", …} \
                         or {\"type\": \"json_object\"}"
                            .into(),
                    )
                }
            },
            "output_tools" if environment => {
                return refuse(
                    "a job with an environment records its calls in sample.tool_calls".into(),
                )
            }
            "output_tools" => tools_reader = Some(name.clone()),
            "messages" | "tool_calls" if environment => {}
            other => {
                return refuse(format!(
                    "samples have no field {other:?}: they hold output_text, output_json (with a \
                     JSON response_format), output_tools (rows with tools), and with an \
                     environment messages and tool_calls"
                ))
            }
        }
    }
    Ok(tools_reader)
}

/// A job without `method`, as OpenAI takes it (its legacy shape): supervised, with the
/// top-level `hyperparameters` (`batch_size`, `learning_rate_multiplier`, `n_epochs`, …);
/// errors name `hyperparameters.{field}`.
pub fn legacy_method(hyperparameters: Option<&Value>) -> ApiResult<CheckedMethod> {
    let hyperparameters = match hyperparameters {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(value @ Value::Object(_)) => value.clone(),
        Some(_) => return Err(ApiError::invalid("hyperparameters", "must be an object")),
    };
    let method = serde_json::json!({
        "type": "supervised",
        "supervised": { "hyperparameters": hyperparameters },
    });
    validate_method(Some(&method)).map_err(|mut e| {
        if let Some(param) = &e.param {
            let prefix = "method.supervised.";
            e.param = Some(param.strip_prefix(prefix).unwrap_or(param).to_string());
        }
        e
    })
}

/// Checks a `response_format` (at `param`): its fields, and that its schema compiles into the
/// grammar constrained decoding enforces (a strict schema with keywords the engine cannot
/// enforce, or one no output satisfies, is refused naming `{param}.json_schema.schema`).
pub fn validate_response_format(param: &str, format: &ResponseFormat) -> ApiResult<()> {
    format.validate().map_err(|e| ApiError::invalid(format!("{param}.{}", e.field), e.message))?;
    verity_worker::constrained::check_format(format).map_err(|message| {
        let field = match format {
            ResponseFormat::JsonSchema { .. } => ".json_schema.schema",
            _ => "",
        };
        ApiError::invalid(format!("{param}{field}"), message)
    })
}

/// Checks the suffix: at most 64 characters of letters, digits, `-` and `_`.
pub fn validate_suffix(suffix: Option<&str>) -> ApiResult<()> {
    match suffix {
        Some(s)
            if s.is_empty()
                || s.len() > 64
                || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
        {
            Err(ApiError::invalid(
                "suffix",
                "1 to 64 characters among letters, digits, '-' and '_'",
            ))
        }
        _ => Ok(()),
    }
}

/// The request's `integrations`, checked: a W&B run needs the server's W&B API key.
pub fn validate_integrations(
    state: &AppState,
    integrations: Option<&Value>,
) -> ApiResult<Vec<WandbIntegration>> {
    let parsed = verity_core::integrations::parse(integrations)
        .map_err(|e| ApiError::invalid(e.field.as_str(), e.message))?;
    if !parsed.is_empty() && state.wandb.is_none() {
        return Err(ApiError::invalid(
            "integrations",
            "this server has no Weights & Biases API key: its operator sets WANDB_API_KEY (and \
             WANDB_BASE_URL for a self-hosted W&B) on `verity serve`/`verity up`; metrics are \
             always at GET /v1/fine_tuning/jobs/{id}/metrics",
        )
        .with_code("unsupported_parameter"));
    }
    Ok(parsed)
}

/// Refuses the deprecated top-level `hyperparameters` beside a `method` (they belong in
/// `method.{type}.hyperparameters`) rather than dropping them. Null is accepted.
pub fn refuse_top_level_hyperparameters(hyperparameters: Option<&Value>) -> ApiResult<()> {
    match hyperparameters {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(ApiError::invalid(
            "hyperparameters",
            "the top-level hyperparameters are deprecated; put them in \
             method.{type}.hyperparameters (e.g. method.reinforcement.hyperparameters)",
        )
        .with_code("unsupported_parameter")),
    }
}

/// Checks metadata: at most 16 string values with keys up to 64 characters.
pub fn validate_metadata(metadata: Option<&Value>) -> ApiResult<()> {
    let Some(metadata) = metadata else { return Ok(()) };
    if metadata.is_null() {
        return Ok(());
    }
    let map: &Map<String, Value> =
        metadata.as_object().ok_or_else(|| ApiError::invalid("metadata", "must be an object"))?;
    if map.len() > 16 {
        return Err(ApiError::invalid("metadata", "at most 16 keys"));
    }
    for (key, value) in map {
        if key.chars().count() > 64 || value.as_str().is_none_or(|v| v.chars().count() > 512) {
            return Err(ApiError::invalid(
                format!("metadata.{key}"),
                "keys up to 64 characters, string values up to 512",
            ));
        }
    }
    Ok(())
}

/// Checks that `file_id` is a processed fine-tune file of the caller's org; its row.
pub async fn validate_file(
    state: &AppState,
    principal: &Principal,
    param: &str,
    file_id: &str,
) -> ApiResult<FileRecord> {
    let file = verity_core::files::get_file(&state.pool, principal.org_id, file_id)
        .await?
        .ok_or_else(|| {
            ApiError::invalid(param, format!("no file with id {file_id:?}"))
                .with_code("file_not_found")
        })?;
    match file.status.as_str() {
        "processed" => Ok(file),
        "error" => {
            let details = file
                .status_details
                .as_ref()
                .and_then(|d| d.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("invalid");
            Err(ApiError::invalid(param, format!("file {file_id} failed validation: {details}"))
                .with_code("invalid_file"))
        }
        other => Err(ApiError::invalid(param, format!("file {file_id} is {other}, not processed"))
            .with_code("invalid_file")),
    }
}

/// Checks every row of a processed file for what the job will do with it (`validator`, see
/// [`CheckedMethod::rows`]): for reinforcement jobs a prompt the worker can render and each
/// `item` field the grader reads, for supervised and DPO jobs a chat or preference pair. The
/// file is streamed from the store; checking stops after a few problems, and the first is
/// reported with its line and field (the others by line).
pub async fn validate_rows(
    state: &AppState,
    param: &str,
    file: &FileRecord,
    validator: JsonlValidator,
) -> ApiResult<()> {
    row_problems(state, file, validator).await?.map(|_| ()).map_err(|errors| {
        let message = rows_message(&file.id, &errors);
        tracing::info!(file_id = %file.id, param, problems = errors.len(), "dataset rows refused");
        ApiError::invalid(param, message).with_code("invalid_file")
    })
}

/// Streams `file` through `validator`: the number of rows, or the problems found (each with
/// its line and field, at most the validator's limit).
pub async fn row_problems(
    state: &AppState,
    file: &FileRecord,
    mut validator: JsonlValidator,
) -> ApiResult<Result<u64, Vec<LineError>>> {
    let mut reader = state.store.get_reader(&file.storage_key).await?;
    let mut buffer = vec![0u8; READ_CHUNK];
    while !validator.is_full() {
        let read = reader
            .read(&mut buffer)
            .await
            .map_err(|e| ApiError::unavailable("reading a dataset from the object store", e))?;
        if read == 0 {
            break;
        }
        validator.feed(&buffer[..read]);
    }
    Ok(validator.finish_all())
}

/// The first `n` rows of `file` that parse as JSON objects, with their 1-based line numbers
/// (reading at most [`FIRST_ROWS_BYTES`]).
pub async fn first_rows(
    state: &AppState,
    file: &FileRecord,
    n: usize,
) -> ApiResult<Vec<(u64, Value)>> {
    let mut reader = state.store.get_reader(&file.storage_key).await?;
    let mut bytes = Vec::new();
    let mut buffer = vec![0u8; READ_CHUNK];
    while bytes.len() < FIRST_ROWS_BYTES {
        let read = reader
            .read(&mut buffer)
            .await
            .map_err(|e| ApiError::unavailable("reading a dataset from the object store", e))?;
        if read == 0 {
            break;
        }
        bytes.extend_from_slice(&buffer[..read]);
        if bytes.iter().filter(|&&b| b == b'\n').count() > n {
            break;
        }
    }
    let rows = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter_map(|(i, line)| match serde_json::from_slice::<Value>(line) {
            Ok(value @ Value::Object(_)) => Some((i as u64 + 1, value)),
            _ => None,
        })
        .take(n)
        .collect();
    Ok(rows)
}

/// `file file-… line 3: field `x`: why (also lines 5, 9)`.
fn rows_message(file_id: &str, errors: &[LineError]) -> String {
    let mut message = match errors.first() {
        Some(first) => format!("file {file_id} {first}"),
        None => format!("file {file_id} is invalid"),
    };
    if errors.len() > 1 {
        let lines: Vec<String> = errors[1..].iter().map(|e| e.line.to_string()).collect();
        message.push_str(&format!(" (also line(s) {})", lines.join(", ")));
        if errors.len() == crate::api::files::jsonl::MAX_LINE_ERRORS {
            message.push_str(" and possibly more; checking stopped there");
        }
    }
    message
}

/// Checks that every judge model the grader names (at `param`) is routed to an endpoint or
/// registered for the caller's org; a missing one is a 400 naming its JSON path.
pub async fn validate_judges(
    state: &AppState,
    principal: &Principal,
    param: &str,
    grader: &Grader,
) -> ApiResult<()> {
    for (path, name) in grader.judge_models() {
        if state.judges.settings().endpoint(&name).is_none() {
            model_name_param(state, principal, &format!("{param}.{path}"), &name).await?;
        }
    }
    match state.judges.missing_judge(&state.pool, principal.org_id, grader).await? {
        None => Ok(()),
        Some((path, name)) => Err(ApiError::invalid(
            format!("{param}.{path}"),
            format!(
                "judge model {name:?} does not exist (see GET /v1/models; register it with \
                 `verity models import`, or route it with VERITY_JUDGE_ENDPOINTS)"
            ),
        )
        .with_code("model_not_found")),
    }
}

/// Checks a model, judge or other object name the request sent at `param` against the one
/// name rule ([`verity_core::names::check_name`]); a 400 naming `param` (never echoing the
/// name) when it breaks it.
pub fn check_name_param(param: &str, name: &str) -> ApiResult<()> {
    verity_core::names::check_name(name).map_err(|e| {
        ApiError::invalid(param, format!("invalid name: {e}")).with_code("invalid_name")
    })
}

/// The model name a request sent at `param`, with the hub id (`OWNER/NAME`) of a model the
/// caller's org can see replaced by that model's name ([`verity_core::models::model_for_hub_id`]);
/// any other name must pass [`check_name_param`]. A hub id no model has is a 400 that says how
/// a model gets one.
pub async fn model_name_param(
    state: &AppState,
    principal: &Principal,
    param: &str,
    name: &str,
) -> ApiResult<String> {
    let by_hub_id = verity_core::models::model_for_hub_id(&state.pool, principal.org_id, name);
    if let Some(model) = by_hub_id.await? {
        return Ok(model);
    }
    if verity_core::models::check_hub_id(name).is_ok() {
        return Err(ApiError::invalid(
            param,
            format!(
                "no model has the hub id {name:?}: an org admin pulls it with POST \
                 /v1/verity/model_pulls {{\"model\": \"{name}\"}} (or the dashboard's Models \
                 page), the operator with `verity models pull {name}` (or gives an imported \
                 folder that id with `verity models import --hub-id`); see GET /v1/models"
            ),
        )
        .with_code("model_not_found"));
    }
    check_name_param(param, name)?;
    Ok(name.to_string())
}

/// Checks that `model` names a model the caller's org can train from: a base model, one of its
/// jobs' `fine_tuned_model` (full weights or a LoRA adapter, merged into its base when the job
/// starts) or checkpoint names (`…:ckpt-step-N`), over the model its job started from
/// ([`verity_core::lineage::resolve_stack`]). Another org's model is as unknown as a missing one.
pub async fn validate_model(state: &AppState, principal: &Principal, model: &str) -> ApiResult<()> {
    check_name_param("model", model)?;
    verity_core::lineage::resolve_stack(&state.pool, principal.org_id, model).await?.ok_or_else(
        || {
            ApiError::invalid(
                "model",
                format!(
                    "model {model:?} does not exist (see GET /v1/models, or a job's \
                     fine_tuned_model or checkpoints)"
                ),
            )
            .with_code("model_not_found")
        },
    )?;
    Ok(())
}
