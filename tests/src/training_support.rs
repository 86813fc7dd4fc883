//! Shared set-up of the training-job tests: an org, a local object store holding a tiny random
//! model (published HF folder, registered in `models`) and the synthetic task's files, and a job.

use serde_json::{json, Value};
use sqlx::PgPool;
use std::path::Path;
use std::sync::Arc;
use verity_core::queue::{NewJob, Queue};
use verity_core::storage::{publish_folder, LocalStore, ObjectStore};
use verity_worker::job::{TrainingHandler, TrainingHandlerConfig};
use verity_worker::trainer::testing::{
    first_token_grader, target_token_jsonl, write_tiny_model_dir,
};
use verity_worker::Family;

/// Model id of the tiny model.
pub const MODEL: &str = "tiny-llama";

/// Opens a local store in `root/objects` and publishes the tiny model and the task files.
pub async fn prepare_store(pool: &PgPool, root: &Path) -> Arc<dyn ObjectStore> {
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(root.join("objects"), None).await.unwrap());
    prepare(pool, root, store).await
}

/// Publishes the tiny model (written under `root`) and the task files to `store`.
pub async fn prepare(
    pool: &PgPool,
    root: &Path,
    store: Arc<dyn ObjectStore>,
) -> Arc<dyn ObjectStore> {
    let model_dir = root.join("tiny-model");
    write_tiny_model_dir(&model_dir, Family::Llama, 3).unwrap();
    publish_folder(store.as_ref(), &model_dir, "models/tiny-llama").await.unwrap();
    sqlx::query("INSERT INTO models (id, kind, storage_prefix, format) VALUES ($1, 'base', 'models/tiny-llama', 'hf')")
        .bind(MODEL)
        .execute(pool)
        .await
        .unwrap();
    store.put_bytes("files/file-train.jsonl", target_token_jsonl(6).into()).await.unwrap();
    store.put_bytes("files/file-valid.jsonl", target_token_jsonl(3).into()).await.unwrap();
    store
}

/// The method of a small job on the synthetic task.
pub fn method(hyperparameters: Value) -> Value {
    json!({"type": "reinforcement", "reinforcement": {"grader": first_token_grader(), "hyperparameters": hyperparameters}})
}

/// Creates an org named after its id; returns the id.
pub async fn new_org(pool: &PgPool) -> uuid::Uuid {
    let org = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO orgs (id, name) VALUES ($1, $2)")
        .bind(org)
        .bind(format!("org-{org}"))
        .execute(pool)
        .await
        .unwrap();
    org
}

/// Publishes the SmolLM2 folder `model_dir` to `store` and registers it as the base `smollm2`.
pub async fn publish_smollm2(pool: &PgPool, store: &dyn ObjectStore, model_dir: &Path) {
    verity_core::testing::publish_base_model(pool, store, model_dir, "smollm2").await;
}

/// Creates an org and enqueues a job with `method`; returns its id.
pub async fn enqueue(pool: &PgPool, queue: &Queue, method: Value) -> String {
    let org = new_org(pool).await;
    let mut job = NewJob::new(org, MODEL, method);
    job.training_file = Some("file-train".into());
    job.validation_file = Some("file-valid".into());
    job.seed = 42;
    queue.enqueue(&job).await.unwrap()
}

/// Steps of the job's metrics rows, in order.
pub async fn metric_steps(pool: &PgPool, job: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT step FROM job_metrics WHERE job_id = $1 ORDER BY step")
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Kinds of the job's events, in order.
pub async fn event_kinds(pool: &PgPool, job: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM job_events WHERE job_id = $1 ORDER BY id")
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The steps of the lines of a job's `metrics.jsonl`, in file order.
pub async fn metrics_jsonl_steps(store: &dyn ObjectStore, job: &str) -> Vec<i64> {
    let bytes = store.get_bytes(&format!("jobs/{job}/metrics.jsonl")).await.unwrap();
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].as_i64().unwrap())
        .collect()
}

/// A CPU training handler over `store`, caching models in `cache`, with two grader workers.
pub fn cpu_training_handler(store: Arc<dyn ObjectStore>, cache: &Path) -> TrainingHandler {
    TrainingHandler::new(
        store,
        TrainingHandlerConfig {
            cache_dir: cache.to_path_buf(),
            device: candle_core::Device::Cpu,
            grader_workers: 2,
        },
    )
}

/// Starts the `verity-training-worker` process at `worker` (a test passes
/// `env!("CARGO_BIN_EXE_verity-training-worker")`) on the test database with its store and cache
/// under `root` and a 2 s lease (so that a killed worker's job is rescued quickly).
pub fn spawn_worker(worker: &str, database_url: &str, root: &Path) -> std::process::Child {
    std::process::Command::new(worker)
        .env("DATABASE_URL", database_url)
        .env("VERITY_STORAGE", root.join("objects"))
        .env("VERITY_CACHE_DIR", root.join("cache"))
        .env("TEST_LEASE_MS", "2000")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the training worker")
}

/// Runs exactly one queued job to its end on an in-process CPU worker.
pub async fn run_one_job(queue: &Queue, store: Arc<dyn ObjectStore>, cache: &Path) {
    use verity_core::queue::{run_worker, DeviceKind, RunnerOptions, WorkerInfo};
    let handler = cpu_training_handler(store, cache);
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    let token = tokio_util::sync::CancellationToken::new();
    let done = run_worker(queue.clone(), worker, Arc::new(handler), options, token).await;
    assert_eq!(done, 1);
}

/// Passes when the completion contains the row's `answer` (about half of the tiny model's
/// four-token completions contain `t1`, `t2` or `t3` somewhere), so pass@k has contrast.
pub fn contains_grader() -> Value {
    json!({"type": "string_check", "name": "contains", "input": "{{sample.output_text}}",
           "reference": "{{item.answer}}", "operation": "like"})
}

/// Four prompts whose answers are substrings of many tokens of the tiny vocabulary.
pub fn prompts_jsonl() -> String {
    ["t1", "t2", "t3", "t1"]
        .iter()
        .enumerate()
        .map(|(i, answer)| {
            json!({"prompt": format!("t{} t{}", 5 + i, 20 + i), "answer": answer}).to_string()
                + "\n"
        })
        .collect()
}

/// Prompt rows for difficulty profiles: one per `(answer, pad)`, the prompt `t{5+i} t{20+i}`;
/// with the first-token grader a row whose `pad` holds its answer is always solved, and an
/// answer outside the tiny vocabulary is never solved.
pub fn profile_rows_jsonl(rows: &[(&str, &str)]) -> String {
    rows.iter()
        .enumerate()
        .map(|(i, (answer, pad))| {
            json!({"prompt": format!("t{} t{}", 5 + i, 20 + i), "answer": answer, "pad": pad})
                .to_string()
                + "\n"
        })
        .collect()
}
