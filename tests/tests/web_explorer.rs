//! The completions explorer in a real headless Chromium, on jobs trained in-process on tiny
//! random models: one dataset row followed across steps always shows the same prompt (rows are
//! the dataset's, not positions in a step's batch), text search finds a row, each prompt is
//! shown once per group, ChatML prompts (a tiny model whose chat template is ChatML) render as
//! role turns with no raw `<|im_start|>`, pages of groups keep the filters and every completion
//! shows its dataset row, the validation completions the evaluation during training kept are
//! shown apart ("validation, step 6"), and an evaluation report of the job shows validation
//! completions of the base and the checkpoint side by side per row.

use verity_tests::api_support;
use verity_tests::training_support;
use verity_tests::webdriver;

use serde_json::{json, Value};
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use verity_core::queue::{run_worker, DeviceKind, RunnerOptions, WorkerInfo};
use verity_core::storage::publish_folder;
use verity_worker::trainer::testing::{
    first_token_grader, target_token_jsonl, write_tiny_model_dir,
};
use webdriver::{click, serve, sign_in, until, Driver};

/// A ChatML chat template (as Qwen and SmolLM2 use).
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Publishes a tiny model whose tokenizer renders prompts with [`CHATML`] as `tiny-chatml`.
async fn publish_chatml_model(
    pool: &PgPool,
    store: &dyn verity_core::storage::ObjectStore,
    root: &std::path::Path,
) {
    let dir = root.join("tiny-chatml");
    write_tiny_model_dir(&dir, verity_worker::Family::Llama, 3).unwrap();
    let path = dir.join("tokenizer_config.json");
    let mut config: Value = if path.is_file() {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    } else {
        json!({})
    };
    config["chat_template"] = json!(CHATML);
    std::fs::write(&path, config.to_string()).unwrap();
    publish_folder(store, &dir, "models/tiny-chatml").await.unwrap();
    sqlx::query("INSERT INTO models (id, kind, storage_prefix, format) VALUES ('tiny-chatml', 'base', 'models/tiny-chatml', 'hf')")
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_explorer_follows_dataset_rows_and_renders_chat_roles(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = training_support::prepare_store(&pool, root.path()).await;
    publish_chatml_model(&pool, store.as_ref(), root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let router = verity_server::app::app(state.clone());
    let upload = |name: &'static str, rows: usize| {
        let router = router.clone();
        let key = key.clone();
        async move {
            let reply =
                api_support::upload(&router, &key, name, target_token_jsonl(rows).as_bytes()).await;
            reply.json()["id"].as_str().unwrap().to_string()
        }
    };
    // A batch of 2 of 4 rows for 6 steps: each row recurs (once per epoch, in a seeded order),
    // at batch positions that differ from its row number.
    let train = upload("train.jsonl", 4).await;
    let valid = upload("valid.jsonl", 2).await;
    let run_one = || async {
        let handler =
            training_support::cpu_training_handler(store.clone(), &root.path().join("cache"));
        let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
        let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
        let queue = verity_core::queue::Queue::new(pool.clone(), Default::default());
        run_worker(queue, worker, Arc::new(handler), options, CancellationToken::new()).await
    };
    let hp = json!({"batch_size": 2, "group_size": 2, "max_steps": 6, "max_completion_tokens": 3,
                    "checkpoint_interval": 6, "eval_samples": 2, "eval_on_start": false});
    let method = json!({"type": "reinforcement", "reinforcement": {"grader": first_token_grader(), "hyperparameters": hp}});
    let job = api_support::post(&router, "/v1/fine_tuning/jobs", &key,
        json!({"model": "tiny-chatml", "training_file": train, "validation_file": valid, "method": method})).await;
    assert_eq!(job.status, 200, "{:?}", job.json());
    let job_id = job.json()["id"].as_str().unwrap().to_string();
    assert_eq!(run_one().await, 1);

    let base = serve(state).await;
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, &format!("/jobs/{job_id}/completions")).await;
    until(&c, "document.querySelector('#completions')").await;

    // Every dataset row across all steps: one prompt per row, whatever the step.
    let groups_of = "Array.from(document.querySelectorAll('.prompt-group')).map(g => [g.dataset.row, g.dataset.step, g.querySelector('.prompt').textContent.replace(/\\s+/g, ' ').trim()])";
    let rows = c
        .execute(
            "return Array.from(document.querySelectorAll('.prompt-group')).map(g => g.dataset.row)",
            vec![],
        )
        .await;
    assert!(
        rows.as_array().unwrap().iter().all(|r| r.as_str().is_some_and(|r| !r.is_empty())),
        "every sample records its row: {rows}"
    );
    // Rows are numbered from 1, like the file's lines (row 1 is the first line: t3 t10).
    for row in 1..=4 {
        c.goto(&format!("{base}/jobs/{job_id}/completions?step=&row={row}")).await;
        let groups =
            until(&c, &format!("document.querySelector('.prompt-group') && {groups_of}")).await;
        let groups = groups.as_array().unwrap();
        let prompts: std::collections::BTreeSet<&str> =
            groups.iter().map(|g| g[2].as_str().unwrap()).collect();
        let steps: std::collections::BTreeSet<&str> =
            groups.iter().map(|g| g[1].as_str().unwrap()).collect();
        let want = row.to_string();
        assert!(groups.iter().all(|g| g[0].as_str() == Some(want.as_str())), "{groups:?}");
        assert_eq!(prompts.len(), 1, "row {row} shows one prompt across steps: {groups:?}");
        let expected = format!("t{} t{}", 2 + row, 8 + 2 * row);
        assert!(prompts.iter().next().unwrap().contains(&expected), "row {row}: {prompts:?}");
        assert!(steps.len() >= 2, "6 steps of 2 over 4 rows: row {row} recurs: {groups:?}");
        // The prompt once per group, its completions under it.
        let per_group = c.execute("return Array.from(document.querySelectorAll('.prompt-group')).every(g => g.querySelectorAll('.prompt').length === 1 && g.querySelectorAll('.completion').length === 2)", vec![]).await;
        assert_eq!(per_group, true);
    }

    // ChatML renders as role turns; no raw special tokens anywhere on the page.
    let roles = c.execute("return Array.from(document.querySelectorAll('.prompt .turn .role')).map(r => r.textContent)", vec![]).await;
    assert!(
        roles.as_array().unwrap().iter().all(|r| r == "user")
            && !roles.as_array().unwrap().is_empty(),
        "{roles}"
    );
    let body = c.execute("return document.body.innerText", vec![]).await;
    assert!(
        !body.as_str().unwrap().contains("<|im_start|>")
            && !body.as_str().unwrap().contains("<|im_end|>"),
        "{body}"
    );

    // Row 0 does not exist (400 naming `row`); completions of a step count from #1 too.
    c.goto(&format!("{base}/jobs/{job_id}/completions?step=6")).await;
    let numbers = until(&c, "document.querySelector('.completion') && Array.from(document.querySelectorAll('.completion header .mono:not(.c-row)')).map(n => n.textContent).sort()").await;
    assert_eq!(numbers, json!(["#1", "#2", "#3", "#4"]), "2 prompts × 2 completions");
    c.goto(&format!("{base}/jobs/{job_id}/completions?step=&row=0")).await;
    let refused = until(&c, "document.body.innerText").await;
    assert!(refused.as_str().unwrap().contains("numbered from 1"), "{refused}");

    // Text search across steps finds only the row that contains it.
    c.goto(&format!("{base}/jobs/{job_id}/completions?step=&q=T12")).await;
    let found = until(&c, "document.querySelector('.prompt-group') && Array.from(document.querySelectorAll('.prompt-group')).map(g => [g.dataset.row, g.textContent.toLowerCase().includes('t12')])").await;
    let found = found.as_array().unwrap();
    assert!(found.iter().all(|g| g[1] == true), "every match contains the text: {found:?}");
    assert!(found.iter().any(|g| g[0] == "2"), "row 2's prompt is t4 t12: {found:?}");

    // Paged on the server: 12 groups (6 steps × 2) at 5 a page; next and previous keep filters.
    c.goto(&format!("{base}/jobs/{job_id}/completions?step=&max_score=1&per_page=5")).await;
    let keys = "Array.from(document.querySelectorAll('.prompt-group')).map(g => g.dataset.step + '/' + g.dataset.row)";
    let first = until(&c, &format!("document.querySelector('#page-number') && {keys}")).await;
    assert_eq!(first.as_array().unwrap().len(), 5, "{first}");
    assert_eq!(
        until(&c, "document.querySelector('#page-number').textContent").await,
        "page 1 of 3"
    );
    assert_eq!(c.execute("return !document.querySelector('#page-prev')", vec![]).await, true);
    // Every completion shows its dataset row.
    let rows_shown = "Array.from(document.querySelectorAll('.prompt-group')).every(g => Array.from(g.querySelectorAll('.completion .c-row')).every(r => r.textContent === 'row ' + g.dataset.row))";
    assert_eq!(c.execute(&format!("return {rows_shown}"), vec![]).await, true);
    click(&c, "#page-next").await;
    until(&c, "document.querySelector('#page-number').textContent === 'page 2 of 3'").await;
    let url = c.current_url().await;
    for kept in ["step=&", "max_score=1", "per_page=5", "page=2"] {
        assert!(url.contains(kept), "{kept} kept in {url}");
    }
    let second = c.execute(&format!("return {keys}"), vec![]).await;
    assert_eq!(second.as_array().unwrap().len(), 5);
    assert_ne!(first, second, "another page of groups");
    click(&c, "#page-next").await;
    until(&c, "document.querySelector('#page-number').textContent === 'page 3 of 3'").await;
    assert_eq!(c.execute(&format!("return {keys}.length"), vec![]).await, 2);
    assert_eq!(c.execute("return !document.querySelector('#page-next')", vec![]).await, true);
    click(&c, "#page-prev").await;
    // (the next click waits for that page: clicking during the navigation finds a stale link)
    until(&c, "document.querySelector('#page-number').textContent === 'page 2 of 3'").await;
    click(&c, "#page-prev").await;
    until(&c, "document.querySelector('#page-number').textContent === 'page 1 of 3'").await;
    assert_eq!(c.execute(&format!("return {keys}"), vec![]).await, first);

    // The evaluation after the last step kept its validation completions: 2 rows × 2 samples,
    // tagged "validation, step 6", apart from the training samples.
    c.goto(&format!("{base}/jobs/{job_id}/completions?source=validation")).await;
    let validation = until(&c, "document.querySelector('.prompt-group') && Array.from(document.querySelectorAll('.prompt-group')).map(g => [g.dataset.row, g.dataset.step, g.querySelector('header').textContent.trim(), g.querySelectorAll('.completion').length])").await;
    let validation = validation.as_array().unwrap();
    let rows: Vec<&str> = validation.iter().map(|g| g[0].as_str().unwrap()).collect();
    assert_eq!(rows, ["1", "2"], "{validation:?}");
    for group in validation {
        assert_eq!(group[1], "6", "{group:?}");
        assert!(group[2].as_str().unwrap().starts_with("validation, step 6"), "{group:?}");
        assert_eq!(group[3], 2, "{group:?}");
    }
    c.goto(&format!("{base}/jobs/{job_id}/completions?step=6")).await;
    let training = until(&c, "document.querySelector('.prompt-group') && Array.from(document.querySelectorAll('.prompt-group > header')).map(h => h.textContent.trim())").await;
    assert!(
        training.as_array().unwrap().iter().all(|t| t.as_str().unwrap().starts_with("step 6")),
        "training samples only: {training}"
    );

    // An evaluation report of the job: validation rows with the base and the checkpoint side by side.
    c.goto(&format!("{base}/jobs/{job_id}")).await;
    click(&c, "#evaluate-job").await;
    until(&c, "location.pathname.startsWith('/evaluations/evaljob-')").await;
    let evaluation = c.current_url().await.rsplit('/').next().unwrap().to_string();
    assert_eq!(run_one().await, 1);
    c.goto(&format!("{base}/jobs/{job_id}/completions?source={evaluation}")).await;
    let columns = until(&c, "document.querySelector('.prompt-group') && Array.from(document.querySelectorAll('.prompt-group')).map(g => [g.dataset.row, Array.from(g.querySelectorAll('.column h3')).map(h => h.textContent)])").await;
    let columns = columns.as_array().unwrap();
    assert_eq!(columns.len(), 2, "one group per validation row: {columns:?}");
    for group in columns {
        let labels = group[1].as_array().unwrap();
        assert_eq!(labels.len(), 2, "base and checkpoint: {group:?}");
        assert_eq!(labels[0], "tiny-chatml", "{group:?}");
        assert!(labels[1].as_str().unwrap().contains(":ckpt-step-6"), "{group:?}");
    }
    let body = c.execute("return document.body.innerText", vec![]).await;
    assert!(!body.as_str().unwrap().contains("<|im_start|>"), "{body}");
}
