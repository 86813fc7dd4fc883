//! Authentication and tenancy: JWT minting and tampering, roles, rate limits, and isolation
//! of every endpoint between orgs (another org's id answers 404).

use verity_tests::api_support;

use api_support::*;
use axum::http::{Method, StatusCode};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use verity_core::tenancy::Role;
use verity_server::api::auth::tokens::{Claims, TokenService, TokenSettings, TokenSource};

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

async fn token(app: &TestApp, body: Value) -> Reply {
    call(&app.router, Method::POST, "/v1/auth/token", None, Some(body)).await
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn tokens_are_minted_and_tampering_is_rejected(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;

    let by_password = token(&app, json!({"email": "a@x.io", "password": "password123"})).await;
    assert_eq!(by_password.status, StatusCode::OK, "{:?}", by_password.json());
    assert_eq!(by_password.json()["token_type"], "Bearer");
    let jwt = by_password.json()["access_token"].as_str().unwrap().to_string();
    assert_eq!(get(&app.router, "/v1/files", &jwt).await.status, StatusCode::OK);
    let by_key = token(&app, json!({"api_key": key})).await.json();
    assert_eq!(
        get(&app.router, "/v1/fine_tuning/jobs", by_key["access_token"].as_str().unwrap())
            .await
            .status,
        StatusCode::OK
    );

    for body in [
        json!({"email": "a@x.io", "password": "wrong-password"}),
        json!({"email": "nobody@x.io", "password": "password123"}),
        json!({"api_key": format!("vt-{}", "b".repeat(40))}),
    ] {
        assert_eq!(token(&app, body).await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(token(&app, json!({"email": "a@x.io"})).await.status, StatusCode::BAD_REQUEST);

    let parts: Vec<&str> = jwt.split('.').collect();
    let payload: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    let mut escalated = payload.clone();
    escalated["role"] = json!("admin");
    escalated["org"] = json!(uuid::Uuid::new_v4());
    let alg_none = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT"})), parts[1]);
    let alg_none_signed =
        format!("{}.{}.{}", b64(&json!({"alg": "none", "typ": "JWT"})), parts[1], parts[2]);
    let hs512_header =
        format!("{}.{}.{}", b64(&json!({"alg": "HS512", "typ": "JWT"})), parts[1], parts[2]);
    let tampered = format!("{}.{}.{}", parts[0], b64(&escalated), parts[2]);
    let truncated_sig = format!("{}.{}.{}", parts[0], parts[1], &parts[2][..parts[2].len() - 2]);

    let service = |secret: &str, issuer: &str, audience: &str| {
        TokenService::new(TokenSettings {
            secret: secret.as_bytes().to_vec(),
            issuer: issuer.into(),
            audience: audience.into(),
            ttl: std::time::Duration::from_secs(60),
        })
    };
    let claims = |exp_offset: i64, iss: &str, aud: &str| Claims {
        sub: serde_json::from_value(payload["sub"].clone()).unwrap(),
        org: serde_json::from_value(payload["org"].clone()).unwrap(),
        role: Role::Member,
        iss: iss.into(),
        aud: aud.into(),
        iat: chrono::Utc::now().timestamp() - 1000,
        exp: chrono::Utc::now().timestamp() + exp_offset,
        src: TokenSource::Password,
        kid: None,
    };
    let ours = service(JWT_SECRET, "verity", "verity-api");
    let wrong_key = service("another-secret-another-secret-another", "verity", "verity-api")
        .mint_claims(&claims(600, "verity", "verity-api"))
        .unwrap();
    let expired = ours.mint_claims(&claims(-120, "verity", "verity-api")).unwrap();
    let wrong_issuer = ours.mint_claims(&claims(600, "evil", "verity-api")).unwrap();
    let wrong_audience = ours.mint_claims(&claims(600, "verity", "other-api")).unwrap();
    let valid = ours.mint_claims(&claims(600, "verity", "verity-api")).unwrap();
    assert_eq!(
        get(&app.router, "/v1/files", &valid).await.status,
        StatusCode::OK,
        "control: a well-formed token works"
    );

    for (name, bad) in [
        ("alg none", alg_none),
        ("alg none with signature", alg_none_signed),
        ("alg switched", hs512_header),
        ("tampered payload", tampered),
        ("truncated signature", truncated_sig),
        ("wrong key", wrong_key),
        ("expired", expired),
        ("wrong issuer", wrong_issuer),
        ("wrong audience", wrong_audience),
        ("garbage", "abc.def.ghi".to_string()),
    ] {
        let reply = get(&app.router, "/v1/files", &bad).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{name} accepted");
        assert_eq!(reply.json()["error"]["type"], "authentication_error", "{name}");
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn rate_limit_answers_429_with_retry_after(pool: sqlx::PgPool) {
    let mut config = api_config();
    config.rate_limit_rps = 0.5;
    config.rate_limit_burst = 3.0;
    let app = app_with(pool.clone(), config, |_| {}).await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let other = user(&pool, "b@x.io", "acme", "member").await;
    for _ in 0..3 {
        assert_eq!(get(&app.router, "/v1/files", &key).await.status, StatusCode::OK);
    }
    let limited = get(&app.router, "/v1/files", &key).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.json()["error"]["code"], "rate_limit_exceeded");
    let retry: u64 = limited.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    assert_eq!(
        get(&app.router, "/v1/files", &other).await.status,
        StatusCode::OK,
        "buckets are per key"
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn another_orgs_ids_answer_404_everywhere(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let alice = user(&pool, "alice@a.io", "org-a", "admin").await;
    let mallory = user(&pool, "mallory@b.io", "org-b", "admin").await;
    let (file, job) = file_and_job(&app, &alice).await;

    // A checkpoint in org A's job.
    let worker = verity_core::queue::WorkerInfo::new(verity_core::queue::DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.bin"), b"x").unwrap();
    let prefix = format!("jobs/{job}/checkpoints/step-1");
    verity_core::storage::publish_folder(app.state.store.as_ref(), dir.path(), &prefix)
        .await
        .unwrap();
    let ckpt = lease.checkpoint(1, &prefix, 1, None).await.unwrap();
    lease.metric(1, &json!({"reward": 1})).await.unwrap();

    let jobs = format!("/v1/fine_tuning/jobs/{job}");
    let requests: Vec<(Method, String)> = vec![
        (Method::GET, format!("/v1/files/{file}")),
        (Method::GET, format!("/v1/files/{file}/content")),
        (Method::DELETE, format!("/v1/files/{file}")),
        (Method::GET, jobs.clone()),
        (Method::POST, format!("{jobs}/cancel")),
        (Method::POST, format!("{jobs}/pause")),
        (Method::POST, format!("{jobs}/resume")),
        (Method::GET, format!("{jobs}/events")),
        (Method::GET, format!("{jobs}/checkpoints")),
        (Method::GET, format!("{jobs}/checkpoints/{ckpt}")),
        (Method::GET, format!("{jobs}/checkpoints/{ckpt}/content")),
        (Method::GET, format!("{jobs}/checkpoints/{ckpt}/content?redirect=1")),
        (Method::DELETE, format!("{jobs}/checkpoints/{ckpt}")),
        (Method::GET, format!("{jobs}/metrics")),
        (Method::GET, format!("{jobs}/metrics?format=csv")),
        (Method::GET, format!("{jobs}/samples")),
    ];
    for (method, uri) in &requests {
        let body = (method == Method::POST).then(|| json!({}));
        let reply = call(&app.router, method.clone(), uri, Some(&mallory), body).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{method} {uri}: {}",
            String::from_utf8_lossy(&reply.bytes)
        );
        assert_eq!(reply.json()["error"]["code"], "not_found");
    }
    // Lists do not leak, and org A's file cannot be used in org B's job.
    for list in ["/v1/files", "/v1/fine_tuning/jobs"] {
        assert_eq!(get(&app.router, list, &mallory).await.json()["data"], json!([]), "{list}");
    }
    let models = get(&app.router, "/v1/models", &mallory).await.json();
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "only the shared base model: {models}");
    let steal = post(
        &app.router,
        "/v1/fine_tuning/jobs",
        &mallory,
        json!({"model": "tiny", "training_file": file, "method": method()}),
    )
    .await;
    assert_eq!(steal.status, StatusCode::BAD_REQUEST);
    assert_eq!(steal.json()["error"]["param"], "training_file");

    // Nothing changed for org A.
    for (method, uri) in &requests {
        if method == Method::GET {
            assert!(
                call(&app.router, method.clone(), uri, Some(&alice), None)
                    .await
                    .status
                    .is_success()
                    || uri.contains("redirect"),
                "{uri}"
            );
        }
    }
    assert_eq!(get(&app.router, &jobs, &alice).await.json()["status"], "running");
}
