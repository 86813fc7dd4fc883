//! `verity checkpoints download`: a checkpoint's files, checked against its manifest.

use super::{byte_bar, field, Client, ClientArgs};
use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use tokio::io::AsyncWriteExt;
use verity_core::storage::{Manifest, MANIFEST};

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
    },
}

/// Runs a checkpoint command.
pub async fn run(args: &CheckpointsArgs) -> anyhow::Result<()> {
    let client = Client::from_args(&args.client)?;
    match &args.command {
        CheckpointsCommand::Download { job, step, out } => {
            let manifest = download(&client, job, *step, out, true).await?;
            println!(
                "{} files, {} bytes, verified, in {}",
                manifest.files.len(),
                manifest.total_bytes,
                out.display()
            );
            Ok(())
        }
    }
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

/// Downloads the checkpoint into `out`, then checks every file's size and SHA-256 against the
/// manifest (written as `out/manifest.json`).
pub async fn download(
    client: &Client,
    job: &str,
    step: Option<i64>,
    out: &Path,
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
    tokio::fs::create_dir_all(out).await.with_context(|| format!("creating {}", out.display()))?;

    let response = client.send(client.request(reqwest::Method::GET, &base)).await?;
    let bar = if progress {
        byte_bar(response.content_length(), &format!("downloading {id}"))
    } else {
        indicatif::ProgressBar::hidden()
    };
    let archive = out.join(format!(".{id}.tar.part"));
    let mut file = tokio::fs::File::create(&archive)
        .await
        .with_context(|| format!("creating {}", archive.display()))?;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("downloading the checkpoint")?;
        file.write_all(&chunk).await.with_context(|| format!("writing {}", archive.display()))?;
        bar.inc(chunk.len() as u64);
    }
    file.flush().await?;
    drop(file);
    bar.finish_and_clear();

    let (archive_path, dir, expected) = (archive.clone(), out.to_path_buf(), manifest.clone());
    let unpacked =
        tokio::task::spawn_blocking(move || unpack_and_verify(&archive_path, &dir, &expected))
            .await?;
    let _ = tokio::fs::remove_file(&archive).await;
    unpacked?;
    let text = serde_json::to_vec_pretty(&manifest)?;
    tokio::fs::write(out.join(MANIFEST), text).await?;
    Ok(manifest)
}

/// Unpacks the archive's `<checkpoint>/<path>` entries as `dir/<path>` and verifies them.
fn unpack_and_verify(archive: &Path, dir: &Path, manifest: &Manifest) -> anyhow::Result<()> {
    let file = std::fs::File::open(archive)?;
    let mut tar = tar::Archive::new(file);
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let relative: PathBuf = path.components().skip(1).collect();
        if relative.as_os_str().is_empty()
            || relative.components().any(|c| !matches!(c, Component::Normal(_)))
        {
            bail!("unexpected path {} in the archive", path.display());
        }
        let target = dir.join(&relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::File::create(&target)
            .with_context(|| format!("creating {}", target.display()))?;
        std::io::copy(&mut entry, &mut out)?;
    }
    for expected in &manifest.files {
        let path = dir.join(&expected.path);
        let mut file = std::fs::File::open(&path)
            .with_context(|| format!("{} is missing from the download", expected.path))?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            size += n as u64;
            hasher.update(&buffer[..n]);
        }
        let sha = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>();
        if size != expected.size || sha != expected.sha256 {
            bail!("{} does not match the manifest ({size} bytes, sha256 {sha}; expected {} bytes, {})", expected.path, expected.size, expected.sha256);
        }
    }
    Ok(())
}
