//! The holes of issue #19, closed: a model can only be registered over the caller's org's own
//! storage (with one answer for every other prefix, so nothing leaks about other orgs' objects),
//! and everything derived from an API key dies with it, on every server at once.

use verity_tests::api_support;

use api_support::*;
use axum::http::{Method, StatusCode};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use verity_core::tenancy::Role;
use verity_server::api::auth::tokens::{Claims, TokenSource};

/// Publishes one object under `prefix/` in the app's store.
async fn publish(app: &TestApp, prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"weights").unwrap();
    verity_core::storage::publish_folder(app.state.store.as_ref(), dir.path(), prefix)
        .await
        .unwrap();
}

/// Creates `owner`'s job (the only queued one) and a checkpoint of it at step 1; the job id.
async fn job_with_checkpoint(app: &TestApp, owner: &str) -> (String, String) {
    let (file, job) = file_and_job(app, owner).await;
    let worker = verity_core::queue::WorkerInfo::new(verity_core::queue::DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(lease.job().id, job);
    let prefix = format!("jobs/{job}/checkpoints/step-1");
    publish(app, &prefix).await;
    lease.checkpoint(1, &prefix, 1, None).await.unwrap();
    (file, job)
}

fn register(id: &str, prefix: &str) -> Value {
    json!({"id": id, "storage_prefix": prefix})
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn models_register_only_over_the_orgs_own_storage(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let bob = user(&pool, "bob@b.io", "org-b", "admin").await;
    let alice = user(&pool, "alice@a.io", "org-a", "admin").await;
    let member = user(&pool, "mia@a.io", "org-a", "member").await;

    // Org B's objects of every kind: a file, a checkpoint, samples, metrics, a private model.
    let (file_b, job_b) = job_with_checkpoint(&app, &bob).await;
    let file_key = format!("files/{file_b}.jsonl");
    assert!(app.state.store.head(&file_key).await.unwrap().is_some());
    let samples = format!("jobs/{job_b}/samples/step-1.jsonl");
    app.state.store.put_bytes(&samples, bytes::Bytes::from_static(b"{}\n")).await.unwrap();
    app.state
        .store
        .put_bytes(&format!("jobs/{job_b}/metrics.jsonl"), bytes::Bytes::from_static(b"{}\n"))
        .await
        .unwrap();
    publish(&app, "models/b-private").await;
    let own =
        post(&app.router, "/v1/models", &bob, register("b-private", "models/b-private")).await;
    assert_eq!(own.status, StatusCode::OK, "{:?}", own.json());
    let checkpoint = format!("jobs/{job_b}/checkpoints/step-1");
    let own = post(&app.router, "/v1/models", &bob, register("b-step-1", &checkpoint)).await;
    assert_eq!(
        own.status,
        StatusCode::OK,
        "an admin registers its org's checkpoint: {:?}",
        own.json()
    );
    assert_eq!(own.json()["owned_by"], app_org(&pool, "bob@b.io").await);
    let own = post(&app.router, "/v1/models", &bob, register("b-file", &file_key)).await;
    assert_eq!(own.status, StatusCode::OK, "{:?}", own.json());

    // Org A tries each of them, and siblings that do not exist: one identical 404 for all.
    let existing = [
        checkpoint.clone(),
        format!("{checkpoint}/"),
        format!("{checkpoint}/model.safetensors"),
        samples.clone(),
        format!("jobs/{job_b}/samples"),
        format!("jobs/{job_b}/metrics.jsonl"),
        format!("jobs/{job_b}"),
        file_key.clone(),
        "models/b-private".to_string(),
        "models/b-private/model.safetensors".to_string(),
    ];
    let missing = [
        format!("jobs/{job_b}/checkpoints/step-2"),
        format!("jobs/{job_b}/samples/step-9.jsonl"),
        "jobs/ftjob-nonexistent/checkpoints/step-1".to_string(),
        "files/file-nonexistent.jsonl".to_string(),
        "models/nothing-here".to_string(),
        "elsewhere/x".to_string(),
    ];
    let mut bodies = Vec::new();
    for prefix in existing.iter().chain(&missing) {
        let reply = post(&app.router, "/v1/models", &alice, register("stolen", prefix)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{prefix}: {:?}", reply.json());
        bodies.push((prefix.clone(), reply.bytes.clone()));
    }
    for (prefix, body) in &bodies {
        assert_eq!(body, &bodies[0].1, "{prefix}: the answer tells existing from missing");
    }
    assert!(!String::from_utf8_lossy(&bodies[0].1).contains(&job_b), "no echo of the prefix");

    // Escapes are refused before anything is looked up.
    for prefix in [
        format!("models/tiny/../../{checkpoint}"),
        format!("models/%2e%2e/{checkpoint}"),
        format!("/{checkpoint}"),
        format!("models//../{checkpoint}"),
        format!("models/tiny/..%2F..%2F{checkpoint}"),
        format!("models\\..\\{checkpoint}"),
    ] {
        let reply = post(&app.router, "/v1/models", &alice, register("stolen", &prefix)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{prefix}: {:?}", reply.json());
        assert_eq!(reply.json()["error"]["param"], "storage_prefix");
    }

    // Members cannot register at all; an admin can use a shared published base folder.
    let reply = post(&app.router, "/v1/models", &member, register("mine", "models/tiny")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    // Org B registering the published folder privately first does not lock org A out of it.
    let reply = post(&app.router, "/v1/models", &bob, register("b-tiny", "models/tiny")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let reply = post(&app.router, "/v1/models", &alice, register("a-tiny", "models/tiny")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());

    // Nothing of org B's became a model of org A.
    let ids: Vec<String> = get(&app.router, "/v1/models", &alice).await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["a-tiny", "tiny"]);
}

/// The org id (as a string) of the user with this e-mail.
async fn app_org(pool: &sqlx::PgPool, email: &str) -> String {
    verity_core::tenancy::find_user_by_email(pool, email).await.unwrap().unwrap().org_id.to_string()
}

async fn key_id_of(app: &TestApp, admin: &str, prefix: &str) -> String {
    let keys = get(&app.router, "/v1/api_keys", admin).await.json();
    keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| prefix.starts_with(k["prefix"].as_str().unwrap()))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn token_from(app: &TestApp, body: Value) -> String {
    let reply = call(&app.router, Method::POST, "/v1/auth/token", None, Some(body)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    reply.json()["access_token"].as_str().unwrap().to_string()
}

fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// Polls `uri` on `router` with `credential` until it answers 401, for at most two seconds.
async fn refused_within_two_seconds(router: &axum::Router, credential: &str) -> Duration {
    let started = Instant::now();
    loop {
        let status = get(router, "/v1/files", credential).await.status;
        if status == StatusCode::UNAUTHORIZED {
            return started.elapsed();
        }
        assert_eq!(status, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_secs(2), "still accepted after 2 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn tokens_die_with_their_key_on_every_replica(pool: sqlx::PgPool) {
    // Two servers over one database, both caching keys and listening for revocations.
    let a = app(pool.clone()).await;
    let b = app(pool.clone()).await;
    let c = app(pool.clone()).await; // not listening: reads the key's row on every use
    assert!(a.state.start_key_revocation_listener().await.is_some());
    assert!(b.state.start_key_revocation_listener().await.is_some());
    let admin = user(&pool, "ada@a.io", "acme", "admin").await;
    let leaked = post(&a.router, "/v1/api_keys", &admin, json!({"name": "leaked"})).await.json();
    let leaked = leaked["secret"].as_str().unwrap().to_string();
    let leaked_id = key_id_of(&a, &admin, &leaked).await;

    let token = token_from(&a, json!({"api_key": leaked})).await;
    let claims = claims_of(&token);
    assert_eq!(claims["kid"], leaked_id.as_str(), "the token names its key");
    assert_eq!(claims["src"], "api_key");
    for app in [&a, &b, &c] {
        for credential in [&token, &leaked] {
            assert_eq!(get(&app.router, "/v1/files", credential).await.status, StatusCode::OK);
        }
    }

    let revoked =
        call(&a.router, Method::DELETE, &format!("/v1/api_keys/{leaked_id}"), Some(&admin), None)
            .await;
    assert_eq!(revoked.status, StatusCode::OK);
    for app in [&a, &c] {
        let reply = get(&app.router, "/v1/files", &token).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{:?}", reply.json());
        assert!(reply.json()["error"]["message"].as_str().unwrap().contains("revoked"));
        assert_eq!(get(&app.router, "/v1/files", &leaked).await.status, StatusCode::UNAUTHORIZED);
    }
    // Replica B trusted its cached verdicts; the NOTIFY makes it drop them.
    refused_within_two_seconds(&b.router, &token).await;
    refused_within_two_seconds(&b.router, &leaked).await;
    assert_eq!(get(&b.router, "/v1/files", &admin).await.status, StatusCode::OK, "others work");
    // A token minted from the key before the revocation cannot mint more either.
    let minted = post(&b.router, "/v1/api_keys", &token, json!({"name": "backdoor"})).await;
    assert_eq!(minted.status, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn only_keys_and_fresh_password_sign_ins_create_keys(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let admin = user(&pool, "ada@a.io", "acme", "admin").await;
    let from_key = token_from(&app, json!({"api_key": admin})).await;
    let refused = post(&app.router, "/v1/api_keys", &from_key, json!({"name": "x"})).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.json());
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("minted from an API key"), "{message}");
    // The same token still reads.
    assert_eq!(get(&app.router, "/v1/api_keys", &from_key).await.status, StatusCode::OK);

    let by_key = post(&app.router, "/v1/api_keys", &admin, json!({"name": "by-key"})).await;
    assert_eq!(by_key.status, StatusCode::OK, "{:?}", by_key.json());
    let by_password =
        token_from(&app, json!({"email": "ada@a.io", "password": "password123"})).await;
    assert_eq!(claims_of(&by_password)["src"], "password");
    assert!(claims_of(&by_password).get("kid").is_none());
    let fresh = post(&app.router, "/v1/api_keys", &by_password, json!({"name": "fresh"})).await;
    assert_eq!(fresh.status, StatusCode::OK, "{:?}", fresh.json());

    let claims = claims_of(&by_password);
    let now = chrono::Utc::now().timestamp();
    let stale = app
        .state
        .tokens
        .mint_claims(&Claims {
            sub: serde_json::from_value(claims["sub"].clone()).unwrap(),
            org: serde_json::from_value(claims["org"].clone()).unwrap(),
            role: Role::Admin,
            iss: "verity".into(),
            aud: "verity-api".into(),
            iat: now - 6 * 60,
            exp: now + 60,
            src: TokenSource::Password,
            kid: None,
        })
        .unwrap();
    assert_eq!(get(&app.router, "/v1/files", &stale).await.status, StatusCode::OK);
    let refused = post(&app.router, "/v1/api_keys", &stale, json!({"name": "stale"})).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("recent sign-in"));
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn members_list_only_their_own_keys(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let admin = user(&pool, "ada@a.io", "acme", "admin").await;
    let member = user(&pool, "bob@a.io", "acme", "member").await;
    user(&pool, "eve@b.io", "other", "admin").await;
    assert_eq!(
        post(&app.router, "/v1/api_keys", &admin, json!({"name": "ci"})).await.status,
        StatusCode::OK
    );
    let listed = get(&app.router, "/v1/api_keys", &member).await.json();
    let keys = listed["data"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{listed}");
    assert!(member.starts_with(keys[0]["prefix"].as_str().unwrap()));
    assert_eq!(keys[0]["role"], "member");
    let listed = get(&app.router, "/v1/api_keys", &admin).await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 3, "an admin sees the org's keys");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn token_lifetime_follows_the_configuration(pool: sqlx::PgPool) {
    let mut config = api_config();
    config.token_ttl_seconds = 120;
    let app = app_with(pool.clone(), config, |_| {}).await;
    user(&pool, "ada@a.io", "acme", "admin").await;
    let reply = call(
        &app.router,
        Method::POST,
        "/v1/auth/token",
        None,
        Some(json!({"email": "ada@a.io", "password": "password123"})),
    )
    .await;
    assert_eq!(reply.json()["expires_in"], 120);
    let claims = claims_of(reply.json()["access_token"].as_str().unwrap());
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 120);
}
