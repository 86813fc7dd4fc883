//! The model benchmarks the `verity bench` command runs: `rollout` (decoding), `train-step`
//! (forward + backward + AdamW), `grpo-step` ([`grpo_step`]) and `learn` ([`learning`]), and what
//! they share: the model under test and the process's memory.

pub mod grpo_step;
pub mod learning;
pub mod sweep;

use crate::chat_template::ChatMessage;
use crate::device::{gpu_memory_peak_mib, parse_device, reset_gpu_memory_peak};
use crate::error::{Result, WorkerError};
use crate::loader::{load_model, LoadedModel};
use crate::model::compact::RolloutDtype;
use crate::optim::{AdamW, AdamWConfig, GradAccumulator};
use crate::sampler::{sample, SamplingParams};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The model a benchmark runs, and where.
#[derive(Debug, Clone)]
pub struct BenchModel {
    /// An HF folder or GGUF file; with `random_weights`, a folder holding only `config.json`
    /// and the tokenizer files.
    pub path: PathBuf,
    /// Device spec (`cpu`, `cuda:N`).
    pub device: String,
    /// Draw the weights at random from `config.json` instead of reading them: the shapes (and
    /// so the speed) of a model whose weights are not at hand, e.g. on a GPU machine without
    /// network access.
    pub random_weights: bool,
}

impl BenchModel {
    /// The model at `path` on the CPU, its weights read.
    pub fn cpu(path: &Path) -> Self {
        BenchModel { path: path.to_path_buf(), device: "cpu".into(), random_weights: false }
    }

    /// Loads the model onto its device.
    pub fn load(&self) -> Result<LoadedModel> {
        let device = parse_device(&self.device)?;
        if !self.random_weights {
            return load_model(&self.path, &device);
        }
        let config = crate::config::ModelConfig::from_hf_file(&self.path.join("config.json"))?;
        let tokenizer =
            crate::tokenizer::ChatTokenizer::from_hf_dir(&self.path, &config.eos_token_ids)?;
        let weights = crate::weights::random_weights(&config, 0, &device)?;
        let model = crate::model::Transformer::from_weights(config, weights, &device)?;
        Ok(LoadedModel { model, tokenizer })
    }

    /// What every benchmark reports about its model: path, device, compute dtype and size.
    pub fn describe(&self, lm: &LoadedModel) -> serde_json::Value {
        serde_json::json!({
            "model": self.path.display().to_string(),
            "device": self.device,
            "random_weights": self.random_weights,
            "compute_dtype": format!("{:?}", lm.model.compute_dtype()).to_lowercase(),
            "parameters": model_parameters(lm),
        })
    }
}

/// Parameters of the base model (the tied LM head counted once).
pub fn model_parameters(lm: &LoadedModel) -> usize {
    lm.model.named_weights().iter().map(|(_, v)| v.elem_count()).sum()
}

/// Adds the fields of `extra` (an object) to `report` (an object).
pub fn merge_json(mut report: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(r), serde_json::Value::Object(e)) = (report.as_object_mut(), extra) {
        r.extend(e);
    }
    report
}

/// Peak resident set size of this process in MiB (Linux `VmHWM`; 0 elsewhere).
pub fn peak_rss_mib() -> f64 {
    proc_status_mib("VmHWM:")
}

/// Current resident set size of this process in MiB (Linux `VmRSS`; 0 elsewhere).
pub fn rss_mib() -> f64 {
    proc_status_mib("VmRSS:")
}

fn proc_status_mib(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn bench_prompts(lm: &LoadedModel, batch: usize) -> Result<Vec<Vec<u32>>> {
    (0..batch)
        .map(|i| {
            let q = format!("What is {} + {}?", 3 + 7 * i, 11 + 5 * i);
            let text = lm.tokenizer.apply_chat_template(&[ChatMessage::new("user", q)], true)?;
            lm.tokenizer.encode(&text)
        })
        .collect()
}

/// What `verity bench rollout` decodes: `prompts` chat prompts × `samples` each, `batch` rows at
/// a time, `new_tokens` tokens per sample (EOS ignored unless `stop_at_eos`).
#[derive(Debug, Clone, Copy)]
pub struct RolloutBench {
    /// Rows decoded at once.
    pub batch: usize,
    /// Longest sample, in tokens.
    pub new_tokens: usize,
    /// Precision of the weights decoding reads.
    pub rollout_dtype: RolloutDtype,
    /// Prompts in all (0: `batch / samples`, one batch).
    pub prompts: usize,
    /// Samples per prompt.
    pub samples: usize,
    /// End a sample at EOS (lengths then differ: the tail continuous batching fills).
    pub stop_at_eos: bool,
    /// Decode the prompts in separate calls of `batch` rows each (each waits for its longest
    /// sample) instead of one continuous batch of `batch` rows.
    pub chunked: bool,
    /// Constrain every sample to a JSON object (constrained decoding's cost).
    pub json_object: bool,
}

impl RolloutBench {
    /// One batch of `batch` prompts, one sample each, `new_tokens` tokens, f32 weights.
    pub fn new(batch: usize, new_tokens: usize) -> Self {
        RolloutBench {
            batch,
            new_tokens,
            rollout_dtype: RolloutDtype::F32,
            prompts: 0,
            samples: 1,
            stop_at_eos: false,
            chunked: false,
            json_object: false,
        }
    }
}

/// `verity bench rollout`: samples chat prompts at temperature 1 as `bench` says and reports
/// throughput as JSON (`tokens_per_s`, `seconds`, `prefill_tokens`, `peak_rss_mib`,
/// `model_tflops`: 2 · parameters · generated tokens per second, ...).
pub fn bench_rollout(model: &BenchModel, bench: &RolloutBench) -> Result<serde_json::Value> {
    let RolloutBench {
        batch,
        new_tokens,
        rollout_dtype,
        samples,
        stop_at_eos,
        chunked,
        json_object,
        ..
    } = *bench;
    if batch == 0 || new_tokens == 0 || samples == 0 || samples > batch {
        return Err(WorkerError::InvalidArgument(
            "batch, new_tokens and samples must be at least 1, samples at most batch".into(),
        ));
    }
    let per_batch = batch / samples;
    let prompt_count = if bench.prompts == 0 { per_batch } else { bench.prompts };
    let lm = model.load()?;
    let prompts = bench_prompts(&lm, prompt_count)?;
    let constraint = if json_object {
        let format = verity_core::response_format::ResponseFormat::JsonObject;
        crate::constrained::OutputConstraint::compile(
            &format,
            &lm.tokenizer,
            lm.model.config.vocab_size,
        )?
    } else {
        None
    };
    let params = SamplingParams {
        n: samples,
        temperature: 1.0,
        max_new_tokens: new_tokens,
        seed: 1,
        rollout_dtype,
        max_batch_rows: batch,
        constraint,
        ..Default::default()
    };
    let eos: &[u32] = if stop_at_eos { &lm.tokenizer.eos_token_ids } else { &[] };
    let pad = lm.tokenizer.pad_id();
    let start = Instant::now();
    let out = if chunked {
        let mut out = Vec::new();
        for chunk in prompts.chunks(per_batch) {
            out.extend(sample(&lm.model, chunk, &params, eos, pad, None)?);
        }
        out
    } else {
        sample(&lm.model, &prompts, &params, eos, pad, None)?
    };
    lm.model.device().synchronize()?; // a GPU runs ahead of the host: time its work
    let secs = start.elapsed().as_secs_f64();
    let generated: usize = out.iter().map(|c| c.token_ids.len()).sum();
    let flops = 2.0 * model_parameters(&lm) as f64 * generated as f64;
    let report = serde_json::json!({
        "bench": "rollout",
        "batch": batch,
        "prompts": prompt_count,
        "samples": samples,
        "new_tokens": new_tokens,
        "stop_at_eos": stop_at_eos,
        "mode": if chunked { "chunked" } else { "continuous" },
        "json_object": json_object,
        "rollout_dtype": rollout_dtype,
        "generated_tokens": generated,
        "prefill_tokens": prompts.iter().map(Vec::len).sum::<usize>(),
        "seconds": secs,
        "tokens_per_s": generated as f64 / secs,
        "model_tflops": flops / secs / 1e12,
        "threads": rayon::current_num_threads(),
        "peak_rss_mib": peak_rss_mib(),
        "peak_gpu_mib": gpu_memory_peak_mib(lm.model.device()),
    });
    Ok(merge_json(report, model.describe(&lm)))
}

/// `verity bench train-step`: one training step (full fine-tuning, or LoRA of rank `lora_rank`
/// on every projection when it is > 0) on `batch` random sequences of
/// `seq_len` tokens (a quarter prompt, the rest scored completion): forward with gradients,
/// backward, gradient accumulation and an AdamW step, timed over `steps` steps after a warm-up.
/// Reports the median step's `seconds` (forward + backward + optimizer) with its parts, `peak_rss_mib` and the peak before
/// the optimizer's state existed (`peak_rss_fwd_bwd_mib`: what forward + backward alone need),
/// and `model_tflops`: 6 · parameters · tokens per second (4 · with LoRA: no weight gradients
/// of the base).
pub fn bench_train_step(
    bench_model: &BenchModel,
    (batch, seq_len): (usize, usize),
    steps: usize,
    lora_rank: usize,
) -> Result<serde_json::Value> {
    if batch == 0 || seq_len < 2 || steps == 0 {
        return Err(WorkerError::InvalidArgument(
            "batch and steps must be >= 1 and seq_len >= 2".into(),
        ));
    }
    let mut lm = bench_model.load()?;
    if lora_rank > 0 {
        let all_projections =
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
        let config = crate::model::lora::LoraConfig {
            r: lora_rank,
            lora_alpha: 2.0 * lora_rank as f64,
            target_modules: all_projections.map(String::from).to_vec(),
            lora_dropout: 0.0,
        };
        lm.model.enable_lora(config, 0)?;
    }
    let model = &lm.model;
    let vocab = model.config.vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let prompt_len = (seq_len / 4).max(1);
    let prompts: Vec<Vec<u32>> =
        (0..batch).map(|_| (0..prompt_len).map(|_| rng.random_range(0..vocab)).collect()).collect();
    let completions: Vec<Vec<u32>> = (0..batch)
        .map(|_| (0..seq_len - prompt_len).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    let params = model.trainable_params();
    // Made after the first forward + backward, whose peak is then that of those two alone.
    let mut opt = None;
    let mut acc = GradAccumulator::new(&params);
    let mut timings = Vec::new();
    let mut rss = (0.0, 0.0);
    let mut peak_fwd_bwd = None;
    let rss_loaded = rss_mib();
    let dev = model.device().clone();
    let gpu_loaded = gpu_memory_peak_mib(&dev);
    // The GPU memory pool's peak in the forward, the backward and the optimizer step.
    let mut gpu = [None; 3];
    let timings = verity_kernels::on_pool(|| -> Result<_> {
        for _ in 0..=steps {
            acc.reset();
            reset_gpu_memory_peak(&dev);
            let t0 = Instant::now();
            let (lp, tape) =
                model.completion_logprobs_layered(&prompts, &completions, &[], 1.0, 0)?;
            let n_tokens = lp.mask.sum_all()?.to_scalar::<f32>()?;
            let loss = ((lp.logprobs * lp.mask)?.sum_all()? / -(n_tokens as f64))?;
            model.device().synchronize()?;
            let t1 = Instant::now();
            rss.0 = rss_mib();
            gpu[0] = gpu_memory_peak_mib(&dev);
            reset_gpu_memory_peak(&dev);
            acc.accumulate_layered(&loss, tape, &params, 1.0)?;
            model.device().synchronize()?;
            rss.1 = rss_mib();
            gpu[1] = gpu_memory_peak_mib(&dev);
            reset_gpu_memory_peak(&dev);
            let t2 = Instant::now();
            peak_fwd_bwd.get_or_insert_with(peak_rss_mib);
            if opt.is_none() {
                let config = AdamWConfig { weight_decay: 0.01, ..Default::default() };
                opt = Some(AdamW::new(config, &params)?);
            }
            let (clip, _) = acc.clip_factor(1.0);
            if let Some(opt) = opt.as_mut() {
                opt.step(&params, &acc, 1e-5, clip)?;
            }
            model.device().synchronize()?;
            gpu[2] = gpu_memory_peak_mib(&dev);
            let t3 = Instant::now();
            timings.push((
                (t1 - t0).as_secs_f64(),
                (t2 - t1).as_secs_f64(),
                (t3 - t2).as_secs_f64(),
            ));
        }
        Ok(timings)
    })?;
    let warmup = timings[0];
    let mut measured = timings[1..].to_vec();
    measured.sort_by(|x, y| (x.0 + x.1 + x.2).total_cmp(&(y.0 + y.1 + y.2)));
    let (f, b, o) = measured[measured.len() / 2];
    let per_token = if lora_rank > 0 { 4.0 } else { 6.0 };
    let flops = per_token * model_parameters(&lm) as f64 * (batch * seq_len) as f64;
    let report = serde_json::json!({
        "bench": "train-step",
        "batch": batch,
        "seq_len": seq_len,
        "seconds": f + b + o,
        "forward_s": f,
        "backward_s": b,
        "optimizer_s": o,
        "steps": steps,
        "seconds_each": measured.iter().map(|(f, b, o)| f + b + o).collect::<Vec<_>>(),
        "warmup_seconds": warmup.0 + warmup.1 + warmup.2,
        "blas": verity_kernels::blas_core(),
        "lora_rank": lora_rank,
        "trainable_params": params.iter().map(|(_, v)| v.elem_count()).sum::<usize>(),
        "threads": rayon::current_num_threads(),
        "rss_after_load_mib": rss_loaded,
        "rss_after_forward_mib": rss.0,
        "rss_after_backward_mib": rss.1,
        "peak_rss_fwd_bwd_mib": peak_fwd_bwd,
        "peak_rss_mib": peak_rss_mib(),
        "gpu_after_load_mib": gpu_loaded,
        "peak_gpu_forward_mib": gpu[0],
        "peak_gpu_backward_mib": gpu[1],
        "peak_gpu_optimizer_mib": gpu[2],
        "model_tflops": flops / (f + b + o) / 1e12,
    });
    Ok(merge_json(report, bench_model.describe(&lm)))
}
