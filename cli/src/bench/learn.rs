//! `verity bench learn`: one learning-quality run (JSON lines on stdout), or with `--seeds`,
//! `--seed-list` or `--set` a sweep over seeds and a grid of hyperparameters, recorded in
//! `--out` and resumed from there ([`verity_worker::bench::sweep`]).

use anyhow::Context;
use clap::Args;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use verity_core::environment::{Environment, HttpAllowList};
use verity_core::spec::Hyperparameters;
use verity_worker::bench::learning::{learning_run, LearningRun};
use verity_worker::bench::sweep::grid::Axis;
use verity_worker::bench::sweep::{Sweep, SweepInputs};

/// The task `verity bench learn` runs when `--task` is not given.
const DEFAULT_TASK: &str = "examples/arithmetic";

/// Options of `verity bench learn`.
#[derive(Debug, Args)]
pub struct LearnArgs {
    /// HF folder or GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// A task folder: its `train.jsonl`, `validation.jsonl`, `grader.json`, `recipe.json` and,
    /// when present, `environment.json` are the run's inputs unless the options below name
    /// others (tasks in examples/: arithmetic, multistep, code-functions,
    /// multiplication-tools).
    #[arg(long, default_value = DEFAULT_TASK)]
    pub task: PathBuf,
    /// Training rows (JSONL); default: the task's `train.jsonl`.
    #[arg(long)]
    pub train: Option<PathBuf>,
    /// Held-out rows (JSONL); default: the task's `validation.jsonl`.
    #[arg(long)]
    pub validation: Option<PathBuf>,
    /// The grader spec (JSON); default: the task's `grader.json`.
    #[arg(long)]
    pub grader: Option<PathBuf>,
    /// The hyperparameters (JSON object, as in a job's `method.reinforcement.hyperparameters`);
    /// in a sweep, the recipe each setting's values override. Default: the task's `recipe.json`.
    #[arg(long)]
    pub hyperparameters: Option<PathBuf>,
    /// A tool environment (JSON, as a job's `method.reinforcement.environment`): rollouts are
    /// multi-turn episodes. Default: the task's `environment.json` when it has one.
    #[arg(long)]
    pub environment: Option<PathBuf>,
    /// Only evaluate the model on the held-out rows with the recipe's evaluation settings
    /// (`eval_samples`, `temperature`, `max_completion_tokens`, `seed`), without training: scores
    /// a peer's checkpoint exactly as Verity's own runs are scored.
    #[arg(long, conflicts_with_all = ["seeds", "seed_list", "axes", "report_only"])]
    pub eval_only: bool,
    /// Sweep: run every setting with seeds 1 to N.
    #[arg(long, value_name = "N", conflicts_with = "seed_list")]
    pub seeds: Option<u64>,
    /// Sweep: run every setting with these seeds (e.g. 11,23,37).
    #[arg(long, value_name = "S1,S2,…", value_delimiter = ',')]
    pub seed_list: Vec<u64>,
    /// Sweep: a grid axis, a hyperparameter and its values (e.g. `--set loss=grpo,dapo --set
    /// group_size=4,8`); the grid is every combination. Values are JSON where they parse.
    #[arg(long = "set", value_name = "KEY=V1,V2,…")]
    pub axes: Vec<String>,
    /// Sweep: the folder of its runs, table (table.md, table.json) and plots; a sweep started
    /// again over it keeps the finished runs.
    #[arg(long, default_value = "learn-sweep")]
    pub out: PathBuf,
    /// Sweep: only write the table and plots from the runs already in --out.
    #[arg(long)]
    pub report_only: bool,
}

impl LearnArgs {
    fn is_sweep(&self) -> bool {
        self.seeds.is_some()
            || !self.seed_list.is_empty()
            || !self.axes.is_empty()
            || self.report_only
    }

    /// The sweep's seeds: --seed-list, else 1..=--seeds, else the recipe's own seed (or 0).
    fn sweep_seeds(&self, recipe: &Map<String, Value>) -> Vec<u64> {
        if !self.seed_list.is_empty() {
            return self.seed_list.clone();
        }
        match self.seeds {
            Some(n) => (1..=n).collect(),
            None => vec![recipe.get("seed").and_then(Value::as_u64).unwrap_or(0)],
        }
    }
}

fn read_text(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The files a learning run reads, with their paths (for errors).
struct Inputs {
    train: String,
    validation: String,
    grader_path: PathBuf,
    grader_text: String,
    recipe_path: PathBuf,
    recipe: Map<String, Value>,
    environment: Option<(PathBuf, String)>,
}

impl Inputs {
    /// Reads the options' files, each from the task folder unless named.
    fn read(args: &LearnArgs) -> anyhow::Result<Inputs> {
        let path = |given: &Option<PathBuf>, file: &str| {
            given.clone().unwrap_or_else(|| args.task.join(file))
        };
        let recipe_path = path(&args.hyperparameters, "recipe.json");
        let recipe_text = read_text(&recipe_path)?;
        let recipe: Map<String, Value> = serde_json::from_str(&recipe_text)
            .with_context(|| format!("hyperparameters {}", recipe_path.display()))?;
        let environment = args
            .environment
            .clone()
            .or_else(|| Some(args.task.join("environment.json")).filter(|p| p.is_file()))
            .map(|p| read_text(&p).map(|text| (p, text)))
            .transpose()?;
        let grader_path = path(&args.grader, "grader.json");
        Ok(Inputs {
            train: read_text(&path(&args.train, "train.jsonl"))?,
            validation: read_text(&path(&args.validation, "validation.jsonl"))?,
            grader_text: read_text(&grader_path)?,
            grader_path,
            recipe_path,
            recipe,
            environment,
        })
    }

    fn grader(&self) -> anyhow::Result<verity_verifiers::Grader> {
        verity_verifiers::Grader::from_json(&self.grader_text)
            .map_err(|e| anyhow::anyhow!("grader {}: {e}", self.grader_path.display()))
    }

    /// The recipe as hyperparameters, checked as a job's are.
    fn hyperparameters(&self) -> anyhow::Result<Hyperparameters> {
        let hyperparameters: Hyperparameters =
            serde_json::from_value(Value::Object(self.recipe.clone()))
                .with_context(|| format!("hyperparameters {}", self.recipe_path.display()))?;
        hyperparameters
            .validate("hyperparameters")
            .map_err(|e| anyhow::anyhow!("{}: {}", e.param, e.message))?;
        Ok(hyperparameters)
    }

    /// The tool environment, if the run has one, checked as a job's is against the completion
    /// budget of `hyperparameters`.
    fn environment(
        &self,
        hyperparameters: &Hyperparameters,
    ) -> anyhow::Result<Option<Environment>> {
        let Some((path, text)) = &self.environment else { return Ok(None) };
        let environment: Environment = serde_json::from_str(text)
            .with_context(|| format!("environment {}", path.display()))?;
        environment
            .validate(
                "environment",
                hyperparameters.max_completion_tokens(),
                &HttpAllowList::from_env(),
            )
            .map_err(|e| anyhow::anyhow!("environment {}: {e}", path.display()))?;
        Ok(Some(environment))
    }
}

/// A learning-quality run (validation pass@1 before and after a fixed recipe, and the curve),
/// or a sweep of them.
pub async fn learn(args: &LearnArgs) -> anyhow::Result<()> {
    let inputs = Inputs::read(args)?;
    if args.is_sweep() {
        return sweep(args, inputs).await;
    }
    let grader = inputs.grader()?;
    let hyperparameters = inputs.hyperparameters()?;
    let environment = inputs.environment(&hyperparameters)?;
    let (model, evaluate_only) = (args.model.clone(), args.eval_only);
    let summary = tokio::task::spawn_blocking(move || {
        let run = LearningRun {
            model_dir: &model,
            train_jsonl: &inputs.train,
            validation_jsonl: &inputs.validation,
            grader,
            hyperparameters,
            environment,
            evaluate_only,
        };
        learning_run(run, |line| println!("{line}"))
    })
    .await??;
    println!("{summary}");
    Ok(())
}

/// Runs the grid's pending runs one after another (or only reports), then prints the table.
async fn sweep(args: &LearnArgs, inputs: Inputs) -> anyhow::Result<()> {
    let axes = args.axes.iter().map(|a| Axis::parse(a)).collect::<Result<Vec<_>, _>>()?;
    let seeds = args.sweep_seeds(&inputs.recipe);
    let sweep_inputs = SweepInputs::new(
        &args.model,
        &inputs.train,
        &inputs.validation,
        &inputs.grader_text,
        inputs.environment.as_ref().map(|(_, text)| text.as_str()),
        inputs.recipe.clone(),
    );
    // Every input is checked before the sweep's folder is created or touched.
    inputs.grader()?;
    inputs.environment(&inputs.hyperparameters()?)?;
    let sweep = Sweep::open(&args.out, sweep_inputs, &axes, seeds)?;
    let report_only = args.report_only;
    let model = args.model.clone();
    let rows = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        if report_only {
            return Ok(sweep.report()?);
        }
        let runner = |spec: &verity_worker::bench::sweep::RunSpec,
                      report: &mut dyn FnMut(&Value)|
         -> anyhow::Result<Value> {
            let run = LearningRun {
                model_dir: &model,
                train_jsonl: &inputs.train,
                validation_jsonl: &inputs.validation,
                grader: inputs.grader()?,
                hyperparameters: spec.hyperparameters.clone(),
                environment: inputs.environment(&spec.hyperparameters)?,
                evaluate_only: false,
            };
            Ok(learning_run(run, report)?)
        };
        Ok(sweep.run(runner, |line| eprintln!("bench learn: {line}"))?)
    })
    .await??;
    let (peers, own): (Vec<_>, Vec<_>) = rows
        .iter()
        .filter(|row| row.seeds_finished < row.seeds_planned)
        .partition(|row| row.setting.starts_with("peer="));
    print!("{}", read_text(&args.out.join("table.md"))?);
    if !own.is_empty() {
        eprintln!("bench learn: {} settings have unfinished runs; run the same command again to finish them", own.len());
    }
    if !peers.is_empty() {
        eprintln!(
            "bench learn: {} peer settings lack seeds of the grid; bench/peers/trl_learn.py --seed N --out {} runs them",
            peers.len(),
            args.out.display()
        );
    }
    eprintln!(
        "bench learn: table in {0}/table.md and {0}/table.json, plots in {0}/pass_at_1_vs_tokens.svg \
         and {0}/pass_at_1_vs_seconds.svg",
        args.out.display()
    );
    Ok(())
}
