//! Where the sandbox finds bubblewrap and Python, and the limits every run shares.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Sandbox settings; [`SandboxConfig::default`] discovers the tools once per process.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// The `bwrap` binary (`VERITY_SANDBOX_BWRAP`, else searched on `PATH`).
    pub bwrap: PathBuf,
    /// The real Python interpreter (`VERITY_SANDBOX_PYTHON`, else `python3` on `PATH`, resolved
    /// through shims such as pyenv's to `sys.executable`).
    pub python: PathBuf,
    /// Directories outside `/usr` the interpreter needs (its prefixes), bound read-only.
    pub python_roots: Vec<PathBuf>,
    /// The interpreter's site-packages directories: the sandbox starts Python without `site`
    /// (`-S`, twice as fast: no `.pth` hooks) and puts these on `sys.path` itself.
    pub python_site_paths: Vec<PathBuf>,
    /// The interpreter's version tag (`cpython-3.11.7-x86_64`): the grader image's packages
    /// are installed per tag ([`super::packages`]).
    pub python_tag: String,
    /// The grader image's packages ([`super::packages`]) when this run gets them: bound
    /// read-only and first on `sys.path` (python graders only).
    pub grader_packages: Option<PathBuf>,
    /// Most processes (threads included) one run may have.
    pub max_processes: u64,
    /// Largest file a run may write, in bytes.
    pub max_file_bytes: u64,
    /// Size of the writable `/work` and `/tmp` tmpfs, in bytes each.
    pub workdir_bytes: u64,
    /// Stdout/stderr bytes kept per stream (the rest is drained and dropped).
    pub max_output_bytes: usize,
    /// When Verity runs as root, runs use uids `uid_base..uid_base+uid_count` (one per concurrent
    /// run) so that the process limit is enforced per run.
    pub uid_base: u32,
    /// Size of the uid range.
    pub uid_count: u32,
    /// Why the sandbox cannot run, when discovery failed (reported as a sandbox error per grading).
    pub unavailable: Option<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        static DISCOVERED: OnceLock<SandboxConfig> = OnceLock::new();
        DISCOVERED.get_or_init(Self::discover).clone()
    }
}

impl SandboxConfig {
    /// A configuration for graders that never run programs (no discovery, no process spawned).
    pub fn not_needed() -> Self {
        Self { unavailable: Some("this grader runs no programs".into()), ..Self::limits_only() }
    }

    fn limits_only() -> Self {
        Self {
            bwrap: PathBuf::new(),
            python: PathBuf::new(),
            python_roots: Vec::new(),
            python_site_paths: Vec::new(),
            python_tag: String::new(),
            grader_packages: None,
            max_processes: 64,
            max_file_bytes: 16 << 20,
            workdir_bytes: 64 << 20,
            max_output_bytes: 64 << 10,
            uid_base: 61_000,
            uid_count: 1_000,
            unavailable: None,
        }
    }

    /// Finds bwrap and the Python interpreter (never fails: problems land in `unavailable`).
    pub fn discover() -> Self {
        let mut config = Self::limits_only();
        let bwrap = std::env::var_os("VERITY_SANDBOX_BWRAP")
            .map(PathBuf::from)
            .or_else(|| find_on_path("bwrap"));
        let python = std::env::var_os("VERITY_SANDBOX_PYTHON")
            .map(PathBuf::from)
            .or_else(|| find_on_path("python3"));
        match (bwrap, python) {
            (None, _) => config.unavailable = Some("bubblewrap (bwrap) not found on PATH".into()),
            (_, None) => config.unavailable = Some("python3 not found on PATH".into()),
            (Some(bwrap), Some(python)) => {
                config.bwrap = bwrap;
                match resolve_python(&python) {
                    Ok(found) => {
                        config.python = found.executable;
                        config.python_roots = found.roots;
                        config.python_site_paths = found.site_paths;
                        config.python_tag = found.tag;
                    }
                    Err(e) => config.unavailable = Some(e),
                }
            }
        }
        if let Some(why) = &config.unavailable {
            tracing::warn!(reason = %why, "code sandbox unavailable");
        }
        config
    }

    /// Uses this interpreter (resolved like the default one).
    pub fn with_python(mut self, python: &Path) -> Self {
        match resolve_python(python) {
            Ok(found) => {
                self.python = found.executable;
                self.python_roots = found.roots;
                self.python_site_paths = found.site_paths;
                self.python_tag = found.tag;
            }
            Err(e) => self.unavailable = Some(e),
        }
        self
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        })
    })
}

/// What an interpreter reports about itself.
struct FoundPython {
    executable: PathBuf,
    roots: Vec<PathBuf>,
    site_paths: Vec<PathBuf>,
    tag: String,
}

/// Asks the interpreter (possibly a shim script) for its real executable, prefixes,
/// site-packages directories and version tag.
fn resolve_python(python: &Path) -> Result<FoundPython, String> {
    let script = "import os, sys, site\nprint(sys.executable)\nprint(sys.prefix)\n\
                  print(sys.base_prefix)\nv = sys.version_info\n\
                  print('tag:%s-%d.%d.%d-%s' % (sys.implementation.name, v[0], v[1], v[2], \
                  os.uname().machine))\nfor p in site.getsitepackages():\n    print('site:' + p)";
    let output = Command::new(python)
        .args(["-I", "-c", script])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let exe = lines.next().filter(|l| !l.is_empty()).ok_or("python reported no sys.executable")?;
    let exe = std::fs::canonicalize(exe).map_err(|e| format!("cannot resolve {exe}: {e}"))?;
    let mut roots: Vec<PathBuf> = Vec::new();
    let mut site_paths = Vec::new();
    let mut tag = String::new();
    for line in lines {
        if let Some(found) = line.strip_prefix("tag:") {
            tag = found.to_string();
            continue;
        }
        if let Some(site) = line.strip_prefix("site:") {
            if Path::new(site).is_dir() {
                site_paths.push(PathBuf::from(site));
            }
            continue;
        }
        let prefix =
            std::fs::canonicalize(line).map_err(|e| format!("cannot resolve {line}: {e}"))?;
        if !prefix.starts_with("/usr") && !roots.contains(&prefix) {
            roots.push(prefix);
        }
    }
    if !exe.starts_with("/usr") && !roots.iter().any(|r| exe.starts_with(r)) {
        if let Some(dir) = exe.parent() {
            roots.push(dir.to_path_buf());
        }
    }
    Ok(FoundPython { executable: exe, roots, site_paths, tag })
}
