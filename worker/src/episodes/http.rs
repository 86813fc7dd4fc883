//! User tools served by an HTTP endpoint the operator allows ([`HTTP_ALLOW_ENV`]): each call
//! POSTs its arguments as JSON; a 2xx body is the result, any other answer a tool error.
//! Connection failures and 5xx answers are retried (`http.retries`, with a short back-off)
//! within the call's time limit; redirects are not followed (an allowed prefix cannot send the
//! worker elsewhere). Sandboxed code never gets the network; only the worker makes these calls.

use std::io::Read;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use verity_core::environment::{HttpAllowList, HttpTool, HTTP_ALLOW_ENV};
use verity_verifiers::tools::{ToolLimits, ToolReply};

/// One client for every call (connection reuse); `None` if TLS could not be set up.
static CLIENT: LazyLock<Option<reqwest::blocking::Client>> = LazyLock::new(|| {
    reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().ok()
});

/// Calls the endpoint with `arguments` under `limits`.
pub fn call(
    allow: &HttpAllowList,
    endpoint: &HttpTool,
    arguments: &Value,
    limits: &ToolLimits,
) -> ToolReply {
    // The URL sent is the one checked: parsed once, `.`/`..` resolved, compared by parts.
    let url = match allow.check(&endpoint.url) {
        Ok(url) => url,
        Err(e) => {
            return ToolReply::error(format!(
                "the endpoint {} is not on this worker's {HTTP_ALLOW_ENV}: {e}",
                endpoint.url
            ))
        }
    };
    let Some(client) = CLIENT.as_ref() else {
        return ToolReply::fatal("the worker has no HTTP client (TLS set-up failed)");
    };
    let time_limit = || {
        ToolReply::fatal(format!(
            "the tool ran past its time limit of {} ms",
            limits.timeout.as_millis()
        ))
    };
    let deadline = Instant::now() + limits.timeout;
    let mut last = String::from("no attempt was made");
    for attempt in 0..=endpoint.retries {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return time_limit();
        }
        match client.post(url.url().clone()).timeout(left).json(arguments).send() {
            Ok(response) if response.status().is_server_error() => {
                last = format!("HTTP {}", response.status());
            }
            Ok(response) => {
                let status = response.status();
                let cap = limits.max_output_bytes;
                let mut body = Vec::new();
                if let Err(e) = response.take(cap as u64 + 1).read_to_end(&mut body) {
                    // reqwest reports a body read past the request's timeout as its own error
                    let timed_out = e
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
                        .is_some_and(reqwest::Error::is_timeout);
                    if timed_out {
                        return time_limit();
                    }
                    return ToolReply::error(format!("reading the endpoint's answer failed: {e}"));
                }
                if body.len() > cap {
                    return ToolReply::fatal(format!("the tool printed more than {cap} bytes"));
                }
                let text = String::from_utf8_lossy(&body).into_owned();
                return if status.is_success() {
                    ToolReply::ok(text)
                } else {
                    ToolReply::error(format!("HTTP {status}: {text}"))
                };
            }
            Err(e) if e.is_timeout() => return time_limit(),
            Err(e) => last = e.to_string(),
        }
        if attempt < endpoint.retries {
            let backoff = Duration::from_millis(100 << attempt.min(4));
            std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
    ToolReply::error(format!("the endpoint failed after {} attempts: {last}", endpoint.retries + 1))
}

/// Test servers' side of one HTTP exchange on loopback.
#[cfg(test)]
pub(crate) mod exchange {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;

    /// Reads one request: its request line and its body.
    pub fn read_request(stream: &TcpStream) -> (String, String) {
        let mut reader = BufReader::new(stream);
        let (mut first, mut length) = (String::new(), 0);
        reader.read_line(&mut first).ok();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok();
        (first, String::from_utf8_lossy(&body).into_owned())
    }

    /// Answers with `status` and `text`, closing the connection.
    pub fn answer(mut stream: &TcpStream, status: u16, text: &str) {
        let _ = write!(
            stream,
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::exchange::{answer, read_request};
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A one-thread HTTP server: answers each request with `respond(n, body)` (status, body),
    /// `n` counting requests from 0.
    fn serve(respond: fn(usize, &str) -> (u16, String)) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/tool", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (_, body) = read_request(&stream);
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let (status, text) = respond(n, &body);
                answer(&stream, status, &text);
            }
        });
        (url, count)
    }

    fn limits() -> ToolLimits {
        ToolLimits { timeout: Duration::from_secs(10), memory_mb: 0, max_output_bytes: 64 }
    }

    #[test]
    fn posts_the_arguments_retries_5xx_and_refuses_what_the_operator_did_not_allow() {
        let (url, count) =
            serve(
                |n, body| {
                    if n == 0 {
                        (503, "busy".into())
                    } else {
                        (200, format!("got {body}"))
                    }
                },
            );
        let endpoint = HttpTool { url: url.clone(), retries: 2 };
        let allow = HttpAllowList::parse(&url);
        let reply = call(&allow, &endpoint, &serde_json::json!({"city": "Oslo"}), &limits());
        assert_eq!(reply, ToolReply::ok(r#"got {"city":"Oslo"}"#));
        assert_eq!(count.load(Ordering::SeqCst), 2, "one retry after the 503");
        let refused = call(&HttpAllowList::default(), &endpoint, &Value::Null, &limits());
        assert!(
            refused.error && refused.fatal.is_none() && refused.content.contains(HTTP_ALLOW_ENV)
        );
        assert_eq!(count.load(Ordering::SeqCst), 2, "a refused call sends nothing");
    }

    #[test]
    fn client_errors_are_tool_errors_and_a_flood_ends_the_episode() {
        let (url, _) =
            serve(
                |n, _| if n == 0 { (404, "no such city".into()) } else { (200, "x".repeat(1000)) },
            );
        let endpoint = HttpTool { url: url.clone(), retries: 0 };
        let allow = HttpAllowList::parse(&url);
        let missing = call(&allow, &endpoint, &Value::Null, &limits());
        assert!(missing.error && missing.fatal.is_none(), "{missing:?}");
        assert!(missing.content.contains("404") && missing.content.contains("no such city"));
        let flood = call(&allow, &endpoint, &Value::Null, &limits());
        assert!(flood.fatal.is_some_and(|f| f.contains("more than 64 bytes")));
        let closed = HttpTool { url: "http://127.0.0.1:9/tool".into(), retries: 1 };
        let down =
            call(&HttpAllowList::parse("http://127.0.0.1:9/"), &closed, &Value::Null, &limits());
        assert!(
            down.error && down.fatal.is_none() && down.content.contains("after 2 attempts"),
            "{down:?}"
        );
    }
    /// A loopback server that records request lines and answers each with a redirect to
    /// `/internal`.
    fn redirecting() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = lines.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let (line, _) = read_request(&stream);
                seen.lock().unwrap().push(line.trim_end().to_string());
                let _ = std::io::Write::write_all(
                    &mut stream,
                    b"HTTP/1.1 302 Found\r\nlocation: /internal\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        (base, lines)
    }

    #[test]
    fn urls_that_leave_the_allowed_prefix_send_nothing_and_redirects_are_not_followed() {
        let (base, lines) = redirecting();
        let port = base.rsplit(':').next().unwrap().to_string();
        let allow = HttpAllowList::parse(&format!("{base}/v1/"));
        for url in [
            format!("{base}/v1/../internal"),
            format!("{base}/v1/%2e%2e/internal2"),
            format!("http://127.0.0.1:{port}@127.0.0.2:{port}/v1/"),
        ] {
            let endpoint = HttpTool { url: url.clone(), retries: 0 };
            let refused = call(&allow, &endpoint, &Value::Null, &limits());
            assert!(
                refused.error && refused.content.contains(HTTP_ALLOW_ENV),
                "{url}: {refused:?}"
            );
        }
        assert!(lines.lock().unwrap().is_empty(), "refused URLs reach no listener");
        let endpoint = HttpTool { url: format!("{base}/v1/tool"), retries: 0 };
        let moved = call(&allow, &endpoint, &Value::Null, &limits());
        assert!(moved.error && moved.content.contains("302"), "{moved:?}");
        assert_eq!(*lines.lock().unwrap(), vec!["POST /v1/tool HTTP/1.1".to_string()]);
    }
}
