//! Dashboard problems found walking through it in Chromium (issue 44), each checked in a real
//! headless browser: Files → Delete asks first and refuses (409, the jobs named) a file a job
//! uses unless forced, after which the job's page shows the file as deleted; activity renews the
//! session (sliding expiry) up to a maximum; the new-job form submits without a script error
//! (radio buttons named `method` shadowed `form.method`) and checks the temperature range, the
//! error next to the field; an API key needs a name, the error next to the field.

use verity_tests::api_support;
use verity_tests::webdriver;

use api_support::{
    api_config, app, app_with, base_model, call, file_and_job, post, upload, TestApp, DATASET,
};
use axum::http::Method;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use verity_server::api::state::ApiConfig;
use webdriver::{click, fill, serve, sign_in, until, Browser, Driver};

/// Records uncaught script errors of the current page in `window.__errors`.
async fn catch_errors(c: &Browser) {
    c.execute(
        "window.__errors = []; window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });",
        vec![],
    )
    .await;
}

/// The uncaught script errors recorded since [`catch_errors`].
async fn errors(c: &Browser) -> Value {
    c.execute("return window.__errors", vec![]).await
}

/// Uploads `DATASET` as `name`; its id.
async fn uploaded(app: &TestApp, key: &str, name: &str) -> String {
    let reply = upload(&app.router, key, name, DATASET).await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    reply.json()["id"].as_str().unwrap().to_string()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_job_form_submits_without_script_errors_and_checks_the_temperature(pool: PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let file = uploaded(&app, &key, "train.jsonl").await;
    // The API: temperature is in (0, 2], as OpenAI's sampling range (above 0).
    let with_temperature = |t: f64| {
        let mut method = api_support::method();
        method["reinforcement"]["hyperparameters"]["temperature"] = json!(t);
        json!({"model": "tiny", "training_file": file, "method": method})
    };
    let refused = post(&app.router, "/v1/fine_tuning/jobs", &key, with_temperature(5.0)).await;
    assert_eq!(refused.status, 400, "{:?}", refused.json());
    assert_eq!(
        refused.json()["error"]["param"],
        "method.reinforcement.hyperparameters.temperature"
    );
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("(0, 2]"));

    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/jobs/new").await;
    until(&c, "document.querySelector('#training-file option[value]') && document.querySelector('#hp-temperature')").await;
    catch_errors(&c).await;
    c.execute("const s = document.querySelector('#training-file'); s.value = arguments[0]; s.dispatchEvent(new Event('change'));", vec![json!(file)]).await;
    let grader = &api_support::method()["reinforcement"]["grader"];
    fill(&c, "#grader", &grader.to_string()).await;
    let temperature = c.find("#hp-temperature").await;
    assert_eq!(
        c.execute("const t = document.querySelector('#hp-temperature'); return [t.min, t.max, t.dataset.minExclusive]", vec![]).await,
        json!(["0", "2", "true"]),
        "the input carries the API's range"
    );

    // The loss presets belong to reinforcement: a supervised job's form does not show them.
    let presets_shown = "document.querySelector('[aria-label=\"Algorithm presets\"]').getBoundingClientRect().height > 0";
    assert_eq!(c.execute(&format!("return {presets_shown}"), vec![]).await, true);
    let pick = |method: &str| {
        format!("document.querySelector('input[name=method][value={method}]').click()")
    };
    c.execute(&pick("supervised"), vec![]).await;
    assert_eq!(c.execute(&format!("return {presets_shown}"), vec![]).await, false);
    c.execute(&pick("reinforcement"), vec![]).await;
    assert_eq!(c.execute(&format!("return {presets_shown}"), vec![]).await, true);

    // Out of range: refused before sending, the error next to the field, the field marked.
    fill(&c, "#hp-temperature", "5").await;
    click(&c, "#create-job").await;
    let shown = until(&c, "document.querySelector('#hp-temperature[aria-invalid=true] + #hp-temperature-error') && document.querySelector('#hp-temperature-error').textContent").await;
    let shown = shown.as_str().unwrap();
    assert!(shown.contains("temperature") && shown.contains("(0, 2]"), "{shown}");
    assert_eq!(errors(&c).await, json!([]), "submitting throws nothing");
    assert_eq!(c.execute("return location.pathname", vec![]).await, "/jobs/new");
    assert_eq!(
        c.execute("return document.activeElement.id", vec![]).await,
        "hp-temperature",
        "the bad field has the focus"
    );

    // The API's own refusal also lands next to the field its `param` names.
    c.execute("document.querySelector('#hp-temperature').removeAttribute('max')", vec![]).await;
    click(&c, "#create-job").await;
    let from_api = until(&c, "document.querySelector('#hp-temperature-error') && document.querySelector('#hp-temperature-error').textContent.includes('got 5') && document.querySelector('#hp-temperature-error').textContent").await;
    assert!(
        from_api.as_str().unwrap().contains("method.reinforcement.hyperparameters.temperature"),
        "{from_api}"
    );
    assert_eq!(
        c.execute("return document.querySelectorAll('.field-error').length", vec![]).await,
        1,
        "each submit clears the previous errors"
    );
    assert_eq!(
        c.execute("return document.querySelector('#form-error').hidden", vec![]).await,
        true
    );

    // In range: the job is created.
    temperature.clear().await;
    temperature.send_keys("2").await;
    click(&c, "#create-job").await;
    let job =
        until(&c, "location.pathname.startsWith('/jobs/ftjob-') && location.pathname.slice(6)")
            .await;
    let spec: Value = sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1")
        .bind(job.as_str().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    let temperature = spec.pointer("/method/reinforcement/hyperparameters/temperature");
    assert_eq!(temperature.and_then(Value::as_f64), Some(2.0), "{spec}");
    c.close().await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_api_key_needs_a_name_and_the_form_says_so_next_to_the_field(pool: PgPool) {
    let app = app(pool.clone()).await;
    let admin = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    for body in [json!({"name": ""}), json!({"name": "   "}), json!({})] {
        let refused = post(&app.router, "/v1/api_keys", &admin, body.clone()).await;
        assert_eq!(refused.status, 400, "{body}: {:?}", refused.json());
        assert_eq!(refused.json()["error"]["param"], "name", "{body}");
    }
    let keys = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM api_keys")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(keys().await, 1, "only the test's own key");

    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/keys").await;
    fill(&c, "#key-name", "  ").await;
    click(&c, "#create-key").await;
    let shown = until(&c, "document.querySelector('#key-name[aria-invalid=true] + #key-name-error') && document.querySelector('#key-name-error').textContent").await;
    assert!(shown.as_str().unwrap().contains("must not be empty"), "{shown}");
    assert_eq!(c.execute("return !document.querySelector('#new-key')", vec![]).await, true);
    assert_eq!(keys().await, 1, "no key was made");
    fill(&c, "#key-name", "ci").await;
    click(&c, "#create-key").await;
    until(&c, "document.querySelector('#new-key') && !document.querySelector('#key-name-error')")
        .await;
    assert_eq!(keys().await, 2);
    c.close().await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn deleting_a_file_asks_first_and_a_file_a_job_uses_only_when_forced(pool: PgPool) {
    let app = app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let (used, job) = file_and_job(&app, &key).await;
    let unused = uploaded(&app, &key, "spare.jsonl").await;

    // The API refuses (409 `file_in_use`, the job named) unless forced.
    let delete = |id: &str, query: &str| {
        let uri = format!("/v1/files/{id}{query}");
        let (router, key) = (app.router.clone(), key.clone());
        async move { call(&router, Method::DELETE, &uri, Some(&key), None).await }
    };
    let refused = delete(&used, "").await;
    assert_eq!(refused.status, 409, "{:?}", refused.json());
    assert_eq!(refused.json()["error"]["code"], "file_in_use");
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains(&format!("{job} (training file, queued)")), "{message}");
    assert!(message.contains("force=true"), "{message}");
    let (other_file, other_job) = file_and_job(&app, &key).await;
    let forced = delete(&other_file, "?force=true").await;
    assert_eq!(forced.status, 200, "{:?}", forced.json());
    assert_eq!(delete(&other_file, "").await.status, 404);
    assert_eq!(
        api_support::get(&app.router, &format!("/v1/fine_tuning/jobs/{other_job}"), &key)
            .await
            .status,
        200
    );

    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/files").await;
    let rows = "document.querySelectorAll('tbody tr').length";

    // Delete asks first; "Keep" keeps the file.
    until(&c, &format!("document.querySelector('button[data-delete=\"{unused}\"]')")).await;
    click(&c, &format!("button[data-delete=\"{unused}\"]")).await;
    let question = until(&c, "document.querySelector('#confirm-dialog').open && document.querySelector('#confirm-text').textContent").await;
    assert!(question.as_str().unwrap().contains(&unused), "{question}");
    click(&c, "#confirm-no").await;
    until(&c, "!document.querySelector('#confirm-dialog').open").await;
    assert_eq!(c.execute(&format!("return {rows}"), vec![]).await, 2, "kept");
    // Confirmed, an unused file goes.
    click(&c, &format!("button[data-delete=\"{unused}\"]")).await;
    until(&c, "document.querySelector('#confirm-dialog').open").await;
    click(&c, "#confirm-yes").await;
    until(&c, &format!("location.pathname === '/files' && {rows} === 1")).await;

    // A file a job trained on: refused on a page naming the job, offering to delete anyway.
    click(&c, &format!("button[data-delete=\"{used}\"]")).await;
    until(&c, "document.querySelector('#confirm-dialog').open").await;
    click(&c, "#confirm-yes").await;
    let affected =
        until(&c, "document.querySelector('#confirm-affected') && document.querySelector('#confirm-affected').textContent").await;
    assert!(affected.as_str().unwrap().contains(&format!("{job} (training file, queued)")));
    let link = c
        .execute(
            "return document.querySelector('#confirm-affected a').getAttribute('href')",
            vec![],
        )
        .await;
    assert_eq!(link, json!(format!("/jobs/{job}")));
    assert_eq!(
        until(&c, "document.querySelector('#confirm-yes').textContent").await,
        "Delete anyway"
    );
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM files WHERE id = $1")
        .bind(&used)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(still, 1, "not deleted without force");
    click(&c, "#confirm-yes").await;
    until(&c, &format!("location.pathname === '/files' && {rows} === 0")).await;

    // The job's page still works and shows the file as deleted, not as a link that 404s.
    c.goto(&format!("{base}/jobs/{job}")).await;
    let shown = until(&c, "document.querySelector('#training-file-link[data-deleted=true]') && document.querySelector('#training-file-link').textContent").await;
    assert_eq!(shown, json!(format!("{used} (deleted)")));
    assert_eq!(
        c.execute("return document.querySelector('#training-file-link').tagName", vec![]).await,
        "SPAN"
    );
    // "Continue training" from it says the file is gone and leaves the field to choose.
    sqlx::query("UPDATE jobs SET fine_tuned_model = 'tiny' WHERE id = $1")
        .bind(&job)
        .execute(&pool)
        .await
        .unwrap();
    c.goto(&format!("{base}/jobs/new?from_job={job}")).await;
    let note = until(&c, &format!("document.querySelector('.prefill-missing[data-file=\"{used}\"]') && document.querySelector('.prefill-missing').textContent")).await;
    assert!(note.as_str().unwrap().contains("was deleted"), "{note}");
    assert_eq!(
        c.execute("return document.querySelector('#training-file').value", vec![]).await,
        ""
    );

    // Without scripts (no `confirm=yes`), the server asks on a page of its own.
    let spare = uploaded(&app, &key, "spare2.jsonl").await;
    let cookie = format!("verity_session={}", c.cookie("verity_session").await);
    let asked = reqwest::Client::new()
        .post(format!("{base}/files/{spare}/delete"))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 200);
    assert!(asked.text().await.unwrap().contains("id=\"confirm-question\""));
    assert_eq!(
        api_support::get(&app.router, &format!("/v1/files/{spare}"), &key).await.status,
        200,
        "asked, not deleted"
    );
    c.close().await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn activity_renews_the_session_up_to_its_maximum(pool: PgPool) {
    // Idle lifetime 12 s (renewed when that moves the expiry by 3 s or more), at most 24 s.
    let (idle, max) = (12u64, 24u64);
    let config = ApiConfig { token_ttl_seconds: idle, ..api_config() };
    let app = app_with(pool.clone(), config, |state| {
        state.sessions.max = Duration::from_secs(max);
    })
    .await;
    api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/jobs").await;
    let signed_in = Instant::now();
    let first_expiry = c.cookie_expiry("verity_session").await.expect("Max-Age sets an expiry");

    // A request right after signing in moves the expiry by less than the step: no renewal, no
    // write, no cookie.
    let session = format!("verity_session={}", c.cookie("verity_session").await);
    let http = reqwest::Client::new();
    let quiet = http.get(format!("{base}/jobs")).header("cookie", &session).send().await.unwrap();
    assert_eq!(quiet.status(), 200);
    assert!(quiet.headers().get("set-cookie").is_none(), "not renewed on every request");

    // Pages opened every second stay signed in well past the idle lifetime; the cookie's
    // expiry moves later.
    while signed_in.elapsed() < Duration::from_secs(idle + 4) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.goto(&format!("{base}/jobs")).await;
        let at = signed_in.elapsed();
        assert_eq!(
            c.execute("return location.pathname", vec![]).await,
            "/jobs",
            "still signed in after {at:?} of activity"
        );
    }
    let renewed = c.cookie_expiry("verity_session").await.expect("still set");
    assert!(renewed >= first_expiry + 4, "cookie renewed: {first_expiry} → {renewed}");

    // However active, the session ends at its maximum.
    let ended = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.goto(&format!("{base}/jobs")).await;
        if c.execute("return location.pathname", vec![]).await == "/login" {
            break signed_in.elapsed();
        }
        assert!(signed_in.elapsed() < Duration::from_secs(max + 8), "never ended");
    };
    assert!(ended >= Duration::from_secs(max - 3), "ended at {ended:?}, before the maximum");

    // A session left idle longer than the idle lifetime ends.
    sign_in(&c, &base, "/jobs").await;
    tokio::time::sleep(Duration::from_secs(idle + 2)).await;
    c.goto(&format!("{base}/jobs")).await;
    assert_eq!(c.execute("return location.pathname", vec![]).await, "/login");
    c.close().await;
}
