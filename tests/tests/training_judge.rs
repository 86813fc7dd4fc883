//! A job whose grader is a `score_model` judged by SmolLM2-135M-Instruct (a model registered in
//! Verity, loaded by the worker next to the policy) trains two steps through the real queue;
//! the judge's scores reach the per-grader metrics and its reasons the samples. A job whose
//! judge endpoint is down is paused with a clear event instead of scoring zeros. Skipped loudly
//! without the model (`scripts/fetch-test-model.sh`).

use verity_tests::training_support;

use serde_json::{json, Value};
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use verity_core::queue::{
    run_worker, DeviceKind, NewJob, Queue, QueueSettings, RunnerOptions, WorkerInfo,
};
use verity_core::storage::{LocalStore, ObjectStore};
use verity_core::JobState;
use verity_worker::bench::grpo_step::arithmetic_jsonl;
use verity_worker::judge::{JudgeEndpoint, JudgeSettings};

/// The judge of both tests: rate the answer from 0 to 100. SmolLM2-135M is far too small to be a
/// good judge (its replies often echo a number of the question); these tests check the
/// plumbing — batched judging, parsing, scores and reasons in metrics and samples — not its
/// judgement.
fn judge_grader(model: &str, question: &str) -> Value {
    json!({"type": "score_model", "name": "judge", "model": model, "range": [0, 100],
           "input": [{"role": "system", "content": "You grade answers. Reply with only a number from 0 to 100."},
                     {"role": "user", "content": format!("Question: {question} Answer: {{{{sample.output_text}}}}. Rate the answer from 0 to 100. Reply with only the number.")}],
           "sampling_params": {"temperature": 0, "seed": 7, "max_completions_tokens": 8}})
}

async fn run_one(queue: &Queue, handler: verity_worker::job::TrainingHandler) {
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    run_worker(
        queue.clone(),
        WorkerInfo::new(DeviceKind::Cpu, 4096),
        Arc::new(handler),
        options,
        CancellationToken::new(),
    )
    .await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn smollm2_judged_job_trains_two_steps_with_scores_and_reasons(pool: PgPool) {
    let Some(model_dir) = verity_worker::testing::smollm2_dir(
        "smollm2_judged_job_trains_two_steps_with_scores_and_reasons",
    ) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(root.path().join("objects"), None).await.unwrap());
    training_support::publish_smollm2(&pool, store.as_ref(), &model_dir).await;
    store.put_bytes("files/file-math.jsonl", arithmetic_jsonl(4).into()).await.unwrap();
    let method = json!({"type": "reinforcement", "reinforcement": {
        "grader": judge_grader("smollm2", "{{item.messages.0.content}}"),
        "hyperparameters": {"batch_size": 1, "group_size": 4, "max_steps": 2, "max_completion_tokens": 16,
                            "learning_rate": 1e-5, "checkpoint_interval": 2}}});
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let mut job = NewJob::new(training_support::new_org(&pool).await, "smollm2", method);
    job.training_file = Some("file-math".into());
    let job = queue.enqueue(&job).await.unwrap();
    run_one(
        &queue,
        training_support::cpu_training_handler(store.clone(), &root.path().join("cache")),
    )
    .await;
    let error: Option<Value> = sqlx::query_scalar("SELECT error FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded, "{error:?}");
    assert_eq!(training_support::metric_steps(&pool, &job).await, vec![1, 2]);
    let metrics: Vec<Value> =
        sqlx::query_scalar("SELECT data FROM job_metrics WHERE job_id = $1 ORDER BY step")
            .bind(&job)
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut judged = 0;
    for step in 1..=2 {
        let bytes =
            store.get_bytes(&format!("jobs/{job}/samples/step-{step}.jsonl")).await.unwrap();
        for line in String::from_utf8(bytes.to_vec()).unwrap().lines() {
            let sample: Value = serde_json::from_str(line).unwrap();
            let reason = sample["reason"].as_str().unwrap();
            if sample["grader_error"].is_null() {
                judged += 1;
                assert!(reason.starts_with("judge smollm2 scored"), "{sample}");
                assert!(sample["per_grader"]["judge"].is_number(), "{sample}");
            } else {
                // an unparsable reply is a counted error, never a silent 0
                assert!(reason.contains("judge reply"), "{sample}");
            }
        }
    }
    assert!(judged > 0, "no sample was judged");
    let per_grader = metrics.iter().filter(|m| m.to_string().contains("\"judge\"")).count();
    assert_eq!(per_grader, 2, "per-grader metrics of the judge in every step: {metrics:?}");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_judge_outage_pauses_the_job_instead_of_scoring_zeros(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = training_support::prepare_store(&pool, root.path()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let grader = judge_grader("down-judge", "{{item.prompt}}");
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": grader,
        "hyperparameters": {"batch_size": 1, "group_size": 2, "max_steps": 1, "max_completion_tokens": 4}}});
    let mut job =
        NewJob::new(training_support::new_org(&pool).await, training_support::MODEL, method);
    job.training_file = Some("file-train".into());
    job.max_attempts = 1;
    let job = queue.enqueue(&job).await.unwrap();
    // nothing listens on port 9 of loopback
    let settings = JudgeSettings {
        endpoints: vec![JudgeEndpoint {
            name: "down-judge".into(),
            base_url: "http://127.0.0.1:9/v1".into(),
            key_env: None,
        }],
        retries: 1,
        ..JudgeSettings::default()
    };
    let handler = training_support::cpu_training_handler(store, &root.path().join("cache"))
        .with_judge_settings(settings);
    run_one(&queue, handler).await;
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Paused, "a judge outage pauses the job");
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM job_events WHERE job_id = $1 AND kind = 'judge_unavailable'",
    )
    .bind(&job)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].contains("judge unavailable") && events[0].contains("paused"), "{events:?}");
    assert!(training_support::metric_steps(&pool, &job).await.is_empty(), "no step was scored");
}
