//! The Tinker API at the router (a fresh Postgres database, no inference worker): the SDK's
//! `X-API-Key` header with a key in its `tml-` form, sessions and sampling sessions scoped to
//! the org, futures read back (a failed call as the SDK's `{"error", "category"}`), and a 400
//! naming every call Verity does not serve. The official SDK drives the rest against a real
//! inference worker in `inference_api.rs`.

mod api_support;

use api_support::*;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};

/// `method uri` with the Tinker SDK's credential header.
async fn tinker(app: &TestApp, method: Method, uri: &str, key: &str, body: Value) -> Reply {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    send(&app.router, request).await
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sessions_and_futures_are_the_orgs_and_unserved_calls_are_named(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let a = format!("tml-{}", user(&pool, "a@a.io", "org-a", "member").await);
    let b = user(&pool, "b@b.io", "org-b", "member").await;
    let post = |uri: &'static str, key: &str, body: Value| {
        let key = key.to_string();
        let app = &app;
        async move { tinker(app, Method::POST, uri, &key, body).await }
    };

    // The credential: a key in its tml- form or as it is; anything else is a 401.
    assert_eq!(post("/api/v1/client/config", &a, json!({})).await.status, StatusCode::OK);
    assert_eq!(post("/api/v1/client/config", &b, json!({})).await.status, StatusCode::OK);
    let forged = post("/api/v1/client/config", "tml-vt-nope", json!({})).await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    let jwt = post("/api/v1/auth/token", &a, json!({})).await;
    assert_eq!(jwt.status, StatusCode::OK, "{:?}", jwt.json());
    let jwt = jwt.json()["jwt"].as_str().unwrap().to_string();
    assert!(jwt.starts_with("eyJ"), "{jwt}");

    let session =
        post("/api/v1/create_session", &jwt, json!({"tags": ["t"], "type": "create_session"}))
            .await
            .json()["session_id"]
            .as_str()
            .unwrap()
            .to_string();
    let beat = json!({"session_id": session, "type": "session_heartbeat"});
    assert_eq!(post("/api/v1/session_heartbeat", &a, beat.clone()).await.status, StatusCode::OK);
    assert_eq!(post("/api/v1/session_heartbeat", &b, beat.clone()).await.status, StatusCode::GONE);

    // A sampling session names a model the org can use; another org cannot open one on the
    // session, nor read it.
    let open = |model: &str| json!({"session_id": session, "sampling_session_seq_id": 0, "base_model": model});
    let missing = post("/api/v1/create_sampling_session", &a, open("nope")).await;
    assert_error(&missing, StatusCode::BAD_REQUEST, Some("base_model"));
    let foreign = post("/api/v1/create_sampling_session", &b, open("tiny")).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{:?}", foreign.json());
    let sampler = post("/api/v1/create_sampling_session", &a, open("tiny")).await.json()
        ["sampling_session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let uri = format!("/api/v1/samplers/{sampler}");
    let got = tinker(&app, Method::GET, &uri, &a, json!({})).await;
    assert_eq!(got.json()["base_model"], "tiny", "{:?}", got.json());
    assert_eq!(tinker(&app, Method::GET, &uri, &b, json!({})).await.status, StatusCode::NOT_FOUND);

    // Bad sampling requests name their field; a good one is a future that, with no inference
    // worker, fails as the server's fault.
    let sample = |params: Value, chunks: Value| {
        json!({"sampling_session_id": sampler, "num_samples": 2, "seq_id": 0, "type": "sample",
               "prompt": {"chunks": chunks}, "sampling_params": params})
    };
    let text = json!([{"type": "encoded_text", "tokens": [1, 2, 3]}]);
    for (params, chunks, field) in [
        (json!({"top_k": 5}), text.clone(), "sampling_params.top_k"),
        (json!({"top_p": 0}), text.clone(), "sampling_params.top_p"),
        (json!({"stop": [1.5]}), text.clone(), "sampling_params.stop.0"),
        (
            json!({}),
            json!([{"type": "image", "data": "", "format": "png"}]),
            "prompt.chunks.0.type",
        ),
        (json!({}), json!([{"type": "encoded_text", "tokens": [-1]}]), "prompt.chunks.0.tokens.0"),
    ] {
        let refused = post("/api/v1/asample", &a, sample(params, chunks)).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, Some(field));
    }
    let mut logprobs = sample(json!({"max_tokens": 2}), text.clone());
    logprobs["topk_prompt_logprobs"] = json!(2);
    let refused = post("/api/v1/asample", &a, logprobs).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("topk_prompt_logprobs"));
    let started = post("/api/v1/asample", &a, sample(json!({"max_tokens": 2}), text)).await;
    assert_eq!(started.status, StatusCode::OK, "{:?}", started.json());
    let request = started.json()["request_id"].as_str().unwrap().to_string();
    assert_eq!(started.json()["sample_sequence_ids"].as_array().unwrap().len(), 2);
    let retrieve = json!({"request_id": request, "allow_metadata_only": true});
    let other = post("/api/v1/retrieve_future", &b, retrieve.clone()).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    let failed = post("/api/v1/retrieve_future", &a, retrieve).await;
    assert_eq!(failed.status, StatusCode::OK);
    assert_eq!(failed.json()["category"], "server", "{:?}", failed.json());
    assert!(failed.json()["error"].as_str().unwrap().contains("verity inference"));

    // Training calls are not served: a 400 naming the call, never a hang.
    let refused = post("/api/v1/create_model", &a, json!({"session_id": session})).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("call"));
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("create_model"));

    let finish = format!("/api/v1/sessions/{session}/finish");
    let done = json!({"reason": {"type": "success"}});
    assert_eq!(
        tinker(&app, Method::POST, &finish, &b, done.clone()).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(tinker(&app, Method::POST, &finish, &a, done).await.status, StatusCode::OK);
    assert_eq!(post("/api/v1/session_heartbeat", &a, beat).await.status, StatusCode::GONE);
}

/// One org's pending sampling calls are capped (`VERITY_TINKER_ORG_PENDING`): beyond, `asample`
/// is a 429 the SDK waits out and sends again; another org samples on.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_orgs_pending_sampling_calls_are_capped(pool: sqlx::PgPool) {
    let mut config = api_config();
    config.limits.tinker_org_pending = 1;
    let app = app_with(pool.clone(), config, |_| {}).await;
    base_model(&app).await;
    let a = user(&pool, "a@a.io", "org-a", "member").await;
    let b = user(&pool, "b@b.io", "org-b", "member").await;
    let org_a =
        verity_core::tenancy::find_user_by_email(&pool, "a@a.io").await.unwrap().unwrap().org_id;
    // Org A has one call pending (as a long generation would be).
    verity_core::tinker::create_future(&pool, org_a, "sample").await.unwrap();
    let sample = json!({"base_model": "tiny", "num_samples": 1, "sampling_params": {"max_tokens": 1},
                        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}});
    let refused = tinker(&app, Method::POST, "/api/v1/asample", &a, sample.clone()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", refused.json());
    assert_eq!(refused.json()["error"]["code"], "tinker_pending_limit");
    assert!(refused.headers.contains_key("retry-after"));
    let other = tinker(&app, Method::POST, "/api/v1/asample", &b, sample).await;
    assert_eq!(other.status, StatusCode::OK, "{:?}", other.json());
}
