//! Issue #43: a model whose name is `.` or `..` (inserted straight into the database, as the API
//! refuses it) fails its job at once, without retries, and deletes nothing in the cache.

use verity_tests::training_support;

use sqlx::PgPool;
use training_support::{method, prepare_store, run_one_job, MODEL};
use verity_core::queue::{NewJob, Queue, QueueSettings};
use verity_core::JobState;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_over_a_dot_named_model_fails_once_and_keeps_the_cache(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let cache = root.path().join("cache");
    // What other jobs and servers keep in the shared cache.
    let sentinels = [
        cache.join("sentinel"),
        cache.join("models/other/weights"),
        cache.join("serving/other/weights"),
        cache.join("jobs/other/step-1/weights"),
    ];
    for sentinel in &sentinels {
        std::fs::create_dir_all(sentinel.parent().unwrap()).unwrap();
        std::fs::write(sentinel, b"keep").unwrap();
    }
    let org = training_support::new_org(&pool).await;
    for name in ["..", "."] {
        sqlx::query(
            "INSERT INTO models (id, kind, storage_prefix, format) VALUES ($1, 'base', 'models/tiny-llama', 'hf')",
        )
        .bind(name)
        .execute(&pool)
        .await
        .unwrap();
        let mut job = NewJob::new(
            org,
            name,
            method(serde_json::json!({"max_steps": 1, "max_completion_tokens": 4})),
        );
        job.training_file = Some("file-train".into());
        job.seed = 1;
        let job = queue.enqueue(&job).await.unwrap();
        run_one_job(&queue, store.clone(), &cache).await;
        assert_eq!(queue.state(&job).await.unwrap(), JobState::Failed, "model {name:?}");
        let (attempt, error): (i32, serde_json::Value) =
            sqlx::query_as("SELECT attempt, error FROM jobs WHERE id = $1")
                .bind(&job)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(attempt, 1, "model {name:?}: failed at once, no retries");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("must not be . or .."), "{message}");
        for sentinel in &sentinels {
            assert!(sentinel.exists(), "{} survived model {name:?}", sentinel.display());
        }
    }
    // The same cache still serves a well-named model.
    let mut job = NewJob::new(
        org,
        MODEL,
        method(serde_json::json!({"max_steps": 1, "max_completion_tokens": 4})),
    );
    job.training_file = Some("file-train".into());
    let job = queue.enqueue(&job).await.unwrap();
    run_one_job(&queue, store.clone(), &cache).await;
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded);
}
