//! Dashboard sessions and role re-checks through the real HTTP server: the cookie holds a random
//! session id (never the key), signing out revokes it (the old cookie stops working), the
//! cookie is `Secure` when the public URL is https, and a demoted or deleted user loses their
//! role at the next request whatever they hold — session, API key or access token — also on a
//! server that caches verdicts while listening for changes.

use verity_tests::api_support;

use api_support::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::time::{Duration, Instant};
use verity_core::queue::QueueSettings;
use verity_server::api::state::AppState;

/// Serves `state`'s app on 127.0.0.1; returns its base URL.
async fn serve(state: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let service = verity_server::app::service(verity_server::app::app(state));
    tokio::spawn(axum::serve(listener, service).into_future());
    base
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// Signs in through the form with `body`; returns the whole `Set-Cookie` value.
async fn sign_in(base: &str, body: &str) -> String {
    let reply = client()
        .post(format!("{base}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("{body}&next=%2Fjobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::SEE_OTHER);
    reply.headers()["set-cookie"].to_str().unwrap().to_string()
}

/// The `name=value` part of a `Set-Cookie` value.
fn pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

/// `DELETE /v1/api_keys/{random}`: 404 for an admin, 403 for a member, 401 without a principal.
async fn admin_probe(base: &str, auth: (&str, &str)) -> StatusCode {
    let url = format!("{base}/v1/api_keys/{}", uuid::Uuid::new_v4());
    client().delete(url).header(auth.0, auth.1).send().await.unwrap().status()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sign_out_revokes_the_session_and_the_cookie_never_holds_the_key(pool: sqlx::PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(app.state.clone()).await;
    let http = client();

    for body in [format!("api_key={key}"), "email=ada%40example.com&password=password123".into()] {
        let set_cookie = sign_in(&base, &body).await;
        assert!(!set_cookie.contains(&key), "the cookie holds the key: {set_cookie}");
        assert!(!set_cookie.contains("Secure"), "plain-HTTP public URL: no Secure flag");
        let cookie = pair(&set_cookie);
        let jobs = http.get(format!("{base}/jobs")).header("cookie", &cookie).send().await;
        assert_eq!(jobs.unwrap().status(), StatusCode::OK);
        let files = http.get(format!("{base}/v1/files")).header("cookie", &cookie).send().await;
        assert_eq!(files.unwrap().status(), StatusCode::OK);

        let out = http.post(format!("{base}/logout")).header("cookie", &cookie).send().await;
        let out = out.unwrap();
        assert_eq!(out.status(), StatusCode::SEE_OTHER);
        assert!(out.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
        // The old cookie, replayed, no longer works: not on pages, not on the API.
        let page = http.get(format!("{base}/jobs")).header("cookie", &cookie).send().await;
        let page = page.unwrap();
        assert_eq!(page.status(), StatusCode::SEE_OTHER);
        assert_eq!(page.headers()["location"], "/login?next=/jobs");
        let files = http.get(format!("{base}/v1/files")).header("cookie", &cookie).send().await;
        assert_eq!(files.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    // The key itself still works: signing out ended the session, not the key.
    let files = http.get(format!("{base}/v1/files")).bearer_auth(&key).send().await.unwrap();
    assert_eq!(files.status(), StatusCode::OK);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn session_cookies_are_secure_when_the_public_url_is_https(pool: sqlx::PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let mut storage = storage_config(dir.path());
    storage.public_url = Some("https://verity.example".into());
    let store = std::sync::Arc::new(
        verity_core::storage::LocalStore::open(dir.path(), None).await.unwrap(),
    );
    let state =
        AppState::new(pool.clone(), store, QueueSettings::default(), &storage, &api_config())
            .unwrap();
    assert!(state.secure_cookies);
    user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(state).await;
    let set_cookie = sign_in(&base, "email=ada%40example.com&password=password123").await;
    assert!(set_cookie.contains("; Secure"), "{set_cookie}");
    let cookie = pair(&set_cookie);
    let out = client().post(format!("{base}/logout")).header("cookie", &cookie).send().await;
    assert!(out.unwrap().headers()["set-cookie"].to_str().unwrap().contains("; Secure"));
}

/// Every credential of an admin: a password session, a key session, the key, a password token
/// and a key token, as (header, value) pairs.
async fn credentials(base: &str, key: &str) -> Vec<(&'static str, String)> {
    let token = |body: Value| async move {
        let reply = client().post(format!("{base}/v1/auth/token")).json(&body).send().await;
        let reply: Value = reply.unwrap().json().await.unwrap();
        format!("Bearer {}", reply["access_token"].as_str().unwrap())
    };
    vec![
        ("cookie", pair(&sign_in(base, "email=ada%40example.com&password=password123").await)),
        ("cookie", pair(&sign_in(base, &format!("api_key={key}")).await)),
        ("authorization", format!("Bearer {key}")),
        (
            "authorization",
            token(json!({"email": "ada@example.com", "password": "password123"})).await,
        ),
        ("authorization", token(json!({"api_key": key})).await),
    ]
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_demoted_or_deleted_user_loses_their_role_at_the_next_request(pool: sqlx::PgPool) {
    // Two servers over one database: A reads the rows on every request, B caches verdicts and
    // listens for changes (as `verity serve` does).
    let a = app(pool.clone()).await;
    let b = app(pool.clone()).await;
    b.state.start_key_revocation_listener().await.expect("listening");
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let (base_a, base_b) = (serve(a.state.clone()).await, serve(b.state.clone()).await);
    let on_a = credentials(&base_a, &key).await;
    let on_b = credentials(&base_b, &key).await;
    for (base, creds) in [(&base_a, &on_a), (&base_b, &on_b)] {
        for (header, value) in creds {
            // Used twice: the second use may be served from caches.
            for _ in 0..2 {
                assert_eq!(admin_probe(base, (header, value)).await, StatusCode::NOT_FOUND);
            }
        }
    }

    sqlx::query("UPDATE users SET role = 'member' WHERE email = 'ada@example.com'")
        .execute(&pool)
        .await
        .unwrap();
    for (header, value) in &on_a {
        assert_eq!(admin_probe(&base_a, (header, value)).await, StatusCode::FORBIDDEN, "{value}");
    }
    for (header, value) in &on_b {
        assert_eq!(
            until_not(&base_b, (header, value), StatusCode::NOT_FOUND).await,
            StatusCode::FORBIDDEN
        );
    }

    sqlx::query("DELETE FROM users WHERE email = 'ada@example.com'").execute(&pool).await.unwrap();
    for (header, value) in &on_a {
        assert_eq!(admin_probe(&base_a, (header, value)).await, StatusCode::UNAUTHORIZED);
    }
    for (header, value) in &on_b {
        let status = until_not(&base_b, (header, value), StatusCode::FORBIDDEN).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{value}");
    }
}

/// The probe's status once it is no longer `old`, polled for at most two seconds (the change
/// notification reaches a listening server within milliseconds).
async fn until_not(base: &str, auth: (&str, &str), old: StatusCode) -> StatusCode {
    let started = Instant::now();
    loop {
        let status = admin_probe(base, auth).await;
        if status != old {
            return status;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "still {old} after 2 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
