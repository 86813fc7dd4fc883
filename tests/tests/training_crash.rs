//! A real training worker process is SIGKILLed mid-job; a second worker process resumes from
//! the last checkpoint after the lease expires, and each step's metrics exist exactly once
//! (in Postgres and in `metrics.jsonl`).

use verity_tests::training_support;

use serde_json::json;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use training_support::{
    enqueue, event_kinds, method, metric_steps, metrics_jsonl_steps, prepare_store, spawn_worker,
};
use verity_core::queue::{Queue, QueueSettings};
use verity_core::JobState;

const STEPS: i32 = 40;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_killed_training_worker_is_resumed_from_its_checkpoint(pool: PgPool) {
    let url = verity_testkit::db::database_url_of(&pool).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let hp = json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.01, "max_steps": STEPS,
                    "max_completion_tokens": 16, "checkpoint_interval": 2, "micro_batch_size": 8});
    let job = enqueue(&pool, &queue, method(hp)).await;

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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().expect("SIGKILL the worker");
    first.wait().unwrap();
    let at_kill = metric_steps(&pool, &job).await;
    assert!((at_kill.len() as i32) < STEPS, "killed mid-job: {at_kill:?}");
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Running);

    let mut second = spawn_worker(env!("CARGO_BIN_EXE_verity-training-worker"), &url, root.path());
    let started = Instant::now();
    while queue.state(&job).await.unwrap() != JobState::Succeeded {
        assert!(started.elapsed() < Duration::from_secs(180), "the second worker did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(second.wait().unwrap().success());

    assert_eq!(
        metric_steps(&pool, &job).await,
        (1..=STEPS).collect::<Vec<_>>(),
        "each step exactly once"
    );
    assert_eq!(
        metrics_jsonl_steps(store.as_ref(), &job).await,
        (1..=STEPS as i64).collect::<Vec<_>>()
    );
    let attempts: Vec<i32> = sqlx::query_scalar(
        "SELECT DISTINCT attempt FROM job_metrics WHERE job_id = $1 ORDER BY attempt",
    )
    .bind(&job)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(attempts, vec![1, 2], "both attempts wrote steps");
    assert!(event_kinds(&pool, &job).await.contains(&"resumed".to_string()));
}
