//! Model graders at the API (router, a fresh Postgres database, a local store): bad bodies are a
//! 400 naming the JSON path at job creation, `graders/validate` and `graders/run`, with nothing
//! enqueued; a valid `score_model` whose judge is the registered model `tiny` is accepted.

use verity_tests::api_support;

use api_support::*;
use axum::http::StatusCode;
use serde_json::{json, Value};

fn score_model(model: &str) -> Value {
    json!({"type": "score_model", "name": "judge", "model": model, "range": [0, 10],
           "input": [{"role": "system", "content": "Rate 0-10."},
                     {"role": "user", "content": "Reference: {{item.reference_answer}}\nAnswer: {{sample.output_text}}"}],
           "sampling_params": {"temperature": 0, "seed": 1, "max_completions_tokens": 8, "reasoning_effort": "low"}})
}

fn label_model(model: &str) -> Value {
    json!({"type": "label_model", "name": "verdict", "model": model,
           "labels": ["correct", "incorrect"], "passing_labels": ["correct"],
           "input": [{"role": "user", "type": "message",
                      "content": {"type": "input_text", "text": "Is {{sample.output_text}} equal to {{item.reference_answer}}?"}}]})
}

fn job_body(file: &str, grader: Value) -> Value {
    json!({"model": "tiny", "training_file": file,
           "method": {"type": "reinforcement", "reinforcement": {"grader": grader}}})
}

fn assert_400(reply: &Reply, param: &str, needle: &str) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&reply.bytes));
    let error = &reply.json()["error"];
    assert_eq!(error["param"], param, "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle:?} not in {message:?}");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn bad_model_graders_are_400s_naming_the_path_and_enqueue_nothing(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = user(&pool, "judge@x.io", "acme", "member").await;
    let file = upload(&app.router, &key, "train.jsonl", DATASET).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let grader = "method.reinforcement.grader";
    let mut bad_range = score_model("tiny");
    bad_range["range"] = json!([5, 5]);
    let mut bad_labels = label_model("tiny");
    bad_labels["passing_labels"] = json!(["correct", "right"]);
    let mut missing_field = score_model("tiny");
    missing_field["input"][1]["content"] = json!("{{item.rubric}} {{sample.output_text}}");
    let multi = json!({"type": "multi", "calculate_output": "j",
                       "graders": {"j": score_model("gpt-4o-judge")}});
    let cases: Vec<(Value, String, &str)> = vec![
        (score_model("no-such-judge"), format!("{grader}.model"), "does not exist"),
        (multi, format!("{grader}.graders.j.model"), "gpt-4o-judge"),
        (bad_range, format!("{grader}.range"), "min < max"),
        (bad_labels, format!("{grader}.passing_labels.1"), "'right' is not one of 'labels'"),
    ];
    for (g, param, needle) in &cases {
        let reply =
            post(&app.router, "/v1/fine_tuning/jobs", &key, job_body(&file, g.clone())).await;
        assert_400(&reply, param, needle);
        // the same answers from graders/validate and graders/run, under `grader`
        let local = param.replacen(grader, "grader", 1);
        let body = json!({"grader": g});
        assert_400(
            &post(&app.router, "/v1/fine_tuning/alpha/graders/validate", &key, body).await,
            &local,
            needle,
        );
        let body = json!({"grader": g, "model_sample": "4", "item": {"reference_answer": "4"}});
        assert_400(
            &post(&app.router, "/v1/fine_tuning/alpha/graders/run", &key, body).await,
            &local,
            needle,
        );
    }
    // a template naming a field the rows lack: the file and the field are named
    let reply =
        post(&app.router, "/v1/fine_tuning/jobs", &key, job_body(&file, missing_field)).await;
    assert_400(&reply, "training_file", "`rubric`");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!(jobs, 0, "nothing was enqueued");

    // the same graders, correct, go through (the judge `tiny` is registered for every org)
    for g in [score_model("tiny"), label_model("tiny")] {
        let ok =
            post(&app.router, "/v1/fine_tuning/alpha/graders/validate", &key, json!({"grader": g}))
                .await;
        assert_eq!(ok.status, StatusCode::OK, "{:?}", ok.json());
        let job = post(&app.router, "/v1/fine_tuning/jobs", &key, job_body(&file, g)).await;
        assert_eq!(job.status, StatusCode::OK, "{:?}", job.json());
    }
}
