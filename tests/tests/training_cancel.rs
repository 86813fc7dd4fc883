//! Cancel takes effect within seconds in every phase: a job cancelled while its step-0
//! evaluation is being judged by a model (SmolLM2-135M-Instruct, writing long verdicts) is
//! cancelled in under 5 s, and the evaluation is abandoned, not finished. Before, the worker
//! learned of the cancel only between steps, and this evaluation kept judging for minutes.
//! Skipped loudly without the model (`scripts/fetch-test-model.sh`).

use verity_tests::training_support;

use serde_json::{json, Value};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use verity_core::queue::{NewJob, Queue, QueueSettings};
use verity_core::JobState;
use verity_worker::trainer::testing::target_token_jsonl;

/// A judge that writes long replies, so that judging the evaluation's 160 completions takes far
/// longer than the 5 s a cancel may take. Its budget is the 32768 tokens OpenAI's graders guide
/// asks for: more than SmolLM2's context, so it is clamped with a warning event.
fn verbose_judge() -> Value {
    json!({"type": "score_model", "name": "judge", "model": "smollm2", "range": [0, 100],
           "input": [{"role": "user", "content": "Write a long, detailed essay on whether this answer is right, then a score from 0 to 100. Answer: {{sample.output_text}}"}],
           "sampling_params": {"temperature": 0, "seed": 7, "max_completions_tokens": 32768}})
}

async fn progress(pool: &PgPool, job: &str) -> Value {
    sqlx::query_scalar::<_, Option<Value>>("SELECT progress FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(pool)
        .await
        .unwrap()
        .unwrap_or(Value::Null)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_cancelled_while_its_evaluation_is_judged_stops_within_seconds(pool: PgPool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    let Some(model_dir) = verity_worker::testing::smollm2_dir(
        "a_job_cancelled_while_its_evaluation_is_judged_stops_within_seconds",
    ) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let store = training_support::prepare_store(&pool, root.path()).await;
    training_support::publish_smollm2(&pool, store.as_ref(), &model_dir).await;
    store.put_bytes("files/file-eval40.jsonl", target_token_jsonl(40).into()).await.unwrap();
    let method = json!({"type": "reinforcement", "reinforcement": {
        "grader": verbose_judge(),
        "hyperparameters": {"batch_size": 1, "group_size": 2, "max_steps": 1, "eval_samples": 4,
                            "max_completion_tokens": 4}}});
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let mut job =
        NewJob::new(training_support::new_org(&pool).await, training_support::MODEL, method);
    job.training_file = Some("file-train".into());
    job.validation_file = Some("file-eval40".into());
    let job = queue.enqueue(&job).await.unwrap();
    let worker = {
        let (queue, store, cache) = (queue.clone(), store.clone(), root.path().join("cache"));
        tokio::spawn(async move { training_support::run_one_job(&queue, store, &cache).await })
    };

    // Wait until every validation completion is sampled: the judge is now at work.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let p = progress(&pool, &job).await;
        let sampled = p["phase"] == "evaluating"
            && p["phase_total"].as_u64().is_some_and(|total| total > 0)
            && p["phase_done"] == p["phase_total"];
        if sampled {
            break;
        }
        assert!(!worker.is_finished(), "the job ended before its evaluation was judged: {p}");
        assert!(Instant::now() < deadline, "the evaluation never finished sampling: {p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let asked = Instant::now();
    tracing::info!("cancelling");
    queue.cancel(&job).await.unwrap();
    while queue.state(&job).await.unwrap() != JobState::Cancelled {
        assert!(asked.elapsed() < Duration::from_secs(60), "the job was never cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(5), "the cancel took {took:?}");
    tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("the worker is free again")
        .unwrap();
    // The evaluation was abandoned: no baseline row, no eval event.
    assert!(training_support::metric_steps(&pool, &job).await.is_empty());
    let kinds = training_support::event_kinds(&pool, &job).await;
    assert!(!kinds.iter().any(|k| k == "eval"), "{kinds:?}");
    // The judge's budget was accepted and clamped, with a warning naming the field.
    let clamped: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM job_events WHERE job_id = $1 AND kind = 'judge_budget_clamped'",
    )
    .bind(&job)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(clamped.len(), 1, "{kinds:?}");
    assert!(clamped[0].starts_with("sampling_params.max_completions_tokens: 32768"), "{clamped:?}");
}
