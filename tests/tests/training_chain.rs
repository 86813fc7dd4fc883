//! Jobs that start from another job's model ("chaining"), through the real API, queue and a
//! local object store on a tiny random model: a job started from a checkpoint resumes its
//! weights exactly (full fine-tuning), a LoRA model is merged into its base (`W + scale · B A`,
//! checked against an independent computation), chains of adapters train on, fine-tuned models
//! (full and LoRA) judge `score_model` graders as their weights, and another org's model is
//! refused naming `model`.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{post, upload, user};
use axum::http::StatusCode;
use candle_core::Device;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use training_support::{prepare_store, run_one_job, MODEL};
use verity_core::queue::{DeviceKind, Queue, QueueSettings, WorkerInfo};
use verity_core::storage::{download_folder, publish_folder, ObjectStore};
use verity_core::JobState;
use verity_verifiers::{JudgeMessage, JudgePrompt, JudgeSampling};
use verity_worker::judge::{JudgeProvider, JudgeSettings};
use verity_worker::trainer::testing::target_token_jsonl;
use verity_worker::LoadedModel;

/// The LoRA adapter the first job trains: scale = alpha / rank = 2.
const LORA: (usize, f64) = (4, 8.0);
const LORA_TARGETS: [&str; 3] = ["q_proj", "v_proj", "down_proj"];

/// A small job's method; a graded similarity gives reward contrast from the first step, so
/// the weights (or the adapter's B) move. A checkpoint at every step.
fn method(lora: bool) -> Value {
    let mut hp = json!({"batch_size": 2, "group_size": 4, "learning_rate": 0.02, "max_steps": 2,
                        "max_completion_tokens": 4, "micro_batch_size": 4, "checkpoint_interval": 1});
    if lora {
        hp["lora"] = json!({"rank": LORA.0, "alpha": LORA.1, "targets": LORA_TARGETS});
    }
    let grader = json!({"type": "text_similarity", "name": "similarity", "input": "{{sample.output_text}}",
                        "reference": "t7 t7 t7 t7", "evaluation_metric": "fuzzy_match"});
    json!({"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}})
}

/// The set-up: the tiny base published, an org `acme` with a key and an uploaded training
/// file, another org with a key, and the API over the same store.
struct Setup {
    root: tempfile::TempDir,
    store: Arc<dyn ObjectStore>,
    queue: Queue,
    router: axum::Router,
    key: String,
    other_key: String,
    file: String,
}

async fn setup(pool: &PgPool) -> Setup {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(pool, root.path()).await;
    let router = verity_server::app::app(api_support::app_on(pool.clone(), store.clone()).await);
    let key = user(pool, "a@acme.io", "acme", "member").await;
    let other_key = user(pool, "b@other.io", "other", "member").await;
    let uploaded = upload(&router, &key, "train.jsonl", target_token_jsonl(6).as_bytes()).await;
    assert_eq!(uploaded.status, StatusCode::OK, "{:?}", uploaded.json());
    let file = uploaded.json()["id"].as_str().unwrap().to_string();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    Setup { root, store, queue, router, key, other_key, file }
}

impl Setup {
    /// Creates a job through the API starting from `model`; its JSON object.
    async fn create(&self, model: &str, lora: bool) -> Value {
        let body =
            json!({"model": model, "training_file": self.file, "method": method(lora), "seed": 5});
        let reply = post(&self.router, "/v1/fine_tuning/jobs", &self.key, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{model}: {:?}", reply.json());
        reply.json()
    }

    /// Creates a job from `model`, runs it to success; its `(id, fine_tuned_model)`.
    async fn train(&self, model: &str, lora: bool) -> (String, String) {
        let job = self.create(model, lora).await;
        let id = job["id"].as_str().unwrap().to_string();
        assert_eq!(job["base_model"], MODEL, "{job}");
        run_one_job(&self.queue, self.store.clone(), &self.root.path().join("cache")).await;
        assert_eq!(self.queue.state(&id).await.unwrap(), JobState::Succeeded);
        let name: String = sqlx::query_scalar("SELECT fine_tuned_model FROM jobs WHERE id = $1")
            .bind(&id)
            .fetch_one(self.queue.pool())
            .await
            .unwrap();
        assert_eq!(name, format!("ft:{MODEL}:acme::{id}"), "named after the root base");
        (id, name)
    }

    /// The model a job on `model` starts from, built as the training handler builds it.
    async fn start_model(&self, model: &str) -> LoadedModel {
        let org = self.org().await;
        let stack = verity_core::lineage::resolve_stack(self.queue.pool(), org, model)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{model} does not resolve"));
        assert_eq!(stack.base.id, MODEL);
        let cache = self.root.path().join("start-cache");
        let fetched =
            verity_worker::checkpoint::stack::fetch_stack(self.store.as_ref(), &stack, &cache)
                .await
                .unwrap();
        fetched.load(&Device::Cpu).unwrap()
    }

    /// Asks `model` as the judge of a `score_model` grader (loaded as a worker loads judges)
    /// and checks that it replies as the model a job on `model` starts from.
    async fn judge_like_start_model(&self, model: &str) {
        let org = self.org().await;
        let grader = json!({"type": "score_model", "name": "judge", "model": model, "range": [0, 10],
                            "input": [{"role": "user", "content": "Rate {{sample.output_text}}"}]});
        let grader = verity_verifiers::Grader::from_json(&grader.to_string()).unwrap();
        let judges = JudgeProvider::on_cpu(JudgeSettings::default(), self.root.path().join("j"));
        let judge = judges.judge_for(self.queue.pool(), self.store.as_ref(), org, &grader).await;
        let judge = judge.unwrap_or_else(|e| panic!("{model} as a judge: {e}"));
        let prompt = JudgePrompt {
            model: model.to_string(),
            messages: vec![JudgeMessage { role: "user".into(), content: "Rate t7 t7".into() }],
            sampling: JudgeSampling {
                temperature: 0.0,
                top_p: 1.0,
                seed: 1,
                max_completion_tokens: 6,
                reasoning_effort: None,
            },
        };
        let reply = judge.complete(std::slice::from_ref(&prompt)).remove(0).unwrap();
        let start = self.start_model(model).await;
        let expected = verity_worker::judge::local::generate(&start, &[&prompt]).remove(0);
        assert_eq!(reply, expected.unwrap(), "{model} judges as its weights");
    }

    async fn org(&self) -> uuid::Uuid {
        sqlx::query_scalar("SELECT id FROM orgs WHERE name = 'acme'")
            .fetch_one(self.queue.pool())
            .await
            .unwrap()
    }

    /// Downloads the job's checkpoint at `step`; its folder.
    async fn checkpoint(&self, job: &str, step: i32) -> std::path::PathBuf {
        let dir = self.root.path().join(format!("{job}-step-{step}"));
        let prefix = format!("jobs/{job}/checkpoints/step-{step}");
        download_folder(self.store.as_ref(), &prefix, &dir).await.unwrap();
        dir
    }

    fn base(&self) -> LoadedModel {
        verity_worker::load_model(&self.root.path().join("tiny-model"), &Device::Cpu).unwrap()
    }
}

/// Log-probabilities of a fixed completion after a fixed prompt.
fn logprobs(lm: &LoadedModel) -> Vec<f32> {
    let prompt = lm.tokenizer.encode("t3 t10 t4").unwrap();
    let completion = lm.tokenizer.encode("t7 t7 t9 t7").unwrap();
    let pad = lm.tokenizer.pad_id();
    let out = lm.model.completion_logprobs(&[prompt], &[completion], 1.0, pad, false).unwrap();
    out.logprobs.flatten_all().unwrap().to_vec1().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Every base weight in HF layout, as flat f32 vectors with their shapes.
fn weights(lm: &LoadedModel) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    lm.model
        .export_weights()
        .unwrap()
        .into_iter()
        .map(|(name, t)| (name, (t.dims().to_vec(), t.flatten_all().unwrap().to_vec1().unwrap())))
        .collect()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_started_from_a_full_checkpoint_resumes_its_weights(pool: PgPool) {
    let s = setup(&pool).await;
    let (first, name) = s.train(MODEL, false).await;
    let checkpoint = verity_core::models::checkpoint_model_name(&name, 1);

    // The start model is the checkpoint, bit for bit.
    let start = s.start_model(&checkpoint).await;
    let saved = verity_worker::load_model(&s.checkpoint(&first, 1).await, &Device::Cpu).unwrap();
    assert_eq!(weights(&start), weights(&saved), "the checkpoint's weights, unchanged");
    assert_eq!(logprobs(&start), logprobs(&saved));
    assert!(max_diff(&logprobs(&start), &logprobs(&s.base())) > 0.0, "trained, not the base");
    s.judge_like_start_model(&name).await;

    // The chained job runs, records where it started and is named after the root base.
    let (second, _) = s.train(&checkpoint, false).await;
    let started: Value =
        sqlx::query_scalar("SELECT data FROM job_events WHERE job_id = $1 AND kind = 'started'")
            .bind(&second)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((&started["model"], &started["base_model"]), (&json!(checkpoint), &json!(MODEL)));

    // A checkpoint of a job that did not succeed (one running, then cancelled) is a model too.
    let cancelled = s.create(MODEL, false).await["id"].as_str().unwrap().to_string();
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
    s.queue.register_worker(&worker).await.unwrap();
    let lease = s.queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(lease.job().id, cancelled);
    let prefix = format!("jobs/{cancelled}/checkpoints/step-1");
    let folder = s.checkpoint(&first, 1).await;
    let manifest = publish_folder(s.store.as_ref(), &folder, &prefix).await.unwrap();
    lease.checkpoint(1, &prefix, manifest.total_bytes as i64, None).await.unwrap();
    let running = verity_core::models::fine_tuned_model_name(MODEL, "acme", None, &cancelled);
    let running = verity_core::models::checkpoint_model_name(&running, 1);
    assert_eq!(weights(&s.start_model(&running).await), weights(&saved), "while running");
    lease.ack_cancel().await.unwrap();
    assert_eq!(s.queue.state(&cancelled).await.unwrap(), JobState::Cancelled);
    let from_cancelled = s.create(&running, false).await;
    assert_eq!(from_cancelled["model"], json!(running));
    assert_eq!(weights(&s.start_model(&running).await), weights(&saved), "once cancelled");

    // Another org cannot start from it: a 400 naming `model`, as for a missing model.
    for model in [checkpoint.as_str(), name.as_str(), "ft:tiny-llama:acme::ftjob-nope"] {
        let body = json!({"model": model, "training_file": s.file, "method": method(false)});
        let reply = post(&s.router, "/v1/fine_tuning/jobs", &s.other_key, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{model}");
        let error = &reply.json()["error"];
        assert_eq!((&error["param"], &error["code"]), (&json!("model"), &json!("model_not_found")));
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_lora_model_is_merged_into_its_base_and_trained_on(pool: PgPool) {
    let s = setup(&pool).await;
    let (first, name) = s.train(MODEL, true).await;
    let format: String = sqlx::query_scalar("SELECT format FROM models WHERE id = $1")
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(format, "peft", "the first job's model is an adapter only");

    // The start model computes what the base with the adapter (unmerged) computes.
    let start = s.start_model(&name).await;
    let adapter_dir = s.checkpoint(&first, 2).await;
    let mut adapted = s.base();
    adapted.model.load_lora(&adapter_dir).unwrap();
    let (merged, unmerged, base) = (logprobs(&start), logprobs(&adapted), logprobs(&s.base()));
    assert!(max_diff(&merged, &unmerged) < 1e-4, "{merged:?} vs {unmerged:?}");
    assert!(max_diff(&merged, &base) > 1e-4, "the adapter changes the model");
    s.judge_like_start_model(&name).await;

    // Its weights are W + scale · B A, computed here independently from the stored files.
    let mut adapter = HashMap::new();
    verity_worker::weights::read_safetensors(
        &adapter_dir.join("adapter_model.safetensors"),
        &Device::Cpu,
        |name, t| {
            adapter.insert(name, (t.dims().to_vec(), t.flatten_all()?.to_vec1::<f32>()?));
            Ok(())
        },
    )
    .unwrap();
    let scale = (LORA.1 / LORA.0 as f64) as f32;
    let (base_weights, start_weights) = (weights(&s.base()), weights(&start));
    let mut merged_projections = 0;
    for (name, (shape, w)) in &base_weights {
        let path = name.strip_suffix(".weight").unwrap_or(name);
        let lora = |m: &str| adapter.get(&format!("base_model.model.{path}.lora_{m}.weight"));
        let expected = match (lora("A"), lora("B")) {
            (Some((a_shape, a)), Some((_, b))) => {
                merged_projections += 1;
                let (out_dim, in_dim, r) = (shape[0], shape[1], a_shape[0]);
                let mut merged = w.clone();
                for o in 0..out_dim {
                    for i in 0..in_dim {
                        let ba: f32 = (0..r).map(|k| b[o * r + k] * a[k * in_dim + i]).sum();
                        merged[o * in_dim + i] += scale * ba;
                    }
                }
                merged
            }
            _ => w.clone(),
        };
        let got = &start_weights[name].1;
        assert!(max_diff(got, &expected) < 1e-5, "{name}: not W + scale · B A");
    }
    let layers = s.base().model.config.num_hidden_layers;
    assert_eq!(merged_projections, LORA_TARGETS.len() * layers);

    // A new LoRA over the merged model from the first job's checkpoint, then full fine-tuning
    // over that (two adapters merged in order): each starts from the stack below it.
    let step_one = verity_core::models::checkpoint_model_name(&name, 1);
    let (second, second_name) = s.train(&step_one, true).await;
    let start = s.start_model(&second_name).await;
    let mut expected = s.base();
    expected.model.load_lora(&s.checkpoint(&first, 1).await).unwrap();
    expected.model.merge_lora().unwrap();
    expected.model.load_lora(&s.checkpoint(&second, 2).await).unwrap();
    assert!(max_diff(&logprobs(&start), &logprobs(&expected)) < 1e-4);
    let (_, third_name) = s.train(&second_name, false).await;
    assert!(third_name.starts_with(&format!("ft:{MODEL}:acme::")));
}
