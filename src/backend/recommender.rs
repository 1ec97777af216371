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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use reqwest::header::{HeaderValue, CONTENT_TYPE};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use watermarkd_engine::Reading;

use super::prometheus::connection::{chain, tls};
use super::{Observation, ObservationDetail, QueryError};
use crate::rules::{Recommender, TargetRef, TlsSettings};
use crate::telemetry::HttpClientMetrics;

/// The environment variable the Datadog controller takes its cluster name from: the default of
/// the daemon's `cluster_name` setting, sent as `targetRef.cluster`.
pub const CLUSTER_NAME_ENV: &str = "K8S_CLUSTER_NAME";
/// How much of a non-200 body is quoted in the reason, as the Datadog controller does.
const QUOTED_BODY: usize = 100;
/// A reply larger than this is not a recommendation.
const MAX_REPLY_BYTES: usize = 1 << 20;

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

/// The HTTP clients of the recommenders in use, one per TLS configuration (and per version of
/// its files, so that rotated certificates are picked up).
pub struct RecommenderClients {
    clients: Mutex<Vec<(TlsKey, reqwest::Client)>>,
    /// The daemon's cluster name (`cluster_name` setting, else `K8S_CLUSTER_NAME`), for
    /// recommenders that do not name one.
    cluster_name: Option<String>,
    metrics: HttpClientMetrics,
}

#[derive(Clone, Debug, PartialEq)]
struct TlsKey {
    settings: TlsSettings,
    modified: Vec<Option<SystemTime>>,
}

impl TlsKey {
    fn of(settings: &TlsSettings) -> Self {
        let files: [&Option<PathBuf>; 3] = [&settings.ca_file, &settings.client_cert_file, &settings.client_key_file];
        let modified = files
            .into_iter()
            .map(|file| file.as_ref().and_then(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()))
            .collect();
        TlsKey { settings: settings.clone(), modified }
    }
}

impl RecommenderClients {
    /// Clients that name `cluster_name` in requests whose recommender names no cluster, and
    /// report their requests in `metrics`.
    pub fn new(cluster_name: Option<String>, metrics: HttpClientMetrics) -> Self {
        let cluster_name = cluster_name.filter(|name| !name.is_empty());
        RecommenderClients { clients: Mutex::new(Vec::new()), cluster_name, metrics }
    }

    /// With series on a registry of their own (tests, one-shot commands).
    pub fn with_cluster_name(cluster_name: Option<String>) -> Self {
        Self::new(cluster_name, HttpClientMetrics::detached())
    }

    fn client(&self, settings: &TlsSettings) -> Result<reqwest::Client, String> {
        let key = TlsKey::of(settings);
        // A poisoned lock only means another evaluation panicked; the list is still whole.
        let mut clients = self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, client)) = clients.iter().find(|(k, _)| *k == key) {
            return Ok(client.clone());
        }
        super::ensure_crypto_provider();
        let builder = reqwest::Client::builder()
            .user_agent(concat!("watermarkd/", env!("CARGO_PKG_VERSION")))
            .redirect(super::trust::redirect_policy());
        let builder = tls(builder, "recommender", settings)?;
        let client = builder.build().map_err(|e| format!("cannot set up the HTTP client: {}", chain(&e)))?;
        // Files that changed leave their old client behind: drop clients of the same settings.
        clients.retain(|(k, _)| k.settings != key.settings);
        clients.push((key, client.clone()));
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
        let client = self.client(&recommender.tls).map_err(QueryError::Configuration)?;
        let cluster = recommender.cluster_name.clone().or_else(|| self.cluster_name.clone()).unwrap_or_default();
        let body = request_body(recommender, target, &cluster, state);
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = recommender.timeout.min(left);
        if timeout.is_zero() {
            return Err(QueryError::Timeout(0));
        }
        let until = Instant::now() + timeout;
        let timed_out = || QueryError::Timeout(timeout.as_secs_f64().ceil() as u64);
        let label = recommender.display_url();
        let send = client
            .post(&recommender.url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body)
            .send();

        // Up to the response headers: what the Datadog controller's client series measure.
        let started = Instant::now();
        let in_flight = self.metrics.in_flight(&label);
        let sent = tokio::time::timeout_at(until, send).await;
        drop(in_flight);
        let mut response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                self.metrics.error(&label);
                // The URL is named by the caller, redacted; reqwest's own message would quote it whole.
                return Err(if e.is_timeout() {
                    timed_out()
                } else if super::trust::is_refused_redirect(&e) {
                    QueryError::Configuration(chain(&e.without_url()))
                } else {
                    QueryError::Transport(chain(&e.without_url()))
                });
            }
            Err(_) => {
                self.metrics.error(&label);
                return Err(timed_out());
            }
        };
        let status = response.status();
        self.metrics.response(&label, "POST", status.as_u16(), started.elapsed().as_secs_f64());

        // The body, read in chunks so that an endless one stops at the cap instead of filling memory.
        let read = async {
            let mut bytes = Vec::new();
            while let Some(chunk) =
                response.chunk().await.map_err(|e| QueryError::Transport(chain(&e.without_url())))?
            {
                if bytes.len() + chunk.len() > MAX_REPLY_BYTES {
                    // A failed reply is only quoted in part; no need to read on.
                    if status != reqwest::StatusCode::OK {
                        bytes.extend_from_slice(&chunk[..chunk.len().min(MAX_REPLY_BYTES - bytes.len())]);
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
            let quoted: String = String::from_utf8_lossy(&bytes).chars().take(QUOTED_BODY).collect();
            let quoted = quoted.trim();
            let message = if quoted.is_empty() {
                format!("the recommender answered HTTP {}", status.as_u16())
            } else {
                format!("the recommender answered HTTP {} ({quoted})", status.as_u16())
            };
            return Err(QueryError::Server(message));
        }
        parse_reply(&bytes)
    }
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
pub fn parse_reply(body: &[u8]) -> Result<Reply, QueryError> {
    let reply: ReplyJson = serde_json::from_slice(body)
        .map_err(|e| QueryError::Protocol(format!("the recommender's reply is not a recommendation: {e}")))?;
    if let Some(error) = reply.error {
        let code = error.code.as_ref().and_then(Count::value).map(|c| format!("{c} ")).unwrap_or_default();
        return Err(QueryError::Server(format!("the recommender answered an error: {code}{}", error.message)));
    }
    let count = |name: &str, count: Option<&Count>| -> Result<Option<u32>, QueryError> {
        let Some(count) = count else { return Ok(None) };
        let value = count.value().and_then(|v| u32::try_from(v).ok());
        value.map(Some).ok_or_else(|| QueryError::Protocol(format!("{name} ({count:?}) is not a replica count")))
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
            "server error: the recommender answered an error: 5 unknown workload"
        );
        assert!(err(b"<html>").starts_with("unexpected answer: the recommender's reply is not a recommendation"));
        assert_eq!(err(b"{}"), "unexpected answer: the recommender's reply has no targetReplicas");
        assert!(err(br#"{"targetReplicas": -2}"#).contains("targetReplicas"), "{}", err(br#"{"targetReplicas": -2}"#));
    }
}
