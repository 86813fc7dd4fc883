//! A dashboard session opened with an API key that expires stops working at that moment: the
//! session carries the key itself, every page checks it, and a key about to expire is not served
//! from the key cache past its expiry. Before it, pages open; after it, they send the browser
//! back to the sign-in page, and signing in again with the key is refused as expired.

use verity_tests::api_support;

use api_support::{post, send, user};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::json;
use sqlx::PgPool;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_session_signed_in_with_an_expiring_key_ends_when_the_key_expires(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    let admin = user(&pool, "ada@example.com", "acme", "admin").await;
    let soon = chrono::Utc::now().timestamp() + 3;
    let key =
        post(&app.router, "/v1/api_keys", &admin, json!({"name": "short", "expires_at": soon}))
            .await
            .json();
    let secret = key["secret"].as_str().unwrap().to_string();
    let login = |body: String| {
        let request = Request::builder()
            .method(Method::POST)
            .uri("/login")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap();
        send(&app.router, request)
    };
    let signed_in = login(format!("api_key={secret}&next=%2Fjobs")).await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    let cookie =
        signed_in.headers["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let page = |path: &'static str| {
        let request =
            Request::builder().uri(path).header("cookie", &cookie).body(Body::empty()).unwrap();
        send(&app.router, request)
    };
    for _ in 0..3 {
        // Used (and so possibly cached) several times before it expires.
        assert_eq!(page("/jobs").await.status, StatusCode::OK);
    }
    while chrono::Utc::now().timestamp() <= soon {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let after = page("/jobs").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER, "the session ended with the key");
    assert_eq!(after.headers["location"], "/login?next=/jobs");
    assert_eq!(page("/keys").await.status, StatusCode::SEE_OTHER);
    let again = login(format!("api_key={secret}&next=%2Fjobs")).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);
    let page = String::from_utf8_lossy(&again.bytes).into_owned();
    assert!(page.contains("this API key expired at"), "{page}");
}
