//! tinker-cookbook's RL recipe against Verity (docs/tinker.md, issue #48 item 4): the cookbook's
//! own command line, `python -m tinker_cookbook.recipes.math_rl.train` with `env=arithmetic`,
//! run unchanged but for its connection settings (`base_url`, the key in `TINKER_API_KEY`) and
//! the sizes a CPU affords, with the model named by its hub id (`HuggingFaceTB/SmolLM2-135M-Instruct`,
//! which Verity's model answers to, and whose tokenizer the cookbook and the SDK load from the hub
//! cache, offline, as after `verity models pull`) — against a real API server, a real inference worker
//! (the recipe's rollouts) and a real training worker (its `forward_backward` / `optim_step`),
//! all on SmolLM2-135M-Instruct. The reward the cookbook logs rises over the steps (through its
//! format term: see the test), the run's call log shows each call, and the weights it saves at
//! the end are a Verity model that `/v1/chat/completions` serves.
//!
//! Needs `VERITY_TEST_TINKER_COOKBOOK_PYTHON` (a Python with tinker-cookbook 0.6.1 and torch,
//! which `scripts/test-services.sh` installs; CI sets `VERITY_REQUIRE_TINKER_COOKBOOK=1` so that
//! its absence fails rather than skips) and the SmolLM2 folder (`scripts/fetch-test-model.sh`).

use verity_tests::api_support;
use verity_tests::inference_support;

use serde_json::{json, Value};
use sqlx::PgPool;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verity_core::queue::{DeviceKind, Queue, QueueSettings, WorkerInfo};
use verity_core::spec::RolloutDtype;
use verity_core::storage::{LocalStore, ObjectStore};

/// Steps the recipe runs: enough for its reward to rise, few enough for a 2-core CPU.
const STEPS: usize = 12;

/// The recipe's command line: the cookbook's defaults but for the connection, the model, the
/// documented loss (`stable_reinforce`, the CLI's default, is not served: docs/tinker.md) and the
/// sizes (4 problems × 8 samples a step, answers of at most 8 tokens, a save every 6 steps).
fn recipe_args(model: &str, base_url: &str, log_path: &Path) -> Vec<String> {
    [
        "-m",
        "tinker_cookbook.recipes.math_rl.train",
        &format!("model_name={model}"),
        "renderer_name=qwen3_instruct",
        "env=arithmetic",
        "groups_per_batch=4",
        "group_size=8",
        "max_tokens=8",
        "learning_rate=3e-4",
        "lora_rank=8",
        &format!("max_steps={STEPS}"),
        "save_every=6",
        "loss_fn=importance_sampling",
        &format!("log_path={}", log_path.display()),
        &format!("base_url={base_url}"),
        "behavior_if_log_dir_exists=delete",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The hub id the recipe names the model by.
const HUB_ID: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// Lays out the model's tokenizer and config as the hub cache holds a downloaded revision
/// (`models--OWNER--NAME/refs/main` naming a commit, the files under `snapshots/COMMIT/`), which
/// transformers reads offline.
fn hub_cache(hub: &Path, model_dir: &Path) {
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = hub.join(format!("models--{}", HUB_ID.replace('/', "--")));
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]
    {
        if model_dir.join(file).exists() {
            std::fs::copy(model_dir.join(file), snapshot.join(file)).unwrap();
        }
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn tinker_cookbooks_arithmetic_rl_recipe_learns_on_verity(pool: PgPool) {
    const TEST: &str = "tinker_cookbooks_arithmetic_rl_recipe_learns_on_verity";
    let Ok(python) = std::env::var("VERITY_TEST_TINKER_COOKBOOK_PYTHON") else {
        // CI installs the cookbook (scripts/test-services.sh): there, its absence is a failure.
        assert!(
            std::env::var("VERITY_REQUIRE_TINKER_COOKBOOK").as_deref() != Ok("1"),
            "VERITY_TEST_TINKER_COOKBOOK_PYTHON is not set but VERITY_REQUIRE_TINKER_COOKBOOK=1"
        );
        eprintln!(
            "SKIPPED: {TEST}: VERITY_TEST_TINKER_COOKBOOK_PYTHON is not set (source scripts/test-services.sh)"
        );
        return;
    };
    let Some(model_dir) = verity_worker::testing::smollm2_dir(TEST) else { return };
    let model_dir = model_dir.as_path();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path().join("objects"), None).await.unwrap());
    // Registered as `verity models pull HuggingFaceTB/SmolLM2-135M-Instruct` would: under its
    // own name, with the hub id beside it, the tokenizer in the hub cache's layout.
    verity_core::testing::publish_base_model(&pool, store.as_ref(), model_dir, "smollm2").await;
    verity_core::models::set_hub_id(&pool, "smollm2", HUB_ID).await.unwrap();
    let hf_home = dir.path().join("hf");
    hub_cache(&hf_home.join("hub"), model_dir);
    let model = HUB_ID.to_string();

    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(verity_server::app::serve(listener, verity_server::app::app(state)));
    let (_engine, shutdown) = inference_support::start_worker(
        &pool,
        store.clone(),
        &dir.path().join("inference-cache"),
        (32, RolloutDtype::F32),
    )
    .await;
    let handler = verity_worker::job::TrainingHandler::new(
        store.clone(),
        verity_worker::job::TrainingHandlerConfig {
            cache_dir: dir.path().join("training-cache"),
            device: candle_core::Device::Cpu,
            grader_workers: 1,
        },
    );
    let worker = tokio::spawn(verity_core::queue::run_worker(
        Queue::new(pool.clone(), QueueSettings::default()),
        WorkerInfo::new(DeviceKind::Cpu, 4096),
        Arc::new(handler),
        verity_core::queue::RunnerOptions::default(),
        shutdown.clone(),
    ));
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;

    let log_path = dir.path().join("run");
    let started = Instant::now();
    let output = tokio::process::Command::new(&python)
        .args(recipe_args(&model, &base_url, &log_path))
        .current_dir(dir.path())
        .env("TINKER_API_KEY", format!("tml-{key}"))
        .env("TINKER_TELEMETRY", "0")
        .env("HF_HOME", &hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .env("TINKER_COOKBOOK_RUNS_DIR", dir.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the recipe failed ({:?}):\nstdout:\n{}\nstderr:\n{stderr}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    eprintln!("the recipe ran {STEPS} steps in {:.0} s", started.elapsed().as_secs_f64());

    // What the cookbook logged, step by step. The recipe's reward is 0.1 × (format − 1) +
    // correct. SmolLM2-135M rarely adds two-digit numbers right with no room to reason
    // (`correct` stays near 0.01 throughout, about one right answer in a hundred, and every
    // group that has none teaches nothing about it); what it learns in a few steps is the
    // format the reward asks for — the answer, then the end-of-turn token, within 8 tokens
    // (`format` 0.6–0.8 at the first steps, 1.0 after a few) — so the reward's format term is
    // what is asserted to rise: the total reward's step-to-step noise from a chance right answer
    // (±0.03) is larger than the format term's whole range (0.1 × 0.3).
    let rows = std::fs::read_to_string(log_path.join("metrics.jsonl")).unwrap();
    let steps: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|row| row.get("env/all/reward/total").is_some())
        .collect();
    let series =
        |key: &str| -> Vec<f64> { steps.iter().map(|r| r[key].as_f64().unwrap()).collect() };
    let (reward, format, correct) =
        (series("env/all/reward/total"), series("env/all/format"), series("env/all/correct"));
    eprintln!("reward by step: {reward:?}\nformat: {format:?}\ncorrect: {correct:?}");
    assert_eq!(reward.len(), STEPS, "one row per step: {rows}");
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let early_late = |xs: &[f64]| (mean(&xs[..3]), mean(&xs[STEPS - 3..]));
    let (first, last) = early_late(&format);
    assert!(
        last >= first + 0.1,
        "the reward's format term did not rise: format {first:.3} at the first 3 steps, \
         {last:.3} at the last 3 (reward {reward:?})"
    );
    // One model underneath: the sampler's log-probabilities of its tokens are the trainer's
    // (the cookbook's own estimate of KL(sampler ‖ trainer) on every step's batch).
    for kl in series("optim/kl_sample_train_v1") {
        assert!(kl.abs() < 1e-3, "sampler and trainer disagree: {kl}");
    }
    // Its periodic saves (state and sampler weights, asking for a week) and the final ones.
    let saved = std::fs::read_to_string(log_path.join("checkpoints.jsonl")).unwrap();
    let names: Vec<String> = saved
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["000006", "000012", "final"], "{saved}");
    let expiring: Vec<String> = sqlx::query_scalar(
        "SELECT path FROM tinker_checkpoints WHERE expires_at > now() + interval '6 days' ORDER BY path",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(expiring.len(), 4, "{expiring:?}");

    // The weights the recipe saved at its end are a Verity model, served like any other.
    let final_model: String = sqlx::query_scalar(
        "SELECT model FROM tinker_checkpoints WHERE kind = 'sampler' AND path LIKE '%/final'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let reply = reqwest::Client::new()
        .post(format!("{base_url}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": final_model, "max_tokens": 8,
                      "messages": [{"role": "user", "content": "What is 12 + 30?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    // The run's call log: each step's forward_backward with the worker's own time on it, which
    // is part of the call's time from arrival to end; another org's key sees no such run.
    let run_id: String = sqlx::query_scalar("SELECT id FROM jobs WHERE kind = 'tinker'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let calls_of = |key: String, query: &'static str| {
        let url = format!("{base_url}/api/v1/training_runs/{run_id}/calls{query}");
        async move {
            let reply = reqwest::Client::new().get(url).header("X-API-Key", key).send().await;
            let reply = reply.unwrap();
            (reply.status().as_u16(), reply.json::<Value>().await.unwrap())
        }
    };
    let (status, log) = calls_of(format!("tml-{key}"), "?limit=1000").await;
    assert_eq!(status, 200, "{log}");
    let steps: Vec<&Value> = log["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "forward_backward")
        .collect();
    assert_eq!(steps.len(), STEPS, "{log}");
    for call in steps {
        let (ran, took) = (call["ran_ms"].as_i64().unwrap(), call["took_ms"].as_i64().unwrap());
        assert!(ran > 0 && ran <= took + 1 && call["tokens"].as_i64().unwrap() > 0, "{call}");
    }
    let (status, reply) = calls_of(format!("tml-{key}"), "?limit=0").await;
    assert!(status == 400 && reply.to_string().contains("limit"), "{status} {reply}");
    let other = api_support::user(&pool, "b@y.io", "org-b", "member").await;
    assert_eq!(calls_of(format!("tml-{other}"), "").await.0, 404);
    // The recipe closed its session, which ends its training client.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let states: Vec<String> =
            sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'tinker'")
                .fetch_all(&pool)
                .await
                .unwrap();
        if !states.is_empty() && states.iter().all(|s| s == "succeeded") {
            break;
        }
        assert!(Instant::now() < deadline, "the client did not end: {states:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Custom losses, the SDK's way: a Python loss over the log-probabilities (a callable, and
    // one made by `create_custom_loss`) runs on the client — Verity's client configuration
    // does not ask for uploads — as a `forward` and a weighted `cross_entropy` backward, both
    // served by the same worker.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), CUSTOM_LOSS_SCRIPT).unwrap();
    let output = tokio::process::Command::new(&python)
        .arg(file.path())
        .env("VERITY_BASE", &base_url)
        .env("KEY", &key)
        .env("MODEL", &model)
        .env("TINKER_TELEMETRY", "0")
        .env("HF_HOME", &hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("SDK OK"),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    shutdown.cancel();
    let _ = worker.await;
}

/// `forward_backward_custom` with a plain callable and with a `create_custom_loss` handle, each
/// equal to cross-entropy: the loss the SDK computes is the server's `cross_entropy`, and the
/// step it takes lowers it.
const CUSTOM_LOSS_SCRIPT: &str = r#"
import os, tinker, torch
from tinker import types
sc = tinker.ServiceClient(base_url=os.environ["VERITY_BASE"], api_key="tml-" + os.environ["KEY"])
tc = sc.create_lora_training_client(base_model=os.environ["MODEL"], rank=4).result()
tokens = [1, 504, 3117, 314, 260, 1345, 28, 17, 2]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
def cross_entropy_now():
    return tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
def neg_ll(data, logprobs_list):
    loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs_list))
    return loss, {"custom/neg_ll:sum": loss.item()}
def neg_ll_traced(logprobs, weights):
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll_traced:sum": loss}
handle = sc.create_custom_loss(neg_ll_traced, input_ranks={"logprobs": 1, "weights": 1}).result()
for loss_fn in (neg_ll, handle):
    before = cross_entropy_now()
    out = tc.forward_backward_custom([datum], loss_fn).result()
    custom = [v for k, v in out.metrics.items() if k.startswith("custom/")]
    assert len(custom) == 1 and abs(custom[0] - before) < 1e-3 * max(1.0, before), (out.metrics, before)
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert cross_entropy_now() < before, (cross_entropy_now(), before)
sc.close("success").result()
print("SDK OK")
"#;
