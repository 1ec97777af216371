//! Replica recommenders: HTTP services that answer "how many replicas" for one workload, asked
//! with the request and read with the reply of the Datadog WPA controller's recommender client
//! (the `datadog.autoscaling.kubernetes` `WorkloadRecommendationRequest` and
//! `WorkloadRecommendationReply` messages, as protobuf JSON, POSTed with
//! `Content-Type: application/json`).
//!
//! A reply becomes a `Reading::Replicas` carrying its bounds and observed value; everything
//! else (a transport error, a timeout, a status other than 200, a body that is not the reply,
//! an `error` in the reply, a count that does not fit) becomes an unavailable reading with the
//! reason, so the engine holds. A reply of 0 replicas is passed on as 0: the engine reads it as
//! no data unless the rule tolerates zero (docs/engine.md §1).
//!
//! What the recommender answered never goes into the reason, which ends up in WPA statuses
//! and Events that the WPA's author reads: a WPA may point the daemon at a service that is not
//! a recommender, and its answers are not the author's to read. The reason says the status
//! code or what was wrong; the answer itself goes to the debug log, cut short.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderValue, CONTENT_TYPE, HOST};
use reqwest::Url;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use watermarkd_engine::Reading;

use super::prometheus::connection::{chain, tls};
use super::{Observation, ObservationDetail, QueryError};
use crate::adapters::secret::FileStamp;
use crate::adapters::telemetry::HttpClientMetrics;
use crate::domain::rules::{Recommender, TargetRef, TlsSettings};

/// The environment variable the Datadog controller takes its cluster name from: the default of
/// the daemon's `cluster_name` setting, sent as `targetRef.cluster`.
pub const CLUSTER_NAME_ENV: &str = "K8S_CLUSTER_NAME";
/// How much of an answer that is not a recommendation goes to the debug log.
const LOGGED_ANSWER: usize = 100;
/// A reply larger than this is not a recommendation.
const MAX_REPLY_BYTES: usize = 1 << 20;
/// How often a client's TLS files are checked for a change (a rotated certificate), at most.
const FILES_RECHECK: Duration = Duration::from_secs(10);

/// What the request says about the workload, read from the target just before asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadState {
    /// `spec.replicas`: `state.desiredReplicas`.
    pub desired: u32,
    /// `status.replicas`: `state.currentReplicas`.
    pub current: u32,
    /// Ready replicas, when known: `state.readyReplicas`.
    pub ready: Option<u32>,
    pub min_replicas: u32,
    pub max_replicas: u32,
}

/// The HTTP clients of the recommenders in use, one per TLS configuration, and their series.
/// Both are dropped with the last autoscaler that uses them ([`RecommenderClients::retain`]).
pub struct RecommenderClients {
    clients: Mutex<Vec<LazyClient>>,
    /// The daemon's cluster name (`cluster_name` setting, else `K8S_CLUSTER_NAME`), for
    /// recommenders that do not name one.
    cluster_name: Option<String>,
    metrics: HttpClientMetrics,
    /// The `client` labels of the recommenders in use, once `retain` has said them: a request
    /// still in flight for a recommender that is gone does not bring its series back.
    counted: Mutex<Option<BTreeSet<String>>>,
    files_recheck: Duration,
}

/// One client, built on first use. Requests with the same key wait for one build (which reads
/// files and the system's certificates) instead of each building their own.
struct LazyClient {
    key: ClientKey,
    client: Arc<tokio::sync::Mutex<Option<Built>>>,
}

struct Built {
    client: reqwest::Client,
    /// The TLS files as they were when read, to tell a rotated file.
    stamps: Vec<Option<FileStamp>>,
    checked: Instant,
}

/// What a client is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClientKey {
    tls: TlsSettings,
    /// Where the TLS files must resolve (a WPA's: the daemon's `recommender_tls_dir`).
    tls_dir: Option<PathBuf>,
    renamed: Option<Renamed>,
}

/// An `https://` recommender verified against another name than its url's host: requests go
/// to that name, which this client alone resolves to the url's host.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Renamed {
    server_name: String,
    /// The url's host (an IP address without brackets, or a DNS name).
    host: String,
}

impl ClientKey {
    fn of(recommender: &Recommender) -> Result<ClientKey, String> {
        let renamed = match &recommender.server_name {
            Some(server_name) if recommender.url.starts_with("https://") => {
                let url = Url::parse(&recommender.url).map_err(|e| format!("the url is not a URL: {e}"))?;
                let host = url.host_str().ok_or("the url has no host")?;
                Some(Renamed {
                    server_name: server_name.to_ascii_lowercase(),
                    host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
                })
            }
            _ => None,
        };
        Ok(ClientKey { tls: recommender.tls.clone(), tls_dir: recommender.tls_dir.clone(), renamed })
    }

    fn files(&self) -> Vec<PathBuf> {
        [&self.tls.ca_file, &self.tls.client_cert_file, &self.tls.client_key_file]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The client: blocking (it reads the TLS files and the system's certificates).
    fn build(&self) -> Result<Built, String> {
        // Stamps first, then the files: a change in between is seen at the next check.
        let stamps = stamps(&self.files());
        let settings = match &self.tls_dir {
            Some(dir) => confined(&self.tls, dir)?,
            None => self.tls.clone(),
        };
        super::ensure_crypto_provider();
        let builder = reqwest::Client::builder()
            .user_agent(concat!("watermarkd/", env!("CARGO_PKG_VERSION")))
            // A redirect would take the request where the url (checked against the allowed
            // ones) does not point.
            .redirect(reqwest::redirect::Policy::none());
        let mut builder = tls(builder, "recommender", &settings)?;
        if let Some(renamed) = &self.renamed {
            builder = builder.dns_resolver(Arc::new(renamed.clone()));
        }
        let client = builder.build().map_err(|e| format!("cannot set up the HTTP client: {}", chain(&e)))?;
        Ok(Built { client, stamps, checked: Instant::now() })
    }
}

impl reqwest::dns::Resolve for Renamed {
    /// The server name is looked up as the url's host; any other name as itself.
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = if name.as_str().eq_ignore_ascii_case(&self.server_name) {
            self.host.clone()
        } else {
            name.as_str().to_string()
        };
        Box::pin(async move {
            // Port 0: the url's port replaces it.
            let addresses: Vec<_> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Blocking. `FileStamp::of` follows symlinks: Kubernetes rotates mounted secrets by swapping one.
fn stamps(files: &[PathBuf]) -> Vec<Option<FileStamp>> {
    files.iter().map(|file| FileStamp::of(file)).collect()
}

/// `settings` with every file resolved (symlinks followed), each of which must lie inside `dir`
/// once resolved too: a symlink in the directory cannot lead out of it. Blocking.
fn confined(settings: &TlsSettings, dir: &Path) -> Result<TlsSettings, String> {
    let root = dir
        .canonicalize()
        .map_err(|e| format!("recommender_tls_dir {} cannot be read: {}", dir.display(), e.kind()))?;
    let resolve = |name: &str, file: &Option<PathBuf>| -> Result<Option<PathBuf>, String> {
        let Some(file) = file else { return Ok(None) };
        let resolved =
            file.canonicalize().map_err(|e| format!("cannot read tls.{name} {}: {}", file.display(), e.kind()))?;
        if !resolved.starts_with(&root) {
            return Err(format!(
                "tls.{name} {} leads outside recommender_tls_dir {} (through a symlink): it is not read",
                file.display(),
                dir.display()
            ));
        }
        Ok(Some(resolved))
    };
    Ok(TlsSettings {
        ca_file: resolve("ca_file", &settings.ca_file)?,
        client_cert_file: resolve("client_cert_file", &settings.client_cert_file)?,
        client_key_file: resolve("client_key_file", &settings.client_key_file)?,
        insecure_skip_verify: settings.insecure_skip_verify,
    })
}

/// Runs blocking file work off the async runtime.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(work).await.map_err(|e| format!("reading the TLS files failed: {e}"))
}

impl RecommenderClients {
    /// Clients that name `cluster_name` in requests whose recommender names no cluster, and
    /// report their requests in `metrics`.
    pub fn new(cluster_name: Option<String>, metrics: HttpClientMetrics) -> Self {
        let cluster_name = cluster_name.filter(|name| !name.is_empty());
        RecommenderClients {
            clients: Mutex::new(Vec::new()),
            cluster_name,
            metrics,
            counted: Mutex::new(None),
            files_recheck: FILES_RECHECK,
        }
    }

    /// With series on a registry of their own (tests, one-shot commands).
    pub(crate) fn with_cluster_name(cluster_name: Option<String>) -> Self {
        Self::new(cluster_name, HttpClientMetrics::detached())
    }

    /// Checks the TLS files for a change at most every `period` (default 10s) rather than on
    /// every request.
    pub(crate) fn files_recheck(mut self, period: Duration) -> Self {
        self.files_recheck = period;
        self
    }

    /// Keeps the clients and series of these recommenders (those of the autoscalers running
    /// now) and drops the others, so that recommenders come and go without leaving anything
    /// behind. From then on only these are counted, until the next call.
    pub fn retain<'a>(&self, in_use: impl IntoIterator<Item = &'a Recommender>) {
        let mut keys = Vec::new();
        let mut labels = BTreeSet::new();
        for recommender in in_use {
            if let Ok(key) = ClientKey::of(recommender) {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            labels.insert(recommender.display_url());
        }
        // A poisoned lock only means another evaluation panicked; the lists are still whole.
        self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).retain(|slot| keys.contains(&slot.key));
        self.metrics.retain_clients(&labels);
        *self.counted.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(labels);
    }

    /// Whether requests to `label` are counted: the recommender is in use (or `retain` was
    /// never called).
    fn counts(&self, label: &str) -> bool {
        let counted = self.counted.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        counted.as_ref().is_none_or(|labels| labels.contains(label))
    }

    /// The client for `key`, built on first use and again when its files changed. The files
    /// are read off the async runtime, and checked for a change at most every `files_recheck`.
    /// A client of a recommender no longer in use (`keep` false) is not kept.
    async fn client(&self, key: &ClientKey, keep: bool) -> Result<reqwest::Client, String> {
        let slot = {
            let mut clients = self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match clients.iter().find(|slot| slot.key == *key) {
                Some(slot) => Arc::clone(&slot.client),
                None => {
                    let client = Arc::new(tokio::sync::Mutex::new(None));
                    if keep {
                        clients.push(LazyClient { key: key.clone(), client: Arc::clone(&client) });
                    }
                    client
                }
            }
        };
        let mut built = slot.lock().await;
        if let Some(current) = built.as_mut() {
            let files = key.files();
            if files.is_empty() || current.checked.elapsed() < self.files_recheck {
                return Ok(current.client.clone());
            }
            let stamps = blocking(move || stamps(&files)).await?;
            if stamps == current.stamps {
                current.checked = Instant::now();
                return Ok(current.client.clone());
            }
            tracing::debug!("a recommender's TLS files changed: building its client again");
        }
        let key = key.clone();
        let fresh = blocking(move || key.build()).await??;
        let client = fresh.client.clone();
        *built = Some(fresh);
        Ok(client)
    }

    /// Asks `recommender` for `target`'s replica count, answering by `deadline` at the latest.
    pub async fn ask(
        &self,
        recommender: &Recommender,
        target: &TargetRef,
        state: WorkloadState,
        deadline: Instant,
    ) -> Observation {
        match self.request(recommender, target, state, deadline).await {
            Ok(reply) => reply.into_observation(),
            Err(error) => Observation::unavailable(error),
        }
    }

    async fn request(
        &self,
        recommender: &Recommender,
        target: &TargetRef,
        state: WorkloadState,
        deadline: Instant,
    ) -> Result<Reply, QueryError> {
        let label = recommender.display_url();
        let key = ClientKey::of(recommender).map_err(QueryError::Configuration)?;
        let client = self.client(&key, self.counts(&label)).await.map_err(QueryError::Configuration)?;
        let (url, host) = request_url(&recommender.url, key.renamed.as_ref()).map_err(QueryError::Configuration)?;
        let cluster = recommender.cluster_name.clone().or_else(|| self.cluster_name.clone()).unwrap_or_default();
        let body = request_body(recommender, target, &cluster, state);
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = recommender.timeout.min(left);
        if timeout.is_zero() {
            return Err(QueryError::Timeout(0));
        }
        let until = Instant::now() + timeout;
        let timed_out = || QueryError::Timeout(timeout.as_secs_f64().ceil() as u64);
        let mut post = client.post(url).header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(host) = host {
            // As the Datadog controller's Go client: the server name changes what TLS checks,
            // not the Host the request names.
            post = post.header(HOST, host);
        }
        let send = post.body(body).send();

        // Up to the response headers: what the Datadog controller's client series measure.
        let started = Instant::now();
        let in_flight = self.counts(&label).then(|| self.metrics.in_flight(&label));
        let sent = tokio::time::timeout_at(until, send).await;
        drop(in_flight);
        let mut response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                self.count_error(&label);
                // The URL is named by the caller, redacted; reqwest's own message would quote it whole.
                return Err(if e.is_timeout() { timed_out() } else { QueryError::Transport(chain(&e.without_url())) });
            }
            Err(_) => {
                self.count_error(&label);
                return Err(timed_out());
            }
        };
        let status = response.status();
        if self.counts(&label) {
            self.metrics.response(&label, "POST", status.as_u16(), started.elapsed().as_secs_f64());
        }

        // The body, read in chunks so that an endless one stops at the cap instead of filling memory.
        let read = async {
            let mut bytes = Vec::new();
            while let Some(chunk) =
                response.chunk().await.map_err(|e| QueryError::Transport(chain(&e.without_url())))?
            {
                if bytes.len() + chunk.len() > MAX_REPLY_BYTES {
                    // A failed reply is only logged in part; no need to read on.
                    if status != reqwest::StatusCode::OK {
                        break;
                    }
                    return Err(QueryError::Protocol(format!(
                        "the recommender's reply is over {MAX_REPLY_BYTES} bytes"
                    )));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes)
        };
        let bytes = tokio::time::timeout_at(until, read).await.map_err(|_| timed_out())??;
        if status != reqwest::StatusCode::OK {
            log_answer(&label, status.as_u16(), &bytes);
            let description = status.canonical_reason().map(|r| format!(" ({r})")).unwrap_or_default();
            return Err(QueryError::Server(format!("the recommender answered HTTP {}{description}", status.as_u16())));
        }
        parse_reply(&bytes).inspect_err(|_| log_answer(&label, status.as_u16(), &bytes))
    }

    fn count_error(&self, label: &str) {
        if self.counts(label) {
            self.metrics.error(label);
        }
    }
}

/// The answer that was not a recommendation, cut short, for whoever debugs the recommender.
fn log_answer(label: &str, status: u16, body: &[u8]) {
    let answer: String = String::from_utf8_lossy(body).chars().take(LOGGED_ANSWER).collect();
    tracing::debug!(recommender = %label, status, answer = %answer.trim(), "the recommender's answer");
}

/// Where the request goes: the url, or with a server name the url at that name, and then the
/// url's own host and port for the `Host` header.
fn request_url(url: &str, renamed: Option<&Renamed>) -> Result<(Url, Option<String>), String> {
    let mut parsed = Url::parse(url).map_err(|e| format!("the url is not a URL: {e}"))?;
    let Some(renamed) = renamed else { return Ok((parsed, None)) };
    let host = match (parsed.host_str(), parsed.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => return Err("the url has no host".into()),
    };
    parsed
        .set_host(Some(&renamed.server_name))
        .map_err(|e| format!("server_name {:?} cannot be a host: {e}", renamed.server_name))?;
    Ok((parsed, Some(host)))
}

/// The request body: `WorkloadRecommendationRequest` in protobuf JSON. As protobuf JSON does,
/// fields at their zero value are left out, except the `optional` replica counts.
pub fn request_body(recommender: &Recommender, target: &TargetRef, cluster: &str, state: WorkloadState) -> String {
    let request = Request {
        target_ref: TargetRefJson {
            cluster,
            namespace: &target.namespace,
            kind: &target.kind,
            name: &target.name,
            api_version: &target.api_version,
        },
        constraints: Constraints { min_replicas: state.min_replicas, max_replicas: state.max_replicas },
        state: StateJson {
            desired_replicas: state.desired,
            current_replicas: state.current,
            ready_replicas: state.ready.unwrap_or(state.current),
        },
        targets: [TargetJson {
            type_: &recommender.target_type,
            lower_bound: recommender.lower_bound,
            upper_bound: recommender.upper_bound,
        }],
        settings: &recommender.settings,
    };
    // Serializing these plain structs cannot fail.
    serde_json::to_string(&request).unwrap_or_default()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_f64(n: &f64) -> bool {
    *n == 0.0
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    target_ref: TargetRefJson<'a>,
    constraints: Constraints,
    state: StateJson,
    targets: [TargetJson<'a>; 1],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    settings: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TargetRefJson<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    cluster: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    api_version: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Constraints {
    #[serde(skip_serializing_if = "is_zero")]
    min_replicas: u32,
    #[serde(skip_serializing_if = "is_zero")]
    max_replicas: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StateJson {
    #[serde(skip_serializing_if = "is_zero")]
    desired_replicas: u32,
    current_replicas: u32,
    ready_replicas: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TargetJson<'a> {
    #[serde(rename = "type", skip_serializing_if = "str::is_empty")]
    type_: &'a str,
    #[serde(skip_serializing_if = "is_zero_f64")]
    lower_bound: f64,
    #[serde(skip_serializing_if = "is_zero_f64")]
    upper_bound: f64,
}

/// A `WorkloadRecommendationReply`, as far as it is used. Protobuf JSON may write an int32 as a
/// number or a string; both are read. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ReplyJson {
    error: Option<ErrorJson>,
    target_replicas: Option<Count>,
    lower_bound_replicas: Option<Count>,
    upper_bound_replicas: Option<Count>,
    observed_targets: Vec<ObservedTarget>,
    reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorJson {
    code: Option<Count>,
    message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ObservedTarget {
    target_value: Option<Number>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Count {
    Number(i64),
    Text(String),
}

impl Count {
    fn value(&self) -> Option<i64> {
        match self {
            Count::Number(n) => Some(*n),
            Count::Text(text) => text.trim().parse().ok(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Number {
    Number(f64),
    Text(String),
}

impl Number {
    fn value(&self) -> Option<f64> {
        match self {
            Number::Number(n) => Some(*n),
            Number::Text(text) => text.trim().parse().ok(),
        }
    }
}

/// A reply that is a recommendation.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub replicas: u32,
    pub lower_bound: Option<u32>,
    pub upper_bound: Option<u32>,
    pub observed: Option<f64>,
    pub reason: Option<String>,
}

impl Reply {
    fn into_observation(self) -> Observation {
        Observation {
            reading: Reading::Replicas {
                replicas: self.replicas,
                lower_bound: self.lower_bound,
                upper_bound: self.upper_bound,
                observed: self.observed,
            },
            detail: ObservationDetail::default(),
        }
    }
}

/// Reads a reply body: the recommendation, or why it is none.
pub(crate) fn parse_reply(body: &[u8]) -> Result<Reply, QueryError> {
    // serde's message may quote the answer: it goes to the debug log only.
    let reply: ReplyJson = serde_json::from_slice(body).map_err(|e| {
        tracing::debug!(error = %e, "the recommender's reply is not a recommendation");
        QueryError::Protocol(format!(
            "the recommender's reply is not a recommendation (not JSON, or a field of the wrong type, at line {} \
             column {})",
            e.line(),
            e.column()
        ))
    })?;
    if let Some(error) = reply.error {
        let code = error.code.as_ref().and_then(Count::value).map(|c| format!(" with code {c}")).unwrap_or_default();
        tracing::debug!(message = %error.message.chars().take(LOGGED_ANSWER).collect::<String>(), "the recommender's error");
        return Err(QueryError::Server(format!(
            "the recommender answered an error{code} (its message is in the daemon's debug log)"
        )));
    }
    let count = |name: &str, count: Option<&Count>| -> Result<Option<u32>, QueryError> {
        let Some(count) = count else { return Ok(None) };
        let value = count.value().and_then(|v| u32::try_from(v).ok());
        value.map(Some).ok_or_else(|| QueryError::Protocol(format!("{name} is not a replica count (0 to 4294967295)")))
    };
    let replicas = count("targetReplicas", reply.target_replicas.as_ref())?
        .ok_or_else(|| QueryError::Protocol("the recommender's reply has no targetReplicas".into()))?;
    let observed = match reply.observed_targets.as_slice() {
        // As the Datadog controller: the observed value only when there is exactly one target.
        [one] => one.target_value.as_ref().and_then(Number::value).filter(|v| v.is_finite()),
        _ => None,
    };
    Ok(Reply {
        replicas,
        lower_bound: count("lowerBoundReplicas", reply.lower_bound_replicas.as_ref())?,
        upper_bound: count("upperBoundReplicas", reply.upper_bound_replicas.as_ref())?,
        observed,
        reason: reply.reason.filter(|r| !r.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn recommender() -> Recommender {
        Recommender {
            url: "http://127.0.0.1:1/".into(),
            target_type: "cpu".into(),
            settings: BTreeMap::from([("window".to_string(), "1h".to_string())]),
            lower_bound: 0.6,
            upper_bound: 0.8,
            timeout: Duration::from_secs(10),
            cluster_name: None,
            tls: TlsSettings::default(),
            server_name: None,
            tls_dir: None,
        }
    }

    #[test]
    fn the_request_has_the_datadog_controllers_field_names() {
        let target = TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "prod".into(),
            name: "billing".into(),
        };
        let state = WorkloadState { desired: 4, current: 5, ready: Some(3), min_replicas: 2, max_replicas: 9 };
        let body: serde_json::Value =
            serde_json::from_str(&request_body(&recommender(), &target, "eu-1", state)).expect("json");
        assert_eq!(
            body,
            serde_json::json!({
                "targetRef": {"cluster": "eu-1", "namespace": "prod", "kind": "Deployment", "name": "billing",
                              "apiVersion": "apps/v1"},
                "constraints": {"minReplicas": 2, "maxReplicas": 9},
                "state": {"desiredReplicas": 4, "currentReplicas": 5, "readyReplicas": 3},
                "targets": [{"type": "cpu", "lowerBound": 0.6, "upperBound": 0.8}],
                "settings": {"window": "1h"}
            })
        );
    }

    #[test]
    fn a_reply_carries_its_bounds_and_observed_value() {
        let reply = parse_reply(
            br#"{"timestamp": "2024-05-01T12:00:00Z", "targetReplicas": 7, "lowerBoundReplicas": "5",
                 "upperBoundReplicas": 9, "observedTargets": [{"type": "cpu", "targetValue": 0.73}],
                 "reason": "busy"}"#,
        )
        .expect("reply");
        assert_eq!(
            reply,
            Reply {
                replicas: 7,
                lower_bound: Some(5),
                upper_bound: Some(9),
                observed: Some(0.73),
                reason: Some("busy".into())
            }
        );
    }

    #[test]
    fn what_is_not_a_recommendation_says_why() {
        let err = |body: &[u8]| parse_reply(body).expect_err("not a recommendation").to_string();
        assert_eq!(
            err(br#"{"error": {"code": 5, "message": "unknown workload"}}"#),
            "server error: the recommender answered an error with code 5 (its message is in the daemon's debug log)"
        );
        // What the answer says is not repeated, wherever it is.
        let quoted = err(br#"{"error": "the database password is hunter2"}"#);
        assert!(!quoted.contains("hunter2"), "{quoted}");
        let quoted = err(br#"{"targetReplicas": "hunter2"}"#);
        assert!(!quoted.contains("hunter2") && quoted.contains("targetReplicas"), "{quoted}");
        assert!(err(b"<html>").starts_with("unexpected answer: the recommender's reply is not a recommendation"));
        assert_eq!(err(b"{}"), "unexpected answer: the recommender's reply has no targetReplicas");
        assert!(err(br#"{"targetReplicas": -2}"#).contains("targetReplicas"), "{}", err(br#"{"targetReplicas": -2}"#));
    }
}
