//! The dashboard's HTML handlers without a browser: sign-in and its cookie, the redirect when
//! signed out, every page rendering, cross-origin writes refused, login throttling (API and
//! dashboard), and the API-key endpoints and page (a revoked key stops working at once).

use verity_tests::api_support;

use api_support::{app, base_model, call, file_and_job, get, post, send, user, Reply, TestApp};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::json;
use sqlx::PgPool;

/// A form POST with optional cookie and extra headers.
async fn form(
    app: &TestApp,
    uri: &str,
    body: &str,
    cookie: Option<&str>,
    headers: &[(&str, &str)],
) -> Reply {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(cookie) = cookie {
        builder = builder.header("cookie", cookie);
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    send(&app.router, builder.body(Body::from(body.to_string())).unwrap()).await
}

/// A GET with the session cookie.
async fn page(app: &TestApp, uri: &str, cookie: &str) -> Reply {
    send(
        &app.router,
        Request::builder().uri(uri).header("cookie", cookie).body(Body::empty()).unwrap(),
    )
    .await
}

fn text(reply: &Reply) -> String {
    String::from_utf8_lossy(&reply.bytes).into_owned()
}

/// Signs in with the password of `email`; the `name=value` of the session cookie.
async fn sign_in(app: &TestApp, email: &str) -> String {
    let reply = form(
        app,
        "/login",
        &format!("email={}&password=password123&next=%2Fjobs", email.replace('@', "%40")),
        None,
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", text(&reply));
    assert_eq!(reply.headers["location"], "/jobs");
    let cookie = reply.headers["set-cookie"].to_str().unwrap().to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    cookie.split(';').next().unwrap().to_string()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn pages_need_a_session_and_render_once_signed_in(pool: PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    base_model(&app).await;
    let (file_id, job_id) = file_and_job(&app, &key).await;

    let signed_out =
        send(&app.router, Request::builder().uri("/jobs/new").body(Body::empty()).unwrap()).await;
    assert_eq!(signed_out.status, StatusCode::SEE_OTHER);
    assert_eq!(signed_out.headers["location"], "/login?next=/jobs/new");
    let login =
        send(&app.router, Request::builder().uri("/login").body(Body::empty()).unwrap()).await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(text(&login).contains("name=\"api_key\""));
    let wrong = form(&app, "/login", "email=ada%40example.com&password=nope", None, &[]).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(text(&wrong).contains("wrong e-mail or password"));
    // An absolute next= is not followed.
    let by_key =
        form(&app, "/login", &format!("api_key={key}&next=https%3A%2F%2Fevil.example"), None, &[])
            .await;
    assert_eq!(by_key.status, StatusCode::SEE_OTHER);
    assert_eq!(by_key.headers["location"], "/jobs");

    let cookie = sign_in(&app, "ada@example.com").await;
    let jobs = text(&page(&app, "/jobs", &cookie).await);
    assert!(
        jobs.contains("Created by") && jobs.contains("ada@example.com"),
        "the jobs list names who created each job"
    );
    for (uri, needle) in [
        ("/jobs".to_string(), job_id.as_str()),
        ("/jobs/new".to_string(), "Test grader"),
        (format!("/jobs/{job_id}"), "Training metrics"),
        (format!("/jobs/{job_id}/completions"), "No completions match"),
        (format!("/jobs/{job_id}/checkpoints"), "No checkpoints yet"),
        ("/files".to_string(), file_id.as_str()),
        (format!("/files/{file_id}"), "2+2?"),
        (format!("/files/{file_id}/preview"), "processed"),
        ("/keys".to_string(), "Create key"),
    ] {
        let reply = page(&app, &uri, &cookie).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", text(&reply));
        assert!(text(&reply).contains(needle), "{uri} lacks {needle}");
    }
    let missing = page(&app, "/jobs/ftjob-nope", &cookie).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let bad_filter =
        page(&app, &format!("/jobs/{job_id}/completions?min_score=abc"), &cookie).await;
    assert_eq!(bad_filter.status, StatusCode::BAD_REQUEST);
    // The models page (with a pulled model's hub id) and the playground (opened from the job:
    // its rows and grader).
    verity_core::models::set_hub_id(&pool, "tiny", "acme/Tiny-1").await.unwrap();
    for (uri, needle) in [
        ("/models".to_string(), "acme/Tiny-1"),
        ("/models".to_string(), "Open in playground"),
        ("/playground".to_string(), "id=\"model-right\""),
        (format!("/playground?job={job_id}"), "Try a training row"),
        (format!("/files/{file_id}/rows/1"), "3+3?"),
    ] {
        let reply = page(&app, &uri, &cookie).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", text(&reply));
        assert!(text(&reply).contains(needle), "{uri} lacks {needle}");
    }
    let past_the_end = page(&app, &format!("/files/{file_id}/rows/2"), &cookie).await;
    assert_eq!(past_the_end.status, StatusCode::BAD_REQUEST);
    assert_eq!(past_the_end.json()["error"]["param"], "index");
    let css = send(
        &app.router,
        Request::builder().uri("/static/vendor/uPlot.min.css").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.headers["cache-control"].to_str().unwrap().contains("max-age"));
    // The session also authenticates the JSON API (the dashboard's scripts use it).
    let jobs = page(&app, "/v1/fine_tuning/jobs", &cookie).await;
    assert_eq!(jobs.json()["data"][0]["id"], job_id.as_str());
    let out = form(&app, "/logout", "", Some(&cookie), &[]).await;
    assert!(out.headers["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cross_origin_writes_with_the_session_are_refused(pool: PgPool) {
    let app = app(pool.clone()).await;
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    base_model(&app).await;
    let (_, job_id) = file_and_job(&app, &key).await;
    let cookie = sign_in(&app, "ada@example.com").await;
    let cancel = format!("/jobs/{job_id}/control/cancel");
    let api_cancel = format!("/v1/fine_tuning/jobs/{job_id}/cancel");
    for headers in [
        [("sec-fetch-site", "cross-site"), ("host", "verity.test")],
        [("origin", "http://evil.example"), ("host", "verity.test")],
    ] {
        for uri in [&cancel, &api_cancel] {
            let reply = form(&app, uri, "", Some(&cookie), &headers).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{uri} {headers:?}");
        }
        let login =
            form(&app, "/login", "email=ada%40example.com&password=password123", None, &headers)
                .await;
        assert_eq!(login.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(
        get(&app.router, &format!("/v1/fine_tuning/jobs/{job_id}"), &key).await.json()["status"],
        "queued",
        "nothing was cancelled"
    );
    // A bearer credential is not ambient: a cross-origin call with it is the caller's own choice.
    let mut request = Request::builder()
        .method(Method::GET)
        .uri("/v1/files")
        .header("authorization", format!("Bearer {key}"));
    request = request.header("origin", "http://elsewhere.example");
    assert_eq!(
        send(&app.router, request.body(Body::empty()).unwrap()).await.status,
        StatusCode::OK
    );
    let same =
        form(&app, &cancel, "confirm=yes", Some(&cookie), &[("sec-fetch-site", "same-origin")])
            .await;
    assert_eq!(same.status, StatusCode::SEE_OTHER);
    assert_eq!(
        get(&app.router, &format!("/v1/fine_tuning/jobs/{job_id}"), &key).await.json()["status"],
        "cancelled"
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn repeated_failed_logins_are_throttled(pool: PgPool) {
    let app = app(pool.clone()).await;
    user(&pool, "ada@example.com", "acme", "admin").await;
    user(&pool, "bob@example.com", "acme", "member").await;
    let attempt = |email: &str, password: &str| json!({"email": email, "password": password});
    for _ in 0..verity_server::api::auth::throttle::FREE_FAILURES {
        let reply = call(
            &app.router,
            Method::POST,
            "/v1/auth/token",
            None,
            Some(attempt("ada@example.com", "wrong")),
        )
        .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    }
    // From the same address (here: unrecorded, one bucket) even the right password is refused
    // during the back-off; Retry-After says for how long.
    let refused = call(
        &app.router,
        Method::POST,
        "/v1/auth/token",
        None,
        Some(attempt("ada@example.com", "password123")),
    )
    .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", refused.json());
    let retry: u64 = refused.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry > 0 && retry <= verity_server::api::auth::throttle::BACKOFF_BASE.as_secs());
    let page =
        form(&app, "/login", "email=ada%40example.com&password=password123", None, &[]).await;
    assert_eq!(page.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(page.headers.contains_key("retry-after"));
    // Another user is unaffected.
    let other = call(
        &app.router,
        Method::POST,
        "/v1/auth/token",
        None,
        Some(attempt("bob@example.com", "password123")),
    )
    .await;
    assert_eq!(other.status, StatusCode::OK);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn api_keys_are_listed_created_and_revoked_at_once(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = user(&pool, "ada@example.com", "acme", "admin").await;
    let member = user(&pool, "bob@example.com", "acme", "member").await;
    let outsider = user(&pool, "eve@example.com", "other", "admin").await;

    let listed = get(&app.router, "/v1/api_keys", &admin).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.json()["data"].as_array().unwrap().len(), 2, "the org's two keys");
    assert!(
        listed.json()["data"][0].get("secret").is_none()
            && listed.json()["data"][0].get("key_hash").is_none()
    );

    let created = post(&app.router, "/v1/api_keys", &admin, json!({"name": "ci"})).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let secret = created.json()["secret"].as_str().unwrap().to_string();
    let id = created.json()["id"].as_str().unwrap().to_string();
    assert_eq!(created.json()["name"], "ci");
    assert!(secret.starts_with(created.json()["prefix"].as_str().unwrap()));
    assert_eq!(
        get(&app.router, "/v1/files", &secret).await.status,
        StatusCode::OK,
        "the new key works (and is now cached)"
    );
    let used = get(&app.router, "/v1/api_keys", &admin).await.json();
    let row =
        used["data"].as_array().unwrap().iter().find(|k| k["id"] == id.as_str()).unwrap().clone();
    assert!(row["last_used_at"].is_number() && row["revoked"] == false, "{row}");

    assert_eq!(
        post(&app.router, "/v1/api_keys", &member, json!({"name": "x"})).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&app.router, Method::DELETE, &format!("/v1/api_keys/{id}"), Some(&member), None)
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&app.router, Method::DELETE, &format!("/v1/api_keys/{id}"), Some(&outsider), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post(&app.router, "/v1/api_keys", &admin, json!({"name": "x".repeat(101)})).await.status,
        StatusCode::BAD_REQUEST
    );

    let revoked =
        call(&app.router, Method::DELETE, &format!("/v1/api_keys/{id}"), Some(&admin), None).await;
    assert_eq!(revoked.status, StatusCode::OK);
    assert_eq!(revoked.json()["revoked"], true);
    let after = get(&app.router, "/v1/files", &secret).await;
    assert_eq!(
        after.status,
        StatusCode::UNAUTHORIZED,
        "revocation is immediate despite the key cache"
    );
    assert_eq!(
        get(&app.router, "/v1/files", &admin).await.status,
        StatusCode::OK,
        "other keys still work"
    );

    // The keys page: create shows the secret once; revoke by form.
    let cookie = sign_in(&app, "ada@example.com").await;
    let made = form(&app, "/keys", "name=from-page", Some(&cookie), &[]).await;
    assert_eq!(made.status, StatusCode::OK);
    let html = text(&made);
    let start = html.find("id=\"new-key\">").unwrap() + "id=\"new-key\">".len();
    let page_secret = html[start..start + 43].to_string();
    assert_eq!(get(&app.router, "/v1/files", &page_secret).await.status, StatusCode::OK);
    let page_id = get(&app.router, "/v1/api_keys", &admin).await.json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let gone =
        form(&app, &format!("/keys/{page_id}/revoke"), "confirm=yes", Some(&cookie), &[]).await;
    assert_eq!(gone.status, StatusCode::SEE_OTHER);
    assert_eq!(get(&app.router, "/v1/files", &page_secret).await.status, StatusCode::UNAUTHORIZED);
    assert!(
        !text(&page(&app, "/keys", &cookie).await).contains(&page_secret),
        "a secret is shown once"
    );

    // A dashboard session opened with a key ends when that key is revoked.
    let fresh = post(&app.router, "/v1/api_keys", &admin, json!({"name": "session"})).await.json();
    let signed_in = form(
        &app,
        "/login",
        &format!("api_key={}&next=%2Fjobs", fresh["secret"].as_str().unwrap()),
        None,
        &[],
    )
    .await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    let key_cookie =
        signed_in.headers["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    assert_eq!(page(&app, "/jobs", &key_cookie).await.status, StatusCode::OK);
    let fresh_id = fresh["id"].as_str().unwrap();
    assert_eq!(
        call(&app.router, Method::DELETE, &format!("/v1/api_keys/{fresh_id}"), Some(&admin), None)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        page(&app, "/jobs", &key_cookie).await.status,
        StatusCode::SEE_OTHER,
        "back to the sign-in page"
    );
}
