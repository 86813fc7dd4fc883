//! `python`: a stateful Python session in the bubblewrap sandbox.
//!
//! Each call runs in a fresh sandbox (no network, the sandbox's rlimits and a memory cap), which
//! first replays the session's earlier cells with their output discarded, so variables,
//! functions and imports persist across an episode's calls; the new cell's stdout (and the value
//! of a final expression, as in a notebook) is the result. Exceptions are reported as the result
//! (a tool error the model may recover from); running past the per-call time limit or printing
//! more than the output cap ends the episode. The replay counts against the call's time limit.

use serde_json::{json, Value};

use super::{ToolLimits, ToolReply};
use crate::code::{startup_failure, Limits};
use crate::sandbox::{run_harness, SandboxConfig};

/// The program the sandbox runs: replays `_cells[:-1]` silently, then runs the last cell.
const SESSION: &str = r#"
import ast as _ast, contextlib as _cl, io as _io, json as _json, sys as _sys, traceback as _tb
_cells = _json.loads(_sys.stdin.read())
_ns = {"__name__": "__main__", "__builtins__": __builtins__}

def _run(source, show):
    tree = _ast.parse(source, "<cell>")
    last = None
    if show and tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _ns)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), _ns)
        if value is not None:
            print(repr(value))

for _cell in _cells[:-1]:
    try:
        with _cl.redirect_stdout(_io.StringIO()), _cl.redirect_stderr(_io.StringIO()):
            _run(_cell, False)
    except BaseException:
        pass
try:
    _run(_cells[-1], True)
except BaseException as _e:
    _sys.stdout.write(_tb.format_exception_only(type(_e), _e)[-1])
    _sys.stdout.flush()
    _sys.exit(1)
"#;

/// The python tool's function schema, in OpenAI's `tools` format.
pub fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": "python",
        "description": "Runs Python code; variables persist between calls. Prints stdout and the value of the last expression.",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "Python source"}},
            "required": ["code"]}}})
}

/// One episode's Python session: the cells run so far.
#[derive(Debug, Clone, Default)]
pub struct PythonSession {
    cells: Vec<String>,
}

impl PythonSession {
    /// A session with nothing run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs one call (`{"code": "..."}`) under `limits`; the cell joins the session whatever
    /// it did, so later calls see what it defined before failing.
    pub fn call(
        &mut self,
        sandbox: &SandboxConfig,
        arguments: &Value,
        limits: &ToolLimits,
    ) -> ToolReply {
        let Some(code) = arguments.get("code").and_then(Value::as_str) else {
            return ToolReply::error("python takes {\"code\": \"...\"}");
        };
        self.cells.push(code.to_string());
        let input = match serde_json::to_string(&self.cells) {
            Ok(input) => input,
            Err(e) => return ToolReply::fatal(format!("cannot encode the session: {e}")),
        };
        let timeout_ms = limits.timeout.as_millis() as u64;
        let request = json!({
            "mode": "cases", "program": SESSION, "inputs": [input],
            "case_timeout_s": timeout_ms as f64 / 1000.0,
            "max_case_output": limits.max_output_bytes,
        });
        let run_limits = Limits { timeout_ms, memory_mb: limits.memory_mb }.run_limits(1);
        let outcome = match run_harness(sandbox, &request, &run_limits) {
            Ok(outcome) => outcome,
            Err(e) => return ToolReply::fatal(e.to_string()),
        };
        if let Some(failure) = startup_failure(&outcome) {
            return ToolReply::fatal(failure.reason);
        }
        let Some(case) = outcome.of_kind("case").next() else {
            return ToolReply::fatal(if outcome.timed_out {
                "python ran past its time limit".to_string()
            } else {
                "the python session ended without a result".to_string()
            });
        };
        let stdout = case["stdout"].as_str().unwrap_or("").to_string();
        if case["timed_out"] == true {
            return ToolReply::fatal(format!("python ran past its time limit of {timeout_ms} ms"));
        }
        if case["truncated"] == true {
            return ToolReply::fatal(format!(
                "python printed more than {} bytes",
                limits.max_output_bytes
            ));
        }
        match case["returncode"].as_i64() {
            Some(0) => ToolReply::ok(stdout),
            Some(1) if !stdout.is_empty() => {
                ToolReply { content: stdout, error: true, fatal: None }
            }
            code => ToolReply::error(format!(
                "python exited with code {} (killed by a limit?){}",
                code.map_or("none".to_string(), |c| c.to_string()),
                if stdout.is_empty() { String::new() } else { format!(": {stdout}") }
            )),
        }
    }

    /// Cells run so far.
    pub fn cells(&self) -> usize {
        self.cells.len()
    }
}
