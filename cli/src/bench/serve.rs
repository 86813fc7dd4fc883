//! `verity bench serve`: serving throughput under concurrent chat clients. Each level runs
//! `clients` clients at once, each sending `--requests` chat requests one after another, and
//! prints one JSON line: requests/s, generated tokens/s, time to first token and latency
//! (p50/p99). In-process it starts an inference engine (the one `verity inference` serves) on a
//! model folder and suppresses end-of-sequence tokens so that every answer has exactly
//! `--max-tokens` tokens; with `--url` it drives any OpenAI-compatible server over streamed
//! `/v1/chat/completions` instead.

use anyhow::{bail, Context};
use clap::Args;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verity_core::storage::{publish_folder, LocalStore, ObjectStore};
use verity_worker::inference::request::{
    GenerationEvent, GenerationParams, GenerationRequest, ModelSource, PromptInput,
};
use verity_worker::inference::{Engine, EngineConfig};
use verity_worker::ChatMessage;

/// Options of `verity bench serve`.
#[derive(Debug, Args)]
pub struct ServeBenchArgs {
    /// An HF model folder (in-process), or with `--url` the `model` name to request.
    #[arg(long)]
    pub model: String,
    /// Concurrent clients of each level.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub clients: Vec<usize>,
    /// Requests each client sends, one after another.
    #[arg(long, default_value_t = 4)]
    pub requests: usize,
    /// Tokens per answer (in-process: exactly, end-of-sequence suppressed).
    #[arg(long = "max-tokens", default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// An OpenAI-compatible server to drive instead (e.g. `http://127.0.0.1:8080`).
    #[arg(long)]
    pub url: Option<String>,
    /// Its API key (with `--url`).
    #[arg(long = "api-key", env = "VERITY_API_KEY")]
    pub api_key: Option<String>,
    /// In-process: the device (cpu, cuda or cuda:N).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// In-process: most sequences decoded together (`verity inference --max-batch`).
    #[arg(long = "max-batch", default_value_t = 32)]
    pub max_batch: usize,
    /// In-process: precision of the weights decoding reads (`verity inference --decode-dtype`).
    #[arg(long = "decode-dtype", value_enum, default_value_t)]
    pub decode_dtype: verity_core::spec::RolloutDtype,
}

/// The prompts clients cycle through (those of `bench/peers/gen_bench.py`).
fn prompt(i: usize) -> Vec<ChatMessage> {
    const PAIRS: [(u32, u32); 8] =
        [(3, 4), (10, 22), (7, 5), (41, 9), (0, 50), (33, 17), (25, 25), (12, 48)];
    let (a, b) = PAIRS[i % PAIRS.len()];
    vec![ChatMessage::new("user", format!("What is {a} + {b}?"))]
}

/// What one request measured.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Seconds to the first generated text.
    ttft: f64,
    /// Seconds to the end.
    latency: f64,
    /// Tokens generated.
    tokens: usize,
}

/// Where requests go.
enum Client {
    /// An engine in this process.
    Engine { engine: Arc<Engine>, source: ModelSource, bias: BTreeMap<u32, f32> },
    /// An OpenAI-compatible server.
    Http { http: reqwest::Client, url: String, key: String, model: String },
}

impl Client {
    /// Sends chat request `index` and measures it.
    async fn request(
        &self,
        index: usize,
        max_tokens: usize,
        temperature: f32,
    ) -> anyhow::Result<Sample> {
        let started = Instant::now();
        let mut first = None;
        let tokens = match self {
            Client::Engine { engine, source, bias } => {
                let request = GenerationRequest {
                    model: source.clone(),
                    prompt: PromptInput::Chat(prompt(index)),
                    params: GenerationParams {
                        temperature,
                        max_tokens: Some(max_tokens),
                        seed: index as u64,
                        logit_bias: bias.clone(),
                        ..GenerationParams::default()
                    },
                };
                let mut generation = engine.generate(request).await?;
                let mut tokens = 0;
                while let Some(event) = generation.events.recv().await {
                    match event {
                        GenerationEvent::Delta { .. } => {
                            first.get_or_insert_with(|| started.elapsed());
                        }
                        GenerationEvent::Finished { completion_tokens, .. } => {
                            tokens = completion_tokens;
                            break;
                        }
                        GenerationEvent::Failed { message } => {
                            bail!("generation failed: {message}")
                        }
                        GenerationEvent::Refused { param, message } => {
                            bail!("request refused ({param}): {message}")
                        }
                        GenerationEvent::Started { .. }
                        | GenerationEvent::PromptLogprobs { .. } => {}
                    }
                }
                tokens
            }
            Client::Http { http, url, key, model } => {
                let body = json!({
                    "model": model, "messages": prompt(index), "max_tokens": max_tokens,
                    "temperature": temperature, "seed": index, "stream": true,
                    "stream_options": {"include_usage": true},
                });
                let response = http
                    .post(format!("{}/v1/chat/completions", url.trim_end_matches('/')))
                    .bearer_auth(key)
                    .json(&body)
                    .send()
                    .await
                    .context("sending a chat request")?;
                if !response.status().is_success() {
                    let status = response.status();
                    bail!("HTTP {status}: {}", response.text().await.unwrap_or_default());
                }
                let (mut buffer, mut tokens) = (String::new(), 0);
                let mut body = response.bytes_stream();
                while let Some(chunk) = body.next().await {
                    buffer
                        .push_str(&String::from_utf8_lossy(&chunk.context("reading the stream")?));
                    while let Some(end) = buffer.find("\n\n") {
                        let event: String = buffer.drain(..end + 2).collect();
                        let Some(data) = event.trim().strip_prefix("data:").map(str::trim) else {
                            continue;
                        };
                        if data == "[DONE]" {
                            continue;
                        }
                        let chunk: Value = serde_json::from_str(data).context("an SSE event")?;
                        if let Some(error) = chunk.get("error") {
                            bail!("generation failed: {error}");
                        }
                        let text =
                            chunk.pointer("/choices/0/delta/content").and_then(Value::as_str);
                        if text.is_some_and(|t| !t.is_empty()) {
                            first.get_or_insert_with(|| started.elapsed());
                        }
                        if let Some(n) =
                            chunk.pointer("/usage/completion_tokens").and_then(Value::as_u64)
                        {
                            tokens = n as usize;
                        }
                    }
                }
                tokens
            }
        };
        let latency = started.elapsed();
        Ok(Sample {
            ttft: first.unwrap_or(latency).as_secs_f64(),
            latency: latency.as_secs_f64(),
            tokens,
        })
    }
}

/// The `q`-quantile (nearest rank) of sorted `values`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds, rounded to 0.1.
fn ms(seconds: f64) -> f64 {
    (seconds * 10_000.0).round() / 10.0
}

/// One level: `clients` concurrent clients, `requests` each; its JSON line.
async fn level(client: &Arc<Client>, clients: usize, args: &ServeBenchArgs) -> Value {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, requests) = (client.clone(), args.requests);
            let (max_tokens, temperature) = (args.max_tokens, args.temperature);
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(requests);
                for r in 0..requests {
                    samples.push(client.request(c * requests + r, max_tokens, temperature).await);
                }
                samples
            })
        })
        .collect();
    let (mut samples, mut failures) = (Vec::new(), Vec::new());
    for task in futures::future::join_all(tasks).await {
        for result in task.unwrap_or_else(|e| vec![Err(anyhow::anyhow!("client task: {e}"))]) {
            match result {
                Ok(sample) => samples.push(sample),
                Err(error) => failures.push(format!("{error:#}")),
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let sorted = |pick: fn(&Sample) -> f64| {
        let mut v: Vec<f64> = samples.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (ttft, latency) = (sorted(|s| s.ttft), sorted(|s| s.latency));
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let round = |v: f64| (v * 100.0).round() / 100.0;
    json!({
        "bench": "serve",
        "clients": clients,
        "requests": samples.len(),
        "failed": failures.len(),
        "first_failure": failures.first(),
        "max_tokens": args.max_tokens,
        "completion_tokens": tokens,
        "seconds": round(seconds),
        "requests_per_s": round(samples.len() as f64 / seconds),
        "tokens_per_s": round(tokens as f64 / seconds),
        "ttft_ms_p50": ms(quantile(&ttft, 0.5)),
        "ttft_ms_p99": ms(quantile(&ttft, 0.99)),
        "latency_ms_p50": ms(quantile(&latency, 0.5)),
        "latency_ms_p99": ms(quantile(&latency, 0.99)),
    })
}

/// The end-of-sequence ids of the model folder `dir`, each biased by -100 (never sampled).
fn suppress_eos(dir: &Path) -> anyhow::Result<BTreeMap<u32, f32>> {
    let config = verity_worker::ModelConfig::from_hf_file(&dir.join("config.json"))
        .with_context(|| format!("reading {}/config.json", dir.display()))?;
    let tokenizer = verity_worker::ChatTokenizer::from_hf_dir(dir, &config.eos_token_ids)
        .with_context(|| format!("reading the tokenizer of {}", dir.display()))?;
    Ok(tokenizer.eos_token_ids.iter().map(|&id| (id, -100.0)).collect())
}

/// An engine over a scratch store holding the model folder `dir`.
async fn local_engine(dir: &Path, args: &ServeBenchArgs, scratch: &Path) -> anyhow::Result<Client> {
    if !dir.join("config.json").is_file() {
        bail!(
            "--model {}: not an HF model folder (no config.json); use --url for a server",
            dir.display()
        );
    }
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(scratch.join("objects"), None).await?);
    publish_folder(store.as_ref(), dir, "models/bench").await.context("staging the model")?;
    let engine = Engine::new(
        store,
        EngineConfig {
            cache_dir: scratch.join("cache"),
            device: verity_worker::parse_device(&args.device)?,
            memory_budget_bytes: usize::MAX / 2,
            max_batch: args.max_batch.max(1),
            decode_dtype: args.decode_dtype,
            idle_unload: None,
        },
    );
    let source = ModelSource {
        base_prefix: "models/bench".into(),
        base_format: "hf".into(),
        merged: Vec::new(),
        checkpoint_prefix: None,
    };
    Ok(Client::Engine { engine: Arc::new(engine), source, bias: suppress_eos(dir)? })
}

/// Runs the benchmark, printing one JSON line per level.
pub async fn run(args: &ServeBenchArgs) -> anyhow::Result<()> {
    let scratch = std::env::temp_dir().join(format!("verity-bench-serve-{}", std::process::id()));
    let client = match &args.url {
        Some(url) => Client::Http {
            http: reqwest::Client::builder().timeout(Duration::from_secs(3600)).build()?,
            url: url.clone(),
            key: args.api_key.clone().context("--url needs --api-key (or VERITY_API_KEY)")?,
            model: args.model.clone(),
        },
        None => local_engine(&PathBuf::from(&args.model), args, &scratch).await?,
    };
    let client = Arc::new(client);
    // Warm-up: loads the model (and fills the allocator) outside the measured levels.
    client.request(0, args.max_tokens.min(8), args.temperature).await.context("warm-up request")?;
    for &clients in &args.clients {
        println!("{}", level(&client, clients.max(1), args).await);
    }
    if args.url.is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(ms(0.12345), 123.5);
    }
}
