//! A model from a Hugging Face-compatible hub (`verity models pull`, and the API's pulls that a
//! worker runs), fetched with the maintained Rust client (`hf-hub`) into the cache the user's
//! other tools share
//! (`HF_HOME`, `~/.cache/huggingface/hub` by default, the same layout as `huggingface_hub`),
//! each file checked against the SHA-256 the hub lists for it; [`crate::model_import`] then
//! imports it. `HF_ENDPOINT` names another hub (a mirror, an internal server); `HF_TOKEN` (or
//! the token file `huggingface-cli login` writes) opens gated and private models.
//!
//! The hub endpoints used: `GET /api/models/{repo}/revision/{revision}?blobs=true` (the commit
//! and the files, with each large file's SHA-256) and `GET /{repo}/resolve/{revision}/{file}`
//! with a `Range` header (hf-hub reads the commit from `X-Repo-Commit`, the blob's name from
//! `X-Linked-Etag` or `ETag` and the size from `Content-Range`, then fetches the bytes in ranges).

use anyhow::{bail, Context};
use hf_hub::api::tokio::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The hub's public address.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where models come from and where they are kept.
#[derive(Debug, Clone)]
pub struct Hub {
    /// The hub's base URL.
    pub endpoint: String,
    /// The `hub` cache folder (`$HF_HOME/hub`).
    pub cache: PathBuf,
    /// A token for gated and private models.
    pub token: Option<String>,
    /// Whether to draw progress bars.
    pub progress: bool,
    /// The most bytes one pull may fetch, as the hub lists the files' sizes (`None`: no limit,
    /// the operator's own `verity models pull`).
    pub max_bytes: Option<u64>,
}

/// `VERITY_PULL_MAX_GB`: the most a pull asked for through the API may fetch (default 64 GB, a
/// 30B-parameter model in bf16), so that an org admin cannot fill a worker's disk.
pub const PULL_MAX_GB_ENV: &str = "VERITY_PULL_MAX_GB";

/// The default of [`PULL_MAX_GB_ENV`].
const DEFAULT_PULL_MAX_GB: u64 = 64;

/// The limit of API pulls in bytes: [`PULL_MAX_GB_ENV`] if it is a whole number of GB, else the
/// default (with a warning).
pub fn api_pull_limit() -> u64 {
    let gb = match std::env::var(PULL_MAX_GB_ENV) {
        Err(_) => DEFAULT_PULL_MAX_GB,
        Ok(value) => value.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(%value, "{PULL_MAX_GB_ENV} is not a whole number of GB: using {DEFAULT_PULL_MAX_GB}");
            DEFAULT_PULL_MAX_GB
        }),
    };
    gb.saturating_mul(1_000_000_000)
}

impl Hub {
    /// The hub as the user's environment names it: `HF_ENDPOINT`, `HF_HOME`, `HF_TOKEN` (else
    /// the saved token file).
    pub fn from_env() -> Hub {
        let cache = Cache::from_env();
        let token =
            std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()).or_else(|| cache.token());
        Hub {
            endpoint: std::env::var("HF_ENDPOINT").unwrap_or_else(|_| DEFAULT_ENDPOINT.into()),
            cache: cache.path().clone(),
            token,
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            max_bytes: None,
        }
    }

    fn api(&self) -> anyhow::Result<Api> {
        ApiBuilder::from_cache(Cache::new(self.cache.clone()))
            .with_endpoint(self.endpoint.trim_end_matches('/').to_string())
            .with_token(self.token.clone())
            .with_progress(self.progress)
            .build()
            .context("setting up the hub client")
    }
}

/// `OWNER/NAME[@REVISION]` split and checked ([`verity_core::models::parse_hub_ref`]); the
/// revision defaults to `main`. A bad name is a [`HubRefusal`].
pub fn parse_model_ref(spec: &str) -> anyhow::Result<(String, String)> {
    verity_core::models::parse_hub_ref(spec)
        .map_err(|rule| HubRefusal(format!("{spec:?}: {rule}")).into())
}

/// What the hub refused, or a fetched model that fails its checks (missing files, a damaged
/// file): asking again will not help, unlike a network failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HubRefusal(pub String);

/// Whether `err` is (or wraps) a [`HubRefusal`].
pub fn is_refusal(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| cause.downcast_ref::<HubRefusal>().is_some())
}

/// A file the hub lists.
#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    /// Its size in bytes.
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

/// A large file's checksum as the hub lists it.
#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
}

/// The repository at one commit, as `/api/models/…/revision/…?blobs=true` answers.
#[derive(Debug, Deserialize)]
struct RepoInfo {
    sha: String,
    siblings: Vec<Sibling>,
}

/// Whether Verity needs `file` to load and train a model (config, tokenizer, weights).
fn wanted(file: &str) -> bool {
    matches!(
        file,
        "config.json"
            | "generation_config.json"
            | "tokenizer.json"
            | "tokenizer_config.json"
            | "special_tokens_map.json"
            | "chat_template.jinja"
            | "chat_template.json"
            | "model.safetensors.index.json"
    ) || (file.ends_with(".safetensors") && !file.contains('/'))
}

/// A model fetched into the cache.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// `OWNER/NAME`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// The snapshot folder (`…/models--OWNER--NAME/snapshots/COMMIT`).
    pub dir: PathBuf,
    /// The files fetched or found in the cache.
    pub files: Vec<String>,
    /// How many of them were downloaded (the others were in the cache).
    pub downloaded: usize,
}

fn hub_error(e: ApiError, hub: &Hub, id: &str, revision: &str, what: &str) -> anyhow::Error {
    let status = match &e {
        ApiError::RequestError(r) => r.status().map(|s| s.as_u16()),
        _ => None,
    };
    match status {
        Some(401 | 403) if hub.token.is_none() => HubRefusal(format!(
            "{id} is gated or private on {}: set HF_TOKEN to a token of an account that may \
             read it (for a gated model, one that accepted its licence)",
            hub.endpoint
        ))
        .into(),
        Some(401 | 403) => HubRefusal(format!(
            "{id}: the hub refused the token in HF_TOKEN ({e}); for a gated model, accept its \
             licence on the model's page with that account"
        ))
        .into(),
        Some(404) => {
            HubRefusal(format!("{id} has no {what} at revision {revision:?} on {}", hub.endpoint))
                .into()
        }
        _ => anyhow::Error::new(e).context(format!("{id}: fetching {what} from {}", hub.endpoint)),
    }
}

/// SHA-256 of a file, hex.
fn sha256_hex(path: &Path) -> anyhow::Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// Fetches what Verity needs of `spec` (`OWNER/NAME[@REVISION]`) into the cache (files already
/// there for the same commit are not fetched again) and checks every large file's SHA-256.
pub async fn fetch(hub: &Hub, spec: &str) -> anyhow::Result<Fetched> {
    let (id, revision) = parse_model_ref(spec)?;
    let api = hub.api()?;
    let repo = api.repo(Repo::with_revision(id.clone(), RepoType::Model, revision.clone()));
    let info: RepoInfo =
        fetch_info(&repo).await.map_err(|e| hub_error(e, hub, &id, &revision, "model"))?;
    // The commit names a folder of the cache: a hub answering anything but a commit hash is
    // refused, never joined to a path.
    if !(info.sha.len() == 40 && info.sha.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Err(
            HubRefusal(format!("{id}: the hub answered {:?}, not a commit", info.sha)).into()
        );
    }
    let files: Vec<&Sibling> = info.siblings.iter().filter(|s| wanted(&s.rfilename)).collect();
    let has = |name: &str| files.iter().any(|s| s.rfilename == name);
    let weights = files.iter().any(|s| s.rfilename.ends_with(".safetensors"));
    let missing: Vec<&str> = [
        (!has("config.json")).then_some("config.json"),
        (!has("tokenizer.json")).then_some("tokenizer.json"),
        (!weights).then_some("*.safetensors"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !missing.is_empty() {
        let listed: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
        return Err(HubRefusal(format!(
            "{id}@{revision} lacks {} (Verity loads safetensors weights with a tokenizer.json); \
             the repository has: {}",
            missing.join(", "),
            listed.join(", ")
        ))
        .into());
    }
    let bytes: u64 = files.iter().filter_map(|s| s.size).sum();
    if let Some(max) = hub.max_bytes.filter(|max| bytes > *max) {
        return Err(HubRefusal(format!(
            "{id}@{revision} is {:.1} GB, more than the {:.1} GB this server's pulls may fetch \
             ({PULL_MAX_GB_ENV}); the operator can pull it with `verity models pull {id}`",
            bytes as f64 / 1e9,
            max as f64 / 1e9
        ))
        .into());
    }
    let snapshot = Cache::new(hub.cache.clone())
        .repo(Repo::with_revision(id.clone(), RepoType::Model, revision.clone()))
        .pointer_path(&info.sha);
    let mut downloaded = 0;
    for sibling in &files {
        let name = &sibling.rfilename;
        let cached = snapshot.join(name);
        let path = if cached.is_file() {
            cached
        } else {
            downloaded += 1;
            repo.download(name).await.map_err(|e| hub_error(e, hub, &id, &revision, name))?
        };
        if path.parent() != Some(snapshot.as_path()) {
            bail!("{id}@{revision} moved to another commit while it was fetched; pull it again");
        }
        if let Some(lfs) = &sibling.lfs {
            let check = path.clone();
            let actual = tokio::task::spawn_blocking(move || sha256_hex(&check)).await??;
            if !actual.eq_ignore_ascii_case(&lfs.sha256) {
                // The blob is wrong: remove it, so the next pull fetches it again.
                let blob = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(&blob);
                return Err(HubRefusal(format!(
                    "{id}: {name} has SHA-256 {actual}, the hub lists {}; the damaged copy was \
                     removed, pull again",
                    lfs.sha256
                ))
                .into());
            }
        }
    }
    Ok(Fetched {
        repo: id,
        revision,
        commit: info.sha,
        dir: snapshot,
        files: files.iter().map(|s| s.rfilename.clone()).collect(),
        downloaded,
    })
}

async fn fetch_info(repo: &ApiRepo) -> Result<RepoInfo, ApiError> {
    Ok(repo
        .info_request()
        .query(&[("blobs", "true")])
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_follow_the_hubs_rules() {
        assert_eq!(
            parse_model_ref("Qwen/Qwen3-1.7B").unwrap(),
            ("Qwen/Qwen3-1.7B".to_string(), "main".to_string())
        );
        assert_eq!(parse_model_ref("HuggingFaceTB/SmolLM2-135M-Instruct@v1.0").unwrap().1, "v1.0");
        assert_eq!(parse_model_ref("a/b@refs/pr/1").unwrap().1, "refs/pr/1");
        for bad in [
            "noslash",
            "a/b/c",
            "../x",
            "a/..",
            "a--b/c",
            "a/-b",
            "a/b.",
            "a/b c",
            "/b",
            "a/",
            "a/b@",
            "a/b@../x",
            &format!("a/{}", "x".repeat(97)),
        ] {
            assert!(parse_model_ref(bad).is_err(), "{bad}");
        }
        assert_eq!(verity_core::models::default_pull_name("Qwen/Qwen3-1.7B"), "Qwen3-1.7B");
    }

    #[test]
    fn only_what_verity_loads_is_fetched() {
        for file in ["config.json", "tokenizer.json", "model-00001-of-00002.safetensors"] {
            assert!(wanted(file), "{file}");
        }
        for file in ["pytorch_model.bin", "model.gguf", "onnx/model.safetensors", "README.md"] {
            assert!(!wanted(file), "{file}");
        }
    }
}
