//! The new-job page's pre-flight in a real headless Chromium: a file whose line 2 lacks the
//! field the grader reads is reported by line and field (not let through), the exploit probes'
//! scores are shown (listing every candidate scores 1 against a contains-check), the Test-grader
//! row starts from the file's first row, job creation refuses the file with nothing enqueued, a
//! non-numeric learning rate names its field, and a resubmit clears the old error.

use verity_tests::api_support;
use verity_tests::webdriver;

use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use verity_core::storage::{LocalStore, ObjectStore};
use webdriver::{click, fill, serve, shot, until, Driver};

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn preflight_shows_line_errors_and_probe_scores_in_a_real_browser(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(root.path().join("objects"), None).await.unwrap());
    verity_core::testing::tiny_base_model(&pool, store.as_ref()).await;
    let state = api_support::app_on(pool.clone(), store).await;
    api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(state).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    let bad = root.path().join("no-answer.jsonl");
    std::fs::write(
        &bad,
        "{\"prompt\": \"2+2?\", \"reference_answer\": \"4\"}\n{\"prompt\": \"3+3?\"}\n",
    )
    .unwrap();

    c.goto(&format!("{base}/jobs/new")).await;
    until(&c, "location.pathname === '/login'").await;
    fill(&c, "#email", "ada@example.com").await;
    fill(&c, "#password", "password123").await;
    click(&c, "#sign-in").await;
    until(&c, "location.pathname === '/jobs/new' && document.querySelector('#training-upload')")
        .await;
    c.find("#training-upload").await.send_keys(bad.to_str().unwrap()).await;
    until(&c, "document.querySelector('#training-preview .preview[data-status=processed]')").await;

    // The Test-grader row is the file's first row, not `{}`.
    let row = until(&c, "document.querySelector('#test-item').dataset.fromFile && document.querySelector('#test-item').value").await;
    let row: serde_json::Value = serde_json::from_str(row.as_str().unwrap()).unwrap();
    assert_eq!(row, json!({"prompt": "2+2?", "reference_answer": "4"}));

    // A contains-check grader on `reference_answer`.
    let grader = json!({"type": "string_check", "name": "g", "operation": "like",
        "input": "{{sample.output_text}}", "reference": "{{item.reference_answer}}"});
    fill(&c, "#grader", &grader.to_string()).await;
    click(&c, "#run-preflight").await;
    assert_eq!(until(&c, "document.querySelector('#preflight-verdict').dataset.ok").await, "false");
    let line = until(&c, "document.querySelector('#preflight-result .line-error[data-line=\"2\"][data-field=\"reference_answer\"]').textContent").await;
    assert!(line.as_str().unwrap().contains("{{item.reference_answer}}"), "{line}");
    let listing =
        until(&c, "document.querySelector('tr[data-probe=all_candidates]').textContent").await;
    assert!(listing.as_str().unwrap().contains("scored 1 rewarded"), "{listing}");
    let empty =
        until(&c, "document.querySelector('tr[data-probe=empty_answer]').textContent").await;
    assert!(empty.as_str().unwrap().contains("scored 0"), "{empty}");
    shot(&c, "preflight-report").await;

    // A non-numeric learning rate names its field, next to it (the field marked) ...
    fill(&c, "#hp-learning_rate", "fast").await;
    click(&c, "#create-job").await;
    let error = until(&c, "document.querySelector('#hp-learning_rate[aria-invalid=true] + #hp-learning_rate-error') && document.querySelector('#hp-learning_rate-error').textContent").await;
    assert!(
        error.as_str().unwrap().contains("method.reinforcement.hyperparameters.learning_rate"),
        "{error}"
    );
    // ... and once fixed, the resubmit shows only its own error: the file's line and field,
    // next to the training file.
    c.find("#hp-learning_rate").await.clear().await;
    click(&c, "#create-job").await;
    let error = until(&c, "!document.querySelector('#hp-learning_rate-error') && !document.querySelector('#hp-learning_rate[aria-invalid]') && document.querySelector('#training-file-error') && document.querySelector('#training-file-error').textContent").await;
    let error = error.as_str().unwrap();
    assert!(error.contains("line 2") && error.contains("`reference_answer`"), "{error}");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!(jobs, 0, "nothing was enqueued");
    c.close().await;
}
