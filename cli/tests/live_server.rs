//! Drives a real `verity serve` process over HTTP: the official `openai` Python SDK — its newest
//! 3.x release and the oldest release docs/api.md promises — against the fine-tuning and grader
//! endpoints (model graders judged by a registered tiny random model through a `verity inference`
//! worker), and
//! schemathesis against `/openapi.json` (zero 5xx, responses match the schema). The Python tools
//! come from `scripts/test-services.sh` (VERITY_TEST_PYTHON, VERITY_TEST_PYTHON_OLDEST,
//! VERITY_TEST_SCHEMATHESIS); without them the tests say so and skip.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use verity_core::storage::{LocalStore, ObjectStore};

const JWT_SECRET: &str = "live-test-secret-live-test-secret-0123";

/// A running server (and the inference worker beside it, when one was asked for), killed on
/// drop.
struct Server {
    child: Child,
    inference: Option<Child>,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        for child in std::iter::once(&mut self.child).chain(self.inference.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `verity serve` on a free port over the test database, with a base model `tiny`, a
/// loadable judge model `tiny-judge` (random weights) and a user; returns the server and an API
/// key.
async fn start(pool: &sqlx::PgPool) -> (Server, String) {
    start_with(pool, &[]).await
}

/// [`start`] with extra environment variables for the server.
async fn start_with(pool: &sqlx::PgPool, env: &[(&str, &str)]) -> (Server, String) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::open(dir.path(), None).await.unwrap());
    verity_core::db::migrate(pool).await.unwrap();
    verity_core::testing::tiny_base_model(pool, store.as_ref()).await;
    let judge_dir = dir.path().join("tiny-judge-folder");
    verity_worker::trainer::testing::write_tiny_model_dir(
        &judge_dir,
        verity_worker::Family::Llama,
        5,
    )
    .unwrap();
    verity_core::storage::publish_folder(store.as_ref(), &judge_dir, "models/tiny-judge")
        .await
        .unwrap();
    verity_core::models::insert_base_model(
        pool,
        None,
        "tiny-judge",
        "models/tiny-judge",
        "hf",
        &serde_json::json!({}),
    )
    .await
    .unwrap();
    verity_cli::commands::admin::create_user(pool, "sdk@x.io", "sdk-org", "member", None)
        .await
        .unwrap();
    let key = verity_cli::commands::admin::create_key(pool, "sdk@x.io", "sdk").await.unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_verity"))
        .arg("serve")
        .env("DATABASE_URL", verity_testkit::db::database_url_of(pool).await.unwrap())
        .env("VERITY_BIND", "127.0.0.1:0")
        .env("VERITY_STORAGE", dir.path())
        .env("VERITY_CACHE_DIR", dir.path().join("cache"))
        .env("VERITY_JWT_SECRET", JWT_SECRET)
        .env("VERITY_RATE_LIMIT_RPS", "0")
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning verity serve");
    let stdout = child.stdout.take().unwrap();
    let base = verity_testkit::serve::listening_address(stdout).await.unwrap();
    (Server { child, inference: None, base, _dir: dir }, key)
}

/// [`start_with`] and a `verity inference` worker over the same database and store, registered
/// before this returns: model graders' judges in `graders/run` are asked through it.
async fn start_with_inference(pool: &sqlx::PgPool, env: &[(&str, &str)]) -> (Server, String) {
    let (mut server, key) = start_with(pool, env).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_verity"))
        .arg("inference")
        .env("DATABASE_URL", verity_testkit::db::database_url_of(pool).await.unwrap())
        .env("VERITY_INFERENCE_BIND", format!("127.0.0.1:{port}"))
        .env("VERITY_STORAGE", server._dir.path())
        .env("VERITY_CACHE_DIR", server._dir.path().join("inference-cache"))
        .env("VERITY_INFERENCE_MEMORY_MIB", "2048")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning verity inference");
    server.inference = Some(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while verity_core::inference::live_inference_workers(pool, 10.0).await.unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "verity inference never registered");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    (server, key)
}

fn tool(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(path) => Some(path),
        Err(_) => {
            eprintln!("SKIPPED: {var} is not set (source scripts/test-services.sh)");
            None
        }
    }
}

/// The newest and the oldest supported SDK's interpreters, each that is set up.
fn sdk_pythons() -> Vec<String> {
    ["VERITY_TEST_PYTHON", "VERITY_TEST_PYTHON_OLDEST"].into_iter().filter_map(tool).collect()
}

/// The first part of the SDK run: files, job creation (the `"auto"` body, a full OpenAI body,
/// suffix and metadata), controls, events, errors; every bad body a 400 naming its JSON path
/// with nothing enqueued. Prints the id of the job the test then finishes as a worker would.
const SDK_SCRIPT: &str = r#"
import io, os, openai
from openai import OpenAI

client = OpenAI()
data = b'{"prompt": "2+2?", "reference_answer": "4"}\n{"messages": [{"role": "user", "content": "3+3?"}], "reference_answer": "6"}\n'
f = client.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
assert f.id.startswith("file-") and f.status == "processed" and f.bytes == len(data), f
bad = client.files.create(file=("bad.jsonl", io.BytesIO(b'{"prompt": 3}\n')), purpose="fine-tune")
assert bad.status == "error" and "prompt" in bad.status_details, bad

grader = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
          "reference": "{{item.reference_answer}}", "operation": "eq"}
def rft(hyperparameters):
    return {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hyperparameters}}
method = rft({"n_epochs": 1})
job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method=method, seed=3, suffix="sdk")
assert job.id.startswith("ftjob-") and job.status == "queued" and job.seed == 3, job
assert job.method.type == "reinforcement", job.method

listed = client.fine_tuning.jobs.list(limit=10)
assert [j.id for j in listed.data] == [job.id], listed
got = client.fine_tuning.jobs.retrieve(job.id)
assert got.id == job.id and got.model == "tiny" and got.training_file == f.id, got

assert client.fine_tuning.jobs.pause(job.id).status == "paused"
assert client.fine_tuning.jobs.resume(job.id).status == "queued"
assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"

events = client.fine_tuning.jobs.list_events(job.id, limit=2)
assert len(events.data) == 2 and events.has_more, events
every = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=2)]
assert every[0] == "paused -> queued" or "cancelled" in every[0], every
assert every[-1] == "job created in state queued", every

checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id)
assert checkpoints.data == [], checkpoints

# Every OpenAI RFT hyperparameter as "auto": resolved and echoed, Verity's own beside them.
auto = rft({"batch_size": "auto", "n_epochs": "auto", "learning_rate_multiplier": "auto",
            "eval_interval": "auto", "eval_samples": "auto", "compute_multiplier": "auto",
            "reasoning_effort": "default"})
metadata = {"team": "rl", "k" * 64: "v" * 512}
resolved = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method=auto, suffix="auto", metadata=metadata)
hp = resolved.method.reinforcement.hyperparameters
assert (hp.batch_size, hp.n_epochs, hp.learning_rate_multiplier, hp.eval_interval, hp.eval_samples,
        hp.compute_multiplier, hp.reasoning_effort) == (4, 1, 1.0, 0, 4, 1.0, "medium"), hp
top = resolved.hyperparameters
assert (top.batch_size, top.n_epochs, top.learning_rate_multiplier) == (4, 1, 1.0), top
verity = resolved.to_dict()["hyperparameters"]
assert verity["group_size"] == 8 and verity["max_completion_tokens"] == 256 and verity["loss"] == "grpo", verity
assert resolved.metadata == metadata and resolved.suffix == "auto", resolved
assert resolved.integrations is None and resolved.result_files == [] and resolved.trained_tokens is None, resolved
assert client.fine_tuning.jobs.retrieve(resolved.id).metadata == metadata

# A full OpenAI body, every hyperparameter given: accepted unchanged, echoed as given.
given = {"batch_size": 2, "n_epochs": 3, "learning_rate_multiplier": 0.5, "eval_interval": 2,
         "eval_samples": 3, "compute_multiplier": 1.5, "reasoning_effort": "low"}
full = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, validation_file=f.id,
                                      method=rft(given), suffix="full", seed=11, metadata={"a": "b"})
echoed = full.method.reinforcement.hyperparameters.to_dict()
assert {k: echoed[k] for k in given} == given, echoed
extra = full.to_dict()["hyperparameters"]
assert extra["group_size"] == 12 and extra["max_completion_tokens"] == 128, extra

# Bad input: a 400 naming the JSON path, and nothing enqueued.
before = [j.id for j in client.fine_tuning.jobs.list(limit=100).data]
hp_path = "method.reinforcement.hyperparameters"
cases = [
    (dict(metadata={f"k{i}": "v" for i in range(17)}), "metadata"),
    (dict(metadata={"k" * 65: "v"}), "metadata." + "k" * 65),
    (dict(metadata={"k": "v" * 513}), "metadata.k"),
    (dict(integrations=[{"type": "wandb", "wandb": {"project": "p"}}]), "integrations"),
    (dict(method=rft({"compute_multiplier": 0})), hp_path + ".compute_multiplier"),
    (dict(method=rft({"n_epochs": -1})), hp_path + ".n_epochs"),
    (dict(method=rft({"batch_size": "many"})), hp_path + ".batch_size"),
    (dict(method=rft({"learning_rate_multiplier": -1})), hp_path + ".learning_rate_multiplier"),
    (dict(method=rft({"eval_samples": 0})), hp_path + ".eval_samples"),
    (dict(method=rft({"reasoning_effort": "extreme"})), hp_path + ".reasoning_effort"),
    (dict(method={"type": "distillation"}), "method.type"),
    (dict(method={"type": "supervised", "supervised": {"grader": grader}}), "method.supervised.grader"),
    (dict(model="nope"), "model"),
]
for kwargs, param in cases:
    body = dict(model="tiny", training_file=f.id, method=method) | kwargs
    try:
        client.fine_tuning.jobs.create(**body)
        raise SystemExit(f"expected 400 for {param}")
    except openai.BadRequestError as e:
        assert e.param == param, (e.param, param, e)
assert [j.id for j in client.fine_tuning.jobs.list(limit=100).data] == before, "bad input enqueued nothing"

try:
    client.fine_tuning.jobs.retrieve("ftjob-doesnotexist")
    raise SystemExit("expected 404")
except openai.NotFoundError:
    pass
try:
    client.fine_tuning.jobs.cancel(job.id)
    raise SystemExit("expected 409")
except openai.ConflictError:
    pass
client.fine_tuning.jobs.cancel(resolved.id)
print("FINISH", full.id)
print("SDK OK")
"#;

/// The second part, after the test finished the job as its worker would: the succeeded job's
/// fields, its results file, checkpoint names, and a new job on its fine-tuned model.
const SDK_FINISHED_SCRIPT: &str = r#"
import os, openai
from openai import OpenAI

client = OpenAI()
job = client.fine_tuning.jobs.retrieve(os.environ["JOB"])
assert job.status == "succeeded", job
assert job.fine_tuned_model == f"ft:tiny:sdk-org:full:{job.id}", job.fine_tuned_model
assert job.trained_tokens == 84 and job.estimated_finish is None, job
assert job.metadata == {"a": "b"} and job.suffix == "full", job
assert len(job.result_files) == 1, job.result_files
results = client.files.retrieve(job.result_files[0])
assert results.purpose == "fine-tune-results" and results.filename == "step_metrics.csv", results
csv = client.files.content(job.result_files[0]).text.splitlines()
assert csv[0].startswith("step,train_loss,train_reward_mean,train_reward_std,train_accuracy,valid_reward_mean"), csv
assert len(csv) == 3 and csv[2].startswith("2,0.4,0.5,"), csv
[checkpoint] = client.fine_tuning.jobs.checkpoints.list(job.id).data
assert checkpoint.fine_tuned_model_checkpoint == job.fine_tuned_model + ":ckpt-step-2", checkpoint
assert checkpoint.step_number == 2 and checkpoint.fine_tuning_job_id == job.id, checkpoint
assert job.fine_tuned_model in [m.id for m in client.models.list().data]
model = client.models.retrieve(job.fine_tuned_model)
assert model.id == job.fine_tuned_model and model.object == "model", model
assert client.models.retrieve(checkpoint.fine_tuned_model_checkpoint).id == checkpoint.fine_tuned_model_checkpoint
try:
    client.models.retrieve("ft:tiny:someone-else:x:ftjob-nope")
    raise SystemExit("expected 404")
except openai.NotFoundError:
    pass

method = {"type": "reinforcement", "reinforcement": {"grader": job.method.reinforcement.grader.to_dict(),
          "hyperparameters": {"n_epochs": 1}}}
child = client.fine_tuning.jobs.create(model=job.fine_tuned_model, training_file=job.training_file,
                                       method=method, suffix="child")
assert child.status == "queued" and child.model == job.fine_tuned_model, child
try:  # deleting a model is an admin's act (OpenAI: the owner's); this key is a member's
    client.models.delete(job.fine_tuned_model)
    raise SystemExit("expected 403")
except openai.PermissionDeniedError:
    pass
print("SDK OK")
"#;

/// Runs `script` under `python` against `server`; its stdout, after checking it printed
/// `SDK OK`.
async fn run_sdk(python: &str, script: &str, server: &Server, key: &str, job: &str) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    run_python(python, file.path().to_str().unwrap(), &[], (server, key), job, &[]).await
}

/// Runs the script file `script` with `args` under `python` against `server` (the SDK pointed
/// at it, `JOB` set to `job`, and `env`); its stdout, after checking it printed `SDK OK`.
async fn run_python(
    python: &str,
    script: &str,
    args: &[&str],
    (server, key): (&Server, &str),
    job: &str,
    env: &[(&str, &str)],
) -> String {
    let output = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .env("OPENAI_API_KEY", key)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base))
        .env("OPENAI_MAX_RETRIES", "0")
        .env("JOB", job)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("SDK OK"),
        "{python}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// Finishes job `job_id` as a worker would: two metrics rows, a checkpoint at step 2, the
/// results file, and completion with the trained model.
async fn finish_as_worker(pool: &sqlx::PgPool, server: &Server, job_id: &str) {
    use verity_core::queue::{DeviceKind, Queue, QueueSettings, TrainedModel, WorkerInfo};
    let store = LocalStore::open(server._dir.path(), None).await.unwrap();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    queue.register_worker(&worker).await.unwrap();
    let lease = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(lease.job().id, job_id);
    let rows = [
        (
            1,
            serde_json::json!({"loss": 0.5, "reward_mean": 0.25, "reward_std": 0.1, "accuracy": 0.0, "trained_tokens": 40}),
        ),
        (
            2,
            serde_json::json!({"loss": 0.4, "reward_mean": 0.5, "reward_std": 0.2, "accuracy": 0.5, "trained_tokens": 44,
                               "eval": {"mean_reward": 0.75, "pass_at_k": {"pass@1": 0.5}}}),
        ),
    ];
    for (step, row) in &rows {
        lease.metric(*step, row).await.unwrap();
    }
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("config.json"), b"{}").unwrap();
    let prefix = format!("jobs/{job_id}/checkpoints/step-2");
    verity_core::storage::publish_folder(&store, folder.path(), &prefix).await.unwrap();
    lease.checkpoint(2, &prefix, 2, Some(&rows[1].1)).await.unwrap();
    let file = verity_worker::job::write_results_file(&store, &rows).await.unwrap();
    let result = serde_json::json!({"steps": 2, "trained_tokens": 84, "result_files": [file.id]});
    let trained =
        TrainedModel { storage_prefix: prefix, format: "hf".into(), results_file: Some(file) };
    let name = lease.complete(&result, Some(&trained)).await.unwrap();
    assert_eq!(name.unwrap(), format!("ft:tiny:sdk-org:full:{job_id}"));
}

/// The official SDK found in `var` drives the fine-tuning API from creation to a finished job
/// and a job on its fine-tuned model.
async fn sdk_drives_the_api(pool: sqlx::PgPool, var: &str) {
    let Some(python) = tool(var) else { return };
    let (server, key) = start(&pool).await;
    let stdout = run_sdk(&python, SDK_SCRIPT, &server, &key, "").await;
    let job = stdout
        .lines()
        .find_map(|line| line.strip_prefix("FINISH "))
        .unwrap_or_else(|| panic!("no FINISH line in {stdout}"))
        .to_string();
    finish_as_worker(&pool, &server, &job).await;
    run_sdk(&python, SDK_FINISHED_SCRIPT, &server, &key, &job).await;
    cli_continues_from(&server, &key, &job).await;
}

/// `verity jobs create --from-job JOB [--checkpoint STEP]` starts a job from the finished job's
/// `fine_tuned_model` or checkpoint.
async fn cli_continues_from(server: &Server, key: &str, job: &str) {
    let object: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/fine_tuning/jobs/{job}", server.base))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let body = tempfile::NamedTempFile::new().unwrap();
    let grader = &object["method"]["reinforcement"]["grader"];
    let method = serde_json::json!({"type": "reinforcement", "reinforcement": {"grader": grader}});
    std::fs::write(body.path(), serde_json::json!({"method": method}).to_string()).unwrap();
    let fine_tuned = object["fine_tuned_model"].as_str().unwrap().to_string();
    for (extra, model) in [
        (vec![], fine_tuned.clone()),
        (vec!["--checkpoint", "2"], format!("{fine_tuned}:ckpt-step-2")),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_verity"))
            .args(["jobs", "create", "--json", "--url", &server.base, "--api-key", key])
            .args(["--file", body.path().to_str().unwrap(), "--from-job", job])
            .args(["--training-file", object["training_file"].as_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let created: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            (&created["model"], &created["base_model"]),
            (&serde_json::json!(model), &serde_json::json!("tiny"))
        );
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_newest_drives_the_api(pool: sqlx::PgPool) {
    sdk_drives_the_api(pool, "VERITY_TEST_PYTHON").await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_oldest_drives_the_api(pool: sqlx::PgPool) {
    sdk_drives_the_api(pool, "VERITY_TEST_PYTHON_OLDEST").await;
}

/// Supervised and DPO jobs through the SDK: files in OpenAI's chat and preference formats, jobs
/// with OpenAI's hyperparameters echoed resolved, bad rows and settings refused with their line
/// and field (nothing enqueued). Prints the two job ids for the worker.
const TUNING_SCRIPT: &str = r#"
import io, json, openai
from openai import OpenAI

client = OpenAI()
def jsonl(rows):
    return io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())
chat = {"messages": [{"role": "system", "content": "t3"}, {"role": "user", "content": "t5 t6"},
                     {"role": "assistant", "content": "t9", "weight": 0}, {"role": "user", "content": "t4"},
                     {"role": "assistant", "content": "t7 t8", "weight": 1}]}
pair = {"input": {"messages": [{"role": "user", "content": "t5"}]},
        "preferred_output": [{"role": "assistant", "content": "t7"}],
        "non_preferred_output": [{"role": "assistant", "content": "t9 t10"}]}
chats = client.files.create(file=("sft.jsonl", jsonl([chat] * 4)), purpose="fine-tune")
pairs = client.files.create(file=("dpo.jsonl", jsonl([pair] * 4)), purpose="fine-tune")
assert chats.status == "processed" and pairs.status == "processed", (chats, pairs)

sft = client.fine_tuning.jobs.create(model="tiny-judge", training_file=chats.id, validation_file=chats.id,
    method={"type": "supervised", "supervised": {"hyperparameters": {
        "n_epochs": 2, "batch_size": 2, "learning_rate_multiplier": "auto", "eval_interval": 2,
        "checkpoint_interval": 2, "max_completion_tokens": 2}}})
assert sft.status == "queued" and sft.method.type == "supervised", sft
hp = sft.method.supervised.hyperparameters
assert (hp.n_epochs, hp.batch_size, hp.learning_rate_multiplier) == (2, 2, 1.0), hp
assert sft.to_dict()["method"]["supervised"]["hyperparameters"]["learning_rate"] == 2e-5, sft
dpo = client.fine_tuning.jobs.create(model="tiny-judge", training_file=pairs.id, validation_file=pairs.id,
    method={"type": "dpo", "dpo": {"hyperparameters": {"beta": "auto", "batch_size": 2, "eval_interval": 2,
                                                        "checkpoint_interval": 2, "max_completion_tokens": 2}}})
assert dpo.method.type == "dpo" and dpo.method.dpo.hyperparameters.beta == 0.1, dpo
assert (dpo.method.dpo.hyperparameters.n_epochs, dpo.hyperparameters.batch_size) == (1, 2), dpo

before = [j.id for j in client.fine_tuning.jobs.list(limit=100).data]
lone = {"messages": [{"role": "user", "content": "t5"}]}
half = {"input": pair["input"], "preferred_output": pair["preferred_output"]}
no_assistant = client.files.create(file=("u.jsonl", jsonl([chat, lone])), purpose="fine-tune")
half_pair = client.files.create(file=("h.jsonl", jsonl([pair, half])), purpose="fine-tune")
weighted = dict(chat, messages=chat["messages"][:4] + [{"role": "assistant", "content": "t7", "weight": 0.5}])
bad_weight = client.files.create(file=("w.jsonl", jsonl([chat, weighted])), purpose="fine-tune")
assert bad_weight.status == "error" and "line 2" in bad_weight.status_details, bad_weight
assert "messages[4].weight" in bad_weight.status_details, bad_weight
cases = [
    (dict(training_file=no_assistant.id, method={"type": "supervised"}), "training_file", "line 2: field `messages`"),
    (dict(training_file=half_pair.id, method={"type": "dpo"}), "training_file", "line 2: field `non_preferred_output`"),
    (dict(training_file=bad_weight.id, method={"type": "supervised"}), "training_file", "messages[4].weight"),
    (dict(training_file=pairs.id, method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0}}}),
     "method.dpo.hyperparameters.beta", "(0, 100]"),
    (dict(training_file=chats.id, method={"type": "supervised", "supervised": {"grader": {"type": "math"}}}),
     "method.supervised.grader", "no grader"),
]
for kwargs, param, text in cases:
    try:
        client.fine_tuning.jobs.create(model="tiny-judge", **kwargs)
        raise SystemExit(f"expected 400 for {param}")
    except openai.BadRequestError as e:
        assert e.param == param and text in e.message, (e.param, param, e.message)
assert [j.id for j in client.fine_tuning.jobs.list(limit=100).data] == before, "bad input enqueued nothing"
print("JOBS", sft.id, dpo.id)
print("SDK OK")
"#;

/// After the worker ran both jobs: their state, events, checkpoints, metrics and models.
const TUNING_FINISHED_SCRIPT: &str = r#"
import os, httpx
from openai import OpenAI

client = OpenAI()
for job_id, metric in zip(os.environ["JOB"].split(), ["token_accuracy", "preference_accuracy"]):
    job = client.fine_tuning.jobs.retrieve(job_id)
    assert job.status == "succeeded" and job.fine_tuned_model, job
    assert job.trained_tokens and job.trained_tokens > 0, job
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100)]
    assert any("validation loss" in m for m in messages), messages
    steps = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job_id).data]
    assert sorted(steps) == [2, 4] if metric == "token_accuracy" else sorted(steps) == [2], (metric, steps)
    reply = httpx.get(f"{os.environ['OPENAI_BASE_URL']}/fine_tuning/jobs/{job_id}/metrics",
                      headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    last = reply.json()["data"][-1]
    assert metric in last["eval"] and "loss" in last, last
print("SDK OK")
"#;

/// Runs every queued job of the test server's database to its end in-process, as a CPU worker
/// over the server's store.
async fn run_queued_jobs(pool: &sqlx::PgPool, server: &Server, jobs: usize) {
    use verity_core::queue::{
        run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo,
    };
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(server._dir.path(), None).await.unwrap());
    let handler = verity_worker::job::TrainingHandler::new(
        store,
        verity_worker::job::TrainingHandlerConfig {
            cache_dir: server._dir.path().join("worker-cache"),
            device: verity_worker::parse_device("cpu").unwrap(),
            grader_workers: 1,
        },
    );
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let options = RunnerOptions { max_jobs: Some(jobs), ..RunnerOptions::default() };
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    let token = tokio_util::sync::CancellationToken::new();
    let done = run_worker(queue, worker, Arc::new(handler), options, token).await;
    assert_eq!(done, jobs);
}

/// The official SDK found in `var` creates supervised and DPO jobs (bad ones refused); a worker
/// runs them through the real queue and store; the SDK reads their results.
async fn sdk_trains_supervised_and_dpo(pool: sqlx::PgPool, var: &str) {
    let Some(python) = tool(var) else { return };
    let (server, key) = start(&pool).await;
    let stdout = run_sdk(&python, TUNING_SCRIPT, &server, &key, "").await;
    let jobs = stdout
        .lines()
        .find_map(|line| line.strip_prefix("JOBS "))
        .unwrap_or_else(|| panic!("no JOBS line in {stdout}"))
        .to_string();
    run_queued_jobs(&pool, &server, 2).await;
    run_sdk(&python, TUNING_FINISHED_SCRIPT, &server, &key, &jobs).await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_newest_trains_supervised_and_dpo(pool: sqlx::PgPool) {
    sdk_trains_supervised_and_dpo(pool, "VERITY_TEST_PYTHON").await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_oldest_trains_supervised_and_dpo(pool: sqlx::PgPool) {
    sdk_trains_supervised_and_dpo(pool, "VERITY_TEST_PYTHON_OLDEST").await;
}

const SIMILARITY_SCRIPT: &str = r#"
import io, openai
from openai import OpenAI

client = OpenAI()
def grader(metric):
    return {"type": "text_similarity", "name": metric, "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}", "evaluation_metric": metric, "pass_threshold": 0.5}

item = {"reference_answer": "A cat is sitting on a rug."}
cosine = client.fine_tuning.alpha.graders.run(grader=grader("cosine"), model_sample="The cat sits on the mat.", item=item)
# all-MiniLM-L6-v2 (sentence-transformers): 0.768879 for this pair (worker/tests/embedding.rs)
assert abs(cosine.reward - 0.768879) < 1e-4, cosine
assert cosine.sub_rewards == {"similarity": cosine.reward, "passed": 1.0}, cosine
assert cosine.metadata.type == "text_similarity", cosine
meteor = client.fine_tuning.alpha.graders.run(grader=grader("meteor"), model_sample="the cat sat on the mat",
                                              item={"reference_answer": "the cat is sitting on the mat"})
# NLTK 3.10.4 meteor_score without WordNet on the same tokens
assert abs(meteor.reward - 0.7014492753623188) < 1e-12, meteor
valid = client.fine_tuning.alpha.graders.validate(grader=grader("cosine"))
assert valid.grader.evaluation_metric == "cosine", valid

data = b'{"prompt": "Describe a cat.", "reference_answer": "A cat is sitting on a rug."}\n'
f = client.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
method = {"type": "reinforcement", "reinforcement": {"grader": grader("cosine")}}
job = client.fine_tuning.jobs.create(model="tiny", training_file=f.id, method=method)
assert job.status == "queued" and job.method.reinforcement.grader.evaluation_metric == "cosine", job
print("SDK OK")
"#;

/// `text_similarity` with `cosine` (the all-MiniLM-L6-v2 fixture as the server's embedding
/// model) and `meteor` through the official SDK: graders.run, graders.validate, job creation.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_sdk_runs_cosine_and_meteor_graders(pool: sqlx::PgPool) {
    let Some(model) =
        verity_worker::testing::minilm_dir("openai_sdk_runs_cosine_and_meteor_graders")
    else {
        return;
    };
    let model = model.to_string_lossy().into_owned();
    let (server, key) = start_with(&pool, &[("VERITY_EMBEDDING_MODEL", &model)]).await;
    for python in sdk_pythons() {
        run_sdk(&python, SIMILARITY_SCRIPT, &server, &key, "").await;
    }
}

/// Model graders through `client.fine_tuning.alpha.graders` of the official SDK; the judge
/// `tiny-judge` (random weights: its replies are words like `t17`, whose number is the score)
/// is asked through the `verity inference` worker beside the server.
const SDK_GRADERS_SCRIPT: &str = r#"
import openai
from openai import OpenAI

client = OpenAI()
messages = [{"role": "system", "content": "t5 t6"},
            {"role": "user", "content": "{{item.question}} t9 {{sample.output_text}}"}]
score = {"type": "score_model", "name": "judge", "model": "tiny-judge", "input": messages,
         "range": [0, 100], "sampling_params": {"temperature": 0, "seed": 3, "max_completions_tokens": 4}}
def failed(r):
    """Whether any of OpenAI's error flags is set (typed access, as SDK users write it)."""
    e = r.metadata.errors
    return any([e.formula_parse_error, e.sample_parse_error, e.truncated_observation_error,
                e.unresponsive_reward_error, e.invalid_variable_error, e.other_error,
                e.python_grader_server_error, e.python_grader_runtime_error,
                e.model_grader_server_error, e.model_grader_refusal_error, e.model_grader_parse_error])

def verity(r):
    return r.metadata.model_dump()["verity"]

r = client.fine_tuning.alpha.graders.run(grader=score, model_sample="t44", item={"question": "t3 t8"})
assert r.metadata.name == "judge" and r.metadata.type == "score_model", r
assert r.metadata.sampled_model_name == "tiny-judge", r
# the judge's tokens: the rendered prompt and at most the 4 reply tokens asked for
usage = r.model_grader_token_usage_per_model["tiny-judge"]
assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 4, r
assert r.metadata.token_usage == usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"], r
if failed(r):
    assert r.metadata.errors.model_grader_parse_error and r.reward == 0, r
    assert verity(r)["error"]["kind"] == "judge_reply", r
else:
    assert 0 <= r.reward <= 1 and verity(r)["reason"].startswith("judge tiny-judge scored"), r
again = client.fine_tuning.alpha.graders.run(grader=score, model_sample="t44", item={"question": "t3 t8"})
assert again.reward == r.reward, (again, r)

labels = ["t%d" % i for i in range(3, 64)]
label = {"type": "label_model", "name": "verdict", "model": "tiny-judge", "input": messages,
         "labels": labels, "passing_labels": labels[:30]}
r = client.fine_tuning.alpha.graders.run(grader=label, model_sample="t44", item={"question": "t3 t8"})
assert r.reward in (0, 1), r
assert failed(r) or verity(r)["reason"].startswith("judge tiny-judge labelled"), r

multi = {"type": "multi", "graders": {"s": score, "exact": {"type": "string_check", "name": "exact",
         "input": "{{sample.output_text}}", "reference": "t44", "operation": "eq"}},
         "calculate_output": "exact"}
r = client.fine_tuning.alpha.graders.run(grader=multi, model_sample="t44", item={"question": "t3 t8"})
assert r.reward == 1 or failed(r), r
if not failed(r):
    assert r.metadata.scores["exact"] == 1, r

for g in (score, label):
    v = client.fine_tuning.alpha.graders.validate(grader=g)
    assert v.grader is not None, v
for bad, param in ((dict(score, model="nope"), "grader.model"),
                   (dict(score, range=[1, 0]), "grader.range"),
                   (dict(label, passing_labels=["nope"]), "grader.passing_labels.0")):
    try:
        client.fine_tuning.alpha.graders.run(grader=bad, model_sample="t4")
        raise SystemExit("expected 400 for %s" % param)
    except openai.BadRequestError as e:
        assert e.param == param, (e.param, param)
print("SDK OK")
"#;

/// OpenAI's documented examples (tests/openai_examples: graders guide, RFT, supervised and DPO
/// guides, API reference, cookbooks, each with its source URL) through the newest and the oldest
/// supported SDK: every body accepted and graded, or refused with a 400 naming its field where
/// the collection says so, each response compared field by field with the documented one; then
/// the jobs it queues (the RFT guide's flagship with structured outputs, the graders guide's
/// tool-call grader, the supervised and DPO guides' jobs, the API reference's RFT job) trained by
/// a real worker and their results read back.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_documentation_examples_are_accepted_and_graded(pool: sqlx::PgPool) {
    let pythons = sdk_pythons();
    if pythons.is_empty() {
        return;
    }
    // The flagship job's structured outputs need a tokenizer that can write JSON: SmolLM2.
    let Some(smollm2) = verity_worker::testing::smollm2_dir(
        "openai_documentation_examples_are_accepted_and_graded",
    ) else {
        return;
    };
    // `cosine` is graded with all-MiniLM-L6-v2 when it is fetched, and refused without it.
    let minilm = verity_worker::testing::minilm_dir("the examples' cosine grader");
    let embedding = minilm.as_ref().map_or("off".into(), |dir| dir.to_string_lossy().into_owned());
    // The W&B example exports to a loopback server speaking W&B's run protocol.
    let wandb = verity_testkit::wandb::WandbServer::start("examples-wandb-key").await.unwrap();
    let server_env = [
        ("VERITY_EMBEDDING_MODEL", embedding.as_str()),
        ("WANDB_API_KEY", "examples-wandb-key"),
        ("WANDB_BASE_URL", wandb.base_url.as_str()),
    ];
    let (server, key) = start_with_inference(&pool, &server_env).await;
    let env = [("VERITY_EXAMPLES_EMBEDDING", if minilm.is_some() { "1" } else { "0" })];
    let store = LocalStore::open(server._dir.path(), None).await.unwrap();
    verity_core::testing::publish_base_model(&pool, &store, &smollm2, "smollm2").await;
    let mut jobs = Vec::new();
    for python in &pythons {
        let stdout = run_examples(python, &[], (&server, &key), "", &env).await;
        let line = stdout.lines().find_map(|line| line.strip_prefix("JOBS "));
        let line = line.unwrap_or_else(|| panic!("no JOBS line in {stdout}"));
        jobs.extend(line.split(' ').map(str::to_string));
    }
    run_queued_jobs(&pool, &server, jobs.len()).await;
    for python in &pythons {
        run_examples(python, &["finished"], (&server, &key), &jobs.join(" "), &env).await;
    }
    // One W&B run per SDK's "W&B Integration" job, named and tagged as the example asks.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let runs = wandb.runs();
        let named = runs.iter().filter(|(_, run)| {
            run.project == "my-wandb-project"
                && run.display_name.as_deref() == Some("ft-run-display-name")
                && run.tags.starts_with(&["first-experiment".into(), "v2".into()])
        });
        if named.count() == pythons.len() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "W&B runs: {runs:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert_eq!(wandb.unauthorised(), 0);
}

/// Runs tests/openai_examples/run.py with `args` under `python` against `server`; its stdout,
/// after checking it printed `SDK OK`.
async fn run_examples(
    python: &str,
    args: &[&str],
    (server, key): (&Server, &str),
    job: &str,
    env: &[(&str, &str)],
) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/openai_examples/run.py");
    run_python(python, script, args, (server, key), job, env).await
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_runs_model_graders(pool: sqlx::PgPool) {
    let (server, key) = start_with_inference(&pool, &[]).await;
    for python in sdk_pythons() {
        run_sdk(&python, SDK_GRADERS_SCRIPT, &server, &key, "").await;
    }
}

/// Longest a schemathesis run may take (`VERITY_TEST_SCHEMATHESIS_LIMIT_SECS`, else 10 minutes):
/// far beyond its usual seconds, so that a run that stops making progress fails saying where it
/// stuck instead of holding the suite until CI's limit.
fn schemathesis_limit() -> std::time::Duration {
    let secs = std::env::var("VERITY_TEST_SCHEMATHESIS_LIMIT_SECS").ok();
    std::time::Duration::from_secs(secs.and_then(|s| s.parse().ok()).unwrap_or(10 * 60))
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn schemathesis_finds_no_server_errors(pool: sqlx::PgPool) {
    let Some(st) = tool("VERITY_TEST_SCHEMATHESIS") else { return };
    let (server, key) = start(&pool).await;
    // Its output goes to files, so that what a run printed survives it being stopped.
    let out = tempfile::tempdir().unwrap();
    let (stdout_path, stderr_path) = (out.path().join("stdout"), out.path().join("stderr"));
    let started = std::time::Instant::now();
    let mut child = tokio::process::Command::new(st)
        .args(["run", &format!("{}/openapi.json", server.base)])
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--experimental",
            "openapi-3.1",
        ])
        // One worker thread: Hypothesis before 6.136 does not promise thread safety, and two
        // schemathesis workers run its engine side by side (the one CI hang on record was this
        // run, the server logging nothing meanwhile).
        .args(["--hypothesis-max-examples", "8", "--hypothesis-derandomize", "--workers", "1"])
        .args(["--request-timeout", "10000"])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .env("SCHEMATHESIS_HOOKS", "")
        // SIGABRT makes Python print every thread's stack (see below).
        .env("PYTHONFAULTHANDLER", "1")
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let limit = schemathesis_limit();
    let status = tokio::time::timeout(limit, child.wait()).await;
    let printed = || {
        let read = |path| std::fs::read_to_string(path).unwrap_or_default();
        format!("{}\n{}", read(&stdout_path), read(&stderr_path))
    };
    let Ok(status) = status else {
        // Where it stuck: Python's stack of each thread, and whether the server still answers.
        if let Some(pid) = child.id() {
            let _ = Command::new("kill").args(["-ABRT", &pid.to_string()]).status();
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        let _ = child.kill().await;
        let health = health_check(&server.base);
        panic!(
            "schemathesis made no end in {limit:?} (the server {health}); it \
             printed:\n{}",
            printed()
        );
    };
    eprintln!("schemathesis took {:.0} s", started.elapsed().as_secs_f64());
    assert!(status.unwrap().success(), "schemathesis failed:\n{}", printed());
}

/// Whether the server at `base` answers `GET /healthz` within 5 s, in words.
fn health_check(base: &str) -> String {
    use std::io::{Read, Write};
    let address = base.trim_start_matches("http://");
    let asked = (|| -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(address)?;
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        stream.write_all(format!("GET /healthz HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        Ok(reply.lines().next().unwrap_or_default().to_string())
    })();
    match asked {
        Ok(status) => format!("answered /healthz with {status:?}"),
        Err(error) => format!("did not answer /healthz: {error}"),
    }
}

/// Runs `verity ARGS --json` against the test server; its stdout as JSON (the command must
/// succeed).
fn verity_json(server: &Server, key: &str, args: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_verity"))
        .args(args)
        .args(["--json", "--url", &server.base, "--api-key", key])
        .output()
        .unwrap();
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// `verity evaluations …` and `verity rejection-sampling …` create, follow and read the
/// sampling runs of `/v1/verity/` while a worker runs them.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cli_runs_evaluations_and_rejection_sampling(pool: sqlx::PgPool) {
    let (server, key) = start(&pool).await;
    let rows = tempfile::Builder::new().suffix(".jsonl").tempfile().unwrap();
    let text: String = ["t1", "t2", "t3"]
        .iter()
        .enumerate()
        .map(|(i, answer)| {
            serde_json::json!({"prompt": format!("t{} t{}", 5 + i, 20 + i), "answer": answer})
                .to_string()
                + "\n"
        })
        .collect();
    std::fs::write(rows.path(), text).unwrap();
    let file = verity_json(&server, &key, &["files", "upload", rows.path().to_str().unwrap()]);
    let file = file["id"].as_str().unwrap().to_string();
    let grader = serde_json::json!({"type": "string_check", "name": "contains",
        "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "like"});
    let body = tempfile::NamedTempFile::new().unwrap();
    let path = body.path().to_str().unwrap();

    let request = serde_json::json!({"models": ["tiny-judge"], "file": file, "grader": grader,
                                     "n": 2, "max_tokens": 4, "seed": 3});
    std::fs::write(body.path(), request.to_string()).unwrap();
    let created = verity_json(&server, &key, &["evaluations", "create", "--body", path]);
    let id = created["id"].as_str().unwrap().to_string();
    run_queued_jobs(&pool, &server, 1).await;
    let done = verity_json(&server, &key, &["evaluations", "watch", &id]);
    assert_eq!(done["status"], "succeeded", "{done}");
    let listed = verity_json(&server, &key, &["evaluations", "list"]);
    assert_eq!(listed["data"][0]["id"], id.as_str(), "{listed}");
    let results = verity_json(&server, &key, &["evaluations", "results", &id]);
    let model = &results["models"][0];
    assert_eq!(model["model"], "tiny-judge", "{results}");
    assert!(model["pass_at_k"]["pass@2"].is_number(), "{results}");
    let csv = Command::new(env!("CARGO_BIN_EXE_verity"))
        .args(["evaluations", "results", &id, "--csv", "--url", &server.base, "--api-key", &key])
        .output()
        .unwrap();
    assert!(csv.status.success(), "{}", String::from_utf8_lossy(&csv.stderr));
    let csv = String::from_utf8(csv.stdout).unwrap();
    assert!(csv.lines().count() >= 2 && csv.contains("tiny-judge"), "{csv}");

    let request = serde_json::json!({"model": "tiny-judge", "file": file, "grader": grader,
        "k": 2, "policy": "all_passing", "min_score": 0.0, "max_tokens": 4, "seed": 3});
    std::fs::write(body.path(), request.to_string()).unwrap();
    let created = verity_json(&server, &key, &["rejection-sampling", "create", "--body", path]);
    let id = created["id"].as_str().unwrap().to_string();
    run_queued_jobs(&pool, &server, 1).await;
    let done = verity_json(&server, &key, &["rejection-sampling", "watch", &id]);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done["output_file"].as_str().is_some_and(|f| f.starts_with("file-")), "{done}");
}

/// `verity recipes …` against a running `verity serve`: the server's own loop starts each stage
/// when the one before it succeeded (rejection sampling → SFT of a fresh base on the kept
/// samples → evaluation of both), a worker runs them, and `watch` follows the recipe to its end.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cli_runs_a_recipe_the_server_advances(pool: sqlx::PgPool) {
    let (server, key) = start(&pool).await;
    let rows = tempfile::Builder::new().suffix(".jsonl").tempfile().unwrap();
    let text: String = ["t1", "t2"]
        .iter()
        .map(|answer| serde_json::json!({"prompt": "t5 t20", "answer": answer}).to_string() + "\n")
        .collect();
    std::fs::write(rows.path(), text).unwrap();
    let file = verity_json(&server, &key, &["files", "upload", rows.path().to_str().unwrap()]);
    let file = file["id"].as_str().unwrap().to_string();
    let grader = serde_json::json!({"type": "string_check", "name": "contains",
        "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "like"});
    let recipe = serde_json::json!({"name": "distil", "seed": 3, "stages": [
        {"name": "rs", "type": "rejection_sampling", "rejection_sampling": {"model": "tiny-judge",
            "file": file, "grader": grader, "k": 2, "policy": "all_passing", "min_score": 0.0,
            "max_tokens": 4}},
        {"name": "sft", "type": "fine_tuning_job", "fresh_base": true, "fine_tuning_job": {
            "training_file": "{{stages.rs.file}}", "method": {"type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}}}}},
        {"name": "eval", "type": "evaluation", "evaluation": {
            "models": ["tiny-judge", "{{stages.sft.fine_tuned_model}}"], "file": file,
            "grader": grader, "n": 2, "max_tokens": 4}}]});
    let body = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(body.path(), recipe.to_string()).unwrap();
    let created =
        verity_json(&server, &key, &["recipes", "create", "--body", body.path().to_str().unwrap()]);
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["stages"][0]["status"], "queued", "{created}");
    // One worker pass per stage: each waits until the server has queued the next stage.
    run_queued_jobs(&pool, &server, 3).await;
    let done = verity_json(&server, &key, &["recipes", "watch", &id]);
    assert_eq!(done["status"], "succeeded", "{done}");
    let sft = done["stages"][1]["outputs"]["fine_tuned_model"].as_str().unwrap();
    let models: Vec<&str> = done["stages"][2]["summary"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["tiny-judge", sft], "{done}");
    let listed = verity_json(&server, &key, &["recipes", "list"]);
    assert_eq!(listed["data"][0]["id"], id.as_str(), "{listed}");
    let cancel = Command::new(env!("CARGO_BIN_EXE_verity"))
        .args(["recipes", "cancel", &id, "--url", &server.base, "--api-key", &key])
        .output()
        .unwrap();
    assert!(!cancel.status.success(), "a finished recipe cannot be cancelled");
    assert!(String::from_utf8_lossy(&cancel.stderr).contains("cannot be cancelled"));
}

/// `verity jobs create --dry-run` against a running server: a file whose line 2 lacks the field
/// the grader reads exits 1 with the line and field and each probe's score, nothing enqueued;
/// the good file exits 0.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cli_dry_run_reports_rows_and_probes(pool: sqlx::PgPool) {
    let (server, key) = start(&pool).await;
    let upload = |text: &str| {
        let rows = tempfile::Builder::new().suffix(".jsonl").tempfile().unwrap();
        std::fs::write(rows.path(), text).unwrap();
        let file = verity_json(&server, &key, &["files", "upload", rows.path().to_str().unwrap()]);
        file["id"].as_str().unwrap().to_string()
    };
    let good = "{\"prompt\": \"2+2?\", \"answer\": \"4\"}\n";
    let bad = upload(&format!("{good}{{\"prompt\": \"3+3?\"}}\n"));
    let good = upload(good);
    let grader = serde_json::json!({"type": "string_check", "name": "contains",
        "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "like"});
    let body = tempfile::NamedTempFile::new().unwrap();
    let request = serde_json::json!({"model": "tiny",
        "method": {"type": "reinforcement", "reinforcement": {"grader": grader}}});
    std::fs::write(body.path(), request.to_string()).unwrap();
    let dry_run = |file: &str| {
        Command::new(env!("CARGO_BIN_EXE_verity"))
            .args(["jobs", "create", "--dry-run", "--url", &server.base, "--api-key", &key])
            .args(["--file", body.path().to_str().unwrap(), "--training-file", file])
            .output()
            .unwrap()
    };
    let refused = dry_run(&bad);
    let stdout = String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "{stdout}");
    assert!(stdout.contains("line 2: field `answer`"), "{stdout}");
    assert!(stdout.contains("all_candidates") && stdout.contains("scored 1  REWARDED"), "{stdout}");
    let accepted = dry_run(&good);
    let stdout = String::from_utf8_lossy(&accepted.stdout);
    assert!(accepted.status.success(), "{stdout}");
    assert!(stdout.contains("rows ok") && stdout.contains("would accept"), "{stdout}");
    let jobs = verity_json(&server, &key, &["jobs", "list"]);
    assert_eq!(jobs["data"], serde_json::json!([]), "a dry run enqueues nothing");
}
