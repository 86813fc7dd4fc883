//! Drives a real `verity serve` process over HTTP: the official `openai` Python SDK against the
//! fine-tuning and grader endpoints (model graders judged in-process by a registered tiny
//! random model), and schemathesis against `/openapi.json` (zero 5xx, responses match
//! the schema). The Python tools come from `scripts/test-services.sh` (VERITY_TEST_PYTHON,
//! VERITY_TEST_SCHEMATHESIS); without them the tests say so and skip.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use verity_core::storage::{LocalStore, ObjectStore};

const JWT_SECRET: &str = "live-test-secret-live-test-secret-0123";

/// A running server, killed on drop.
struct Server {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn database_url(pool: &sqlx::PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres")
    )
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
    verity_server::commands::admin::create_user(pool, "sdk@x.io", "sdk-org", "member", None)
        .await
        .unwrap();
    let key = verity_server::commands::admin::create_key(pool, "sdk@x.io", "sdk").await.unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_verity"))
        .arg("serve")
        .env("DATABASE_URL", database_url(pool))
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
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let listening: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("unexpected first line {line:?}: {e}"));
    let base = listening["listening"].as_str().unwrap().to_string();
    (Server { child, base, _dir: dir }, key)
}

/// Runs `script` under the SDK's `python` against `server` and asserts it printed `marker`.
async fn assert_sdk_script_passes(
    python: &str,
    server: &Server,
    key: &str,
    script: &str,
    marker: &str,
) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    let output = tokio::process::Command::new(python)
        .arg(file.path())
        .env("OPENAI_API_KEY", key)
        .env("OPENAI_BASE_URL", format!("{}/v1", server.base))
        .env("OPENAI_MAX_RETRIES", "0")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(marker),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
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

const SDK_SCRIPT: &str = r#"
import io, os, openai
from openai import OpenAI

client = OpenAI()
data = b'{"prompt": "2+2?", "reference_answer": "4"}\n{"messages": [{"role": "user", "content": "3+3?"}], "reference_answer": "6"}\n'
f = client.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
assert f.id.startswith("file-") and f.status == "processed" and f.bytes == len(data), f
bad = client.files.create(file=("bad.jsonl", io.BytesIO(b'{"prompt": 3}\n')), purpose="fine-tune")
assert bad.status == "error" and "prompt" in bad.status_details, bad

method = {"type": "reinforcement", "reinforcement": {
    "grader": {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
               "reference": "{{item.reference_answer}}", "operation": "eq"},
    "hyperparameters": {"n_epochs": 1}}}
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

try:
    client.fine_tuning.jobs.retrieve("ftjob-doesnotexist")
    raise SystemExit("expected 404")
except openai.NotFoundError:
    pass
try:
    client.fine_tuning.jobs.create(model="nope", training_file=f.id, method=method)
    raise SystemExit("expected 400")
except openai.BadRequestError as e:
    assert e.param == "model", e
try:
    client.fine_tuning.jobs.cancel(job.id)
    raise SystemExit("expected 409")
except openai.ConflictError:
    pass
print("SDK OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_drives_the_api(pool: sqlx::PgPool) {
    let Some(python) = tool("VERITY_TEST_PYTHON") else { return };
    let (server, key) = start(&pool).await;
    assert_sdk_script_passes(&python, &server, &key, SDK_SCRIPT, "SDK OK").await;
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
print("SIMILARITY OK")
"#;

/// `text_similarity` with `cosine` (the all-MiniLM-L6-v2 fixture as the server's embedding
/// model) and `meteor` through the official SDK: graders.run, graders.validate, job creation.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_sdk_runs_cosine_and_meteor_graders(pool: sqlx::PgPool) {
    let Some(python) = tool("VERITY_TEST_PYTHON") else { return };
    let Some(model) =
        verity_worker::testing::minilm_dir("openai_sdk_runs_cosine_and_meteor_graders")
    else {
        return;
    };
    let model = model.to_string_lossy().into_owned();
    let (server, key) = start_with(&pool, &[("VERITY_EMBEDDING_MODEL", &model)]).await;
    assert_sdk_script_passes(&python, &server, &key, SIMILARITY_SCRIPT, "SIMILARITY OK").await;
}

/// Model graders through `client.fine_tuning.alpha.graders` of the official SDK; the judge
/// `tiny-judge` (random weights: its replies are words like `t17`, whose number is the score)
/// is loaded by the server within the request.
const SDK_GRADERS_SCRIPT: &str = r#"
import openai
from openai import OpenAI

client = OpenAI()
messages = [{"role": "system", "content": "t5 t6"},
            {"role": "user", "content": "{{item.question}} t9 {{sample.output_text}}"}]
score = {"type": "score_model", "name": "judge", "model": "tiny-judge", "input": messages,
         "range": [0, 100], "sampling_params": {"temperature": 0, "seed": 3, "max_completions_tokens": 4}}
r = client.fine_tuning.alpha.graders.run(grader=score, model_sample="t44", item={"question": "t3 t8"})
meta = r.metadata if isinstance(r.metadata, dict) else r.metadata.model_dump()
reason = meta["reason"] if isinstance(meta, dict) else meta.reason
if meta.get("errors"):
    assert meta["errors"]["kind"] == "judge_reply" and r.reward == 0, r
else:
    assert 0 <= r.reward <= 1 and reason.startswith("judge tiny-judge scored"), r
again = client.fine_tuning.alpha.graders.run(grader=score, model_sample="t44", item={"question": "t3 t8"})
assert again.reward == r.reward, (again, r)

labels = ["t%d" % i for i in range(3, 64)]
label = {"type": "label_model", "name": "verdict", "model": "tiny-judge", "input": messages,
         "labels": labels, "passing_labels": labels[:30]}
r = client.fine_tuning.alpha.graders.run(grader=label, model_sample="t44", item={"question": "t3 t8"})
meta = r.metadata if isinstance(r.metadata, dict) else r.metadata.model_dump()
assert r.reward in (0, 1), r
assert meta.get("errors") or meta["reason"].startswith("judge tiny-judge labelled"), r

multi = {"type": "multi", "graders": {"s": score, "exact": {"type": "string_check", "name": "exact",
         "input": "{{sample.output_text}}", "reference": "t44", "operation": "eq"}},
         "calculate_output": "exact"}
r = client.fine_tuning.alpha.graders.run(grader=multi, model_sample="t44", item={"question": "t3 t8"})
meta = r.metadata if isinstance(r.metadata, dict) else r.metadata.model_dump()
assert r.reward == 1 or meta.get("errors"), r

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
print("GRADERS OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_python_sdk_runs_model_graders(pool: sqlx::PgPool) {
    let Some(python) = tool("VERITY_TEST_PYTHON") else { return };
    let (server, key) = start(&pool).await;
    assert_sdk_script_passes(&python, &server, &key, SDK_GRADERS_SCRIPT, "GRADERS OK").await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn schemathesis_finds_no_server_errors(pool: sqlx::PgPool) {
    let Some(st) = tool("VERITY_TEST_SCHEMATHESIS") else { return };
    let (server, key) = start(&pool).await;
    let output = tokio::process::Command::new(st)
        .args(["run", &format!("{}/openapi.json", server.base)])
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--experimental",
            "openapi-3.1",
        ])
        .args(["--hypothesis-max-examples", "8", "--hypothesis-derandomize", "--workers", "2"])
        .args(["--request-timeout", "10000"])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
