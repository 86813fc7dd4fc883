//! End to end: supervised and DPO jobs on a tiny random model through the real queue and a local
//! object store — metrics rows with the method's metrics, evaluations, greedy samples, events,
//! checkpoints that reload — and a DPO job whose worker process is SIGKILLed resumes from its
//! checkpoint (with the cached reference log-probs), each step exactly once.

use verity_tests::training_support;

use serde_json::{json, Value};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use training_support::{
    enqueue, event_kinds, metric_steps, metrics_jsonl_steps, prepare_store, run_one_job,
    spawn_worker,
};
use verity_core::queue::{Queue, QueueSettings};
use verity_core::storage::ObjectStore;
use verity_core::JobState;

/// Supervised rows: a user turn, a masked assistant reply and the trained answer.
fn chats(rows: usize) -> String {
    (0..rows)
        .map(|i| {
            json!({"messages": [
                {"role": "system", "content": "t3"},
                {"role": "user", "content": format!("t{}", 4 + i)},
                {"role": "assistant", "content": "t30", "weight": 0},
                {"role": "user", "content": "t5"},
                {"role": "assistant", "content": "t40 t41"}]})
            .to_string()
                + "\n"
        })
        .collect()
}

/// Preference rows.
fn pairs(rows: usize) -> String {
    (0..rows)
        .map(|i| {
            json!({"input": {"messages": [{"role": "user", "content": format!("t{} t9", 4 + i)}]},
                "preferred_output": [{"role": "assistant", "content": "t40"}],
                "non_preferred_output": [{"role": "assistant", "content": format!("t{}", 50 + i)}]})
            .to_string()
                + "\n"
        })
        .collect()
}

async fn put_files(store: &dyn ObjectStore, train: String, valid: String) {
    store.put_bytes("files/file-train.jsonl", train.into()).await.unwrap();
    store.put_bytes("files/file-valid.jsonl", valid.into()).await.unwrap();
}

async fn rows(pool: &PgPool, job: &str) -> Vec<Value> {
    sqlx::query_scalar("SELECT data FROM job_metrics WHERE job_id = $1 ORDER BY step")
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn eval_events(pool: &PgPool, job: &str) -> Vec<(String, Value)> {
    sqlx::query_as(
        "SELECT message, data FROM job_events WHERE job_id = $1 AND kind = 'eval' ORDER BY id",
    )
    .bind(job)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Runs a job of `method` to success and checks what every job leaves behind; its metrics rows.
/// Runs a job to success and checks what it recorded; `eval_steps` are the steps of its `eval`
/// events (a supervised job's baseline at step 0 included).
async fn run_to_success(
    pool: &PgPool,
    method: Value,
    (train, valid): (String, String),
    eval_steps: &[i64],
) -> Vec<Value> {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(pool, root.path()).await;
    put_files(store.as_ref(), train, valid).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let job = enqueue(pool, &queue, method).await;
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;
    let (state, error): (String, Option<Value>) =
        sqlx::query_as("SELECT state::text, error FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(state, "succeeded", "{error:?}");
    assert_eq!(metric_steps(pool, &job).await, vec![1, 2, 3, 4]);
    assert_eq!(metrics_jsonl_steps(store.as_ref(), &job).await, vec![1, 2, 3, 4]);
    let kinds = event_kinds(pool, &job).await;
    for kind in ["started", "step", "eval", "checkpoint", "succeeded"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} missing from {kinds:?}");
    }
    let evals = eval_events(pool, &job).await;
    assert_eq!(
        evals.iter().map(|(_, d)| d["step"].as_i64().unwrap()).collect::<Vec<_>>(),
        eval_steps
    );
    assert!(evals.last().is_some_and(|e| e.0.contains("validation loss")), "{evals:?}");
    // greedy samples at the evaluation steps, beside the row's target
    let samples: Vec<i32> =
        sqlx::query_scalar("SELECT DISTINCT step FROM samples WHERE job_id = $1 ORDER BY step")
            .bind(&job)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(samples, vec![2, 4]);
    let text = store.get_bytes(&format!("jobs/{job}/samples/step-2.jsonl")).await.unwrap();
    let first: Value =
        serde_json::from_str(std::str::from_utf8(&text).unwrap().lines().next().unwrap()).unwrap();
    assert!(first["reference"].as_str().unwrap().starts_with("t40"), "{first}");
    let checkpoints: Vec<(i32, String)> = sqlx::query_as(
        "SELECT step, storage_prefix FROM checkpoints WHERE job_id = $1 ORDER BY step",
    )
    .bind(&job)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(checkpoints.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 4]);
    let dir = root.path().join("downloaded");
    verity_core::storage::download_folder(store.as_ref(), &checkpoints[1].1, &dir).await.unwrap();
    verity_worker::load_model(&dir, &candle_core::Device::Cpu).expect("the checkpoint reloads");
    let (model, result): (Option<String>, Value) =
        sqlx::query_as("SELECT fine_tuned_model, result FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(model.is_some() && result["result_files"][0].is_string(), "{result}");
    // the results file carries the validation loss on the evaluation steps, and only there
    let org: uuid::Uuid = sqlx::query_scalar("SELECT org_id FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(pool)
        .await
        .unwrap();
    let file_id = result["result_files"][0].as_str().unwrap();
    let file = verity_core::files::get_file(pool, org, file_id).await.unwrap().unwrap();
    let csv =
        String::from_utf8(store.get_bytes(&file.storage_key).await.unwrap().to_vec()).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = header.iter().position(|c| *c == "valid_loss").expect("a valid_loss column");
    let with_loss: Vec<i64> = lines
        .filter(|l| !l.split(',').nth(column).unwrap_or_default().is_empty())
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    let trained = eval_steps.iter().filter(|s| **s > 0).all(|s| with_loss.contains(s));
    assert!(trained && with_loss.iter().all(|s| eval_steps.contains(s)), "{csv}");
    rows(pool, &job).await
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_supervised_job_runs_end_to_end(pool: PgPool) {
    let method = json!({"type": "supervised", "supervised": {"hyperparameters": {
        "batch_size": 2, "learning_rate": 0.01, "max_steps": 4, "checkpoint_interval": 2,
        "eval_interval": 2, "max_completion_tokens": 3}}});
    // the baseline: validation loss of the start model at step 0
    let rows = run_to_success(&pool, method, (chats(4), chats(2)), &[0, 2, 4]).await;
    // two chats a step, two trained tokens each: the weight-0 reply and the other turns are
    // not counted
    assert_eq!(rows[0]["label_tokens"], json!(4), "{}", rows[0]);
    assert!(rows[0].get("reward_mean").is_none(), "{}", rows[0]);
    assert!(rows[3]["loss"].as_f64() < rows[0]["loss"].as_f64(), "{rows:?}");
    assert!(rows[1]["eval"]["token_accuracy"].is_number(), "{}", rows[1]);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_dpo_job_runs_end_to_end(pool: PgPool) {
    let method = json!({"type": "dpo", "dpo": {"hyperparameters": {
        "beta": 0.5, "batch_size": 2, "learning_rate": 0.01, "max_steps": 4,
        "checkpoint_interval": 2, "eval_interval": 2, "max_completion_tokens": 2}}});
    // no baseline: before the first step the policy is its own reference (loss ln 2, margin 0)
    let rows = run_to_success(&pool, method, (pairs(4), pairs(2)), &[2, 4]).await;
    let first = &rows[0];
    assert!((first["loss"].as_f64().unwrap() - std::f64::consts::LN_2).abs() < 1e-4, "{first}");
    for field in [
        "reward_margin",
        "preference_accuracy",
        "chosen_logprob",
        "rejected_logprob",
        "chosen_reward",
        "rejected_reward",
    ] {
        assert!(first[field].is_number(), "{field} missing from {first}");
    }
    assert!(rows[3]["reward_margin"].as_f64().unwrap() > 0.0, "{rows:?}");
    let eval = &rows[3]["eval"];
    assert!(eval["preference_accuracy"].is_number() && eval["reward_margin"].is_number(), "{eval}");
}

const STEPS: i32 = 60;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_killed_dpo_job_resumes_from_its_checkpoint(pool: PgPool) {
    let url = verity_testkit::db::database_url_of(&pool).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    put_files(store.as_ref(), pairs(8), pairs(2)).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let method = json!({"type": "dpo", "dpo": {"hyperparameters": {
        "batch_size": 1, "learning_rate": 0.001, "max_steps": STEPS, "checkpoint_interval": 2}}});
    let job = enqueue(&pool, &queue, method).await;

    let mut first = spawn_worker(env!("CARGO_BIN_EXE_verity-training-worker"), &url, root.path());
    let started = Instant::now();
    loop {
        let checkpoints: i64 =
            sqlx::query_scalar("SELECT count(*) FROM checkpoints WHERE job_id = $1")
                .bind(&job)
                .fetch_one(&pool)
                .await
                .unwrap();
        if checkpoints >= 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint from the first worker"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().expect("SIGKILL the worker");
    first.wait().unwrap();
    let at_kill = metric_steps(&pool, &job).await;
    assert!((at_kill.len() as i32) < STEPS, "killed mid-job: {at_kill:?}");

    let mut second = spawn_worker(env!("CARGO_BIN_EXE_verity-training-worker"), &url, root.path());
    let started = Instant::now();
    loop {
        let state = queue.state(&job).await.unwrap();
        if state == JobState::Succeeded {
            break;
        }
        assert_ne!(state, JobState::Failed, "the resumed job failed");
        assert!(started.elapsed() < Duration::from_secs(180), "the second worker did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(second.wait().unwrap().success());
    assert_eq!(metric_steps(&pool, &job).await, (1..=STEPS).collect::<Vec<_>>(), "each step once");
    assert!(event_kinds(&pool, &job).await.contains(&"resumed".to_string()));
    let rows = rows(&pool, &job).await;
    assert!(rows.iter().all(|r| r["loss"].as_f64().unwrap().is_finite()), "{rows:?}");
}
