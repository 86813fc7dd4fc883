//! The dashboard in a real headless Chromium (driven over WebDriver): sign in,
//! a bad upload shows its line error, upload a dataset, write a grader and test it, create a job
//! on a tiny random model, watch the charts gain points while an in-process worker trains it,
//! open the completions, download a checkpoint, continue training from it (the new-job page
//! prefilled) and test a model grader judged by the fine-tuned model, cancel a second job, create and revoke an API key. WebDriver is spoken by the small client in `webdriver/`. Screenshots of each page land in `$CARGO_TARGET_DIR/dashboard-screenshots/`.

use verity_tests::api_support;
use verity_tests::inference_support;
use verity_tests::training_support;
use verity_tests::webdriver;

use serde_json::{json, Value};
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use verity_core::queue::{run_worker, DeviceKind, RunnerOptions, WorkerInfo};
use verity_worker::job::{TrainingHandler, TrainingHandlerConfig};
use verity_worker::trainer::testing::{first_token_grader, target_token_jsonl, TARGET_TOKEN};
use webdriver::{click, fill, serve, shot, until, Driver};

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_dashboard_works_in_a_real_browser(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = training_support::prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(state.clone()).await;
    // The inference worker the Test-grader panel's model grader asks its judge through.
    let cache = root.path().join("inference-cache");
    let (_engine, inference) = inference_support::start_worker(
        &pool,
        store.clone(),
        &cache,
        (4, verity_core::spec::RolloutDtype::F32),
    )
    .await;
    let _stop_inference = inference.drop_guard();
    let driver = Driver::start().await;
    let c = driver.browser().await;
    let files = root.path().join("uploads");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("bad.jsonl"), "{\"prompt\": \"fine\"}\n{\"oops\": 1}\n").unwrap();
    std::fs::write(files.join("train.jsonl"), target_token_jsonl(6)).unwrap();
    std::fs::write(files.join("valid.jsonl"), target_token_jsonl(3)).unwrap();

    // Sign in.
    c.goto(&format!("{base}/jobs")).await;
    until(&c, "location.pathname === '/login'").await;
    shot(&c, "01-login").await;
    fill(&c, "#email", "ada@example.com").await;
    fill(&c, "#password", "password123").await;
    click(&c, "#sign-in").await;
    until(&c, "location.pathname === '/jobs' && document.querySelector('#new-job')").await;
    shot(&c, "02-jobs-empty").await;

    // New job: a bad upload shows its line error; good uploads show a preview.
    click(&c, "#new-job").await;
    until(&c, "document.querySelector('#training-upload')").await;
    c.find("#training-upload").await.send_keys(files.join("bad.jsonl").to_str().unwrap()).await;
    let error =
        until(&c, "document.querySelector('#training-preview .line-error').textContent").await;
    assert!(error.as_str().unwrap().contains("line 2"), "{error}");
    c.find("#training-upload").await.send_keys(files.join("train.jsonl").to_str().unwrap()).await;
    until(&c, "document.querySelector('#training-preview .preview[data-status=processed]')").await;
    let training_file = until(&c, "document.querySelector('#training-file').value").await;
    c.find("#validation-upload").await.send_keys(files.join("valid.jsonl").to_str().unwrap()).await;
    until(&c, "document.querySelector('#validation-preview .preview[data-status=processed]')")
        .await;

    // Write a grader and test it on a pasted completion and a dataset row.
    click(&c, "[data-template=format]").await;
    assert!(until(&c, "document.querySelector('#grader').value")
        .await
        .as_str()
        .unwrap()
        .contains("think_answer_tag"));
    fill(&c, "#grader", &first_token_grader().to_string()).await;
    fill(&c, "#test-completion", TARGET_TOKEN).await;
    fill(&c, "#test-item", &json!({"answer": TARGET_TOKEN}).to_string()).await;
    click(&c, "#test-grader").await;
    assert_eq!(until(&c, "document.querySelector('#test-reward').dataset.reward").await, "1");
    fill(&c, "#test-completion", "t3").await;
    click(&c, "#test-grader").await;
    assert_eq!(
        until(&c, "document.querySelector('#test-reward[data-reward=\"0\"]') && '0'").await,
        "0"
    );

    // Hyperparameters: a preset fills fields; then the tiny job's values.
    click(&c, "[data-preset=dapo]").await;
    assert_eq!(until(&c, "document.querySelector('#hp-loss').value").await, "dapo");
    click(&c, "[data-preset=grpo]").await;
    for (name, value) in [
        ("max_steps", "3"),
        ("batch_size", "2"),
        ("group_size", "4"),
        ("learning_rate", "0.01"),
        ("max_completion_tokens", "4"),
        ("checkpoint_interval", "2"),
        ("eval_interval", "2"),
        ("eval_samples", "2"),
        ("micro_batch_size", "4"),
    ] {
        fill(&c, &format!("#hp-{name}"), value).await;
    }
    // The tools environment and budget caps: the body the form sends carries them (then
    // unticked again: this job trains without tools).
    c.execute("document.querySelector('#environment-panel').open = true; document.querySelector('#budget-panel').open = true", vec![]).await;
    click(&c, "#env-calculator").await;
    fill(&c, "#env-max-turns", "3").await;
    fill(&c, "#budget-max-tokens", "100000").await;
    let body = c.execute("const b = VerityNewJob.jobBody(); return [b.method.reinforcement.environment, b.budget]", vec![]).await;
    assert_eq!(
        body,
        json!([{"tools": [{"type": "calculator"}], "max_turns": 3}, {"max_tokens": 100000}])
    );
    click(&c, "#env-calculator").await;
    fill(&c, "#env-max-turns", "").await;
    shot(&c, "03-new-job").await;
    click(&c, "#create-job").await;
    let job_id =
        until(&c, "location.pathname.startsWith('/jobs/ftjob-') && location.pathname.slice(6)")
            .await
            .as_str()
            .unwrap()
            .to_string();
    assert_eq!(
        until(&c, "document.querySelector('#charts').dataset.points").await,
        "0",
        "no steps before the worker starts"
    );
    let job =
        verity_core::jobs::get_job(&pool, state_org(&pool).await, &job_id).await.unwrap().unwrap();
    assert_eq!(job.training_file.as_deref(), training_file.as_str());

    // Train it in-process; the page's charts gain points over server-sent events, no reload.
    let handler = TrainingHandler::new(
        store.clone(),
        TrainingHandlerConfig {
            cache_dir: root.path().join("cache"),
            device: candle_core::Device::Cpu,
            grader_workers: 2,
        },
    );
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let worker = tokio::spawn(run_worker(
        state.queue.clone(),
        WorkerInfo::new(DeviceKind::Cpu, 1024),
        Arc::new(handler),
        options,
        CancellationToken::new(),
    ));
    c.execute("window.__marker = 'same page'", vec![]).await;
    until(&c, "Number(document.querySelector('#charts').dataset.points) >= 1").await;
    until(&c, "Number(document.querySelector('#charts').dataset.points) >= 3 && document.querySelector('#job-status').textContent === 'succeeded'").await;
    assert_eq!(
        c.execute("return window.__marker", vec![]).await,
        "same page",
        "updated without a reload"
    );
    assert!(
        until(&c, "document.querySelectorAll('#charts .uplot').length").await.as_u64().unwrap()
            >= 8
    );
    assert_eq!(worker.await.unwrap(), 1);
    shot(&c, "04-job").await;
    click(&c, "#theme-toggle").await;
    until(&c, "document.documentElement.dataset.theme === 'dark'").await;
    shot(&c, "05-job-dark").await;
    click(&c, "#theme-toggle").await;

    // Completions of the last step, side by side.
    click(&c, "#open-completions").await;
    until(&c, "document.querySelectorAll('.completion').length === 8").await;
    let body = until(&c, "document.querySelector('#completions').textContent").await;
    assert!(
        body.as_str().unwrap().contains("first_token") && body.as_str().unwrap().contains("step 3")
    );
    shot(&c, "06-completions").await;

    // Checkpoints: download the last one through the page's link, with the browser's session.
    c.goto(&format!("{base}/jobs/{job_id}/checkpoints")).await;
    let href = until(&c, "document.querySelector('a[data-step=\"3\"]').href")
        .await
        .as_str()
        .unwrap()
        .to_string();
    shot(&c, "07-checkpoints").await;
    let session = c.cookie("verity_session").await;
    let download = reqwest::Client::new()
        .get(&href)
        .header("cookie", format!("verity_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(download.status(), 200);
    let archive = download.bytes().await.unwrap();
    let names: Vec<String> = tar::Archive::new(&archive[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".safetensors")), "{names:?}");
    // The GGUF form asks the API with the same session; this tiny model's word-level tokenizer
    // has no llama.cpp counterpart, which the answer says (SmolLM2's export: gguf_export_api.rs).
    let action = until(&c, "document.querySelector('form[data-gguf=\"3\"]').action").await;
    let gguf = reqwest::Client::new()
        .get(format!("{}?quantization=q4_k_m", action.as_str().unwrap()))
        .header("cookie", format!("verity_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(gguf.status(), 422);
    assert!(gguf.text().await.unwrap().contains("byte-level BPE"));

    // "Continue training" from the step-2 checkpoint, then from the job page: the new-job page
    // opens with that model, the job's files and its grader.
    let fine_tuned = verity_core::jobs::get_job(&pool, state_org(&pool).await, &job_id)
        .await
        .unwrap()
        .unwrap()
        .fine_tuned_model
        .unwrap();
    let validation_file = job.validation_file.clone().unwrap();
    for (start, link, model) in [
        (
            format!("/jobs/{job_id}/checkpoints"),
            "a[data-continue=\"2\"]",
            format!("{fine_tuned}:ckpt-step-2"),
        ),
        (format!("/jobs/{job_id}"), "#continue-job", fine_tuned.clone()),
    ] {
        c.goto(&format!("{base}{start}")).await;
        until(&c, &format!("document.querySelector('{link}')")).await;
        click(&c, link).await;
        until(&c, "location.pathname === '/jobs/new' && document.querySelector('#continue-note')")
            .await;
        assert_eq!(until(&c, "document.querySelector('#model').value").await, model.as_str());
        assert_eq!(
            until(&c, "document.querySelector('#training-file').value").await,
            training_file
        );
        assert_eq!(
            until(&c, "document.querySelector('#validation-file').value").await,
            validation_file.as_str()
        );
        let grader = until(&c, "document.querySelector('#grader').value").await;
        let grader: Value = serde_json::from_str(grader.as_str().unwrap()).unwrap();
        assert_eq!(Some(&grader), job.spec.pointer("/method/reinforcement/grader"));
        assert_eq!(grader["name"], "first_token");
    }
    shot(&c, "07b-continue-training").await;

    // The Test-grader panel with a model grader: the job's fine-tuned model judges (asked
    // through the inference worker) and the panel shows its score.
    let judge = json!({"type": "score_model", "name": "judge", "model": fine_tuned, "range": [0, 100],
                       "input": [{"role": "user", "content": "Rate 0-100: {{sample.output_text}}"}],
                       "sampling_params": {"temperature": 0, "seed": 1, "max_completions_tokens": 4}});
    fill(&c, "#grader", &judge.to_string()).await;
    fill(&c, "#test-completion", TARGET_TOKEN).await;
    fill(&c, "#test-item", "{}").await;
    click(&c, "#test-grader").await;
    let reward = until(&c, "document.querySelector('#test-reward').dataset.reward").await;
    let reward: f64 = reward.as_str().unwrap().parse().unwrap();
    let shown = until(&c, "document.querySelector('#test-result').textContent").await;
    let shown = shown.as_str().unwrap();
    assert!((0.0..=1.0).contains(&reward), "{shown}");
    assert!(shown.contains(&format!("judge {fine_tuned} scored")), "{shown}");
    shot(&c, "07c-test-model-grader").await;

    // A second job, cancelled from its page.
    c.goto(&format!("{base}/jobs/new")).await;
    until(&c, "document.querySelector('#training-file')").await;
    c.execute("const s = document.querySelector('#training-file'); s.value = arguments[0]; s.dispatchEvent(new Event('change'));", vec![training_file.clone()]).await;
    fill(&c, "#grader", &first_token_grader().to_string()).await;
    click(&c, "#create-job").await;
    until(&c, &format!("location.pathname.startsWith('/jobs/ftjob-') && location.pathname !== '/jobs/{job_id}'")).await;
    assert_eq!(until(&c, "document.querySelector('#job-status').textContent").await, "queued");
    click(&c, "#cancel-job").await;
    until(&c, "document.querySelector('#confirm-dialog').open").await;
    click(&c, "#confirm-yes").await;
    until(&c, "document.querySelector('#job-status').textContent === 'cancelled'").await;
    c.goto(&format!("{base}/jobs")).await;
    assert_eq!(until(&c, "document.querySelectorAll('table.jobs tbody tr').length").await, 2);
    shot(&c, "08-jobs").await;

    // API keys: create one (shown once), it works; revoke it, the API refuses it at once.
    c.goto(&format!("{base}/keys")).await;
    fill(&c, "#key-name", "from-browser").await;
    click(&c, "#create-key").await;
    let secret = until(&c, "document.querySelector('#new-key').textContent")
        .await
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    let http = reqwest::Client::new();
    let files_url = format!("{base}/v1/files");
    assert_eq!(http.get(&files_url).bearer_auth(&secret).send().await.unwrap().status(), 200);
    // The Tinker SDK's form of the same key, sent as that SDK sends it.
    let tinker = until(&c, "document.querySelector('#new-key-tinker').textContent").await;
    let tinker = tinker.as_str().unwrap().trim().to_string();
    assert_eq!(tinker, format!("tml-{secret}"));
    let config = http.post(format!("{base}/api/v1/client/config")).header("x-api-key", &tinker);
    assert_eq!(config.json(&json!({})).send().await.unwrap().status(), 200);
    click(&c, "#copy-new-key").await;
    until(&c, "document.querySelector('#copy-new-key').dataset.copied === 'true'").await;
    shot(&c, "09-keys").await;
    click(&c, &format!("button[data-prefix=\"{}\"]", &secret[..11])).await;
    until(&c, "document.querySelector('#confirm-dialog').open").await;
    click(&c, "#confirm-yes").await;
    until(&c, "location.pathname === '/keys' && !document.querySelector('#new-key')").await;
    assert_eq!(http.get(&files_url).bearer_auth(&secret).send().await.unwrap().status(), 401);

    c.goto(&format!("{base}/files")).await;
    // The three uploads and the succeeded job's results file (`step_metrics.csv`).
    until(&c, "document.querySelectorAll('tbody tr').length === 4 && document.querySelector('tbody').textContent.includes('step_metrics.csv')").await;
    shot(&c, "10-files").await;

    // Phone width.
    c.set_window_size(375, 812).await;
    c.goto(&format!("{base}/jobs/{job_id}")).await;
    until(&c, "document.querySelectorAll('#charts .uplot').length >= 8").await;
    let overflow = c
        .execute(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
            vec![],
        )
        .await;
    assert!(overflow.as_i64().unwrap() <= 1, "no horizontal scrolling at 375 px: {overflow}");
    shot(&c, "11-job-phone").await;

    click(&c, "#sign-out").await;
    until(&c, "location.pathname === '/login'").await;
    c.close().await;
}

/// The org of the only user.
async fn state_org(pool: &PgPool) -> uuid::Uuid {
    sqlx::query_scalar("SELECT org_id FROM users LIMIT 1").fetch_one(pool).await.unwrap()
}

/// An evaluation report's page in the browser: reached from the navigation, its pass@k chart
/// draws one curve per model (a base and a checkpoint of a job trained in-process), the table
/// has a row per model, and the CSV link downloads the results.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_evaluation_report_draws_its_pass_at_k_chart(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = training_support::prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let router = verity_server::app::app(state.clone());
    let file = api_support::upload(&router, &key, "valid.jsonl", target_token_jsonl(3).as_bytes())
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let run_one = || async {
        let handler =
            training_support::cpu_training_handler(store.clone(), &root.path().join("cache"));
        let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
        let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
        let queue = verity_core::queue::Queue::new(pool.clone(), Default::default());
        run_worker(queue, worker, Arc::new(handler), options, CancellationToken::new()).await
    };
    let hp = json!({"batch_size": 2, "group_size": 2, "max_steps": 1, "max_completion_tokens": 3,
                    "checkpoint_interval": 1, "eval_samples": 2});
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": first_token_grader(), "hyperparameters": hp}});
    let job = api_support::post(&router, "/v1/fine_tuning/jobs", &key,
        json!({"model": training_support::MODEL, "training_file": file, "validation_file": file, "method": method})).await;
    assert_eq!(job.status, 200, "{:?}", job.json());
    let job_id = job.json()["id"].as_str().unwrap().to_string();
    assert_eq!(run_one().await, 1);
    let base = serve(state).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    c.goto(&format!("{base}/jobs/{job_id}")).await;
    until(&c, "location.pathname === '/login'").await;
    fill(&c, "#email", "ada@example.com").await;
    fill(&c, "#password", "password123").await;
    click(&c, "#sign-in").await;
    // The job page names the fine-tuned model, with a button that copies it.
    let tuned = api_support::get(&router, &format!("/v1/fine_tuning/jobs/{job_id}"), &key).await;
    let tuned = tuned.json()["fine_tuned_model"].as_str().unwrap().to_string();
    assert!(tuned.starts_with("ft:"), "{tuned}");
    let shown = until(&c, "!document.querySelector('#fine-tuned-line').hidden && document.querySelector('#fine-tuned-model').textContent").await;
    assert_eq!(shown, tuned.as_str());
    click(&c, "#copy-fine-tuned-model").await;
    until(&c, "document.querySelector('#copy-fine-tuned-model').dataset.copied === 'true'").await;
    // The job page shows the baseline and creates the report of its base vs its checkpoint.
    until(&c, "document.querySelector('#baseline strong')").await;
    click(&c, "#evaluate-job").await;
    until(&c, "location.pathname.startsWith('/evaluations/evaljob-')").await;
    let evaluation = c.current_url().await.rsplit('/').next().unwrap().to_string();
    // The queued report's page follows the run: its results appear without a reload.
    let waiting = until(&c, "document.querySelector('#evaluation-pending').textContent").await;
    assert!(!waiting.as_str().unwrap().contains("Reload"), "{waiting}");
    assert_eq!(run_one().await, 1);
    until(&c, "document.querySelector('#evaluation-status').textContent === 'succeeded'").await;
    until(&c, "document.querySelector('#passk-chart .uplot')").await;
    assert_eq!(
        c.execute("return !document.querySelector('#evaluation-pending')", vec![]).await,
        Value::Bool(true),
        "a finished report says nothing is pending"
    );
    c.goto(&format!("{base}/jobs")).await;
    click(&c, "a[href='/evaluations']").await;
    until(&c, &format!("document.querySelector(\"a[href='/evaluations/{evaluation}']\")")).await;
    click(&c, &format!("a[href='/evaluations/{evaluation}']")).await;
    until(&c, "document.querySelector('#passk-chart .uplot')").await;
    let series = until(&c, "document.querySelector('#passk-chart').dataset.series").await;
    assert_eq!(series, "2", "one curve for the base, one for the checkpoint");
    let rows = c
        .execute("return document.querySelectorAll('#results-table tbody tr').length", vec![])
        .await;
    assert_eq!(rows, 2);
    let legend = c
        .execute("return document.querySelector('#passk-chart .u-legend').textContent", vec![])
        .await;
    assert!(legend.as_str().unwrap().contains(":ckpt-step-1"), "{legend}");
    let csv = c
        .execute("return document.querySelector('#results-csv').getAttribute('href')", vec![])
        .await;
    let csv_url = format!("{base}{}", csv.as_str().unwrap());
    let text = reqwest::Client::new()
        .get(&csv_url)
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.starts_with("model,base,"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
    shot(&c, "12-evaluation").await;
    c.goto(&format!("{base}/jobs/{job_id}")).await;
    until(
        &c,
        &format!(
            "document.querySelector(\"#job-evaluations a[href='/evaluations/{evaluation}']\")"
        ),
    )
    .await;

    // The job's results file is listed under Files but never offered to train on.
    let files = api_support::get(&router, "/v1/files", &key).await.json();
    assert!(files.to_string().contains("step_metrics.csv"), "{files}");
    c.goto(&format!("{base}/jobs/new")).await;
    let offered = until(&c, "document.querySelector('#training-file') && Array.from(document.querySelectorAll('#training-file option, #validation-file option')).map(function (o) { return o.textContent; }).join('|')").await;
    assert!(offered.as_str().unwrap().contains("valid.jsonl"), "{offered}");
    assert!(!offered.as_str().unwrap().contains("step_metrics.csv"), "{offered}");

    // A checkpoint's size is what Download .tar fetches: the weights, not the optimizer state.
    c.goto(&format!("{base}/jobs/{job_id}/checkpoints")).await;
    let sizes = until(&c, "(function () { var td = document.querySelector('td[data-weights-bytes]'); return td && [Number(td.dataset.weightsBytes), Number(td.dataset.totalBytes)]; })()").await;
    let (weights, total) = (sizes[0].as_f64().unwrap(), sizes[1].as_f64().unwrap());
    assert!(weights > 0.0 && weights < total, "the optimizer state is left out: {sizes}");

    // Every table page keeps its row actions whole and in view, on a laptop and on a phone.
    let pages = [
        format!("/jobs/{job_id}/checkpoints"),
        "/models".to_string(),
        "/files".to_string(),
        "/keys".to_string(),
        format!("/evaluations/{evaluation}"),
    ];
    for (width, height) in [(1280, 900), (390, 844)] {
        c.set_window_size(width, height).await;
        for page in &pages {
            c.goto(&format!("{base}{page}")).await;
            until(
                &c,
                "document.readyState === 'complete' && document.querySelector('td.row-actions')",
            )
            .await;
            let report = c.execute(ACTIONS_IN_VIEW, vec![]).await;
            let report: Value = serde_json::from_str(report.as_str().unwrap()).unwrap();
            assert_eq!(report["bad"], json!([]), "{page} at {width} px: {report}");
            assert!(report["actions"].as_u64().unwrap() > 0, "{page}: {report}");
            assert!(
                report["page"].as_f64().unwrap() <= report["viewport"].as_f64().unwrap() + 1.0,
                "{page} at {width} px is wider than the window: {report}"
            );
        }
    }
    c.close().await;
}

/// Every control and badge in a row-actions cell lies whole inside its table's frame and the
/// window, its text not cut; with the count of such cells and the page's width.
const ACTIONS_IN_VIEW: &str = "var bad = []; \
    document.querySelectorAll('.table-wrap').forEach(function (wrap) { \
      var frame = wrap.getBoundingClientRect(); \
      wrap.querySelectorAll('td.row-actions a, td.row-actions button, td.row-actions select, td.row-actions .badge').forEach(function (el) { \
        var r = el.getBoundingClientRect(); \
        if (r.width === 0) return; \
        var name = el.textContent.trim() || el.tagName; \
        if (r.left < frame.left - 1 || r.right > frame.right + 1 || r.right > window.innerWidth + 1) \
          bad.push(name + ' at ' + Math.round(r.left) + '..' + Math.round(r.right) + ' outside ' + Math.round(frame.left) + '..' + Math.round(frame.right)); \
        if (el.scrollWidth > el.clientWidth + 1) bad.push(name + ' cut'); \
      }); \
    }); \
    return JSON.stringify({bad: bad, actions: document.querySelectorAll('td.row-actions').length, \
      page: document.documentElement.scrollWidth, viewport: window.innerWidth});";
