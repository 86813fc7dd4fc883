//! End to end: a training job on a tiny random model runs through the real queue and a local
//! object store; metrics, samples, events and checkpoints land where the API reads them, the
//! final checkpoint reloads, and user errors fail the job without retries.

use verity_tests::training_support;

use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{
    cpu_training_handler, enqueue, event_kinds, method, metric_steps, metrics_jsonl_steps,
    prepare_store, MODEL,
};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::storage::download_folder;
use verity_core::JobState;

async fn run_one_job(
    queue: &Queue,
    store: Arc<dyn verity_core::storage::ObjectStore>,
    cache: &std::path::Path,
) {
    let handler = cpu_training_handler(store, cache);
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let done = run_worker(
        queue.clone(),
        WorkerInfo::new(DeviceKind::Cpu, 1024),
        Arc::new(handler),
        options,
        CancellationToken::new(),
    )
    .await;
    assert_eq!(done, 1);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_training_job_runs_end_to_end(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let hp = json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.01, "max_steps": 3, "max_completion_tokens": 4,
                    "checkpoint_interval": 2, "eval_interval": 2, "eval_samples": 2, "micro_batch_size": 4,
                    "eval_on_start": true});
    // A graded similarity gives reward contrast from the first step, so the weights move.
    let grader = json!({"type": "text_similarity", "name": "similarity", "input": "{{sample.output_text}}",
                        "reference": "t7 t7 t7 t7", "evaluation_metric": "fuzzy_match"});
    let job = enqueue(&pool, &queue, json!({"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}})).await;
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;

    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded);
    assert_eq!(metric_steps(&pool, &job).await, vec![1, 2, 3], "one metrics row per step");
    let kinds = event_kinds(&pool, &job).await;
    for kind in ["started", "step", "eval", "checkpoint", "succeeded"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} missing from {kinds:?}");
    }
    let eval_steps: Vec<i64> =
        sqlx::query_scalar("SELECT (data->>'step')::bigint FROM job_events WHERE job_id = $1 AND kind = 'eval' ORDER BY id")
            .bind(&job)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        eval_steps,
        vec![0, 2, 3],
        "the baseline before training, every 2 steps, and at the end"
    );
    assert_eq!(metrics_jsonl_steps(store.as_ref(), &job).await, vec![1, 2, 3]);
    let row: serde_json::Value =
        sqlx::query_scalar("SELECT data FROM job_metrics WHERE job_id = $1 AND step = 2")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(row["eval"]["pass_at_k"]["pass@1"].is_number(), "{row}");
    assert!(
        row["grad_norm"].as_f64().unwrap() >= 0.0 && row["learning_rate"].as_f64().unwrap() > 0.0
    );
    let samples: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM samples WHERE job_id = $1 AND advantage IS NOT NULL",
    )
    .bind(&job)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(samples, 3 * 2 * 4);
    // Each evaluation kept validation samples (no advantage), the baseline's at step 0.
    let validation: Vec<i32> = sqlx::query_scalar(
        "SELECT DISTINCT step FROM samples WHERE job_id = $1 AND advantage IS NULL ORDER BY step",
    )
    .bind(&job)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(validation, vec![0, 2, 3]);
    let first_sample = String::from_utf8(
        store.get_bytes(&format!("jobs/{job}/samples/step-1.jsonl")).await.unwrap().to_vec(),
    )
    .unwrap();
    let first: serde_json::Value =
        serde_json::from_str(first_sample.lines().next().unwrap()).unwrap();
    assert!(
        first["per_grader"]["similarity"].is_number() && first["finish_reason"].is_string(),
        "{first}"
    );

    let checkpoints: Vec<(i32, String)> = sqlx::query_as(
        "SELECT step, storage_prefix FROM checkpoints WHERE job_id = $1 ORDER BY step",
    )
    .bind(&job)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(checkpoints.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 3]);
    let dir = root.path().join("downloaded");
    download_folder(store.as_ref(), &checkpoints[1].1, &dir).await.unwrap();
    let reloaded = verity_worker::load_model(&dir, &candle_core::Device::Cpu).unwrap();
    let base =
        verity_worker::load_model(&root.path().join("tiny-model"), &candle_core::Device::Cpu)
            .unwrap();
    let changed = reloaded
        .model
        .export_weights()
        .unwrap()
        .iter()
        .zip(base.model.export_weights().unwrap())
        .any(|((_, a), (_, b))| {
            a.sub(&b).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() > 0.0
        });
    assert!(changed, "the checkpoint holds trained weights");
    let progress: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("trainer_progress.json")).unwrap()).unwrap();
    assert_eq!(progress["step"], 3);
}

/// The succeeded job's row: fine-tuned model name, result and org.
async fn finished(pool: &PgPool, job: &str) -> (String, serde_json::Value, uuid::Uuid) {
    sqlx::query_as("SELECT fine_tuned_model, result, org_id FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_fine_tuned_model_is_named_registered_and_trained_again(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let cache = root.path().join("cache");
    let hp = json!({"batch_size": 2, "compute_multiplier": 0.5, "reasoning_effort": "low",
                    "max_completion_tokens": 4, "learning_rate": 0.01, "max_steps": 2,
                    "micro_batch_size": 4, "checkpoint_interval": 10});
    let first = enqueue(&pool, &queue, method(hp.clone())).await;
    sqlx::query("UPDATE jobs SET suffix = 'first' WHERE id = $1")
        .bind(&first)
        .execute(&pool)
        .await
        .unwrap();
    run_one_job(&queue, store.clone(), &cache).await;
    assert_eq!(queue.state(&first).await.unwrap(), JobState::Succeeded);

    // The model's name, its registration, the trained tokens and the results file.
    let (name, result, org) = finished(&pool, &first).await;
    let org_name: String = sqlx::query_scalar("SELECT name FROM orgs WHERE id = $1")
        .bind(org)
        .fetch_one(&pool)
        .await
        .unwrap();
    let slug = verity_core::models::org_slug(&org_name);
    assert_eq!(name, format!("ft:{MODEL}:{slug}:first:{first}"));
    let model = verity_core::models::get_model(&pool, org, &name).await.unwrap().unwrap();
    assert_eq!((model.kind.as_str(), model.format.as_str()), ("fine_tuned", "hf"));
    assert_eq!(model.storage_prefix, format!("jobs/{first}/checkpoints/step-2"));
    assert_eq!(model.job_id.as_deref(), Some(first.as_str()));
    let rows: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT data FROM job_metrics WHERE job_id = $1 ORDER BY step")
            .bind(&first)
            .fetch_all(&pool)
            .await
            .unwrap();
    let per_step: Vec<u64> = rows.iter().map(|r| r["trained_tokens"].as_u64().unwrap()).collect();
    assert!(per_step.iter().all(|&t| t > 0), "{per_step:?}");
    assert_eq!(result["trained_tokens"].as_u64(), Some(per_step.iter().sum()));
    let file_id = result["result_files"][0].as_str().unwrap();
    let file = verity_core::files::get_file(&pool, org, file_id).await.unwrap().unwrap();
    assert_eq!((file.purpose.as_str(), file.status.as_str()), ("fine-tune-results", "processed"));
    let csv =
        String::from_utf8(store.get_bytes(&file.storage_key).await.unwrap().to_vec()).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("step,train_loss,train_reward_mean,"), "{csv}");
    assert_eq!((lines.len(), file.line_count), (3, Some(2)), "{csv}");
    assert!(lines[1].starts_with("1,") && lines[2].starts_with("2,"), "{csv}");
    // compute_multiplier 0.5 → 4 completions per prompt; reasoning_effort low is overridden.
    let samples: i64 =
        sqlx::query_scalar("SELECT count(*) FROM samples WHERE job_id = $1 AND step = 1")
            .bind(&first)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(samples, 2 * 4);

    // A job on the fine-tuned model starts from its weights and is named after the root base.
    let mut job = verity_core::queue::NewJob::new(org, &name, method(hp));
    job.training_file = Some("file-train".into());
    job.seed = 7;
    let second = queue.enqueue(&job).await.unwrap();
    run_one_job(&queue, store.clone(), &cache).await;
    assert_eq!(queue.state(&second).await.unwrap(), JobState::Succeeded);
    let cached = std::fs::read_dir(cache.join("models"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("model.safetensors").is_file() && p.to_string_lossy().contains("first"))
        .expect("the fine-tuned model's folder in the worker's cache");
    let trained = store
        .get_bytes(&format!("jobs/{first}/checkpoints/step-2/model.safetensors"))
        .await
        .unwrap();
    assert_eq!(std::fs::read(cached.join("model.safetensors")).unwrap(), trained.to_vec());
    let (second_name, _, _) = finished(&pool, &second).await;
    assert_eq!(second_name, format!("ft:{MODEL}:{slug}::{second}"), "names do not nest");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn user_errors_fail_the_job_without_retries(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let bad_grader = json!({"type": "reinforcement", "reinforcement": {"grader": {"type": "string_check"}, "hyperparameters": {}}});
    let job = enqueue(&pool, &queue, bad_grader).await;
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Failed);
    let error: serde_json::Value = sqlx::query_scalar("SELECT error FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(error["message"].as_str().unwrap().starts_with("invalid grader"), "{error}");
    assert!(event_kinds(&pool, &job).await.contains(&"failed".to_string()));

    store
        .put_bytes("files/file-train.jsonl", "{\"prompt\": \"t3\"}\n{\"oops\": 1}\n".into())
        .await
        .unwrap();
    let job =
        enqueue(&pool, &queue, method(json!({"max_steps": 1, "max_completion_tokens": 4}))).await;
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Failed);
    let error: serde_json::Value = sqlx::query_scalar("SELECT error FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(error["message"].as_str().unwrap().contains("line 2"), "{error}");
}
