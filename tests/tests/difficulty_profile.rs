//! Difficulty profiles end to end through the API, the real queue, a local store and a CPU
//! worker on a tiny random model: the per-row pass rates, histogram and predicted
//! zero-advantage fraction match an independent computation from the stored samples, a
//! training step is measured and the estimate multiplies it out, the filtered file drops
//! exactly the rows always or never solved (kept rows unchanged and in order) and trains a job,
//! and bad requests are refused naming the field.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{get, post, upload, user};
use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{cpu_training_handler, prepare_store, profile_rows_jsonl, MODEL};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};

/// Five prompts: row 1 is always solved (its `pad` contains the answer), row 3 never (no
/// completion of the tiny vocabulary holds the answer), the others by chance.
fn rows_jsonl() -> String {
    profile_rows_jsonl(&[
        ("t1", ""),
        ("ALWAYS", "ALWAYS"),
        ("t2", ""),
        ("NEVER-SOLVED", ""),
        ("t3", ""),
    ])
}

fn grader() -> Value {
    json!({"type": "string_check", "name": "contains", "input": "{{item.pad}}{{sample.output_text}}",
           "reference": "{{item.answer}}", "operation": "like"})
}

fn job(file: &str) -> Value {
    let hp = json!({"batch_size": 2, "group_size": 4, "max_steps": 3, "max_completion_tokens": 4,
                    "learning_rate": 0.05, "micro_batch_size": 8});
    json!({"model": MODEL, "training_file": file, "seed": 3,
           "method": {"type": "reinforcement", "reinforcement": {"grader": grader(), "hyperparameters": hp}}})
}

async fn run_one(
    queue: &Queue,
    store: Arc<dyn verity_core::storage::ObjectStore>,
    root: &std::path::Path,
) {
    let handler = cpu_training_handler(store, &root.join("cache"));
    let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
    let info = WorkerInfo::new(DeviceKind::Cpu, 1024);
    let done =
        run_worker(queue.clone(), info, Arc::new(handler), options, CancellationToken::new()).await;
    assert_eq!(done, 1);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_profile_predicts_zero_advantage_estimates_cost_and_filters_the_file(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state);
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let text = rows_jsonl();
    let reply = upload(&router, &key, "math.jsonl", text.as_bytes()).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let file = reply.json()["id"].as_str().unwrap().to_string();
    let queue = Queue::new(pool.clone(), QueueSettings::default());

    let body = json!({"job": job(&file), "k": 6, "prompts": 5, "seed": 7});
    let created = post(&router, "/v1/verity/difficulty_profiles", &key, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let created = created.json();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("dpjob-"), "{created}");
    assert_eq!(created["object"], "verity.difficulty_profile");
    assert_eq!((created["status"].as_str(), created["k"].as_u64()), (Some("queued"), Some(6)));
    assert_eq!(created["hyperparameters"]["group_size"], 4);
    let early = post(
        &router,
        &format!("/v1/verity/difficulty_profiles/{id}/filtered_file"),
        &key,
        json!({}),
    )
    .await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{:?}", early.json());
    let jobs = get(&router, "/v1/fine_tuning/jobs", &key).await.json();
    assert!(jobs["data"].as_array().unwrap().is_empty(), "a profile is no fine-tuning job: {jobs}");

    run_one(&queue, store.clone(), root.path()).await;
    let profile = get(&router, &format!("/v1/verity/difficulty_profiles/{id}"), &key).await.json();
    assert_eq!(profile["status"], "succeeded", "{profile}");
    let report = &profile["report"];
    assert_eq!(report["prompts"], 5);
    assert_eq!(
        (report["samples_per_prompt"].as_u64(), report["group_size"].as_u64()),
        (Some(6), Some(4))
    );
    assert_eq!(report["file_rows"], 5);

    // Independently from the stored samples: passes per row, histogram, p^G + (1 − p)^G.
    let samples: Vec<(i32, Option<f64>)> =
        sqlx::query_as("SELECT prompt_idx, score FROM samples WHERE job_id = $1 ORDER BY idx")
            .bind(&id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(samples.len(), 30, "5 prompts × k = 6");
    let mut passing: BTreeMap<usize, usize> = BTreeMap::new();
    for (row, score) in &samples {
        *passing.entry(*row as usize).or_default() += usize::from(score.unwrap_or(0.0) >= 1.0);
    }
    assert_eq!(passing[&1], 6, "row 1 is always solved");
    assert_eq!(passing[&3], 0, "row 3 is never solved");
    let rows = report["rows"].as_array().unwrap();
    for (row, profiled) in rows.iter().enumerate() {
        assert_eq!(profiled["row"], row);
        assert_eq!(profiled["line"], row + 1);
        assert_eq!(profiled["passing"].as_u64().unwrap() as usize, passing[&row], "{profiled}");
    }
    let histogram = report["histogram"].as_array().unwrap();
    assert_eq!(histogram.len(), 7, "one bin per passing count 0..=6");
    for bin in histogram {
        let count = passing.values().filter(|&&p| p as u64 == bin["passing"]).count();
        assert_eq!(bin["prompts"].as_u64().unwrap() as usize, count, "{bin}");
    }
    let predicted: f64 = passing
        .values()
        .map(|&c| {
            let p = c as f64 / 6.0;
            p.powi(4) + (1.0 - p).powi(4)
        })
        .sum::<f64>()
        / 5.0;
    let reported = report["predicted_zero_advantage_fraction"].as_f64().unwrap();
    assert!((reported - predicted).abs() < 1e-9, "{reported} vs {predicted}");
    assert_eq!(report["binary_rewards"], true);
    let always = passing.values().filter(|&&c| c == 6).count();
    let never = passing.values().filter(|&&c| c == 0).count();
    assert_eq!(
        (report["always_solved"].as_u64(), report["never_solved"].as_u64()),
        (Some(always as u64), Some(never as u64))
    );

    // The measured step and the estimate built on it.
    let step = &report["measured_step"];
    assert!(step["trained_tokens"].as_u64().unwrap() > 0, "{step}");
    assert!(step["training_seconds"].as_f64().unwrap() > 0.0, "{step}");
    let estimate = &report["estimate"];
    assert_eq!(estimate["steps"], 3, "max_steps");
    assert_eq!(estimate["groups_per_step"], 2.0);
    let per_step = estimate["seconds_per_step"].as_f64().unwrap();
    assert!(estimate["training_seconds_per_step"].as_f64().unwrap() > 0.0, "{estimate}");
    assert!((estimate["total_seconds"].as_f64().unwrap() - 3.0 * per_step).abs() < 1e-9);
    let throughput = &report["throughput"];
    assert_eq!(throughput["completions"], 30);
    let mean_len = throughput["completion_tokens"].as_f64().unwrap() / 30.0;
    let tokens = estimate["completion_tokens_per_step"].as_f64().unwrap();
    assert!((tokens - 2.0 * 4.0 * mean_len).abs() < 1e-9, "B × G × mean length");

    // The filtered file: rows always or never solved dropped, the rest byte for byte in order.
    let url = format!("/v1/verity/difficulty_profiles/{id}/filtered_file");
    let filtered = post(&router, &url, &key, json!({})).await;
    assert_eq!(filtered.status, StatusCode::OK, "{:?}", filtered.json());
    let filtered = filtered.json();
    assert_eq!(filtered["source_file"], file.as_str());
    assert_eq!(filtered["profile"], id.as_str());
    assert_eq!(filtered["file"]["filename"], "math.filtered.jsonl");
    assert_eq!(filtered["file"]["status"], "processed");
    let dropped: Vec<usize> =
        passing.iter().filter(|(_, c)| **c == 0 || **c == 6).map(|(row, _)| *row).collect();
    assert_eq!(filtered["dropped_rows"], json!(dropped));
    let new_id = filtered["file"]["id"].as_str().unwrap().to_string();
    let content = get(&router, &format!("/v1/files/{new_id}/content"), &key).await;
    let expected: String = text
        .lines()
        .enumerate()
        .filter(|(row, _)| !dropped.contains(row))
        .map(|(_, line)| format!("{line}\n"))
        .collect();
    assert_eq!(String::from_utf8(content.bytes.to_vec()).unwrap(), expected);
    assert_eq!(filtered["kept_rows"].as_u64().unwrap() as usize, 5 - dropped.len());
    let again = post(&router, &url, &key, json!({})).await.json();
    assert_eq!(again["file"]["id"], new_id.as_str(), "asking twice returns the same file");
    let only_never = post(&router, &url, &key, json!({"drop_always_solved": false})).await.json();
    let never_rows: Vec<usize> =
        passing.iter().filter(|(_, c)| **c == 0).map(|(row, _)| *row).collect();
    assert_eq!(only_never["dropped_rows"], json!(never_rows));
    let neither =
        post(&router, &url, &key, json!({"drop_always_solved": false, "drop_never_solved": false}))
            .await;
    assert_eq!(neither.status, StatusCode::BAD_REQUEST);
    // The filtered file trains a job.
    let trained = post(&router, "/v1/fine_tuning/jobs", &key, job(&new_id)).await;
    assert_eq!(trained.status, StatusCode::OK, "{:?}", trained.json());
    let listed = get(&router, "/v1/verity/difficulty_profiles", &key).await.json();
    assert_eq!(listed["data"][0]["id"], id.as_str());
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn bad_profiles_are_refused_naming_the_field(pool: PgPool) {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state);
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let file = upload(&router, &key, "math.jsonl", rows_jsonl().as_bytes()).await.json();
    let file = file["id"].as_str().unwrap().to_string();
    let url = "/v1/verity/difficulty_profiles";
    let supervised =
        json!({"model": MODEL, "training_file": file, "method": {"type": "supervised"}});
    let mut no_model = job(&file);
    no_model["model"] = json!("no-such-model");
    let cases = [
        (json!({}), "job"),
        (json!({"job": job(&file), "prompts": 0}), "prompts"),
        (json!({"job": job(&file), "k": 0}), "k"),
        (json!({"job": supervised}), "job.method.type"),
        (json!({"job": no_model}), "job.model"),
        (json!({"job": job("file-missing")}), "job.training_file"),
    ];
    for (body, param) in cases {
        let reply = post(&router, url, &key, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {:?}", reply.json());
        assert_eq!(reply.json()["error"]["param"], param, "{body}: {:?}", reply.json());
    }
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 0, "nothing was queued");
}
