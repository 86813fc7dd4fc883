//! A long-lived harness run: one sandbox kept open for a series of exchanges (a tool's session
//! over an episode). The request travels on the input pipe as for one-shot runs; later messages
//! travel framed (a 4-byte big-endian length and one JSON value) on a third pipe, and every
//! answer comes back as a nonce-tagged verdict event. Each exchange has its own wall-clock
//! limit; running past it, or dropping the session, kills the whole process group.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::SandboxConfig;
use super::run::{
    nonce, payload, pipe, set_nonblocking, spawn, verdict_event, RunLimits, Stream, INPUT_FD,
    MESSAGES_FD, VERDICT_FD,
};
use super::SandboxError;

/// Bytes of verdict lines buffered before a line completes.
const MAX_PENDING_VERDICT: usize = 8 << 20;

/// What waiting for the session's next event gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Exchange {
    /// The next verdict event (nonce removed).
    Event(Value),
    /// The wait ran past its limit; the session was killed.
    TimedOut,
    /// The sandbox exited (or closed its verdict pipe) before answering.
    Ended,
}

/// One sandbox kept open across exchanges; killed when dropped.
pub struct SandboxSession {
    child: Child,
    pgid: libc::pid_t,
    nonce: String,
    messages: Option<OwnedFd>,
    /// bwrap's stdout, stderr and the verdict pipe.
    streams: [Stream; 3],
    events: VecDeque<Value>,
    exited: bool,
    killed: bool,
}

impl SandboxSession {
    /// Starts the harness with `request` (its `mode` must be a session mode) under `limits`
    /// (`limits.wall` is not applied: each exchange has its own limit).
    pub fn start(
        config: &SandboxConfig,
        request: &Value,
        limits: &RunLimits,
    ) -> Result<Self, SandboxError> {
        if let Some(why) = &config.unavailable {
            return Err(SandboxError::Unavailable(why.clone()));
        }
        let nonce = nonce().map_err(SandboxError::Io)?;
        let input = payload(config, request, &nonce)?;
        let (verdict_r, verdict_w) = pipe().map_err(SandboxError::Io)?;
        let (input_r, input_w) = pipe().map_err(SandboxError::Io)?;
        let (messages_r, messages_w) = pipe().map_err(SandboxError::Io)?;
        let mut child = spawn(
            config,
            limits,
            &[(&verdict_w, VERDICT_FD), (&input_r, INPUT_FD), (&messages_r, MESSAGES_FD)],
        )?;
        drop((verdict_w, input_r, messages_r));
        let pgid = child.id() as libc::pid_t;
        let take = |fd: Option<OwnedFd>| {
            fd.ok_or_else(|| SandboxError::Io(io::Error::other("missing child pipe")))
        };
        let stdout = take(child.stdout.take().map(OwnedFd::from))?;
        let stderr = take(child.stderr.take().map(OwnedFd::from))?;
        let streams = [
            Stream::new(stdout, config.max_output_bytes).map_err(SandboxError::Io)?,
            Stream::new(stderr, config.max_output_bytes).map_err(SandboxError::Io)?,
            Stream::new(verdict_r, MAX_PENDING_VERDICT).map_err(SandboxError::Io)?,
        ];
        set_nonblocking(messages_w.as_raw_fd()).map_err(SandboxError::Io)?;
        let mut session = SandboxSession {
            child,
            pgid,
            nonce,
            messages: Some(messages_w),
            streams,
            events: VecDeque::new(),
            exited: false,
            killed: false,
        };
        // The harness reads its whole request before anything else; a harness that died
        // early makes this write fail, and the session then ends at its first wait.
        let mut input_w = std::fs::File::from(input_w);
        if let Err(e) = input_w.write_all(&input) {
            if e.kind() != io::ErrorKind::BrokenPipe {
                return Err(SandboxError::Io(e));
            }
        }
        drop(input_w);
        session.pump();
        Ok(session)
    }

    /// Waits up to `timeout` for the session's next event.
    pub fn next_event(&mut self, timeout: Duration) -> Exchange {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(event) = self.events.pop_front() {
                return Exchange::Event(event);
            }
            if self.killed || (self.exited && self.streams[2].fd.is_none()) {
                return Exchange::Ended;
            }
            let now = Instant::now();
            if now >= deadline {
                self.kill();
                return Exchange::TimedOut;
            }
            self.wait_readable(deadline.saturating_duration_since(now));
            self.pump();
        }
    }

    /// Sends one framed message and waits up to `timeout` (writing included) for the answer.
    pub fn exchange(&mut self, message: &Value, timeout: Duration) -> Exchange {
        let deadline = Instant::now() + timeout;
        let Ok(body) = serde_json::to_vec(message) else { return Exchange::Ended };
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let mut written = 0;
        while written < frame.len() {
            let Some(fd) = &self.messages else { return Exchange::Ended };
            let rest = &frame[written..];
            // SAFETY: writing from a live slice to an fd we own.
            let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
            if n > 0 {
                written += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {}
                _ => {
                    self.messages = None;
                    return Exchange::Ended;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                self.kill();
                return Exchange::TimedOut;
            }
            self.pump();
            if self.exited {
                return Exchange::Ended;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.next_event(deadline.saturating_duration_since(Instant::now()))
    }

    /// What the sandbox printed on stderr so far (capped), for diagnostics.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.streams[1].buf).into_owned()
    }

    fn wait_readable(&mut self, left: Duration) {
        let mut polls: Vec<libc::pollfd> = self
            .streams
            .iter()
            .filter_map(|s| s.fd.as_ref())
            .map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        let wait_ms = left.as_millis().clamp(1, 50) as libc::c_int;
        if polls.is_empty() {
            std::thread::sleep(Duration::from_millis(wait_ms as u64));
        } else {
            // SAFETY: polls is a valid array of pollfd for the duration of the call.
            unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait_ms) };
        }
    }

    /// Reads what the pipes hold, parses complete verdict lines and notes an exited sandbox.
    fn pump(&mut self) {
        for s in &mut self.streams {
            s.pump();
        }
        let verdict = &mut self.streams[2];
        while let Some(end) = verdict.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = verdict.buf.drain(..=end).collect();
            if let Some(event) = verdict_event(&String::from_utf8_lossy(&line), &self.nonce) {
                self.events.push_back(event);
            }
        }
        if !self.exited {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.exited = true;
                // anything of the sandbox still holding a pipe goes with its group
                // SAFETY: signalling the process group we created.
                unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
            }
        }
    }

    fn kill(&mut self) {
        self.killed = true;
        self.messages = None;
        // SAFETY: signalling the process group we created.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
    }
}

impl Drop for SandboxSession {
    fn drop(&mut self) {
        self.kill();
        let _ = self.child.wait();
    }
}
