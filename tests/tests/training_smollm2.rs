//! A 3-step job on SmolLM2-135M-Instruct with the math grader through the real queue and a
//! local store; the final checkpoint downloads and reloads. Skipped loudly without the model
//! (`scripts/fetch-test-model.sh`).

use verity_tests::training_support;

use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use verity_core::queue::{
    run_worker, DeviceKind, NewJob, Queue, QueueSettings, RunnerOptions, WorkerInfo,
};
use verity_core::storage::{download_folder, LocalStore, ObjectStore};
use verity_core::JobState;
use verity_worker::bench::grpo_step::arithmetic_jsonl;
use verity_worker::job::{TrainingHandler, TrainingHandlerConfig};

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn smollm2_trains_three_steps_with_the_math_grader(pool: PgPool) {
    let Some(model_dir) =
        verity_worker::testing::smollm2_dir("smollm2_trains_three_steps_with_the_math_grader")
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(root.path().join("objects"), None).await.unwrap());
    training_support::publish_smollm2(&pool, store.as_ref(), &model_dir).await;
    store.put_bytes("files/file-math.jsonl", arithmetic_jsonl(4).into()).await.unwrap();
    let org = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO orgs (id, name) VALUES ($1, 'smol')")
        .bind(org)
        .execute(&pool)
        .await
        .unwrap();
    let method = json!({"type": "reinforcement", "reinforcement": {
        "grader": {"type": "math", "name": "math", "reference": "{{item.answer}}"},
        "hyperparameters": {"batch_size": 1, "group_size": 4, "max_steps": 3, "max_completion_tokens": 24,
                            "learning_rate": 1e-5, "checkpoint_interval": 3, "eval_samples": 2}}});
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let mut job = NewJob::new(org, "smollm2", method);
    job.training_file = Some("file-math".into());
    job.validation_file = Some("file-math".into());
    let job = queue.enqueue(&job).await.unwrap();
    let handler = TrainingHandler::new(
        store.clone(),
        TrainingHandlerConfig {
            cache_dir: root.path().join("cache"),
            device: candle_core::Device::Cpu,
            grader_workers: 2,
        },
    );
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    run_worker(
        queue.clone(),
        WorkerInfo::new(DeviceKind::Cpu, 4096),
        Arc::new(handler),
        options,
        CancellationToken::new(),
    )
    .await;
    let error: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT error FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded, "{error:?}");
    let steps: Vec<i32> =
        sqlx::query_scalar("SELECT step FROM job_metrics WHERE job_id = $1 ORDER BY step")
            .bind(&job)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(steps, vec![1, 2, 3]);
    let dir = root.path().join("downloaded");
    download_folder(store.as_ref(), &format!("jobs/{job}/checkpoints/step-3"), &dir).await.unwrap();
    let reloaded = verity_worker::load_model(&dir, &candle_core::Device::Cpu).unwrap();
    assert_eq!(reloaded.model.config.vocab_size, 49152);
}
