//! Sampling runs end to end through the API, the real queue, a local store and a CPU worker on
//! a tiny random model: an evaluation of a base and a LoRA checkpoint of a job (JSON and CSV
//! results whose pass@k match an independent computation from the stored per-sample scores),
//! rejection sampling into a supervised file (exactly the passing samples; the best one per
//! prompt), bad requests refused before anything is queued, org isolation, cancel.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{get, post, upload, user};
use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{
    contains_grader, cpu_training_handler, prepare_store, prompts_jsonl, MODEL,
};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::storage::ObjectStore;

struct Setup {
    router: axum::Router,
    pool: PgPool,
    store: Arc<dyn ObjectStore>,
    queue: Queue,
    key: String,
    file: String,
    root: tempfile::TempDir,
}

async fn setup(pool: PgPool) -> Setup {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state);
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let reply = upload(&router, &key, "prompts.jsonl", prompts_jsonl().as_bytes()).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let file = reply.json()["id"].as_str().unwrap().to_string();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    Setup { router, pool, store, queue, key, file, root }
}

impl Setup {
    /// Runs one queued job (training or sampling run) on a CPU worker.
    async fn run_one(&self) {
        let handler = cpu_training_handler(self.store.clone(), &self.root.path().join("cache"));
        let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
        let done = run_worker(
            self.queue.clone(),
            WorkerInfo::new(DeviceKind::Cpu, 1024),
            Arc::new(handler),
            options,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(done, 1);
    }

    /// Trains a one-step LoRA job on the prompts file; the name of its step-1 checkpoint.
    async fn checkpoint(&self) -> String {
        let hp = json!({"batch_size": 2, "group_size": 4, "max_steps": 1, "max_completion_tokens": 4,
                        "checkpoint_interval": 1, "learning_rate": 0.05, "micro_batch_size": 8,
                        "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0}});
        let method = json!({"type": "reinforcement", "reinforcement": {"grader": contains_grader(), "hyperparameters": hp}});
        let job = post(
            &self.router,
            "/v1/fine_tuning/jobs",
            &self.key,
            json!({"model": MODEL, "training_file": self.file, "method": method, "seed": 3}),
        )
        .await;
        assert_eq!(job.status, StatusCode::OK, "{:?}", job.json());
        let id = job.json()["id"].as_str().unwrap().to_string();
        self.run_one().await;
        let job = get(&self.router, &format!("/v1/fine_tuning/jobs/{id}"), &self.key).await.json();
        assert_eq!(job["status"], "succeeded", "{job}");
        let checkpoints =
            get(&self.router, &format!("/v1/fine_tuning/jobs/{id}/checkpoints"), &self.key)
                .await
                .json();
        checkpoints["data"][0]["fine_tuned_model_checkpoint"].as_str().unwrap().to_string()
    }

    async fn jobs_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&self.pool).await.unwrap()
    }
}

/// Unbiased pass@k from first principles: 1 − C(n−c, k) / C(n, k) with exact binomials.
fn independent_pass_at_k(n: u64, c: u64, k: u64) -> f64 {
    fn choose(n: u64, k: u64) -> f64 {
        if k > n {
            return 0.0;
        }
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    }
    1.0 - choose(n - c, k) / choose(n, k)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_evaluation_reports_pass_at_k_of_a_base_and_its_checkpoint(pool: PgPool) {
    let s = setup(pool).await;
    let checkpoint = s.checkpoint().await;
    let body = json!({"models": [MODEL, checkpoint], "file": s.file, "grader": contains_grader(),
                      "n": 6, "max_tokens": 4, "temperature": 1.0, "seed": 11});
    let created = post(&s.router, "/v1/verity/evaluations", &s.key, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let created = created.json();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("evaljob-"), "{created}");
    assert_eq!(created["object"], "verity.evaluation");
    assert_eq!(created["status"], "queued");
    assert_eq!(created["models"][1], json!({"name": checkpoint, "base": MODEL}));
    // An evaluation is not a fine-tuning job.
    let jobs = get(&s.router, "/v1/fine_tuning/jobs", &s.key).await.json();
    assert!(jobs["data"].as_array().unwrap().iter().all(|j| j["id"] != id.as_str()), "{jobs}");
    let as_job = get(&s.router, &format!("/v1/fine_tuning/jobs/{id}"), &s.key).await;
    assert_eq!(as_job.status, StatusCode::NOT_FOUND);

    s.run_one().await;
    let evaluation = get(&s.router, &format!("/v1/verity/evaluations/{id}"), &s.key).await.json();
    assert_eq!(evaluation["status"], "succeeded", "{evaluation}");
    let results =
        get(&s.router, &format!("/v1/verity/evaluations/{id}/results"), &s.key).await.json();
    assert_eq!(results["object"], "verity.evaluation.results");
    assert_eq!(results["ks"], json!([1, 2, 4, 6]), "k = 1, 2, 4, … and n");
    let models = results["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0]["model"], MODEL);
    assert_eq!(models[1]["model"], checkpoint.as_str());

    // Independent computation from the stored per-sample scores (step = model index).
    let rows: Vec<(i32, i32, Option<f64>)> = sqlx::query_as(
        "SELECT step, prompt_idx, score FROM samples WHERE job_id = $1 ORDER BY step, idx",
    )
    .bind(&id)
    .fetch_all(&s.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2 * 4 * 6, "every completion of both models is indexed");
    let mut per_prompt: BTreeMap<(i32, i32), (u64, u64)> = BTreeMap::new();
    let mut sums = [0.0f64; 2];
    for (step, prompt, score) in &rows {
        let score = score.expect("no grading failed");
        sums[*step as usize] += score;
        let entry = per_prompt.entry((*step, *prompt)).or_default();
        entry.0 += 1;
        entry.1 += u64::from(score >= 1.0);
    }
    let mut any_contrast = false;
    for (m, model) in models.iter().enumerate() {
        let mean = sums[m] / 24.0;
        assert!((model["mean_reward"].as_f64().unwrap() - mean).abs() < 1e-9, "{model}");
        for k in [1u64, 2, 4, 6] {
            let prompts: Vec<&(u64, u64)> = per_prompt
                .iter()
                .filter(|((step, _), _)| *step == m as i32)
                .map(|(_, v)| v)
                .collect();
            let expected =
                prompts.iter().map(|&&(n, c)| independent_pass_at_k(n, c, k)).sum::<f64>()
                    / prompts.len() as f64;
            let got = model["pass_at_k"][format!("pass@{k}")].as_f64().unwrap();
            assert!(
                (got - expected).abs() < 1e-9,
                "{} pass@{k}: {got} vs {expected}",
                model["model"]
            );
            any_contrast |= got > 0.0 && got < 1.0;
        }
    }
    assert!(any_contrast, "the grader gives pass@k strictly between 0 and 1: {results}");

    // The CSV has the same numbers, one row per model.
    let csv =
        get(&s.router, &format!("/v1/verity/evaluations/{id}/results?format=csv"), &s.key).await;
    assert_eq!(csv.status, StatusCode::OK);
    assert!(csv.headers["content-type"].to_str().unwrap().starts_with("text/csv"));
    let text = String::from_utf8(csv.bytes.to_vec()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "model,base,prompts,samples_per_prompt,mean_reward,grader_errors,pass@1,pass@2,pass@4,pass@6,narrower_than_base"
    );
    assert_eq!(lines.len(), 3, "{text}");
    for (line, model) in lines[1..].iter().zip(models) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells[0], model["model"].as_str().unwrap());
        for (i, k) in [1, 2, 4, 6].iter().enumerate() {
            let v: f64 = cells[6 + i].parse().unwrap();
            assert_eq!(v, model["pass_at_k"][format!("pass@{k}")].as_f64().unwrap());
        }
        let flagged =
            results["flags"].as_array().unwrap().iter().any(|f| f["model"] == model["model"]);
        assert_eq!(cells[10], flagged.to_string());
    }
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM job_events WHERE job_id = $1 ORDER BY id")
            .bind(&id)
            .fetch_all(&s.pool)
            .await
            .unwrap();
    assert_eq!(kinds.iter().filter(|k| *k == "eval").count(), 2, "{kinds:?}");
    let samples =
        get(&s.router, &format!("/v1/verity/evaluations/{id}/samples?step=1&limit=100"), &s.key)
            .await
            .json();
    let samples = samples["data"].as_array().unwrap();
    assert_eq!(samples.len(), 24, "the checkpoint's completions");
    for sample in samples {
        assert!(sample["sample"]["completion"].is_string(), "{sample}");
        assert_eq!(sample["score"], sample["sample"]["score"], "{sample}");
    }
    let list = get(&s.router, "/v1/verity/evaluations", &s.key).await.json();
    assert_eq!(list["data"][0]["id"], id.as_str());

    // Another org sees none of it.
    let other = user(&s.pool, "eve@example.com", "evil", "admin").await;
    let reply = get(&s.router, &format!("/v1/verity/evaluations/{id}"), &other).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let reply = get(&s.router, &format!("/v1/verity/evaluations/{id}/results"), &other).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let listed = get(&s.router, "/v1/verity/evaluations", &other).await.json();
    assert_eq!(listed["data"], json!([]));
}

/// The kept lines of a rejection-sampling run's output, checked by Verity's own JSONL
/// validation and as supervised chats (prompt messages then one assistant answer).
async fn output_lines(s: &Setup, run: &Value) -> Vec<Value> {
    let file_id = run["output_file"].as_str().expect("an output file");
    let file = get(&s.router, &format!("/v1/files/{file_id}"), &s.key).await.json();
    assert_eq!(file["purpose"], "fine-tune", "{file}");
    assert_eq!(file["status"], "processed", "{file}");
    let content = get(&s.router, &format!("/v1/files/{file_id}/content"), &s.key).await;
    assert_eq!(content.status, StatusCode::OK);
    let mut validator = verity_server::api::files::jsonl::JsonlValidator::default();
    validator.feed(&content.bytes);
    let records = validator.finish().expect("the output passes the JSONL validation");
    let lines: Vec<Value> = String::from_utf8(content.bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records as usize, lines.len());
    assert_eq!(file["bytes"].as_u64().unwrap() as usize, content.bytes.len());
    for line in &lines {
        let messages = line["messages"].as_array().unwrap();
        assert_eq!(line.as_object().unwrap().len(), 1, "only messages: {line}");
        assert_eq!(messages[0]["role"], "user");
        assert_eq!(messages.last().unwrap()["role"], "assistant", "{line}");
        assert_eq!(messages.len(), 2);
    }
    lines
}

/// The stored samples of a run: per prompt index, `(completion, score)` in sample order.
async fn stored_samples(s: &Setup, run: &str) -> BTreeMap<usize, Vec<(String, f64)>> {
    let bytes = s.store.get_bytes(&format!("jobs/{run}/samples/step-0.jsonl")).await.unwrap();
    let mut out: BTreeMap<usize, Vec<(String, f64)>> = BTreeMap::new();
    for line in String::from_utf8(bytes.to_vec()).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        out.entry(v["prompt_idx"].as_u64().unwrap() as usize)
            .or_default()
            .push((v["completion"].as_str().unwrap().to_string(), v["score"].as_f64().unwrap()));
    }
    out
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn rejection_sampling_writes_the_kept_samples_as_a_supervised_file(pool: PgPool) {
    let s = setup(pool).await;
    let prompts: Vec<String> = prompts_jsonl()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["prompt"].as_str().unwrap().to_string())
        .collect();
    for policy in ["all_passing", "best"] {
        let body = json!({"model": MODEL, "file": s.file, "grader": contains_grader(), "k": 6,
                          "policy": policy, "max_tokens": 4, "seed": 5});
        let created = post(&s.router, "/v1/verity/rejection_sampling", &s.key, body).await;
        assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
        let id = created.json()["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("rsjob-"));
        s.run_one().await;
        let run =
            get(&s.router, &format!("/v1/verity/rejection_sampling/{id}"), &s.key).await.json();
        assert_eq!(run["status"], "succeeded", "{run}");
        let samples = stored_samples(&s, &id).await;
        assert_eq!(samples.len(), 4);
        let lines = output_lines(&s, &run).await;
        let kept: Vec<(String, String)> = lines
            .iter()
            .map(|l| {
                let m = l["messages"].as_array().unwrap();
                (m[0]["content"].as_str().unwrap().into(), m[1]["content"].as_str().unwrap().into())
            })
            .collect();
        let mut expected = Vec::new();
        for (prompt, completions) in &samples {
            let passing: Vec<&(String, f64)> =
                completions.iter().filter(|(_, score)| *score >= 1.0).collect();
            let summary = &run["summary"]["per_prompt"][*prompt];
            assert_eq!(summary["samples"], 6);
            assert_eq!(summary["passing"].as_u64().unwrap() as usize, passing.len(), "{summary}");
            match policy {
                "best" => expected
                    .extend(passing.first().map(|(t, _)| (prompts[*prompt].clone(), t.clone()))),
                _ => {
                    let mut seen = Vec::new();
                    for (text, _) in passing {
                        if !seen.contains(&text) {
                            seen.push(text);
                            expected.push((prompts[*prompt].clone(), text.clone()));
                        }
                    }
                }
            }
        }
        assert_eq!(kept, expected, "{policy}: exactly the selected passing samples");
        assert!(!kept.is_empty(), "some completion passes");
        assert_eq!(run["summary"]["kept"].as_u64().unwrap() as usize, kept.len());
    }
    let listed = get(&s.router, "/v1/verity/rejection_sampling", &s.key).await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn bad_runs_are_refused_naming_the_field_and_nothing_is_queued(pool: PgPool) {
    let s = setup(pool).await;
    let other = user(&s.pool, "eve@example.com", "evil", "admin").await;
    let theirs = upload(&s.router, &other, "x.jsonl", prompts_jsonl().as_bytes()).await.json();
    let theirs = theirs["id"].as_str().unwrap();
    let base = json!({"models": [MODEL], "file": s.file, "grader": contains_grader(), "n": 2});
    let with = |patch: Value| {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    verity_core::models::set_hub_id(&s.pool, MODEL, "acme/Tiny-Llama").await.unwrap();
    let before = s.jobs_rows().await;
    for (body, param) in [
        (with(json!({"models": [MODEL, "no-such-model"]})), "models[1]"),
        (with(json!({"models": [MODEL, "ft:tiny-llama:evil:ftjob-x:ckpt-step-1"]})), "models[1]"),
        (with(json!({"models": []})), "models"),
        (with(json!({"models": [MODEL, MODEL]})), "models[1]"),
        // the same model by its hub id; a hub id no model has
        (with(json!({"models": [MODEL, "acme/Tiny-Llama"]})), "models[1]"),
        (with(json!({"models": [MODEL, "acme/none"]})), "models[1]"),
        (with(json!({"file": theirs})), "file"),
        (with(json!({"n": 0})), "n"),
        (with(json!({"temperature": 5.0})), "temperature"),
        (with(json!({"grader": {"type": "string_check", "name": "x"}})), "grader"),
        (with(json!({"grader": {"type": "no_such_grader"}})), "grader"),
        (with(json!({"job": "ftjob-missing", "models": null})), "job"),
        (
            with(json!({"response_format": {"type": "json_schema", "json_schema": {"name": ""}}})),
            "response_format.json_schema.name",
        ),
        // a grader reading sample.output_json needs a JSON response_format
        (
            with(json!({"grader": {"type": "string_check", "name": "j", "operation": "eq",
                "input": "{{sample.output_json.answer}}", "reference": "x"}})),
            "grader",
        ),
    ] {
        let reply = post(&s.router, "/v1/verity/evaluations", &s.key, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {:?}", reply.json());
        let got = reply.json()["error"]["param"].as_str().unwrap_or_default().to_string();
        assert!(got.starts_with(param), "{body}: param {got:?}, expected {param}");
    }
    let rs = json!({"model": MODEL, "file": s.file, "grader": contains_grader()});
    for (patch, param) in [
        (json!({"k": 0}), "k"),
        (json!({"model": "nope"}), "model"),
        (json!({"file": theirs}), "file"),
        (json!({"policy": "worst"}), "policy"),
        (json!({"min_score": 2.0}), "min_score"),
    ] {
        let mut body = rs.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let reply = post(&s.router, "/v1/verity/rejection_sampling", &s.key, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {:?}", reply.json());
        let got = reply.json()["error"]["param"].as_str().unwrap_or_default().to_string();
        assert!(got.starts_with(param), "{body}: param {got:?}, expected {param}");
    }
    let typo = with(json!({"temprature": 0.5}));
    let reply = post(&s.router, "/v1/verity/evaluations", &s.key, typo).await;
    assert!(reply.status.is_client_error(), "an unknown field is refused: {:?}", reply.json());
    assert_eq!(s.jobs_rows().await, before, "nothing was enqueued");
    // A hub id names the model in an evaluation too; it is reported under the model's name.
    let by_hub_id = with(json!({"models": ["acme/Tiny-Llama"]}));
    let by_hub_id = post(&s.router, "/v1/verity/evaluations", &s.key, by_hub_id).await;
    assert_eq!(by_hub_id.status, StatusCode::OK, "{:?}", by_hub_id.json());
    assert_eq!(by_hub_id.json()["models"][0]["name"], MODEL);
    let missing = get(&s.router, "/v1/verity/evaluations/evaljob-nope", &s.key).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_cancelled_evaluation_never_runs(pool: PgPool) {
    let s = setup(pool).await;
    let body = json!({"models": [MODEL], "file": s.file, "grader": contains_grader(), "n": 2});
    let created = post(&s.router, "/v1/verity/evaluations", &s.key, body).await.json();
    let id = created["id"].as_str().unwrap();
    let other = user(&s.pool, "eve@example.com", "evil", "admin").await;
    let reply =
        post(&s.router, &format!("/v1/verity/evaluations/{id}/cancel"), &other, json!({})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "another org cannot cancel it");
    let cancelled =
        post(&s.router, &format!("/v1/verity/evaluations/{id}/cancel"), &s.key, json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.json());
    assert_eq!(cancelled.json()["status"], "cancelled");
    let again =
        post(&s.router, &format!("/v1/verity/evaluations/{id}/cancel"), &s.key, json!({})).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    s.queue.register_worker(&worker).await.unwrap();
    assert!(s.queue.claim(&worker).await.unwrap().is_none(), "nothing left to claim");
}
