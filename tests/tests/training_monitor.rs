//! The reward-hacking and collapse monitor through the real API, queue and worker on a tiny
//! random model: a job listing `zero_advantage` in `auto_pause_on` whose grader never
//! rewards anything fires that warning (a `warning` event), is paused by the worker, and shows
//! it on `GET /v1/verity/jobs/{id}/warnings`; an unknown kind is a 400 naming the field.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{get, post, upload, user};
use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;
use training_support::{event_kinds, metric_steps, prepare_store, run_one_job, MODEL};
use verity_core::queue::{Queue, QueueSettings};
use verity_core::JobState;
use verity_worker::trainer::testing::target_token_jsonl;

fn body(file: &str, auto_pause_on: serde_json::Value) -> serde_json::Value {
    let hp = json!({"batch_size": 2, "group_size": 2, "learning_rate": 0.01, "max_steps": 5,
                    "max_completion_tokens": 2, "micro_batch_size": 4, "eval_on_start": false,
                    "auto_pause_on": auto_pause_on});
    // A reference no completion can equal: every reward is 0, so every group has zero advantage.
    let grader = json!({"type": "string_check", "name": "never", "input": "{{sample.output_text}}",
                        "reference": "no completion says this", "operation": "eq"});
    json!({"model": MODEL, "training_file": file,
           "method": {"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}}})
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn auto_pause_on_pauses_a_job_when_its_warning_fires(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let router = verity_server::app::app(api_support::app_on(pool.clone(), store.clone()).await);
    let key = user(&pool, "a@acme.io", "acme", "member").await;
    let uploaded = upload(&router, &key, "train.jsonl", target_token_jsonl(6).as_bytes()).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{:?}", uploaded.json());
    let file = uploaded.json()["id"].as_str().unwrap().to_string();

    let bad = post(
        &router,
        "/v1/fine_tuning/jobs",
        &key,
        body(&file, json!(["entropy_collapse", "vibes"])),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{:?}", bad.json());
    assert_eq!(
        bad.json()["error"]["param"],
        "method.reinforcement.hyperparameters.auto_pause_on[1]",
        "{:?}",
        bad.json()
    );
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!(jobs, 0, "a refused job changes nothing");

    let created =
        post(&router, "/v1/fine_tuning/jobs", &key, body(&file, json!(["zero_advantage"]))).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let job = created.json()["id"].as_str().unwrap().to_string();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;

    assert_eq!(queue.state(&job).await.unwrap(), JobState::Paused);
    assert_eq!(metric_steps(&pool, &job).await, vec![1, 2], "paused at the first step it fired");
    let kinds = event_kinds(&pool, &job).await;
    for kind in ["warning", "auto_pause", "checkpoint"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} missing from {kinds:?}");
    }
    let reply = get(&router, &format!("/v1/verity/jobs/{job}/warnings"), &key).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let warnings = reply.json();
    assert_eq!(warnings["auto_pause_on"], json!(["zero_advantage"]));
    let first = &warnings["data"][0];
    assert_eq!(first["kind"], "zero_advantage", "{warnings}");
    assert_eq!(first["metric"], "zero_advantage_group_fraction");
    assert_eq!((first["value"].as_f64(), first["step"].as_i64()), (Some(1.0), Some(2)));
    assert!(first["threshold"].as_f64().unwrap() < 1.0 && first["message"].is_string());

    // Resumed, it is not paused again for the same warning: it runs to the end.
    let resumed =
        post(&router, &format!("/v1/fine_tuning/jobs/{job}/resume"), &key, json!({})).await;
    assert_eq!(resumed.status, StatusCode::OK, "{:?}", resumed.json());
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded);
    assert_eq!(metric_steps(&pool, &job).await, vec![1, 2, 3, 4, 5]);
    let other = user(&pool, "b@other.io", "other", "member").await;
    let hidden = get(&router, &format!("/v1/verity/jobs/{job}/warnings"), &other).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
}
