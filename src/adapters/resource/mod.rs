//! Resource metrics: the cpu or memory usage of the pods a metric's selector selects, read from
//! the Kubernetes metrics API (`metrics.k8s.io/v1beta1` PodMetrics, served by metrics-server
//! through the API server's aggregation layer), with the pods themselves read from the API
//! server to decide which count (`tally`).
//!
//! # What is asked, and why a list per cycle
//! Per cycle, for each (namespace, selector) in use, and only those: one LIST of PodMetrics and
//! one LIST of Pods, both with the selector as `labelSelector`; never a GET per pod, and nothing
//! for namespaces or pods no metric selects. Metrics with the same namespace and selector (cpu
//! and memory of one workload, or two autoscalers) share the two requests.
//!
//! The pods are listed each cycle rather than kept by a watch: the PodMetrics have no watch and
//! are listed each cycle anyway, so the pod list is one more request of the same shape, taken
//! at the same moment, which keeps pods and samples consistent with each other. It is asked with
//! `resourceVersion=0`, so the API server answers from its watch cache (filtering by label in
//! memory) without reading etcd: the same source and freshness a watch would give. A watch per
//! selector would save the transfer of unchanged pods, but keep every selected pod in this
//! process's memory between cycles, hold one more long-lived connection per selector, and have
//! to be started and stopped as rules come and go; pods whose readiness changes (the ones that
//! matter here) would be sent either way.
//!
//! # Unavailable, partial
//! A failed request, no selected pod that counts, or no usable sample for any of them is
//! "unavailable" with the reason: never 0. Some pods that count without a usable sample (none,
//! stale, a container without the resource) make a *partial* reading, a lower bound marked in
//! `ObservationDetail::partial`; the daemon lets it scale up but never down (see
//! `runtime::evaluate`).

mod tally;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use tokio::task::JoinSet;
use tokio::time::Instant;
use watermarkd_engine::Timestamp;

use crate::adapters::backend::{Observation, ObservationDetail, QueryError};
use crate::adapters::telemetry::BackendMetrics;
use crate::domain::rules::ResourceSource;

pub(crate) use tally::{tally, PodSample, PodView, TallyOutcome, TallyRule};

/// How the resource metrics appear in `watermarkd_backend_*` series and cycle timings.
pub const BACKEND_LABEL: &str = "metrics.k8s.io";

/// One resource metric to read: its source, in the namespace of its autoscaler's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceQuery {
    pub namespace: Arc<str>,
    pub source: ResourceSource,
}

/// Reads resource metrics through the API server.
#[derive(Clone)]
pub struct ResourceMetrics {
    client: kube::Client,
    metrics: Arc<BackendMetrics>,
}

/// What one (namespace, selector) read gave: the pods and their samples, or why not.
type Snapshot = Result<(Vec<PodView>, Vec<PodSample>), QueryError>;

impl ResourceMetrics {
    pub fn new(client: kube::Client, metrics: Arc<BackendMetrics>) -> ResourceMetrics {
        ResourceMetrics { client, metrics }
    }

    /// Answers `queries` in their order, all by `deadline`.
    pub async fn evaluate(&self, queries: &[ResourceQuery], now: Timestamp, deadline: Instant) -> Vec<Observation> {
        let mut groups: BTreeMap<(Arc<str>, String), Option<Snapshot>> = BTreeMap::new();
        for query in queries {
            groups.insert((query.namespace.clone(), query.source.selector.clone()), None);
        }
        let mut reads = JoinSet::new();
        let budget = deadline.saturating_duration_since(Instant::now()).as_secs();
        for (namespace, selector) in groups.keys().cloned() {
            let this = self.clone();
            reads.spawn(async move {
                let snapshot = match tokio::time::timeout_at(deadline, this.read(&namespace, &selector)).await {
                    Ok(snapshot) => snapshot,
                    Err(_) => Err(QueryError::Timeout(budget)),
                };
                ((namespace, selector), snapshot)
            });
        }
        while let Some(done) = reads.join_next().await {
            if let Ok((key, snapshot)) = done {
                groups.insert(key, Some(snapshot));
            }
        }
        queries
            .iter()
            .map(|query| {
                let key = (query.namespace.clone(), query.source.selector.clone());
                match groups.get(&key) {
                    Some(Some(Ok((pods, samples)))) => observe(query, pods, samples, now),
                    Some(Some(Err(error))) => Observation::unavailable(error.clone()),
                    _ => Observation::unavailable(QueryError::Server("the read of the pods did not finish".into())),
                }
            })
            .collect()
    }

    /// One LIST of pods and one of PodMetrics, both with the selector, at the same moment.
    async fn read(&self, namespace: &str, selector: &str) -> Snapshot {
        let started = Instant::now();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let samples: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &pod_metrics());
        // resourceVersion=0: from the API server's watch cache, not a read of etcd.
        let pod_params = ListParams::default().labels(selector).match_any();
        let sample_params = ListParams::default().labels(selector);
        let (pods, samples) = tokio::join!(pods.list(&pod_params), samples.list(&sample_params));
        for (outcome, seconds) in [(pods.is_ok(), started.elapsed()), (samples.is_ok(), started.elapsed())] {
            let outcome = if outcome { "ok" } else { "server_error" };
            self.metrics.request_ended(BACKEND_LABEL, outcome);
            self.metrics.request_seconds.with_label_values(&[BACKEND_LABEL]).observe(seconds.as_secs_f64());
        }
        let pods = pods.map_err(|e| api_error(e, "pods", namespace))?;
        let samples = samples.map_err(|e| api_error(e, "pods.metrics.k8s.io", namespace))?;
        let pods = pods.items.iter().map(PodView::from_pod).collect();
        let samples = samples
            .items
            .iter()
            .filter_map(|object| serde_json::to_value(object).ok())
            .map(|value| PodSample::from_json(&value))
            .collect();
        Ok((pods, samples))
    }
}

fn pod_metrics() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics"), "pods")
}

/// What one query reads from its group's pods and samples.
fn observe(query: &ResourceQuery, pods: &[PodView], samples: &[PodSample], now: Timestamp) -> Observation {
    let source = &query.source;
    let rule = TallyRule {
        resource: source.resource,
        aggregation: source.aggregation,
        readiness_delay: source.readiness_delay,
        max_age: source.max_age,
    };
    let result = tally(&rule, pods, samples, now);
    tracing::debug!(
        namespace = %query.namespace,
        selector = %source.selector,
        resource = %source.resource,
        measured = result.measured.len(),
        missing = ?result.missing,
        ignored = ?result.ignored,
        "resource metric read"
    );
    let detail = ObservationDetail { series: Some(result.measured.len()), ..ObservationDetail::default() };
    match result.outcome {
        TallyOutcome::Complete { value, at } => Observation::value(value, at, detail),
        TallyOutcome::Partial { value, at } => {
            let counted = result.measured.len() + result.missing.len();
            let missing: Vec<String> = result.missing.iter().take(5).map(|e| format!("{}: {}", e.pod, e.why)).collect();
            let more = result.missing.len().saturating_sub(5);
            let more = if more > 0 { format!("; {more} more") } else { String::new() };
            let partial = format!(
                "{} of the {counted} pods that count have no usable metrics ({}{more}), so {value} is a lower bound",
                result.missing.len(),
                missing.join("; ")
            );
            Observation::value(value, at, ObservationDetail { partial: Some(partial), ..detail })
        }
        TallyOutcome::Unavailable(why) => Observation::unavailable_with(QueryError::NoData(why), detail),
    }
}

/// A failed list, said so that a person knows what to fix.
fn api_error(error: kube::Error, what: &str, namespace: &str) -> QueryError {
    match error {
        kube::Error::Api(status) if status.code == 404 && what != "pods" => QueryError::Configuration(format!(
            "the API server does not serve {what} (is metrics-server installed and its APIService available?): {}",
            status.message
        )),
        kube::Error::Api(status) if status.code == 403 => QueryError::Configuration(format!(
            "forbidden to list {what} in namespace {namespace} (deploy/rbac.yaml grants it): {}",
            status.message
        )),
        kube::Error::Api(status) if status.code == 400 => QueryError::BadQuery(status.message),
        kube::Error::Api(status) if status.code == 429 => QueryError::Server(format!("throttled: {}", status.message)),
        kube::Error::Api(status) => QueryError::Server(format!("listing {what}: {} ({})", status.message, status.code)),
        other => QueryError::Transport(format!("listing {what}: {other}")),
    }
}
