//! `verity checkpoints download`: a checkpoint's files, checked against its manifest;
//! `verity checkpoints export`: a checkpoint as a GGUF file for llama.cpp and Ollama.

use super::{byte_bar, field, Client, ClientArgs};
use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Component, Path, PathBuf};
use tokio::io::AsyncWriteExt;
use verity_core::storage::{Manifest, MANIFEST};
use verity_server::api::jobs::checkpoints::is_trainer_state;

/// `verity checkpoints …`.
#[derive(Debug, Args)]
pub struct CheckpointsArgs {
    /// Server and key.
    #[command(flatten)]
    pub client: ClientArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: CheckpointsCommand,
}

/// Checkpoint commands.
#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// Download a job's checkpoint (the latest unless --step) into a folder and verify it.
    Download {
        /// Job id.
        job: String,
        /// Training step of the checkpoint.
        #[arg(long)]
        step: Option<i64>,
        /// Output folder (created).
        #[arg(long)]
        out: PathBuf,
        /// Also fetch the optimizer state (`trainer_state.safetensors`), to resume training
        /// elsewhere; by default only what inference needs is downloaded.
        #[arg(long = "with-trainer-state")]
        with_trainer_state: bool,
    },
    /// Export a job's checkpoint (the latest unless --step) as a GGUF file for llama.cpp, Ollama
    /// or LM Studio (a LoRA adapter merged into its base first), with an Ollama Modelfile
    /// beside it (`FILE.Modelfile`).
    Export {
        /// Job id.
        job: String,
        /// Training step of the checkpoint.
        #[arg(long)]
        step: Option<i64>,
        /// File format (only `gguf`).
        #[arg(long, default_value = "gguf", value_parser = ["gguf"])]
        format: String,
        /// Precision: `f16`, `q8_0` or `q4_k_m` (llama-quantize's mix).
        #[arg(long, alias = "quantization", default_value = "q8_0")]
        quant: String,
        /// Output file (default `JOB-step-N.QUANT.gguf` here).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs a checkpoint command.
pub async fn run(args: &CheckpointsArgs) -> anyhow::Result<()> {
    let client = Client::from_args(&args.client)?;
    match &args.command {
        CheckpointsCommand::Download { job, step, out, with_trainer_state } => {
            let manifest = download(&client, job, *step, out, *with_trainer_state, true).await?;
            println!(
                "{} files, {} bytes, verified, in {}",
                manifest.files.len(),
                manifest.total_bytes,
                out.display()
            );
            Ok(())
        }
        CheckpointsCommand::Export { job, step, format: _, quant, out } => {
            let (gguf, modelfile) =
                export(&client, job, *step, quant, out.as_deref(), true).await?;
            println!("wrote {} and {}", gguf.display(), modelfile.display());
            println!("  llama.cpp: llama-cli -m {} -cnv", gguf.display());
            println!("  Ollama:    ollama create my-model -f {}", modelfile.display());
            Ok(())
        }
    }
}

/// Downloads the GGUF export of `job`'s checkpoint at `step` (latest when `None`) in `quant` to
/// `out` (default `JOB-step-N.QUANT.gguf`), and its Ollama Modelfile beside it (`FROM` naming
/// that file); returns both paths. The server builds the export on the first request.
pub async fn export(
    client: &Client,
    job: &str,
    step: Option<i64>,
    quant: &str,
    out: Option<&Path>,
    progress: bool,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let checkpoint = find(client, job, step).await?;
    let id = field(&checkpoint, "id").to_string();
    let step = checkpoint["step_number"].as_i64().unwrap_or_default();
    let gguf = out.map_or_else(
        || PathBuf::from(format!("{job}-step-{step}.{quant}.gguf")),
        Path::to_path_buf,
    );
    let url = format!("/v1/fine_tuning/jobs/{job}/checkpoints/{id}/gguf");
    let spinner = if progress {
        byte_bar(None, &format!("exporting {id} as {quant} (the server builds it once)"))
    } else {
        indicatif::ProgressBar::hidden()
    };
    spinner.enable_steady_tick(std::time::Duration::from_millis(250));
    let request = client.request(reqwest::Method::GET, &url).query(&[("quantization", quant)]);
    let response = client.send(request).await?;
    spinner.finish_and_clear();
    let bar = if progress {
        byte_bar(response.content_length(), &format!("downloading {}", gguf.display()))
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut part = gguf.clone().into_os_string();
    part.push(".part");
    let part = PathBuf::from(part);
    let mut file = tokio::fs::File::create(&part)
        .await
        .with_context(|| format!("creating {}", part.display()))?;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("downloading the GGUF file")?;
        file.write_all(&chunk).await.with_context(|| format!("writing {}", part.display()))?;
        bar.inc(chunk.len() as u64);
    }
    file.flush().await?;
    drop(file);
    bar.finish_and_clear();
    tokio::fs::rename(&part, &gguf)
        .await
        .with_context(|| format!("moving {} into place", gguf.display()))?;
    let request = client
        .request(reqwest::Method::GET, &url)
        .query(&[("quantization", quant), ("file", "modelfile")]);
    let text = client.send(request).await?.text().await.context("reading the Modelfile")?;
    let name = gguf.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let body = text.split_once('\n').map_or("", |(_, rest)| rest);
    let modelfile = gguf.with_extension("Modelfile");
    tokio::fs::write(&modelfile, format!("FROM ./{name}\n{body}"))
        .await
        .with_context(|| format!("writing {}", modelfile.display()))?;
    Ok((gguf, modelfile))
}

/// The checkpoint of `job` at `step` (latest when `None`).
pub async fn find(client: &Client, job: &str, step: Option<i64>) -> anyhow::Result<Value> {
    let mut after: Option<String> = None;
    loop {
        let query = after.as_ref().map_or_else(String::new, |a| format!("&after={a}"));
        let page = client
            .get_json(&format!("/v1/fine_tuning/jobs/{job}/checkpoints?limit=100{query}"))
            .await?;
        let data = page["data"].as_array().cloned().unwrap_or_default();
        let found = match step {
            None => data.first().cloned(),
            Some(step) => data.iter().find(|c| c["step_number"].as_i64() == Some(step)).cloned(),
        };
        if let Some(checkpoint) = found {
            return Ok(checkpoint);
        }
        if page["has_more"] != true || data.is_empty() {
            return Err(match step {
                Some(step) => anyhow!("job {job} has no checkpoint at step {step}"),
                None => anyhow!("job {job} has no checkpoints yet"),
            });
        }
        after = data.last().map(|c| field(c, "id").to_string());
    }
}

/// Downloads the checkpoint into `out` as its HF folder, file by file (weights only unless
/// `with_trainer_state`), checking each file's size and SHA-256 against the manifest while it
/// streams; the manifest of the files fetched is written as `out/manifest.json`.
pub async fn download(
    client: &Client,
    job: &str,
    step: Option<i64>,
    out: &Path,
    with_trainer_state: bool,
    progress: bool,
) -> anyhow::Result<Manifest> {
    let checkpoint = find(client, job, step).await?;
    let id = field(&checkpoint, "id").to_string();
    let base = format!("/v1/fine_tuning/jobs/{job}/checkpoints/{id}/content");
    let manifest_request =
        client.request(reqwest::Method::GET, &format!("{base}?redirect=1&path={MANIFEST}"));
    let manifest: Manifest = client
        .send(manifest_request)
        .await?
        .json()
        .await
        .context("reading the checkpoint's manifest")?;
    let manifest = manifest.only(|f| with_trainer_state || !is_trainer_state(&f.path));
    tokio::fs::create_dir_all(out).await.with_context(|| format!("creating {}", out.display()))?;
    let bar = if progress {
        byte_bar(Some(manifest.total_bytes), &format!("downloading {id}"))
    } else {
        indicatif::ProgressBar::hidden()
    };
    for entry in &manifest.files {
        let relative = Path::new(&entry.path);
        if relative.components().any(|c| !matches!(c, Component::Normal(_))) {
            bail!("unexpected path {:?} in the manifest", entry.path);
        }
        let target = out.join(relative);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        let mut part = target.clone().into_os_string();
        part.push(".part");
        let part = PathBuf::from(part);
        let request =
            client.request(reqwest::Method::GET, &base).query(&[("path", entry.path.as_str())]);
        let response = client.send(request).await?;
        let mut file = tokio::fs::File::create(&part)
            .await
            .with_context(|| format!("creating {}", part.display()))?;
        let (mut hasher, mut size) = (Sha256::new(), 0u64);
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.with_context(|| format!("downloading {}", entry.path))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk).await.with_context(|| format!("writing {}", part.display()))?;
            bar.inc(chunk.len() as u64);
        }
        file.flush().await?;
        drop(file);
        let sha = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>();
        if size != entry.size || sha != entry.sha256 {
            let _ = tokio::fs::remove_file(&part).await;
            bail!(
                "{} does not match the manifest ({size} bytes, sha256 {sha}; expected {} bytes, {})",
                entry.path,
                entry.size,
                entry.sha256
            );
        }
        tokio::fs::rename(&part, &target)
            .await
            .with_context(|| format!("moving {} into place", target.display()))?;
    }
    bar.finish_and_clear();
    let text = serde_json::to_vec_pretty(&manifest)?;
    tokio::fs::write(out.join(MANIFEST), text).await?;
    Ok(manifest)
}
