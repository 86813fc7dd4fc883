//! A training job whose grader is `text_similarity` with `cosine`: the worker gets the
//! embedding model (the all-MiniLM-L6-v2 fixture of `scripts/fetch-embedding-model.sh`, SKIPPED
//! without it) and one step runs end to end with the rollouts' similarities as rewards.

mod training_support;

use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{cpu_training_handler, enqueue, metric_steps, prepare_store};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::JobState;
use verity_worker::embedding::{configure, configured, EmbeddingModel};

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_cosine_graded_job_runs_a_step(pool: PgPool) {
    let Some(dir) = verity_worker::testing::minilm_dir("a_cosine_graded_job_runs_a_step") else {
        return;
    };
    configure(EmbeddingModel::new(Some(dir.clone())));
    assert_eq!(configured().dir(), Some(dir.as_path()), "the process's embedding model");
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let hp = json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.01, "max_steps": 1,
                    "max_completion_tokens": 4, "micro_batch_size": 4});
    let grader = json!({"type": "text_similarity", "name": "similarity", "input": "{{sample.output_text}}",
                        "reference": "t7 t7 t7 t7", "evaluation_metric": "cosine"});
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}});
    let job = enqueue(&pool, &queue, method).await;
    let handler = cpu_training_handler(store.clone(), &root.path().join("cache"));
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    let done =
        run_worker(queue.clone(), worker, Arc::new(handler), options, CancellationToken::new())
            .await;
    assert_eq!(done, 1);
    let error: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT error FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded, "{error:?}");
    assert_eq!(metric_steps(&pool, &job).await, vec![1]);
    let samples = String::from_utf8(
        store.get_bytes(&format!("jobs/{job}/samples/step-1.jsonl")).await.unwrap().to_vec(),
    )
    .unwrap();
    let rows: Vec<serde_json::Value> =
        samples.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2 * 4);
    for row in &rows {
        let score = row["per_grader"]["similarity"].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&score) && row["grader_error"].is_null(), "{row}");
    }
    // real embeddings of different completions: not all the same score, none an error
    let scores: Vec<f64> =
        rows.iter().map(|r| r["per_grader"]["similarity"].as_f64().unwrap()).collect();
    assert!(scores.iter().any(|s| (s - scores[0]).abs() > 1e-6), "{scores:?}");
    let metrics: serde_json::Value =
        sqlx::query_scalar("SELECT data FROM job_metrics WHERE job_id = $1 AND step = 1")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(metrics["grader_errors"].as_f64(), Some(0.0), "{metrics}");
}
