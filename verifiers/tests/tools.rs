//! The tools against the real sandbox: the python session keeps state across calls in one
//! long-lived sandbox, its per-call limits hold (a hang or an output flood ends the episode,
//! memory is capped, there is no network), the code grader's escape suite holds against the
//! session, and user tools (Python functions) run in their own session. Assertions are about
//! containment, never speed.

use std::time::{Duration, Instant};

use serde_json::json;
use verity_verifiers::tools::function::FunctionSession;
use verity_verifiers::tools::python::PythonSession;
use verity_verifiers::tools::{calculator, ToolLimits};
use verity_verifiers::SandboxConfig;

mod containment;
use containment::{processes_left_after_waiting, CONTAINED_WITHIN};

fn limits(timeout_ms: u64) -> ToolLimits {
    ToolLimits {
        timeout: Duration::from_millis(timeout_ms),
        memory_mb: 128,
        max_output_bytes: 1024,
    }
}

fn call(
    session: &mut PythonSession,
    code: &str,
    timeout_ms: u64,
) -> verity_verifiers::tools::ToolReply {
    let started = Instant::now();
    let reply =
        session.call(&SandboxConfig::default(), &json!({ "code": code }), &limits(timeout_ms));
    assert!(started.elapsed() < CONTAINED_WITHIN, "not contained: {reply:?}");
    reply
}

#[test]
fn python_session_keeps_variables_across_calls() {
    let mut session = PythonSession::new(Duration::from_secs(60));
    let first = call(&mut session, "x = 1234\nprint('set')", 10_000);
    assert_eq!((first.content.as_str(), first.error), ("set\n", false), "{first:?}");
    let second = call(&mut session, "def f(y):\n    return x * y\nf(5678)", 10_000);
    assert_eq!(second.content.trim(), "7006652", "{second:?}");
    let failed = call(&mut session, "1 / 0", 10_000);
    assert!(failed.error && failed.fatal.is_none(), "recoverable: {failed:?}");
    assert!(failed.content.contains("ZeroDivisionError"), "{failed:?}");
    let after = call(&mut session, "x + 1", 10_000);
    assert_eq!(after.content.trim(), "1235", "state survives an error: {after:?}");
    assert_eq!(session.cells(), 4);
}

#[test]
fn a_hanging_call_ends_the_episode_at_its_time_limit() {
    let mut session = PythonSession::new(Duration::from_secs(60));
    let reply = call(&mut session, "while True:\n    pass", 500);
    assert!(reply.error, "{reply:?}");
    assert!(reply.fatal.as_deref().is_some_and(|f| f.contains("time limit")), "{reply:?}");
}

#[test]
fn an_output_flood_ends_the_episode_at_the_output_cap() {
    let mut session = PythonSession::new(Duration::from_secs(60));
    let reply = call(&mut session, "while True:\n    print('x' * 1000)", 10_000);
    assert!(reply.fatal.as_deref().is_some_and(|f| f.contains("more than 1024")), "{reply:?}");
    assert!(reply.content.len() < 200, "the flood is not the result: {}", reply.content.len());
}

#[test]
fn memory_is_capped_and_there_is_no_network() {
    let mut session = PythonSession::new(Duration::from_secs(60));
    let big = call(&mut session, "b = bytearray(1 << 30)", 10_000);
    assert!(big.error && big.content.contains("MemoryError"), "{big:?}");
    let net = call(
        &mut session,
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
        10_000,
    );
    assert!(net.error && net.fatal.is_none(), "{net:?}");
    assert!(net.content.contains("Error"), "{net:?}");
}

#[test]
fn one_sandbox_serves_the_whole_session_and_dies_with_it() {
    let marker = format!("verity-session-marker-{}", std::process::id());
    let mut session = PythonSession::new(Duration::from_secs(60));
    let pid = call(&mut session, "import os\nos.getpid()", 10_000);
    let again = call(&mut session, "os.getpid()", 10_000);
    assert_eq!(pid.content, again.content, "the same interpreter answers every call");
    let started = call(
        &mut session,
        &format!(
            "import subprocess, sys\n\
             bg = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'], start_new_session=True)\n\
             print('started')"
        ),
        10_000,
    );
    assert_eq!(started.content.trim(), "started", "{started:?}");
    assert_eq!(call(&mut session, "bg.poll() is None", 10_000).content.trim(), "True");
    drop(session);
    assert_eq!(processes_left_after_waiting(&marker), 0, "a process outlived its session");
}

/// The code grader's escape suite (tests/sandbox.rs), as cells of one session.
#[test]
fn the_escape_suite_holds_against_the_session() {
    let mut session = PythonSession::new(Duration::from_secs(60));
    let host_dir = std::env::temp_dir().join(format!("verity-tool-escape-{}", std::process::id()));
    std::fs::create_dir_all(&host_dir).unwrap();
    let target = host_dir.join("pwned.txt");
    let secret = host_dir.join("server.env");
    std::fs::write(&secret, "VERITY_JWT_SECRET=do-not-leak").unwrap();
    let probes = call(
        &mut session,
        &format!(
            "import os, socket\n\
             def write(path):\n    try:\n        open(path, 'w').write('pwned')\n        return True\n    except OSError:\n        return False\n\
             def read(path):\n    try:\n        return open(path).read()\n    except OSError:\n        return None\n\
             def reach():\n    try:\n        socket.create_connection(('127.0.0.1', 22), timeout=2).close()\n        return True\n    except OSError:\n        return False\n\
             [write('/usr/pwned'), write('/etc/pwned'), write({target:?}), write('/work/ok.txt'),\n \
              read({secret:?}), read('/etc/shadow'), reach(), 'VERITY' in ''.join(os.environ)]",
            target = target.to_string_lossy(),
            secret = secret.to_string_lossy()
        ),
        20_000,
    );
    assert_eq!(
        probes.content.trim(),
        "[False, False, False, True, None, None, False, False]",
        "{probes:?}"
    );
    assert!(!target.exists(), "a sandboxed write reached the host");
    std::fs::remove_dir_all(&host_dir).ok();
    // a fork bomb fails its call (or ends the session), and the host can still start processes
    let bomb = call(
        &mut session,
        "import os, time\nn = 0\nwhile n < 100000:\n    try:\n        os.fork()\n    except OSError:\n        n += 1\n        time.sleep(0.001)",
        3_000,
    );
    assert!(bomb.error, "{bomb:?}");
    assert!(std::process::Command::new("true").status().unwrap().success());
}

#[test]
fn memory_bombs_sleepers_and_exits_end_cleanly() {
    let mut session = PythonSession::new(Duration::from_secs(60));
    let hog =
        call(&mut session, "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))", 10_000);
    assert!(hog.error && hog.content.contains("MemoryError"), "{hog:?}");
    let after = call(&mut session, "del hog\n6 * 7", 10_000);
    assert_eq!(after.content.trim(), "42", "the session survives a MemoryError: {after:?}");
    let nap = call(&mut session, "import time\ntime.sleep(10**6)", 500);
    assert!(nap.fatal.as_deref().is_some_and(|f| f.contains("time limit")), "{nap:?}");
    let later = call(&mut session, "1", 10_000);
    assert!(later.fatal.is_some(), "a session killed at its limit stays over: {later:?}");
    let mut exits = PythonSession::new(Duration::from_secs(60));
    let exit = call(&mut exits, "raise SystemExit(0)", 10_000);
    assert!(exit.error && exit.fatal.is_none() && exit.content.contains("SystemExit"), "{exit:?}");
    let hard = call(&mut exits, "import os\nos._exit(0)", 10_000);
    assert!(hard.fatal.is_some(), "{hard:?}");
}

#[test]
fn user_tool_functions_run_in_their_own_session() {
    let source = "TABLE = {'oslo': 3, 'lima': 19}\ncalls = []\n\
                  def temperature(city):\n    calls.append(city)\n    return {'city': city, 'celsius': TABLE[city.lower()], 'calls': len(calls)}\n";
    let mut tool = FunctionSession::new(source, Duration::from_secs(60));
    let sandbox = SandboxConfig::default();
    let reply = tool.call(&sandbox, "temperature", &json!({"city": "Oslo"}), &limits(10_000));
    assert_eq!(reply.content.trim(), r#"{"city": "Oslo", "celsius": 3, "calls": 1}"#, "{reply:?}");
    let again = tool.call(&sandbox, "temperature", &json!({"city": "Lima"}), &limits(10_000));
    assert!(again.content.contains("\"calls\": 2"), "state persists: {again:?}");
    let missing = tool.call(&sandbox, "temperature", &json!({"city": "Rome"}), &limits(10_000));
    assert!(missing.error && missing.fatal.is_none() && missing.content.contains("KeyError"));
    let bad_args = tool.call(&sandbox, "temperature", &json!({"town": "Oslo"}), &limits(10_000));
    assert!(bad_args.error && bad_args.content.contains("TypeError"), "{bad_args:?}");
    let mut broken = FunctionSession::new("def f(:\n", Duration::from_secs(60));
    let reply = broken.call(&sandbox, "f", &json!({}), &limits(10_000));
    assert!(reply.error && reply.content.contains("failed to load"), "{reply:?}");
}

#[test]
fn calculator_multiplies_four_digit_numbers_exactly() {
    assert_eq!(calculator::call(&json!({"expression": "9876 * 5432"})).content, "53646432");
}
