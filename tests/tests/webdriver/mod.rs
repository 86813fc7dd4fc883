//! A minimal W3C WebDriver client over reqwest: just the commands the dashboard's browser test
//! uses (a full client crate pulled in features that rebuilt most of the dependency tree).
#![allow(dead_code)]

use base64::Engine;
use serde_json::{json, Value};

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
