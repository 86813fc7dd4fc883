//! The playground in a real headless Chromium: opened from a job's page ("Try it"), the job's
//! base model and its checkpoint answer one prompt side by side, both streamed from a real API
//! server and a real inference worker (registered through Postgres) serving a tiny random
//! model; a validation row fills the prompt and the job's grader scores both answers; Stop
//! aborts both streams and the worker frees their rows; the models page links to the
//! playground; no horizontal scrolling at 390 px.

use verity_tests::api_support;
use verity_tests::inference_support;
use verity_tests::webdriver;

use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verity_core::queue::{DeviceKind, Queue, QueueSettings, WorkerInfo};
use verity_core::storage::{publish_folder, LocalStore, ObjectStore};
use verity_worker::trainer::testing::{first_token_grader, target_token_jsonl};
use webdriver::{click, fill, serve, shot, until, Driver};

/// The base model's name.
const BASE: &str = "tiny-llama";

/// Reads a dashboard value (a text, an attribute) as a string.
async fn text(c: &webdriver::Browser, expression: &str) -> String {
    until(c, expression).await.as_str().unwrap_or_default().to_string()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_playground_compares_a_base_and_its_checkpoint_in_a_real_browser(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(root.path().join("objects"), None).await.unwrap());
    let (base_dir, checkpoint_dir) = (root.path().join("base"), root.path().join("ckpt"));
    // Contexts long enough for an answer that outlasts the Stop button.
    inference_support::tiny_model(&base_dir, 3, 8192);
    inference_support::tiny_model(&checkpoint_dir, 4, 8192);
    publish_folder(store.as_ref(), &base_dir, "models/tiny-llama").await.unwrap();
    verity_core::models::insert_base_model(
        &pool,
        None,
        BASE,
        "models/tiny-llama",
        "hf",
        &json!({}),
    )
    .await
    .unwrap();

    // API server and inference worker.
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let base = serve(state.clone()).await;
    let (engine, shutdown) = inference_support::start_worker(
        &pool,
        store.clone(),
        &root.path().join("cache"),
        (8, verity_core::spec::RolloutDtype::F32),
    )
    .await;
    let _stop_worker = shutdown.drop_guard();

    // A job with a validation file and a grader, and a checkpoint (other weights) at step 1.
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let router = verity_server::app::app(state.clone());
    let mut files = Vec::new();
    for (name, rows) in [("train.jsonl", 4), ("valid.jsonl", 3)] {
        let reply =
            api_support::upload(&router, &key, name, target_token_jsonl(rows).as_bytes()).await;
        assert_eq!(reply.status, 200, "{:?}", reply.json());
        files.push(reply.json()["id"].as_str().unwrap().to_string());
    }
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": first_token_grader(),
        "hyperparameters": {"max_steps": 2, "batch_size": 2, "group_size": 2, "max_completion_tokens": 24}}});
    let body = json!({"model": BASE, "training_file": files[0], "validation_file": files[1], "method": method});
    let reply = api_support::post(&router, "/v1/fine_tuning/jobs", &key, body).await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    let job_id = reply.json()["id"].as_str().unwrap().to_string();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1 << 20);
    queue.register_worker(&worker).await.unwrap();
    let lease = queue.claim(&worker).await.unwrap().unwrap();
    let prefix = format!("jobs/{job_id}/checkpoints/step-1");
    publish_folder(store.as_ref(), &checkpoint_dir, &prefix).await.unwrap();
    lease.checkpoint(1, &prefix, 1, None).await.unwrap();
    let org: uuid::Uuid = sqlx::query_scalar("SELECT org_id FROM jobs WHERE id = $1")
        .bind(&job_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let job = verity_core::jobs::get_job(&pool, org, &job_id).await.unwrap().unwrap();
    let checkpoint = verity_core::models::checkpoint_model_name(&job.output_model_name(), 1);
    // Sign in, open the job, "Try it": base left, checkpoint right, validation row 1 loaded.
    let driver = Driver::start().await;
    let c = driver.browser().await;
    c.goto(&format!("{base}/login")).await;
    fill(&c, "#email", "ada@example.com").await;
    fill(&c, "#password", "password123").await;
    click(&c, "#sign-in").await;
    until(&c, "location.pathname === '/jobs'").await;
    c.goto(&format!("{base}/jobs/{job_id}")).await;
    click(&c, "#open-playground").await;
    until(&c, "location.pathname === '/playground' && document.querySelector('#playground')").await;
    assert_eq!(text(&c, "document.querySelector('#model-left').value").await, BASE);
    assert_eq!(text(&c, "document.querySelector('#model-right').value").await, checkpoint);
    assert_eq!(text(&c, "document.querySelector('#pg-user').value").await, "t3 t10");
    assert_eq!(text(&c, "document.querySelector('#row-pick').dataset.loaded").await, "1");
    // Answers are cut where the job's rollouts were: the job's max_completion_tokens.
    assert_eq!(text(&c, "document.querySelector('#pg-max-tokens').value").await, "24");

    // Row by number, then a random one (whichever it is, the prompt is that row's).
    fill(&c, "#pg-row", "3").await;
    click(&c, "#pg-load-row").await;
    until(&c, "document.querySelector('#pg-user').value === 't5 t14'").await;
    click(&c, "#pg-random-row").await;
    let n: usize = text(&c, "document.querySelector('#pg-row-status').textContent.startsWith('Row ') && document.querySelector('#row-pick').dataset.loaded").await.parse().unwrap();
    assert!((1..=3).contains(&n), "{n}");
    let prompt = text(&c, "document.querySelector('#pg-user').value").await;
    assert_eq!(prompt, format!("t{} t{}", 2 + n, 8 + 2 * n));

    // Run: both panes stream their answers, then both are scored by the job's grader.
    fill(&c, "#pg-seed", "7").await;
    fill(&c, "#pg-temperature", "1").await;
    fill(&c, "#pg-max-tokens", "12").await;
    click(&c, "#pg-run").await;
    until(&c, "['left', 'right'].every(s => document.querySelector('#answer-' + s).dataset.state === 'done')").await;
    shot(&c, "playground-01-answers").await;
    let mut answers = Vec::new();
    for side in ["left", "right"] {
        let answer =
            text(&c, &format!("document.querySelector('#answer-{side}').textContent")).await;
        let reward =
            text(&c, &format!("document.querySelector('#score-{side}').dataset.reward")).await;
        // The same request outside the browser gives the same text (same seed, same model).
        let model = if side == "left" { BASE } else { checkpoint.as_str() };
        let reply = api_support::post(&router, "/v1/chat/completions", &key, json!({"model": model,
            "messages": [{"role": "user", "content": prompt}], "seed": 7, "temperature": 1, "max_tokens": 12})).await;
        assert_eq!(reply.status, 200, "{:?}", reply.json());
        assert_eq!(reply.json()["choices"][0]["message"]["content"], answer.as_str(), "{side}");
        let expected = if answer.split_whitespace().next() == Some("t7") { "1" } else { "0" };
        assert_eq!(reward, expected, "{side}: {answer:?}");
        answers.push(answer);
    }
    assert_ne!(answers[0], answers[1], "the checkpoint's weights differ from the base's");

    // Stop aborts both streams and the worker frees their rows. (A random model soon samples its
    // end-of-sequence token, so this run's requests suppress it to outlast the click.)
    c.execute("const f = window.fetch; window.fetch = (u, o) => { if (String(u).endsWith('/v1/chat/completions')) { const b = JSON.parse(o.body); b.logit_bias = {'2': -100}; o = Object.assign({}, o, {body: JSON.stringify(b)}); } return f(u, o); };", vec![]).await;
    fill(&c, "#pg-max-tokens", "8000").await;
    click(&c, "#pg-run").await;
    until(&c, "['left', 'right'].every(s => document.querySelector('#answer-' + s).textContent.length > 0 && document.querySelector('#answer-' + s).dataset.state === 'streaming')").await;
    click(&c, "#pg-stop").await;
    until(&c, "['left', 'right'].every(s => document.querySelector('#answer-' + s).dataset.state === 'stopped') && !document.querySelector('#pg-run').disabled").await;
    let score = text(&c, "document.querySelector('#score-left').textContent || 'none'").await;
    assert_eq!(score, "none", "stopped answers are not scored");
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.active_requests() > 0 {
        assert!(Instant::now() < deadline, "stopped answers kept their batch rows");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    click(&c, "#theme-toggle").await;
    until(&c, "document.documentElement.dataset.theme === 'dark'").await;
    shot(&c, "playground-02-stopped-dark").await;
    click(&c, "#theme-toggle").await;

    // The models page lists the checkpoint and opens it in the playground.
    c.goto(&format!("{base}/models")).await;
    click(&c, &format!("a[data-model=\"{checkpoint}\"]")).await;
    until(&c, "location.pathname === '/playground'").await;
    assert_eq!(text(&c, "document.querySelector('#model-right').value").await, checkpoint);

    // Phone width: panes stacked, no horizontal scrolling.
    c.set_window_size(390, 844).await;
    c.goto(&format!("{base}/playground?job={job_id}")).await;
    until(&c, "document.querySelector('#row-pick').dataset.loaded").await;
    let layout = c
        .execute(
            "const l = document.querySelector('#answer-left').getBoundingClientRect(), r = document.querySelector('#answer-right').getBoundingClientRect(); return [document.documentElement.scrollWidth - document.documentElement.clientWidth, r.top >= l.bottom];",
            vec![],
        )
        .await;
    assert!(layout[0].as_i64().unwrap() <= 1, "no horizontal scrolling at 390 px: {layout}");
    assert_eq!(layout[1], json!(true), "panes stacked on a phone: {layout}");
    shot(&c, "playground-03-phone").await;
    c.close().await;
}
