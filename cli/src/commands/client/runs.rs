//! `verity evaluations …` and `verity rejection-sampling …`: the sampling runs of
//! `/v1/verity/` (create from a JSON body, list, show, watch, cancel; an evaluation's results
//! as JSON or CSV).

use super::{field, print_json, read_json, Client, ClientArgs};
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Which kind of sampling run a command is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// `/v1/verity/evaluations`.
    Evaluation,
    /// `/v1/verity/rejection_sampling`.
    RejectionSampling,
}

impl RunKind {
    /// The collection's path.
    fn path(self) -> &'static str {
        match self {
            RunKind::Evaluation => "/v1/verity/evaluations",
            RunKind::RejectionSampling => "/v1/verity/rejection_sampling",
        }
    }
}

/// `verity evaluations …` / `verity rejection-sampling …`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Server and key.
    #[command(flatten)]
    pub client: ClientArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: RunsCommand,
}

/// Sampling-run commands.
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Create a run from a JSON body (the API's request, see docs/evaluation.md); prints its id.
    Create {
        /// The request body (JSON).
        #[arg(long = "body")]
        body: PathBuf,
        /// Follow the run until it ends, then show it.
        #[arg(long)]
        watch: bool,
    },
    /// List runs, newest first.
    List,
    /// Show one run.
    Show {
        /// The run's id.
        id: String,
    },
    /// Wait until the run ends, then show it; fails unless it succeeded.
    Watch {
        /// The run's id.
        id: String,
    },
    /// Cancel a run.
    Cancel {
        /// The run's id.
        id: String,
    },
    /// An evaluation's results: mean reward and pass@k per model (JSON, or CSV with `--csv`).
    Results {
        /// The evaluation's id.
        id: String,
        /// Print the CSV instead.
        #[arg(long)]
        csv: bool,
    },
}

/// Runs a sampling-run command of `kind`.
pub async fn run(kind: RunKind, args: &RunsArgs) -> anyhow::Result<()> {
    let client = Client::from_args(&args.client)?;
    let json = args.client.json;
    let base = kind.path();
    match &args.command {
        RunsCommand::Create { body, watch: follow } => {
            let request = read_json(body)?;
            let created = client.post_json(base, &request).await?;
            if *follow {
                let id = created["id"].as_str().context("the server returned no run id")?;
                return watch(&client, base, id, json).await;
            }
            if json {
                print_json(&created);
            } else {
                println!("{}", field(&created, "id"));
            }
        }
        RunsCommand::List => {
            let page = client.get_json(&format!("{base}?limit=100")).await?;
            if json {
                print_json(&page);
            } else {
                for run in page["data"].as_array().into_iter().flatten() {
                    println!("{}\t{}\t{}", field(run, "id"), field(run, "status"), models(run));
                }
            }
        }
        RunsCommand::Show { id } => show(&client.get_json(&format!("{base}/{id}")).await?, json),
        RunsCommand::Watch { id } => return watch(&client, base, id, json).await,
        RunsCommand::Cancel { id } => {
            show(&client.post_json(&format!("{base}/{id}/cancel"), &Value::Null).await?, json)
        }
        RunsCommand::Results { id, csv } => {
            anyhow::ensure!(kind == RunKind::Evaluation, "only evaluations have results");
            if *csv {
                let path = format!("{base}/{id}/results?format=csv");
                let request = client.request(reqwest::Method::GET, &path);
                let response = client.send(request).await?;
                print!("{}", response.text().await.context("reading the CSV")?);
            } else {
                print_json(&client.get_json(&format!("{base}/{id}/results")).await?);
            }
        }
    }
    Ok(())
}

/// Polls the run every second until it ends; shows it, and fails unless it succeeded.
async fn watch(client: &Client, base: &str, id: &str, json: bool) -> anyhow::Result<()> {
    loop {
        let run = client.get_json(&format!("{base}/{id}")).await?;
        let status = run["status"].as_str().unwrap_or_default().to_string();
        if super::jobs::is_final(&status) {
            show(&run, json);
            anyhow::ensure!(status == "succeeded", "run {id} {status}: {}", run["error"]);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The model names of a run (an evaluation's list, or a rejection-sampling run's one).
fn models(run: &Value) -> String {
    let names: Vec<&str> = match run["models"].as_array() {
        Some(models) => models.iter().filter_map(|m| m["name"].as_str()).collect(),
        None => run["model"]["name"].as_str().into_iter().collect(),
    };
    names.join(",")
}

/// Prints a run: its JSON, or its id, status, models and outcome.
fn show(run: &Value, json: bool) {
    if json {
        print_json(run);
        return;
    }
    println!("{}\t{}\t{}", field(run, "id"), field(run, "status"), models(run));
    for model in run["results"]["models"].as_array().into_iter().flatten() {
        println!(
            "  {}\tmean reward {}\t{}",
            field(model, "model"),
            model["mean_reward"],
            model["pass_at_k"]
        );
    }
    if let Some(file) = run["output_file"].as_str() {
        println!("  kept samples: {file}\t{}", run["summary"]);
    }
}
