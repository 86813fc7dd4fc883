//! `verity jobs create|list|show|cancel|pause|resume|watch`.

use super::{field, print_json, Client, ClientArgs};
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// `verity jobs …`.
#[derive(Debug, Args)]
pub struct JobsArgs {
    /// Server and key.
    #[command(flatten)]
    pub client: ClientArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: JobsCommand,
}

/// Job commands.
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Create a job from a JSON request body (as `POST /v1/fine_tuning/jobs`); prints its id.
    /// With `--dry-run`, only the pre-flight report (`POST /v1/verity/preflight`); with
    /// `--dry-run --profile`, also a difficulty profile and the cost estimate.
    Create(Box<CreateArgs>),
    /// List jobs, newest first.
    List,
    /// Show one job.
    Show {
        /// Job id.
        id: String,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: String,
    },
    /// Pause a job (it keeps its checkpoints; resume continues from the last one).
    Pause {
        /// Job id.
        id: String,
    },
    /// Resume a paused job.
    Resume {
        /// Job id.
        id: String,
    },
    /// Change a job's budget caps (`POST /v1/verity/jobs/{id}/budget`); a cap not given is
    /// kept. Raise the cap of a job its budget paused, then resume it.
    Budget {
        /// Job id.
        id: String,
        #[command(flatten)]
        caps: BudgetArgs,
    },
    /// The training monitor's warnings (`GET /v1/verity/jobs/{id}/warnings`): one line each
    /// with its step, kind, the metric that triggered it against its threshold, and whether
    /// the job's `auto_pause_on` pauses it.
    Warnings {
        /// Job id.
        id: String,
    },
    /// Print a line per new event until the job ends; exits 0 only when it succeeded.
    Watch {
        /// Job id.
        id: String,
    },
}

/// Options of `verity jobs create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The request body (JSON); the flags below override its fields.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Training file id.
    #[arg(long = "training-file")]
    pub training_file: Option<String>,
    /// Validation file id.
    #[arg(long = "validation-file")]
    pub validation_file: Option<String>,
    /// The model to train: a base model, a `fine_tuned_model` or a checkpoint name.
    #[arg(long, conflicts_with = "from_job")]
    pub model: Option<String>,
    /// Continue training from this job's model (its `fine_tuned_model`, or with
    /// `--checkpoint` one of its checkpoints).
    #[arg(long = "from-job")]
    pub from_job: Option<String>,
    /// With `--from-job`: start from the job's checkpoint at this step.
    #[arg(long, requires = "from_job")]
    pub checkpoint: Option<i64>,
    /// The method: `reinforcement` (needs a grader in the body), `supervised` or `dpo`.
    #[arg(long, value_parser = ["reinforcement", "supervised", "dpo"])]
    pub method: Option<String>,
    /// Hyperparameters (a JSON object) merged into `method.{type}.hyperparameters`.
    #[arg(long)]
    pub hyperparameters: Option<String>,
    /// Check the request without creating the job (`POST /v1/verity/preflight`): every row
    /// problem with its line and field, the grader on the first rows and the exploit probes'
    /// scores; exits 1 when job creation would refuse the request.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// With `--dry-run`: also profile the job's difficulty (`POST /v1/verity/difficulty_profiles`)
    /// and print the pass-rate histogram, the predicted zero-advantage fraction and the cost
    /// and time estimate.
    #[arg(long, requires = "dry_run")]
    pub profile: bool,
    /// With `--profile`: prompts profiled (default 32).
    #[arg(long = "profile-prompts", requires = "profile")]
    pub profile_prompts: Option<usize>,
    /// With `--profile`: completions per prompt (default: the job's group size).
    #[arg(long = "profile-k", requires = "profile")]
    pub profile_k: Option<usize>,
    /// With `--profile`: write the training file without the prompts always or never solved
    /// (`<name>.filtered.jsonl`) and print its id.
    #[arg(long, requires = "profile")]
    pub filter: bool,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub environment: EnvironmentArgs,
}

/// A reinforcement job's tool environment (Verity extension; docs/tools.md): multi-turn
/// episodes in which the model calls sandboxed tools.
#[derive(Debug, Args)]
pub struct EnvironmentArgs {
    /// The whole `environment` block (JSON, or `@path` to a JSON file); the two flags below
    /// override its fields.
    #[arg(long)]
    pub environment: Option<String>,
    /// Built-in tools offered, comma-separated (`calculator`, `python`); replaces the block's
    /// `tools`.
    #[arg(long, value_delimiter = ',')]
    pub tools: Vec<String>,
    /// Assistant turns per episode.
    #[arg(long = "max-turns")]
    pub max_turns: Option<u64>,
    /// Lets one assistant turn make several tool calls (sets `parallel_tool_calls`).
    #[arg(long = "parallel-tool-calls")]
    pub parallel_tool_calls: bool,
}

impl EnvironmentArgs {
    /// The environment block the flags give (`None` when none is given).
    fn body(&self) -> anyhow::Result<Option<Value>> {
        let mut block = match self.environment.as_deref() {
            None => serde_json::Map::new(),
            Some(text) => {
                let text = match text.strip_prefix('@') {
                    Some(path) => std::fs::read_to_string(path)
                        .with_context(|| format!("reading the environment file {path}"))?,
                    None => text.to_string(),
                };
                serde_json::from_str(&text).context("--environment must be a JSON object")?
            }
        };
        if !self.tools.is_empty() {
            let tools = self.tools.iter().map(|t| serde_json::json!({"type": t.trim()})).collect();
            block.insert("tools".into(), Value::Array(tools));
        }
        if let Some(turns) = self.max_turns {
            block.insert("max_turns".into(), turns.into());
        }
        if self.parallel_tool_calls {
            block.insert("parallel_tool_calls".into(), true.into());
        }
        let given = self.environment.is_some()
            || !self.tools.is_empty()
            || self.max_turns.is_some()
            || self.parallel_tool_calls;
        Ok(given.then_some(Value::Object(block)))
    }
}

/// Sets `method.reinforcement.environment` (the method must be reinforcement).
fn apply_environment(
    body: &mut serde_json::Map<String, Value>,
    environment: Value,
) -> anyhow::Result<()> {
    let method =
        body.entry("method").or_insert_with(|| serde_json::json!({"type": "reinforcement"}));
    let Some(method) = method.as_object_mut() else {
        anyhow::bail!("the body's `method` must be an object")
    };
    let kind = method.entry("type").or_insert_with(|| "reinforcement".into());
    if kind.as_str() != Some("reinforcement") {
        anyhow::bail!(
            "--environment, --tools, --max-turns and --parallel-tool-calls need a reinforcement job, not {kind}"
        );
    }
    let settings = method.entry("reinforcement").or_insert_with(|| serde_json::json!({}));
    let Some(settings) = settings.as_object_mut() else {
        anyhow::bail!("the body's `method.reinforcement` must be an object")
    };
    settings.insert("environment".into(), environment);
    Ok(())
}

/// A job's budget caps (Verity extension; the job pauses itself when one is reached).
#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// Wall seconds the job's attempts may spend (time queued or paused not counted).
    #[arg(long = "max-wall-seconds")]
    pub max_wall_seconds: Option<i64>,
    /// Completion tokens the policy may generate in training steps (reinforcement jobs).
    #[arg(long = "max-tokens")]
    pub max_tokens: Option<i64>,
}

impl BudgetArgs {
    /// The caps given, as a budget object (`None` when none is).
    fn body(&self) -> Option<Value> {
        let caps = [("max_wall_seconds", self.max_wall_seconds), ("max_tokens", self.max_tokens)];
        let map: serde_json::Map<String, Value> =
            caps.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?.into()))).collect();
        (!map.is_empty()).then_some(Value::Object(map))
    }
}

/// The model name `--from-job JOB [--checkpoint STEP]` stands for: the checkpoint's
/// `fine_tuned_model_checkpoint`, else the job's `fine_tuned_model`, else its latest checkpoint.
pub async fn from_job_model(
    client: &Client,
    job: &str,
    step: Option<i64>,
) -> anyhow::Result<String> {
    if step.is_none() {
        let object = client.get_json(&format!("/v1/fine_tuning/jobs/{job}")).await?;
        if let Some(model) = object["fine_tuned_model"].as_str() {
            return Ok(model.to_string());
        }
    }
    let checkpoint = super::checkpoints::find(client, job, step).await?;
    checkpoint["fine_tuned_model_checkpoint"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("job {job}'s checkpoint has no model name"))
}

/// Sets the body's `method.type` to `kind` (keeping settings of that type) and merges
/// `hyperparameters` into `method.{type}.hyperparameters`.
fn apply_method(
    body: &mut serde_json::Map<String, Value>,
    kind: Option<&str>,
    hyperparameters: Option<&str>,
) -> anyhow::Result<()> {
    if kind.is_none() && hyperparameters.is_none() {
        return Ok(());
    }
    let method = body.entry("method").or_insert_with(|| serde_json::json!({}));
    let Some(method) = method.as_object_mut() else {
        anyhow::bail!("the body's `method` must be an object")
    };
    if let Some(kind) = kind {
        if method.get("type").and_then(Value::as_str) != Some(kind) {
            method.retain(|key, _| key == kind);
            method.insert("type".into(), Value::String(kind.to_string()));
        }
    }
    let kind = method.get("type").and_then(Value::as_str).unwrap_or("reinforcement").to_string();
    if let Some(text) = hyperparameters {
        let extra: serde_json::Map<String, Value> =
            serde_json::from_str(text).context("--hyperparameters must be a JSON object")?;
        let settings = method.entry(kind).or_insert_with(|| serde_json::json!({}));
        let hp = settings
            .as_object_mut()
            .context("the method's settings must be an object")?
            .entry("hyperparameters")
            .or_insert_with(|| serde_json::json!({}));
        let hp = hp.as_object_mut().context("hyperparameters must be an object")?;
        hp.extend(extra);
    }
    Ok(())
}

/// Whether a job's (or sampling run's) `status` is final: it does not change any more.
pub fn is_final(status: &str) -> bool {
    status.parse::<verity_core::JobState>().is_ok_and(verity_core::JobState::is_terminal)
}

/// Runs a job command.
pub async fn run(args: &JobsArgs) -> anyhow::Result<()> {
    let client = Client::from_args(&args.client)?;
    let json = args.client.json;
    match &args.command {
        JobsCommand::Create(create) => {
            let mut body = match &create.file {
                Some(path) => super::read_json(path)?,
                None => Value::Object(Default::default()),
            };
            let Some(object) = body.as_object_mut() else {
                anyhow::bail!("the job request must be a JSON object")
            };
            let model = match &create.from_job {
                Some(job) => Some(from_job_model(&client, job, create.checkpoint).await?),
                None => create.model.clone(),
            };
            for (name, value) in [
                ("training_file", &create.training_file),
                ("validation_file", &create.validation_file),
                ("model", &model),
            ] {
                if let Some(value) = value {
                    object.insert(name.to_string(), Value::String(value.clone()));
                }
            }
            apply_method(object, create.method.as_deref(), create.hyperparameters.as_deref())?;
            if let Some(environment) = create.environment.body()? {
                apply_environment(object, environment)?;
            }
            if let Some(Value::Object(caps)) = create.budget.body() {
                let budget = object.entry("budget").or_insert_with(|| serde_json::json!({}));
                let Some(budget) = budget.as_object_mut() else {
                    anyhow::bail!("the body's `budget` must be an object")
                };
                budget.extend(caps);
            }
            if create.dry_run {
                let report = client.post_json("/v1/verity/preflight", &body).await?;
                if json {
                    print_json(&report);
                } else {
                    print!("{}", super::preflight::report_text(&report));
                }
                if report["ok"] != Value::Bool(true) {
                    anyhow::bail!("pre-flight: job creation would refuse this request");
                }
                if create.profile {
                    let options = super::profile::ProfileOptions {
                        prompts: create.profile_prompts,
                        k: create.profile_k,
                        filter: create.filter,
                    };
                    super::profile::profile(&client, &body, &options, json).await?;
                }
                return Ok(());
            }
            let job = client.post_json("/v1/fine_tuning/jobs", &body).await?;
            show(&job, json, true);
        }
        JobsCommand::List => {
            let page = client.get_json("/v1/fine_tuning/jobs?limit=100").await?;
            if json {
                print_json(&page);
            } else {
                for job in page["data"].as_array().into_iter().flatten() {
                    println!(
                        "{}\t{}\t{}\t{}",
                        field(job, "id"),
                        field(job, "status"),
                        field(job, "model"),
                        progress_text(job)
                    );
                }
            }
        }
        JobsCommand::Show { id } => {
            show(&client.get_json(&format!("/v1/fine_tuning/jobs/{id}")).await?, json, false)
        }
        JobsCommand::Cancel { id } => show(&control(&client, id, "cancel").await?, json, false),
        JobsCommand::Pause { id } => show(&control(&client, id, "pause").await?, json, false),
        JobsCommand::Resume { id } => show(&control(&client, id, "resume").await?, json, false),
        JobsCommand::Budget { id, caps } => {
            let body = caps.body().context("give --max-wall-seconds or --max-tokens")?;
            let job = client.post_json(&format!("/v1/verity/jobs/{id}/budget"), &body).await?;
            show(&job, json, false)
        }
        JobsCommand::Warnings { id } => {
            let list = client.get_json(&format!("/v1/verity/jobs/{id}/warnings")).await?;
            if json {
                print_json(&list);
            } else {
                print!("{}", warnings_text(&list));
            }
        }
        JobsCommand::Watch { id } => {
            let status = watch(&client, id, |line| println!("{line}")).await?;
            if status != "succeeded" {
                anyhow::bail!("job {id} ended {status}");
            }
        }
    }
    Ok(())
}

/// `POST /v1/fine_tuning/jobs/{id}/{action}`.
pub async fn control(client: &Client, id: &str, action: &str) -> anyhow::Result<Value> {
    client
        .post_json(
            &format!("/v1/fine_tuning/jobs/{id}/{action}"),
            &Value::Object(Default::default()),
        )
        .await
}

/// The lines `verity jobs warnings` prints for a warnings list.
fn warnings_text(list: &Value) -> String {
    let pausing: Vec<&str> =
        list["auto_pause_on"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let warnings = list["data"].as_array().map(Vec::as_slice).unwrap_or_default();
    if warnings.is_empty() {
        return "no warnings\n".to_string();
    }
    let mut text = String::new();
    for w in warnings {
        let kind = field(w, "kind");
        let pauses = if pausing.contains(&kind) { "pauses the job" } else { "warns only" };
        text.push_str(&format!(
            "step {}  {kind}  {} = {:.4} (threshold {:.4}; {pauses})\n  {}\n",
            w["step"],
            field(w, "metric"),
            w["value"].as_f64().unwrap_or(f64::NAN),
            w["threshold"].as_f64().unwrap_or(f64::NAN),
            field(w, "message"),
        ));
    }
    text
}

fn show(job: &Value, json: bool, id_only: bool) {
    if json {
        print_json(job);
    } else if id_only {
        println!("{}", field(job, "id"));
    } else {
        println!("id:              {}", field(job, "id"));
        println!("status:          {}", field(job, "status"));
        println!("model:           {}", field(job, "model"));
        println!("training file:   {}", field(job, "training_file"));
        println!("validation file: {}", field(job, "validation_file"));
        println!("progress:        {}", progress_text(job));
        if let Some(control) = job["pending_control"].as_str() {
            println!("requested:       {control} (the worker acts on it within a heartbeat)");
        }
        if let Some(model) = job["fine_tuned_model"].as_str() {
            println!("fine-tuned:      {model}");
        }
        if let Some(message) = job.pointer("/error/message").and_then(Value::as_str) {
            println!("error:           {message}");
        }
    }
}

/// `step 3/12`, or `-`.
fn progress_text(job: &Value) -> String {
    match (
        job.pointer("/progress/step").and_then(Value::as_i64),
        job.pointer("/progress/total_steps").and_then(Value::as_i64),
    ) {
        (Some(step), Some(total)) => format!("step {step}/{total}"),
        _ => "-".to_string(),
    }
}

/// Number of an event id (`ftevent-42` → 42).
pub fn event_number(event: &Value) -> i64 {
    field(event, "id").rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Events newer than `after`, oldest first.
pub async fn new_events(client: &Client, id: &str, after: i64) -> anyhow::Result<Vec<Value>> {
    let page = client.get_json(&format!("/v1/fine_tuning/jobs/{id}/events?limit=100")).await?;
    let mut events: Vec<Value> = page["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| event_number(e) > after)
        .collect();
    events.sort_by_key(event_number);
    Ok(events)
}

/// Follows job `id`, calling `line` with each new event, until it ends; returns its final status.
pub async fn watch(
    client: &Client,
    id: &str,
    mut line: impl FnMut(&str),
) -> anyhow::Result<String> {
    let mut last = 0;
    loop {
        let job = client.get_json(&format!("/v1/fine_tuning/jobs/{id}")).await?;
        for event in new_events(client, id, last).await? {
            last = event_number(&event);
            let time =
                chrono::DateTime::from_timestamp(event["created_at"].as_i64().unwrap_or(0), 0)
                    .map(|t| t.format("%H:%M:%S").to_string())
                    .unwrap_or_default();
            line(&format!("{time} {:<5} {}", field(&event, "level"), field(&event, "message")));
        }
        let status = field(&job, "status").to_string();
        if is_final(&status) {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{apply_environment, apply_method, warnings_text, EnvironmentArgs};
    use serde_json::json;

    #[test]
    fn warnings_print_the_metric_against_its_threshold_and_whether_they_pause() {
        let list = json!({"object": "list", "auto_pause_on": ["length_drift"], "data": [
            {"kind": "length_drift", "metric": "completion_length_mean", "value": 2.5,
             "threshold": 2.0, "step": 7, "message": "completions grew 2.5x"},
            {"kind": "entropy_collapse", "metric": "entropy", "value": 0.01,
             "threshold": 0.05, "step": 8, "message": "entropy fell"}]});
        assert_eq!(
            warnings_text(&list),
            "step 7  length_drift  completion_length_mean = 2.5000 (threshold 2.0000; pauses the job)\n  completions grew 2.5x\n\
             step 8  entropy_collapse  entropy = 0.0100 (threshold 0.0500; warns only)\n  entropy fell\n"
        );
        assert_eq!(warnings_text(&json!({"data": []})), "no warnings\n");
    }

    #[test]
    fn method_flags_set_the_type_and_merge_hyperparameters() {
        let mut body = json!({"model": "m"}).as_object().cloned().unwrap_or_default();
        apply_method(&mut body, Some("dpo"), Some(r#"{"beta": 0.2}"#)).unwrap();
        assert_eq!(
            body["method"],
            json!({"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}})
        );
        let mut rl = json!({"method": {"type": "reinforcement", "reinforcement": {"grader": {}}}})
            .as_object()
            .cloned()
            .unwrap_or_default();
        apply_method(&mut rl, None, Some(r#"{"n_epochs": 2}"#)).unwrap();
        assert_eq!(rl["method"]["reinforcement"]["hyperparameters"], json!({"n_epochs": 2}));
        apply_method(&mut rl, Some("supervised"), None).unwrap();
        assert_eq!(rl["method"], json!({"type": "supervised"}), "the other method's settings go");
        assert!(apply_method(&mut rl, None, Some("[1]")).is_err());
    }

    #[test]
    fn environment_flags_build_the_block_and_need_a_reinforcement_job() {
        let args = EnvironmentArgs {
            environment: Some(
                r#"{"max_turns": 2, "episode_limits": {"max_tool_calls": 3}}"#.into(),
            ),
            tools: vec!["calculator".into(), "python".into()],
            max_turns: Some(5),
            parallel_tool_calls: true,
        };
        let block = args.body().unwrap().unwrap();
        assert_eq!(
            block,
            json!({"max_turns": 5, "episode_limits": {"max_tool_calls": 3},
                   "tools": [{"type": "calculator"}, {"type": "python"}],
                   "parallel_tool_calls": true})
        );
        let mut body =
            json!({"method": {"type": "reinforcement", "reinforcement": {"grader": {}}}})
                .as_object()
                .cloned()
                .unwrap_or_default();
        apply_environment(&mut body, block.clone()).unwrap();
        assert_eq!(body["method"]["reinforcement"]["environment"], block);
        assert_eq!(body["method"]["reinforcement"]["grader"], json!({}), "the grader stays");
        let mut sft =
            json!({"method": {"type": "supervised"}}).as_object().cloned().unwrap_or_default();
        assert!(apply_environment(&mut sft, block).is_err());
        let none = EnvironmentArgs {
            environment: None,
            tools: vec![],
            max_turns: None,
            parallel_tool_calls: false,
        };
        assert_eq!(none.body().unwrap(), None);
    }
}
