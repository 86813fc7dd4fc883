//! The Tinker API at the router (a fresh Postgres database, no inference worker): the SDK's
//! `X-API-Key` header with a key in its `tml-` form, sessions and sampling sessions scoped to
//! the org, futures read back (a failed call as the SDK's `{"error", "category"}`), and a 400
//! naming every call Verity does not serve. The official SDK drives the rest against a real
//! inference worker in `inference_api.rs`.

use verity_tests::api_support;

use api_support::*;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use prost::Message;
use serde_json::{json, Value};
use std::collections::HashMap;
use verity_server::api::tinker::proto::int32s;
use verity_server::api::tinker::training_proto::{
    Chunk, ChunkKind, DType, EncodedTextChunk, Encoding, ForwardBackwardRequest, Tensor, WireDatum,
};

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

/// A router with the tiny base model and a user in each of two orgs: org A's key in its `tml-`
/// form (as the SDK sends it), org B's as it is.
async fn two_orgs(pool: &sqlx::PgPool) -> (TestApp, String, String) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let a = format!("tml-{}", user(pool, "a@a.io", "org-a", "member").await);
    let b = user(pool, "b@b.io", "org-b", "member").await;
    (app, a, b)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sessions_and_futures_are_the_orgs_and_unserved_calls_are_named(pool: sqlx::PgPool) {
    let (app, a, b) = two_orgs(&pool).await;
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

    // What is not served is a 400 naming the call, never a hang.
    let refused = post("/api/v1/copy_weights", &a, json!({"model_id": "x"})).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("call"));
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("copy_weights"));
    let unknown = "/api/v1/training_runs/tinkjob-x/checkpoints/weights/c1/archive";
    let refused = post(unknown, &a, json!({})).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("call"));
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("c1/archive"));
    // Publishing is served: a path the org does not have is a 404.
    let publish = "/api/v1/training_runs/tinkjob-x/checkpoints/weights/c1/publish";
    let missing = post(publish, &a, json!({})).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{:?}", missing.json());

    let finish = format!("/api/v1/sessions/{session}/finish");
    let done = json!({"reason": {"type": "success"}});
    assert_eq!(
        tinker(&app, Method::POST, &finish, &b, done.clone()).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(tinker(&app, Method::POST, &finish, &a, done).await.status, StatusCode::OK);
    assert_eq!(post("/api/v1/session_heartbeat", &a, beat).await.status, StatusCode::GONE);
}

/// `list_sessions` and `get_session`: the org's sessions newest first, each with the training
/// runs and samplers it opened, its display name and metadata (strings, as the SDK types them);
/// another org's session is unknown, and bad names, scopes and pages are 400s naming the field.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sessions_list_and_show_what_they_opened(pool: sqlx::PgPool) {
    let (app, a, b) = two_orgs(&pool).await;
    let call = |method: Method, uri: String, key: &str, body: Value| {
        let key = key.to_string();
        let app = &app;
        async move { tinker(app, method, &uri, &key, body).await }
    };
    let open =
        |key: &str, body: Value| call(Method::POST, "/api/v1/create_session".into(), key, body);
    let first = open(&a, json!({"tags": [], "user_metadata": null, "sdk_version": "0.38.0"})).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.json());
    let first = first.json()["session_id"].as_str().unwrap().to_string();
    let named = json!({"tags": ["rl"], "sdk_version": "0.38.0", "type": "create_session",
                       "display_name": "arithmetic RL", "project_id": null,
                       "user_metadata": {"run": "7", "lr": 0.0001, "ok": true}});
    let second = open(&a, named).await.json()["session_id"].as_str().unwrap().to_string();
    let other_org = open(&b, json!({})).await.json()["session_id"].as_str().unwrap().to_string();

    // Bad bodies change nothing and name their field.
    let long = open(&a, json!({"display_name": "x".repeat(257)})).await;
    assert_error(&long, StatusCode::BAD_REQUEST, Some("display_name"));
    let nul = open(&a, json!({"user_metadata": {"k": "a\0b"}})).await;
    assert_error(&nul, StatusCode::BAD_REQUEST, Some("user_metadata"));

    // The second session opens a training client and a sampler.
    let client = json!({"session_id": second, "model_seq_id": 0, "base_model": "tiny",
                        "lora_config": {"rank": 4}, "type": "create_model"});
    let created = call(Method::POST, "/api/v1/create_model".into(), &a, client).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let run: String = sqlx::query_scalar("SELECT id FROM jobs").fetch_one(&pool).await.unwrap();
    let sampler = json!({"session_id": second, "sampling_session_seq_id": 0, "base_model": "tiny"});
    let sampler = call(Method::POST, "/api/v1/create_sampling_session".into(), &a, sampler).await;
    let sampler = sampler.json()["sampling_session_id"].as_str().unwrap().to_string();

    let listed = call(Method::GET, "/api/v1/sessions".into(), &a, json!({})).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.json());
    assert_eq!(listed.json()["sessions"], json!([second, first]), "newest first, the org's own");
    assert_eq!(listed.json()["cursor"]["total_count"], 2);
    let page = call(Method::GET, "/api/v1/sessions?limit=1&offset=1".into(), &a, json!({})).await;
    assert_eq!(page.json()["sessions"], json!([first]), "{:?}", page.json());
    for (query, field) in
        [("limit=0", "limit"), ("offset=-1", "offset"), ("access_scope=all", "access_scope")]
    {
        let refused = call(Method::GET, format!("/api/v1/sessions?{query}"), &a, json!({})).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, Some(field));
    }
    let theirs =
        call(Method::GET, "/api/v1/sessions?access_scope=accessible".into(), &b, json!({}));
    assert_eq!(theirs.await.json()["sessions"], json!([other_org]));

    let shown =
        call(Method::GET, format!("/api/v1/sessions/{second}?access_scope=owned"), &a, json!({}));
    let shown = shown.await;
    assert_eq!(shown.status, StatusCode::OK, "{:?}", shown.json());
    let shown = shown.json();
    assert_eq!(shown["training_run_ids"], json!([run]), "{shown}");
    assert_eq!(shown["sampler_ids"], json!([sampler]), "{shown}");
    assert_eq!(shown["display_name"], "arithmetic RL");
    assert_eq!(shown["user_metadata"], json!({"run": "7", "lr": "0.0001", "ok": "true"}));
    assert_eq!(shown["verity_tags"], json!(["rl"]));
    assert!(shown["verity_finished_at"].is_null(), "{shown}");
    let plain = call(Method::GET, format!("/api/v1/sessions/{first}"), &a, json!({})).await.json();
    assert_eq!(
        (
            plain["display_name"].clone(),
            plain["user_metadata"].clone(),
            plain["training_run_ids"].clone()
        ),
        (Value::Null, json!({}), json!([]))
    );
    // What the SDK's RestClient asks of sessions that Verity does not serve is a 400 naming it.
    for (method, uri) in [
        (Method::POST, "/api/v1/sessions/search".to_string()),
        (Method::PUT, format!("/api/v1/sessions/{first}/project")),
        (Method::GET, format!("/api/v1/sessions/{first}/trace_export")),
        (Method::POST, "/api/v1/sessions".to_string()),
    ] {
        let name = uri.trim_start_matches("/api/v1/").to_string();
        let refused = call(method, uri, &a, json!({})).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, Some("call"));
        let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains(&name), "{message}");
    }
    let foreign = call(Method::GET, format!("/api/v1/sessions/{other_org}"), &a, json!({})).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{:?}", foreign.json());

    // A finished session says so, and why.
    let finish = format!("/api/v1/sessions/{second}/finish");
    let done = call(Method::POST, finish, &a, json!({"reason": {"type": "success"}})).await;
    assert_eq!(done.status, StatusCode::OK);
    let shown = call(Method::GET, format!("/api/v1/sessions/{second}"), &a, json!({})).await.json();
    assert!(shown["verity_finished_at"].is_string(), "{shown}");
    assert_eq!(shown["verity_finish_reason"], "success");

    // The dashboard's Tinker page lists the org's sessions with the runs they opened.
    let cookie = dashboard_cookie(&app.router, "a@a.io").await;
    let (status, page) = dashboard_page(&app.router, "/tinker", &cookie).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(&second) && page.contains("arithmetic RL") && page.contains(&run),
        "{page}"
    );
    assert!(!page.contains(&other_org), "another org's session is listed");
}

/// A session whose client stopped beating (its process died) is closed after
/// `VERITY_TINKER_SESSION_TIMEOUT_SECS`, with reason `heartbeat_timeout`: its parked training
/// clients end, its heartbeats are a 410 from then on, and sessions that still beat stay open.
/// The server's loop does the same on its own.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sessions_without_heartbeats_are_closed_and_release_their_clients(pool: sqlx::PgPool) {
    let (app, a, b) = two_orgs(&pool).await;
    let post = |uri: &'static str, key: &str, body: Value| {
        let key = key.to_string();
        let app = &app;
        async move { tinker(app, Method::POST, uri, &key, body).await }
    };
    let open = |key: &str| {
        let key = key.to_string();
        async move {
            let opened = post("/api/v1/create_session", &key, json!({})).await;
            opened.json()["session_id"].as_str().unwrap().to_string()
        }
    };
    let (dead, dead_elsewhere, alive) = (open(&a).await, open(&b).await, open(&a).await);
    let client = json!({"session_id": dead, "model_seq_id": 0, "base_model": "tiny",
                        "lora_config": {"rank": 4}, "type": "create_model"});
    assert_eq!(post("/api/v1/create_model", &a, client).await.status, StatusCode::OK);
    // Its client was parked (what a worker does to an idle one: see clients::park).
    sqlx::query("UPDATE jobs SET state = 'paused'").execute(&pool).await.unwrap();
    let backdate = "UPDATE tinker_sessions SET last_heartbeat_at = now() - interval '1 hour' \
                    WHERE id = $1";
    for id in [&dead, &dead_elsewhere] {
        sqlx::query(backdate).bind(id).execute(&pool).await.unwrap();
    }

    let timeout = std::time::Duration::from_secs(600);
    let mut closed = verity_core::tinker::expire_sessions(&pool, timeout).await.unwrap();
    closed.sort();
    let mut expected = vec![dead.clone(), dead_elsewhere.clone()];
    expected.sort();
    assert_eq!(closed, expected, "only the sessions that stopped beating");
    let uri = format!("/api/v1/sessions/{dead}");
    let shown = tinker(&app, Method::GET, &uri, &a, json!({})).await.json();
    assert!(shown["verity_finished_at"].is_string(), "{shown}");
    assert_eq!(shown["verity_finish_reason"], "heartbeat_timeout", "{shown}");
    let (state, result): (String, Value) =
        sqlx::query_as("SELECT state, result FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!((state.as_str(), result), ("succeeded", json!({"released": "session_finished"})));
    let beat = |id: &str| json!({"session_id": id, "type": "session_heartbeat"});
    assert_eq!(post("/api/v1/session_heartbeat", &a, beat(&dead)).await.status, StatusCode::GONE);
    assert_eq!(post("/api/v1/session_heartbeat", &a, beat(&alive)).await.status, StatusCode::OK);
    assert!(verity_core::tinker::expire_sessions(&pool, timeout).await.unwrap().is_empty());

    // The server's loop, with a one-second timeout, closes the session that stops beating.
    let expiry =
        verity_server::api::tinker::spawn_expiry(pool.clone(), std::time::Duration::from_secs(1));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let uri = format!("/api/v1/sessions/{alive}");
        let shown = tinker(&app, Method::GET, &uri, &a, json!({})).await.json();
        if shown["verity_finish_reason"] == "heartbeat_timeout" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never closed: {shown}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    expiry.abort();
}

/// One org's pending calls are capped (`VERITY_TINKER_ORG_PENDING`): beyond, `asample` and
/// training calls are a 429 the SDK waits out and sends again; another org samples on.
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
    // Training calls count against the same cap (the SDK sends the same call again).
    let session = tinker(&app, Method::POST, "/api/v1/create_session", &a, json!({})).await.json()
        ["session_id"]
        .clone();
    let create = json!({"session_id": session, "base_model": "tiny", "lora_config": {"rank": 2}});
    let created = tinker(&app, Method::POST, "/api/v1/create_model", &a, create).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let step = json!({"model_id": created.json()["model_id"], "seq_id": 1});
    let refused = tinker(&app, Method::POST, "/api/v1/optim_step", &a, step).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", refused.json());
    assert_eq!(refused.json()["error"]["code"], "tinker_pending_limit");
}

/// A `forward_backward` body as the SDK sends it: one datum, `target_tokens` int64, the float
/// inputs float32.
fn forward_backward_body(
    model_id: &str,
    seq_id: i32,
    loss_fn: &str,
    floats: &[(&str, &[f32])],
) -> Vec<u8> {
    let tensor = |bytes: Vec<u8>, dtype: DType, n: usize| Tensor {
        encoding: Some(Encoding::Dense(bytes)),
        dtype: dtype as i32,
        shape: vec![n as i64],
    };
    let mut inputs = HashMap::new();
    let targets: Vec<u8> = [2i64, 3, 4].iter().flat_map(|t| t.to_le_bytes()).collect();
    inputs.insert("target_tokens".to_string(), tensor(targets, DType::Int64, 3));
    for (name, values) in floats {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        inputs.insert(name.to_string(), tensor(bytes, DType::Float32, values.len()));
    }
    let text = EncodedTextChunk { tokens: int32s(&[1, 2, 3]) };
    let datum = WireDatum {
        model_input: vec![Chunk { chunk: Some(ChunkKind::EncodedText(text)) }],
        loss_fn_inputs: inputs,
    };
    ForwardBackwardRequest {
        model_id: model_id.into(),
        seq_id,
        data: vec![datum],
        loss_fn: loss_fn.into(),
        ..ForwardBackwardRequest::default()
    }
    .encode_to_vec()
}

/// Training clients at the router (no training worker): `create_model` queues a client of the
/// org's session (the same request again answers the same client), bad settings and bad calls
/// are 400s naming their field, calls are the client's org's only, and once the client has
/// ended its waiting calls fail instead of hanging, and new ones are refused.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn training_clients_queue_their_calls_and_name_bad_fields(pool: sqlx::PgPool) {
    let (app, a, b) = two_orgs(&pool).await;
    let post = |uri: &'static str, key: &str, body: Value| {
        let key = key.to_string();
        let app = &app;
        async move { tinker(app, Method::POST, uri, &key, body).await }
    };
    let session = post("/api/v1/create_session", &a, json!({})).await.json()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let create = |rank: u32, model: &str| {
        json!({"session_id": session, "model_seq_id": 0, "base_model": model,
               "lora_config": {"rank": rank}, "optimizer_config": {"type": "adamw"},
               "type": "create_model"})
    };
    let refused = post("/api/v1/create_model", &a, create(0, "tiny")).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("lora_config.rank"));
    let refused = post("/api/v1/create_model", &a, create(4, "nope")).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("base_model"));
    let foreign = post("/api/v1/create_model", &b, create(4, "tiny")).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{:?}", foreign.json());
    let created = post("/api/v1/create_model", &a, create(4, "tiny")).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let model_id = created.json()["model_id"].as_str().unwrap().to_string();
    assert_eq!(model_id, format!("{session}:train:0"));
    let again = post("/api/v1/create_model", &a, create(4, "tiny")).await;
    assert_eq!(again.json(), created.json(), "a retried create_model is the same client");
    // The client is a queue row of its own kind: not a fine-tuning job.
    let kinds: Vec<(String, String)> =
        sqlx::query_as("SELECT id, kind FROM jobs").fetch_all(&pool).await.unwrap();
    assert!(
        kinds.len() == 1 && kinds[0].0.starts_with("tinkjob-") && kinds[0].1 == "tinker",
        "{kinds:?}"
    );
    let jobs = get(&app.router, "/v1/fine_tuning/jobs", &a[4..]).await;
    assert_eq!(jobs.json()["data"], json!([]), "{:?}", jobs.json());

    let info = post("/api/v1/get_info", &a, json!({"model_id": model_id})).await.json();
    assert_eq!(info["model_data"]["model_name"], "tiny", "{info}");
    assert_eq!((info["is_lora"].clone(), info["lora_rank"].clone()), (json!(true), json!(4)));
    assert_eq!(
        post("/api/v1/get_info", &b, json!({"model_id": model_id})).await.status,
        StatusCode::NOT_FOUND
    );

    let forward_backward = |key: &str, body: Vec<u8>| {
        let request = Request::builder()
            .method(Method::POST)
            .uri("/api/v1/forward_backward")
            .header("x-api-key", key)
            .header("content-type", "application/x-protobuf")
            .body(Body::from(body))
            .unwrap();
        let app = &app;
        async move { send(&app.router, request).await }
    };
    // A refused call still takes its place in the client's order (the SDK has numbered the
    // calls after it), filled with a call that fails at once.
    let bad = forward_backward(&a, forward_backward_body(&model_id, 1, "dro", &[])).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, Some("loss_fn"));
    let missing = forward_backward(
        &a,
        forward_backward_body(&model_id, 2, "ppo", &[("advantages", &[1.0; 3])]),
    )
    .await;
    assert_error(&missing, StatusCode::BAD_REQUEST, Some("data[0].loss_fn_inputs.logprobs"));
    let body = forward_backward_body(&model_id, 3, "cross_entropy", &[("weights", &[1.0; 3])]);
    let foreign = forward_backward(&b, body.clone()).await;
    assert_error(&foreign, StatusCode::BAD_REQUEST, Some("model_id"));
    let queued = forward_backward(&a, body.clone()).await;
    assert_eq!(queued.status, StatusCode::OK, "{:?}", queued.json());
    let request = queued.json()["request_id"].as_str().unwrap().to_string();
    assert_eq!(
        forward_backward(&a, body).await.json()["request_id"],
        request.as_str(),
        "a retried call is the same call"
    );
    let step = |seq: i32, beta1: f64| {
        json!({"model_id": model_id, "seq_id": seq, "type": "optim_step",
                                             "adam_params": {"learning_rate": 1e-4, "beta1": beta1}})
    };
    let refused = post("/api/v1/optim_step", &a, step(4, 1.5)).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("adam_params.beta1"));
    assert_eq!(post("/api/v1/optim_step", &a, step(5, 0.9)).await.status, StatusCode::OK);
    let save = json!({"model_id": model_id, "seq_id": 6, "path": "../x", "kind": "snapshot"});
    assert_error(
        &post("/api/v1/save_weights_for_sampler", &a, save).await,
        StatusCode::BAD_REQUEST,
        Some("path"),
    );
    let calls: Vec<(i32, String)> =
        sqlx::query_as("SELECT seq_id, kind FROM tinker_calls ORDER BY seq_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let order: Vec<(i32, &str)> = calls.iter().map(|(seq, kind)| (*seq, kind.as_str())).collect();
    assert_eq!(
        order,
        [
            (1, "refused"),
            (2, "refused"),
            (3, "forward_backward"),
            (4, "refused"),
            (5, "optim_step"),
            (6, "refused")
        ]
    );

    // The dashboard's Tinker page lists the run; its page shows the call log, refusals included.
    let job_id = &kinds[0].0;
    let cookie = dashboard_cookie(&app.router, "a@a.io").await;
    let (status, html) = dashboard_page(&app.router, "/tinker", &cookie).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains(job_id.as_str()) && html.contains("LoRA rank 4"), "{html}");
    let (status, html) = dashboard_page(&app.router, &format!("/tinker/{job_id}"), &cookie).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains("forward_backward")
            && html.contains("optim_step")
            && html.contains("refused"),
        "{html}"
    );
    let other = dashboard_cookie(&app.router, "b@b.io").await;
    let (status, _) = dashboard_page(&app.router, &format!("/tinker/{job_id}"), &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another org's run is not found");
    // A paused client is shown as what it is: parked, back on its next call.
    app.state.queue.pause(job_id).await.unwrap();
    let (_, html) = dashboard_page(&app.router, &format!("/tinker/{job_id}"), &cookie).await;
    assert!(html.contains(">parked<") && html.contains("its next call restores it"), "{html}");
    app.state.queue.resume(job_id).await.unwrap();

    // Saved weights are the org's: another org's `weights_info` and delete are 404s that change
    // nothing; the owner's delete removes the path, and the checkpoint no other path holds.
    let org: uuid::Uuid = sqlx::query_scalar("SELECT org_id FROM jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    // A checkpoint as the client's worker writes one, under its lease.
    let worker = verity_core::queue::WorkerInfo::new(verity_core::queue::DeviceKind::Cpu, 4096);
    let lease = app.state.queue.claim(&worker).await.unwrap().expect("the client's row");
    let prefix = verity_core::keys::checkpoint(job_id, 0);
    lease.checkpoint(0, &prefix, 0, None).await.unwrap();
    let record = |path: String, kind: &'static str| {
        let (pool, model_id) = (pool.clone(), model_id.clone());
        async move {
            let saved = verity_core::tinker::clients::SavedWeights {
                path: &path,
                kind,
                step: 0,
                model: "ft:tiny:w0",
                ttl_seconds: None,
            };
            let recorded =
                verity_core::tinker::clients::record_checkpoint(&pool, org, &model_id, &saved);
            assert!(recorded.await.unwrap(), "the checkpoint exists");
            path
        }
    };
    let path = record(format!("tinker://{job_id}/weights/w0"), "training").await;
    // The dashboard deletes a second path onto the same checkpoint (asking first): the
    // checkpoint stays, "w0" still holding it.
    let second = record(format!("tinker://{job_id}/sampler_weights/v0"), "sampler").await;
    let (_, html) = dashboard_page(&app.router, &format!("/tinker/{job_id}"), &cookie).await;
    assert!(html.contains("/saved/delete?path=tinker%3A"), "{html}");
    let action = format!("/tinker/{job_id}/saved/delete?path={}", second.replace(':', "%3A"));
    let form = |cookie: &str, body: &'static str| {
        let request = Request::builder()
            .method(Method::POST)
            .uri(&action)
            .header("cookie", cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        let router = app.router.clone();
        async move { send(&router, request).await }
    };
    let asked = form(&cookie, "").await;
    assert_eq!(asked.status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&asked.bytes).contains("id=\"confirm-question\""));
    assert_eq!(form(&other, "confirm=yes").await.status, StatusCode::NOT_FOUND);
    let elsewhere = action.replacen(job_id.as_str(), "tinkjob-other", 1);
    let mismatched = Request::builder()
        .method(Method::POST)
        .uri(&elsewhere)
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("confirm=yes"))
        .unwrap();
    let mismatched = send(&app.router, mismatched).await;
    assert_eq!(mismatched.status, StatusCode::NOT_FOUND, "a path of another run is not this run's");
    assert_eq!(form(&cookie, "confirm=yes").await.status, StatusCode::SEE_OTHER);
    let paths: Vec<String> =
        sqlx::query_scalar("SELECT path FROM tinker_checkpoints").fetch_all(&pool).await.unwrap();
    assert_eq!(paths, std::slice::from_ref(&path));
    let info = |key: &str| post("/api/v1/weights_info", key, json!({"tinker_path": path}));
    assert_eq!(info(&b).await.status, StatusCode::NOT_FOUND);
    let mine = info(&a).await;
    assert_eq!(mine.status, StatusCode::OK, "{:?}", mine.json());
    let expected = json!({"base_model": "tiny", "is_lora": true, "lora_rank": 4});
    for field in ["base_model", "is_lora", "lora_rank"] {
        assert_eq!(mine.json()[field], expected[field], "{:?}", mine.json());
    }
    // The dashboard publishes the path (asking first): another org reads it then; Unpublish
    // (no question) makes it the org's alone again.
    let (_, html) = dashboard_page(&app.router, &format!("/tinker/{job_id}"), &cookie).await;
    assert!(html.contains("/saved/publish?path=tinker%3A") && html.contains(">Publish<"), "{html}");
    let publication = |public: bool, body: &'static str| {
        let uri = format!(
            "/tinker/{job_id}/saved/publish?path={}&public={public}",
            path.replace(':', "%3A")
        );
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("cookie", &cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        let router = app.router.clone();
        async move { send(&router, request).await.status }
    };
    assert_eq!(publication(true, "").await, StatusCode::OK, "asked first");
    assert_eq!(info(&b).await.status, StatusCode::NOT_FOUND);
    assert_eq!(publication(true, "confirm=yes").await, StatusCode::SEE_OTHER);
    assert_eq!(info(&b).await.status, StatusCode::OK);
    let (_, html) = dashboard_page(&app.router, &format!("/tinker/{job_id}"), &cookie).await;
    assert!(html.contains(">public<") && html.contains(">Unpublish<"), "{html}");
    assert_eq!(publication(false, "").await, StatusCode::SEE_OTHER);
    assert_eq!(info(&b).await.status, StatusCode::NOT_FOUND);
    let delete_uri = format!("/api/v1/training_runs/{job_id}/checkpoints/weights/w0");
    let foreign = tinker(&app, Method::DELETE, &delete_uri, &b, json!({})).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    let held = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!((held("tinker_checkpoints").await, held("checkpoints").await), (1, 1));
    let deleted = tinker(&app, Method::DELETE, &delete_uri, &a, json!({})).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!((held("tinker_checkpoints").await, held("checkpoints").await), (0, 0));
    let again = tinker(&app, Method::DELETE, &delete_uri, &a, json!({})).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert_eq!(info(&a).await.status, StatusCode::NOT_FOUND);

    // The client ends (its worker stopped): the waiting call fails, new calls are refused.
    lease.fail("the worker stopped", false).await.unwrap();
    let retrieve = json!({"request_id": request, "allow_metadata_only": true});
    let failed = post("/api/v1/retrieve_future", &a, retrieve).await.json();
    assert_eq!(failed["category"], "server", "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("ended"), "{failed}");
    let late = post("/api/v1/optim_step", &a, json!({"model_id": model_id, "seq_id": 7})).await;
    assert_eq!(late.status, StatusCode::GONE, "{:?}", late.json());
    assert_eq!(late.json()["error"]["code"], "training_client_ended", "{:?}", late.json());
}

/// A client created by a base model's hub id trains that model, and the SDK is told to load
/// its tokenizer by the hub id (which transformers finds in the hub cache `verity models pull`
/// filled), whichever name the client was created with.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_client_named_by_hub_id_trains_the_model_and_loads_its_tokenizer_by_it(
    pool: sqlx::PgPool,
) {
    let (app, a, _) = two_orgs(&pool).await;
    let given = verity_core::models::set_hub_id(&pool, "tiny", "acme/Tiny-1").await.unwrap();
    assert_eq!(given, verity_core::models::HubIdSet::Set);
    let post = |uri: &'static str, body: Value| {
        let (app, a) = (&app, a.clone());
        async move { tinker(app, Method::POST, uri, &a, body).await }
    };
    let session = post("/api/v1/create_session", json!({})).await.json()["session_id"].clone();
    for (seq, base_model) in [(0, "acme/Tiny-1"), (1, "tiny")] {
        let create = json!({"session_id": session, "model_seq_id": seq, "base_model": base_model,
                            "lora_config": {"rank": 4}, "type": "create_model"});
        let created = post("/api/v1/create_model", create).await;
        assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
        let model_id = created.json()["model_id"].clone();
        let info = post("/api/v1/get_info", json!({"model_id": model_id})).await.json();
        assert_eq!(info["model_name"], "tiny", "{info}");
        assert_eq!(info["model_data"]["tokenizer_id"], "acme/Tiny-1", "{info}");
    }
    let create = json!({"session_id": session, "model_seq_id": 2, "base_model": "acme/None",
                        "lora_config": {"rank": 4}, "type": "create_model"});
    let refused = post("/api/v1/create_model", create).await;
    assert_error(&refused, StatusCode::BAD_REQUEST, Some("base_model"));
}
