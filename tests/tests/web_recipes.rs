//! Recipes in a real headless Chromium: the nav's Recipes page; "New recipe" loads a template
//! and refuses it with the API's error naming the stage and field (nothing written); a recipe
//! written on the page starts and its page follows it live — each stage's status, link and key
//! figure, the evaluation's pass@k table matching the API — while an in-process CPU worker runs
//! its stages on a tiny random model; no horizontal scrolling at 390 px.

use verity_tests::api_support;
use verity_tests::training_support;
use verity_tests::webdriver;

use serde_json::{json, Value};
use sqlx::PgPool;
use training_support::{contains_grader, prepare_store, prompts_jsonl, run_one_job, MODEL};
use verity_core::queue::{Queue, QueueSettings};
use verity_server::api::recipes::advance::advance_all;
use webdriver::{click, serve, shot, sign_in, until, Browser, Driver};

/// Reads a page value as a string once it is truthy.
async fn text(c: &Browser, expression: &str) -> String {
    let value = until(c, expression).await;
    value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}")).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_recipe_starts_from_the_dashboard_and_its_page_follows_it(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state.clone());
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(state.clone()).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let cache = root.path().join("cache");
    let chats: String = ["t1", "t2"]
        .iter()
        .map(|a| {
            let messages =
                json!([{"role": "user", "content": "t5 t20"}, {"role": "assistant", "content": a}]);
            json!({ "messages": messages }).to_string() + "\n"
        })
        .collect();
    let mut files = Vec::new();
    for (name, content) in [("prompts.jsonl", prompts_jsonl()), ("chats.jsonl", chats)] {
        let reply = api_support::upload(&router, &key, name, content.as_bytes()).await;
        assert_eq!(reply.status, 200, "{:?}", reply.json());
        files.push(reply.json()["id"].as_str().unwrap().to_string());
    }
    let (prompts, chats) = (files[0].clone(), files[1].clone());

    // The nav's Recipes page is empty; New recipe starts from the R1 template.
    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/jobs").await;
    click(&c, "a[href='/recipes']").await;
    until(&c, "location.pathname === '/recipes' && document.querySelector('#new-recipe')").await;
    assert!(until(&c, "document.body.textContent.includes('No recipes yet')")
        .await
        .as_bool()
        .unwrap());
    click(&c, "#new-recipe").await;
    let template = text(&c, "document.querySelector('#recipe-body').value").await;
    let template: Value = serde_json::from_str(&template).unwrap();
    assert_eq!(template["name"], "R1 recipe");
    assert_eq!(template["stages"].as_array().unwrap().len(), 5);
    assert!(text(&c, "document.querySelector('#recipe-files').textContent")
        .await
        .contains(&prompts));

    // Sent as it is, the template names a model this server does not have: the API's error
    // names the stage and field; nothing is written.
    click(&c, "#recipe-create").await;
    let error = text(&c, "!document.querySelector('#recipe-error').hidden && document.querySelector('#recipe-error').textContent").await;
    assert!(error.starts_with("stages[0].fine_tuning_job.model: "), "{error}");
    assert_eq!((count(&pool, "recipes").await, count(&pool, "jobs").await), (0, 0));
    shot(&c, "recipes-01-refused").await;

    // A two-stage recipe written on the page starts.
    let recipe = json!({"name": "sft then eval", "seed": 3, "stages": [
        {"name": "sft", "type": "fine_tuning_job", "fine_tuning_job": {"model": MODEL,
            "training_file": chats, "method": {"type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}}}}},
        {"name": "eval", "type": "evaluation", "evaluation": {
            "models": [MODEL, "{{stages.sft.fine_tuned_model}}"], "file": prompts,
            "grader": contains_grader(), "n": 2, "max_tokens": 4}}]});
    c.execute(
        "document.querySelector('#recipe-body').value = arguments[0];",
        vec![json!(recipe.to_string())],
    )
    .await;
    click(&c, "#recipe-create").await;
    let path =
        text(&c, "location.pathname.startsWith('/recipes/recipe-') && location.pathname").await;
    let id = path.trim_start_matches("/recipes/").to_string();
    let stage_status = |name: &str| {
        format!("document.querySelector('#recipe-stages li[data-stage={name}]').dataset.status")
    };
    assert_eq!(text(&c, &stage_status("sft")).await, "queued");
    assert_eq!(text(&c, &stage_status("eval")).await, "pending");
    assert_eq!(text(&c, "document.querySelector('#recipe-status').textContent").await, "running");

    // The page follows the recipe as its stages run (no reload by the test).
    run_one_job(&queue, store.clone(), &cache).await;
    advance_all(&state).await.unwrap();
    until(&c, &format!("{} === 'queued'", stage_status("eval"))).await;
    let sft =
        text(&c, "document.querySelector('#recipe-stages li[data-stage=sft]').textContent").await;
    assert!(sft.contains("succeeded") && sft.contains("loss"), "{sft}");
    assert!(sft.contains("fine_tuned_model"), "its output: {sft}");
    run_one_job(&queue, store.clone(), &cache).await;
    advance_all(&state).await.unwrap();
    until(&c, "document.querySelector('#recipe-status').textContent === 'succeeded'").await;
    shot(&c, "recipes-02-succeeded").await;

    // The evaluation's pass@k table is the API's report.
    let api = api_support::get(&router, &format!("/v1/verity/recipes/{id}"), &key).await.json();
    let report = &api["stages"][1]["summary"];
    let rows = c
        .execute(
            "return [...document.querySelectorAll('#report-eval tbody tr')].map(r => [...r.cells].map(c => c.textContent.trim()));",
            vec![],
        )
        .await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "base and SFT model: {rows:?}");
    for (row, model) in rows.iter().zip(report["models"].as_array().unwrap()) {
        assert_eq!(row[0], model["model"], "{row}");
        let pass1 = format!("{:.3}", model["pass_at_k"]["pass@1"].as_f64().unwrap());
        assert_eq!(row[2], pass1.as_str(), "{row}");
    }
    let link = text(
        &c,
        "document.querySelector('#recipe-stages li[data-stage=sft] a').getAttribute('href')",
    )
    .await;
    assert_eq!(link, format!("/jobs/{}", api["stages"][0]["id"].as_str().unwrap()));

    // The list shows it with its stages.
    c.goto(&format!("{base}/recipes")).await;
    let listed = text(&c, &format!("document.querySelector('#recipes a[href=\"/recipes/{id}\"]').closest('tr').textContent")).await;
    assert!(listed.contains("sft then eval") && listed.contains("succeeded"), "{listed}");

    // Phone width: no horizontal scrolling on the recipe's page, the form and the list.
    c.set_window_size(390, 844).await;
    for page in [format!("/recipes/{id}"), "/recipes/new".into(), "/recipes".into()] {
        c.goto(&format!("{base}{page}")).await;
        until(&c, "document.readyState === 'complete'").await;
        let overflow = c
            .execute("return document.documentElement.scrollWidth - document.documentElement.clientWidth;", vec![])
            .await;
        assert!(overflow.as_i64().unwrap() <= 1, "{page} scrolls sideways at 390 px: {overflow}");
    }
    shot(&c, "recipes-03-phone").await;
    c.close().await;
}
