//! The new-job page's difficulty profile in a real headless Chromium: "Profile difficulty"
//! queues a profile of the job the form describes, follows it while an in-process CPU worker
//! runs it on a tiny random model, then shows the pass-rate histogram and the predicted
//! zero-advantage fraction exactly as the API reports them, and the estimate; "Drop …" writes
//! the filtered file and makes it the job's training file.

use verity_tests::api_support;
use verity_tests::training_support;
use verity_tests::webdriver;

use serde_json::json;
use sqlx::PgPool;
use training_support::{prepare_store, profile_rows_jsonl, run_one_job, MODEL};
use verity_core::queue::{Queue, QueueSettings};
use webdriver::{click, fill, serve, shot, sign_in, until, Driver};

/// Four prompts: row 1 always solved (its `pad` holds the answer), row 2 never.
fn rows_jsonl() -> String {
    profile_rows_jsonl(&[("t1", ""), ("ALWAYS", "ALWAYS"), ("NEVER-SOLVED", ""), ("t2", "")])
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_profile_shows_the_histogram_and_predicted_fraction_in_a_real_browser(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state.clone());
    let key = api_support::user(&pool, "ada@example.com", "acme", "admin").await;
    let base = serve(state).await;
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let reply = api_support::upload(&router, &key, "math.jsonl", rows_jsonl().as_bytes()).await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    let file = reply.json()["id"].as_str().unwrap().to_string();

    let driver = Driver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &base, "/jobs/new").await;
    until(&c, "document.querySelector('#run-profile')").await;
    let pick = format!(
        "document.querySelector('#model').value = '{MODEL}';
         const f = document.querySelector('#training-file'); f.value = '{file}';
         f.dispatchEvent(new Event('change', {{bubbles: true}}));"
    );
    c.execute(&pick, vec![]).await;
    let grader = json!({"type": "string_check", "name": "contains", "operation": "like",
        "input": "{{item.pad}}{{sample.output_text}}", "reference": "{{item.answer}}"});
    fill(&c, "#grader", &grader.to_string()).await;
    for (field, value) in [
        ("batch_size", "2"),
        ("group_size", "4"),
        ("max_steps", "2"),
        ("max_completion_tokens", "4"),
    ] {
        fill(&c, &format!("#hp-{field}"), value).await;
    }
    fill(&c, "#profile-k", "6").await;
    click(&c, "#run-profile").await;
    let id = until(&c, "document.querySelector('#profile-result').dataset.profile").await;
    let id = id.as_str().unwrap().to_string();
    assert!(id.starts_with("dpjob-"), "{id}");

    // The page follows the profile (no reload by the test) and shows its report at the end.
    run_one_job(&queue, store.clone(), &root.path().join("cache")).await;
    let shown = until(&c, "document.querySelector('#profile-zero-advantage') && document.querySelector('#profile-zero-advantage').dataset.fraction").await;
    shot(&c, "difficulty-profile-report").await;
    let profile = api_support::get(&router, &format!("/v1/verity/difficulty_profiles/{id}"), &key)
        .await
        .json();
    assert_eq!(profile["status"], "succeeded", "{profile}");
    let report = &profile["report"];
    let fraction = report["predicted_zero_advantage_fraction"].as_f64().unwrap();
    assert_eq!(shown.as_str().unwrap().parse::<f64>().unwrap(), fraction);
    let sentence = until(&c, "document.querySelector('#profile-zero-advantage').textContent").await;
    let percent = format!("{:.1}%", 100.0 * fraction);
    assert!(sentence.as_str().unwrap().contains(&percent), "{sentence} shows {percent}");
    assert!(sentence.as_str().unwrap().contains("group size 4"), "{sentence}");
    let bars = c
        .execute(
            "return [...document.querySelectorAll('#profile-histogram .bucket-count')].map(b => [Number(b.dataset.passing), Number(b.textContent)]);",
            vec![],
        )
        .await;
    let expected: Vec<(u64, u64)> = report["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["passing"].as_u64().unwrap(), b["prompts"].as_u64().unwrap()))
        .collect();
    let bars: Vec<(u64, u64)> = serde_json::from_value(bars).unwrap();
    assert_eq!(bars, expected, "one bar per passing count, as the API reports");
    assert_eq!(bars.len(), 7);
    assert_eq!(bars[6].1 as usize, report["always_solved"].as_u64().unwrap() as usize);
    let estimate =
        until(&c, "document.querySelector('#profile-estimate').dataset.totalSeconds").await;
    let total = report["estimate"]["total_seconds"].as_f64().unwrap();
    assert_eq!(estimate.as_str().unwrap().parse::<f64>().unwrap(), total);

    // Filtering writes the new file and makes it the training file.
    click(&c, "#profile-filter").await;
    let new_file = until(&c, "document.querySelector('#profile-filtered-file') && document.querySelector('#profile-filtered-file').dataset.file").await;
    let new_file = new_file.as_str().unwrap().to_string();
    assert_eq!(
        until(&c, "document.querySelector('#training-file').value").await,
        new_file.as_str()
    );
    let stored = api_support::get(&router, &format!("/v1/files/{new_file}"), &key).await.json();
    assert_eq!(stored["filename"], "math.filtered.jsonl", "{stored}");
    let dropped =
        report["always_solved"].as_u64().unwrap() + report["never_solved"].as_u64().unwrap();
    assert_eq!(stored["records"].as_u64().unwrap(), 4 - dropped);
    shot(&c, "difficulty-profile-filtered").await;
    c.close().await;
}
