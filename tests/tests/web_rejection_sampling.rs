//! Rejection sampling in a real headless Chromium: from a finished job's page ("Rejection-sample")
//! the form is prefilled with the job's model, file and grader; a bad value is refused with the
//! API's error naming the field and nothing is queued; a run started from the form is watched
//! live while an in-process CPU worker runs it on a tiny random model, then shows the summary,
//! the pass-rate histogram and the per-prompt table exactly as the API reports them; "Train on
//! this file" opens the new-job page with the kept file and the supervised method chosen; Cancel
//! asks first; no horizontal scrolling at 390 px.

use verity_tests::api_support;
use verity_tests::training_support;
use verity_tests::webdriver;

use serde_json::{json, Value};
use sqlx::PgPool;
use training_support::{contains_grader, prepare_store, prompts_jsonl, run_one_job, MODEL};
use verity_core::queue::{Queue, QueueSettings};
use webdriver::{click, fill, serve, shot, sign_in, until, Browser, Driver};

/// Reads a page value as a string once it is truthy.
async fn text(c: &Browser, expression: &str) -> String {
    let value = until(c, expression).await;
    value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())
}

async fn queued_runs(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id LIKE 'rsjob-%'")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn rejection_sampling_runs_from_the_dashboard_in_a_real_browser(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state.clone());
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(state).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let cache = root.path().join("cache");
    let reply =
        api_support::upload(&router, &key, "prompts.jsonl", prompts_jsonl().as_bytes()).await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    let file = reply.json()["id"].as_str().unwrap().to_string();

    // A finished one-step LoRA job to sample from.
    let hp = json!({"batch_size": 2, "group_size": 2, "max_steps": 1, "max_completion_tokens": 4,
                    "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0}});
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": contains_grader(), "hyperparameters": hp}});
    let body = json!({"model": MODEL, "training_file": file, "method": method, "seed": 3});
    let job = api_support::post(&router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(job.status, 200, "{:?}", job.json());
    let job_id = job.json()["id"].as_str().unwrap().to_string();
    run_one_job(&queue, store.clone(), &cache).await;
    let job =
        api_support::get(&router, &format!("/v1/fine_tuning/jobs/{job_id}"), &key).await.json();
    let fine_tuned = job["fine_tuned_model"].as_str().expect("the job succeeded").to_string();

    // Sign in; the nav's Sampling page is empty; the job's page offers "Rejection-sample".
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/jobs").await;
    click(&c, "a[href='/rejection-sampling']").await;
    until(&c, "location.pathname === '/rejection-sampling' && document.querySelector('#new-rejection-sampling')").await;
    assert!(until(&c, "document.body.textContent.includes('No runs yet')")
        .await
        .as_bool()
        .unwrap());
    c.goto(&format!("{base}/jobs/{job_id}")).await;
    click(&c, "#rejection-sample-job").await;
    until(
        &c,
        "location.pathname === '/rejection-sampling/new' && document.querySelector('#rs-form')",
    )
    .await;
    assert_eq!(text(&c, "document.querySelector('#rs-model').value").await, fine_tuned);
    assert_eq!(text(&c, "document.querySelector('#rs-file').value").await, file);
    let grader: Value =
        serde_json::from_str(&text(&c, "document.querySelector('#rs-grader').value").await)
            .unwrap();
    assert_eq!(grader, contains_grader(), "the job's grader");
    assert!(text(&c, "document.querySelector('#rs-from-job').textContent").await.contains(&job_id));

    // A bad k is refused with the API's error naming the field; nothing is queued.
    fill(&c, "#rs-k", "0").await;
    click(&c, "#rs-create").await;
    let error = text(&c, "!document.querySelector('#rs-error').hidden && document.querySelector('#rs-error').textContent").await;
    assert!(error.starts_with("k: "), "{error}");
    assert_eq!(queued_runs(&pool).await, 0);
    shot(&c, "rejection-sampling-01-form-error").await;

    // The base samples: 6 per prompt, every passing completion kept.
    fill(&c, "#rs-model", MODEL).await;
    fill(&c, "#rs-k", "6").await;
    c.execute("document.querySelector('#rs-policy').value = 'all_passing';", vec![]).await;
    fill(&c, "#rs-max-tokens", "4").await;
    fill(&c, "#rs-seed", "5").await;
    click(&c, "#rs-create").await;
    let path =
        text(&c, "location.pathname.startsWith('/rejection-sampling/rsjob-') && location.pathname")
            .await;
    let run_id = path.trim_start_matches("/rejection-sampling/").to_string();
    assert_eq!(text(&c, "document.querySelector('#rs-status').dataset.status").await, "queued");
    assert_eq!(queued_runs(&pool).await, 1);

    // The page follows the run live (no reload by the test) and shows its summary at the end.
    run_one_job(&queue, store.clone(), &cache).await;
    until(&c, "document.querySelector('#rs-status').dataset.status === 'succeeded' && document.querySelector('#rs-kept')").await;
    shot(&c, "rejection-sampling-02-summary").await;
    let run = api_support::get(&router, &format!("/v1/verity/rejection_sampling/{run_id}"), &key)
        .await
        .json();
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["k"], 6);
    assert_eq!(run["policy"], "all_passing");
    let summary = &run["summary"];
    assert_eq!(
        text(&c, "document.querySelector('#rs-kept').textContent").await,
        summary["kept"].to_string()
    );
    assert_eq!(text(&c, "document.querySelector('#rs-prompts').textContent").await, "4");
    assert_eq!(
        text(&c, "document.querySelector('#rs-with-a-pass').textContent").await,
        summary["prompts_with_a_pass"].to_string()
    );
    let table = c
        .execute(
            "return [...document.querySelectorAll('#rs-prompts-table tbody tr')].map(r => [...r.cells].map(c => c.textContent.trim()));",
            vec![],
        )
        .await;
    let per_prompt = summary["per_prompt"].as_array().unwrap();
    assert_eq!(table.as_array().unwrap().len(), per_prompt.len());
    for (row, p) in table.as_array().unwrap().iter().zip(per_prompt) {
        let passing = format!("{} / {}", p["passing"], p["samples"]);
        assert_eq!(row[0], (p["prompt_index"].as_u64().unwrap() + 1).to_string());
        assert_eq!(row[1], passing.as_str(), "{row} vs {p}");
        assert_eq!(row[3], p["kept"].to_string().as_str());
    }
    let histogram = c
        .execute(
            "return [...document.querySelectorAll('#rs-histogram .bucket-count')].map(b => Number(b.textContent));",
            vec![],
        )
        .await;
    let counts: Vec<u64> =
        histogram.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(counts.iter().sum::<u64>(), 4, "every prompt in one bucket: {counts:?}");
    let never = per_prompt.iter().filter(|p| p["passing"] == 0).count() as u64;
    let always = per_prompt.iter().filter(|p| p["passing"] == p["samples"]).count() as u64;
    assert_eq!((counts[0], counts[4]), (never, always), "{counts:?}");

    // "Train on this file": the new-job page with the kept file and supervised chosen.
    let output = run["output_file"].as_str().expect("some completion passed").to_string();
    assert_eq!(text(&c, "document.querySelector('#rs-output-file').textContent").await, output);
    click(&c, "#rs-train").await;
    until(&c, "location.pathname === '/jobs/new' && document.querySelector('#job-form')").await;
    assert_eq!(text(&c, "document.querySelector('#training-file').value").await, output);
    assert_eq!(
        text(&c, "document.querySelector('input[name=method]:checked').value").await,
        "supervised"
    );

    // The list shows the run with its kept count.
    c.goto(&format!("{base}/rejection-sampling")).await;
    let listed = text(&c, &format!("document.querySelector('#rejection-sampling-runs a[href=\"/rejection-sampling/{run_id}\"]').closest('tr').textContent")).await;
    assert!(
        listed.contains("succeeded") && listed.contains(&summary["kept"].to_string()),
        "{listed}"
    );

    // Cancel asks first: declined, nothing changes; confirmed, the queued run is cancelled.
    let body =
        json!({"model": MODEL, "file": file, "grader": contains_grader(), "k": 2, "max_tokens": 4});
    let second = api_support::post(&router, "/v1/verity/rejection_sampling", &key, body).await;
    assert_eq!(second.status, 200, "{:?}", second.json());
    let second = second.json()["id"].as_str().unwrap().to_string();
    c.goto(&format!("{base}/rejection-sampling/{second}")).await;
    until(&c, "document.querySelector('#rs-cancel')").await;
    c.execute("window.confirm = () => false;", vec![]).await;
    click(&c, "#rs-cancel").await;
    let after = api_support::get(&router, &format!("/v1/verity/rejection_sampling/{second}"), &key)
        .await
        .json();
    assert_eq!(
        (after["status"].as_str(), after["pending_control"].as_str()),
        (Some("queued"), None)
    );
    c.execute("window.confirm = () => true;", vec![]).await;
    click(&c, "#rs-cancel").await;
    until(&c, "document.querySelector('#rs-status').dataset.status === 'cancelled'").await;

    // Phone width: no horizontal scrolling on the run's page, the form and the list.
    c.set_window_size(390, 844).await;
    for page in [
        format!("/rejection-sampling/{run_id}"),
        "/rejection-sampling/new".into(),
        "/rejection-sampling".into(),
    ] {
        c.goto(&format!("{base}{page}")).await;
        until(&c, "document.readyState === 'complete'").await;
        let overflow = c
            .execute("return document.documentElement.scrollWidth - document.documentElement.clientWidth;", vec![])
            .await;
        assert!(overflow.as_i64().unwrap() <= 1, "{page} scrolls sideways at 390 px: {overflow}");
    }
    shot(&c, "rejection-sampling-03-phone").await;
    c.close().await;
}
