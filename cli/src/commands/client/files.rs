//! `verity files upload|list`.

use super::{byte_bar, field, print_json, Client, ClientArgs};
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokio_util::io::ReaderStream;

/// `verity files …`.
#[derive(Debug, Args)]
pub struct FilesArgs {
    /// Server and key.
    #[command(flatten)]
    pub client: ClientArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: FilesCommand,
}

/// File commands.
#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// Upload a JSONL dataset (purpose fine-tune); prints its id, or the line that is wrong.
    Upload {
        /// The JSONL file.
        file: PathBuf,
    },
    /// List uploaded files, newest first.
    List,
}

/// Runs a file command.
pub async fn run(args: &FilesArgs) -> anyhow::Result<()> {
    let client = Client::from_args(&args.client)?;
    match &args.command {
        FilesCommand::Upload { file } => {
            let uploaded = upload(&client, file, true).await?;
            if args.client.json {
                print_json(&uploaded);
            } else {
                println!("{}", field(&uploaded, "id"));
            }
            Ok(())
        }
        FilesCommand::List => {
            let page = client.get_json("/v1/files?limit=100").await?;
            if args.client.json {
                print_json(&page);
                return Ok(());
            }
            for file in page["data"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{} bytes\t{}\t{}",
                    field(file, "id"),
                    field(file, "status"),
                    file["bytes"].as_i64().unwrap_or(0),
                    file["records"]
                        .as_i64()
                        .map_or_else(|| "-".to_string(), |n| format!("{n} rows")),
                    field(file, "filename")
                );
            }
            Ok(())
        }
    }
}

/// Streams `path` to `POST /v1/files` (with a progress bar when `progress`); fails with the
/// server's validation message when the file was rejected.
pub async fn upload(client: &Client, path: &Path, progress: bool) -> anyhow::Result<Value> {
    let file =
        tokio::fs::File::open(path).await.with_context(|| format!("opening {}", path.display()))?;
    let size = file.metadata().await.with_context(|| format!("reading {}", path.display()))?.len();
    let name = path
        .file_name()
        .map_or_else(|| "data.jsonl".to_string(), |n| n.to_string_lossy().into_owned());
    let bar = if progress {
        byte_bar(Some(size), &format!("uploading {name}"))
    } else {
        indicatif::ProgressBar::hidden()
    };
    let counter = bar.clone();
    let stream = ReaderStream::new(file).inspect(move |chunk| {
        if let Ok(bytes) = chunk {
            counter.inc(bytes.len() as u64);
        }
    });
    let body = reqwest::Body::wrap_stream(stream);
    upload_body(client, reqwest::multipart::Part::stream_with_length(body, size), &name)
        .await
        .inspect(|_| bar.finish_and_clear())
}

/// Uploads `bytes` as a file named `name` (no progress bar).
pub async fn upload_bytes(
    client: &Client,
    bytes: impl Into<std::borrow::Cow<'static, [u8]>>,
    name: &str,
) -> anyhow::Result<Value> {
    upload_body(client, reqwest::multipart::Part::bytes(bytes), name).await
}

async fn upload_body(
    client: &Client,
    part: reqwest::multipart::Part,
    name: &str,
) -> anyhow::Result<Value> {
    let part = part.file_name(name.to_string()).mime_str("application/jsonl")?;
    let form = reqwest::multipart::Form::new().text("purpose", "fine-tune").part("file", part);
    let response =
        client.send(client.request(reqwest::Method::POST, "/v1/files").multipart(form)).await?;
    let uploaded: Value = response.json().await.context("reading the server's answer")?;
    if uploaded["status"] != "processed" {
        bail!(
            "{name} was rejected: {} (file {})",
            field(&uploaded, "status_details"),
            field(&uploaded, "id")
        );
    }
    Ok(uploaded)
}
