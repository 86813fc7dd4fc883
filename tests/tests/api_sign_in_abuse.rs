//! Sign-in abuse through the real HTTP server (axum over TCP recording each peer's address, as
//! `verity serve` and `verity up` run it), with clients on distinct loopback addresses:
//! parallel wrong passwords are all counted before any is checked, a stranger cannot lock the
//! user out from another address, Bearer floods of a real key prefix plus random characters are
//! throttled per address, `X-Forwarded-For` is believed only from a trusted proxy, and a flood
//! of hashes waits for a slot or gets 429.

use verity_tests::api_support;

use api_support::*;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::net::IpAddr;
use verity_server::api::auth::throttle::FREE_FAILURES;
use verity_server::api::state::ApiConfig;

/// A server on 127.0.0.1 for `app`; returns its base URL.
async fn serve(app: &TestApp) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let service = verity_server::app::service(app.router.clone());
    tokio::spawn(axum::serve(listener, service).into_future());
    base
}

/// A client whose connections come from loopback address `from`.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `POST /v1/auth/token` with `body`, to be sent.
fn token_request(
    client: &reqwest::Client,
    base: &str,
    body: Value,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    client.post(format!("{base}/v1/auth/token")).json(&body).send()
}

async fn token(client: &reqwest::Client, base: &str, body: Value) -> reqwest::Response {
    token_request(client, base, body).await.unwrap()
}

/// Sends `n` requests at once; returns their statuses.
async fn all_at_once<F, Fut>(n: usize, request: F) -> Vec<StatusCode>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    join_all((0..n).map(request)).await.into_iter().map(|r| r.unwrap().status()).collect()
}

/// How many of `statuses` were checked (401), after asserting each is 401 or 429.
fn checked(statuses: &[StatusCode]) -> usize {
    for status in statuses {
        assert!(
            matches!(*status, StatusCode::UNAUTHORIZED | StatusCode::TOO_MANY_REQUESTS),
            "unexpected {status}"
        );
    }
    statuses.iter().filter(|s| **s == StatusCode::UNAUTHORIZED).count()
}

/// A key-shaped credential: a real key's lookup prefix and random characters.
fn forged(key: &str) -> String {
    format!("{}{}", &key[..11], uuid::Uuid::new_v4().simple())
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn parallel_wrong_passwords_are_all_counted_and_the_owner_still_signs_in(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(&app).await;
    let stranger = client_from("127.0.0.2");
    let wrong = json!({"email": "ada@example.com", "password": "wrong-password"});

    let statuses = all_at_once(60, |_| token_request(&stranger, &base, wrong.clone())).await;
    let guesses = checked(&statuses);
    assert!(guesses <= FREE_FAILURES as usize, "{guesses} guesses checked");
    assert!(guesses >= 1);
    // Through the dashboard's form too (another stranger's address).
    let form_stranger = client_from("127.0.0.3");
    let statuses = all_at_once(100, |_| {
        form_stranger
            .post(format!("{base}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("email=ada%40example.com&password=wrong-password")
            .send()
    })
    .await;
    assert!(checked(&statuses) <= FREE_FAILURES as usize);

    // The stranger's address now waits, even with the right password...
    let right = json!({"email": "ada@example.com", "password": "password123"});
    let locked = token(&stranger, &base, right.clone()).await;
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = locked.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    // ...but the owner, from their own address, signs in: by token and by the form.
    let owner = client_from("127.0.0.4");
    let signed_in = token(&owner, &base, right).await;
    assert_eq!(signed_in.status(), StatusCode::OK);
    let page = owner
        .post(format!("{base}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("email=ada%40example.com&password=password123&next=%2Fjobs")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);

    // An unknown e-mail gets the same answer as a wrong password, and is counted the same way.
    let nobody = json!({"email": "nobody@example.com", "password": "wrong-password"});
    let statuses = all_at_once(20, |_| token_request(&owner, &base, nobody.clone())).await;
    assert!(checked(&statuses) <= FREE_FAILURES as usize);
    let other = client_from("127.0.0.5");
    let unknown: Value = token(&other, &base, nobody).await.json().await.unwrap();
    let known: Value = token(&other, &base, wrong).await.json().await.unwrap();
    assert_eq!(unknown, known);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn forged_keys_of_a_real_prefix_lock_out_only_their_address(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(&app).await;
    let stranger = client_from("127.0.0.2");

    let statuses =
        all_at_once(60, |_| token_request(&stranger, &base, json!({"api_key": forged(&key)})))
            .await;
    assert!(checked(&statuses) <= FREE_FAILURES as usize);
    let refused = token(&stranger, &base, json!({"api_key": key})).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    let owner = client_from("127.0.0.3");
    assert_eq!(token(&owner, &base, json!({"api_key": key})).await.status(), StatusCode::OK);
    let files = owner.get(format!("{base}/v1/files")).bearer_auth(&key).send().await.unwrap();
    assert_eq!(files.status(), StatusCode::OK);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn bearer_floods_are_throttled_per_address(pool: sqlx::PgPool) {
    let config = ApiConfig { auth_failures_per_address: 10, ..api_config() };
    let app = app_with(pool.clone(), config, |_| {}).await;
    let mut keys = Vec::new();
    for n in 0..3 {
        keys.push(user(&pool, &format!("user{n}@example.com"), "acme", "member").await);
    }
    let base = serve(&app).await;
    let flooder = client_from("127.0.0.2");

    // Three real prefixes, five guesses each would be allowed per prefix: the address limit
    // (10) stops the flood first. Every forged token would cost a hash.
    let statuses = all_at_once(90, |n| {
        flooder.get(format!("{base}/v1/files")).bearer_auth(forged(&keys[n % 3])).send()
    })
    .await;
    let guesses = checked(&statuses);
    assert!(guesses <= 10, "{guesses} forged keys checked");
    assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS));
    let throttled =
        flooder.get(format!("{base}/v1/files")).bearer_auth(&keys[0]).send().await.unwrap();
    assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(throttled.headers().contains_key("retry-after"));
    // Password guesses for many different e-mails from one address are throttled as well.
    let statuses = all_at_once(26, |n| {
        token_request(
            &flooder,
            &base,
            json!({"email": format!("someone{n}@example.com"), "password": "wrong-password"}),
        )
    })
    .await;
    assert_eq!(checked(&statuses), 0, "the address is over its limit");

    // Another address is served.
    let other = client_from("127.0.0.3");
    for key in &keys {
        let files = other.get(format!("{base}/v1/files")).bearer_auth(key).send().await.unwrap();
        assert_eq!(files.status(), StatusCode::OK);
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn forwarded_for_names_the_client_only_behind_a_trusted_proxy(pool: sqlx::PgPool) {
    let config = ApiConfig { trusted_proxies: "127.0.0.6".into(), ..api_config() };
    let app = app_with(pool.clone(), config, |_| {}).await;
    user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(&app).await;
    let proxy = client_from("127.0.0.6");
    let via_proxy = |client: &str, body: Value| {
        proxy
            .post(format!("{base}/v1/auth/token"))
            .header("x-forwarded-for", format!("{client}, 127.0.0.6"))
            .json(&body)
            .send()
    };
    let wrong = json!({"email": "ada@example.com", "password": "wrong-password"});
    let right = json!({"email": "ada@example.com", "password": "password123"});
    for _ in 0..FREE_FAILURES {
        assert_eq!(
            via_proxy("198.51.100.7", wrong.clone()).await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    let locked = via_proxy("198.51.100.7", right.clone()).await.unwrap();
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another client behind the same proxy is not locked out.
    assert_eq!(via_proxy("198.51.100.8", right.clone()).await.unwrap().status(), StatusCode::OK);

    // An untrusted peer cannot choose its address with the header.
    let direct = client_from("127.0.0.7");
    for _ in 0..FREE_FAILURES {
        let reply = direct
            .post(format!("{base}/v1/auth/token"))
            .header("x-forwarded-for", "198.51.100.9")
            .json(&wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::UNAUTHORIZED);
    }
    let spoofed = direct
        .post(format!("{base}/v1/auth/token"))
        .header("x-forwarded-for", "198.51.100.10")
        .json(&right)
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A server with one hashing slot and no address limits (only the slot stands between a flood
/// and memory), a user `ada@example.com`, and a client from 127.0.0.2.
async fn one_hashing_slot(pool: &sqlx::PgPool) -> (TestApp, String, reqwest::Client) {
    let config = ApiConfig {
        hash_concurrency: 1,
        auth_failures_per_address: 0,
        auth_checks_per_minute: 0.0,
        ..api_config()
    };
    let app = app_with(pool.clone(), config, |_| {}).await;
    user(pool, "ada@example.com", "acme", "admin").await;
    let base = serve(&app).await;
    (app, base, client_from("127.0.0.2"))
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_flood_of_hashes_waits_for_a_slot_or_gets_429(pool: sqlx::PgPool) {
    // No address limits here: only the hashing slots (one) stand between the flood and memory.
    let (_app, base, client) = one_hashing_slot(&pool).await;
    let right = json!({"email": "ada@example.com", "password": "password123"});
    let statuses = all_at_once(80, |_| token_request(&client, &base, right.clone())).await;
    for status in &statuses {
        assert!(matches!(*status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS), "{status}");
    }
    assert!(statuses.contains(&StatusCode::OK), "some sign-ins got a slot");
}

/// An unknown e-mail costs a password hash like a known one (a dummy hash runs), so the time of
/// the answer does not tell whether an account exists: with the only hashing slot held, both
/// wait for it and get 429; with it free, both are 401.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_unknown_email_costs_a_hash_like_a_wrong_password(pool: sqlx::PgPool) {
    let (app, base, client) = one_hashing_slot(&pool).await;
    let known = json!({"email": "ada@example.com", "password": "not-the-password"});
    let unknown = json!({"email": "nobody@example.com", "password": "not-the-password"});
    let held = app.state.hasher.permits.clone().acquire_owned().await.unwrap();
    for body in [&known, &unknown] {
        let reply = token(&client, &base, body.clone()).await;
        assert_eq!(reply.status(), StatusCode::TOO_MANY_REQUESTS, "{body}: waits for a hash");
    }
    drop(held);
    for body in [&known, &unknown] {
        assert_eq!(token(&client, &base, body.clone()).await.status(), StatusCode::UNAUTHORIZED);
    }
}
