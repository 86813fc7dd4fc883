//! The built-in tools against the real sandbox: the python session keeps state across calls,
//! and its per-call limits hold (a hang or an output flood ends the episode, memory is capped,
//! there is no network). Assertions are about containment, never speed.

use std::time::{Duration, Instant};

use serde_json::json;
use verity_verifiers::tools::python::PythonSession;
use verity_verifiers::tools::{calculator, ToolLimits};
use verity_verifiers::SandboxConfig;

/// Far above every limit used here: a call that needs this long was not contained.
const CONTAINED_WITHIN: Duration = Duration::from_secs(60);

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
    let mut session = PythonSession::new();
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
    let mut session = PythonSession::new();
    let reply = call(&mut session, "while True:\n    pass", 500);
    assert!(reply.error, "{reply:?}");
    assert!(reply.fatal.as_deref().is_some_and(|f| f.contains("time limit")), "{reply:?}");
}

#[test]
fn an_output_flood_ends_the_episode_at_the_output_cap() {
    let mut session = PythonSession::new();
    let reply = call(&mut session, "while True:\n    print('x' * 1000)", 10_000);
    assert!(reply.fatal.as_deref().is_some_and(|f| f.contains("more than 1024")), "{reply:?}");
    assert!(reply.content.len() < 200, "the flood is not the result: {}", reply.content.len());
}

#[test]
fn memory_is_capped_and_there_is_no_network() {
    let mut session = PythonSession::new();
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
fn calculator_multiplies_four_digit_numbers_exactly() {
    assert_eq!(calculator::call(&json!({"expression": "9876 * 5432"})).content, "53646432");
}
