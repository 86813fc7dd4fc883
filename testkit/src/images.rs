//! Verity's deploy images in tests, with podman: the `runtime` stage of a Dockerfile under
//! `deploy/` (everything of the image but the release binary), into which a test mounts its own
//! `verity` — the binary the test step built — at the path the image's entry point runs.
//!
//! Needs podman and the base image `debian:bookworm-slim`; `scripts/test-services.sh` installs
//! podman, makes the base without a registry and exports `VERITY_TEST_PODMAN`. Without them the
//! tests say SKIPPED, unless `VERITY_REQUIRE_PODMAN=1` (CI) makes that a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The CPU worker's Dockerfile, from the repository root.
pub const WORKER_CPU: &str = "deploy/Dockerfile.worker-cpu";
/// The server's Dockerfile, from the repository root.
pub const SERVER: &str = "deploy/Dockerfile.server";

/// The repository's root folder.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The podman command, or `None` after printing SKIPPED for `test` when this machine has none
/// set up; panics instead when `VERITY_REQUIRE_PODMAN=1`.
pub fn podman(test: &str) -> Option<String> {
    let podman = std::env::var("VERITY_TEST_PODMAN").ok().filter(|p| !p.is_empty());
    if podman.is_none() {
        let why = "VERITY_TEST_PODMAN is not set (source scripts/test-services.sh)";
        if std::env::var("VERITY_REQUIRE_PODMAN").as_deref() == Ok("1") {
            panic!("{test}: {why}, and VERITY_REQUIRE_PODMAN=1");
        }
        eprintln!("SKIPPED {test}: {why}");
    }
    podman
}

/// Builds the `runtime` stage of `dockerfile` (a path from the repository root) once per test
/// process — podman's layer cache makes a rebuild of an unchanged stage quick — and returns its
/// tag, `localhost/verity-<name>-runtime:test`. Panics with podman's output when it fails.
pub fn runtime_image(podman: &str, dockerfile: &str) -> String {
    static BUILT: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(tag) = built.get(dockerfile) {
        return tag.clone();
    }
    let name = dockerfile.rsplit('.').next().unwrap_or("image");
    let tag = format!("localhost/verity-{name}-runtime:test");
    // The runtime stages copy nothing from the context: an empty folder will do.
    let context = std::env::temp_dir().join(format!("verity-empty-context-{}", std::process::id()));
    std::fs::create_dir_all(&context).expect("an empty build context");
    let output = Command::new(podman)
        .args(["build", "--target", "runtime", "-t", &tag, "-f"])
        .arg(repository().join(dockerfile))
        .arg(&context)
        .output()
        .expect("running podman build");
    let _ = std::fs::remove_dir(&context);
    assert!(
        output.status.success(),
        "podman build --target runtime -f {dockerfile} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(dockerfile.to_string(), tag.clone());
    tag
}

/// The `podman run` volume option that puts `binary` where the images run `verity` from.
pub fn binary_mount(binary: &str) -> String {
    format!("{binary}:/usr/local/bin/verity:ro")
}

/// The container options of a container that runs the grader sandbox (a worker, the server), as
/// the compose file and the Kubernetes manifests give them: the seccomp profile `seccomp` (a
/// file, `unconfined`, or `None` for the runtime's default; the manifests use the shipped
/// [`sandbox_seccomp_profile`]), unconfined AppArmor, an unmasked `/proc`, every capability
/// dropped, no new privileges.
pub fn sandbox_container_options(seccomp: Option<&str>) -> Vec<String> {
    let mut options: Vec<String> = [
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "apparmor=unconfined",
        "--security-opt",
        "systempaths=unconfined",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(seccomp) = seccomp {
        options.extend(["--security-opt".to_string(), format!("seccomp={seccomp}")]);
    }
    options
}

/// The shipped worker seccomp profile's path.
pub fn sandbox_seccomp_profile() -> PathBuf {
    repository().join("deploy/seccomp/verity-sandbox.json")
}
