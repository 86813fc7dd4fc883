//! OpenAI-compatible inference end to end: a real API server and a real inference worker (both
//! on loopback ports, registered through Postgres), a tiny random model published in a local
//! store, a LoRA checkpoint of a job and the same adapter merged into full weights. Driven by
//! the official `openai` Python SDK and by plain HTTP.

use verity_tests::api_support;
use verity_tests::inference_support;

use futures::StreamExt;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use sqlx::PgPool;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use verity_core::queue::{DeviceKind, NewJob, Queue, QueueSettings, SharedKind, WorkerInfo};
use verity_core::spec::RolloutDtype;
use verity_core::storage::{publish_folder, LocalStore, ObjectStore};
use verity_worker::inference::Engine;
use verity_worker::model::lora::LoraConfig;

/// The base model's name.
const BASE: &str = "tiny-llama";
/// Context of the test model (long enough for a generation that outlasts a client).
const CONTEXT: usize = 4096;

/// API server + inference worker over one database and store.
struct Stack {
    base: String,
    pool: PgPool,
    engine: Arc<Engine>,
    model_dir: PathBuf,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn stack(pool: PgPool) -> Stack {
    stack_decoding(pool, RolloutDtype::F32).await
}

/// [`stack`] with an inference worker decoding from `decode_dtype` weights.
async fn stack_decoding(pool: PgPool, decode_dtype: RolloutDtype) -> Stack {
    stack_with(pool, decode_dtype, |_| {}).await
}

/// [`stack_decoding`] with the API server's state changed by `tweak` before it serves.
async fn stack_with(
    pool: PgPool,
    decode_dtype: RolloutDtype,
    tweak: impl FnOnce(&mut verity_server::api::state::AppState),
) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path().join("objects"), None).await.unwrap());
    let model_dir = dir.path().join("tiny");
    inference_support::tiny_model(&model_dir, 3, CONTEXT);
    publish_folder(store.as_ref(), &model_dir, "models/tiny-llama").await.unwrap();
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

    let mut state = api_support::app_on(pool.clone(), store.clone()).await;
    tweak(&mut state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(verity_server::app::serve(listener, verity_server::app::app(state)));

    let cache = dir.path().join("cache");
    let (engine, shutdown) =
        inference_support::start_worker(&pool, store, &cache, (16, decode_dtype)).await;
    Stack { base, pool, engine, model_dir, dir, shutdown }
}

async fn org_of(pool: &PgPool, email: &str) -> uuid::Uuid {
    sqlx::query_scalar("SELECT org_id FROM users WHERE email = $1")
        .bind(email)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A job of `org` with two checkpoints: step 1 a LoRA adapter (random, non-zero B), step 2 the
/// same adapter merged into full weights. Returns their model names.
async fn checkpoints(stack: &Stack, org: uuid::Uuid) -> (String, String) {
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(stack.dir.path().join("objects"), None).await.unwrap());
    let queue = Queue::new(stack.pool.clone(), QueueSettings::default());
    let job =
        queue.enqueue(&NewJob::new(org, BASE, json!({"type": "reinforcement"}))).await.unwrap();
    let lm = verity_worker::load_model(&stack.model_dir, &candle_core::Device::Cpu).unwrap();
    let mut model = lm.model;
    let lora = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        target_modules: ["q_proj", "v_proj", "o_proj", "down_proj"].map(String::from).to_vec(),
        lora_dropout: 0.0,
    };
    model.enable_lora(lora, 11).unwrap();
    // Seeded, so that every run serves the same adapter (one whose greedy answer differs from
    // the base model's: candle's CPU `randn` cannot be seeded, and an unlucky draw answered as
    // the base did).
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (i, (name, var)) in model.lora_params().into_iter().enumerate() {
        if name.contains("lora_B") {
            let values: Vec<f32> =
                (0..var.elem_count()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let t = candle_core::Tensor::from_vec(values, var.dims(), &candle_core::Device::Cpu)
                .unwrap();
            var.set(&t).unwrap_or_else(|e| panic!("{i}: {e}"));
        }
    }
    let (lora_dir, merged_dir) =
        (stack.dir.path().join("ckpt-lora"), stack.dir.path().join("ckpt-merged"));
    let save = verity_worker::checkpoint::save_checkpoint;
    save(&lora_dir, &model, Some(&lm.tokenizer), None, BASE).unwrap();
    model.merge_lora().unwrap();
    save(&merged_dir, &model, Some(&lm.tokenizer), None, BASE).unwrap();
    // Checkpoints are written by the job's lease holder, as a training worker does.
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    queue.register_worker(&worker).await.unwrap();
    let lease = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(lease.job().id, job);
    for (step, dir) in [(1, &lora_dir), (2, &merged_dir)] {
        let prefix = format!("jobs/{job}/checkpoints/step-{step}");
        publish_folder(store.as_ref(), dir, &prefix).await.unwrap();
        lease.checkpoint(step, &prefix, 1, None).await.unwrap();
    }
    let record = verity_core::jobs::get_job(&stack.pool, org, &job).await.unwrap().unwrap();
    let model = record.output_model_name();
    let name = |step| verity_core::models::checkpoint_model_name(&model, step);
    (name(1), name(2))
}

async fn chat(stack: &Stack, key: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", stack.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn text(reply: &Value) -> String {
    reply["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

const SDK_SCRIPT: &str = r#"
import os
from openai import OpenAI, NotFoundError, BadRequestError
base, ckpt = os.environ["VERITY_BASE"] + "/v1", os.environ["CKPT"]
client = OpenAI(base_url=base, api_key=os.environ["KEY"], max_retries=0)
messages = [{"role": "user", "content": "t5 t9 t12"}]
texts = {}
for model in ["tiny-llama", ckpt]:
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                       temperature=0, seed=3, logprobs=True, top_logprobs=2)
    assert r.object == "chat.completion" and r.model == model, r
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length"), r
    assert len(choice.logprobs.content) == r.usage.completion_tokens, r
    assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content), r
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r
    parts, usage, finish = [], None, None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                            temperature=0, seed=3, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(parts) == choice.message.content, (parts, choice.message.content)
    assert finish == choice.finish_reason and usage.completion_tokens == r.usage.completion_tokens
    texts[model] = choice.message.content
assert texts["tiny-llama"] != texts[ckpt], texts
r = client.chat.completions.create(model="tiny-llama", messages=messages, n=3, max_tokens=6, seed=1)
assert [c.index for c in r.choices] == [0, 1, 2], r
r = client.completions.create(model=ckpt, prompt="t5 t9", max_tokens=4, temperature=0, logprobs=2)
assert r.object == "text_completion" and len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens, r
streamed = "".join(c.choices[0].text for c in client.completions.create(
    model=ckpt, prompt="t5 t9", max_tokens=4, temperature=0, stream=True) if c.choices)
assert streamed == r.choices[0].text, (streamed, r.choices[0].text)
ids = [m.id for m in client.models.list()]
assert "tiny-llama" in ids and ckpt in ids, ids
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise SystemExit("unknown model accepted")
except NotFoundError as e:
    assert "no-such-model" in str(e), e
try:
    client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=10**6)
    raise SystemExit("max_tokens above the context accepted")
except BadRequestError as e:
    body = e.body.get("error", e.body)
    assert body["param"] == "max_tokens", body
other = OpenAI(base_url=base, api_key=os.environ["OTHER_KEY"], max_retries=0)
try:
    other.chat.completions.create(model=ckpt, messages=messages)
    raise SystemExit("another org's checkpoint served")
except NotFoundError:
    pass
print("SDK OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn openai_sdk_chats_with_a_base_model_and_a_lora_checkpoint(pool: PgPool) {
    let Ok(python) = std::env::var("VERITY_TEST_PYTHON") else {
        eprintln!("SKIPPED: VERITY_TEST_PYTHON is not set (source scripts/test-services.sh)");
        return;
    };
    let stack = stack(pool.clone()).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let other_key = api_support::user(&pool, "b@x.io", "org-b", "member").await;
    let (lora, _) = checkpoints(&stack, org_of(&pool, "a@x.io").await).await;
    let env = [("KEY", key.as_str()), ("OTHER_KEY", &other_key), ("CKPT", &lora)];
    run_sdk(&python, SDK_SCRIPT, &stack, &env).await;
}

/// Runs `script` under `python` with `VERITY_BASE` and `env`; its stdout, after checking that it
/// printed `SDK OK`.
async fn run_sdk(python: &str, script: &str, stack: &Stack, env: &[(&str, &str)]) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    let output = tokio::process::Command::new(python)
        .arg(file.path())
        .env("VERITY_BASE", &stack.base)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && stdout.contains("SDK OK"),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn bad_models_and_budgets_are_refused_with_the_field_named(pool: PgPool) {
    let stack = stack(pool.clone()).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let other = api_support::user(&pool, "b@x.io", "org-b", "member").await;
    let (lora, _) = checkpoints(&stack, org_of(&pool, "a@x.io").await).await;
    let messages = json!([{"role": "user", "content": "t5"}]);
    let (status, body) = chat(&stack, &other, json!({"model": lora, "messages": messages})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["param"], "model");
    let (status, body) =
        chat(&stack, &key, json!({"model": "nope-model", "messages": messages})).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("nope-model"), "{body}");
    for field in ["max_tokens", "max_completion_tokens"] {
        let (status, body) =
            chat(&stack, &key, json!({"model": BASE, "messages": messages, field: CONTEXT})).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], field, "{body}");
    }
    for (field, value) in [
        ("temperature", json!(3)),
        ("top_p", json!(0)),
        ("n", json!(0)),
        ("stop", json!(["a", "b", "c", "d", "e"])),
        ("presence_penalty", json!(1)),
        ("tools", json!([{"type": "function"}])),
        ("top_logprobs", json!(3)),
    ] {
        let (status, body) =
            chat(&stack, &key, json!({"model": BASE, "messages": messages, field: value})).await;
        assert_eq!(status, 400, "{field}: {body}");
        assert_eq!(body["error"]["param"], field, "{body}");
    }
    // The tiny model's word-level tokenizer cannot write JSON: a structured output is refused
    // by the worker before any token, naming the field (not a server error).
    let format = json!({"type": "json_object"});
    let body = json!({"model": BASE, "messages": messages, "response_format": format});
    let (status, body) = chat(&stack, &key, body).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "response_format", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("cannot be constrained"), "{body}");
    let (status, body) =
        chat(&stack, &key, json!({"model": lora, "messages": messages, "max_tokens": 3})).await;
    assert_eq!(status, 200, "{body}");
    // A model's hub id serves it too (`verity models pull` gives a pulled model its own).
    verity_core::models::set_hub_id(&pool, BASE, "acme/Tiny-1").await.unwrap();
    let body = json!({"model": "acme/Tiny-1", "messages": messages, "max_tokens": 3, "seed": 1});
    let (status, by_hub_id) = chat(&stack, &key, body.clone()).await;
    assert_eq!(status, 200, "{by_hub_id}");
    let mut by_name = body;
    by_name["model"] = json!(BASE);
    let (_, by_name) = chat(&stack, &key, by_name).await;
    assert_eq!(by_hub_id["choices"], by_name["choices"], "the same model, the same tokens");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_same_seed_gives_the_text_of_verity_generate(pool: PgPool) {
    same_seeds_as_verity_generate(pool, RolloutDtype::F32).await;
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_int8_worker_answers_as_verity_generate_with_int8_weights(pool: PgPool) {
    let texts = same_seeds_as_verity_generate(pool, RolloutDtype::Int8).await;
    // The copies are what it decodes from: the f32 weights answer otherwise.
    assert_ne!(texts, f32_texts().await);
}

/// The seeds the generation tests use.
const SEEDS: [u64; 3] = [0, 7, 123];

/// `verity generate`'s options for `seed` reading `dtype` weights.
fn generate_options(seed: u64, dtype: RolloutDtype) -> verity_worker::GenerateOptions {
    verity_worker::GenerateOptions {
        sampling: verity_worker::SamplingParams {
            max_new_tokens: 20,
            temperature: 0.9,
            seed,
            rollout_dtype: dtype,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `verity generate`'s texts for [`SEEDS`] with the f32 weights of the test model.
async fn f32_texts() -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    inference_support::tiny_model(dir.path(), 3, CONTEXT);
    let path = dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        SEEDS
            .iter()
            .map(|&seed| {
                let options = generate_options(seed, RolloutDtype::F32);
                verity_worker::generate(&path, "t4 t8 t15", &options).unwrap()[0].text.clone()
            })
            .collect()
    })
    .await
    .unwrap()
}

/// Asks a worker decoding from `dtype` weights for seeded completions, checks each against
/// `verity generate` with the same precision, and returns the texts.
async fn same_seeds_as_verity_generate(pool: PgPool, dtype: RolloutDtype) -> Vec<String> {
    let stack = stack_decoding(pool.clone(), dtype).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let mut texts = Vec::new();
    for seed in SEEDS {
        let (status, body) = chat(
            &stack,
            &key,
            json!({"model": BASE, "messages": [{"role": "user", "content": "t4 t8 t15"}],
                   "temperature": 0.9, "seed": seed, "max_tokens": 20}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let options = generate_options(seed, dtype);
        let dir = stack.model_dir.clone();
        let generated = tokio::task::spawn_blocking(move || {
            verity_worker::generate(&dir, "t4 t8 t15", &options).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(text(&body), generated[0].text, "seed {seed}");
        assert_eq!(body["usage"]["completion_tokens"], generated[0].tokens, "seed {seed}");
        texts.push(text(&body));
    }
    texts
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_lora_checkpoint_over_its_base_answers_as_the_merged_model(pool: PgPool) {
    let stack = stack(pool.clone()).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let (lora, merged) = checkpoints(&stack, org_of(&pool, "a@x.io").await).await;
    for prompt in ["t5 t9 t12", "t33 t3", "t60"] {
        let ask = |model: &str| {
            json!({"model": model, "messages": [{"role": "user", "content": prompt}],
                   "temperature": 0, "max_tokens": 24, "logprobs": true,
                   "logit_bias": {"2": -100}})
        };
        let (_, adapted) = chat(&stack, &key, ask(&lora)).await;
        let (_, full) = chat(&stack, &key, ask(&merged)).await;
        assert_eq!(text(&adapted), text(&full), "{prompt}");
        let lps = |r: &Value| -> Vec<f64> {
            r["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["logprob"].as_f64().unwrap())
                .collect()
        };
        for (a, b) in lps(&adapted).iter().zip(lps(&full)) {
            assert!((a - b).abs() < 1e-3, "{prompt}: {a} vs {b}");
        }
    }
    // One base in memory, the adapter beside it; the merged checkpoint is a model of its own.
    let loaded = stack.engine.loaded_models().await;
    assert_eq!(loaded.len(), 3, "{loaded:?}");
}

/// Greedy token texts of a request run alone.
async fn alone(stack: &Stack, key: &str, prompt: &str, max_tokens: usize) -> String {
    let (status, body) = chat(
        stack,
        key,
        json!({"model": BASE, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
               "max_tokens": max_tokens, "logit_bias": {"2": -100}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    text(&body)
}

/// Opens a streaming chat request; returns its SSE body.
async fn open_stream(
    stack: &Stack,
    key: &str,
    prompt: &str,
    max_tokens: usize,
) -> impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", stack.base))
        .bearer_auth(key)
        .json(&json!({"model": BASE, "messages": [{"role": "user", "content": prompt}],
                      "temperature": 0, "max_tokens": max_tokens, "stream": true,
                      "logit_bias": {"2": -100}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.bytes_stream()
}

/// Reads SSE chunks until `count` content deltas arrived; returns their text.
async fn read_deltas(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    count: usize,
) -> String {
    let (mut buf, mut out, mut seen) = (String::new(), String::new(), 0);
    while seen < count {
        let chunk = body.next().await.expect("stream ended").unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap_or_default();
            if data == "[DONE]" {
                return out;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty())
            {
                out.push_str(t);
                seen += 1;
                if seen == count {
                    break;
                }
            }
        }
    }
    out
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn continuous_batching_gives_each_request_its_lone_tokens_and_a_gone_client_frees_its_rows(
    pool: PgPool,
) {
    let stack = stack(pool.clone()).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let prompts = ["t5 t9 t12 t40 t41", "t33", "t7 t7", "t60 t3 t22"];
    let mut lone = Vec::new();
    for p in prompts {
        lone.push(alone(&stack, &key, p, 30).await);
    }
    let first_30 = alone(&stack, &key, "t10 t11", 30).await;
    // A long generation runs; the others join its batch while it decodes, and leave it.
    let mut long = Box::pin(open_stream(&stack, &key, "t10 t11", CONTEXT - 8).await);
    let head = read_deltas(&mut long, 2).await;
    assert_eq!(stack.engine.active_sequences(), 1);
    let joined =
        futures::future::join_all(prompts.iter().map(|p| alone(&stack, &key, p, 30))).await;
    assert_eq!(joined, lone, "tokens in a shared batch differ from the same request alone");
    // A response can reach its client just before the engine's next step drops its row.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stack.engine.active_sequences() != 1 {
        assert!(Instant::now() < deadline, "finished requests must leave the batch");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rest = read_deltas(&mut long, 28).await;
    assert_eq!(head + &rest, first_30, "the long request's tokens changed when others joined");
    // The client goes away mid-generation: its rows are freed.
    drop(long);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stack.engine.active_sequences() > 0 || stack.engine.active_requests() > 0 {
        assert!(Instant::now() < deadline, "a disconnected stream kept its batch rows");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A model grader in `graders/run` is judged through the inference worker, never loaded by the
/// API process: the worker holds the judge model afterwards, and each reply is the one a training
/// worker's judge (the same folder loaded here) gives, greedy and seeded — the same rendering,
/// per-prompt seed and token counts.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_graders_run_judge_is_asked_through_the_inference_worker(pool: PgPool) {
    let stack = stack(pool.clone()).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let loaded = verity_worker::load_model(&stack.model_dir, &candle_core::Device::Cpu).unwrap();
    let local = Arc::new(verity_worker::judge::LocalJudge::new(std::collections::BTreeMap::from(
        [(BASE.to_string(), Arc::new(std::sync::Mutex::new(loaded)))],
    )));
    let item = json!({"q": "t3 t8"});
    for sampling in [
        json!({"temperature": 0, "max_completions_tokens": 6}),
        json!({"temperature": 1.0, "top_p": 0.9, "seed": 42, "max_completions_tokens": 6}),
    ] {
        let spec = json!({"type": "score_model", "name": "judge", "model": BASE, "range": [0, 100],
                          "input": [{"role": "system", "content": "t5 t6"},
                                    {"role": "user", "content": "{{item.q}} t9 {{sample.output_text}}"}],
                          "sampling_params": sampling});
        let response = reqwest::Client::new()
            .post(format!("{}/v1/fine_tuning/alpha/graders/run", stack.base))
            .bearer_auth(&key)
            .json(&json!({"grader": spec, "model_sample": "t44", "item": item}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let run: Value = response.json().await.unwrap();
        let grader = verity_verifiers::Grader::from_json(&spec.to_string()).unwrap();
        let sample = verity_verifiers::Sample::from_text("t44".to_string()).with_output_json();
        let here = tokio::task::spawn_blocking({
            let (grader, local, item) = (grader.clone(), local.clone(), item.clone());
            move || grader.with_judge(local).grade(&item, &sample)
        })
        .await
        .unwrap();
        assert_eq!(run["reward"].as_f64(), Some(here.score), "{sampling}: {run} vs {here:?}");
        assert_eq!(run["metadata"]["verity"]["reason"], json!(here.reason), "{sampling}: {run}");
        let usage = &here.judge_usage[BASE];
        let tokens = &run["model_grader_token_usage_per_model"][BASE];
        assert_eq!(tokens["prompt_tokens"], json!(usage.prompt_tokens), "{run}");
        assert_eq!(tokens["completion_tokens"], json!(usage.completion_tokens), "{run}");
    }
    let loaded = stack.engine.loaded_models().await;
    assert!(loaded.iter().any(|k| k == "models/tiny-llama"), "{loaded:?}");
}

/// A judge asked through the inference worker answers within the API's grading cap
/// (`VERITY_GRADER_RUN_MAX_MS`) or not at all: past it the grading is the judge's error, and the
/// generation it started is stopped on the worker.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_judge_past_the_grading_cap_is_an_error_and_stops(pool: PgPool) {
    let stack = stack_with(pool.clone(), RolloutDtype::F32, |state| {
        state.limits.grader_run_max_ms = 1;
    })
    .await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let spec = json!({"type": "score_model", "name": "judge", "model": BASE, "range": [0, 100],
                      "input": [{"role": "user", "content": "t5 {{sample.output_text}}"}],
                      "sampling_params": {"temperature": 1.0, "seed": 1, "max_completions_tokens": 2000}});
    let response = reqwest::Client::new()
        .post(format!("{}/v1/fine_tuning/alpha/graders/run", stack.base))
        .bearer_auth(&key)
        .json(&json!({"grader": spec, "model_sample": "t44"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let run: Value = response.json().await.unwrap();
    assert_eq!(run["reward"], 0.0, "{run}");
    assert_eq!(run["metadata"]["verity"]["error"]["kind"], "judge", "{run}");
    let message = run["metadata"]["verity"]["error"]["message"].to_string();
    assert!(message.contains("VERITY_GRADER_RUN_MAX_MS"), "{run}");
    let started = Instant::now();
    while stack.engine.active_requests() > 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "the judge's generation went on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The official Tinker SDK against Verity (docs/tinker.md): its key in the `tml-` form, the
/// server's models, a sampling client on a registered model, greedy and seeded sampling with
/// token ids in and out, stop token ids, the prompt's log-probabilities (`compute_logprobs`), and
/// clear errors for what is not served. Prints the tokens and log-probabilities of one seeded
/// sequence as `SEQUENCE {json}` and the prompt's as `PROMPT {json}`.
const TINKER_SCRIPT: &str = r#"
import json, os, tinker
from tinker import types
connection = dict(base_url=os.environ["VERITY_BASE"], api_key="tml-" + os.environ["KEY"])
sc = tinker.ServiceClient(**connection)
caps = tinker.RestClient(**connection).get_server_capabilities().result()
names = [m.model_name for m in caps.supported_models]
assert "tiny-llama" in names, names
sampler = sc.create_sampling_client(base_model="tiny-llama").result()
prompt = types.ModelInput.from_ints([5, 9, 12])
greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
r = sampler.sample(prompt=prompt, num_samples=2, sampling_params=greedy).result()
assert len(r.sequences) == 2, r
a, b = r.sequences
assert a.tokens == b.tokens and 1 <= len(a.tokens) <= 6, r
assert len(a.logprobs) == len(a.tokens) and all(lp <= 0 for lp in a.logprobs), r
assert a.stop_reason in ("stop", "length"), r
# A stop token id ends the sequence at it (the token is kept, as Tinker keeps it).
first = a.tokens[0]
stopped = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0, stop=[first])).result()
assert stopped.sequences[0].tokens == [first] and stopped.sequences[0].stop_reason == "stop", stopped
# Seeded sampling repeats itself.
seeded = types.SamplingParams(max_tokens=8, temperature=1.0, seed=11)
one = sampler.sample(prompt, 1, seeded).result().sequences[0]
again = sampler.sample(prompt, 1, seeded).result().sequences[0]
assert one.tokens == again.tokens and one.logprobs == again.logprobs, (one, again)
print("SEQUENCE " + json.dumps({"tokens": one.tokens, "logprobs": one.logprobs}))
# The prompt's log-probabilities: none for the first token, then one per token.
scored = sampler.compute_logprobs(prompt).result()
assert len(scored) == 3 and scored[0] is None, scored
last = sampler.sample(prompt, 1, greedy, include_prompt_logprobs=True).result()
assert last.prompt_logprobs == scored, (last.prompt_logprobs, scored)
print("PROMPT " + json.dumps(scored[1:]))
# What is not served is an error naming it, at once.
for call, needle in ((lambda: sampler.sample(prompt, 1, greedy, include_prompt_logprobs=True, topk_prompt_logprobs=2).result(), "topk_prompt_logprobs"),
                     (lambda: sc.create_sampling_client(base_model="no-such-model").result(), "no-such-model")):
    try:
        call()
        raise SystemExit("accepted: " + needle)
    except tinker.BadRequestError as e:
        assert needle in str(e), (needle, str(e))
sc.close("success").result()
print("SDK OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_tinker_sdk_samples_with_the_trainers_log_probabilities(pool: PgPool) {
    let Some(python) = tinker_python() else { return };
    let stack = stack(pool.clone()).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let stdout =
        run_sdk(&python, TINKER_SCRIPT, &stack, &[("KEY", &key), ("TINKER_TELEMETRY", "1")]).await;
    // The sampler's log-probabilities are the trainer's (temperature 1) on the same tokens: what
    // importance sampling in a user's own loop relies on.
    let line = stdout.lines().find_map(|l| l.strip_prefix("SEQUENCE ")).unwrap();
    let sequence: Value = serde_json::from_str(line).unwrap();
    let tokens: Vec<u32> = serde_json::from_value(sequence["tokens"].clone()).unwrap();
    let sampled: Vec<f32> = serde_json::from_value(sequence["logprobs"].clone()).unwrap();
    let lm = verity_worker::load_model(&stack.model_dir, &candle_core::Device::Cpu).unwrap();
    let scored = lm
        .model
        .completion_logprobs(
            &[vec![5, 9, 12]],
            std::slice::from_ref(&tokens),
            1.0,
            lm.tokenizer.pad_id(),
            false,
        )
        .unwrap();
    let trainer: Vec<f32> = scored.logprobs.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(trainer.len(), tokens.len());
    for (i, (s, t)) in sampled.iter().zip(&trainer).enumerate() {
        assert!((s - t).abs() < 1e-3, "token {i}: sampler {s}, trainer {t}");
    }
    let line = stdout.lines().find_map(|l| l.strip_prefix("PROMPT ")).unwrap();
    let prompt: Vec<f32> = serde_json::from_str(line).unwrap();
    let scored = lm
        .model
        .completion_logprobs(&[vec![5]], &[vec![9, 12]], 1.0, lm.tokenizer.pad_id(), false)
        .unwrap();
    let trainer: Vec<f32> = scored.logprobs.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(prompt.len(), trainer.len());
    for (s, t) in prompt.iter().zip(&trainer) {
        assert!((s - t).abs() < 1e-4, "prompt: served {s}, trainer {t}");
    }
    // The session is the org's: closed by the SDK, and invisible to another org.
    let sessions: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT id, finish_reason FROM tinker_sessions")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        sessions.len() == 1 && sessions[0].1.as_deref() == Some("success"),
        "the SDK's close() finished its session: {sessions:?}"
    );
}

/// The official Tinker SDK's training loop against Verity (docs/tinker.md): a LoRA training
/// client, `forward_backward` with `cross_entropy` and `optim_step` until the target sequence is
/// learned, `forward`, a PPO step on sampled tokens, weights saved for sampling (by the SDK's
/// own `save_weights_and_get_sampling_client`, and by name, then sampled through its
/// `tinker://` path), a bad datum named without stalling the calls after it, the training state
/// saved, loaded back and started from by a second client, and the runs with their saved
/// weights listed by the SDK's `RestClient`. Prints the saved sampler's greedy tokens with their log-probabilities as
/// `SAMPLED {json}` and the trainer's `forward` log-probabilities of the same tokens as
/// `FORWARD {json}`.
const TINKER_TRAINING_SCRIPT: &str = r#"
import json, os, tinker
from tinker import types
connection = dict(base_url=os.environ["VERITY_BASE"], api_key="tml-" + os.environ["KEY"])
sc = tinker.ServiceClient(**connection)
tc = sc.create_lora_training_client(base_model="tiny-llama", rank=4).result()
assert tc.get_info().model_data.model_name == "tiny-llama"
tokens = [5, 9, 12, 3, 7]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0, 0.0, 1.0, 1.0]})
losses = []
for _ in range(8):
    fb = tc.forward_backward([datum], "cross_entropy")
    step = tc.optim_step(types.AdamParams(learning_rate=2e-2))
    out = fb.result()
    step.result()
    losses.append(out.metrics["loss:sum"])
    assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == 4
print("LOSSES " + json.dumps(losses))
assert losses[-1] < 0.5 * losses[0], losses
# The trained weights, sampled: the SDK's own save-and-sample, then by name through its path.
sampler = tc.save_weights_and_get_sampling_client()
prompt = types.ModelInput.from_ints(tokens[:3])
greedy = types.SamplingParams(max_tokens=2, temperature=0.0, stop=[])
seq = sampler.sample(prompt=prompt, num_samples=1, sampling_params=greedy).result().sequences[0]
assert seq.tokens == tokens[3:], seq
print("SAMPLED " + json.dumps({"tokens": seq.tokens, "logprobs": seq.logprobs}))
scored = types.Datum(model_input=types.ModelInput.from_ints(tokens[:4]),
                     loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 4})
forward = tc.forward([scored], "cross_entropy").result()
print("FORWARD " + json.dumps(forward.loss_fn_outputs[0]["logprobs"].tolist()))
path = tc.save_weights_for_sampler("s1").result().path
assert path.startswith("tinker://tinkjob-") and path.endswith("/sampler_weights/s1"), path
by_path = sc.create_sampling_client(model_path=path)
again = by_path.sample(prompt=prompt, num_samples=1, sampling_params=greedy).result().sequences[0]
assert again.tokens == seq.tokens, (again, seq)
# A policy-gradient step on the sampled tokens, with the sampler's log-probabilities.
rl = types.Datum(model_input=types.ModelInput.from_ints(tokens[:4]),
                 loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [0.0, 0.0] + seq.logprobs,
                                 "advantages": [0.0, 0.0, 1.0, 1.0]})
ppo = tc.forward_backward([rl], "ppo", loss_fn_config={"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).result()
assert ppo.metrics["loss:sum"] < 0, ppo.metrics
tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
# A bad datum is named, and the calls after it still run.
try:
    tc.forward_backward([rl], "cross_entropy").result()
    raise SystemExit("accepted advantages for cross_entropy")
except tinker.BadRequestError as e:
    assert "data[0].loss_fn_inputs" in str(e), str(e)
def loss_now(client):
    return client.forward([datum], "cross_entropy").result().metrics["loss:sum"]
# The training state (weights and Adam's moments) saved, loaded back, and started from.
state_path = tc.save_state("c1").result().path
assert state_path.startswith("tinker://tinkjob-") and state_path.endswith("/weights/c1"), state_path
saved_loss = loss_now(tc)
fork = sc.create_training_client_from_state_with_optimizer(state_path)
assert abs(loss_now(fork) - saved_loss) < 1e-4, (loss_now(fork), saved_loss)
for client in (tc, fork):
    client.forward_backward([datum], "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
assert abs(loss_now(fork) - loss_now(tc)) < 1e-4, "the same state takes the same step"
assert loss_now(tc) != saved_loss
tc.load_state(state_path).result()
assert abs(loss_now(tc) - saved_loss) < 1e-4, (loss_now(tc), saved_loss)
try:
    tc.load_state("tinker://nowhere/weights/c1").result()
    raise SystemExit("loaded from nowhere")
except tinker.BadRequestError as e:
    assert "path" in str(e), str(e)
assert loss_now(tc) > 0
# The run and its saved weights, as the SDK's RestClient lists them.
rc = tinker.RestClient(**connection)
run_id = path.split("/")[2]
runs = rc.list_training_runs().result()
assert run_id in [r.training_run_id for r in runs.training_runs] and len(runs.training_runs) == 2, runs
run = rc.get_training_run(run_id).result()
assert run.base_model == "tiny-llama" and run.is_lora and run.lora_rank == 4, run
assert run.last_sampler_checkpoint is not None, run
saved = rc.list_checkpoints(run_id).result().checkpoints
kinds = {c.tinker_path: c.checkpoint_type for c in saved}
assert kinds[path] == "sampler" and kinds[state_path] == "training", saved
# Weights saved as a Hugging Face folder (a PEFT adapter here), each file behind a signed URL,
# listed and managed like any save; encryption is refused by name.
import urllib.request
ext = tc.save_weights_external("e1").result().path
assert ext.startswith("tinker://tinkjob-") and ext.endswith("/external_weights/e1"), ext
urls = rc.get_external_weights_urls(ext).result().urls
assert "adapter_model.safetensors" in urls and "trainer_state.safetensors" not in urls, urls
adapter = json.load(urllib.request.urlopen(urls["adapter_config.json"]))
assert adapter["r"] == 4, adapter
listed = {c.tinker_path: c.checkpoint_type for c in rc.list_checkpoints(run_id).result().checkpoints}
assert listed[ext] == "external", listed
try:
    rc.get_external_weights_urls(ext[:-2] + "nope").result()
    raise SystemExit("URLs of nothing")
except tinker.NotFoundError:
    pass
try:
    tc.save_weights_external("e2", age_encryption_recipients=["age1qqq"]).result()
    raise SystemExit("accepted encryption")
except tinker.BadRequestError as e:
    assert "age_encryption_recipients" in str(e), str(e)
# Saves that expire (the SDK's `ttl_seconds`), as RestClient lists them; an expiry set, removed,
# and out of range refused by name (on a save, and the later calls still run).
import datetime
tc.forward_backward([datum], "cross_entropy")
tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()  # a state no other save holds
short = tc.save_weights_for_sampler("short", ttl_seconds=7200).result().path
listed = {c.tinker_path: c for c in rc.list_checkpoints(run_id).result().checkpoints}
assert listed[path].expires_at is None, listed[path]
left = (listed[short].expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
assert 7000 < left <= 7200, left
rc.set_checkpoint_ttl_from_tinker_path(path, 86400).result()
rc.set_checkpoint_ttl_from_tinker_path(short, None).result()
listed = {c.tinker_path: c for c in rc.list_checkpoints(run_id).result().checkpoints}
assert listed[short].expires_at is None and listed[path].expires_at is not None, listed
for bad in (lambda: rc.set_checkpoint_ttl_from_tinker_path(short, 60).result(),
            lambda: tc.save_state("soon", ttl_seconds=10).result()):
    try:
        bad()
        raise SystemExit("accepted a ttl of seconds")
    except tinker.BadRequestError as e:
        assert "ttl_seconds" in str(e), str(e)
assert loss_now(tc) > 0
print("EXPIRING " + short)
# The session that opened both clients, as the SDK's RestClient shows it.
sessions = rc.list_sessions().result().sessions
opened = {s: rc.get_session(s).result() for s in sessions}
owners = [s for s, info in opened.items() if run_id in info.training_run_ids]
assert len(owners) == 1 and len(opened[owners[0]].training_run_ids) == 2, opened
sc.close("success").result()
print("SDK OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_tinker_sdk_trains_on_a_training_worker_and_its_weights_are_a_verity_model(
    pool: PgPool,
) {
    let Some(python) = tinker_python() else { return };
    let stack = stack(pool.clone()).await;
    // Two workers holding one client each: the script makes a second from saved state.
    let workers = training_workers(&pool, &stack, 2, 1, None).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let stdout = run_sdk(&python, TINKER_TRAINING_SCRIPT, &stack, &[("KEY", &key)]).await;
    // One trainer underneath: the sampler's log-probabilities of the trained weights are the
    // training client's own `forward` on the same tokens.
    let json_line = |prefix: &str| -> Value {
        serde_json::from_str(stdout.lines().find_map(|l| l.strip_prefix(prefix)).unwrap()).unwrap()
    };
    let sampled: Vec<f32> =
        serde_json::from_value(json_line("SAMPLED ")["logprobs"].clone()).unwrap();
    let forward: Vec<f32> = serde_json::from_value(json_line("FORWARD ")).unwrap();
    assert_eq!(sampled.len(), 2);
    for (s, f) in sampled.iter().zip(&forward[2..]) {
        assert!((s - f).abs() < 1e-3, "sampler {sampled:?} vs trainer {forward:?}");
    }
    // The saved weights are a Verity model: served by /v1/chat/completions under their name.
    let (job_id, model): (String, String) =
        sqlx::query_as("SELECT m.job_id, c.model FROM tinker_checkpoints c JOIN tinker_models m ON m.id = c.model_id WHERE c.path LIKE '%/s1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(model.starts_with("ft:tiny-llama:") && model.contains(&job_id), "{model}");
    let messages = json!([{"role": "user", "content": "t5"}]);
    let (status, reply) =
        chat(&stack, &key, json!({"model": model, "messages": messages, "max_tokens": 2})).await;
    assert_eq!(status, 200, "{reply}");
    // A path whose time has passed is deleted by the server's sweep, its files with it (no other
    // path holds its checkpoint); the others stay.
    let short = stdout.lines().find_map(|l| l.strip_prefix("EXPIRING ")).unwrap();
    let (job, step): (String, i32) = sqlx::query_as(
        "SELECT m.job_id, t.step FROM tinker_checkpoints t JOIN tinker_models m ON m.id = t.model_id \
         WHERE t.path = $1",
    )
    .bind(short)
    .fetch_one(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE tinker_checkpoints SET expires_at = now() - interval '1 second' WHERE path = $1",
    )
    .bind(short)
    .execute(&pool)
    .await
    .unwrap();
    let store = LocalStore::open(stack.dir.path().join("objects"), None).await.unwrap();
    let deleted = verity_server::api::tinker::delete_expired_weights(&pool, &store).await.unwrap();
    assert_eq!(deleted, 1);
    let left: Vec<String> =
        sqlx::query_scalar("SELECT path FROM tinker_checkpoints").fetch_all(&pool).await.unwrap();
    assert!(!left.iter().any(|p| p == short) && left.len() >= 3, "{left:?}");
    let files: Option<String> = sqlx::query_scalar(
        "SELECT storage_prefix FROM checkpoints WHERE job_id = $1 AND step = $2",
    )
    .bind(&job)
    .bind(step)
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(files, None, "the expired path's checkpoint went with it");
    // The SDK closed its session: the workers released both clients.
    all_clients_end(&pool, 2).await;
    stop(&stack, workers).await;
}

/// The Python with the Tinker SDK (`VERITY_TEST_TINKER_PYTHON`), or `None` after saying that
/// the test is skipped.
fn tinker_python() -> Option<String> {
    let python = std::env::var("VERITY_TEST_TINKER_PYTHON").ok();
    if python.is_none() {
        eprintln!(
            "SKIPPED: VERITY_TEST_TINKER_PYTHON is not set (source scripts/test-services.sh)"
        );
    }
    python
}

/// Shuts `stack` down and waits for its training `workers` to stop.
async fn stop(stack: &Stack, workers: Vec<tokio::task::JoinHandle<usize>>) {
    stack.shutdown.cancel();
    for worker in workers {
        let _ = worker.await;
    }
}

/// Training workers beside `stack`'s inference worker, each holding up to `clients` Tinker
/// clients at a time; `idle` parks a client after that long without a call.
async fn training_workers(
    pool: &PgPool,
    stack: &Stack,
    count: usize,
    clients: usize,
    idle: Option<Duration>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(stack.dir.path().join("objects"), None).await.unwrap());
    let mut handler = verity_worker::job::TrainingHandler::new(
        store,
        verity_worker::job::TrainingHandlerConfig {
            cache_dir: stack.dir.path().join("training-cache"),
            device: candle_core::Device::Cpu,
            grader_workers: 1,
        },
    );
    if let Some(idle) = idle {
        handler = handler.with_tinker_idle(idle);
    }
    let handler = Arc::new(handler);
    (0..count)
        .map(|_| {
            tokio::spawn(verity_core::queue::run_worker(
                Queue::new(pool.clone(), QueueSettings::default()),
                WorkerInfo::new(DeviceKind::Cpu, 4096),
                handler.clone(),
                verity_core::queue::RunnerOptions {
                    shared: Some(SharedKind { kind: "tinker".into(), max: clients }),
                    ..Default::default()
                },
                stack.shutdown.clone(),
            ))
        })
        .collect()
}

/// Waits until the `count` Tinker clients have all ended `succeeded` (their session closed).
async fn all_clients_end(pool: &PgPool, count: usize) {
    let started = Instant::now();
    loop {
        let states: Vec<String> =
            sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'tinker' ORDER BY id")
                .fetch_all(pool)
                .await
                .unwrap();
        if states.len() == count && states.iter().all(|s| s == "succeeded") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the clients are {states:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An idle training client is parked and comes back exactly as it was (docs/tinker.md): two
/// steps, the state saved; idle past the limit, so its worker saves it and frees itself (the
/// script waits until its run says `paused`); the
/// next call restores it (the same loss, and the same next step as a client started from the
/// saved state with its optimizer); then a rewind to the saved state and a different step saves
/// beside the earlier save, not over it; `weights_info` of a path; deleting paths (a checkpoint
/// another path still holds stays). Prints the saved paths as `PATHS {json}` and each one's
/// Verity model before the deletes as `SAVED {json}`.
const TINKER_PARKING_SCRIPT: &str = r#"
import json, os, time, tinker, urllib.request
from tinker import types
connection = dict(base_url=os.environ["VERITY_BASE"], api_key="tml-" + os.environ["KEY"])
sc = tinker.ServiceClient(**connection)
def rest(path):
    request = urllib.request.Request(os.environ["VERITY_BASE"] + path,
                                     headers={"X-API-Key": "tml-" + os.environ["KEY"]})
    return json.load(urllib.request.urlopen(request))
tc = sc.create_lora_training_client(base_model="tiny-llama", rank=4).result()
tokens = [5, 9, 12, 3, 7]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 4})
def step(client, lr=2e-2):
    client.forward_backward([datum], "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=lr)).result()
def loss_now(client):
    return client.forward([datum], "cross_entropy").result().metrics["loss:sum"]
for _ in range(2):
    step(tc)
state = tc.save_state("s2").result().path
sampler = tc.save_weights_for_sampler("a2").result().path
before = loss_now(tc)
run_id = state.split("/")[2]
deadline = time.time() + 120
while rest("/api/v1/training_runs/" + run_id)["verity_state"] != "paused":
    assert time.time() < deadline, "the idle client was never parked"
    time.sleep(0.1)
after = loss_now(tc)
assert abs(after - before) < 1e-5, (after, before)
fork = sc.create_training_client_from_state_with_optimizer(state)
for client in (tc, fork):
    step(client)
assert abs(loss_now(fork) - loss_now(tc)) < 1e-4, (loss_now(fork), loss_now(tc))
c3 = tc.save_weights_for_sampler("c3").result().path
tc.load_state_with_optimizer(state).result()
assert abs(loss_now(tc) - before) < 1e-5, (loss_now(tc), before)
step(tc, lr=5e-2)
d3 = tc.save_weights_for_sampler("d3").result().path
print("PATHS " + json.dumps({"state": state, "sampler": sampler, "c3": c3, "d3": d3}))
saved = rest("/api/v1/training_runs/" + run_id + "/checkpoints")["checkpoints"]
print("SAVED " + json.dumps({c["tinker_path"]: c["verity_model"] for c in saved}))
rc = tinker.RestClient(**connection)
info = rc.get_weights_info_by_tinker_path(state).result()
assert info.base_model == "tiny-llama" and info.is_lora and info.lora_rank == 4, info
rc.delete_checkpoint_from_tinker_path(sampler).result()
rc.delete_checkpoint_from_tinker_path(c3).result()
listed = [c.tinker_path for c in rc.list_checkpoints(run_id).result().checkpoints]
assert sampler not in listed and c3 not in listed and state in listed and d3 in listed, listed
try:
    rc.get_weights_info_by_tinker_path(c3).result()
    raise SystemExit("weights_info of a deleted path")
except tinker.NotFoundError:
    pass
tc.load_state(state).result()
assert abs(loss_now(tc) - before) < 1e-5, (loss_now(tc), before)
sc.close("success").result()
print("SDK OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_idle_tinker_client_is_parked_and_comes_back_as_it_was(pool: PgPool) {
    let Some(python) = tinker_python() else { return };
    let stack = stack(pool.clone()).await;
    let idle = Duration::from_secs(1);
    let workers = training_workers(&pool, &stack, 2, 1, Some(idle)).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let stdout = run_sdk(&python, TINKER_PARKING_SCRIPT, &stack, &[("KEY", &key)]).await;
    let paths: Value = serde_json::from_str(
        stdout.lines().find_map(|l| l.strip_prefix("PATHS ")).expect("the script's paths"),
    )
    .unwrap();
    let models: Value = serde_json::from_str(
        stdout.lines().find_map(|l| l.strip_prefix("SAVED ")).expect("the saved models"),
    )
    .unwrap();
    // The checkpoint under each path, from its model's name (`…:ckpt-step-<N>`).
    let saved_at = |path: &Value| -> i32 {
        let model = models[path.as_str().unwrap()].as_str().unwrap();
        model.rsplit("ckpt-step-").next().unwrap().parse().unwrap()
    };
    // Saves are numbered by the optimizer step, two saves of one state sharing a checkpoint
    // ("c3" would be 4 had "a2" taken 3); the rewound third step is a new checkpoint beside
    // the first third step's.
    assert_eq!(saved_at(&paths["state"]), 2);
    assert_eq!(saved_at(&paths["sampler"]), 2);
    assert_eq!(saved_at(&paths["c3"]), 3);
    let d3 = saved_at(&paths["d3"]);
    assert!(d3 > 3, "the rewound step was saved over checkpoint {d3}");
    // The deleted paths: checkpoint 3 (its only path) is gone with its files; checkpoint 2
    // stays, "s2" still holding it.
    let run = paths["state"].as_str().unwrap().split('/').nth(2).unwrap().to_string();
    let steps: Vec<i32> =
        sqlx::query_scalar("SELECT step FROM checkpoints WHERE job_id = $1 ORDER BY step")
            .bind(&run)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(steps.contains(&2) && steps.contains(&d3) && !steps.contains(&3), "{steps:?}");
    let objects = stack.dir.path().join("objects").join(verity_core::keys::checkpoint(&run, 3));
    assert!(!objects.join("manifest.json").exists(), "{} is still there", objects.display());
    // The client was parked (its row paused, its worker freed) and claimed again.
    let transitions: Vec<String> = sqlx::query_scalar(
        "SELECT message FROM job_events WHERE job_id = $1 AND kind = 'state' ORDER BY id",
    )
    .bind(&run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(transitions.iter().any(|t| t == "running -> paused"), "{transitions:?}");
    assert!(transitions.iter().any(|t| t == "paused -> queued"), "{transitions:?}");
    // The session closed: held clients end as before, parked ones end with it.
    all_clients_end(&pool, 2).await;
    stop(&stack, workers).await;
}

/// One org's loop for [`two_orgs_train_side_by_side_on_one_worker`]: a LoRA client, its first
/// loss, then it says it is `READY` and waits for the other org's client to be up too (with a
/// worker holding one client at a time, the second would wait for the first to end: a
/// deadlock, caught by the deadline); three steps, which lower the loss; a save for sampling.
const TINKER_SIDE_BY_SIDE_SCRIPT: &str = r#"
import os, time, tinker
from tinker import types
sc = tinker.ServiceClient(base_url=os.environ["VERITY_BASE"], api_key="tml-" + os.environ["KEY"])
tc = sc.create_lora_training_client(base_model="tiny-llama", rank=4, seed=int(os.environ["SEED"]))
tokens = [5, 9, 12, 3, 7]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 4})
def loss():
    return tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
first = loss()
open(os.environ["READY"], "w").close()
deadline = time.time() + 120
while not os.path.exists(os.environ["OTHER_READY"]):
    assert time.time() < deadline, "the other org's client never came up"
    time.sleep(0.05)
for _ in range(3):
    tc.forward_backward([datum], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
last = loss()
assert last < first, (first, last)
print("PATH " + tc.save_weights_for_sampler("side").result().path)
sc.close("success").result()
print("SDK OK")
"#;

/// Two orgs' Tinker clients are held by one training worker side by side (docs/tinker.md,
/// "Scheduling"): both train at once, each on its own weights, and both runs are their org's
/// alone.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn two_orgs_train_side_by_side_on_one_worker(pool: PgPool) {
    let Some(python) = tinker_python() else { return };
    let stack = stack(pool.clone()).await;
    let workers = training_workers(&pool, &stack, 1, 2, None).await;
    let key_a = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let key_b = api_support::user(&pool, "b@y.io", "org-b", "member").await;
    let flags = tempfile::tempdir().unwrap();
    let ready = |name: &str| flags.path().join(name).display().to_string();
    let (ready_a, ready_b) = (ready("a"), ready("b"));
    let env_a =
        [("KEY", key_a.as_str()), ("SEED", "1"), ("READY", &ready_a), ("OTHER_READY", &ready_b)];
    let env_b =
        [("KEY", key_b.as_str()), ("SEED", "2"), ("READY", &ready_b), ("OTHER_READY", &ready_a)];
    // Bounded: with a worker holding one client, the second org's `create_model` would wait
    // for the first client's session, which waits for the second client.
    let both = async {
        tokio::join!(
            run_sdk(&python, TINKER_SIDE_BY_SIDE_SCRIPT, &stack, &env_a),
            run_sdk(&python, TINKER_SIDE_BY_SIDE_SCRIPT, &stack, &env_b),
        )
    };
    let (out_a, out_b) = tokio::time::timeout(Duration::from_secs(300), both)
        .await
        .expect("the two orgs' loops did not both finish within 5 minutes");
    let path = |out: &str| out.lines().find_map(|l| l.strip_prefix("PATH ")).unwrap().to_string();
    let (path_a, path_b) = (path(&out_a), path(&out_b));
    // One worker claimed both, and held them at once (until their sessions closed).
    all_clients_end(&pool, 2).await;
    let rows: Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as(
            "SELECT org_id, claimed_at, finished_at FROM jobs WHERE kind = 'tinker' ORDER BY claimed_at",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_ne!(rows[0].0, rows[1].0, "{rows:?}");
    assert!(rows[1].1 < rows[0].2, "the second client was claimed after the first ended: {rows:?}");
    // Each org's saved weights are its own: the other org cannot see them.
    let run_of = |path: &str| path.split('/').nth(2).unwrap().to_string();
    let run_status = |path: &str| {
        let url = format!("{}/api/v1/training_runs/{}", stack.base, run_of(path));
        let key = format!("tml-{key_a}");
        async move {
            let request = reqwest::Client::new().get(url).header("X-API-Key", key);
            request.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(run_status(&path_a).await, 200);
    assert_eq!(run_status(&path_b).await, 404);
    stop(&stack, workers).await;
}

/// Publishing (docs/tinker.md, "Publishing"), with the official SDK as two orgs: the owner's
/// saved paths are invisible to the reader until published; then the reader samples them (the
/// owner's tokens), reads what they are and starts its own client from them; only the owner
/// unpublishes or deletes, and once unpublished the reader's open sampler stops.
const TINKER_PUBLISH_SCRIPT: &str = r#"
import os, tinker
from tinker import types
base = os.environ["VERITY_BASE"]
def clients(key):
    connection = dict(base_url=base, api_key="tml-" + key)
    return tinker.ServiceClient(**connection), tinker.RestClient(**connection)
owner, owner_rest = clients(os.environ["KEY"])
reader, reader_rest = clients(os.environ["OTHER_KEY"])
tc = owner.create_lora_training_client(base_model="tiny-llama", rank=4)
tokens = [5, 9, 12, 3, 7]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 4})
for _ in range(3):
    tc.forward_backward([datum], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
state = tc.save_state("pub").result().path
sampler_path = tc.save_weights_for_sampler("pub").result().path
run_id = state.split("/")[2]
prompt = types.ModelInput.from_ints(tokens[:3])
greedy = types.SamplingParams(max_tokens=2, temperature=0.0, stop=[])
def sample(client):
    return client.sample(prompt=prompt, num_samples=1, sampling_params=greedy).result().sequences[0]
own = sample(owner.create_sampling_client(model_path=sampler_path))
def refused(call, error, needle):
    try:
        call()
    except error as e:
        assert needle in str(e), str(e)
        return
    raise SystemExit("not refused: " + needle)
read_sampler = lambda: sample(reader.create_sampling_client(model_path=sampler_path))
# Private: the reader can neither read nor publish the owner's paths.
refused(read_sampler, tinker.BadRequestError, "model_path")
refused(lambda: reader_rest.get_weights_info_by_tinker_path(state).result(), tinker.NotFoundError, "checkpoint")
refused(lambda: reader_rest.publish_checkpoint_from_tinker_path(state).result(), tinker.NotFoundError, "checkpoint")
# Published (twice is fine): the reader samples the owner's weights, reads what they are, and
# starts its own client from the saved state.
for path in (sampler_path, state, state):
    owner_rest.publish_checkpoint_from_tinker_path(path).result()
public = {c.tinker_path: c.public for c in owner_rest.list_checkpoints(run_id).result().checkpoints}
assert public[state] and public[sampler_path], public
theirs = reader.create_sampling_client(model_path=sampler_path)
assert sample(theirs).tokens == own.tokens
info = reader_rest.get_weights_info_by_tinker_path(state).result()
assert info.base_model == "tiny-llama" and info.lora_rank == 4, info
fork = reader.create_training_client_from_state_with_optimizer(state)
loss = lambda client: client.forward([datum], "cross_entropy").result().metrics["loss:sum"]
assert abs(loss(fork) - loss(tc)) < 1e-4, (loss(fork), loss(tc))
fork_path = fork.save_state("mine").result().path
assert fork_path.split("/")[2] != run_id, fork_path
# The owner's run stays private, and only the owner deletes or unpublishes.
refused(lambda: reader_rest.get_training_run(run_id).result(), tinker.NotFoundError, "training run")
refused(lambda: reader_rest.delete_checkpoint_from_tinker_path(state).result(), tinker.NotFoundError, "checkpoint")
refused(lambda: reader_rest.unpublish_checkpoint_from_tinker_path(sampler_path).result(), tinker.NotFoundError, "checkpoint")
# Unpublished: the reader's open sampler stops at its next sample; the owner's samples on.
owner_rest.unpublish_checkpoint_from_tinker_path(sampler_path).result()
refused(lambda: sample(theirs), tinker.BadRequestError, "no longer published")
refused(read_sampler, tinker.BadRequestError, "model_path")
assert sample(owner.create_sampling_client(model_path=sampler_path)).tokens == own.tokens
print("FORK " + fork_path)
owner.close("success").result()
reader.close("success").result()
print("SDK OK")
"#;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_published_path_is_read_by_other_orgs_until_unpublished(pool: PgPool) {
    let Some(python) = tinker_python() else { return };
    let stack = stack(pool.clone()).await;
    let workers = training_workers(&pool, &stack, 1, 2, None).await;
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let other_key = api_support::user(&pool, "b@y.io", "org-b", "member").await;
    let env = [("KEY", key.as_str()), ("OTHER_KEY", other_key.as_str())];
    let stdout = run_sdk(&python, TINKER_PUBLISH_SCRIPT, &stack, &env).await;
    // The reader's fork is a run of the reader's org, started from the owner's checkpoint.
    let fork = stdout.lines().find_map(|l| l.strip_prefix("FORK ")).unwrap();
    let (fork_org, owner_org): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "SELECT f.org_id, o.org_id FROM tinker_checkpoints f, tinker_checkpoints o \
         WHERE f.path = $1 AND o.path LIKE '%/weights/pub'",
    )
    .bind(fork)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(fork_org, org_of(&pool, "b@y.io").await);
    assert_eq!(owner_org, org_of(&pool, "a@x.io").await);
    let public: Vec<(String, bool)> = sqlx::query_as(
        "SELECT kind, public FROM tinker_checkpoints WHERE org_id = $1 ORDER BY kind",
    )
    .bind(owner_org)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(public, [("sampler".to_string(), false), ("training".to_string(), true)]);
    all_clients_end(&pool, 2).await;
    stop(&stack, workers).await;
}
