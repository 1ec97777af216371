//! A headless Chromium driven over WebDriver (W3C, JSON over HTTP) by Debian's chromedriver:
//! enough of the protocol to load a page, find, type, click, run a line of script, lay the page
//! out at a phone's width and take a screenshot. scripts/install-test-deps installs both.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The key WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    client: reqwest::Client,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Browser {
    /// Starts chromedriver and one headless Chromium session, 1400 x 1000.
    pub async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/install-test-deps installs it)");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(answer) = client.get(format!("{base}/status")).send().await {
                if answer.status().is_success() {
                    break;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        // Headless, and nothing that reaches for the network beyond the page itself.
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--window-size=1400,1000".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args },
        }}});
        let answer = client.post(format!("{base}/session")).json_body(&capabilities).send().await.unwrap();
        let answer: Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {answer}"))
            .to_string();
        Browser { driver, base, session, client, _profile: profile }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.client.request(method, &url);
        if let Some(body) = body {
            request = request.json_body(&body);
        }
        let answer = request.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let value: Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
        if value["value"].get("error").is_some() {
            panic!("WebDriver {path}: {}", value["value"]);
        }
        value["value"].clone()
    }

    pub async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url }))).await;
    }

    /// The elements `css` finds now, as WebDriver references.
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let found =
            self.call(reqwest::Method::POST, "/elements", Some(json!({ "using": "css selector", "value": css }))).await;
        found.as_array().unwrap().iter().filter_map(|e| e[ELEMENT].as_str().map(str::to_string)).collect()
    }

    pub async fn text(&self, element: &str) -> String {
        self.call(reqwest::Method::GET, &format!("/element/{element}/text"), None).await.as_str().unwrap().to_string()
    }

    pub async fn type_into(&self, element: &str, text: &str) {
        self.call(reqwest::Method::POST, &format!("/element/{element}/value"), Some(json!({ "text": text }))).await;
    }

    pub async fn click(&self, element: &str) {
        self.call(reqwest::Method::POST, &format!("/element/{element}/click"), Some(json!({}))).await;
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub async fn run(&self, script: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", Some(json!({ "script": script, "args": [] }))).await
    }

    /// Lays the page out as a device `width` x `height` CSS px wide would (a phone with
    /// `mobile`: the page's viewport meta tag counts), through Chromium's DevTools protocol
    /// (chromedriver's `goog/cdp/execute`); a window cannot be made as narrow as a phone.
    pub async fn set_viewport(&self, width: u32, height: u32, mobile: bool) {
        let params = json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile });
        let body = json!({ "cmd": "Emulation.setDeviceMetricsOverride", "params": params });
        self.call(reqwest::Method::POST, "/goog/cdp/execute", Some(body)).await;
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        let encoded = self.call(reqwest::Method::GET, "/screenshot", None).await;
        base64_decode(encoded.as_str().unwrap())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// JSON bodies without reqwest's `json` feature.
trait JsonBody {
    fn json_body(self, value: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, value: &Value) -> Self {
        self.header("content-type", "application/json").body(value.to_string())
    }
}

/// Standard base64, as WebDriver sends a screenshot.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0);
    for sextet in text.bytes().filter_map(value) {
        bits = (bits << 6) | u32::from(sextet);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
