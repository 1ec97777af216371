//! Who may read the status API and page (docs/status.md, "Who may read it"), through real HTTP
//! against a running daemon: the bearer token's length limit, the TokenReview rate limit and
//! cache, what a failed review tells the reader, the SubjectAccessReview and the token
//! audiences on a real kube-apiserver, the loopback exemption (exactly 127.0.0.1 and ::1, also
//! on a `[::]` listener), the Host header check, and the binary's default listener.
//!
//! The counting tests point the daemon's kubeconfig at a stand-in API server (plain HTTP, in
//! this process) that answers TokenReviews and SubjectAccessReviews and counts them; the daemon
//! makes no other API call with no autoscaler and no leader election.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[macro_use]
#[path = "support/eventually.rs"]
mod eventually;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;

use std::convert::Infallible;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;

const STARTUP: Duration = Duration::from_secs(30);
const TOKEN: &str = "status-access-test-token";
/// What docs/status.md promises: a burst of 20 reviews of new tokens, then 10 a second.
const REVIEW_BURST: usize = 20;
const REVIEWS_PER_SECOND: f64 = 10.0;

// ---------------------------------------------------------------------------------------------
// A stand-in API server: TokenReviews and SubjectAccessReviews, counted

/// How the stand-in answers a TokenReview.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReviewAnswer {
    /// Authenticated when the token starts with `good-`, as user `reader` (allowed to read) or,
    /// for `good-other-`, `other` (not allowed); the audiences asked for are granted.
    Review,
    /// 403, as when the daemon's ServiceAccount may not create TokenReviews.
    Forbidden,
}

/// The Kubernetes Status of a refused TokenReview creation, naming the daemon's identity.
const FORBIDDEN_STATUS: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:watermarkd:watermarkd\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope","reason":"Forbidden","details":{"group":"authentication.k8s.io","kind":"tokenreviews"},"code":403}"#;

#[derive(Default)]
struct Seen {
    /// The `spec` of each TokenReview.
    token_reviews: Vec<Value>,
    /// The `spec` of each SubjectAccessReview.
    access_reviews: Vec<Value>,
    /// Bytes of review request bodies received (the daemon's other calls, such as its check
    /// at the start that a state ConfigMap could be written, are not counted).
    bytes: usize,
}

struct StandIn {
    url: String,
    answer: Arc<Mutex<ReviewAnswer>>,
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn standin_answer(answer: ReviewAnswer, seen: &Mutex<Seen>, path: &str, body: &[u8]) -> (u16, String) {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let spec = request["spec"].clone();
    let mut seen = seen.lock().unwrap();
    if path.contains("review") {
        seen.bytes += body.len();
    }
    match path {
        "/apis/authentication.k8s.io/v1/tokenreviews" => {
            seen.token_reviews.push(spec.clone());
            if answer == ReviewAnswer::Forbidden {
                return (403, FORBIDDEN_STATUS.to_string());
            }
            let token = spec["token"].as_str().unwrap_or_default();
            let user = if token.starts_with("good-other-") { "other" } else { "reader" };
            let status = if token.starts_with("good-") {
                json!({
                    "authenticated": true,
                    "user": { "username": user, "uid": format!("uid-{user}"), "groups": ["readers", "system:authenticated"],
                              "extra": { "example.com/team": ["platform"] } },
                    "audiences": spec["audiences"].clone(),
                })
            } else {
                json!({ "authenticated": false, "error": "invalid bearer token" })
            };
            let answer = json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec, "status": status });
            (201, answer.to_string())
        }
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
            seen.access_reviews.push(spec.clone());
            let allowed = spec["user"] == "reader";
            let answer = json!({ "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
                                 "status": { "allowed": allowed } });
            (201, answer.to_string())
        }
        _ => (
            404,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404})
                .to_string(),
        ),
    }
}

impl StandIn {
    async fn start() -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let answer = Arc::new(Mutex::new(ReviewAnswer::Review));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (a, s) = (Arc::clone(&answer), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (answer, seen) = (Arc::clone(&a), Arc::clone(&s));
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let (answer, seen) = (Arc::clone(&answer), Arc::clone(&seen));
                        async move {
                            let path = request.uri().path().to_string();
                            let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let mode = *answer.lock().unwrap();
                            let (status, text) = standin_answer(mode, &seen, &path, &body);
                            let mut response = Response::new(Full::new(Bytes::from(text)));
                            *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            response.headers_mut().insert("content-type", "application/json".parse().unwrap());
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        StandIn { url, answer, seen, task }
    }

    fn answer(&self, answer: ReviewAnswer) {
        *self.answer.lock().unwrap() = answer;
    }

    fn token_reviews(&self) -> Vec<Value> {
        self.seen.lock().unwrap().token_reviews.clone()
    }

    fn access_reviews(&self) -> Vec<Value> {
        self.seen.lock().unwrap().access_reviews.clone()
    }

    fn bytes(&self) -> usize {
        self.seen.lock().unwrap().bytes
    }

    /// A kubeconfig for the daemon, pointing at the stand-in.
    fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\n\
             users:\n- name: daemon\n  user:\n    token: daemon-own-token\n\
             contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: daemon\ncurrent-context: standin\n",
            self.url
        )
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `watermarkd run` with no autoscaler, no leader election, this settings file and, when given,
/// `--listen`; its log in a file.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(kubeconfig: &str, settings: &str, listen: Option<&str>) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.toml");
        std::fs::write(&rules, "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9\"\n").unwrap();
        let kubeconfig_path = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig).unwrap();
        let settings_path = dir.path().join("watermarkd.toml");
        std::fs::write(&settings_path, settings).unwrap();
        let log = dir.path().join("watermarkd.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_watermarkd"));
        command
            .arg("run")
            .arg("--rules")
            .arg(&rules)
            .arg("--kubeconfig")
            .arg(&kubeconfig_path)
            .arg("--settings")
            .arg(&settings_path)
            .arg("--no-leader-election")
            .env_remove("KUBECONFIG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("WATERMARKD_")) {
            command.env_remove(key);
        }
        if let Some(listen) = listen {
            command.args(["--listen", listen]);
        }
        Daemon { child: Some(command.spawn().expect("start watermarkd run")), log, _dir: dir }
    }

    fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits until `/healthz` at `address` answers.
    async fn wait_serving(&mut self, address: SocketAddr) {
        let deadline = tokio::time::Instant::now() + STARTUP;
        loop {
            if let Some(status) = self.exited() {
                panic!("watermarkd exited with {status}; log:\n{}", self.log());
            }
            if let Ok(reply) = try_send(address, None, &request_text("/healthz", &address.to_string(), None)).await {
                if reply.status == 200 {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "watermarkd not serving at {address}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- watermarkd log ---\n{}", self.log());
        }
    }
}

/// A daemon on `127.0.0.1:PORT` (or `listen_ip`), serving: where to reach it.
async fn serving(kubeconfig: &str, settings: &str, listen_ip: &str) -> (Daemon, u16) {
    let port = free_port();
    let listen = if listen_ip.contains(':') { format!("[{listen_ip}]:{port}") } else { format!("{listen_ip}:{port}") };
    let mut daemon = Daemon::start(kubeconfig, settings, Some(&listen));
    daemon.wait_serving(SocketAddr::from(([127, 0, 0, 1], port))).await;
    (daemon, port)
}

fn token_file_settings(dir: &Path, extra: &str) -> String {
    let path = dir.join("status-token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    format!("[status]\ntoken_file = {:?}\n{extra}", path.display().to_string())
}

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1 client: the Host header, the source address and the token as the test says

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

fn request_text(path: &str, host: &str, token: Option<&str>) -> String {
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}Connection: close\r\n\r\n")
}

async fn try_send(to: SocketAddr, from: Option<IpAddr>, text: &str) -> std::io::Result<Reply> {
    let socket = if to.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(from) = from {
        socket.bind(SocketAddr::new(from, 0))?;
    }
    let mut stream = socket.connect(to).await?;
    stream.write_all(text.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Reply { status, headers, body: body.to_string() })
}

/// GET `path` at `to`, from `from` when given, naming `host`, with `token` when given.
async fn get(to: SocketAddr, from: Option<&str>, path: &str, host: &str, token: Option<&str>) -> Reply {
    let from = from.map(|f| f.parse().unwrap());
    try_send(to, from, &request_text(path, host, token)).await.unwrap_or_else(|e| panic!("GET {path} at {to}: {e}"))
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

const AUTOSCALERS: &str = "/api/v1/autoscalers";
/// Tokens checked with the API server, from loopback too (the tests connect from 127.0.0.1).
const REVIEW_ONLY: &str = "[status]\ntoken_review = true\nopen_on_loopback = false\n";

// ---------------------------------------------------------------------------------------------
// T4-3: the token length limit, the review rate limit and the cache

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_token_is_refused_without_a_review() {
    let standin = StandIn::start().await;
    let (_daemon, port) = serving(&standin.kubeconfig(), REVIEW_ONLY, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let host = to.to_string();
    // A 300 KB token is refused before anything else: no review, nothing sent.
    let huge = "x".repeat(300_000);
    let reply = get(to, None, AUTOSCALERS, &host, Some(&huge)).await;
    assert!(standin.token_reviews().is_empty(), "a TokenReview was sent for a 300 KB token");
    assert_eq!(standin.bytes(), 0);
    assert_eq!(reply.status, 401, "{reply:?}");
    assert_eq!(reply.body, r#"{"error":"the bearer token is longer than 8192 bytes"}"#);
    // 8 KiB is still looked at.
    let reply = get(to, None, AUTOSCALERS, &host, Some(&"x".repeat(8_192))).await;
    assert_eq!((reply.status, standin.token_reviews().len()), (401, 1), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tokens_cost_at_most_the_review_budget_and_a_reader_stays_cached() {
    let standin = StandIn::start().await;
    let (daemon, port) = serving(&standin.kubeconfig(), REVIEW_ONLY, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let host = to.to_string();

    // A flood of new tokens, 8 connections at once: at most the burst and the rate are checked
    // with the API server; the others get 503 with Retry-After and the fixed sentence.
    let (replies, elapsed) = flood(to, "first", 400).await;
    let reviewed = standin.token_reviews().len();
    let budget = REVIEW_BURST + (elapsed * REVIEWS_PER_SECOND).ceil() as usize;
    println!("{} new tokens in {elapsed:.2}s: {reviewed} TokenReviews (budget {budget})", replies.len());
    assert!(reviewed <= budget, "{reviewed} TokenReviews for 400 new tokens in {elapsed:.2}s (budget {budget})");
    assert!(reviewed >= REVIEW_BURST, "the burst is used: {reviewed}");
    let refused = replies.iter().filter(|r| r.status == 401).count();
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.status == 503).collect();
    assert_eq!(refused + busy.len(), replies.len(), "every new token is refused or put off");
    assert_eq!(refused, reviewed, "a 401 for each token reviewed");
    for reply in &busy {
        assert_eq!(reply.body, r#"{"error":"too many new tokens to check; retry later"}"#);
        let retry: u64 = reply.header("retry-after").expect("Retry-After").parse().expect("whole seconds");
        assert!((1..=2).contains(&retry), "Retry-After {retry}");
    }
    assert!(standin.access_reviews().is_empty(), "refused tokens get no SubjectAccessReview");
    // A refused token asked again within ten seconds is not reviewed again.
    let first_refused = standin.token_reviews()[0]["token"].as_str().unwrap().to_string();
    assert_eq!(get(to, None, AUTOSCALERS, &host, Some(&first_refused)).await.status, 401);
    assert_eq!(standin.token_reviews().len(), reviewed);

    // Once the bucket has refilled, a reader's token: one TokenReview for the audience
    // watermarkd, one SubjectAccessReview for its user with everything the TokenReview said of
    // them, on get status.watermarkd.io.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reader = "good-reader-token";
    let reply = get(to, None, AUTOSCALERS, &host, Some(reader)).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let reviews = standin.token_reviews();
    assert_eq!(reviews.len(), reviewed + 1);
    assert_eq!(reviews[reviewed]["audiences"], json!(["watermarkd"]), "{}", reviews[reviewed]);
    let access = standin.access_reviews();
    assert_eq!(access.len(), 1);
    assert_eq!(
        access[0],
        json!({
            "user": "reader",
            "uid": "uid-reader",
            "groups": ["readers", "system:authenticated"],
            "extra": { "example.com/team": ["platform"] },
            "resourceAttributes": { "group": "watermarkd.io", "resource": "status", "verb": "get" },
        })
    );

    // Another flood: the reader is let in from the cache all along, without a review.
    let (_, _) = flood(to, "second", 200).await;
    let reviews = standin.token_reviews().len();
    let reply = get(to, None, AUTOSCALERS, &host, Some(reader)).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(standin.token_reviews().len(), reviews, "the reader's answer came from the cache");
    assert_eq!(standin.access_reviews().len(), 1);

    let log = daemon.log();
    assert!(!log.contains(reader) && !log.contains(&first_refused), "a token in the log:\n{log}");
}

/// GETs with `count` new tokens (`unknown-{prefix}-N`), 8 connections at once: the replies and
/// the seconds it took.
async fn flood(to: SocketAddr, prefix: &str, count: usize) -> (Vec<Reply>, f64) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let next = Arc::new(Mutex::new(0));
    for _ in 0..8 {
        let (next, prefix) = (Arc::clone(&next), prefix.to_string());
        tasks.spawn(async move {
            let mut replies = Vec::new();
            loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    *n += 1;
                    *n
                };
                if i > count {
                    return replies;
                }
                let token = format!("unknown-{prefix}-{i:024}");
                replies.push(get(to, None, AUTOSCALERS, &to.to_string(), Some(&token)).await);
            }
        });
    }
    let mut replies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        replies.extend(done.unwrap());
    }
    (replies, started.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// T4-13: a failed review tells the reader nothing of it

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_review_answers_a_fixed_sentence_and_logs_the_detail() {
    let standin = StandIn::start().await;
    standin.answer(ReviewAnswer::Forbidden);
    let (daemon, port) = serving(&standin.kubeconfig(), REVIEW_ONLY, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let host = to.to_string();
    let token = "good-reader-for-a-forbidden-review";

    let reply = get(to, None, AUTOSCALERS, &host, Some(token)).await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.body, r#"{"error":"the token cannot be checked now"}"#);
    assert!(reply.header("retry-after").is_some(), "{reply:?}");
    let page = get(to, None, "/ui", &host, Some("good-reader-for-the-page")).await;
    assert_eq!(page.status, 503);
    assert!(page.body.contains("the token cannot be checked now"), "{}", page.body);
    for body in [&reply.body, &page.body] {
        for leaked in ["system:serviceaccount", "forbidden", "tokenreviews", "Failure"] {
            assert!(!body.contains(leaked), "the answer says {leaked:?}: {body}");
        }
    }
    assert_eq!(standin.token_reviews().len(), 2);

    // The detail is in the daemon's log, without the token.
    let log = eventually!(
        Duration::from_secs(5),
        "the failed review in the log",
        async {
            let log = daemon.log();
            if log.contains("cannot create resource") {
                Ok(log)
            } else {
                Err(log)
            }
        }
        .await
    );
    assert!(log.contains("TokenReview failed"), "{log}");
    assert!(!log.contains(token), "the token is in the log:\n{log}");
}

// ---------------------------------------------------------------------------------------------
// T4-12: authorization and audiences on a real API server

async fn mint(accounts: &Api<ServiceAccount>, name: &str, audiences: &[&str]) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration_seconds: Some(3_600),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    };
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {name}: {e}"));
    answer.status.expect("a token").token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_account_token_needs_the_reader_role_and_the_watermarkd_audience() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("status-sar").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client(), &ns);
    for name in ["reader", "intruder"] {
        let account: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
        accounts.create(&PostParams::default(), &account).await.unwrap();
    }
    // The reader role as docs/status.md describes it, bound cluster-wide to `reader` only.
    let role_name = format!("{ns}-status-reader");
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": role_name },
        "rules": [{ "apiGroups": ["watermarkd.io"], "resources": ["status"], "verbs": ["get"] }],
    }))
    .unwrap();
    Api::<ClusterRole>::all(cluster.client()).create(&PostParams::default(), &role).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": role_name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name },
        "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": ns }],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(cluster.client()).create(&PostParams::default(), &binding).await.unwrap();
    // RBAC takes the binding from a cache: wait until it applies, or the daemon would keep a
    // no for ten seconds.
    let reader_user = format!("system:serviceaccount:{ns}:reader");
    eventually!(
        Duration::from_secs(30),
        "the binding applies",
        async {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(reader_user.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some("watermarkd.io".into()),
                        resource: Some("status".into()),
                        verb: Some("get".into()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let answer = Api::<SubjectAccessReview>::all(cluster.client())
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| e.to_string())?;
            if answer.status.is_some_and(|s| s.allowed) {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
        .await
    );
    let reader = mint(&accounts, "reader", &["watermarkd"]).await;
    let intruder = mint(&accounts, "intruder", &["watermarkd"]).await;
    let intruder_for_the_api = mint(&accounts, "intruder", &[]).await;
    let reader_for_vault = mint(&accounts, "reader", &["vault"]).await;
    let reader_for_the_api = mint(&accounts, "reader", &[]).await;

    let kubeconfig = cluster.kubeconfig(ADMIN_TOKEN);
    let (daemon, port) = serving(&kubeconfig, REVIEW_ONLY, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let host = to.to_string();
    // What the review found: any ServiceAccount's token for the API server was let in.
    let reply = get(to, None, AUTOSCALERS, &host, Some(&intruder_for_the_api)).await;
    assert_eq!(reply.status, 401, "a token for the API server, of an account without RBAC: {reply:?}");
    let reply = get(to, None, AUTOSCALERS, &host, Some(&reader)).await;
    assert_eq!(reply.status, 200, "the reader, bound to the role: {reply:?}");
    let list: Value = serde_json::from_str(&reply.body).unwrap();
    assert!(list["autoscalers"].is_array(), "{list}");
    let reply = get(to, None, AUTOSCALERS, &host, Some(&intruder)).await;
    assert_eq!(reply.status, 403, "a ServiceAccount without RBAC: {reply:?}");
    assert!(reply.body.contains("may not read the status"), "{}", reply.body);
    assert!(!reply.body.contains("intruder") && !reply.body.contains(&ns), "{}", reply.body);
    let reply = get(to, None, AUTOSCALERS, &host, Some(&reader_for_vault)).await;
    assert_eq!(reply.status, 401, "a token for another audience: {reply:?}");
    let reply = get(to, None, AUTOSCALERS, &host, Some(&reader_for_the_api)).await;
    assert_eq!(reply.status, 401, "a token for the API server, not for watermarkd: {reply:?}");
    assert_eq!(get(to, None, "/ui", &host, Some(&intruder)).await.status, 403);
    for token in [&reader, &intruder, &intruder_for_the_api, &reader_for_vault, &reader_for_the_api] {
        assert!(!daemon.log().contains(token.as_str()), "a token in the log");
    }
    drop(daemon);

    // token_audiences = []: the API server's own audiences, and still the role.
    let (_daemon, port) = serving(&kubeconfig, &format!("{REVIEW_ONLY}token_audiences = []\n"), "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let host = to.to_string();
    assert_eq!(get(to, None, AUTOSCALERS, &host, Some(&reader_for_the_api)).await.status, 200);
    assert_eq!(get(to, None, AUTOSCALERS, &host, Some(&reader_for_vault)).await.status, 401);
    assert_eq!(get(to, None, AUTOSCALERS, &host, Some(&intruder_for_the_api)).await.status, 403);
}

// ---------------------------------------------------------------------------------------------
// T4-4 and T4-14: the loopback exemption is exactly 127.0.0.1 and ::1

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_this_machine_s_own_address_skips_the_token_and_only_when_asked() {
    let standin = StandIn::start().await;
    let dir = tempfile::tempdir().unwrap();
    let exempt = token_file_settings(dir.path(), "open_on_loopback = true\n");

    // On 127.0.0.1: a sidecar's address (Istio connects from 127.0.0.6) needs the token.
    let (_daemon, port) = serving(&standin.kubeconfig(), &exempt, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let host = to.to_string();
    let reply = get(to, Some("127.0.0.6"), AUTOSCALERS, &host, None).await;
    assert_eq!(reply.status, 401, "from 127.0.0.6 without a token: {reply:?}");
    assert_eq!(reply.header("www-authenticate"), Some("Bearer realm=\"watermarkd\""));
    assert_eq!(get(to, Some("127.0.0.6"), AUTOSCALERS, &host, Some(TOKEN)).await.status, 200);
    assert_eq!(get(to, Some("127.0.0.1"), AUTOSCALERS, &host, None).await.status, 200);
    assert_eq!(get(to, Some("127.0.0.1"), AUTOSCALERS, &host, Some("wrong")).await.status, 401, "a token is checked");

    // On [::] (dual stack): IPv4 loopback arrives as ::ffff:127.0.0.1 and is this machine too.
    let (_daemon, port) = serving(&standin.kubeconfig(), &exempt, "::").await;
    let reply = get(at("127.0.0.1", port), None, AUTOSCALERS, &format!("127.0.0.1:{port}"), None).await;
    assert_eq!(reply.status, 200, "127.0.0.1 on a [::] listener: {reply:?}");
    let reply = get(at("::1", port), None, AUTOSCALERS, &format!("[::1]:{port}"), None).await;
    assert_eq!(reply.status, 200, "::1 on a [::] listener: {reply:?}");
    let reply = get(at("127.0.0.1", port), Some("127.0.0.6"), AUTOSCALERS, &format!("127.0.0.1:{port}"), None).await;
    assert_eq!(reply.status, 401, "::ffff:127.0.0.6 on a [::] listener: {reply:?}");

    // With a token and open_on_loopback not set, this machine needs the token too.
    let settings = token_file_settings(dir.path(), "");
    let (_daemon, port) = serving(&standin.kubeconfig(), &settings, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    assert_eq!(get(to, None, AUTOSCALERS, &to.to_string(), None).await.status, 401, "off unless set");
    assert_eq!(get(to, None, AUTOSCALERS, &to.to_string(), Some(TOKEN)).await.status, 200);
}

// ---------------------------------------------------------------------------------------------
// T4-15: the Host header, and the binary's default listener

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_token_must_name_the_daemon_as_its_host() {
    let standin = StandIn::start().await;
    // With a token: the loopback exemption is Host-checked, the token is not (a page that
    // rebinds its name cannot send it).
    let dir = tempfile::tempdir().unwrap();
    let settings = token_file_settings(dir.path(), "open_on_loopback = true\n");
    let (_daemon, port) = serving(&standin.kubeconfig(), &settings, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    let rebound = format!("attacker.example:{port}");
    assert_eq!(get(to, None, AUTOSCALERS, &rebound, None).await.status, 403, "a rebound name through the exemption");
    assert_eq!(get(to, None, AUTOSCALERS, &rebound, Some(TOKEN)).await.status, 200);
    assert_eq!(get(to, None, AUTOSCALERS, &format!("localhost:{port}"), None).await.status, 200);

    // Open (no token asked for): every request is Host-checked; allowed_hosts adds names.
    let settings = "[status]\nallowed_hosts = [\"status.example\"]\n";
    let (_daemon, port) = serving(&standin.kubeconfig(), settings, "127.0.0.1").await;
    let to = at("127.0.0.1", port);
    for path in [AUTOSCALERS, "/ui", "/"] {
        let reply = get(to, None, path, &format!("attacker.example:{port}"), None).await;
        assert_eq!(reply.status, 403, "{path} for attacker.example: {reply:?}");
        assert!(reply.body.contains("allowed_hosts"), "the answer says how to allow a name: {}", reply.body);
        assert!(!reply.body.contains("attacker"), "{}", reply.body);
    }
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "status.example".into(), "[::1]".into()] {
        assert_eq!(get(to, None, AUTOSCALERS, &host, None).await.status, 200, "Host: {host}");
    }
    // Probes and scrapes are not behind it.
    for path in ["/healthz", "/metrics"] {
        assert_eq!(get(to, None, path, "attacker.example", None).await.status, 200, "{path}");
    }
}

/// A non-loopback address of this machine, if it has one (the one the default route uses).
fn outward_address() -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_settings_the_daemon_listens_on_loopback_only() {
    let standin = StandIn::start().await;
    // An empty settings file and no --listen: every default.
    let mut daemon = Daemon::start(&standin.kubeconfig(), "", None);
    let log = eventually!(
        STARTUP,
        "the daemon serves or says why not",
        async {
            let log = daemon.log();
            if log.contains("serving /metrics") || daemon.exited().is_some() {
                Ok(log)
            } else {
                Err(log)
            }
        }
        .await
    );
    let serves = log.lines().find(|l| l.contains("serving /metrics"));
    match serves {
        Some(line) => {
            println!("{line}");
            assert!(line.contains("listen=127.0.0.1:8080"), "{line}");
            assert!(line.contains("status API"), "the status service is on by default: {line}");
            let to = at("127.0.0.1", 8080);
            assert_eq!(get(to, None, AUTOSCALERS, "127.0.0.1:8080", None).await.status, 200, "open to this machine");
            if let Some(outward) = outward_address() {
                let refused = TcpSocket::new_v4().unwrap().connect(SocketAddr::new(outward, 8080)).await;
                assert!(refused.is_err(), "{outward}:8080 accepted a connection");
            }
        }
        // Another process holds the port: the daemon's error names the address it tried.
        None => assert!(log.contains("127.0.0.1:8080"), "{log}"),
    }
}
