//! A minimal W3C WebDriver client over reqwest: just the commands the dashboard's browser tests
//! use (a full client crate pulled in features that rebuilt most of the dependency tree), and
//! what those tests share: a chromedriver process, waiting on the page, screenshots (serving the
//! app is `verity_tests::webdriver::serve`, beside the server it needs).

use base64::Engine;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The W3C key of an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session.
pub struct Browser {
    http: reqwest::Client,
    base: String,
}

/// An element of the current page.
pub struct Element<'a> {
    client: &'a Browser,
    id: String,
}

impl Browser {
    /// Opens a session on the WebDriver server at `server` with `capabilities`.
    pub async fn connect(server: &str, capabilities: Value) -> Browser {
        let http = reqwest::Client::new();
        let reply: Value = http
            .post(format!("{server}/session"))
            .json(&json!({"capabilities": {"alwaysMatch": capabilities}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = reply["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {reply}"))
            .to_string();
        Browser { http, base: format!("{server}/session/{id}") }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let reply: Value = request.send().await.unwrap().json().await.unwrap();
        if let Some(error) = reply["value"].get("error") {
            panic!("webdriver {path}: {error} {}", reply["value"]["message"]);
        }
        reply["value"].clone()
    }

    /// Navigates to `url`.
    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    /// The page's URL.
    pub async fn current_url(&self) -> String {
        self.command(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Runs `script` (a function body) with `args`; its return value.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// The first element matching `css`.
    pub async fn find(&self, css: &str) -> Element<'_> {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        let id = found[ELEMENT_KEY]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_string();
        Element { client: self, id }
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let data = self.command(reqwest::Method::GET, "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD.decode(data.as_str().unwrap()).unwrap()
    }

    /// Resizes the window.
    pub async fn set_window_size(&self, width: u32, height: u32) {
        self.command(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// The value of cookie `name` (HttpOnly ones included).
    pub async fn cookie(&self, name: &str) -> String {
        self.command(reqwest::Method::GET, &format!("/cookie/{name}"), None).await["value"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// When cookie `name` expires (Unix seconds; `None` for a session cookie).
    pub async fn cookie_expiry(&self, name: &str) -> Option<i64> {
        self.command(reqwest::Method::GET, &format!("/cookie/{name}"), None).await["expiry"]
            .as_i64()
    }

    /// Ends the session.
    pub async fn close(self) {
        let _ = self.http.delete(&self.base).send().await;
    }
}

impl Element<'_> {
    async fn command(&self, path: &str, body: Value) -> Value {
        self.client
            .command(reqwest::Method::POST, &format!("/element/{}{path}", self.id), Some(body))
            .await
    }

    /// Clicks it.
    pub async fn click(&self) {
        self.command("/click", json!({})).await;
    }

    /// Empties an input.
    pub async fn clear(&self) {
        self.command("/clear", json!({})).await;
    }

    /// Types `text` (for a file input: the file's path).
    pub async fn send_keys(&self, text: &str) {
        self.command("/value", json!({"text": text})).await;
    }
}

/// Longest wait for anything in the browser (generous: 2 shared cores, a training job).
pub const PATIENCE: Duration = Duration::from_secs(240);

/// A chromedriver process on a free port, killed on drop.
pub struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// Starts chromedriver (`VERITY_TEST_CHROMEDRIVER`) and waits until it answers.
    pub async fn start() -> Driver {
        let path = std::env::var("VERITY_TEST_CHROMEDRIVER")
            .unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        assert!(
            std::path::Path::new(&path).exists(),
            "chromedriver not found at {path}: run `. scripts/test-services.sh` first"
        );
        let port = crate::serve::free_port().unwrap();
        let child = Command::new(&path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let driver = Driver { child, port };
        let status = format!("http://127.0.0.1:{port}/status");
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if client.get(&status).send().await.is_ok_and(|r| r.status().is_success()) {
                return driver;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not answer on port {port}");
    }

    /// A headless Chromium session (`VERITY_TEST_CHROMIUM`), 1280×900.
    pub async fn browser(&self) -> Browser {
        let chromium =
            std::env::var("VERITY_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let caps = json!({"browserName": "chrome", "goog:chromeOptions": {"binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"]}});
        Browser::connect(&format!("http://127.0.0.1:{}", self.port), caps).await
    }
}

/// Where screenshots go.
pub fn shots_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Saves a screenshot of the viewport as `name.png` under [`shots_dir`].
pub async fn shot(c: &Browser, name: &str) {
    let png = c.screenshot().await;
    std::fs::write(shots_dir().join(format!("{name}.png")), png).unwrap();
}

/// Evaluates `expression` in the page until it is truthy; its value then.
pub async fn until(c: &Browser, expression: &str) -> Value {
    let script = format!("try {{ return ({expression}); }} catch (e) {{ return null; }}");
    let started = std::time::Instant::now();
    loop {
        let value = c.execute(&script, vec![]).await;
        let truthy = match &value {
            Value::Null | Value::Bool(false) => false,
            Value::String(s) => !s.is_empty(),
            Value::Number(n) => n.as_f64() != Some(0.0),
            _ => true,
        };
        if truthy {
            return value;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "timed out waiting for `{expression}` on {}",
            c.current_url().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Empties the element `css` and types `text` into it.
pub async fn fill(c: &Browser, css: &str, text: &str) {
    let element = c.find(css).await;
    element.clear().await;
    element.send_keys(text).await;
}

/// Clicks the element `css`.
pub async fn click(c: &Browser, css: &str) {
    c.find(css).await.click().await;
}

/// Opens `path` signed out, signs in on the login page it redirects to (as ada@example.com with
/// the test password) and waits until the browser is back on `path`.
pub async fn sign_in(c: &Browser, base: &str, path: &str) {
    c.goto(&format!("{base}{path}")).await;
    until(c, "location.pathname === '/login'").await;
    fill(c, "#email", "ada@example.com").await;
    fill(c, "#password", "password123").await;
    click(c, "#sign-in").await;
    until(c, &format!("location.pathname === '{}'", path.split('?').next().unwrap_or(path))).await;
}
