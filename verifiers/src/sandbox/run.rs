//! Spawning one harness run under bubblewrap: pipes, rlimits, identity, the poll loop and the
//! wall-clock kill of the whole process group.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::SandboxConfig;
use super::SandboxError;

/// The harness script run inside the sandbox: the verdict process, which never runs untrusted code.
const HARNESS: &str = concat!(include_str!("wire.py"), include_str!("harness.py"));
/// The child script the harness starts to run untrusted code (the program, or a user's grade()).
const CHILD: &str = concat!(include_str!("wire.py"), include_str!("child.py"));
/// Bytes of verdict lines kept.
const MAX_VERDICT_BYTES: usize = 8 << 20;
/// How long pipes may stay open after the sandbox exits or is killed.
const DRAIN_GRACE: Duration = Duration::from_secs(3);
/// Fixed fd numbers inside the sandbox.
pub(super) const VERDICT_FD: RawFd = 3;
pub(super) const INPUT_FD: RawFd = 4;
/// The session's message pipe (framed messages after the request; session mode only).
pub(super) const MESSAGES_FD: RawFd = 5;
/// The first of the seccomp programs' fds, which only bwrap sees (it reads and closes them).
const SECCOMP_FD: RawFd = 6;

/// Limits of one run.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// Wall-clock limit of the whole run.
    pub wall: Duration,
    /// CPU seconds per process.
    pub cpu_seconds: u64,
    /// Address space per process, in bytes.
    pub memory_bytes: u64,
}

/// What one run produced.
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    /// Verdict events whose nonce matched (nonce removed), in order.
    pub events: Vec<Value>,
    /// The wall-clock limit was hit and the run was killed.
    pub timed_out: bool,
    /// Exit code of bubblewrap, when it exited normally.
    pub exit_code: Option<i32>,
    /// Captured stdout (capped).
    pub stdout: String,
    /// Captured stderr (capped).
    pub stderr: String,
    /// Stdout or stderr exceeded the cap.
    pub output_truncated: bool,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl RunOutcome {
    /// The harness started (it reads its input before any untrusted code runs).
    pub fn ready(&self) -> bool {
        self.events.iter().any(|e| e["event"] == "ready")
    }

    /// The harness reached its end.
    pub fn finished(&self) -> bool {
        self.events.iter().any(|e| e["event"] == "done")
    }

    /// Checks the shape every verdict stream has: `ready` first, only the given kinds (plus
    /// `ready` and `done`) after it, and `done`, when present, once and last. Only the harness
    /// holds the verdict pipe and the nonce, so a stream breaking this is a harness bug or a
    /// breach, never a verdict.
    pub fn check_shape(&self, kinds: &[&str]) -> Result<(), String> {
        let kind = |e: &Value| e["event"].as_str().unwrap_or("").to_string();
        match self.events.first() {
            Some(e) if e["event"] == "ready" => {}
            _ => return Err("it does not start with ready".into()),
        }
        for (i, e) in self.events.iter().enumerate().skip(1) {
            let k = kind(e);
            if k == "done" {
                if i + 1 != self.events.len() {
                    return Err("events follow done".into());
                }
            } else if !kinds.contains(&k.as_str()) {
                return Err(format!("unexpected event '{k}'"));
            }
        }
        Ok(())
    }

    /// Events of one kind.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.events.iter().filter(move |e| e["event"] == kind)
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub(super) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array; we take ownership of both right away.
    unsafe {
        cvt(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC))?;
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

pub(super) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = cvt(libc::fcntl(fd, libc::F_GETFL))?;
        cvt(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK))?;
    }
    Ok(())
}

pub(super) fn nonce() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    // SAFETY: getrandom fills the buffer it is given.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(io::Error::other("getrandom failed"));
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Tasks (threads) the given uid runs now; the process limit of a non-root run adds to it.
fn tasks_of_uid(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let mut total = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let owner = field("Uid:")
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok());
        if owner == Some(uid) {
            total += field("Threads:").and_then(|v| v.parse::<u64>().ok()).unwrap_or(1);
        }
    }
    total
}

/// bwrap arguments. As root, bwrap runs privileged without a user namespace and the harness
/// drops to `run_uid` itself (so the process limit binds); otherwise a user namespace is used.
/// `filters` seccomp programs wait at fds `SECCOMP_FD`, `SECCOMP_FD + 1`, ….
fn bwrap_args(config: &SandboxConfig, run_uid: Option<u32>, filters: usize) -> Vec<String> {
    let namespaces: &[&str] = match run_uid {
        Some(_) => &[
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--cap-add",
            "CAP_CHOWN",
        ],
        None => &[
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--uid",
            "1000",
            "--gid",
            "1000",
        ],
    };
    let mut args: Vec<String> = namespaces
        .iter()
        .chain(&[
            "--new-session",
            "--die-with-parent",
            "--hostname",
            "sandbox",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/work",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            // one BLAS/OpenMP thread: the grader image's numpy would otherwise start one per
            // core, past the run's process and address-space limits
            "--setenv",
            "OPENBLAS_NUM_THREADS",
            "1",
            "--setenv",
            "OMP_NUM_THREADS",
            "1",
            "--ro-bind",
            "/usr",
            "/usr",
        ])
        .map(|s| s.to_string())
        .collect();
    for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    args.extend([
                        "--symlink".into(),
                        target.to_string_lossy().into_owned(),
                        dir.into(),
                    ]);
                }
            }
            Ok(m) if m.is_dir() => args.extend(["--ro-bind".into(), dir.into(), dir.into()]),
            _ => {}
        }
    }
    for root in config.python_roots.iter().chain(&config.grader_packages) {
        // parents such as /root must be traversable by the unprivileged run uid
        let mut parents: Vec<&Path> =
            root.ancestors().skip(1).filter(|p| p.parent().is_some()).collect();
        parents.reverse();
        for parent in parents {
            args.extend([
                "--perms".into(),
                "0755".into(),
                "--dir".into(),
                parent.to_string_lossy().into_owned(),
            ]);
        }
        let root = root.to_string_lossy().into_owned();
        args.extend(["--ro-bind".into(), root.clone(), root]);
    }
    for i in 0..filters {
        args.extend(["--add-seccomp-fd".into(), (SECCOMP_FD + i as RawFd).to_string()]);
    }
    let size = config.workdir_bytes.to_string();
    args.extend(
        [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            &size,
            "--tmpfs",
            "/work",
            "--size",
            &size,
            "--tmpfs",
            "/tmp",
            "--remount-ro",
            "/",
            "--chdir",
            "/work",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.push(config.python.to_string_lossy().into_owned());
    args.extend(["-I".into(), "-S".into(), "-c".into(), HARNESS.into()]);
    if let Some(uid) = run_uid {
        args.push(uid.to_string());
    }
    args
}

/// Next uid of the per-run range (used only when running as root).
fn next_uid(config: &SandboxConfig) -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    config.uid_base + NEXT.fetch_add(1, Ordering::Relaxed) % config.uid_count.max(1)
}

/// Starts bwrap under `limits` with each `(fd, number)` of `pipes` as that fd number inside, and
/// the seccomp filter ([`super::seccomp`]) for everything bwrap starts.
pub(super) fn spawn(
    config: &SandboxConfig,
    limits: &RunLimits,
    pipes: &[(&OwnedFd, RawFd)],
) -> Result<Child, SandboxError> {
    // kept open until bwrap has started; bwrap reads each and closes it before the harness runs
    let filters = super::seccomp::filter_files()?;
    let sources: Vec<(RawFd, RawFd)> = pipes
        .iter()
        .map(|(fd, to)| (fd.as_raw_fd(), *to))
        .chain(filters.iter().zip(SECCOMP_FD..).map(|(fd, to)| (fd.as_raw_fd(), to)))
        .collect();
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let run_uid = if is_root { Some(next_uid(config)) } else { None };
    // SAFETY: as above.
    let own_uid = unsafe { libc::getuid() };
    let nproc =
        if is_root { config.max_processes } else { tasks_of_uid(own_uid) + config.max_processes };
    let limits = *limits;
    let file_bytes = config.max_file_bytes;
    let mut command = Command::new(&config.bwrap);
    command
        .args(bwrap_args(config, run_uid, filters.len()))
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe functions
    // (fcntl, dup2, setrlimit) on values prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            let mut moved = Vec::with_capacity(sources.len());
            for &(src, dst) in &sources {
                moved.push((cvt(libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 100))?, dst));
            }
            for &(tmp, dst) in &moved {
                cvt(libc::dup2(tmp, dst))?;
            }
            let set = |resource, soft: u64, hard: u64| -> io::Result<()> {
                let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
                cvt(libc::setrlimit(resource, &limit)).map(|_| ())
            };
            set(libc::RLIMIT_AS, limits.memory_bytes, limits.memory_bytes)?;
            set(libc::RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 1)?;
            set(libc::RLIMIT_FSIZE, file_bytes, file_bytes)?;
            set(libc::RLIMIT_CORE, 0, 0)?;
            set(libc::RLIMIT_NOFILE, 256, 256)?;
            set(libc::RLIMIT_NPROC, nproc, nproc)?;
            Ok(())
        });
    }
    command.spawn().map_err(SandboxError::Spawn)
}

pub(super) struct Stream {
    pub(super) fd: Option<OwnedFd>,
    pub(super) buf: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Stream {
    pub(super) fn new(fd: OwnedFd, cap: usize) -> io::Result<Self> {
        set_nonblocking(fd.as_raw_fd())?;
        Ok(Self { fd: Some(fd), buf: Vec::new(), cap, truncated: false })
    }

    /// Reads what is available; closes on EOF.
    pub(super) fn pump(&mut self) {
        let Some(fd) = &self.fd else { return };
        let mut chunk = [0u8; 65536];
        loop {
            // SAFETY: reading into a local buffer from an fd we own.
            let n = unsafe { libc::read(fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n > 0 {
                let n = n as usize;
                let room = self.cap.saturating_sub(self.buf.len());
                self.buf.extend_from_slice(&chunk[..n.min(room)]);
                self.truncated |= n > room;
            } else if n == 0 {
                self.fd = None;
                return;
            } else {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    if err.kind() != io::ErrorKind::WouldBlock {
                        self.fd = None;
                    }
                    return;
                }
            }
        }
    }
}

/// The harness's input: `request` with the run's nonce, the site paths (the grader image's
/// packages first) and the child's source.
pub(super) fn payload(
    config: &SandboxConfig,
    request: &Value,
    nonce: &str,
) -> Result<Vec<u8>, SandboxError> {
    let mut payload = request.clone();
    if let Value::Object(map) = &mut payload {
        map.insert("nonce".into(), Value::String(nonce.to_string()));
        // the grader image's pins come before whatever the interpreter has installed
        let site: Vec<Value> = config
            .grader_packages
            .iter()
            .chain(&config.python_site_paths)
            .map(|p| Value::String(p.to_string_lossy().into_owned()))
            .collect();
        map.insert("site_paths".into(), Value::Array(site));
        map.insert("child_source".into(), Value::String(CHILD.into()));
    }
    serde_json::to_vec(&payload).map_err(|e| SandboxError::Io(io::Error::other(e)))
}

/// The verdict events in `line` (one JSON line), when its nonce matches; the nonce removed.
pub(super) fn verdict_event(line: &str, nonce: &str) -> Option<Value> {
    let mut v = serde_json::from_str::<Value>(line).ok()?;
    if v.get("nonce").and_then(Value::as_str) != Some(nonce) {
        return None;
    }
    if let Value::Object(map) = &mut v {
        map.remove("nonce");
    }
    Some(v)
}

/// Runs the harness with `request` (a JSON object; a fresh nonce is added) under `limits`.
pub fn run_harness(
    config: &SandboxConfig,
    request: &Value,
    limits: &RunLimits,
) -> Result<RunOutcome, SandboxError> {
    if let Some(why) = &config.unavailable {
        return Err(SandboxError::Unavailable(why.clone()));
    }
    let started = Instant::now();
    let nonce = nonce().map_err(SandboxError::Io)?;
    let input = payload(config, request, &nonce)?;
    let (verdict_r, verdict_w) = pipe().map_err(SandboxError::Io)?;
    let (input_r, input_w) = pipe().map_err(SandboxError::Io)?;
    let mut child = spawn(config, limits, &[(&verdict_w, VERDICT_FD), (&input_r, INPUT_FD)])?;
    drop((verdict_w, input_r));
    let pgid = child.id() as libc::pid_t;
    let outcome =
        supervise(config, limits, &mut child, verdict_r, input_w, &input, pgid, &nonce, started);
    // whatever happened, nothing of this run survives it
    // SAFETY: signalling the process group we created.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
    outcome
}

#[allow(clippy::too_many_arguments)]
fn supervise(
    config: &SandboxConfig,
    limits: &RunLimits,
    child: &mut Child,
    verdict_r: OwnedFd,
    input_w: OwnedFd,
    input: &[u8],
    pgid: libc::pid_t,
    nonce: &str,
    started: Instant,
) -> Result<RunOutcome, SandboxError> {
    let take = |fd: Option<OwnedFd>| {
        fd.ok_or_else(|| SandboxError::Io(io::Error::other("missing child pipe")))
    };
    let stdout = take(child.stdout.take().map(OwnedFd::from))?;
    let stderr = take(child.stderr.take().map(OwnedFd::from))?;
    let mut streams = [
        Stream::new(stdout, config.max_output_bytes).map_err(SandboxError::Io)?,
        Stream::new(stderr, config.max_output_bytes).map_err(SandboxError::Io)?,
        Stream::new(verdict_r, MAX_VERDICT_BYTES).map_err(SandboxError::Io)?,
    ];
    set_nonblocking(input_w.as_raw_fd()).map_err(SandboxError::Io)?;
    let mut input_w = Some(input_w);
    let mut written = 0;
    let deadline = started + limits.wall;
    let mut timed_out = false;
    let mut exit_code = None;
    let mut grace_until: Option<Instant> = None;
    loop {
        let mut polls: Vec<libc::pollfd> = streams
            .iter()
            .filter_map(|s| s.fd.as_ref())
            .map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        if let Some(w) = &input_w {
            polls.push(libc::pollfd { fd: w.as_raw_fd(), events: libc::POLLOUT, revents: 0 });
        }
        let streams_open = streams.iter().any(|s| s.fd.is_some());
        if !streams_open && exit_code.is_some() {
            break;
        }
        let now = Instant::now();
        if let Some(until) = grace_until {
            if now >= until {
                break;
            }
        }
        if now >= deadline && !timed_out {
            timed_out = true;
            // SAFETY: killing the process group we created.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            grace_until = Some(now + DRAIN_GRACE);
        }
        let wait_ms =
            deadline.saturating_duration_since(now).as_millis().clamp(1, 50) as libc::c_int;
        if !polls.is_empty() {
            // SAFETY: polls is a valid array of pollfd for the duration of the call.
            unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait_ms) };
        } else {
            std::thread::sleep(Duration::from_millis(wait_ms as u64));
        }
        for s in &mut streams {
            s.pump();
        }
        if let Some(w) = &input_w {
            while written < input.len() {
                let rest = &input[written..];
                // SAFETY: writing from a live slice to an fd we own.
                let n = unsafe { libc::write(w.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
                if n > 0 {
                    written += n as usize;
                } else {
                    let err = io::Error::last_os_error();
                    if err.kind() == io::ErrorKind::WouldBlock
                        || err.kind() == io::ErrorKind::Interrupted
                    {
                        break;
                    }
                    written = input.len(); // reader gone
                }
            }
            if written >= input.len() {
                input_w = None;
            }
        }
        if exit_code.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                exit_code = Some(status.code().unwrap_or(-1));
                // the sandbox is gone; anything still holding a pipe is killed with its group
                // SAFETY: killing the process group we created.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                grace_until.get_or_insert(Instant::now() + DRAIN_GRACE);
            }
        }
    }
    let [out, err, verdict] = streams;
    let events = String::from_utf8_lossy(&verdict.buf)
        .lines()
        .filter_map(|line| verdict_event(line, nonce))
        .collect();
    Ok(RunOutcome {
        events,
        timed_out,
        exit_code,
        output_truncated: out.truncated || err.truncated,
        stdout: String::from_utf8_lossy(&out.buf).into_owned(),
        stderr: String::from_utf8_lossy(&err.buf).into_owned(),
        elapsed: started.elapsed(),
    })
}
