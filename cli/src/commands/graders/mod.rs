//! `verity graders run|validate`: try a grader on local files before paying for a job;
//! `verity graders install-packages`: install the grader image's Python packages ahead of time;
//! `verity graders seccomp-profile`: the seccomp profile a worker's container runs under.

pub mod files;

use anyhow::Context;
use clap::{Args, Subcommand};
use files::{run_jsonl, validate};
use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use verity_verifiers::{Grader, Judge};
use verity_worker::judge::LocalJudge;

/// Grader commands.
#[derive(Debug, Subcommand)]
pub enum GradersCommand {
    /// Grade every line of a JSONL file (`{"item": {...}, "sample": {"output_text": "..."}}`);
    /// prints one JSON result per line, in input order, and a summary on stderr.
    Run(RunArgs),
    /// Check a grader (and optionally a dataset against it); errors carry JSON paths and lines.
    Validate(ValidateArgs),
    /// Install the Python packages of OpenAI's grader image (pinned in
    /// verifiers/grader-image/requirements.txt) for python graders, from PyPI with pip, into
    /// the cache (`VERITY_GRADER_PACKAGES`, else ~/.cache/verity/grader-packages); prints the
    /// layer's folder. Otherwise the first python grader importing one of them installs them.
    InstallPackages,
    /// Print the seccomp profile (the JSON Docker, Podman, containerd and CRI-O read) a worker's
    /// container needs for the sandbox instead of `Unconfined`: the sandbox's deny list minus
    /// what bubblewrap calls to build a sandbox. The same as deploy/seccomp/verity-sandbox.json
    /// of this version; see deploy/README.md, "Sandbox".
    SeccompProfile,
}

/// Options of `verity graders run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The grader spec (JSON file).
    #[arg(long)]
    pub grader: PathBuf,
    /// Input rows (JSONL); `-` reads standard input.
    #[arg(long)]
    pub input: PathBuf,
    /// Parallel gradings (0 = number of cores).
    #[arg(long, default_value_t = 0)]
    pub jobs: usize,
    /// The judge of model graders: `NAME=PATH` loads the HF folder or GGUF file at PATH for
    /// the judge model NAME (repeat for several); judge prompts run batched on the CPU.
    #[arg(long = "judge", value_name = "NAME=PATH")]
    pub judges: Vec<String>,
}

/// The local judge of `--judge NAME=PATH` options, for the model graders of `grader`.
fn local_judge(grader: &Grader, options: &[String]) -> anyhow::Result<Option<Arc<dyn Judge>>> {
    if !grader.uses_judge() {
        return Ok(None);
    }
    let mut models = BTreeMap::new();
    for option in options {
        let (name, path) = option
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--judge {option:?}: expected NAME=PATH"))?;
        let loaded = verity_worker::load_model(path.as_ref(), &candle_core_cpu()?)
            .with_context(|| format!("loading judge {name:?} from {path}"))?;
        models.insert(name.to_string(), Arc::new(Mutex::new(loaded)));
    }
    for (path, name) in grader.judge_models() {
        if !models.contains_key(&name) {
            anyhow::bail!("{path}: judge model {name:?} needs --judge {name}=PATH");
        }
    }
    Ok(Some(Arc::new(LocalJudge::new(models))))
}

fn candle_core_cpu() -> anyhow::Result<verity_worker::judge::Device> {
    Ok(verity_worker::parse_device("cpu")?)
}

/// Options of `verity graders validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The grader spec (JSON file).
    #[arg(long)]
    pub grader: PathBuf,
    /// A dataset (JSONL) whose rows the grader's templates must resolve against.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
}

fn read_grader(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading grader {}", path.display()))
}

/// `grader` with the embedding model its `cosine` graders need (`VERITY_EMBEDDING_MODEL`).
fn attach_embedding_model(grader: Grader, file: &Path) -> anyhow::Result<Grader> {
    verity_worker::embedding::configured()
        .attach(grader)
        .map_err(|(path, e)| anyhow::anyhow!("grader {} at {path}: {e}", file.display()))
}

/// Runs a grader subcommand; `validate` exits non-zero when the grader or dataset is invalid.
pub fn run(command: &GradersCommand) -> anyhow::Result<()> {
    match command {
        GradersCommand::Run(args) => {
            let spec = read_grader(&args.grader)?;
            let grader = Grader::from_json(&spec)
                .map_err(|e| anyhow::anyhow!("invalid grader {}: {e}", args.grader.display()))?;
            let grader = attach_embedding_model(grader, &args.grader)?;
            let grader = match local_judge(&grader, &args.judges)? {
                Some(judge) => grader.with_judge(judge),
                None => grader,
            };
            let stdout = std::io::stdout().lock();
            let summary = if args.input.as_os_str() == "-" {
                run_jsonl(&grader, std::io::stdin().lock(), stdout, args.jobs)
            } else {
                let file = std::fs::File::open(&args.input)
                    .with_context(|| format!("opening {}", args.input.display()))?;
                run_jsonl(&grader, BufReader::new(file), stdout, args.jobs)
            }
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.input.display()))?;
            eprintln!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        GradersCommand::InstallPackages => install_packages(),
        GradersCommand::SeccompProfile => {
            use verity_verifiers::sandbox::container_profile::profile_text;
            print!("{}", profile_text());
            Ok(())
        }
        GradersCommand::Validate(args) => {
            let spec = read_grader(&args.grader)?;
            let report = validate(&spec, args.dataset.as_deref());
            println!("{}", serde_json::to_string_pretty(&report)?);
            if !report.valid {
                anyhow::bail!("{} problem(s) found", report.errors.len());
            }
            if let Ok(grader) = Grader::from_json(&spec) {
                attach_embedding_model(grader, &args.grader)?;
            }
            Ok(())
        }
    }
}

/// Installs the grader image's packages for the sandbox's Python, unless they are there.
fn install_packages() -> anyhow::Result<()> {
    use verity_verifiers::sandbox::packages::PackageLayer;
    let sandbox = verity_verifiers::SandboxConfig::default();
    let layer = PackageLayer::for_sandbox(&sandbox)?;
    if layer.is_installed() {
        eprintln!("the grader image's packages are already installed");
    } else {
        eprintln!(
            "installing the grader image's packages with {} -m pip (about 860 MB, a few minutes)",
            layer.python.display()
        );
        let started = std::time::Instant::now();
        layer.install()?;
        eprintln!("installed in {:.0} s", started.elapsed().as_secs_f64());
    }
    println!("{}", layer.dir.display());
    Ok(())
}
