//! A stand-in for metrics-server: the `metrics.k8s.io/v1beta1` API (PodMetrics), served over
//! HTTPS by the test process and registered with the test cluster's kube-apiserver as an
//! aggregated APIService, so that clients reach it through the API server exactly as they reach
//! a real metrics-server: same URLs, same authentication and RBAC, same discovery.
//!
//! ```ignore
//! #[path = "support/kube_cluster.rs"]
//! mod kube_cluster;                      // metrics_server uses crate::kube_cluster
//! #[path = "support/metrics_server.rs"]
//! mod metrics_server;
//!
//! let cluster = KubeCluster::shared();
//! let metrics = MetricsServer::shared(cluster).await;   // started and registered once
//! metrics.set_pod(&ns, "web-1", &labels, &[Container::new("app").cpu("250m").memory("64Mi")], Duration::ZERO);
//! ```
//!
//! # What it serves
//! - `GET /apis/metrics.k8s.io/v1beta1`: the resource list (`pods`, `nodes`), which the
//!   aggregator's availability check and discovery ask for.
//! - `GET /apis/metrics.k8s.io/v1beta1/namespaces/NS/pods[?labelSelector=...]`,
//!   `GET /apis/metrics.k8s.io/v1beta1/pods` (every namespace) and
//!   `GET /apis/metrics.k8s.io/v1beta1/namespaces/NS/pods/NAME`: what the test set with
//!   `set_pod`, in metrics-server's JSON shape (`timestamp`, `window`, per-container `usage`).
//!   The label selector is evaluated here, on the labels given to `set_pod` (equality,
//!   inequality, `in`, `notin`, existence), as metrics-server evaluates it on the pods' labels.
//! - anything else: 404 with a `Status`.
//!
//! Every request is recorded (`requests()`) with the user the API server says it proxies for
//! (`X-Remote-User`), so a test can count what a client asked for and check that it came
//! through the aggregator.
//!
//! # How it is registered (`register`)
//! The API server must reach it the way it reaches any extension API server:
//! - TLS both ways. The server's certificate is made by `openssl` for
//!   `SERVICE.NAMESPACE.svc` (the name the aggregator verifies) and 127.0.0.1, signed by a CA of
//!   its own that the APIService carries as `caBundle` (so nothing skips verification). It
//!   requires the aggregator's client certificate (`--proxy-client-cert-file`, signed by the
//!   cluster's front-proxy CA, see `KubeCluster::front_proxy_ca_path`), which is what makes the
//!   `X-Remote-*` headers trustworthy.
//! - A Service to route to. There is no kube-proxy and no endpoints controller, and the API
//!   server refuses Endpoints on loopback addresses, so a ClusterIP Service with hand-made
//!   Endpoints cannot point at 127.0.0.1. An `ExternalName` Service whose name is `127.0.0.1`
//!   can: the aggregator resolves an ExternalName service to `https://EXTERNALNAME:PORT`, with
//!   or without `--enable-aggregator-routing`, and needs no Endpoints.
//! - `register` waits until the APIService is `Available` (the aggregator's own discovery check
//!   reached the server) and discovery lists `pods.metrics.k8s.io`.
//!
//! One APIService per group and version exists in a cluster, so there is one metrics server
//! per test binary (`shared`); tests keep apart by namespace.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

// Each support file is compiled into every test binary that names it, so a test using two of
// them has two copies of this small module.
#[allow(clippy::duplicate_mod, reason = "a test binary that names two support files has two copies of this one")]
#[path = "test_pki.rs"]
mod test_pki;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{json, Value};
use tokio::sync::OnceCell;

use crate::kube_cluster::KubeCluster;

const INSTALL_HINT: &str = "run scripts/install-test-deps (as root) to install it";

/// The namespace and name of the Service the APIService routes to.
pub const SERVICE_NAMESPACE: &str = "watermarkd-test-metrics";
pub const SERVICE_NAME: &str = "metrics-server";
const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";

/// One container's usage, as quantities (`"250m"`, `"64Mi"`); `None` leaves the resource out of
/// its `usage`, as a metrics-server that has not measured it yet would.
#[derive(Clone, Debug)]
pub struct Container {
    pub name: String,
    pub cpu: Option<String>,
    pub memory: Option<String>,
}

impl Container {
    pub fn new(name: &str) -> Container {
        Container { name: name.into(), cpu: None, memory: None }
    }

    pub fn cpu(mut self, quantity: &str) -> Container {
        self.cpu = Some(quantity.into());
        self
    }

    pub fn memory(mut self, quantity: &str) -> Container {
        self.memory = Some(quantity.into());
        self
    }
}

#[derive(Clone, Debug)]
struct PodEntry {
    labels: BTreeMap<String, String>,
    containers: Vec<Container>,
    /// The end of the measurement window.
    timestamp: SystemTime,
    window: Duration,
}

/// One request the server answered.
#[derive(Clone, Debug)]
pub struct MetricsRequest {
    pub path: String,
    /// The decoded `labelSelector` query parameter, when given.
    pub label_selector: Option<String>,
    /// `X-Remote-User`: the user the API server proxied for.
    pub user: Option<String>,
    pub status: u16,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<(String, String), PodEntry>,
    requests: Vec<MetricsRequest>,
}

pub struct MetricsServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    ca: PathBuf,
    _dir: tempfile::TempDir,
}

static SHARED: OnceCell<MetricsServer> = OnceCell::const_new();

impl MetricsServer {
    /// The metrics server of this test binary's shared cluster, started and registered by the
    /// first test that asks.
    pub async fn shared(cluster: &KubeCluster) -> &'static MetricsServer {
        SHARED
            .get_or_init(|| async {
                let server = MetricsServer::start(cluster.front_proxy_ca_path());
                server.register(cluster).await;
                server
            })
            .await
    }

    /// Starts the HTTPS server on a free loopback port. It trusts client certificates signed by
    /// `client_ca` (the cluster's front-proxy CA) and no others.
    pub fn start(client_ca: &Path) -> MetricsServer {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        watermarkd::adapters::backend::ensure_crypto_provider();
        let dir = tempfile::tempdir().expect("temp dir");
        generate_certs(dir.path());
        let load_certs = |path: &Path| -> Vec<CertificateDer<'static>> {
            CertificateDer::pem_file_iter(path).expect("cert file").collect::<Result<_, _>>().expect("certs")
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in load_certs(client_ca) {
            roots.add(ca).expect("front-proxy CA certificate");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build().expect("client verifier");
        let key = PrivateKeyDer::from_pem_file(dir.path().join("server.key")).expect("server key");
        let config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(load_certs(&dir.path().join("server.pem")), key)
            .expect("server config");
        let config = Arc::new(config);
        let listener = StdListener::bind("127.0.0.1:0").expect("bind the metrics server");
        let addr = listener.local_addr().expect("metrics server address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared_state = Arc::clone(&state);
        // Lives as long as the test process; each connection gets a thread (the aggregator keeps
        // a few open at most).
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (config, state) = (Arc::clone(&config), Arc::clone(&shared_state));
                std::thread::spawn(move || serve_connection(stream, config, state));
            }
        });
        MetricsServer { addr, state, ca: dir.path().join("ca.pem"), _dir: dir }
    }

    /// Registers the server as the `v1beta1.metrics.k8s.io` APIService (see the module
    /// documentation) and waits until the API server serves it.
    pub async fn register(&self, cluster: &KubeCluster) {
        let client = cluster.client();
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let namespace = serde_json::from_value(json!({ "metadata": { "name": SERVICE_NAMESPACE } })).expect("ns");
        namespaces.create(&PostParams::default(), &namespace).await.expect("create the metrics server's namespace");
        let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), SERVICE_NAMESPACE);
        let service = serde_json::from_value(json!({
            "metadata": { "name": SERVICE_NAME },
            "spec": { "type": "ExternalName", "externalName": "127.0.0.1" },
        }))
        .expect("service");
        services.create(&PostParams::default(), &service).await.expect("create the metrics server's Service");

        let ca_bundle = std::fs::read(&self.ca).expect("the metrics server's CA");
        let resource = api_service_resource();
        let api_services: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let api_service: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": { "name": "v1beta1.metrics.k8s.io" },
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": { "namespace": SERVICE_NAMESPACE, "name": SERVICE_NAME, "port": self.addr.port() },
                "caBundle": base64(&ca_bundle),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }))
        .expect("APIService");
        api_services.create(&PostParams::default(), &api_service).await.expect("create the APIService");

        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let current = api_services.get("v1beta1.metrics.k8s.io").await.expect("get the APIService");
            let conditions = current.data.pointer("/status/conditions").cloned().unwrap_or(Value::Null);
            let available = conditions
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Available" && c["status"] == "True"));
            let served = match client.list_api_group_resources(GROUP_VERSION).await {
                Ok(list) => list.resources.iter().any(|r| r.name == "pods"),
                Err(_) => false,
            };
            if available && served {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the metrics APIService is not available after 60 s: conditions {conditions}; requests seen: \
                 {:?}\n{}",
                self.requests(),
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets (or replaces) the metrics of one pod: its labels (for selectors), its containers,
    /// and how old the sample is (`timestamp` = now - `age`), with a 30 s window.
    pub fn set_pod(
        &self,
        namespace: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
        containers: &[Container],
        age: Duration,
    ) {
        let entry = PodEntry {
            labels: labels.clone(),
            containers: containers.to_vec(),
            timestamp: SystemTime::now() - age,
            window: Duration::from_secs(30),
        };
        self.lock().pods.insert((namespace.into(), name.into()), entry);
    }

    /// Forgets one pod's metrics, as metrics-server does for a pod it has no sample of.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.lock().pods.remove(&(namespace.into(), name.into()));
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<MetricsRequest> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn api_service_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    )
}

/// A CA and a server certificate for `SERVICE.NAMESPACE.svc` and 127.0.0.1, made by `openssl`.
fn generate_certs(dir: &Path) {
    test_pki::make_ca(dir, "ca.key", "ca.pem", "watermarkd test metrics CA");
    let names = format!("subjectAltName=DNS:{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc,IP:127.0.0.1\n");
    test_pki::sign(dir, ("ca.key", "ca.pem"), ("server.key", "server.pem"), "metrics-server", "serverAuth", &names);
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Answers the requests of one connection (keep-alive) until the client closes it.
fn serve_connection(stream: std::net::TcpStream, config: Arc<rustls::ServerConfig>, state: Arc<Mutex<State>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(connection) = rustls::ServerConnection::new(config) else { return };
    let mut tls = rustls::StreamOwned::new(connection, stream);
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // A failed handshake (no or an untrusted client certificate) shows up as a read error.
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            match tls.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let body_length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let consumed = head_end + 4 + body_length;
        while buffer.len() < consumed {
            match tls.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..consumed);

        let target = request_line.split(' ').nth(1).unwrap_or("/").to_string();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let label_selector = query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == "labelSelector")
            .map(|(_, v)| percent_decode(v));
        let (status, body) = {
            let state = state.lock().unwrap_or_else(|e| e.into_inner());
            answer(&state, path, label_selector.as_deref())
        };
        state.lock().unwrap_or_else(|e| e.into_inner()).requests.push(MetricsRequest {
            path: path.to_string(),
            label_selector,
            user: header("x-remote-user"),
            status,
        });
        let reason = if status == 200 { "OK" } else { "Not Found" };
        let response = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if tls.write_all(response.as_bytes()).and_then(|()| tls.flush()).is_err() {
            return;
        }
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

fn answer(state: &State, path: &str, selector: Option<&str>) -> (u16, String) {
    let base = "/apis/metrics.k8s.io/v1beta1";
    let not_found = || {
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("the server could not find the requested resource ({path})"),
            "reason": "NotFound", "code": 404,
        });
        (404, status.to_string())
    };
    let Some(rest) = path.strip_prefix(base) else { return not_found() };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        [] => {
            let resource = |name: &str, kind: &str, namespaced: bool| json!({ "name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": ["get", "list"] });
            let list = json!({
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
                "resources": [resource("nodes", "NodeMetrics", false), resource("pods", "PodMetrics", true)],
            });
            (200, list.to_string())
        }
        ["pods"] => (200, pod_list(state, None, selector)),
        ["namespaces", namespace, "pods"] => (200, pod_list(state, Some(namespace), selector)),
        ["namespaces", namespace, "pods", name] => {
            match state.pods.get(&((*namespace).to_string(), (*name).to_string())) {
                Some(entry) => (200, pod_metrics(namespace, name, entry).to_string()),
                None => not_found(),
            }
        }
        ["nodes"] => {
            let list = json!({ "kind": "NodeMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": [] });
            (200, list.to_string())
        }
        _ => not_found(),
    }
}

fn pod_list(state: &State, namespace: Option<&str>, selector: Option<&str>) -> String {
    let items: Vec<Value> = state
        .pods
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
        .filter(|(_, entry)| selector.is_none_or(|s| selector_matches(s, &entry.labels)))
        .map(|((ns, name), entry)| pod_metrics(ns, name, entry))
        .collect();
    json!({ "kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items }).to_string()
}

fn pod_metrics(namespace: &str, name: &str, entry: &PodEntry) -> Value {
    let containers: Vec<Value> = entry
        .containers
        .iter()
        .map(|c| {
            let mut usage = serde_json::Map::new();
            if let Some(cpu) = &c.cpu {
                usage.insert("cpu".into(), json!(cpu));
            }
            if let Some(memory) = &c.memory {
                usage.insert("memory".into(), json!(memory));
            }
            json!({ "name": c.name, "usage": usage })
        })
        .collect();
    json!({
        "metadata": { "name": name, "namespace": namespace, "labels": entry.labels },
        "timestamp": rfc3339(entry.timestamp),
        "window": format!("{}s", entry.window.as_secs()),
        "containers": containers,
    })
}

/// Whole seconds, as metav1.Time serializes.
fn rfc3339(time: SystemTime) -> String {
    let seconds = time.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let timestamp = k8s_openapi::jiff::Timestamp::from_second(i64::try_from(seconds).unwrap_or(0)).expect("a time");
    timestamp.to_string()
}

/// Kubernetes label selector syntax: comma-separated requirements `k=v`, `k==v`, `k!=v`,
/// `k in (a,b)`, `k notin (a,b)`, `k`, `!k`. Written here independently of watermarkd's code, so
/// that a selector watermarkd builds wrong does not also match wrong.
pub fn selector_matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    let mut requirements = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in selector.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                requirements.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    requirements.push(current);
    requirements.iter().map(|r| r.trim()).filter(|r| !r.is_empty()).all(|requirement| {
        let set = |text: &str| -> Vec<String> {
            text.trim().trim_start_matches('(').trim_end_matches(')').split(',').map(|v| v.trim().to_string()).collect()
        };
        if let Some((key, values)) = requirement.split_once(" notin ") {
            return labels.get(key.trim()).is_none_or(|v| !set(values).contains(v));
        }
        if let Some((key, values)) = requirement.split_once(" in ") {
            return labels.get(key.trim()).is_some_and(|v| set(values).contains(v));
        }
        if let Some((key, value)) = requirement.split_once("!=") {
            return labels.get(key.trim()) != Some(&value.trim().to_string());
        }
        if let Some((key, value)) = requirement.split_once("==").or_else(|| requirement.split_once('=')) {
            return labels.get(key.trim()) == Some(&value.trim().to_string());
        }
        if let Some(key) = requirement.strip_prefix('!') {
            return !labels.contains_key(key.trim());
        }
        labels.contains_key(requirement)
    })
}
