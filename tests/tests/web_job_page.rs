//! The job page tells the truth while a job runs, in a real headless Chromium: a worker that
//! writes metrics rows before its progress report does not make the step label lag the charts,
//! a step where dynamic sampling kept no group is a gap (not a 0) with its reason on hover,
//! events and progress arrive over the live stream without a reload, controls are enabled only
//! where valid, and Cancel asks before it runs. The API's `estimated_finish` is set while a job
//! runs. Phone widths do not overflow.

use verity_tests::api_support;
use verity_tests::training_support;
use verity_tests::webdriver;

use api_support::{base_model, file_and_job, get};
use serde_json::{json, Value};
use sqlx::PgPool;
use verity_core::queue::{DeviceKind, EventLevel, Lease, WorkerInfo};
use webdriver::{click, serve, shot, sign_in, until, Driver};

/// A reinforcement metrics row of `step` with reward `reward`; `kept` groups trained on.
fn row(step: i32, reward: f64, kept: u64) -> Value {
    json!({"step": step, "reward_mean": reward, "reward_std": 0.1, "accuracy": reward, "kl": 1e-9 * step as f64,
           "entropy": 0.0, "groups_drawn": 2, "groups_kept": kept, "sampling_seconds": 1.0,
           "grading_seconds": 0.1, "training_seconds": 0.5, "loss": 0.0})
}

/// Claims the only queued job as a worker would.
async fn claim(app: &api_support::TestApp) -> Lease {
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    app.state.queue.claim(&worker).await.unwrap().unwrap()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_live_job_page_tells_the_truth(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let (_, job_id) = file_and_job(&app, &key).await;
    let lease = claim(&app).await;

    // The worker wrote three steps (step 2 kept no group) but its last progress report says 1.
    for (step, reward, kept) in [(1, 0.25, 2), (2, 0.0, 0), (3, 0.5, 2)] {
        lease.metric(step, &row(step, reward, kept)).await.unwrap();
    }
    let finish = chrono::Utc::now().timestamp() + 600;
    let progress = json!({"step": 1, "total_steps": 4, "estimated_finish": finish,
                          "phase": "sampling", "trained_tokens": 10});
    lease.heartbeat(Some(&progress)).await.unwrap();

    // The API: estimated_finish while running.
    let api = get(&app.router, &format!("/v1/fine_tuning/jobs/{job_id}"), &key).await;
    assert_eq!(api.json()["status"], "running");
    assert_eq!(api.json()["estimated_finish"], finish, "{:?}", api.json());

    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, &format!("/jobs/{job_id}")).await;
    until(&c, "document.querySelector('#charts').dataset.points === '3'").await;
    // One source: the label follows the rows the charts draw, not the lagging report.
    assert_eq!(until(&c, "document.querySelector('#job-steps').textContent").await, "step 3 / 4");
    let eta = until(&c, "document.querySelector('#job-eta').textContent").await;
    assert!(eta.as_str().unwrap().ends_with("min left"), "{eta}");
    assert_eq!(until(&c, "document.querySelector('#job-phase').textContent").await, "sampling");
    // Controls valid for a running job: pause and cancel, not resume.
    let enabled = "['pause-job','resume-job','cancel-job'].map(function (id) { return !document.getElementById(id).disabled; }).join(',')";
    assert_eq!(until(&c, enabled).await, "true,false,true");

    // The skipped step is a gap in the reward chart, with the reason on hover.
    let reward = "window.verityCharts().find(function (c) { return c.title.startsWith('Reward (mean'); }).data";
    assert_eq!(until(&c, &format!("JSON.stringify({reward}[0])")).await, "[1,2,3]");
    assert_eq!(until(&c, &format!("JSON.stringify({reward}[1])")).await, "[0.25,null,0.5]");
    assert_eq!(until(&c, "document.querySelector('#charts').dataset.skipped").await, "2");
    // Legends show the latest values without hovering; axes have whole steps, no "-0".
    let legend = until(&c, "document.querySelector('#charts .u-legend').textContent").await;
    assert!(!legend.as_str().unwrap().contains("--"), "{legend}");
    assert!(legend.as_str().unwrap().contains("0.5"), "{legend}");
    // The band's legend entry says the std (0.1 in every row), once.
    let band = until(&c, "Array.from(document.querySelectorAll('#charts figure')).find(function (f) { return f.dataset.title.startsWith('Reward (mean'); }).querySelector('.u-legend').innerText").await;
    let band = band.as_str().unwrap().to_lowercase();
    assert!(band.contains("± std") && band.contains("0.1"), "{band}");
    assert!(!band.contains("+std"), "the band's upper edge has no entry: {band}");
    let chart = |title: &str| {
        format!("window.verityCharts().find(function (c) {{ return c.title === '{title}'; }})")
    };
    let kl_ticks = until(&c, &format!("JSON.stringify({}.yTicks)", chart("KL"))).await;
    assert!(!kl_ticks.as_str().unwrap().contains("-0"), "{kl_ticks}");
    let flat_ticks = until(&c, &format!("JSON.stringify({}.yTicks)", chart("Entropy"))).await;
    assert!(
        !flat_ticks.as_str().unwrap().contains("100"),
        "an all-zero series on 0–100: {flat_ticks}"
    );
    let steps = until(&c, &format!("JSON.stringify({}.xTicks)", chart("Accuracy"))).await;
    let steps: Vec<String> = serde_json::from_str(steps.as_str().unwrap()).unwrap();
    assert!(
        steps.iter().all(|t| t.is_empty() || t.parse::<u64>().is_ok()),
        "whole steps only: {steps:?}"
    );
    let hover = "(function () { var f = Array.from(document.querySelectorAll('#charts figure')).find(function (f) { return f.dataset.title.startsWith('Reward (mean'); }); var u = f.querySelector('.u-over'); var r = u.getBoundingClientRect(); u.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true})); var n = f.querySelector('.skip-note'); return !n.hidden && n.textContent; })()";
    let note = until(&c, hover).await;
    assert!(note.as_str().unwrap().contains("kept no group"), "{note}");
    shot(&c, "job-page-live").await;

    // A new step, an event and an evaluation phase arrive live, label and charts together.
    c.execute("window.__marker = 'same page'", vec![]).await;
    lease.metric(4, &row(4, 0.75, 2)).await.unwrap();
    lease.event(EventLevel::Info, "step", "step 4: reward 0.750", None).await.unwrap();
    let evaluating = json!({"step": 4, "total_steps": 4, "estimated_finish": finish,
                            "phase": "evaluating", "phase_done": 37, "phase_total": 200});
    lease.heartbeat(Some(&evaluating)).await.unwrap();
    until(&c, "document.querySelector('#charts').dataset.points === '4'").await;
    assert_eq!(until(&c, "document.querySelector('#job-steps').textContent").await, "step 4 / 4");
    until(&c, "document.querySelector('#job-phase').textContent === 'evaluating 37/200'").await;
    until(&c, "document.querySelector('#events').textContent.includes('step 4: reward 0.750')")
        .await;
    assert_eq!(c.execute("return window.__marker", vec![]).await, "same page");

    // Cancel asks first: dismissing the dialog changes nothing; confirming shows "cancelling…".
    click(&c, "#cancel-job").await;
    until(&c, "document.querySelector('#confirm-dialog').open").await;
    click(&c, "#confirm-no").await;
    until(&c, "!document.querySelector('#confirm-dialog').open").await;
    let job =
        verity_core::jobs::get_job(&pool, lease.job().org_id, &job_id).await.unwrap().unwrap();
    assert_eq!(job.control, "none", "a dismissed confirmation cancels nothing");
    // Without the confirmation (scripts off, a forged form) the server asks instead of acting.
    let session = c.cookie("verity_session").await;
    let http = reqwest::Client::new();
    let page = http
        .post(format!("{base}/jobs/{job_id}/control/cancel"))
        .header("cookie", format!("verity_session={session}"))
        .form(&[("x", "1")])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("id=\"confirm-question\""), "{page}");
    let job =
        verity_core::jobs::get_job(&pool, lease.job().org_id, &job_id).await.unwrap().unwrap();
    assert_eq!(job.control, "none", "an unconfirmed cancel cancels nothing");
    click(&c, "#cancel-job").await;
    until(&c, "document.querySelector('#confirm-dialog').open").await;
    click(&c, "#confirm-yes").await;
    until(&c, "document.querySelector('#job-phase').textContent === 'cancelling…'").await;
    assert_eq!(until(&c, enabled).await, "false,false,false");
    lease.ack_cancel().await.unwrap();
    until(&c, "document.querySelector('#job-status').textContent === 'cancelled'").await;

    // Events download as JSONL, oldest first.
    let jsonl = http
        .get(format!("{base}/jobs/{job_id}/events.jsonl"))
        .header("cookie", format!("verity_session={session}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<Value> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(events.len() >= 3, "{jsonl}");
    assert!(events.iter().any(|e| e["message"] == "step 4: reward 0.750"), "{jsonl}");
    c.close().await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_failed_job_says_so_instead_of_waiting(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let (_, job_id) = file_and_job(&app, &key).await;
    let lease = claim(&app).await;
    lease.fail("missing field 'item.reference_answer' in row 3", false).await.unwrap();
    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, &format!("/jobs/{job_id}")).await;
    let text = until(&c, "document.querySelector('#no-metrics').textContent").await;
    assert_eq!(text, "The job failed before its first step.");
    let error = until(&c, "!document.querySelector('#job-error').hidden && document.querySelector('#job-error').textContent").await;
    assert!(error.as_str().unwrap().contains("item.reference_answer"), "{error}");
    assert!(
        c.execute("return !document.querySelector('#pause-job') && !document.querySelector('#resume-job')", vec![]).await
            == Value::Bool(true),
        "no controls on a final job"
    );
    // The list shows why it failed.
    c.goto(&format!("{base}/jobs")).await;
    let failure = until(&c, "document.querySelector('table.jobs .failure').textContent").await;
    assert!(failure.as_str().unwrap().contains("item.reference_answer"), "{failure}");
    // A typo in the compare box keeps the page, the text typed, and says why beside the box.
    c.goto(&format!("{base}/jobs/{job_id}?compare=ftjob-typo")).await;
    let error = until(&c, "document.querySelector('#compare-error').textContent").await;
    assert_eq!(error, "compare: no job ftjob-typo in your org");
    let state = "[document.querySelector('#job-status').textContent, document.querySelector('#compare').value, document.querySelector('#compare').getAttribute('aria-invalid')].join('|')";
    assert_eq!(c.execute(&format!("return {state}"), vec![]).await, "failed|ftjob-typo|true");
    c.close().await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn keys_get_a_role_and_an_expiry_and_expired_keys_are_refused(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    let admin = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let post = |body: Value| api_support::post(&app.router, "/v1/api_keys", &admin, body);
    let bad = post(json!({"name": "x", "role": "owner"})).await;
    assert_eq!(bad.status, 400);
    assert!(bad.json().to_string().contains("role"), "{:?}", bad.json());
    let past = post(json!({"name": "x", "expires_at": 1})).await;
    assert_eq!(past.status, 400);
    assert!(past.json().to_string().contains("expires_at"), "{:?}", past.json());

    // A member key works for members' things and cannot make keys.
    let later = chrono::Utc::now().timestamp() + 3600;
    let member = post(json!({"name": "ci", "role": "member", "expires_at": later})).await;
    assert_eq!(member.status, 200, "{:?}", member.json());
    assert_eq!(member.json()["role"], "member");
    assert_eq!(member.json()["expires_at"], later);
    let secret = member.json()["secret"].as_str().unwrap().to_string();
    assert_eq!(get(&app.router, "/v1/files", &secret).await.status, 200);
    let minted =
        api_support::post(&app.router, "/v1/api_keys", &secret, json!({"name": "y"})).await;
    assert_eq!(minted.status, 403, "{:?}", minted.json());

    // A key past its expiry is refused.
    let soon = chrono::Utc::now().timestamp() + 3;
    let short = post(json!({"name": "short", "expires_at": soon})).await;
    assert_eq!(short.status, 200, "{:?}", short.json());
    let secret = short.json()["secret"].as_str().unwrap().to_string();
    assert_eq!(get(&app.router, "/v1/files", &secret).await.status, 200);
    while chrono::Utc::now().timestamp() <= soon {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let refused = get(&app.router, "/v1/files", &secret).await;
    assert_eq!(refused.status, 401);
    assert!(refused.json().to_string().contains("expired"), "{:?}", refused.json());
    let listed = get(&app.router, "/v1/api_keys", &admin).await;
    let row = listed.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "short")
        .cloned()
        .unwrap();
    assert_eq!(row["expired"], true, "{row}");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn phone_layouts_fit_and_unknown_pages_say_not_found(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let (_, job_id) = file_and_job(&app, &key).await;
    let lease = claim(&app).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.bin"), b"x").unwrap();
    let prefix = format!("jobs/{job_id}/checkpoints/step-1");
    verity_core::storage::publish_folder(app.state.store.as_ref(), dir.path(), &prefix)
        .await
        .unwrap();
    lease.metric(1, &row(1, 0.5, 2)).await.unwrap();
    lease.checkpoint(1, &prefix, 1, Some(&row(1, 0.5, 2))).await.unwrap();
    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/jobs").await;
    c.set_window_size(390, 844).await;
    let overflow = "document.documentElement.scrollWidth - document.documentElement.clientWidth";
    for path in [
        "/jobs".to_string(),
        format!("/jobs/{job_id}"),
        "/files".into(),
        "/keys".into(),
        format!("/jobs/{job_id}/checkpoints"),
    ] {
        c.goto(&format!("{base}{path}")).await;
        until(&c, "document.readyState === 'complete' && document.querySelector('main')").await;
        let wide = c.execute(&format!("return {overflow}"), vec![]).await;
        let name = path.replace('/', "_");
        shot(&c, &format!("phone{name}")).await;
        let widest = c.execute("return Array.from(document.querySelectorAll('body *')).filter(function (e) { return e.getBoundingClientRect().right > document.documentElement.clientWidth + 1; }).slice(0, 5).map(function (e) { return e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right); }).join(', ')", vec![]).await;
        assert!(
            wide.as_i64().unwrap() <= 1,
            "{path} is {wide} px wider than a 390 px phone: {widest}"
        );
    }
    // An unknown page is a 404 page in the layout; the API's unknown paths stay JSON.
    c.goto(&format!("{base}/no/such/page")).await;
    until(&c, "document.querySelector('#not-found')").await;
    let http = reqwest::Client::new();
    let page = http
        .get(format!("{base}/no/such/page"))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 404);
    let api =
        http.get(format!("{base}/v1/nothing")).header("accept", "text/html").send().await.unwrap();
    assert_eq!(api.status(), 404);
    assert!(api.text().await.unwrap().starts_with('{'));
    let icon = http.get(format!("{base}/favicon.ico")).send().await.unwrap();
    assert_eq!(icon.status(), 200);
    assert_eq!(icon.headers()["content-type"], "image/svg+xml");
    c.close().await;
}

/// The real worker's progress: each step's report (with `estimated_finish`) is stored before
/// the next step begins, so the API shows it while the job runs (checked whenever a poll lands
/// in a running step, and on the last report stored); once the job succeeds, it shows none.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_training_job_reports_its_finish_and_phase_while_running(pool: PgPool) {
    use std::sync::Arc;
    use verity_worker::trainer::testing::{first_token_grader, target_token_jsonl};
    let root = tempfile::tempdir().unwrap();
    let store = training_support::prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let router = verity_server::app::app(state.clone());
    let file = api_support::upload(&router, &key, "t.jsonl", target_token_jsonl(4).as_bytes())
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let hp = json!({"batch_size": 2, "group_size": 2, "max_steps": 4, "max_completion_tokens": 3,
                    "checkpoint_interval": 4, "eval_interval": 4, "eval_samples": 2});
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": first_token_grader(), "hyperparameters": hp}});
    let job = api_support::post(&router, "/v1/fine_tuning/jobs", &key,
        json!({"model": training_support::MODEL, "training_file": file, "validation_file": file, "method": method})).await;
    assert_eq!(job.status, 200, "{:?}", job.json());
    let job_id = job.json()["id"].as_str().unwrap().to_string();
    let handler = training_support::cpu_training_handler(store.clone(), &root.path().join("cache"));
    let options = verity_core::queue::RunnerOptions { max_jobs: Some(1), ..Default::default() };
    let worker = tokio::spawn(verity_core::queue::run_worker(
        state.queue.clone(),
        WorkerInfo::new(DeviceKind::Cpu, 1024),
        Arc::new(handler),
        options,
        tokio_util::sync::CancellationToken::new(),
    ));
    let url = format!("/v1/fine_tuning/jobs/{job_id}");
    loop {
        // The job row, not a cached copy: what any server would answer.
        let record = verity_core::jobs::get_job(&pool, state_org(&pool).await, &job_id)
            .await
            .unwrap()
            .unwrap();
        let object = verity_server::api::jobs::view::JobObject::from(record);
        if object.status == "running" {
            let step = object.progress.as_ref().and_then(|p| p["step"].as_u64()).unwrap_or(0);
            if step >= 1 {
                assert!(
                    object.estimated_finish.is_some(),
                    "running after a step: {:?}",
                    object.progress
                );
            }
        }
        if object.status == "succeeded" {
            assert_eq!(object.estimated_finish, None, "none once the job stops");
            // The last report the worker stored, shown as it was while the job ran.
            let report = object.progress.clone().unwrap();
            assert_eq!(report["step"], 4, "{report}");
            assert!(report["estimated_finish"].is_i64(), "{report}");
            let mut running = verity_core::jobs::get_job(&pool, state_org(&pool).await, &job_id)
                .await
                .unwrap()
                .unwrap();
            running.state = verity_core::JobState::Running;
            let shown = verity_server::api::jobs::view::JobObject::from(running);
            assert_eq!(shown.estimated_finish, report["estimated_finish"].as_i64());
            break;
        }
        assert!(!["failed", "cancelled"].contains(&object.status.as_str()), "{:?}", object.error);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(worker.await.unwrap(), 1);
    let done = get(&router, &url, &key).await;
    assert_eq!(done.json()["status"], "succeeded");
}

/// The org of the only user.
async fn state_org(pool: &PgPool) -> uuid::Uuid {
    sqlx::query_scalar("SELECT org_id FROM users LIMIT 1").fetch_one(pool).await.unwrap()
}

/// Two runs overlaid (`?compare=`): every chart draws both, and each legend, long labels
/// included, stays inside its card on a laptop and on a phone.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn compared_runs_share_the_charts_and_their_legends_fit_the_cards(pool: PgPool) {
    let app = api_support::app(pool.clone()).await;
    base_model(&app).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let (file, first) = file_and_job(&app, &key).await;
    let lease = claim(&app).await;
    let body = json!({"model": "tiny", "training_file": file, "method": api_support::method(),
                      "suffix": "a-rather-long-suffix-for-a-legend-entry"});
    let second = api_support::post(&app.router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(second.status, 200, "{:?}", second.json());
    let second = second.json()["id"].as_str().unwrap().to_string();
    let other = claim(&app).await;
    for step in 1..=3 {
        lease.metric(step, &row(step, 0.1 * step as f64, 2)).await.unwrap();
        other.metric(step, &row(step, 0.2 * step as f64, 2)).await.unwrap();
    }
    let base = serve(app.state.clone()).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, &format!("/jobs/{first}?compare={second}")).await;
    let fits = "(function () { var bad = []; document.querySelectorAll('#charts figure').forEach(function (f) { var box = f.getBoundingClientRect(); var l = f.querySelector('.u-legend'); if (!l) return; var r = l.getBoundingClientRect(); if (r.left < box.left - 1 || r.right > box.right + 1) bad.push(f.dataset.title + ' ' + Math.round(r.left) + '..' + Math.round(r.right) + ' in ' + Math.round(box.left) + '..' + Math.round(box.right)); }); return JSON.stringify(bad); })()";
    for (width, height) in [(1280, 900), (390, 844)] {
        c.set_window_size(width, height).await;
        c.goto(&format!("{base}/jobs/{first}?compare={second}")).await;
        until(&c, "document.querySelector('#charts').dataset.points === '3' && document.querySelector('#charts .u-legend')").await;
        let legend = until(&c, "document.querySelector('#charts .u-legend').textContent").await;
        assert!(legend.as_str().unwrap().contains("a-rather-long-suffix"), "both runs: {legend}");
        assert_eq!(c.execute(&format!("return {fits}"), vec![]).await, "[]", "at {width} px");
    }
    c.close().await;
}
