//! Router tests of the REST API (tower `oneshot`, a fresh Postgres database per test, a local
//! object store): files, jobs, control, events, checkpoints, metrics, samples, models, objects.

use verity_tests::api_support;

use api_support::*;
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use std::io::Read;
use verity_core::queue::{DeviceKind, SampleIndexRow, WorkerInfo};
use verity_core::storage::publish_folder;
use verity_server::api::state::ApiConfig;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn health_auth_and_error_shape(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    assert_eq!(call(&app.router, Method::GET, "/healthz", None, None).await.status, StatusCode::OK);
    assert_eq!(call(&app.router, Method::GET, "/readyz", None, None).await.status, StatusCode::OK);
    assert_error(
        &call(&app.router, Method::GET, "/v1/files", None, None).await,
        StatusCode::UNAUTHORIZED,
        None,
    );
    assert_error(
        &call(&app.router, Method::GET, "/v1/files", Some("vt-nonsense"), None).await,
        StatusCode::UNAUTHORIZED,
        None,
    );
    let fake = format!("vt-{}", "a".repeat(40));
    assert_error(
        &call(&app.router, Method::GET, "/v1/files", Some(&fake), None).await,
        StatusCode::UNAUTHORIZED,
        None,
    );
    let key = user(&pool, "a@x.io", "acme", "member").await;
    assert_eq!(get(&app.router, "/v1/files", &key).await.status, StatusCode::OK);
    assert_error(&get(&app.router, "/v1/nothing-here", &key).await, StatusCode::NOT_FOUND, None);
    assert_error(
        &get(&app.router, "/v1/files?limit=0", &key).await,
        StatusCode::BAD_REQUEST,
        Some("limit"),
    );
    assert_error(
        &get(&app.router, "/v1/files?limit=abc", &key).await,
        StatusCode::BAD_REQUEST,
        Some("query"),
    );
    let bad_json = axum::http::Request::builder()
        .method(Method::POST)
        .uri("/v1/fine_tuning/jobs")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from("{not json"))
        .unwrap();
    assert_error(&send(&app.router, bad_json).await, StatusCode::BAD_REQUEST, Some("body"));
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn files_upload_validate_list_read_delete(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;

    let good = upload(&app.router, &key, "train.jsonl", DATASET).await;
    assert_eq!(good.status, StatusCode::OK);
    let file = good.json();
    assert!(file["id"].as_str().unwrap().starts_with("file-"));
    assert_eq!(file["object"], "file");
    assert_eq!(file["status"], "processed");
    assert_eq!(file["bytes"], DATASET.len());
    assert_eq!(file["records"], 2);
    assert_eq!(file["filename"], "train.jsonl");
    assert_eq!(file["purpose"], "fine-tune");

    let bad = upload(
        &app.router,
        &key,
        "bad.jsonl",
        b"{\"prompt\":\"a\"}\n{\"messages\":[{\"role\":\"user\"}]}\n",
    )
    .await;
    assert_eq!(bad.status, StatusCode::OK);
    assert_eq!(bad.json()["status"], "error");
    let details = bad.json()["status_details"].as_str().unwrap().to_string();
    assert!(
        details.contains("line 2")
            && details.contains("messages[0].content")
            && details.contains("missing"),
        "{details}"
    );

    let (content_type, body) = multipart("x.jsonl", "assistants", DATASET);
    let request = axum::http::Request::builder()
        .method(Method::POST)
        .uri("/v1/files")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", content_type)
        .body(axum::body::Body::from(body))
        .unwrap();
    assert_error(&send(&app.router, request).await, StatusCode::BAD_REQUEST, Some("purpose"));
    assert_error(
        &post(&app.router, "/v1/files", &key, json!({})).await,
        StatusCode::BAD_REQUEST,
        Some("file"),
    );

    // Pagination: newest first.
    let third = upload(&app.router, &key, "c.jsonl", DATASET).await.json();
    let page = get(&app.router, "/v1/files?limit=2", &key).await.json();
    assert_eq!(page["object"], "list");
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["id"], third["id"]);
    let after = page["last_id"].as_str().unwrap();
    let rest = get(&app.router, &format!("/v1/files?limit=2&after={after}"), &key).await.json();
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["data"][0]["id"], file["id"]);

    let id = file["id"].as_str().unwrap();
    assert_eq!(get(&app.router, &format!("/v1/files/{id}"), &key).await.json()["id"], id);
    let content = get(&app.router, &format!("/v1/files/{id}/content"), &key).await;
    assert_eq!(content.status, StatusCode::OK);
    assert_eq!(&content.bytes[..], DATASET);
    let deleted =
        call(&app.router, Method::DELETE, &format!("/v1/files/{id}"), Some(&key), None).await;
    assert_eq!(deleted.json(), json!({"id": id, "object": "file", "deleted": true}));
    assert_error(
        &get(&app.router, &format!("/v1/files/{id}"), &key).await,
        StatusCode::NOT_FOUND,
        None,
    );
    assert!(app.state.store.head(&format!("files/{id}.jsonl")).await.unwrap().is_none());
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn uploads_beyond_the_limit_are_413_and_leave_nothing(pool: sqlx::PgPool) {
    let app =
        app_with(pool.clone(), api_config(), |state| state.limits.max_upload_bytes = 1000).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let line = b"{\"prompt\": \"0123456789012345678901234567890123456789\"}\n";
    let big: Vec<u8> = line.iter().copied().cycle().take(line.len() * 40).collect();
    let reply = upload(&app.router, &key, "big.jsonl", &big).await;
    assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, Some("file"));
    assert_eq!(get(&app.router, "/v1/files", &key).await.json()["data"], json!([]));
    assert!(app.state.store.list("files/").await.unwrap().is_empty());
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn job_creation_validates_every_field(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let file_id = upload(&app.router, &key, "t.jsonl", DATASET).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let bad_file = upload(&app.router, &key, "b.jsonl", b"[1]\n").await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ok = json!({"model": "tiny", "training_file": file_id, "method": method()});
    let with = |field: &str, value: Value| {
        let mut body = ok.clone();
        body[field] = value;
        body
    };
    let cases = [
        (with("model", json!("nope")), "model"),
        (with("training_file", json!("file-missing")), "training_file"),
        (with("training_file", json!(bad_file)), "training_file"),
        (with("validation_file", json!("file-missing")), "validation_file"),
        (with("method", json!({"type": "distillation"})), "method.type"),
        // a supervised job reads chats: the prompt rows of this file have no assistant message
        (with("method", json!({"type": "supervised"})), "training_file"),
        (with("method", json!({"type": "reinforcement"})), "method.reinforcement"),
        (
            with("method", json!({"type": "reinforcement", "reinforcement": {"grader": []}})),
            "method.reinforcement.grader",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": {"name": "x"}}}),
            ),
            "method.reinforcement.grader.type",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": {"type": "math"}}}),
            ),
            "method.reinforcement.grader",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": {"type": "string_check", "name": "x", "input": "{{sample.output_text}}", "reference": "a", "operation": "nearly"}}}),
            ),
            "method.reinforcement.grader.operation",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "hyperparameters": 3}}),
            ),
            "method.reinforcement.hyperparameters",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "hyperparameters": {"group_size": 1}}}),
            ),
            "method.reinforcement.hyperparameters.group_size",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "hyperparameters": {"bogus": 1}}}),
            ),
            "method.reinforcement.hyperparameters.bogus",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "hyperparameters": {"rollout_dtype": "fp8"}}}),
            ),
            "method.reinforcement.hyperparameters.rollout_dtype",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "extra": 1}}),
            ),
            "method.reinforcement",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "hyperparameters": {"compute_multiplier": "lots"}}}),
            ),
            "method.reinforcement.hyperparameters.compute_multiplier",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "hyperparameters": {"compute_multiplier": -2}}}),
            ),
            "method.reinforcement.hyperparameters.compute_multiplier",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "environment": {"tools": []}}}),
            ),
            "method.reinforcement.environment.tools",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "environment": {"tools": [{"type": "python", "limits": {"timeout_ms": 0}}]}}}),
            ),
            "method.reinforcement.environment.tools[0].limits.timeout_ms",
        ),
        (
            with(
                "method",
                json!({"type": "reinforcement", "reinforcement": {"grader": method()["reinforcement"]["grader"].clone(), "environment": {"tools": [{"type": "calculator"}], "parallel_tool_calls": "yes"}}}),
            ),
            "method.reinforcement.environment.parallel_tool_calls",
        ),
        (with("suffix", json!("has space")), "suffix"),
        (with("metadata", json!({"k": 1})), "metadata.k"),
        (with("metadata", json!({"k": "v".repeat(513)})), "metadata.k"),
        (
            with("integrations", json!([{"type": "wandb", "wandb": {"project": "p"}}])),
            "integrations",
        ),
        (with("hyperparameters", json!({"n_epochs": 2})), "hyperparameters"),
        (json!({"training_file": file_id, "method": method()}), "model"),
        (json!({"model": "tiny", "method": method()}), "training_file"),
        // no `method` is OpenAI's legacy supervised job, which reads chats: these are prompts
        (json!({"model": "tiny", "training_file": file_id}), "training_file"),
    ];
    for (body, param) in cases {
        assert_error(
            &post(&app.router, "/v1/fine_tuning/jobs", &key, body).await,
            StatusCode::BAD_REQUEST,
            Some(param),
        );
    }
    assert_eq!(
        get(&app.router, "/v1/fine_tuning/jobs", &key).await.json()["data"],
        json!([]),
        "bad input changed nothing"
    );

    let mut body = with("suffix", json!("mine"));
    body["seed"] = json!(7);
    body["metadata"] = json!({"team": "rl"});
    let job = post(&app.router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(job.status, StatusCode::OK, "{:?}", job.json());
    let job = job.json();
    assert!(job["id"].as_str().unwrap().starts_with("ftjob-"));
    assert_eq!(job["object"], "fine_tuning.job");
    assert_eq!(job["status"], "queued");
    assert_eq!(job["model"], "tiny");
    assert_eq!(job["seed"], 7);
    assert_eq!(job["suffix"], "mine");
    assert_eq!(job["metadata"], json!({"team": "rl"}));
    assert_eq!(job["method"]["reinforcement"]["grader"], method()["reinforcement"]["grader"]);
    let hp = &job["hyperparameters"];
    assert_eq!(job["method"]["reinforcement"]["hyperparameters"], *hp, "one resolved set");
    for (field, value) in [
        ("n_epochs", json!(1)),
        ("batch_size", json!(2)),
        ("learning_rate_multiplier", json!(1.0)),
        ("compute_multiplier", json!(1.0)),
        ("reasoning_effort", json!("medium")),
        ("eval_interval", json!(0)),
        ("eval_samples", json!(4)),
        ("group_size", json!(8)),
        ("max_completion_tokens", json!(256)),
    ] {
        assert_eq!(hp[field], value, "{field} resolved");
    }
    assert!(job["integrations"].is_null() && job["result_files"] == json!([]));
    assert_eq!(job["training_file"], file_id);
    for null_field in
        ["error", "fine_tuned_model", "finished_at", "trained_tokens", "estimated_finish"]
    {
        assert!(job[null_field].is_null(), "{null_field}");
    }
    assert!(job["created_at"].is_i64());
    let id = job["id"].as_str().unwrap();
    assert_eq!(get(&app.router, &format!("/v1/fine_tuning/jobs/{id}"), &key).await.json(), job);
    let list = get(&app.router, "/v1/fine_tuning/jobs?limit=1", &key).await.json();
    assert_eq!(list["data"][0]["id"], id);
    assert_eq!(list["has_more"], false);
}

/// Uploads `content`; its file id and status.
async fn uploaded(app: &TestApp, key: &str, content: &str) -> (String, String) {
    let reply = upload(&app.router, key, "rows.jsonl", content.as_bytes()).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let file = reply.json();
    (file["id"].as_str().unwrap().to_string(), file["status"].as_str().unwrap().to_string())
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn job_creation_checks_every_row_for_what_the_job_reads(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let job = |training: &str, validation: Option<&str>, method: Value| {
        let mut body = json!({"model": "tiny", "training_file": training, "method": method});
        if let Some(validation) = validation {
            body["validation_file"] = json!(validation);
        }
        post(&app.router, "/v1/fine_tuning/jobs", &key, body)
    };
    let refused = |reply: &Reply, param: &str, needles: &[&str]| {
        assert_error(reply, StatusCode::BAD_REQUEST, Some(param));
        let error = &reply.json()["error"];
        assert_eq!(error["code"], "invalid_file", "{error}");
        let message = error["message"].as_str().unwrap();
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    };
    // A multi grader whose sub-grader reads a nested field.
    let multi = json!({"type": "reinforcement", "reinforcement": {"grader": {
    "type": "multi", "calculate_output": "0.5 * exact + 0.5 * math",
    "graders": {
        "exact": method()["reinforcement"]["grader"].clone(),
        "math": {"type": "math", "reference": "{{ item.meta.answer }}"}
    }}}});

    // Rows without `reference_answer` pass the upload (it does not know the grader) ...
    let (no_answer, status) = uploaded(
        &app,
        &key,
        "{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n{\"prompt\": \"3+3?\"}\n\n{\"prompt\": \"1+1?\", \"reference_answer\": null}\n",
    )
    .await;
    assert_eq!(status, "processed");
    // ... and are refused when a job's grader reads it: the first line and field, then the rest.
    refused(
        &job(&no_answer, None, method()).await,
        "training_file",
        &["line 2", "`reference_answer`", "{{item.reference_answer}}", "also line(s) 4"],
    );
    // Rows without a prompt are refused at upload, and a job names the line and field.
    let (no_prompt, status) = uploaded(
        &app,
        &key,
        "{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n{\"reference_answer\": \"6\"}\n",
    )
    .await;
    assert_eq!(status, "error");
    refused(&job(&no_prompt, None, method()).await, "training_file", &["line 2", "`messages`"]);
    // Fields read inside a multi grader count; so does the validation file.
    let flat = "{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n";
    let nested = "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"reference_answer\": \"4\", \"meta\": {\"answer\": \"4\"}}\n";
    let (flat_file, _) = uploaded(&app, &key, flat).await;
    let (nested_file, _) = uploaded(&app, &key, &format!("{nested}{flat}")).await;
    refused(
        &job(&nested_file, None, multi.clone()).await,
        "training_file",
        &["line 2", "`meta.answer`"],
    );
    let (good_file, _) = uploaded(&app, &key, &nested.repeat(3)).await;
    refused(
        &job(&good_file, Some(&flat_file), multi.clone()).await,
        "validation_file",
        &["line 1", "`meta.answer`", "{{item.meta.answer}}"],
    );
    assert_eq!(
        get(&app.router, "/v1/fine_tuning/jobs", &key).await.json()["data"],
        json!([]),
        "nothing was enqueued"
    );

    // Files with every field go through, for either grader.
    let ok = job(&good_file, Some(&good_file), multi).await;
    assert_eq!(ok.status, StatusCode::OK, "{:?}", ok.json());
    let ok = job(&flat_file, None, method()).await;
    assert_eq!(ok.status, StatusCode::OK, "{:?}", ok.json());
    assert_eq!(
        get(&app.router, "/v1/fine_tuning/jobs", &key).await.json()["data"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cancel_pause_resume_follow_the_queue(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let (_, job) = file_and_job(&app, &key).await;
    let action = |name: &str| format!("/v1/fine_tuning/jobs/{job}/{name}");

    assert_eq!(
        post(&app.router, &action("pause"), &key, json!({})).await.json()["status"],
        "paused"
    );
    assert_error(
        &post(&app.router, &action("pause"), &key, json!({})).await,
        StatusCode::CONFLICT,
        None,
    );
    assert_eq!(
        post(&app.router, &action("resume"), &key, json!({})).await.json()["status"],
        "queued"
    );

    // A running job gets a pending request that its worker sees.
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    let paused = post(&app.router, &action("pause"), &key, json!({})).await.json();
    assert_eq!(
        (paused["status"].as_str(), paused["pending_control"].as_str()),
        (Some("running"), Some("pause"))
    );
    let cancelled = post(&app.router, &action("cancel"), &key, json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.json());
    lease.ack_cancel().await.unwrap();
    assert_eq!(
        get(&app.router, &format!("/v1/fine_tuning/jobs/{job}"), &key).await.json()["status"],
        "cancelled"
    );
    let again = post(&app.router, &action("cancel"), &key, json!({})).await;
    assert_error(&again, StatusCode::CONFLICT, None);
    assert!(again.json()["error"]["message"].as_str().unwrap().contains("cancelled"));
    assert_error(
        &post(&app.router, &action("resume"), &key, json!({})).await,
        StatusCode::CONFLICT,
        None,
    );

    // Events: newest first, paginated with `after`.
    let events =
        get(&app.router, &format!("/v1/fine_tuning/jobs/{job}/events?limit=2"), &key).await.json();
    assert_eq!(events["data"].as_array().unwrap().len(), 2);
    assert_eq!(events["has_more"], true);
    assert_eq!(events["data"][0]["object"], "fine_tuning.job.event");
    assert!(events["data"][0]["message"].as_str().unwrap().contains("cancelled"));
    let after = events["last_id"].as_str().unwrap();
    let older = get(
        &app.router,
        &format!("/v1/fine_tuning/jobs/{job}/events?limit=100&after={after}"),
        &key,
    )
    .await
    .json();
    let all: Vec<&str> =
        older["data"].as_array().unwrap().iter().map(|e| e["message"].as_str().unwrap()).collect();
    assert_eq!(all.last(), Some(&"job created in state queued"), "{all:?}");
    assert_error(
        &get(&app.router, &format!("/v1/fine_tuning/jobs/{job}/events?after=x"), &key).await,
        StatusCode::BAD_REQUEST,
        Some("after"),
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn checkpoints_metrics_and_samples(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let (_, job) = file_and_job(&app, &key).await;

    // Play the worker: metrics, a published checkpoint, samples.
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    for step in 1..=3 {
        let reward = [0.1, 0.2, 0.3][step as usize - 1];
        lease.metric(step, &json!({"reward_mean": reward, "kl": 0.01})).await.unwrap();
    }
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("model.safetensors"), vec![7u8; 1000]).unwrap();
    std::fs::write(folder.path().join("trainer_state.safetensors"), vec![9u8; 2000]).unwrap();
    std::fs::write(folder.path().join("config.json"), b"{\"layers\": 2}").unwrap();
    let prefix = format!("jobs/{job}/checkpoints/step-2");
    publish_folder(app.state.store.as_ref(), folder.path(), &prefix).await.unwrap();
    let ckpt =
        lease.checkpoint(2, &prefix, 1013, Some(&json!({"reward_mean": 0.2}))).await.unwrap();
    let samples_key = format!("jobs/{job}/samples/step-1.jsonl");
    let lines = "{\"completion\": \"4\", \"scores\": {\"exact\": 1.0}}\n{\"completion\": \"5\", \"scores\": {\"exact\": 0.0}}\n{\"completion\": \"6\"}\n";
    app.state.store.put_bytes(&samples_key, bytes::Bytes::from(lines)).await.unwrap();
    let rows: Vec<SampleIndexRow> = (0..3)
        .map(|i| SampleIndexRow {
            idx: i,
            prompt_idx: i / 2,
            score: Some([1.0, 0.0, 0.5][i as usize]),
            advantage: Some(0.0),
            finish_reason: Some("stop".into()),
            storage_key: samples_key.clone(),
            line_no: i,
        })
        .collect();
    lease.samples(1, &rows).await.unwrap();
    let base = format!("/v1/fine_tuning/jobs/{job}");

    let metrics = get(&app.router, &format!("{base}/metrics"), &key).await.json();
    assert_eq!(metrics["data"].as_array().unwrap().len(), 3);
    assert_eq!(metrics["data"][1], json!({"step": 2, "reward_mean": 0.2, "kl": 0.01}));
    assert_eq!(
        get(&app.router, &format!("{base}/metrics"), &key).await.json(),
        metrics,
        "the same answer again"
    );
    lease.metric(2, &json!({"reward_mean": 0.25})).await.unwrap();
    lease.metric(4, &json!({"reward_mean": 0.4})).await.unwrap();
    let updated = get(&app.router, &format!("{base}/metrics"), &key).await.json();
    assert_eq!(updated["data"].as_array().unwrap().len(), 4, "a new step invalidates the cache");
    assert_eq!(
        updated["data"][1],
        json!({"step": 2, "reward_mean": 0.25}),
        "a rewritten step invalidates the cache"
    );
    let csv = get(&app.router, &format!("{base}/metrics?format=csv"), &key).await;
    assert_eq!(csv.headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(
        std::str::from_utf8(&csv.bytes).unwrap(),
        "step,kl,reward_mean\n1,0.01,0.1\n2,,0.25\n3,0.01,0.3\n4,,0.4\n"
    );
    assert_error(
        &get(&app.router, &format!("{base}/metrics?format=xml"), &key).await,
        StatusCode::BAD_REQUEST,
        Some("format"),
    );
    assert_eq!(updated["has_more"], false);
    // Incremental polling: steps after the last one seen, a page at a time.
    let page = get(&app.router, &format!("{base}/metrics?after_step=1&limit=2"), &key).await.json();
    let steps: Vec<i64> =
        page["data"].as_array().unwrap().iter().map(|r| r["step"].as_i64().unwrap()).collect();
    assert_eq!((steps, &page["has_more"]), (vec![2, 3], &json!(true)));
    let rest = get(&app.router, &format!("{base}/metrics?after_step=3"), &key).await.json();
    assert_eq!(
        (rest["data"].clone(), &rest["has_more"]),
        (json!([{"step": 4, "reward_mean": 0.4}]), &json!(false))
    );
    let none = get(&app.router, &format!("{base}/metrics?after_step=4"), &key).await.json();
    assert_eq!((none["data"].clone(), &none["has_more"]), (json!([]), &json!(false)));
    let csv_page =
        get(&app.router, &format!("{base}/metrics?format=csv&after_step=2&limit=1"), &key).await;
    assert_eq!(std::str::from_utf8(&csv_page.bytes).unwrap(), "step,kl,reward_mean\n3,0.01,0.3\n");
    for bad in ["limit=0", "limit=10001", "after_step=x"] {
        let response = get(&app.router, &format!("{base}/metrics?{bad}"), &key).await;
        assert_eq!(response.status, StatusCode::BAD_REQUEST, "{bad}");
    }

    let list = get(&app.router, &format!("{base}/checkpoints"), &key).await.json();
    let c = &list["data"][0];
    assert_eq!(c["id"], ckpt.as_str());
    assert_eq!(c["object"], "fine_tuning.job.checkpoint");
    assert_eq!(c["step_number"], 2);
    assert_eq!(c["metrics"]["step"], 2);
    assert_eq!(c["fine_tuning_job_id"], job.as_str());
    assert_eq!(c["fine_tuned_model_checkpoint"], format!("ft:tiny:acme::{job}:ckpt-step-2"));

    // The archive holds every file of the manifest but the optimizer state, byte for byte;
    // `include=trainer_state` adds it.
    let archive_names = |archive: &Reply| {
        assert_eq!(archive.status, StatusCode::OK);
        assert_eq!(archive.headers["content-length"], archive.bytes.len().to_string());
        let mut tar = tar::Archive::new(&archive.bytes[..]);
        let mut names = Vec::new();
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut content = Vec::new();
            entry.read_to_end(&mut content).unwrap();
            if name.ends_with("/model.safetensors") {
                assert_eq!(content, vec![7u8; 1000]);
            }
            if name.ends_with("/trainer_state.safetensors") {
                assert_eq!(content, vec![9u8; 2000]);
            }
            names.push(name);
        }
        names
    };
    let content = format!("{base}/checkpoints/{ckpt}/content");
    let weights_only = archive_names(&get(&app.router, &content, &key).await);
    assert_eq!(
        weights_only,
        vec![format!("{ckpt}/config.json"), format!("{ckpt}/model.safetensors")]
    );
    let full =
        archive_names(&get(&app.router, &format!("{content}?include=trainer_state"), &key).await);
    assert_eq!(
        full,
        vec![
            format!("{ckpt}/config.json"),
            format!("{ckpt}/model.safetensors"),
            format!("{ckpt}/trainer_state.safetensors")
        ]
    );
    assert_error(
        &get(&app.router, &format!("{content}?include=optimizer"), &key).await,
        StatusCode::BAD_REQUEST,
        Some("include"),
    );
    // One file of the HF folder, streamed.
    let one = get(&app.router, &format!("{content}?path=model.safetensors"), &key).await;
    assert_eq!((one.status, one.bytes.to_vec()), (StatusCode::OK, vec![7u8; 1000]));
    assert_eq!(one.headers["content-length"], "1000");
    assert_error(
        &get(&app.router, &format!("{content}?path=nope"), &key).await,
        StatusCode::BAD_REQUEST,
        Some("path"),
    );

    // Redirect to a signed URL, which the server itself serves.
    let redirect = get(
        &app.router,
        &format!("{base}/checkpoints/{ckpt}/content?redirect=1&path=config.json"),
        &key,
    )
    .await;
    assert_eq!(redirect.status, StatusCode::FOUND);
    let location = redirect.headers["location"].to_str().unwrap().to_string();
    let local = location.strip_prefix(PUBLIC_URL).unwrap();
    let object = call(&app.router, Method::GET, local, None, None).await;
    assert_eq!(object.status, StatusCode::OK);
    assert_eq!(&object.bytes[..], b"{\"layers\": 2}");
    let forged = local.replace("signature=", "signature=00");
    assert_error(
        &call(&app.router, Method::GET, &forged, None, None).await,
        StatusCode::FORBIDDEN,
        None,
    );
    assert_error(
        &get(&app.router, &format!("{base}/checkpoints/{ckpt}/content?redirect=1&path=nope"), &key)
            .await,
        StatusCode::BAD_REQUEST,
        Some("path"),
    );

    // Samples: filters and pagination, with the stored line attached.
    let all = get(&app.router, &format!("{base}/samples?step=1"), &key).await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 3);
    assert_eq!(all["data"][1]["sample"]["completion"], "5");
    let good = get(&app.router, &format!("{base}/samples?min_score=0.5"), &key).await.json();
    let ids: Vec<&str> =
        good["data"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["sample-1-0", "sample-1-2"]);
    let page =
        get(&app.router, &format!("{base}/samples?limit=1&max_score=0.5"), &key).await.json();
    assert_eq!(
        (page["data"][0]["id"].as_str(), page["has_more"].as_bool()),
        (Some("sample-1-1"), Some(true))
    );
    let next =
        get(&app.router, &format!("{base}/samples?limit=1&max_score=0.5&after=sample-1-1"), &key)
            .await
            .json();
    assert_eq!(next["data"][0]["score"], 0.5);
    assert!(get(&app.router, &format!("{base}/samples?step=9"), &key).await.json()["data"]
        .as_array()
        .unwrap()
        .is_empty());

    // Models list the checkpoint; deleting it removes row and files.
    let models = get(&app.router, "/v1/models", &key).await.json();
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(
        ids.contains(&"tiny") && ids.contains(&format!("ft:tiny:acme::{job}:ckpt-step-2").as_str()),
        "{ids:?}"
    );
    let deleted =
        call(&app.router, Method::DELETE, &format!("{base}/checkpoints/{ckpt}"), Some(&key), None)
            .await;
    assert_eq!(deleted.json()["deleted"], true);
    assert!(app.state.store.list(&format!("{prefix}/")).await.unwrap().is_empty());
    assert_error(
        &get(&app.router, &format!("{base}/checkpoints/{ckpt}/content"), &key).await,
        StatusCode::NOT_FOUND,
        None,
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn models_register_and_roles(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let member = user(&pool, "m@x.io", "acme", "member").await;
    let admin = user(&pool, "a@x.io", "acme", "admin").await;
    app.state
        .store
        .put_bytes("models/small/config.json", bytes::Bytes::from_static(b"{}"))
        .await
        .unwrap();
    let body = json!({"id": "small", "storage_prefix": "models/small"});
    assert_error(
        &post(&app.router, "/v1/models", &member, body.clone()).await,
        StatusCode::FORBIDDEN,
        None,
    );
    assert_error(
        &post(
            &app.router,
            "/v1/models",
            &admin,
            json!({"id": "x", "storage_prefix": "models/none"}),
        )
        .await,
        StatusCode::NOT_FOUND,
        Some("storage_prefix"),
    );
    assert_error(
        &post(&app.router, "/v1/models", &admin, json!({"id": "x", "storage_prefix": "../etc"}))
            .await,
        StatusCode::BAD_REQUEST,
        Some("storage_prefix"),
    );
    let registered = post(&app.router, "/v1/models", &admin, body.clone()).await;
    assert_eq!(registered.status, StatusCode::OK, "{:?}", registered.json());
    assert_eq!(registered.json()["kind"], "base");
    assert_error(&post(&app.router, "/v1/models", &admin, body).await, StatusCode::CONFLICT, None);
    // Publishing to every org is the operator's act (`verity models share`), not an org admin's.
    let shared = post(
        &app.router,
        "/v1/models",
        &admin,
        json!({"id": "shared-small", "storage_prefix": "models/small", "shared": true}),
    )
    .await;
    assert_error(&shared, StatusCode::FORBIDDEN, Some("shared"));
    assert!(shared.json()["error"]["message"].as_str().unwrap().contains("verity models share"));
    verity_core::models::insert_base_model(
        &pool,
        None,
        "shared-small",
        "models/small",
        "hf",
        &json!({}),
    )
    .await
    .unwrap();
    let shared = get(&app.router, "/v1/models/shared-small", &admin).await;
    assert_eq!(shared.json()["owned_by"], "verity");
    let other = user(&pool, "o@y.io", "other", "member").await;
    let ids: Vec<String> = get(&app.router, "/v1/models", &other).await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["shared-small"], "the org's private model is not visible elsewhere");
    // `client.models.retrieve`: the org's own model, a shared one; another org's is a 404.
    let own = get(&app.router, "/v1/models/small", &admin).await;
    assert_eq!(own.status, StatusCode::OK, "{:?}", own.json());
    assert_eq!(
        (own.json()["id"].as_str(), own.json()["object"].as_str()),
        (Some("small"), Some("model"))
    );
    assert_eq!(get(&app.router, "/v1/models/shared-small", &other).await.status, StatusCode::OK);
    let hidden = get(&app.router, "/v1/models/small", &other).await;
    assert_error(&hidden, StatusCode::NOT_FOUND, Some("model"));
    assert_eq!(hidden.json()["error"]["code"], "model_not_found");

    // `client.models.delete`: admins only; not while an unfinished job starts from it; never a
    // shared model; the registration goes, another org's name stays hidden.
    let delete = |key: &str, id: &str| {
        let (router, key, uri) = (app.router.clone(), key.to_string(), format!("/v1/models/{id}"));
        async move { call(&router, Method::DELETE, &uri, Some(&key), None).await }
    };
    assert_error(&delete(&member, "small").await, StatusCode::FORBIDDEN, None);
    assert_error(&delete(&other, "small").await, StatusCode::FORBIDDEN, None);
    let org: uuid::Uuid = sqlx::query_scalar("SELECT org_id FROM users WHERE email = 'a@x.io'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let user_job = app
        .state
        .queue
        .enqueue(&verity_core::queue::NewJob::new(org, "small", json!({})))
        .await
        .unwrap();
    let busy = delete(&admin, "small").await;
    assert_error(&busy, StatusCode::CONFLICT, Some("model"));
    assert!(busy.json()["error"]["message"].as_str().unwrap().contains(&user_job));
    app.state.queue.cancel(&user_job).await.unwrap();
    assert_error(&delete(&admin, "shared-small").await, StatusCode::FORBIDDEN, Some("model"));
    let deleted = delete(&admin, "small").await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.json());
    assert_eq!(deleted.json(), json!({"id": "small", "object": "model", "deleted": true}));
    assert_error(
        &get(&app.router, "/v1/models/small", &admin).await,
        StatusCode::NOT_FOUND,
        Some("model"),
    );
    assert_error(&delete(&admin, "small").await, StatusCode::NOT_FOUND, Some("model"));
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn prometheus_and_openapi(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    file_and_job(&app, &key).await;
    let text = call(&app.router, Method::GET, "/metrics", None, None).await;
    let text = String::from_utf8(text.bytes.to_vec()).unwrap();
    assert!(text.contains("verity_jobs{state=\"queued\"} 1"), "{text}");
    assert!(text.contains("verity_queue_depth 1"));
    assert!(text.contains("verity_workers_seen 0"));
    assert!(text.contains("verity_http_requests_total{method=\"POST\",route=\"/v1/fine_tuning/jobs\",status=\"200\"} 1"), "{text}");
    assert!(
        text.contains(
            "verity_http_request_duration_seconds_bucket{route=\"/v1/files\",le=\"+Inf\"} 1"
        ),
        "{text}"
    );
    let doc = call(&app.router, Method::GET, "/openapi.json", None, None).await.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/files",
        "/v1/fine_tuning/jobs/{job_id}/checkpoints",
        "/v1/auth/token",
        "/v1/models",
        "/v1/verity/loss_presets",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn loss_presets_come_from_the_spec_and_make_valid_jobs(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let anonymous = call(&app.router, Method::GET, "/v1/verity/loss_presets", None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let reply = get(&app.router, "/v1/verity/loss_presets", &key).await;
    assert_eq!(reply.status, StatusCode::OK);
    let presets = reply.json()["data"].as_array().unwrap().clone();
    let ids: Vec<&str> = presets.iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(ids, verity_core::spec::Loss::ALL.map(|l| l.as_str()));
    let dapo = &presets[1];
    assert_eq!(dapo["label"], "DAPO");
    assert_eq!(
        dapo["hyperparameters"],
        json!({"loss": "dapo", "epsilon_low": 0.2, "epsilon_high": 0.28, "scale_rewards": true,
               "dynamic_sampling": true, "beta": 0.0})
    );
    let file = upload(&app.router, &key, "train.jsonl", DATASET).await.json()["id"].clone();
    for preset in &presets {
        let mut method = method();
        let hp = method["reinforcement"]["hyperparameters"].as_object_mut().unwrap();
        hp.extend(preset["hyperparameters"].as_object().unwrap().clone());
        let job = post(
            &app.router,
            "/v1/fine_tuning/jobs",
            &key,
            json!({"model": "tiny", "training_file": file, "method": method}),
        )
        .await;
        assert_eq!(job.status, StatusCode::OK, "{}: {:?}", preset["id"], job.json());
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn grader_runs_beyond_the_concurrency_limit_wait_then_get_503(pool: sqlx::PgPool) {
    let config = ApiConfig { grader_concurrency: 2, grader_wait_ms: 300, ..api_config() };
    let app = app_with(pool.clone(), config, |_| {}).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let uri = "/v1/fine_tuning/alpha/graders/run";
    let grader = json!({"type": "text_similarity", "input": "{{sample.output_text}}", "reference": "{{item.r}}", "evaluation_metric": "fuzzy_match"});
    let body =
        |sample: &str, r: &str| json!({"grader": grader, "model_sample": sample, "item": {"r": r}});
    // Both slots are taken (as by two long gradings in flight): a third run waits, then is refused.
    let slots = app.state.grader_slots.permits.clone();
    let held = slots.clone().acquire_many_owned(2).await.unwrap();
    let refused = post(&app.router, uri, &key, body("cat", "cat")).await;
    assert_error(&refused, StatusCode::SERVICE_UNAVAILABLE, None);
    assert_eq!(refused.json()["error"]["code"], "graders_busy");
    assert_eq!(refused.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    // A run that finds a slot freed while it waits is answered.
    let waiting = tokio::spawn({
        let (router, key) = (app.router.clone(), key.clone());
        let body = body("cat", "cat");
        async move { post(&router, uri, &key, body).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    drop(held);
    let answered = waiting.await.unwrap();
    assert_eq!(answered.status, StatusCode::OK, "{:?}", answered.json());
    assert_eq!(answered.json()["reward"], 1.0);
    // Every slot is back once the runs end; an over-long text is graded on its capped prefix.
    assert_eq!(slots.available_permits(), 2);
    let long = "abcdefghij".repeat(25_000);
    let capped = post(&app.router, uri, &key, body(&long, &long)).await;
    assert_eq!(capped.status, StatusCode::OK, "{:?}", capped.json());
    assert_eq!(capped.json()["reward"], 1.0);
    let reason =
        capped.json()["metadata"]["verity"]["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("compared only the first 20000 characters"), "{reason}");
    // Many runs at once: each is answered (200) or refused with 503 (every slot taken) or 429
    // (the org runs as many as it may: one, half of the two slots), none fails otherwise.
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let (router, key, body) = (app.router.clone(), key.clone(), body(&long, &long));
            tokio::spawn(async move { post(&router, uri, &key, body).await.status })
        })
        .collect();
    for run in runs {
        let status = run.await.unwrap();
        let busy = [StatusCode::SERVICE_UNAVAILABLE, StatusCode::TOO_MANY_REQUESTS];
        assert!(status == StatusCode::OK || busy.contains(&status), "{status}");
    }
    assert_eq!(slots.available_permits(), 2);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn grader_run_and_validate_endpoints(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let math = json!({"type": "math", "name": "acc", "reference": "{{item.answer}}"});
    let run =
        |sample: &str, item: Value| json!({"grader": math, "model_sample": sample, "item": item});
    let reply = post(
        &app.router,
        "/v1/fine_tuning/alpha/graders/run",
        &key,
        run("So it is \\boxed{\\frac{3}{4}}.", json!({"answer": "0.75"})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    assert_eq!(reply.json()["reward"], 1.0);
    let wrong = post(
        &app.router,
        "/v1/fine_tuning/alpha/graders/run",
        &key,
        run("\\boxed{2} or \\boxed{3}", json!({"answer": "3"})),
    )
    .await;
    assert_eq!(wrong.json()["reward"], 0.0, "several different answers score 0");
    // A field the grader reads is missing: an error result, not a wrong answer.
    let missing =
        post(&app.router, "/v1/fine_tuning/alpha/graders/run", &key, run("\\boxed{3}", json!({})))
            .await;
    assert_eq!(missing.status, StatusCode::OK);
    let errors = &missing.json()["metadata"]["errors"];
    assert_eq!(errors["invalid_variable_error"], true, "{:?}", missing.json());
    let invalid = json!({"grader": {"type": "math", "reference": "1", "extract": "telepathy"}, "model_sample": "1"});
    assert_error(
        &post(&app.router, "/v1/fine_tuning/alpha/graders/run", &key, invalid).await,
        StatusCode::BAD_REQUEST,
        Some("grader.extract"),
    );
    let valid =
        post(&app.router, "/v1/fine_tuning/alpha/graders/validate", &key, json!({"grader": math}))
            .await;
    assert_eq!(valid.status, StatusCode::OK);
    assert_eq!(valid.json()["grader"], math);
    let bad = json!({"grader": {"type": "multi", "graders": {"a": math}, "calculate_output": "a + import"}});
    assert_eq!(
        post(&app.router, "/v1/fine_tuning/alpha/graders/validate", &key, bad).await.status,
        StatusCode::BAD_REQUEST
    );
    let anonymous = tower::ServiceExt::oneshot(
        app.router.clone(),
        axum::http::Request::post("/v1/fine_tuning/alpha/graders/validate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(json!({"grader": math}).to_string()))
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
}

/// graders/validate runs a python grader once in the real sandbox, as OpenAI does (#50): a
/// source that does not load is a 400 naming its `source` and the problem; a `grade()` failing
/// only on the trial's empty row passes; other grader kinds are not run.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn validate_runs_python_graders_once(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let validate = |grader: Value| {
        let router = app.router.clone();
        let key = key.clone();
        async move {
            post(&router, "/v1/fine_tuning/alpha/graders/validate", &key, json!({"grader": grader}))
                .await
        }
    };
    let python = |source: &str| json!({"type": "python", "source": source});
    let missing = validate(python(
        "import some_missing_module\n\ndef grade(sample, item):\n    return 1.0\n",
    ))
    .await;
    assert_error(&missing, StatusCode::BAD_REQUEST, Some("grader.source"));
    let message = missing.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("No module named 'some_missing_module'"), "{message}");
    let syntax = validate(python("def grade(sample, item)\n    return 1.0\n")).await;
    assert_error(&syntax, StatusCode::BAD_REQUEST, Some("grader.source"));
    assert!(syntax.json()["error"]["message"].as_str().unwrap_or_default().contains("SyntaxError"));
    let nested = json!({"type": "multi", "calculate_output": "a",
        "graders": {"a": python("import some_missing_module\ndef grade(s, i):\n    return 1\n")}});
    assert_error(&validate(nested).await, StatusCode::BAD_REQUEST, Some("grader.graders.a.source"));
    // OpenAI's own validation example: grade() reads item fields the trial row lacks
    let reads_item = python("def grade(sample, item) -> float:\n    return 1.0 if sample['output_text'] == item['reference_answer'] else 0.0\n");
    let valid = validate(reads_item.clone()).await;
    assert_eq!(valid.status, StatusCode::OK, "{:?}", valid.json());
    assert_eq!(valid.json()["grader"], reads_item);
}

/// Polls `GET uri` until `check` holds for its answer (change announcements are asynchronous);
/// the last answer, or `None` if it never held.
async fn answer_becomes(
    app: &TestApp,
    key: &str,
    uri: &str,
    check: impl Fn(&Value) -> bool,
) -> Option<Value> {
    for _ in 0..250 {
        let answer = get(&app.router, uri, key).await.json();
        if check(&answer) {
            return Some(answer);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    None
}

/// Polls `GET` of the job until `check` holds for it.
async fn job_becomes(app: &TestApp, key: &str, job: &str, check: impl Fn(&Value) -> bool) -> bool {
    answer_becomes(app, key, &format!("/v1/fine_tuning/jobs/{job}"), check).await.is_some()
}

/// An app that follows job changes, two users of different orgs and a job of the first.
async fn listening_app_with_job(
    pool: &sqlx::PgPool,
) -> (TestApp, tokio::task::JoinHandle<()>, String, String, String) {
    let app = app(pool.clone()).await;
    let listener = app.state.start_job_change_listener().await.expect("LISTEN works");
    base_model(&app).await;
    let key = user(pool, "a@x.io", "acme", "member").await;
    let other = user(pool, "b@y.io", "globex", "member").await;
    let (_, job) = file_and_job(&app, &key).await;
    (app, listener, key, other, job)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cached_job_rows_follow_changes_made_elsewhere(pool: sqlx::PgPool) {
    let (app, listener, key, other, job) = listening_app_with_job(&pool).await;
    let uri = format!("/v1/fine_tuning/jobs/{job}");

    assert_eq!(get(&app.router, &uri, &key).await.json()["status"], "queued");
    assert!(app.state.job_cache.get(&job).is_some(), "a read job is cached");
    // The cached copy is still scoped to its org.
    assert_error(&get(&app.router, &uri, &other).await, StatusCode::NOT_FOUND, None);

    // A worker (another process, as far as this server knows) claims it: the row changes in
    // the database, and the announcement replaces the cached copy.
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    assert!(
        job_becomes(&app, &key, &job, |j| j["status"] == "running").await,
        "the claim never showed"
    );
    // This server's own change shows at once.
    let paused = post(&app.router, &format!("{uri}/pause"), &key, json!({})).await.json();
    assert_eq!(paused["pending_control"], "pause");
    assert_eq!(get(&app.router, &uri, &key).await.json()["pending_control"], "pause");
    lease.ack_pause().await.unwrap();
    assert!(
        job_becomes(&app, &key, &job, |j| j["status"] == "paused").await,
        "the pause never showed"
    );
    // A change made straight in the database shows too.
    sqlx::query("UPDATE jobs SET metadata = '{\"team\": \"rl\"}' WHERE id = $1")
        .bind(&job)
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        job_becomes(&app, &key, &job, |j| j["metadata"]["team"] == "rl").await,
        "a direct UPDATE never showed"
    );
    // Let the test database go: the listener holds a connection to it.
    listener.abort();
    let _ = listener.await;
}

/// Polls a metrics URI until `check` holds for its answer.
async fn metrics_become(
    app: &TestApp,
    key: &str,
    uri: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    match answer_becomes(app, key, uri, check).await {
        Some(answer) => answer,
        None => panic!("{uri} never showed the change"),
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cached_metrics_follow_new_and_rewritten_steps(pool: sqlx::PgPool) {
    let (app, listener, key, other, job) = listening_app_with_job(&pool).await;
    let uri = format!("/v1/fine_tuning/jobs/{job}/metrics");
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();

    let empty = get(&app.router, &uri, &key).await.json();
    assert_eq!((empty["data"].clone(), &empty["has_more"]), (json!([]), &json!(false)));
    for step in 1..=5 {
        lease.metric(step, &json!({"reward_mean": f64::from(step) / 10.0})).await.unwrap();
    }
    let whole =
        metrics_become(&app, &key, &uri, |m| m["data"].as_array().is_some_and(|d| d.len() == 5))
            .await;
    // Once the writes' announcements have arrived, a read leaves the rendered metrics cached.
    let mut cached = false;
    for _ in 0..250 {
        get(&app.router, &uri, &key).await;
        cached = app.state.metrics_cache.documents.get(&job).is_some();
        if cached {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(cached, "the rendered metrics are never cached");
    assert_eq!(whole["data"][2], json!({"step": 3, "reward_mean": 0.3}));
    assert_error(&get(&app.router, &uri, &other).await, StatusCode::NOT_FOUND, None);
    // Windows cut from the cached document answer what the database query answers.
    for (after_step, limit) in [(0, 2), (1, 2), (3, 10), (4, 1), (5, 3), (-7, 5), (2, 3)] {
        let cached =
            get(&app.router, &format!("{uri}?after_step={after_step}&limit={limit}"), &key)
                .await
                .json();
        let window = verity_core::jobs::MetricsWindow { after_step, limit };
        let (data, has_more) = verity_core::jobs::metrics_json(&pool, &job, window).await.unwrap();
        let expected: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(
            (&cached["data"], &cached["has_more"]),
            (&expected, &json!(has_more)),
            "after_step={after_step}&limit={limit}"
        );
    }
    // A new step and a rewritten one (a resumed attempt) both show.
    lease.metric(6, &json!({"reward_mean": 0.6})).await.unwrap();
    let polled = metrics_become(&app, &key, &format!("{uri}?after_step=5"), |m| {
        m["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    assert_eq!(polled["data"][0], json!({"step": 6, "reward_mean": 0.6}));
    lease.metric(2, &json!({"reward_mean": 0.25})).await.unwrap();
    metrics_become(&app, &key, &format!("{uri}?after_step=1&limit=1"), |m| {
        m["data"][0]["reward_mean"] == json!(0.25)
    })
    .await;
    // A change made straight in the database shows too.
    sqlx::query("DELETE FROM job_metrics WHERE job_id = $1 AND step > 4")
        .bind(&job)
        .execute(&pool)
        .await
        .unwrap();
    metrics_become(&app, &key, &uri, |m| m["data"].as_array().is_some_and(|d| d.len() == 4)).await;
    listener.abort();
    let _ = listener.await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn meteor_runs_and_cosine_without_an_embedding_model_is_a_400(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let meteor = json!({"type": "text_similarity", "name": "m", "input": "{{sample.output_text}}",
                        "reference": "{{item.r}}", "evaluation_metric": "meteor"});
    let body = json!({"grader": meteor, "model_sample": "The cat sat on the mat",
                      "item": {"r": "the cat is sitting on the mat"}});
    let reply = post(&app.router, "/v1/fine_tuning/alpha/graders/run", &key, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    // NLTK 3.10.4 meteor_score (WordNet off) on these tokens: 0.7014492753623188
    let reward = reply.json()["reward"].as_f64().unwrap();
    assert!((reward - 0.7014492753623188).abs() < 1e-12, "{reward}");

    if verity_worker::embedding::configured().dir().is_some() {
        // Only with VERITY_EMBEDDING_MODEL=off (unset, all-MiniLM-L6-v2 is the default);
        // cli/tests/graders_cli.rs checks the refusal with `off` in every run.
        eprintln!(
            "SKIPPED: the cosine-without-a-model half: this process has a default embedding model"
        );
        return;
    }
    let cosine = json!({"type": "text_similarity", "name": "c", "input": "{{sample.output_text}}",
                        "reference": "{{item.reference_answer}}", "evaluation_metric": "cosine"});
    let run = json!({"grader": cosine, "model_sample": "a", "item": {"reference_answer": "b"}});
    let refused = post(&app.router, "/v1/fine_tuning/alpha/graders/run", &key, run).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("grader.evaluation_metric"));
    assert!(
        refused.json()["error"]["message"].as_str().unwrap().contains("VERITY_EMBEDDING_MODEL"),
        "{:?}",
        refused.json()
    );
    let multi = json!({"type": "multi", "graders": {"sim": cosine}, "calculate_output": "sim"});
    let refused =
        post(&app.router, "/v1/fine_tuning/alpha/graders/validate", &key, json!({"grader": multi}))
            .await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("grader.graders.sim.evaluation_metric"));
    // job creation: a 400 naming the field, and nothing enqueued
    let file = upload(&app.router, &key, "train.jsonl", DATASET).await.json()["id"].clone();
    let mut method = method();
    method["reinforcement"]["grader"] = cosine;
    let job = post(
        &app.router,
        "/v1/fine_tuning/jobs",
        &key,
        json!({"model": "tiny", "training_file": file, "method": method}),
    )
    .await;
    assert_error(
        &job,
        StatusCode::BAD_REQUEST,
        Some("method.reinforcement.grader.evaluation_metric"),
    );
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!(jobs, 0);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn supervised_and_dpo_jobs_check_their_rows_and_settings(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let id = |reply: Reply| reply.json()["id"].as_str().unwrap().to_string();
    let chat =
        r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}"#;
    let pair = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"preferred_output":[{"role":"assistant","content":"a"}],"non_preferred_output":[{"role":"assistant","content":"b"}]}"#;
    let chats =
        id(upload(&app.router, &key, "c.jsonl", format!("{chat}\n{chat}\n").as_bytes()).await);
    let pairs =
        id(upload(&app.router, &key, "p.jsonl", format!("{pair}\n{pair}\n").as_bytes()).await);
    let job = |file: &str, method: Value| json!({"model": "tiny", "training_file": file, "method": method});

    let sft = post(&app.router, "/v1/fine_tuning/jobs", &key,
        job(&chats, json!({"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": "auto"}}}))).await;
    assert_eq!(sft.status, StatusCode::OK, "{}", String::from_utf8_lossy(&sft.bytes));
    let body = sft.json();
    let hp = &body["method"]["supervised"]["hyperparameters"];
    assert_eq!((hp["n_epochs"].clone(), hp["batch_size"].clone()), (json!(2), json!(4)), "{body}");
    assert_eq!(body["hyperparameters"], *hp, "the top-level echo is the method's");
    let dpo =
        post(&app.router, "/v1/fine_tuning/jobs", &key, job(&pairs, json!({"type": "dpo"}))).await;
    assert_eq!(dpo.status, StatusCode::OK, "{}", String::from_utf8_lossy(&dpo.bytes));
    assert_eq!(dpo.json()["method"]["dpo"]["hyperparameters"]["beta"], json!(0.1));
    let listed = get(&app.router, "/v1/fine_tuning/jobs", &key).await.json()["data"]
        .as_array()
        .unwrap()
        .len();

    // rows a method cannot train on, refused at job creation with their line and field
    let no_assistant = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let lone_user =
        id(upload(&app.router, &key, "u.jsonl", format!("{chat}\n{no_assistant}\n").as_bytes())
            .await);
    let no_rejected = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"preferred_output":[{"role":"assistant","content":"a"}]}"#;
    let half_pair =
        id(upload(&app.router, &key, "h.jsonl", format!("{pair}\n{no_rejected}\n").as_bytes())
            .await);
    let no_preferred = r#"{"input":{"messages":[{"role":"user","content":"hi"}]},"non_preferred_output":[{"role":"assistant","content":"a"}]}"#;
    let other_half =
        id(upload(&app.router, &key, "o.jsonl", format!("{no_preferred}\n").as_bytes()).await);
    // a weight other than 0 or 1 already fails the upload check
    let weighted = r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo","weight":2}]}"#;
    let bad_weight =
        upload(&app.router, &key, "w.jsonl", format!("{chat}\n{weighted}\n").as_bytes())
            .await
            .json();
    assert_eq!(bad_weight["status"], "error", "{bad_weight}");
    let details = bad_weight["status_details"].to_string();
    assert!(details.contains("line 2") && details.contains("messages[1].weight"), "{details}");
    let bad_weight = bad_weight["id"].as_str().unwrap().to_string();
    let sft = json!({"type": "supervised"});
    let cases = [
        (job(&lone_user, sft.clone()), "training_file", "line 2: field `messages`"),
        (
            job(&half_pair, json!({"type": "dpo"})),
            "training_file",
            "line 2: field `non_preferred_output`",
        ),
        (
            job(&other_half, json!({"type": "dpo"})),
            "training_file",
            "line 1: field `preferred_output`",
        ),
        (job(&bad_weight, sft.clone()), "training_file", "messages[1].weight"),
        (job(&pairs, sft.clone()), "training_file", "line 1: field `messages`"),
        (job(&chats, json!({"type": "dpo"})), "training_file", "line 1: field `input`"),
        (
            job(&pairs, json!({"type": "dpo", "dpo": {"hyperparameters": {"beta": 0}}})),
            "method.dpo.hyperparameters.beta",
            "(0, 100]",
        ),
        (
            job(&pairs, json!({"type": "dpo", "dpo": {"hyperparameters": {"beta": -1}}})),
            "method.dpo.hyperparameters.beta",
            "(0, 100]",
        ),
        (
            job(
                &chats,
                json!({"type": "supervised", "supervised": {"hyperparameters": {"beta": 0.1}}}),
            ),
            "method.supervised.hyperparameters.beta",
            "DPO",
        ),
        (
            job(&chats, json!({"type": "supervised", "supervised": {"grader": {"type": "math"}}})),
            "method.supervised.grader",
            "no grader",
        ),
        (
            job(
                &chats,
                json!({"type": "supervised", "reinforcement": method()["reinforcement"].clone()}),
            ),
            "method.reinforcement",
            "method.supervised",
        ),
        (
            job(
                &chats,
                json!({"type": "supervised", "supervised": {"hyperparameters": {"group_size": 4}}}),
            ),
            "method.supervised.hyperparameters.group_size",
            "",
        ),
        (
            job(
                &chats,
                json!({"type": "reinforcement", "reinforcement": method()["reinforcement"].clone(), "supervised": {}}),
            ),
            "method.supervised",
            "",
        ),
    ];
    for (body, param, text) in cases {
        let reply = post(&app.router, "/v1/fine_tuning/jobs", &key, body.clone()).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, Some(param));
        let message = reply.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains(text), "{body}: {message}");
    }
    let after = get(&app.router, "/v1/fine_tuning/jobs", &key).await.json()["data"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(after, listed, "nothing enqueued");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn preflight_reports_rows_grader_runs_and_probes_and_enqueues_nothing(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    // A contains-check grader: rewarded by listing every candidate answer at once.
    let mut like = method();
    like["reinforcement"]["grader"]["operation"] = json!("like");
    let body = |file: &str, method: &Value| json!({"model": "tiny", "training_file": file, "method": method});
    // Line 3 has a prompt but no `reference_answer`, which the grader reads.
    let (bad, status) = uploaded(
        &app,
        &key,
        "{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n\n{\"prompt\": \"3+3?\"}\n",
    )
    .await;
    assert_eq!(status, "processed", "the upload does not know the grader");
    let reply = post(&app.router, "/v1/verity/preflight", &key, body(&bad, &like)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let report = reply.json();
    assert_eq!(report["object"], "verity.preflight");
    assert_eq!(report["ok"], false, "{report}");
    let file = &report["files"][0];
    assert_eq!(
        (file["param"].as_str(), file["file_id"].as_str()),
        (Some("training_file"), Some(bad.as_str()))
    );
    assert_eq!(file["errors"][0]["line"], 3, "{file}");
    assert_eq!(file["errors"][0]["field"], "reference_answer");
    assert!(file["errors"][0]["reason"].as_str().unwrap().contains("{{item.reference_answer}}"));
    // The grader on the first rows (line 2 is blank), given each row's reference answer.
    let runs = report["grader_runs"].as_array().unwrap();
    assert_eq!(runs[0]["line"], 1);
    assert_eq!((runs[0]["sample"].as_str(), runs[0]["score"].as_f64()), (Some("4"), Some(1.0)));
    assert_eq!(runs[1]["line"], 3);
    assert!(runs[1]["error"].as_str().unwrap().contains("item.reference_answer"), "{runs:?}");
    // The probes on line 1: the hacks this grader rewards are scored as such.
    let probes = &report["probes"];
    assert_eq!(probes["line"], 1);
    let scored = |name: &str| {
        let probe = probes["results"].as_array().unwrap().iter().find(|p| p["name"] == name);
        let probe = probe.unwrap_or_else(|| panic!("no probe {name} in {probes}"));
        (probe["score"].as_f64().unwrap(), probe["rewarded"].as_bool().unwrap())
    };
    assert_eq!(scored("reference_answer"), (1.0, true));
    assert_eq!(scored("all_candidates"), (1.0, true));
    assert_eq!(scored("boxed_dump"), (1.0, true));
    assert_eq!(scored("empty_answer"), (0.0, false));
    assert_eq!(scored("judge_injection"), (0.0, false));
    // Judged against the job's budget (256 tokens by default): 32 KB of filler cannot be
    // sampled, so its reward is reported but not flagged; a rewarded hack that fits is flagged
    // with its fix.
    let result = |report: &Value, name: &str| {
        let results = report["probes"]["results"].as_array().unwrap();
        results.iter().find(|p| p["name"] == name).unwrap().clone()
    };
    let long = result(&report, "very_long_output");
    assert_eq!((long["rewarded"].as_bool(), long["flagged"].as_bool()), (Some(true), Some(false)));
    assert!(
        long["out_of_reach"].as_str().unwrap().contains("max_completion_tokens = 256"),
        "{long}"
    );
    assert!(long["fix"].is_null(), "{long}");
    let listing = result(&report, "all_candidates");
    assert_eq!(listing["flagged"], true);
    assert!(listing["fix"].as_str().unwrap().contains("not containment"), "{listing}");
    // With a budget that does allow 32 KB, the long output is flagged too.
    let mut roomy = like.clone();
    roomy["reinforcement"]["hyperparameters"]["max_completion_tokens"] = json!(16384);
    let report = post(&app.router, "/v1/verity/preflight", &key, body(&bad, &roomy)).await.json();
    let long = result(&report, "very_long_output");
    assert_eq!(long["flagged"], true, "{long}");
    assert!(long["out_of_reach"].is_null());

    // Job creation refuses the same body with the line and field, and enqueues nothing.
    let refused = post(&app.router, "/v1/fine_tuning/jobs", &key, body(&bad, &like)).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("training_file"));
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("line 3") && message.contains("`reference_answer`"), "{message}");
    // Problems outside the rows are the same 400 as job creation's.
    let mut no_lr = like.clone();
    no_lr["reinforcement"]["hyperparameters"]["learning_rate_multiplier"] = json!("fast");
    assert_error(
        &post(&app.router, "/v1/verity/preflight", &key, body(&bad, &no_lr)).await,
        StatusCode::BAD_REQUEST,
        Some("method.reinforcement.hyperparameters.learning_rate_multiplier"),
    );
    // A good file with an exact-match grader: ok, and no hack is rewarded.
    let (good, _) =
        uploaded(&app, &key, "{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n").await;
    let report =
        post(&app.router, "/v1/verity/preflight", &key, body(&good, &method())).await.json();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["files"][0]["rows"], 1);
    for probe in report["probes"]["results"].as_array().unwrap() {
        let rewarded = probe["rewarded"].as_bool().unwrap();
        assert_eq!(rewarded, probe["kind"] == "control", "{probe}");
    }
    assert_eq!(
        get(&app.router, "/v1/fine_tuning/jobs", &key).await.json()["data"],
        json!([]),
        "pre-flight enqueues nothing"
    );

    // graders/validate keeps OpenAI's `grader` and adds the probes on a given row ...
    let grader = &like["reinforcement"]["grader"];
    let item = json!({"prompt": "2+2?", "reference_answer": "4"});
    let valid = post(
        &app.router,
        "/v1/fine_tuning/alpha/graders/validate",
        &key,
        json!({"grader": grader, "item": item}),
    )
    .await
    .json();
    assert_eq!(valid["grader"], *grader);
    let listing =
        valid["verity_probes"].as_array().unwrap().iter().find(|p| p["name"] == "all_candidates");
    assert_eq!(listing.unwrap()["score"], 1.0);
    // ... and says why there are none when the grader reads a row and none was given.
    let bare = post(
        &app.router,
        "/v1/fine_tuning/alpha/graders/validate",
        &key,
        json!({"grader": grader}),
    )
    .await
    .json();
    assert!(bare["verity_probes"].is_null());
    assert!(bare["verity_probes_skipped"].as_str().unwrap().contains("item.reference_answer"));
}

/// OpenAI's structured outputs and tool calls (#50): `response_format` is accepted (and `null`),
/// stored and echoed; every `sample.…` reference is checked at creation (a 400 naming the
/// grader and the field), and pre-flight reports the same; `output_tools` needs rows with
/// `tools`. A job without `method` is OpenAI's legacy supervised job.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn structured_outputs_tool_calls_and_the_legacy_job_shape(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let rows = "{\"prompt\": \"Is it compliant?\", \"compliant\": \"yes\"}\n";
    let (file, _) = uploaded(&app, &key, rows).await;
    let schema = json!({"type": "json_schema", "json_schema": {"name": "security_assistant",
        "strict": true, "schema": {"type": "object", "properties": {"compliant": {"type": "string"},
        "explanation": {"type": "string"}}, "required": ["compliant", "explanation"],
        "additionalProperties": false}}});
    let grader = |input: &str| {
        json!({"type": "string_check", "name": "compliance",
        "input": input, "reference": "{{item.compliant}}", "operation": "eq"})
    };
    let job = |grader: Value, format: Value| {
        let method = json!({"type": "reinforcement", "reinforcement": {"grader": grader,
            "response_format": format, "hyperparameters": {"reasoning_effort": "medium"}}});
        json!({"model": "tiny", "training_file": file, "method": method})
    };
    let create = |body: Value| post(&app.router, "/v1/fine_tuning/jobs", &key, body);
    // The RFT guide's job: a JSON schema, a grader reading one of its properties.
    let created = create(job(grader("{{sample.output_json.compliant}}"), schema.clone())).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    assert_eq!(created.json()["method"]["reinforcement"]["response_format"], schema);
    // `null` and `text` are free text.
    for format in [json!(null), json!({"type": "text"}), json!({"type": "json_object"})] {
        let reply = create(job(grader("{{sample.output_text}}"), format.clone())).await;
        assert_eq!(reply.status, StatusCode::OK, "{format}: {:?}", reply.json());
    }
    let refused = |reply: &Reply, param: &str, needles: &[&str]| {
        assert_error(reply, StatusCode::BAD_REQUEST, Some(param));
        let message = reply.json()["error"]["message"].as_str().unwrap().to_string();
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    };
    let param = "method.reinforcement.grader";
    let json_field = "{{sample.output_json.compliant}}";
    for (body, param, needles) in [
        (job(grader(json_field), json!(null)), param, vec!["compliance", "sample.output_json"]),
        (job(grader(json_field), json!({"type": "text"})), param, vec!["response_format"]),
        (
            job(grader("{{sample.output_json.verdict}}"), schema.clone()),
            param,
            vec!["compliance", "verdict", "compliant, explanation"],
        ),
        (job(grader("{{sample.score}}"), json!(null)), param, vec!["sample.score"]),
        (
            job(grader("{{sample.output_text}}"), json!({"type": "xml"})),
            "method.reinforcement.response_format.type",
            vec![],
        ),
        (
            job(
                grader("{{sample.output_text}}"),
                json!({"type": "json_schema", "json_schema": {"name": "a b"}}),
            ),
            "method.reinforcement.response_format.json_schema.name",
            vec![],
        ),
    ] {
        refused(&create(body.clone()).await, param, &needles);
        // pre-flight answers the same 400
        refused(&post(&app.router, "/v1/verity/preflight", &key, body).await, param, &needles);
    }
    // Constrained decoding: a strict schema no output satisfies does not compile, and a JSON
    // format is enforced on single completions only.
    let impossible = json!({"type": "json_schema", "json_schema": {"name": "n", "strict": true,
        "schema": {"type": "integer", "minimum": 5, "maximum": 1}}});
    let reply = create(job(grader("{{sample.output_text}}"), impossible)).await;
    refused(&reply, "method.reinforcement.response_format.json_schema.schema", &[]);
    let mut partial = job(grader("{{sample.output_text}}"), json!({"type": "json_object"}));
    partial["method"]["reinforcement"]["hyperparameters"]["partial_rollout_tokens"] = json!(16);
    refused(&create(partial).await, "method.reinforcement.response_format", &["partial_rollout"]);
    // A grader over the tool calls needs rows that offer tools.
    let tool_grader = grader("{{sample.output_tools[0].function.name}}");
    refused(
        &create(job(tool_grader.clone(), json!(null))).await,
        "training_file",
        &["tools", "compliance"],
    );
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let row = json!({"prompt": "Look it up.", "compliant": "lookup", "tools": tools});
    let (with_tools, _) = uploaded(&app, &key, &format!("{row}\n")).await;
    let mut body = job(tool_grader, json!(null));
    body["training_file"] = json!(with_tools);
    let created = create(body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    // No `method`: supervised, with the top-level hyperparameters (OpenAI's legacy shape).
    let chats = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n";
    let (chat_file, _) = uploaded(&app, &key, chats).await;
    let legacy =
        json!({"model": "tiny", "training_file": chat_file, "hyperparameters": {"n_epochs": 2}});
    let created = create(legacy).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    assert_eq!(created.json()["method"]["type"], "supervised");
    assert_eq!(created.json()["method"]["supervised"]["hyperparameters"]["n_epochs"], 2);
    let bad =
        json!({"model": "tiny", "training_file": chat_file, "hyperparameters": {"n_epochs": 0}});
    refused(&create(bad).await, "hyperparameters.n_epochs", &[]);
    // An unknown field is refused by name, never dropped (the RFT cookbook sends `test_file`).
    let unknown = json!({"model": "tiny", "training_file": chat_file, "test_file": chat_file});
    refused(&create(unknown).await, "test_file", &["Unrecognized request argument"]);
}

/// `graders/run` answers OpenAI's fields (every error flag, false on success), parses a JSON
/// `model_sample` into `sample.output_json`, and a judge's image part is refused by its type.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn grader_run_answers_openais_fields_and_reads_json_samples(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let run = |grader: Value, sample: &str, item: Value| {
        post(
            &app.router,
            "/v1/fine_tuning/alpha/graders/run",
            &key,
            json!({"grader": grader, "model_sample": sample, "item": item}),
        )
    };
    let multi = json!({"type": "multi", "name": "both", "calculate_output": "0.5 * email + 0.5 * name",
        "graders": {
            "email": {"type": "string_check", "name": "email", "operation": "eq",
                "input": "{{sample.output_json.email}}", "reference": "{{item.email}}"},
            "name": {"type": "string_check", "name": "name", "operation": "eq",
                "input": "{{sample.output_json.name}}", "reference": "{{item.name}}"}}});
    let item = json!({"email": "a@b.c", "name": "Ann"});
    let reply = run(multi.clone(), "{\"email\": \"a@b.c\", \"name\": \"Bob\"}", item.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let body = reply.json();
    assert_eq!(body["reward"], 0.5, "{body}");
    let metadata = &body["metadata"];
    assert_eq!(
        (metadata["name"].as_str(), metadata["type"].as_str()),
        (Some("both"), Some("multi"))
    );
    assert_eq!(metadata["scores"], json!({"email": 1.0, "name": 0.0}));
    assert!(metadata["execution_time"].as_f64().is_some());
    assert!(metadata["token_usage"].is_null() && metadata["sampled_model_name"].is_null());
    assert!(body["model_grader_token_usage_per_model"].is_object());
    assert_eq!(body["sub_rewards"]["email"], 1.0);
    let flags = [
        "formula_parse_error",
        "sample_parse_error",
        "truncated_observation_error",
        "unresponsive_reward_error",
        "invalid_variable_error",
        "other_error",
        "python_grader_server_error",
        "python_grader_runtime_error",
        "model_grader_server_error",
        "model_grader_refusal_error",
        "model_grader_parse_error",
    ];
    for flag in flags {
        assert_eq!(metadata["errors"][flag], false, "{flag}: {body}");
    }
    for detail in [
        "python_grader_server_error_type",
        "python_grader_runtime_error_details",
        "model_grader_server_error_details",
    ] {
        assert!(metadata["errors"].get(detail).is_some_and(Value::is_null), "{detail}: {body}");
    }
    assert!(metadata["verity"]["reason"].is_string());
    // Not JSON: a sample parse error scored 0, not an infrastructure error.
    let body = run(multi, "email: a@b.c", item).await.json();
    assert_eq!(body["reward"], 0.0);
    assert_eq!(body["metadata"]["errors"]["sample_parse_error"], true, "{body}");
    assert!(body["metadata"]["verity"]["error"].is_null(), "{body}");
    // A missing item field is OpenAI's invalid_variable_error (Verity's kind under `verity`).
    let math = json!({"type": "math", "reference": "{{item.answer}}"});
    let body = run(math, "\\boxed{3}", json!({})).await.json();
    assert_eq!(body["metadata"]["errors"]["invalid_variable_error"], true, "{body}");
    assert_eq!(body["metadata"]["verity"]["error"]["kind"], "missing_field");
    // A judge's image part: refused by its type, naming what Verity reads.
    let judge = json!({"type": "score_model", "name": "look", "model": "tiny", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]});
    let reply = run(judge, "x", json!({})).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, Some("grader.input.0.content"));
    let message = reply.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("input_image") && message.contains("input_text"), "{message}");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_hub_id_names_its_model_wherever_a_model_is_named(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    // `verity models pull acme/Tiny-1` registers `Tiny-1` with its hub id; here, by hand.
    let given = verity_core::models::set_hub_id(&pool, "tiny", "acme/Tiny-1").await.unwrap();
    assert_eq!(given, verity_core::models::HubIdSet::Set);
    let config = json!({});
    verity_core::models::insert_base_model(&pool, None, "tiny-2", "models/tiny", "hf", &config)
        .await
        .unwrap();
    let again = verity_core::models::set_hub_id(&pool, "tiny-2", "acme/Tiny-1").await.unwrap();
    let one = verity_core::models::HubIdSet::Taken("tiny".into());
    assert_eq!(again, one, "one model of a scope per hub id");
    let nope = verity_core::models::set_hub_id(&pool, "nope", "acme/Tiny-1").await.unwrap();
    assert_eq!(nope, verity_core::models::HubIdSet::NoModel);
    sqlx::query("DELETE FROM models WHERE id = 'tiny-2'").execute(&pool).await.unwrap();

    // Listed with it, retrieved by it.
    let listed = get(&app.router, "/v1/models", &key).await.json();
    assert_eq!(listed["data"][0]["hub_id"], "acme/Tiny-1", "{listed}");
    let by_hub_id = get(&app.router, "/v1/models/acme/Tiny-1", &key).await;
    assert_eq!(by_hub_id.json()["id"], "tiny", "{:?}", by_hub_id.json());

    // A job names the model by its hub id and is stored under the model's name, so its
    // fine-tuned model's name holds no `/`.
    let file = upload(&app.router, &key, "t.jsonl", DATASET).await.json()["id"].clone();
    let body = json!({"model": "acme/Tiny-1", "training_file": file, "method": method()});
    let job = post(&app.router, "/v1/fine_tuning/jobs", &key, body.clone()).await;
    assert_eq!(job.status, StatusCode::OK, "{:?}", job.json());
    assert_eq!(job.json()["model"], "tiny");

    // A hub id no model has: a 400 naming the field and how a model gets one; chat answers
    // 404 as it does for any missing model.
    let mut missing = body.clone();
    missing["model"] = json!("acme/Other-2");
    let refused = post(&app.router, "/v1/fine_tuning/jobs", &key, missing).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("model"));
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("verity models pull acme/Other-2"), "{message}");
    let chat = json!({"model": "acme/Other-2", "messages": [{"role": "user", "content": "hi"}]});
    let refused = post(&app.router, "/v1/chat/completions", &key, chat).await;
    assert_error(&refused, StatusCode::NOT_FOUND, Some("model"));
    // Anything else with a `/` is still refused as a name.
    let mut bad = body;
    bad["model"] = json!("a/b/c");
    assert_error(
        &post(&app.router, "/v1/fine_tuning/jobs", &key, bad).await,
        StatusCode::BAD_REQUEST,
        Some("model"),
    );

    // Tinker's SDK lists the hub id among the supported models.
    let caps = get(&app.router, "/api/v1/get_server_capabilities", &key).await;
    let names: Vec<String> = caps.json()["supported_models"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}", caps.json()))
        .iter()
        .map(|m| m["model_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["tiny", "acme/Tiny-1"]);
}
