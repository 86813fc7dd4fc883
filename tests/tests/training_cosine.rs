//! A training job whose grader is `text_similarity` with `cosine`: the worker gets the
//! embedding model (the all-MiniLM-L6-v2 fixture of `scripts/fetch-embedding-model.sh`, SKIPPED
//! without it) and one step runs end to end with the rollouts' similarities as rewards; the
//! same model registered in the models registry (kind `embedding`) and named by the grader.

use verity_tests::api_support;
use verity_tests::training_support;

use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{cpu_training_handler, enqueue, metric_steps, prepare_store, MODEL};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::JobState;
use verity_worker::embedding::{configure, configured, EmbeddingModel};
use verity_worker::trainer::testing::target_token_jsonl;

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

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_registered_embedding_model_grades_cosine_by_name(pool: PgPool) {
    use api_support::{get, post, upload, user};
    use axum::http::StatusCode;
    let Some(dir) = verity_worker::testing::minilm_dir("a_registered_embedding_model_grades")
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let import = verity_cli::commands::models::import_embedding_model;
    assert_eq!(import(&pool, store.as_ref(), "minilm", &dir).await.unwrap(), "models/minilm");
    assert!(import(&pool, store.as_ref(), "minilm", &dir).await.is_err(), "the name is taken");
    let tiny = root.path().join("tiny-model");
    let not_bert = import(&pool, store.as_ref(), "tiny-as-embedding", &tiny).await;
    assert!(not_bert.is_err(), "a language model is no embedding model");
    let router = verity_server::app::app(api_support::app_on(pool.clone(), store.clone()).await);
    let key = user(&pool, "a@acme.io", "acme", "member").await;

    let models = get(&router, "/v1/models", &key).await.json();
    let minilm = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "minilm").cloned();
    assert_eq!(minilm.map(|m| m["kind"].clone()), Some(json!("embedding")), "{models}");

    let grader = |model: &str| {
        json!({"type": "text_similarity", "name": "similarity", "input": "{{sample.output_text}}",
               "reference": "t7 t7 t7 t7", "evaluation_metric": "cosine", "model": model})
    };
    let run =
        |model: &str| json!({"grader": grader(model), "model_sample": "t7 t7 t3", "item": {}});
    let reply = post(&router, "/v1/fine_tuning/alpha/graders/run", &key, run("minilm")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let reward = reply.json()["reward"].as_f64().unwrap();
    assert!(reward > 0.0 && reward <= 1.0, "{:?}", reply.json());
    // Named by its hub id: the same model, the same reward.
    let hub_id = "sentence-transformers/all-MiniLM-L6-v2";
    verity_core::models::set_hub_id(&pool, "minilm", hub_id).await.unwrap();
    let reply = post(&router, "/v1/fine_tuning/alpha/graders/run", &key, run(hub_id)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    assert_eq!(reply.json()["reward"].as_f64(), Some(reward));
    let reply = post(&router, "/v1/fine_tuning/alpha/graders/run", &key, run("acme/nothing")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{:?}", reply.json());
    assert_eq!(reply.json()["error"]["param"], "grader.model");
    for (uri, body) in [
        ("/v1/fine_tuning/alpha/graders/run", run("no-such-embedder")),
        ("/v1/fine_tuning/alpha/graders/validate", json!({"grader": grader("tiny-llama")})),
    ] {
        let reply = post(&router, uri, &key, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(reply.json()["error"]["param"], "grader.model", "{:?}", reply.json());
    }

    // A job graded with it: created through the API, trained by a worker.
    let file = upload(&router, &key, "train.jsonl", target_token_jsonl(4).as_bytes()).await;
    let file = file.json()["id"].as_str().unwrap().to_string();
    let hp = json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.01, "max_steps": 1,
                    "max_completion_tokens": 4, "micro_batch_size": 4});
    let method = |model: &str| json!({"type": "reinforcement", "reinforcement": {"grader": grader(model), "hyperparameters": hp}});
    let body = json!({"model": "minilm", "training_file": file, "method": method("minilm")});
    let refused = post(&router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "an embedding model is not trained");
    assert_eq!(refused.json()["error"]["param"], "model");
    let body = json!({"model": MODEL, "training_file": file, "method": method("nope")});
    let refused = post(&router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(refused.json()["error"]["param"], "method.reinforcement.grader.model");
    let body = json!({"model": MODEL, "training_file": file, "method": method("minilm")});
    let created = post(&router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let job = created.json()["id"].as_str().unwrap().to_string();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let handler = cpu_training_handler(store.clone(), &root.path().join("cache"));
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    run_worker(queue.clone(), worker, Arc::new(handler), options, CancellationToken::new()).await;
    let error: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT error FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded, "{error:?}");
    let samples = String::from_utf8(
        store.get_bytes(&format!("jobs/{job}/samples/step-1.jsonl")).await.unwrap().to_vec(),
    )
    .unwrap();
    for line in samples.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let score = row["per_grader"]["similarity"].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&score) && row["grader_error"].is_null(), "{row}");
    }
}
