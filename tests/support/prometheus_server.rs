//! Test servers for tests/prometheus.rs:
//! - `PrometheusServer`: a real Prometheus (Debian's package) on a free loopback port with a
//!   temporary storage directory, scraping an `Exporter` every second; killed on drop.
//! - `Exporter`: a tiny /metrics endpoint whose text the test changes.
//! - `FakeServer`: an HTTP server that records requests and answers as the test says, for what
//!   a real Prometheus cannot show (auth headers, 503s, warnings).
//! - `TlsServer` and `TestCerts`: a mutual-TLS server built on rustls, with certificates made by
//!   the `openssl` CLI.
//! - `PrometheusProxy`: forwards to a real Prometheus, and injects per query what a real one
//!   cannot be made to answer (5xx, slow, HTML, truncated, `status: error`, old samples); it can
//!   also close its port (connection refused) and open it again.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

// Each support file is compiled into every test binary that names it, so a test using two of
// them has two copies of this small module.
#[allow(clippy::duplicate_mod, reason = "a test binary that names two support files has two copies of this one")]
#[path = "test_pki.rs"]
mod test_pki;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{AbortHandle, JoinHandle};

const INSTALL_HINT: &str = "run scripts/install-test-deps (as root) to install it";

/// Serves `listener` with `handle` until the returned task is aborted.
fn serve<F, Fut>(listener: TcpListener, handle: F) -> JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let handle = handle.clone();
                    async move { Ok::<_, Infallible>(handle(req).await) }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    })
}

fn response(status: u16, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("valid status");
    response.headers_mut().insert("content-type", content_type.parse().expect("valid content type"));
    response
}

// ---------------------------------------------------------------------------------------------
// Exporter

/// A /metrics endpoint serving whatever text the test set last.
pub struct Exporter {
    addr: SocketAddr,
    text: Arc<Mutex<String>>,
    task: JoinHandle<()>,
}

impl Exporter {
    pub async fn start(text: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the exporter");
        let addr = listener.local_addr().expect("exporter address");
        let text = Arc::new(Mutex::new(text.to_string()));
        let shared = Arc::clone(&text);
        let task = serve(listener, move |_req| {
            let body = shared.lock().expect("exporter text").clone();
            async move { response(200, "text/plain; version=0.0.4", body) }
        });
        Exporter { addr, text, task }
    }

    pub fn set(&self, text: &str) {
        *self.text.lock().expect("exporter text") = text.to_string();
    }

    /// `host:port`, as a scrape target.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Prometheus

/// A real Prometheus, scraping one target every second. Killed on drop.
pub struct PrometheusServer {
    child: Option<Child>,
    port: u16,
    prefix: String,
    dir: tempfile::TempDir,
}

/// The `prometheus` binary: `$WATERMARKD_PROMETHEUS`, then PATH, then /usr/bin/prometheus.
/// Missing is a failure, not a skip: a test that silently does nothing proves nothing.
pub fn prometheus_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("WATERMARKD_PROMETHEUS") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file());
    let fallback = PathBuf::from("/usr/bin/prometheus");
    match on_path {
        Some(path) => path,
        None if fallback.is_file() => fallback,
        None => panic!("the prometheus binary is not on PATH nor at /usr/bin/prometheus: {INSTALL_HINT}"),
    }
}

fn free_port() -> u16 {
    // The port is free when this returns; Prometheus binding it a moment later can still race
    // with another process, which `start` handles by trying again.
    StdListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local address").port()
}

impl PrometheusServer {
    /// Prometheus scraping `target` (`host:port`) every second, at the root path.
    pub async fn start(target: &str) -> Self {
        Self::start_with_prefix(target, "").await
    }

    /// Same, with `--web.route-prefix` (e.g. `/prometheus`): the API is under the prefix.
    pub async fn start_with_prefix(target: &str, prefix: &str) -> Self {
        Self::start_in(tempfile::tempdir().expect("temp dir"), target, prefix).await
    }

    /// A Prometheus whose storage already holds `openmetrics` (samples with timestamps, ending
    /// in `# EOF`), written into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`
    /// before it starts: a history of any length, at once.
    pub async fn start_with_history(openmetrics: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let input = dir.path().join("history.om");
        std::fs::write(&input, openmetrics).expect("write the OpenMetrics history");
        let promtool = prometheus_binary().with_file_name("promtool");
        let output = Command::new(&promtool)
            .args(["tsdb", "create-blocks-from", "openmetrics", "--quiet"])
            .arg(&input)
            .arg(dir.path().join("data"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", promtool.display()));
        assert!(output.status.success(), "promtool failed: {}", String::from_utf8_lossy(&output.stderr));
        // Nothing to scrape: the port is closed, and the history is all there is.
        Self::start_in(dir, "127.0.0.1:9", "").await
    }

    async fn start_in(mut dir: tempfile::TempDir, target: &str, prefix: &str) -> Self {
        let binary = prometheus_binary();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: exporter\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let log_path = dir.path().join("prometheus.log");
            let log = std::fs::File::create(&log_path).expect("log file");
            let mut command = Command::new(&binary);
            command
                .arg(format!("--config.file={}", config.display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log);
            if !prefix.is_empty() {
                command.arg(format!("--web.route-prefix={prefix}"));
                command.arg(format!("--web.external-url=http://127.0.0.1:{port}{prefix}"));
            }
            let child =
                command.spawn().unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", binary.display()));
            let mut server = PrometheusServer { child: Some(child), port, prefix: prefix.to_string(), dir };
            match server.wait_ready().await {
                Ok(()) => return server,
                Err(log) => {
                    last_log = log;
                    server.stop();
                    // Keep the directory for the next try.
                    dir = std::mem::replace(&mut server.dir, tempfile::tempdir().expect("temp dir"));
                    if !last_log.contains("address already in use") {
                        break;
                    }
                }
            }
        }
        panic!("Prometheus did not start; its log:\n{last_log}");
    }

    /// Polls `/-/ready` for up to 30 s. `Err` carries the log when the process died or never
    /// became ready.
    async fn wait_ready(&mut self) -> Result<(), String> {
        watermarkd::adapters::backend::ensure_crypto_provider();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("client");
        let ready = format!("{}/-/ready", self.url());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("(exited with {status})\n{}", self.log()));
                }
            }
            if let Ok(resp) = client.get(&ready).send().await {
                if resp.status().is_success() {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("(not ready after 30s)\n{}", self.log()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The base URL, with the route prefix if any.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}{}", self.port, self.prefix)
    }

    /// The base URL without the route prefix.
    pub fn root_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills the server and waits for it to exit: its port then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------------------------
// Fake server

/// A request as the fake server saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Decoded query-string pairs.
    pub query: Vec<(String, String)>,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Query-string pairs, or the form body's when the body is a form.
    pub fn params(&self) -> Vec<(String, String)> {
        if self.header("content-type") == Some("application/x-www-form-urlencoded") {
            decode_pairs(&self.body)
        } else {
            self.query.clone()
        }
    }

    pub fn param(&self, name: &str) -> Option<String> {
        self.params().into_iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The query as the rules file wrote it (see [`written_query`]).
    pub fn written_query(&self) -> Option<String> {
        self.param("query").map(|sent| written_query(&sent))
    }

    /// Whether the query went with its data time asked for.
    pub fn dated(&self) -> bool {
        self.param("query").is_some_and(|sent| written_query(&sent) != sent)
    }
}

/// What the backend adds to a query that is a series selector (or one aggregation of one) to
/// learn the time of its data: `(QUERY) or label_replace(min(timestamp(SELECTOR)), ...)`, or for
/// a folded query `(QUERY) or label_replace(min by (K) (timestamp(SELECTOR)), ...)`.
const DATED_TAIL: &str = ") or label_replace(min";

/// The query as the rules file wrote it, from the one sent: faults and answers are keyed by it.
pub fn written_query(sent: &str) -> String {
    match (sent.strip_prefix('('), sent.rfind(DATED_TAIL)) {
        (Some(_), Some(end)) if sent.ends_with(r#", "watermarkd_sample", "time", "", "")"#) => {
            sent.get(1..end).unwrap_or(sent).to_string()
        }
        _ => sent.to_string(),
    }
}

fn decode_pairs(encoded: &str) -> Vec<(String, String)> {
    let url = reqwest::Url::parse(&format!("http://x/?{encoded}")).expect("pairs parse as a query string");
    url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// What the fake answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: &str) -> Self {
        Reply { status, content_type: "application/json", body: body.to_string(), delay: Duration::ZERO }
    }

    pub fn text(status: u16, body: &str) -> Self {
        Reply { status, content_type: "text/plain; charset=utf-8", body: body.to_string(), delay: Duration::ZERO }
    }

    /// A `vector` answer with one sample per value, all at `ts` seconds.
    pub fn vector(ts: f64, values: &[&str]) -> Self {
        let result: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!(r#"{{"metric":{{"__name__":"m","pod":"p{i}"}},"value":[{ts},"{v}"]}}"#))
            .collect();
        Self::json(
            200,
            &format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#, result.join(",")),
        )
    }

    /// A `vector` answer to a dated query: one series of `value` at the evaluation time `ts`,
    /// and the added series whose value is the time of its data, `data_seconds`.
    pub fn dated(ts: f64, value: &str, data_seconds: f64) -> Self {
        Self::json(
            200,
            &format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[
                    {{"metric":{{"__name__":"m"}},"value":[{ts},"{value}"]}},
                    {{"metric":{{"watermarkd_sample":"time"}},"value":[{ts},"{data_seconds}"]}}]}}}}"#
            ),
        )
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Handler = dyn Fn(usize, &Recorded) -> Reply + Send + Sync;

/// Records every request and answers with `handler(index, request)` (index: 0-based count of
/// requests so far).
pub struct FakeServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    max_in_flight: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl FakeServer {
    pub async fn start(handler: impl Fn(usize, &Recorded) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake server");
        let addr = listener.local_addr().expect("fake server address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let state = (Arc::clone(&requests), in_flight, Arc::clone(&max_in_flight), handler);
        let task = serve(listener, move |req: Request<Incoming>| {
            let (requests, in_flight, max_in_flight, handler) = state.clone();
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                max_in_flight.fetch_max(now, Ordering::SeqCst);
                let recorded = record(req).await;
                let index = {
                    let mut all = requests.lock().expect("requests");
                    all.push(recorded.clone());
                    all.len() - 1
                };
                let reply = handler(index, &recorded);
                tokio::time::sleep(reply.delay).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                response(reply.status, reply.content_type, reply.body)
            }
        });
        FakeServer { addr, requests, max_in_flight, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("requests").clone()
    }

    /// The most requests that were being answered at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(req: Request<Incoming>) -> Recorded {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(decode_pairs).unwrap_or_default();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Recorded { method, path, query, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

// ---------------------------------------------------------------------------------------------
// Proxy

/// What the proxy does with the requests for one query text.
#[derive(Clone, Debug)]
pub enum Injected {
    /// Answers this instead of forwarding.
    Reply(Reply),
    /// Forwards after this delay.
    Slow(Duration),
    /// Forwards, and cuts the answer's body in the middle.
    Truncated,
    /// A one-sample vector of `value` whose data is `age` older than the query's `time`, as
    /// Prometheus answers a series that stopped getting samples (within its lookback): the value
    /// at the evaluation time, and for a dated query its data time `age` back. An undated query
    /// gets the sample itself dated `age` back (a lagging replica or a stale cache).
    Old { age: Duration, value: String },
}

#[derive(Default)]
struct ProxyState {
    faults: HashMap<String, Injected>,
    /// Answers injected, per query text.
    injected: HashMap<String, usize>,
    /// Requests seen, per query text.
    seen: HashMap<String, usize>,
}

/// A proxy in front of a Prometheus (`upstream`, its base URL): every request is forwarded as
/// it came, unless `inject` set a fault for its `query` (as the rules file writes it).
pub struct PrometheusProxy {
    addr: SocketAddr,
    upstream: String,
    state: Arc<Mutex<ProxyState>>,
    /// The accept loop, while connections are accepted.
    server: Mutex<Option<JoinHandle<()>>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    /// While connections are refused: the port, bound but not listening.
    held: Mutex<Option<TcpSocket>>,
}

impl PrometheusProxy {
    pub async fn start(upstream: &str) -> Self {
        watermarkd::adapters::backend::ensure_crypto_provider();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let proxy = PrometheusProxy {
            addr,
            upstream: upstream.trim_end_matches('/').to_string(),
            state: Arc::new(Mutex::new(ProxyState::default())),
            server: Mutex::new(None),
            connections: Arc::new(Mutex::new(Vec::new())),
            held: Mutex::new(None),
        };
        proxy.listen(listener);
        proxy
    }

    fn listen(&self, listener: TcpListener) {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("proxy client");
        let (upstream, state, connections) =
            (self.upstream.clone(), Arc::clone(&self.state), Arc::clone(&self.connections));
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (client, upstream, state) = (client.clone(), upstream.clone(), Arc::clone(&state));
                let task = tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (client, upstream, state) = (client.clone(), upstream.clone(), Arc::clone(&state));
                        async move { Ok::<_, Infallible>(proxy(req, &client, &upstream, &state).await) }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
                let mut open = connections.lock().expect("connections");
                open.retain(|t| !t.is_finished());
                open.push(task.abort_handle());
            }
        });
        *self.server.lock().expect("server") = Some(server);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on, requests for `query` get `fault` (`None`: forwarded again).
    pub fn inject(&self, query: &str, fault: Option<Injected>) {
        let mut state = self.state.lock().expect("proxy state");
        match fault {
            Some(fault) => state.faults.insert(query.to_string(), fault),
            None => state.faults.remove(query),
        };
    }

    /// How many answers for `query` were injected so far.
    pub fn injected(&self, query: &str) -> usize {
        self.state.lock().expect("proxy state").injected.get(query).copied().unwrap_or(0)
    }

    /// How many requests for `query` arrived so far.
    pub fn seen(&self, query: &str) -> usize {
        self.state.lock().expect("proxy state").seen.get(query).copied().unwrap_or(0)
    }

    fn close(&self) {
        if let Some(server) = self.server.lock().expect("server").take() {
            server.abort();
        }
        for connection in self.connections.lock().expect("connections").drain(..) {
            connection.abort();
        }
    }

    /// Closes the port: open connections are closed and new ones refused, until
    /// `accept_connections`. The port stays bound (not listening, so a connection attempt is
    /// refused) and no other socket can take it meanwhile.
    pub async fn refuse_connections(&self) {
        let server = self.server.lock().expect("server").take();
        if let Some(server) = server {
            server.abort();
            // Cancelled once dropped, and the listener with it.
            let _ = server.await;
        }
        self.close();
        *self.held.lock().expect("held") = Some(bind_reusable(self.addr));
    }

    /// Listens again on the same port.
    pub async fn accept_connections(&self) {
        let Some(held) = self.held.lock().expect("held").take() else { return };
        drop(held);
        let listener = bind_reusable(self.addr).listen(1024).expect("listen again");
        self.listen(listener);
    }
}

/// A socket bound to `addr` (with SO_REUSEADDR), not listening yet: connections are refused.
fn bind_reusable(addr: SocketAddr) -> TcpSocket {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket.bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    socket
}

impl Drop for PrometheusProxy {
    fn drop(&mut self) {
        self.close();
    }
}

async fn proxy(
    req: Request<Incoming>,
    client: &reqwest::Client,
    upstream: &str,
    state: &Mutex<ProxyState>,
) -> Response<Full<Bytes>> {
    let path_and_query = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    let recorded = record(req).await;
    let query = recorded.written_query().unwrap_or_default();
    let fault = {
        let mut state = state.lock().expect("proxy state");
        *state.seen.entry(query.clone()).or_default() += 1;
        let fault = state.faults.get(&query).cloned();
        if fault.is_some() {
            *state.injected.entry(query.clone()).or_default() += 1;
        }
        fault
    };
    match &fault {
        Some(Injected::Reply(reply)) => {
            tokio::time::sleep(reply.delay).await;
            return response(reply.status, reply.content_type, reply.body.clone());
        }
        Some(Injected::Old { age, value }) => {
            let time = recorded.param("time").and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0);
            let reply = if recorded.dated() {
                Reply::dated(time, value, time - age.as_secs_f64())
            } else {
                Reply::vector(time - age.as_secs_f64(), &[value.as_str()])
            };
            return response(reply.status, reply.content_type, reply.body);
        }
        Some(Injected::Slow(delay)) => tokio::time::sleep(*delay).await,
        Some(Injected::Truncated) | None => {}
    }
    let method = reqwest::Method::from_bytes(recorded.method.as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut forward = client.request(method, format!("{upstream}{path_and_query}"));
    if let Some(content_type) = recorded.header("content-type") {
        forward = forward.header("content-type", content_type).body(recorded.body.clone());
    }
    let answer = async {
        let answer = forward.send().await?;
        let status = answer.status().as_u16();
        let content_type = answer
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        Ok::<_, reqwest::Error>((status, content_type, answer.text().await?))
    };
    match answer.await {
        Ok((status, content_type, mut body)) => {
            if matches!(fault, Some(Injected::Truncated)) {
                let mut cut = body.len() / 2;
                while !body.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.truncate(cut);
            }
            response(status, &content_type, body)
        }
        Err(e) => response(502, "text/plain", format!("proxy: {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// TLS

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all made by `openssl`.
pub struct TestCerts {
    pub dir: tempfile::TempDir,
}

impl TestCerts {
    pub fn generate() -> Self {
        Self::for_server("IP:127.0.0.1,DNS:localhost")
    }

    /// As `generate`, with a server certificate for the names in `subject_alt_names`
    /// (`DNS:reco.internal`).
    pub fn for_server(subject_alt_names: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        test_pki::make_ca(dir.path(), "ca.key", "ca.pem", "watermarkd test CA");
        let server_san = format!("subjectAltName={subject_alt_names}\n");
        for (name, usage, san) in [("server", "serverAuth", server_san.as_str()), ("client", "clientAuth", "")] {
            let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
            test_pki::sign(
                dir.path(),
                ("ca.key", "ca.pem"),
                (&key, &pem),
                &format!("watermarkd test {name}"),
                usage,
                san,
            );
        }
        TestCerts { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

/// An HTTPS server that requires a client certificate signed by the CA, and answers every
/// request with `body` (JSON). Blocking rustls on plain threads: no async TLS crate needed.
pub struct TlsServer {
    pub addr: SocketAddr,
    seen: Arc<std::sync::Mutex<Vec<Seen>>>,
}

/// Per request: the name the client sent in the TLS handshake (SNI), and its `Host` header.
pub type Seen = (Option<String>, Option<String>);

impl TlsServer {
    pub fn start(certs: &TestCerts, body: &str) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        watermarkd::adapters::backend::ensure_crypto_provider();
        let load_certs = |path: &Path| -> Vec<CertificateDer<'static>> {
            CertificateDer::pem_file_iter(path).expect("cert file").collect::<Result<_, _>>().expect("certs")
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in load_certs(&certs.path("ca.pem")) {
            roots.add(ca).expect("CA certificate");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build().expect("client verifier");
        let key = PrivateKeyDer::from_pem_file(certs.path("server.key")).expect("server key");
        let config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(load_certs(&certs.path("server.pem")), key)
            .expect("server config");
        let config = Arc::new(config);
        let listener = StdListener::bind("127.0.0.1:0").expect("bind the TLS server");
        let addr = listener.local_addr().expect("TLS server address");
        let body = body.to_string();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen_by_server = Arc::clone(&seen);
        // Lives as long as the test process; each connection gets a thread.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (config, body, seen) = (Arc::clone(&config), body.clone(), Arc::clone(&seen_by_server));
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let Ok(connection) = rustls::ServerConnection::new(config) else { return };
                    let mut tls = rustls::StreamOwned::new(connection, stream);
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // A failed handshake (no client certificate, untrusted server certificate)
                    // shows up here as a read error: the connection is dropped.
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&request).to_string();
                    let host = head
                        .lines()
                        .find_map(|l| l.split_once(':').filter(|(name, _)| name.eq_ignore_ascii_case("host")))
                        .map(|(_, value)| value.trim().to_string());
                    seen.lock().unwrap().push((tls.conn.server_name().map(String::from), host));
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(answer.as_bytes());
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
        TlsServer { addr, seen }
    }

    /// Per request answered: the TLS server name the client sent, and its `Host` header.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }
}
