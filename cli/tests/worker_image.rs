//! The worker image's sandbox under the shipped seccomp profile (`deploy/seccomp/verity-sandbox.json`),
//! with podman: the runtime stage of `deploy/Dockerfile.worker-cpu` (Debian, bubblewrap, Python,
//! the unprivileged user 10001), this test step's own `verity` binary mounted in, the container
//! options the compose file and the Kubernetes manifests give a worker — the profile instead of
//! `seccomp=unconfined`, all capabilities dropped, no new privileges, no network.
//!
//! - a `code` grader grades through bubblewrap inside it: a right program scores 1, a wrong one 0;
//! - the worker process itself is refused what the profile denies (the kernel keyring, `bpf`,
//!   `perf_event_open`, `ptrace`, `userfaultfd`, io_uring, `setns`) with `EPERM` and `clone3` with
//!   `ENOSYS`, where an unconfined container is not — the profile is tighter than `Unconfined`;
//! - the test bites: the same profile refusing `mount` as well makes the grading fail with kind
//!   `sandbox`, because bubblewrap can no longer build the sandbox; so does the runtime's own
//!   default profile (podman's, here).
//!
//! Needs podman and the base image (`verity_testkit::images`; `scripts/test-services.sh` sets
//! them up); without them the tests say SKIPPED, unless `VERITY_REQUIRE_PODMAN=1` (CI).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use verity_testkit::images;

/// How the container's seccomp is set for one run.
enum Seccomp<'a> {
    /// A profile file on this machine.
    Profile(&'a Path),
    /// No filter at all, as the manifests used to ask.
    Unconfined,
    /// The container runtime's own default profile (podman's here).
    RuntimeDefault,
}

/// Runs `args` in the worker runtime image with a worker's container options and no network,
/// `stdin` on its standard input; `entrypoint` replaces the image's (`tini -- verity`).
fn run_in_worker(
    podman: &str,
    seccomp: Seccomp,
    entrypoint: Option<&str>,
    mounts: &[(&Path, &str)],
    args: &[&str],
    stdin: &str,
) -> Output {
    let seccomp = match seccomp {
        Seccomp::Profile(path) => Some(path.display().to_string()),
        Seccomp::Unconfined => Some("unconfined".to_string()),
        Seccomp::RuntimeDefault => None,
    };
    let mut command = Command::new(podman);
    command.args(["run", "--rm", "-i", "--network", "none", "-e", "RUST_LOG=warn"]);
    command.args(images::sandbox_container_options(seccomp.as_deref()));
    command.arg("-v").arg(images::binary_mount(env!("CARGO_BIN_EXE_verity")));
    for (host, inside) in mounts {
        command.arg("-v").arg(format!("{}:{inside}:ro", host.display()));
    }
    if let Some(entrypoint) = entrypoint {
        command.args(["--entrypoint", entrypoint]);
    }
    command.arg(images::runtime_image(podman, images::WORKER_CPU)).args(args);
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("starting podman run");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("writing stdin");
    child.wait_with_output().expect("podman run")
}

/// Grades `programs` with a `code` grader inside the worker image; one result per program.
fn grade_in_worker(podman: &str, seccomp: Seccomp, programs: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("a temp dir");
    let grader = dir.path().join("grader.json");
    let spec = json!({"type": "code", "name": "tests", "language": "python",
                      "tests": "{{item.tests}}", "scoring": "all_pass", "timeout_ms": 20_000});
    std::fs::write(&grader, spec.to_string()).expect("writing the grader");
    let tests = "assert double(2) == 4\nassert double(-3) == -6";
    let rows: String = programs
        .iter()
        .map(|program| {
            let row = json!({"item": {"tests": tests},
                             "sample": {"output_text": format!("```python\n{program}\n```")}});
            format!("{row}\n")
        })
        .collect();
    let output = run_in_worker(
        podman,
        seccomp,
        None,
        &[(&grader, "/grader.json")],
        &["graders", "run", "--grader", "/grader.json", "--input", "-", "--jobs", "1"],
        &rows,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "verity graders run in the worker image failed:\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().map(|line| serde_json::from_str(line).expect("a JSON result")).collect()
}

#[test]
fn the_worker_image_grades_code_through_the_sandbox_under_the_shipped_profile() {
    let test = "the_worker_image_grades_code_through_the_sandbox_under_the_shipped_profile";
    let Some(podman) = images::podman(test) else { return };
    let profile = images::sandbox_seccomp_profile();
    let results = grade_in_worker(
        &podman,
        Seccomp::Profile(&profile),
        &["def double(x):\n    return 2 * x", "def double(x):\n    return x + 2"],
    );
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0]["score"], 1.0, "the right program: {}", results[0]);
    assert!(results[0]["error"].is_null(), "{}", results[0]);
    assert_eq!(results[1]["score"], 0.0, "the wrong program: {}", results[1]);
    assert!(results[1]["error"].is_null(), "a wrong answer is no error: {}", results[1]);
}

/// Calls each system call of the profile's deny list that a worker never needs, from Python in
/// the worker's container (outside any sandbox), and prints `name errno` per call (0: it ran).
const PROBE: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
nr = {"keyctl": 250, "add_key": 248, "bpf": 321, "perf_event_open": 298, "ptrace": 101,
      "userfaultfd": 323, "io_uring_setup": 425, "setns": 308, "clone3": 435}
args = {"keyctl": (0, -3, 0), "add_key": (b"user", b"verity", b"x", 1, -3), "bpf": (0, 0, 0),
        "perf_event_open": (0, 0, -1, -1, 0), "ptrace": (0, 0, 0, 0), "userfaultfd": (0,),
        "io_uring_setup": (1, 0), "setns": (-1, 0), "clone3": (0, 0)}
for name, number in nr.items():
    ctypes.set_errno(0)
    result = libc.syscall(number, *args[name])
    print(name, 0 if result >= 0 else ctypes.get_errno())
"#;

fn probe(podman: &str, seccomp: Seccomp) -> std::collections::BTreeMap<String, i32> {
    let output = run_in_worker(podman, seccomp, Some("python3"), &[], &["-c", PROBE], "");
    assert!(
        output.status.success(),
        "the probe failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, errno)| (name.to_string(), errno.trim().parse().expect("an errno")))
        .collect()
}

#[test]
fn the_shipped_profile_refuses_the_worker_what_it_never_needs_where_unconfined_does_not() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("SKIPPED: the probe's system call numbers are x86_64's");
        return;
    }
    let test = "the_shipped_profile_refuses_the_worker_what_it_never_needs";
    let Some(podman) = images::podman(test) else { return };
    const EPERM: i32 = 1;
    const ENOSYS: i32 = 38;
    let confined = probe(&podman, Seccomp::Profile(&images::sandbox_seccomp_profile()));
    assert_eq!(confined.len(), 9, "{confined:?}");
    for (name, errno) in &confined {
        let expected = if name == "clone3" { ENOSYS } else { EPERM };
        assert_eq!(*errno, expected, "{name} under the profile: {confined:?}");
    }
    // Unconfined, the keyring answers (an id, or an error other than EPERM): the refusals above
    // come from the profile, not from the kernel or the dropped capabilities.
    let unconfined = probe(&podman, Seccomp::Unconfined);
    assert_ne!(unconfined["keyctl"], EPERM, "unconfined: {unconfined:?}");
    assert_ne!(unconfined["clone3"], ENOSYS, "unconfined: {unconfined:?}");
}

#[test]
fn a_profile_that_also_refuses_mount_stops_the_sandbox_so_the_grading_test_bites() {
    let test = "a_profile_that_also_refuses_mount_stops_the_sandbox";
    let Some(podman) = images::podman(test) else { return };
    let shipped = images::sandbox_seccomp_profile();
    let mut profile: Value =
        serde_json::from_str(&std::fs::read_to_string(shipped).expect("the profile"))
            .expect("the profile is JSON");
    let rules = profile["syscalls"].as_array_mut().expect("syscalls");
    rules.push(json!({"names": ["mount"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}));
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("no-mount.json");
    std::fs::write(&path, profile.to_string()).expect("writing the profile");
    let right = "def double(x):\n    return 2 * x";
    let results = grade_in_worker(&podman, Seccomp::Profile(&path), &[right]);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["error"]["kind"], "sandbox", "{}", results[0]);
    // Nor does it start under the runtime's own default profile, which is why the profile ships
    // (podman's refuses bwrap's sethostname; Docker's and containerd's refuse its mounts).
    let results = grade_in_worker(&podman, Seccomp::RuntimeDefault, &[right]);
    assert_eq!(results[0]["error"]["kind"], "sandbox", "{}", results[0]);
}
