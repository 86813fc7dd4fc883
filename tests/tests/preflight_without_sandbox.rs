//! A machine without bubblewrap (issue #44): a job whose grader needs the sandbox hears so at
//! pre-flight, before it is created, and a grader that needs no sandbox is unaffected. Its own test binary: the sandbox's tools are discovered once per process.

use verity_tests::api_support;

use api_support::*;
use axum::http::StatusCode;
use serde_json::json;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_missing_sandbox_is_reported_before_a_job_is_created(pool: sqlx::PgPool) {
    // No bwrap anywhere this process looks (set before the sandbox is first discovered).
    std::env::remove_var("VERITY_SANDBOX_BWRAP");
    std::env::set_var("PATH", "/nonexistent");
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let file = upload(&app.router, &key, "train.jsonl", DATASET).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let python = json!({"type": "python", "name": "exact",
        "source": "def grade(sample, item) -> float:\n    return 1.0\n"});
    let body = |grader: &serde_json::Value| {
        json!({"model": "tiny", "training_file": file, "method": {"type": "reinforcement",
            "reinforcement": {"grader": grader}}})
    };
    let reply = post(&app.router, "/v1/verity/preflight", &key, body(&python)).await;
    let says_bwrap = |text: &str| text.contains("bubblewrap") && text.contains("sandbox");
    let text = reply.json().to_string();
    assert!(says_bwrap(&text), "pre-flight does not name the missing sandbox: {text}");
    if reply.status == StatusCode::OK {
        assert_eq!(reply.json()["ok"], false, "{text}");
    } else {
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{text}");
    }
    // Pre-flight enqueued nothing. (Job creation does not refuse: in a cluster the workers that
    // grade are other machines than the API's.)
    let listed = get(&app.router, "/v1/fine_tuning/jobs", &key).await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 0, "nothing enqueued: {listed}");
    // A grader without code is unaffected.
    let string_check = &method()["reinforcement"]["grader"];
    let reply = post(&app.router, "/v1/verity/preflight", &key, body(string_check)).await;
    assert_eq!(reply.json()["ok"], true, "{:?}", reply.json());
}
