//! `verity recipes …`: multi-stage recipes of `/v1/verity/recipes` (create from a JSON body,
//! list, show, watch, cancel, resume).

use super::{field, print_json, read_json, Client, ClientArgs};
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// The collection's path.
const PATH: &str = "/v1/verity/recipes";

/// `verity recipes …`.
#[derive(Debug, Args)]
pub struct RecipesArgs {
    /// Server and key.
    #[command(flatten)]
    pub client: ClientArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: RecipesCommand,
}

/// Recipe commands.
#[derive(Debug, Subcommand)]
pub enum RecipesCommand {
    /// Create a recipe from a JSON body (`{"name", "seed", "stages": […]}`, see
    /// docs/recipes.md); prints its id.
    Create {
        /// The request body (JSON).
        #[arg(long = "body")]
        body: PathBuf,
        /// Follow the recipe until it ends, then show it.
        #[arg(long)]
        watch: bool,
    },
    /// List recipes, newest first.
    List,
    /// Show one recipe: each stage's status, id and key figures.
    Show {
        /// The recipe's id.
        id: String,
    },
    /// Follow a recipe, printing each stage as it changes, until it ends or a guard pauses it;
    /// fails unless it succeeded.
    Watch {
        /// The recipe's id.
        id: String,
    },
    /// Cancel a running recipe and its current stage.
    Cancel {
        /// The recipe's id.
        id: String,
    },
    /// Resume a failed or cancelled recipe from the stage that stopped it.
    Resume {
        /// The recipe's id.
        id: String,
    },
}

/// States in which a recipe waits for nobody but a user (resume, cancel) or has ended.
const TERMINAL: [&str; 4] = ["succeeded", "failed", "cancelled", "paused"];

/// Runs a recipe command.
pub async fn run(args: &RecipesArgs) -> anyhow::Result<()> {
    let client = Client::from_args(&args.client)?;
    let json = args.client.json;
    match &args.command {
        RecipesCommand::Create { body, watch: follow } => {
            let request = read_json(body)?;
            let created = client.post_json(PATH, &request).await?;
            let id = created["id"].as_str().context("the server returned no recipe id")?;
            if *follow {
                return watch(&client, id, json).await;
            }
            if json {
                print_json(&created);
            } else {
                println!("{id}");
            }
        }
        RecipesCommand::List => {
            let page = client.get_json(&format!("{PATH}?limit=100")).await?;
            if json {
                print_json(&page);
            } else {
                for recipe in page["data"].as_array().into_iter().flatten() {
                    println!(
                        "{}\t{}\t{}\t{}",
                        field(recipe, "id"),
                        field(recipe, "status"),
                        field(recipe, "name"),
                        line(recipe)
                    );
                }
            }
        }
        RecipesCommand::Show { id } => show(&client.get_json(&format!("{PATH}/{id}")).await?, json),
        RecipesCommand::Watch { id } => return watch(&client, id, json).await,
        RecipesCommand::Cancel { id } => {
            show(&client.post_json(&format!("{PATH}/{id}/cancel"), &Value::Null).await?, json)
        }
        RecipesCommand::Resume { id } => {
            show(&client.post_json(&format!("{PATH}/{id}/resume"), &Value::Null).await?, json)
        }
    }
    Ok(())
}

/// The stages as one line: `sft ✓ → rl … → rs ·`.
pub fn line(recipe: &Value) -> String {
    let stages = recipe["stages"].as_array().into_iter().flatten();
    let marks: Vec<String> = stages
        .map(|s| {
            let mark = match s["status"].as_str().unwrap_or_default() {
                "succeeded" => "ok",
                "failed" => "FAILED",
                "cancelled" => "cancelled",
                "pending" => "-",
                _ => "...",
            };
            format!("{} {mark}", field(s, "name"))
        })
        .collect();
    marks.join(" -> ")
}

/// Prints a recipe: its JSON, or its status and one line per stage.
fn show(recipe: &Value, json: bool) {
    if json {
        print_json(recipe);
        return;
    }
    println!("{}\t{}\t{}", field(recipe, "id"), field(recipe, "status"), field(recipe, "name"));
    for stage in recipe["stages"].as_array().into_iter().flatten() {
        let outputs = &stage["outputs"];
        let outputs = if outputs.as_object().is_some_and(|o| !o.is_empty()) {
            outputs.to_string()
        } else {
            String::new()
        };
        println!(
            "  {}\t{}\t{}\t{}\t{}",
            field(stage, "name"),
            field(stage, "type"),
            field(stage, "status"),
            stage["id"].as_str().unwrap_or("-"),
            outputs
        );
        for model in stage["summary"]["models"].as_array().into_iter().flatten() {
            println!("    {}\tpass@k {}", field(model, "model"), model["pass_at_k"]);
        }
    }
    if let Some(error) = recipe["error"].as_object() {
        println!("  error: {}", error.get("message").and_then(Value::as_str).unwrap_or_default());
    }
}

/// Polls the recipe every two seconds, printing its stage line when it changes, until it ends;
/// shows it, and fails unless it succeeded.
async fn watch(client: &Client, id: &str, json: bool) -> anyhow::Result<()> {
    let mut last = String::new();
    loop {
        let recipe = client.get_json(&format!("{PATH}/{id}")).await?;
        let status = recipe["status"].as_str().unwrap_or_default().to_string();
        if TERMINAL.contains(&status.as_str()) {
            show(&recipe, json);
            anyhow::ensure!(status == "succeeded", "recipe {id} {status}: {}", recipe["error"]);
            return Ok(());
        }
        let now = line(&recipe);
        if now != last && !json {
            eprintln!("{id}: {now}");
            last = now;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
