//! The grader image: the Python packages OpenAI documents for its python graders (image
//! `2025-05-08`), pinned in `verifiers/grader-image/requirements.txt`. They are installed once
//! from PyPI with pip into a cached folder (a *layer*) keyed by a hash of that file and the
//! Python version, and mounted read-only into the sandbox of python graders, first on their
//! `sys.path`. An install goes to a temporary folder renamed into place when complete, under a
//! lock file, so concurrent installers (threads or processes) never see a partial layer.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::SandboxConfig;

/// The pinned requirements: OpenAI's list for image `2025-05-08`, with its source URL.
pub const REQUIREMENTS: &str = include_str!("../../grader-image/requirements.txt");
/// The command that installs the packages ahead of time.
pub const INSTALL_COMMAND: &str = "verity graders install-packages";
/// Setting naming the folder of the layers, or `off` (python graders get only the standard
/// library and nothing is installed).
pub const PACKAGES_ENV: &str = "VERITY_GRADER_PACKAGES";
/// A file every complete layer holds (a copy of the requirements it was installed from).
const MARKER: &str = ".verity-requirements.txt";
/// A file of a layer listing the pins that could not be installed, one `pin: why` a line.
const MISSING: &str = ".verity-missing.txt";
/// How long this process waits before trying again an install that failed.
const RETRY_AFTER: Duration = Duration::from_secs(600);
/// Modules imported under another name than their package's.
const IMPORT_NAMES: &[(&str, &str)] = &[
    ("scikit-learn", "sklearn"),
    ("scikit-bio", "skbio"),
    ("pyyaml", "yaml"),
    ("rouge-score", "rouge_score"),
    ("ast-grep-py", "ast_grep_py"),
];

/// Why the packages could not be installed.
#[derive(Debug, Error)]
pub enum PackagesError {
    /// `VERITY_GRADER_PACKAGES=off`, or the sandbox has no Python.
    #[error("the grader image's packages are not available here: {0}")]
    Unavailable(String),
    /// pip could not run, or failed (offline, no pip, a package without a wheel).
    #[error("pip could not install the grader image's packages ({command}): {detail}")]
    Pip {
        /// The command run.
        command: String,
        /// What pip said (its last lines), or why it did not start.
        detail: String,
    },
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

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PackagesError {
    let path = path.to_path_buf();
    move |source| PackagesError::Io { action, path, source }
}

/// Verity's cache folder: `$HOME/.cache/verity`, or `.verity/cache` without a home (the model
/// cache and the grader packages live under it).
pub fn cache_root() -> PathBuf {
    std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/verity"))
        .unwrap_or_else(|| PathBuf::from(".verity/cache"))
}

/// The folder of the layers: `VERITY_GRADER_PACKAGES`, else `grader-packages` in
/// [`cache_root`]; `None` when the setting is `off`.
pub fn packages_root() -> Option<PathBuf> {
    match std::env::var_os(PACKAGES_ENV) {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(cache_root().join("grader-packages")),
    }
}

/// The pinned packages, `(name, version)`, in the file's order.
pub fn pinned() -> Vec<(&'static str, &'static str)> {
    REQUIREMENTS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once("=="))
        .collect()
}

/// The top-level module a pinned package is imported as (`scikit-learn` → `sklearn`).
pub fn import_name(package: &str) -> String {
    IMPORT_NAMES
        .iter()
        .find(|(name, _)| *name == package)
        .map(|(_, module)| module.to_string())
        .unwrap_or_else(|| package.replace('-', "_"))
}

fn image_modules() -> Vec<String> {
    pinned().into_iter().map(|(name, _)| import_name(name)).collect()
}

/// Whether `source` has an `import` or `from … import` statement naming a module of the image
/// (the cue to install the packages before its first grading).
pub fn imports_image_package(source: &str) -> bool {
    let modules = image_modules();
    source.lines().flat_map(|line| line.split(';')).any(|statement| {
        let statement = statement.trim();
        let names: Vec<&str> = if let Some(rest) = statement.strip_prefix("import ") {
            rest.split(',').filter_map(|n| n.split_whitespace().next()).collect()
        } else if let Some(rest) = statement.strip_prefix("from ") {
            rest.split_whitespace().next().into_iter().collect()
        } else {
            Vec::new()
        };
        names.iter().any(|n| modules.iter().any(|m| n.split('.').next() == Some(m.as_str())))
    })
}

/// A hint for a grader that failed with `ModuleNotFoundError` in `message`: how to install the
/// image's packages when the module is one of them and no layer was mounted (`layer` is the
/// mounted one), why it is missing from the layer, or that the module is not in the image.
pub fn missing_module_hint(message: &str, layer: Option<&Path>) -> Option<String> {
    let rest = message.split("No module named '").nth(1)?;
    let module = rest.split('\'').next()?;
    let top = module.split('.').next()?;
    let Some((package, version)) = pinned().into_iter().find(|(name, _)| import_name(name) == top)
    else {
        let modules = image_modules();
        return Some(format!(
            "'{top}' is not among the grader image's packages ({}); see docs/graders.md#packages",
            modules.join(", ")
        ));
    };
    if let Some(layer) = layer {
        let pin = format!("{package}=={version}");
        return missing_pins(layer).contains(&pin).then(|| {
            format!(
                "{pin} of the grader image could not be installed on this machine; see \
                 {} for why",
                layer.join(MISSING).display()
            )
        });
    }
    Some(match packages_root() {
        None => format!(
            "'{top}' is in the grader image, whose packages are turned off here \
             ({PACKAGES_ENV}=off): unset it and run `{INSTALL_COMMAND}`"
        ),
        Some(root) => format!(
            "'{top}' is in the grader image, whose packages are not installed on this machine: \
             run `{INSTALL_COMMAND}` (pip installs them from PyPI into {})",
            root.display()
        ),
    })
}

/// The pins a complete layer lacks (they could not be installed), as `name==version`.
pub fn missing_pins(layer: &Path) -> Vec<String> {
    std::fs::read_to_string(layer.join(MISSING))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(':').next())
        .filter(|pin| !pin.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// One layer: the pinned packages installed for one interpreter.
#[derive(Debug, Clone)]
pub struct PackageLayer {
    /// The interpreter pip runs as (the sandbox's).
    pub python: PathBuf,
    /// Where the complete layer is (or will be).
    pub dir: PathBuf,
}

impl PackageLayer {
    /// The layer of `python`, whose version tag is `python_tag`, under `root`: its folder is
    /// named by the tag and a hash of the requirements and the tag.
    pub fn new(root: &Path, python: &Path, python_tag: &str) -> Self {
        let mut hash = Sha256::new();
        hash.update(REQUIREMENTS.as_bytes());
        hash.update([0]);
        hash.update(python_tag.as_bytes());
        let digest: String = hash.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect();
        Self { python: python.to_path_buf(), dir: root.join(format!("{python_tag}-{digest}")) }
    }

    /// The layer of the sandbox's interpreter under [`packages_root`].
    pub fn for_sandbox(config: &SandboxConfig) -> Result<Self, PackagesError> {
        if let Some(why) = &config.unavailable {
            return Err(PackagesError::Unavailable(why.clone()));
        }
        let root = packages_root()
            .ok_or_else(|| PackagesError::Unavailable(format!("{PACKAGES_ENV}=off")))?;
        Ok(Self::new(&root, &config.python, &config.python_tag))
    }

    /// Whether the layer is complete.
    pub fn is_installed(&self) -> bool {
        self.dir.join(MARKER).is_file()
    }

    /// Installs the layer unless it is there: pip into a temporary folder, renamed into place
    /// when complete, all under a lock file that other installers wait on.
    pub fn install(&self) -> Result<(), PackagesError> {
        let root = self.dir.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(root).map_err(io_error("creating", root))?;
        let name = self.dir.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        let lock_path = root.join(format!(".{name}.lock"));
        let _lock = lock(&lock_path)?;
        if self.is_installed() {
            return Ok(());
        }
        let staging = root.join(format!(".{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(io_error("creating", &staging))?;
        let installed = self.pip_install(&staging).and_then(|()| {
            std::fs::write(staging.join(MARKER), REQUIREMENTS)
                .map_err(io_error("writing", &staging.join(MARKER)))?;
            readable_by_all(&staging)?;
            match std::fs::rename(&staging, &self.dir) {
                Ok(()) => Ok(()),
                // another installer (one that took no lock) finished first
                Err(_) if self.is_installed() => Ok(()),
                Err(e) => Err(io_error("renaming into place", &self.dir)(e)),
            }
        });
        let _ = std::fs::remove_dir_all(&staging);
        installed
    }

    /// Installs the pins into `target`: all at once, else (one of them could not be built,
    /// e.g. no C compiler for scikit-bio's source) one by one, writing those that failed to
    /// [`MISSING`]; fails when nothing could be installed (offline, no pip).
    fn pip_install(&self, target: &Path) -> Result<(), PackagesError> {
        let requirements = target.with_extension("requirements.txt");
        std::fs::write(&requirements, REQUIREMENTS).map_err(io_error("writing", &requirements))?;
        let all = self.pip(target, &[OsStr::new("-r"), requirements.as_os_str()]);
        let _ = std::fs::remove_file(&requirements);
        let Err(all) = all else { return Ok(()) };
        tracing::warn!(error = %all, "installing the grader image's packages one by one");
        let mut missing = Vec::new();
        for (i, (name, version)) in pinned().into_iter().enumerate() {
            let pin = format!("{name}=={version}");
            if let Err(e) = self.pip(target, &[OsStr::new(&pin)]) {
                if i == 0 {
                    return Err(all); // not even the first: pip or the index is unreachable
                }
                missing.push(format!("{pin}: {e}"));
            }
        }
        let path = target.join(MISSING);
        std::fs::write(&path, missing.join("\n") + "\n").map_err(io_error("writing", &path))
    }

    /// `python -m pip install --target TARGET ARGS…`, its output kept unless it fails.
    fn pip(&self, target: &Path, args: &[&OsStr]) -> Result<(), PackagesError> {
        let mut command = Command::new(&self.python);
        command
            .args(["-m", "pip", "install", "--no-input", "--disable-pip-version-check"])
            .args(["--no-warn-script-location", "--retries", "1", "--timeout", "30"])
            .arg("--target")
            .arg(target)
            .args(args);
        let shown = format!(
            "{} -m pip install --target {} {}",
            self.python.display(),
            self.dir.display(),
            args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
        );
        let output = command
            .output()
            .map_err(|e| PackagesError::Pip { command: shown.clone(), detail: e.to_string() })?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let detail = lines[lines.len().saturating_sub(3)..].join(" | ");
        Err(PackagesError::Pip { command: shown, detail: format!("{}: {detail}", output.status) })
    }
}

/// An exclusive lock on `path` (created if needed), held until the file is dropped.
fn lock(path: &Path) -> Result<File, PackagesError> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_error("opening", path))?;
    file.lock().map_err(io_error("locking", path))?;
    Ok(file)
}

/// Makes every file readable and every folder traversable by all (the sandbox may run as
/// another uid), whatever the umask pip ran under.
fn readable_by_all(dir: &Path) -> Result<(), PackagesError> {
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(io_error("reading", &path))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        let wanted = if meta.is_dir() { mode | 0o555 } else { mode | 0o444 };
        if wanted != mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(wanted))
                .map_err(io_error("setting the permissions of", &path))?;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(io_error("listing", &path))? {
                pending.push(entry.map_err(io_error("listing", &path))?.path());
            }
        }
    }
    Ok(())
}

/// When an install failed in this process, per layer folder.
static FAILED: Mutex<BTreeMap<PathBuf, Instant>> = Mutex::new(BTreeMap::new());

/// The layer's folder when it is complete, installing it first when `install` is true and no
/// install of it failed in this process in the last ten minutes (a failure is logged; python
/// graders then run with the standard library only). Threads wanting an install wait for it.
pub fn ready(layer: &PackageLayer, install: bool) -> Option<PathBuf> {
    if layer.is_installed() {
        return Some(layer.dir.clone());
    }
    if !install {
        return None;
    }
    let mut failed = FAILED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if layer.is_installed() {
        return Some(layer.dir.clone());
    }
    if failed.get(&layer.dir).is_some_and(|at| at.elapsed() < RETRY_AFTER) {
        return None;
    }
    tracing::info!(dir = %layer.dir.display(), "installing the grader image's Python packages from PyPI (once; `{INSTALL_COMMAND}` does it ahead of time)");
    let started = Instant::now();
    match layer.install() {
        Ok(()) => {
            tracing::info!(dir = %layer.dir.display(), seconds = started.elapsed().as_secs(), "grader image packages installed");
            failed.remove(&layer.dir);
            Some(layer.dir.clone())
        }
        Err(e) => {
            tracing::warn!(error = %e, "python graders run with the standard library only");
            failed.insert(layer.dir.clone(), Instant::now());
            None
        }
    }
}

/// The sandbox of a python grader with `source`: with the image's packages when their layer is
/// installed, installed first when the source imports one of them.
pub fn for_python_grader<'a>(config: &'a SandboxConfig, source: &str) -> Cow<'a, SandboxConfig> {
    if config.grader_packages.is_some() {
        return Cow::Borrowed(config);
    }
    let Ok(layer) = PackageLayer::for_sandbox(config) else { return Cow::Borrowed(config) };
    match ready(&layer, imports_image_package(source)) {
        Some(dir) => Cow::Owned(SandboxConfig { grader_packages: Some(dir), ..config.clone() }),
        None => Cow::Borrowed(config),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_are_openais_list() {
        let names: Vec<&str> = pinned().iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), 16);
        assert!(names.contains(&"rapidfuzz") && names.contains(&"ast-grep-py"));
        assert!(pinned().contains(&("numpy", "2.2.4")));
    }

    #[test]
    fn imports_of_image_modules_are_recognised() {
        assert!(imports_image_package("from rapidfuzz import fuzz, utils\n"));
        assert!(imports_image_package("import json, numpy as np"));
        assert!(imports_image_package("def grade(s, i):\n    import sklearn.metrics\n"));
        assert!(imports_image_package("import re; from yaml import safe_load"));
        assert!(!imports_image_package("import re\nfrom collections import Counter\n"));
        assert!(!imports_image_package("# numpy would help\nimport numpyish\n"));
    }

    #[test]
    fn a_missing_module_gets_a_hint() {
        let hint = missing_module_hint("ModuleNotFoundError: No module named 'rapidfuzz'", None);
        assert!(hint.unwrap().contains(INSTALL_COMMAND));
        let layer = std::env::temp_dir().join(format!("verity-layer-{}", std::process::id()));
        std::fs::create_dir_all(&layer).unwrap();
        std::fs::write(layer.join(MISSING), "scikit-bio==0.6.3: no compiler\n").unwrap();
        assert_eq!(missing_module_hint("No module named 'numpy.linalg'", Some(&layer)), None);
        let skbio = missing_module_hint("No module named 'skbio'", Some(&layer)).unwrap();
        assert!(skbio.contains("scikit-bio==0.6.3 of the grader image could not"), "{skbio}");
        assert_eq!(missing_pins(&layer), vec!["scikit-bio==0.6.3".to_string()]);
        std::fs::remove_dir_all(&layer).unwrap();
        let other = missing_module_hint("ModuleNotFoundError: No module named 'torch'", None);
        assert!(other.unwrap().contains("not among the grader image's packages"));
        assert_eq!(missing_module_hint("KeyError: 'x'", None), None);
    }

    #[test]
    fn layers_are_keyed_by_the_python_version() {
        let a = PackageLayer::new(Path::new("/c"), Path::new("/p"), "cpython-3.11.7-x86_64");
        let b = PackageLayer::new(Path::new("/c"), Path::new("/p"), "cpython-3.12.1-x86_64");
        assert_ne!(a.dir, b.dir);
        assert!(a.dir.starts_with("/c"));
        let name = a.dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("cpython-3.11.7-x86_64-"), "{name}");
    }
}
