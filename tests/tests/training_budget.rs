//! A job's budget through the real API, queue and worker on a tiny random model: bad caps are
//! 400s naming the field; a job capped at 4 generated tokens pauses itself after step 1 (a
//! `budget_pause` event, the reason in its progress, its usage on the job object); resuming is
//! refused while the cap is reached; raising it with `POST /v1/verity/jobs/{id}/budget` lets
//! the resumed job run to the end, with usage summed over both attempts.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{get, post, upload, user};
use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use training_support::{event_kinds, metric_steps, prepare_store, run_one_job, MODEL};
use verity_core::queue::{Queue, QueueSettings};
use verity_core::JobState;
use verity_worker::trainer::testing::target_token_jsonl;

fn body(file: &str, budget: Value) -> Value {
    // 2 prompts × 2 completions of 1–2 tokens: every step generates 4 to 8 tokens.
    let hp = json!({"batch_size": 2, "group_size": 2, "learning_rate": 0.01, "max_steps": 4,
                    "max_completion_tokens": 2, "micro_batch_size": 4, "eval_on_start": false});
    let grader = json!({"type": "string_check", "name": "t1", "input": "{{sample.output_text}}",
                        "reference": "t1", "operation": "like"});
    json!({"model": MODEL, "training_file": file, "budget": budget,
           "method": {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}}})
}

/// The sum of the job's stored `generated_tokens`.
async fn generated(pool: &PgPool, job: &str) -> i64 {
    let rows: Vec<Value> =
        sqlx::query_scalar("SELECT data FROM job_metrics WHERE job_id = $1 ORDER BY step")
            .bind(job)
            .fetch_all(pool)
            .await
            .unwrap();
    rows.iter().map(|r| r["generated_tokens"].as_i64().unwrap()).sum()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_pauses_at_its_budget_and_resumes_once_it_is_raised(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let router = verity_server::app::app(api_support::app_on(pool.clone(), store.clone()).await);
    let key = user(&pool, "a@acme.io", "acme", "member").await;
    let uploaded = upload(&router, &key, "train.jsonl", target_token_jsonl(6).as_bytes()).await;
    let file = uploaded.json()["id"].as_str().unwrap().to_string();

    for (budget, param) in [
        (json!({"max_wall_seconds": 0}), "budget.max_wall_seconds"),
        (json!({"max_tokens": "lots"}), "budget.max_tokens"),
        (json!({"max_steps": 3}), "budget.max_steps"),
        (json!(600), "budget"),
    ] {
        let bad = post(&router, "/v1/fine_tuning/jobs", &key, body(&file, budget)).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{:?}", bad.json());
        assert_eq!(bad.json()["error"]["param"], param, "{:?}", bad.json());
    }
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!(jobs, 0, "a refused job changes nothing");

    let budget = json!({"max_tokens": 4, "max_wall_seconds": 3600});
    let created = post(&router, "/v1/fine_tuning/jobs", &key, body(&file, budget)).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let job = created.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        created.json()["budget"],
        json!({"max_wall_seconds": 3600, "max_tokens": 4, "used_wall_seconds": 0.0, "used_tokens": 0})
    );
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;

    // Paused by its budget after step 1, with a checkpoint to resume from.
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Paused);
    assert_eq!(metric_steps(&pool, &job).await, vec![1]);
    let kinds = event_kinds(&pool, &job).await;
    let at = kinds.iter().position(|k| k == "budget_pause").expect("a budget_pause event");
    assert_eq!(kinds[at + 1], "checkpoint", "{kinds:?}");
    let paused = get(&router, &format!("/v1/fine_tuning/jobs/{job}"), &key).await.json();
    let used = &paused["budget"];
    assert_eq!(used["used_tokens"].as_i64(), Some(generated(&pool, &job).await), "{used}");
    assert!(used["used_tokens"].as_i64().unwrap() >= 4, "{used}");
    // The API rounds to 0.1 s, and a tiny model's step can take less: read the stored value.
    let wall: f64 = sqlx::query_scalar("SELECT used_wall_seconds FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(wall > 0.0, "{wall}");
    let reason = paused["progress"]["paused_reason"].as_str().unwrap();
    assert!(reason.starts_with("budget of 4 generated tokens reached at step 1 ("), "{reason}");
    assert!(reason.contains("raise max_tokens"), "{reason}");
    assert!(paused["estimated_finish"].is_null());

    // Resuming at the cap would pause again at once: refused, naming what to raise.
    let refused =
        post(&router, &format!("/v1/fine_tuning/jobs/{job}/resume"), &key, json!({})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.json());
    assert_eq!(refused.json()["error"]["code"], "budget_reached");
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("max_tokens"));

    let url = format!("/v1/verity/jobs/{job}/budget");
    let bad = post(&router, &url, &key, json!({"max_tokens": -1})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["error"]["param"], "max_tokens");
    let raised = post(&router, &url, &key, json!({"max_tokens": 1000})).await;
    assert_eq!(raised.status, StatusCode::OK, "{:?}", raised.json());
    assert_eq!(raised.json()["budget"]["max_tokens"], 1000);
    assert_eq!(raised.json()["budget"]["max_wall_seconds"], 3600, "an absent field keeps its cap");
    let resumed =
        post(&router, &format!("/v1/fine_tuning/jobs/{job}/resume"), &key, json!({})).await;
    assert_eq!(resumed.status, StatusCode::OK, "{:?}", resumed.json());
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;

    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded);
    assert_eq!(metric_steps(&pool, &job).await, vec![1, 2, 3, 4]);
    let done = get(&router, &format!("/v1/fine_tuning/jobs/{job}"), &key).await.json();
    assert_eq!(done["budget"]["used_tokens"].as_i64(), Some(generated(&pool, &job).await));
    // (stored values again: the API's 0.1 s rounding can hide a tiny model's second attempt)
    let total: f64 = sqlx::query_scalar("SELECT used_wall_seconds FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(total > wall, "the second attempt's time adds to the first's: {total} after {wall}");
    let ended = post(&router, &url, &key, json!({"max_tokens": null})).await;
    assert_eq!(ended.status, StatusCode::CONFLICT, "{:?}", ended.json());
    let other = user(&pool, "b@other.io", "other", "member").await;
    let hidden = post(&router, &url, &other, json!({"max_tokens": 5})).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
}
