//! The job page shows a job's budget and monitor warnings truthfully, in a real headless
//! Chromium: while running, the ETA says when the budget will pause the job (not a finish it
//! will not reach); each warning is a structured item (kind, metric, value vs threshold, step,
//! whether it paused the job), rendered the same by the server and by the live stream; when the
//! worker pauses the job at its budget the reason appears live ("budget of 600 s reached at
//! step 8"); the budget form raises the cap and Resume then queues the job.

use verity_tests::api_support;
use verity_tests::webdriver;

use api_support::{base_model, post, upload, DATASET};
use serde_json::{json, Value};
use sqlx::PgPool;
use verity_core::queue::{DeviceKind, EventLevel, WorkerInfo};
use webdriver::{click, fill, serve, shot, sign_in, until, Driver};

/// A metrics row of `step` whose entropy collapses from step 6 on.
fn row(step: i32) -> Value {
    json!({"step": step, "reward_mean": 0.1, "entropy": 1.0 / (1.0 + 10.0 * (step - 1) as f64),
           "completion_length_mean": 10.0, "groups_kept": 2, "loss": 0.0})
}

/// Sets what the job has used, as the worker does at the end of a step.
async fn used(pool: &PgPool, job: &str, seconds: f64) {
    sqlx::query("UPDATE jobs SET used_wall_seconds = $2 WHERE id = $1")
        .bind(job)
        .bind(seconds)
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_job_page_shows_its_budget_and_structured_warnings(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let file = upload(&app.router, &key, "train.jsonl", DATASET).await.json();
    let mut method = api_support::method();
    method["reinforcement"]["hyperparameters"]["auto_pause_on"] = json!(["entropy_collapse"]);
    let created = post(
        &app.router,
        "/v1/fine_tuning/jobs",
        &key,
        json!({"model": "tiny", "training_file": file["id"], "method": method,
               "budget": {"max_wall_seconds": 600}}),
    )
    .await;
    assert_eq!(created.status.as_u16(), 200, "{:?}", created.json());
    let job_id = created.json()["id"].as_str().unwrap().to_string();
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();

    // Eight steps (entropy collapsed), an auto-pause at step 6, 540 of 600 s used, and a
    // report that the budget pauses the job at step 9.
    for step in 1..=8 {
        lease.metric(step, &row(step)).await.unwrap();
    }
    let pause = json!({"kind": "entropy_collapse", "metric": "entropy", "step": 6});
    lease
        .event(EventLevel::Warn, "auto_pause", "paused by auto_pause_on", Some(&pause))
        .await
        .unwrap();
    used(&pool, &job_id, 540.0).await;
    let at = chrono::Utc::now().timestamp() + 60;
    let progress = json!({"step": 8, "total_steps": 20, "estimated_finish": null,
                          "budget_pause": {"step": 9, "at": at}});
    lease.heartbeat(Some(&progress)).await.unwrap();

    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, &format!("/jobs/{job_id}")).await;
    let eta = until(&c, "document.querySelector('#job-eta').textContent").await;
    assert!(eta.as_str().unwrap().starts_with("budget pauses it at step 9 (~"), "{eta}");
    assert_eq!(
        until(&c, "document.querySelector('#job-budget-text').textContent").await,
        "540 s of 600 s"
    );
    assert_eq!(until(&c, "document.querySelector('#job-paused').hidden").await, true);

    // The warning, rendered by the server, then again from the live stream's status.
    let item = "document.querySelector('.warning-item[data-kind=entropy_collapse]')";
    until(&c, item).await;
    c.execute(&format!("{item}.dataset.server = '1'"), vec![]).await;
    until(&c, &format!("{item} && !{item}.dataset.server")).await;
    let part = |class: &str| format!("{item}.querySelector('.{class}').textContent");
    assert_eq!(until(&c, &part("w-kind")).await, "entropy_collapse");
    assert_eq!(until(&c, &part("w-metric")).await, "entropy");
    assert_eq!(until(&c, &part("w-threshold")).await, "0.200");
    assert_eq!(until(&c, &part("w-step")).await, "8");
    assert_eq!(until(&c, &part("w-pause")).await, "auto-paused the job at step 6");
    assert_eq!(until(&c, &format!("{item}.dataset.autoPaused")).await, "true");
    let value: f64 = until(&c, &part("w-value")).await.as_str().unwrap().parse().unwrap();
    assert!(value < 0.2, "the value that crossed the threshold: {value}");
    assert!(until(&c, &part("w-message")).await.as_str().unwrap().contains("Entropy collapsed"));

    // The worker pauses the job at its budget: the reason arrives live.
    used(&pool, &job_id, 612.0).await;
    let reason =
        "budget of 600 s reached at step 8 (612 s used); raise max_wall_seconds and resume";
    let paused = json!({"step": 8, "total_steps": 20, "paused_reason": reason});
    lease.heartbeat(Some(&paused)).await.unwrap();
    lease.ack_pause().await.unwrap();
    until(&c, "document.querySelector('#job-status').textContent === 'paused'").await;
    until(&c, "!document.querySelector('#job-paused').hidden").await;
    assert_eq!(until(&c, "document.querySelector('#job-paused-text').textContent").await, reason);
    assert_eq!(
        until(&c, "document.querySelector('#job-budget-text').textContent").await,
        "612 s of 600 s"
    );
    shot(&c, "job-page-budget-paused").await;

    // Raise the cap, then resume.
    fill(&c, "#budget-wall", "1200").await;
    click(&c, "#budget-save").await;
    until(&c, "document.querySelector('#job-budget-text').textContent === '612 s of 1200 s'").await;
    let caps: (Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT max_wall_seconds, max_tokens FROM jobs WHERE id = $1")
            .bind(&job_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(caps, (Some(1200), None));
    until(&c, "!document.querySelector('#resume-job').disabled").await;
    click(&c, "#resume-job").await;
    until(&c, "document.querySelector('#job-status').textContent === 'queued'").await;
    c.close().await;
}
