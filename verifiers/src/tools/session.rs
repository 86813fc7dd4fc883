//! A sandboxed tool's session: one sandbox, started at the tool's first call of an episode and
//! kept until the episode ends, whose interpreter keeps its state across calls. A call that runs
//! past its time limit or floods its output kills the sandbox and ends the episode; the
//! session's processes never outlive it.

use std::time::Duration;

use serde_json::{json, Value};

use super::{ToolLimits, ToolReply};
use crate::sandbox::{Exchange, RunLimits, SandboxConfig, SandboxSession};

/// Time the sandbox gets to start and load the job's tool functions (not counted against a
/// call: it is the service's work, not the model's).
const START_LIMIT: Duration = Duration::from_secs(30);

/// One tool's sandbox session over an episode.
pub struct ToolSession {
    functions: Vec<String>,
    cpu_budget: Duration,
    session: Option<SandboxSession>,
    load_errors: Vec<String>,
    ended: Option<String>,
    calls: usize,
}

impl ToolSession {
    /// A session that loads `functions` (Python sources) before its first call; every process
    /// of it may use `cpu_budget` of CPU time in all (the episode's tool time).
    pub fn new(functions: Vec<String>, cpu_budget: Duration) -> Self {
        ToolSession {
            functions,
            cpu_budget,
            session: None,
            load_errors: Vec::new(),
            ended: None,
            calls: 0,
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Sends one call (`{"code"}` or `{"function", "arguments"}`) and returns its result;
    /// `limits` bound this call (the sandbox's memory cap is the first call's).
    pub fn call(
        &mut self,
        sandbox: &SandboxConfig,
        message: &Value,
        limits: &ToolLimits,
    ) -> ToolReply {
        if let Some(why) = &self.ended {
            return ToolReply::fatal(why.clone());
        }
        if self.session.is_none() {
            match start(sandbox, &self.functions, self.cpu_budget, limits) {
                Ok((session, errors)) => {
                    self.session = Some(session);
                    self.load_errors = errors;
                }
                Err(reply) => return self.end(reply),
            }
        }
        let Some(session) = self.session.as_mut() else {
            return ToolReply::fatal("the tool session is gone");
        };
        self.calls += 1;
        let reply = match session.exchange(message, limits.timeout) {
            Exchange::Event(event) if event["event"] == "cell" => {
                cell_reply(&event, limits, &self.load_errors)
            }
            Exchange::Event(event) => {
                ToolReply::fatal(format!("the tool session sent an unexpected {}", event["event"]))
            }
            Exchange::TimedOut => ToolReply::fatal(format!(
                "the tool ran past its time limit of {} ms",
                limits.timeout.as_millis()
            )),
            Exchange::Ended => ToolReply::fatal(format!(
                "the tool's sandbox ended (a CPU or process limit?){}",
                excerpt(&session.stderr())
            )),
        };
        if reply.fatal.is_some() {
            return self.end(reply);
        }
        reply
    }

    /// Ends the session (its sandbox is killed); later calls fail with the same reason.
    fn end(&mut self, reply: ToolReply) -> ToolReply {
        self.session = None;
        self.ended = reply.fatal.clone();
        reply
    }
}

fn excerpt(stderr: &str) -> String {
    let text: String = stderr.trim().chars().take(300).collect();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// Starts the sandbox and waits until its interpreter has loaded the functions; returns the
/// session and the functions' load errors.
fn start(
    sandbox: &SandboxConfig,
    functions: &[String],
    cpu_budget: Duration,
    limits: &ToolLimits,
) -> Result<(SandboxSession, Vec<String>), ToolReply> {
    let request =
        json!({"mode": "session", "functions": functions, "max_output": limits.max_output_bytes});
    let run_limits = RunLimits {
        wall: START_LIMIT,
        cpu_seconds: cpu_budget.as_secs() + 2,
        memory_bytes: limits.memory_mb << 20,
    };
    let mut session = SandboxSession::start(sandbox, &request, &run_limits)
        .map_err(|e| ToolReply::fatal(e.to_string()))?;
    loop {
        match session.next_event(START_LIMIT) {
            Exchange::Event(event) if event["event"] == "ready" => continue,
            Exchange::Event(event) if event["event"] == "session" => {
                let errors = event["errors"]
                    .as_array()
                    .map(|e| e.iter().filter_map(Value::as_str).map(String::from).collect())
                    .unwrap_or_default();
                return Ok((session, errors));
            }
            Exchange::Event(event) => {
                let message = event["message"].as_str().unwrap_or("it sent an unexpected event");
                return Err(ToolReply::fatal(format!("the tool sandbox did not start: {message}")));
            }
            Exchange::TimedOut => {
                return Err(ToolReply::fatal("the tool sandbox did not start in time"));
            }
            Exchange::Ended => {
                return Err(ToolReply::fatal(format!(
                    "the tool sandbox did not start{}",
                    excerpt(&session.stderr())
                )));
            }
        }
    }
}

/// The reply of one `cell` event: the call's output, plus its error line when it failed.
fn cell_reply(event: &Value, limits: &ToolLimits, load_errors: &[String]) -> ToolReply {
    let output = event["output"].as_str().unwrap_or("");
    if event["truncated"] == true {
        return ToolReply::fatal(format!(
            "the tool printed more than {} bytes",
            limits.max_output_bytes
        ));
    }
    if event["ended"] == true {
        return ToolReply::fatal("the tool's process ended (os._exit, a signal or a limit)");
    }
    match event["error"].as_str() {
        None => ToolReply::ok(output),
        Some(line) => {
            let mut content = format!("{output}{line}");
            if !load_errors.is_empty() {
                content.push_str(&format!(
                    "\n(the job's tool functions failed to load: {})",
                    load_errors.join("; ")
                ));
            }
            ToolReply { content, error: true, fatal: None }
        }
    }
}
