//! Issue #43 at the API (router, a fresh Postgres database, a local store): `.` and `..` names
//! refused at every entry point with a 400 naming the field; multipart text fields capped and
//! never echoed; file rows capped; grading slots shared fairly between orgs; `/login?next=`
//! only to same-origin paths; `/metrics` labels bounded and behind an optional token.

use verity_tests::api_support;

use api_support::*;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use verity_server::api::state::ApiConfig;

fn assert_400(reply: &Reply, param: &str) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{param}: {:?}", reply.json());
    assert_eq!(reply.json()["error"]["param"], param, "{:?}", reply.json());
}

fn score_model(model: &str) -> Value {
    json!({"type": "score_model", "name": "judge", "model": model,
           "input": [{"role": "user", "content": "Rate {{sample.output_text}}"}]})
}

fn string_check() -> Value {
    json!({"type": "string_check", "name": "s", "input": "{{sample.output_text}}",
           "reference": "x", "operation": "eq"})
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn dot_names_are_refused_at_every_entry_point(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let admin = user(&pool, "ada@a.io", "org-a", "admin").await;
    let file = upload(&app.router, &admin, "train.jsonl", DATASET).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    verity_core::storage::publish_folder(
        app.state.store.as_ref(),
        &{
            let dir = app.dir.path().join("weights");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("model.safetensors"), b"w").unwrap();
            dir
        },
        "models/dots",
    )
    .await
    .unwrap();
    for name in ["..", ".", "a/b", "a\\b", "x\ty"] {
        let r = post(
            &app.router,
            "/v1/models",
            &admin,
            json!({"id": name, "storage_prefix": "models/dots"}),
        )
        .await;
        assert_400(&r, "id");
        let job = json!({"model": name, "training_file": file, "method": method()});
        assert_400(&post(&app.router, "/v1/fine_tuning/jobs", &admin, job.clone()).await, "model");
        assert_400(&post(&app.router, "/v1/verity/preflight", &admin, job).await, "model");
        let run = json!({"grader": score_model(name), "model_sample": "x", "item": {}});
        let graders = "/v1/fine_tuning/alpha/graders";
        assert_400(
            &post(&app.router, &format!("{graders}/run"), &admin, run).await,
            "grader.model",
        );
        let validate = json!({"grader": score_model(name)});
        assert_400(
            &post(&app.router, &format!("{graders}/validate"), &admin, validate).await,
            "grader.model",
        );
        let rejection = json!({"model": name, "file": file, "grader": string_check()});
        assert_400(
            &post(&app.router, "/v1/verity/rejection_sampling", &admin, rejection).await,
            "model",
        );
        let evaluation = json!({"models": ["tiny", name], "file": file, "grader": string_check()});
        assert_400(
            &post(&app.router, "/v1/verity/evaluations", &admin, evaluation).await,
            "models[1]",
        );
        let chat = json!({"model": name, "messages": [{"role": "user", "content": "hi"}]});
        let reply = post(&app.router, "/v1/chat/completions", &admin, chat).await;
        if verity_core::models::check_hub_id(name).is_ok() {
            // `a/b` has a hub id's shape (looked up, never a path): chat answers a model that
            // does not exist with a 404, as OpenAI does.
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{:?}", reply.json());
            assert_eq!(reply.json()["error"]["param"], "model");
        } else {
            assert_400(&reply, "model");
        }
    }
    let ok = post(
        &app.router,
        "/v1/models",
        &admin,
        json!({"id": "dots-ok", "storage_prefix": "models/dots"}),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{:?}", ok.json());
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn multipart_text_is_capped_and_never_echoed_and_rows_are_capped(pool: sqlx::PgPool) {
    let mut config = api_config();
    config.limits.max_row_bytes = 2048;
    let app = app_with(pool.clone(), config, |_| {}).await;
    let key = user(&pool, "ada@a.io", "org-a", "member").await;
    let marker = "PURPOSE-MARKER-";
    let long = marker.repeat(1000);
    let refused = upload_for(&app.router, &key, "train.jsonl", &long, DATASET).await;
    assert_400(&refused, "purpose");
    assert!(refused.bytes.len() < 1024, "{} bytes", refused.bytes.len());
    assert!(!String::from_utf8_lossy(&refused.bytes).contains(marker));
    let wrong = upload_for(&app.router, &key, "train.jsonl", "PURPOSE-MARKER", DATASET).await;
    assert_400(&wrong, "purpose");
    assert!(!String::from_utf8_lossy(&wrong.bytes).contains(marker));
    assert!(upload_for(&app.router, &key, "train.jsonl", "fine-tune", DATASET)
        .await
        .status
        .is_success());

    // One long row (stored, though it fails validation) and one short one.
    let long_row =
        format!("{{\"prompt\": \"{}\"}}\n{{\"prompt\": \"short\"}}\n", "y".repeat(100_000));
    let file = upload(&app.router, &key, "long.jsonl", long_row.as_bytes()).await;
    let id = file.json()["id"].as_str().unwrap().to_string();
    // A dashboard session (its cookie holds a session id, never the key): sign in with the key.
    let signed_in = send(
        &app.router,
        Request::builder()
            .method(Method::POST)
            .uri("/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(format!("api_key={key}")))
            .unwrap(),
    )
    .await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    let cookie =
        signed_in.headers["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let row = |n: usize| {
        Request::builder()
            .uri(format!("/files/{id}/rows/{n}"))
            .header("cookie", cookie.clone())
            .body(Body::empty())
            .unwrap()
    };
    let cut = send(&app.router, row(0)).await;
    assert_eq!(cut.status, StatusCode::OK, "{}", String::from_utf8_lossy(&cut.bytes));
    assert!(cut.bytes.len() < 4096, "{} bytes", cut.bytes.len());
    assert_eq!(cut.json()["truncated"], true);
    assert_eq!(cut.json()["row"], Value::Null);
    assert_eq!(cut.json()["max_bytes"], 2048);
    let whole = send(&app.router, row(1)).await.json();
    assert_eq!(
        (whole["truncated"].clone(), whole["row"]["prompt"].clone()),
        (json!(false), json!("short"))
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn one_org_cannot_take_every_grading_slot(pool: sqlx::PgPool) {
    let config = ApiConfig { grader_concurrency: 4, grader_wait_ms: 200, ..api_config() };
    let app = app_with(pool.clone(), config, |_| {}).await;
    let a = user(&pool, "a@a.io", "org-a", "member").await;
    let b = user(&pool, "b@b.io", "org-b", "member").await;
    let org_a =
        verity_core::tenancy::find_user_by_email(&pool, "a@a.io").await.unwrap().unwrap().org_id;
    // Org A holds its share (half of four slots) as two long gradings would.
    let held = [
        app.state.grader_slots.acquire(org_a).await.unwrap(),
        app.state.grader_slots.acquire(org_a).await.unwrap(),
    ];
    let run = json!({"grader": string_check(), "model_sample": "x", "item": {}});
    let uri = "/v1/fine_tuning/alpha/graders/run";
    let refused = post(&app.router, uri, &a, run.clone()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", refused.json());
    assert_eq!(refused.json()["error"]["code"], "org_graders_busy");
    let other = post(&app.router, uri, &b, run.clone()).await;
    assert_eq!(other.status, StatusCode::OK, "org B still grades: {:?}", other.json());
    drop(held);
    assert_eq!(post(&app.router, uri, &a, run).await.status, StatusCode::OK);
    assert_eq!(app.state.grader_slots.permits.available_permits(), 4);
}

/// `graders/run` never loads a judge model in the API process: its judge is asked through an
/// inference worker, so with none live a model grader is a 503 that says to start one, and the
/// grading slot it held is given back. (`inference_api.rs` grades through a live one.)
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_judge_is_never_loaded_in_the_api_process(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@a.io", "org-a", "member").await;
    let slots = app.state.grader_slots.permits.available_permits();
    let run = json!({"grader": score_model("tiny"), "model_sample": "x", "item": {}});
    let reply = post(&app.router, "/v1/fine_tuning/alpha/graders/run", &key, run).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", reply.json());
    let message = reply.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("verity inference"), "{message}");
    assert!(reply.headers.contains_key("retry-after"));
    // The probes of graders/validate say why they were skipped; the grader itself is valid.
    let validate = json!({"grader": score_model("tiny"), "item": {}});
    let reply = post(&app.router, "/v1/fine_tuning/alpha/graders/validate", &key, validate).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let skipped = reply.json()["verity_probes_skipped"].as_str().unwrap().to_string();
    assert!(skipped.contains("inference worker"), "{skipped}");
    assert_eq!(app.state.grader_slots.permits.available_permits(), slots);
}

/// Signs in with `key` through the form, asking to go to `next` (already form-encoded).
async fn sign_in_to(app: &TestApp, key: &str, next: &str) -> Reply {
    let request = Request::builder()
        .method(Method::POST)
        .uri("/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(format!("api_key={key}&next={next}")))
        .unwrap();
    send(&app.router, request).await
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sign_in_redirects_only_to_same_origin_paths(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "ada@a.io", "org-a", "member").await;
    for next in [
        "%2F%09%2Fevil.example",
        "%2F%0A%2Fevil.example",
        "%2F%0D%0ASet-Cookie%3Ax",
        "%2F%5Cevil.example",
        "%2F%2Fevil.example",
        "https%3A%2F%2Fevil.example",
    ] {
        let reply = sign_in_to(&app, &key, next).await;
        assert_eq!(
            reply.status,
            StatusCode::SEE_OTHER,
            "{next}: {}",
            String::from_utf8_lossy(&reply.bytes)
        );
        assert_eq!(reply.headers["location"], "/jobs", "{next}");
    }
    let reply = sign_in_to(&app, &key, "%2Fjobs%2Fnew").await;
    assert_eq!(reply.headers["location"], "/jobs/new");
    let page = call(&app.router, Method::GET, "/login?next=/%09/evil.example", None, None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!String::from_utf8_lossy(&page.bytes).contains("evil.example"));
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn metrics_labels_are_bounded_and_the_token_guards_them(pool: sqlx::PgPool) {
    let mut config = api_config();
    config.limits.metrics_token = Some("scrape-token-0123456789".into());
    let app = app_with(pool.clone(), config, |_| {}).await;
    for i in 0..20 {
        let method = Method::from_bytes(format!("M{i}{}", "X".repeat(200)).as_bytes()).unwrap();
        call(&app.router, method, "/healthz", None, None).await;
    }
    let open = call(&app.router, Method::GET, "/metrics", None, None).await;
    assert_eq!(open.status, StatusCode::UNAUTHORIZED);
    let wrong = call(&app.router, Method::GET, "/metrics", Some("scrape-token-wrong"), None).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let text =
        call(&app.router, Method::GET, "/metrics", Some("scrape-token-0123456789"), None).await;
    assert_eq!(text.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&text.bytes).into_owned();
    assert!(text.contains("method=\"other\""), "{text}");
    assert!(!text.contains("XXXX"), "unknown methods collapse to other");
    assert!(text.contains("verity_jobs{"));
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_org_over_its_queued_limit_gets_429_and_another_org_does_not(pool: sqlx::PgPool) {
    use verity_core::queue::{Queue, QueueSettings};
    let app = app_with(pool.clone(), api_config(), |state| {
        let settings = QueueSettings { org_max_queued: 1, ..QueueSettings::DEFAULT };
        state.queue = Queue::new(state.pool.clone(), settings);
    })
    .await;
    base_model(&app).await;
    let a = user(&pool, "ada@a.io", "org-a", "member").await;
    let b = user(&pool, "bob@b.io", "org-b", "member").await;
    let (file, _job) = file_and_job(&app, &a).await;
    let body = json!({"model": "tiny", "training_file": file, "method": method()});
    let refused = post(&app.router, "/v1/fine_tuning/jobs", &a, body).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", refused.json());
    assert_eq!(refused.json()["error"]["code"], "queue_limit_exceeded");
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("1 queued jobs") && message.contains("VERITY_ORG_MAX_QUEUED"),
        "{message}"
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap(),
        1
    );
    file_and_job(&app, &b).await;
}
