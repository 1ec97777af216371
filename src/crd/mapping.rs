//! A `WatermarkPodAutoscaler` -> the same `rules::Autoscaler` a rules file yields, through the
//! same extraction and `Rule::new`: the spec is rewritten with the rules file's keys and read by
//! `rules::autoscaler_from_document`, which reports every problem with the WPA's own field
//! path (`spec.metrics[0].external.lowWatermark`). What the rules file cannot express is
//! decided here: the Datadog controller's defaults where they differ from ours, the query the
//! Cluster Agent would build, `DatadogMetric` references, the `watermarkd.io/queries`
//! annotation, Resource metrics (cpu and memory from the metrics API), and what watermarkd does
//! not support yet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use super::annotation::{annotation_path, read_overrides, QueryOverride, QUERIES_ANNOTATION};
use super::query::{
    datadog_query, metric_reference, tag_scope, DatadogMetricQueries, MetricReference, DEFAULT_AGGREGATOR,
    DEFAULT_ROLLUP_SECONDS,
};
use super::recommender_policy::RecommenderPolicy;
use super::types::{
    ExternalMetricSource, MetricSpec, Quantity, RecommenderSpec, ResourceMetricSource, WatermarkPodAutoscaler,
    WatermarkPodAutoscalerSpec,
};
use crate::rules::selector::{selector_text, Expression};
use crate::rules::{autoscaler_from_document, Autoscaler, Backend, Problem};

/// The namespace of an object read from a file without one (`kubectl apply` would put it in
/// the context's namespace, `default` unless configured). Objects from the API always have one.
const DEFAULT_NAMESPACE: &str = "default";

/// Rules-reader messages that name another field in the rules file's spelling, and the WPA's.
const MESSAGE_WORDS: [(&str, &str); 3] =
    [("max_replicas", "maxReplicas"), ("high_watermark", "highWatermark"), ("low_watermark", "lowWatermark")];

/// How WPAs become autoscalers in this daemon.
#[derive(Clone, Debug)]
pub struct MappingOptions {
    /// The `[backend.NAME]` (a Datadog backend) External metrics are queried on unless the
    /// annotation names another: the account the Cluster Agent queried.
    pub default_backend: String,
    /// The Cluster Agent's `external_metrics.aggregator` (default `avg`).
    pub aggregator: String,
    /// The Cluster Agent's `external_metrics_provider.rollup` in seconds (default 30).
    pub rollup_seconds: u32,
    /// The declared backends, when known: every backend a WPA uses is checked against them.
    backends: Option<BTreeMap<String, Option<Backend>>>,
    /// The recommender URLs and TLS files a WPA may name (by default none).
    recommender_policy: RecommenderPolicy,
}

impl MappingOptions {
    pub fn new(default_backend: impl Into<String>) -> Self {
        MappingOptions {
            default_backend: default_backend.into(),
            aggregator: DEFAULT_AGGREGATOR.into(),
            rollup_seconds: DEFAULT_ROLLUP_SECONDS,
            backends: None,
            recommender_policy: RecommenderPolicy::default(),
        }
    }

    /// Lets WPAs use the recommenders and TLS files `policy` allows (the daemon's
    /// `recommender_allowed_urls` and `recommender_tls_dir`).
    pub fn with_recommender_policy(mut self, policy: RecommenderPolicy) -> Self {
        self.recommender_policy = policy;
        self
    }

    /// Checks every backend reference against these (the daemon's `[backend.NAME]` tables).
    pub fn with_backends(mut self, backends: &BTreeMap<String, Backend>) -> Self {
        self.backends = Some(backends.iter().map(|(name, b)| (name.clone(), Some(b.clone()))).collect());
        self
    }

    /// What is wrong with the options themselves, checked once when the daemon starts so that
    /// it is not reported again on every WPA.
    pub fn check(&self) -> Result<(), String> {
        if self.aggregator.is_empty() || !self.aggregator.chars().all(|c| c.is_ascii_lowercase()) {
            return Err(format!(
                "the aggregator ({:?}) must be a Datadog aggregator such as avg, max, min or sum",
                self.aggregator
            ));
        }
        if self.rollup_seconds == 0 {
            return Err("the rollup must be at least 1 second".into());
        }
        Ok(())
    }

    /// The default backend's configuration, when the backends are known and it is one of them.
    fn default_backend_type(&self) -> Option<&Backend> {
        self.backends.as_ref()?.get(&self.default_backend)?.as_ref()
    }

    /// Why the default backend cannot answer a query built from an External metric's name (the
    /// Cluster Agent's Datadog query), if it cannot. Only WPAs with such a metric need it: one
    /// whose every metric has a query in the `watermarkd.io/queries` annotation runs on any
    /// backend, so a Prometheus-only daemon may name its Prometheus backend here.
    pub fn default_backend_problem(&self) -> Option<String> {
        match self.backends.as_ref().map(|b| b.get(&self.default_backend)) {
            None | Some(Some(Some(Backend::Datadog(_)))) => None,
            Some(None) => Some(format!("the default backend {:?} names no [backend.{0}] table", self.default_backend)),
            Some(Some(_)) => Some(format!(
                "the default backend {:?} is not a datadog backend, and a query built from metricName is a Datadog \
                 query",
                self.default_backend
            )),
        }
    }
}

/// A WPA ready to run, and what of it has no effect in watermarkd (for a log line or event).
#[derive(Clone, Debug)]
pub struct MappedWpa {
    pub autoscaler: Autoscaler,
    pub notes: Vec<String>,
}

/// A part of a WPA that watermarkd does not support yet. A WPA with one is not run at all
/// (running it on its other metrics would scale on less than its author asked for); the daemon
/// says so in its status (`status::rejected_status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// `namespace/name` of the WPA.
    pub wpa: String,
    pub field: String,
    pub message: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WatermarkPodAutoscaler {}: {} {}", self.wpa, self.field, self.message)
    }
}

/// Why a WPA does not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapError {
    /// The spec is invalid: every problem, each naming the WPA (as the autoscaler
    /// `namespace/name`) and the field by its path in the object. Unsupported parts found on
    /// the way are listed too.
    Invalid { problems: Vec<Problem>, unsupported: Vec<Unsupported> },
    /// The spec is valid but uses something watermarkd does not support yet.
    Unsupported(Vec<Unsupported>),
    /// The WPA is valid, but another autoscaler already scales its target: the rules file's,
    /// or an older WPA. Two would fight over the replicas; this one waits until the other goes.
    TargetConflict {
        /// `namespace/name` of this WPA.
        wpa: String,
        /// The object both scale: `Deployment shop/web`.
        target: String,
        /// Who scales it: `WatermarkPodAutoscaler shop/web-a (the older one)`, or the rules
        /// file's autoscaler.
        holder: String,
    },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (problems, unsupported): (&[Problem], &[Unsupported]) = match self {
            MapError::Invalid { problems, unsupported } => (problems, unsupported),
            MapError::Unsupported(unsupported) => (&[], unsupported),
            MapError::TargetConflict { wpa, .. } => {
                return write!(
                    f,
                    "WatermarkPodAutoscaler {wpa}: not run: {}",
                    self.conflict_reason().unwrap_or_default()
                )
            }
        };
        let mut lines = problems
            .iter()
            .map(|p| {
                let wpa = p.autoscaler.as_deref().unwrap_or_default();
                let bare = Problem { autoscaler: None, ..p.clone() };
                format!("WatermarkPodAutoscaler {wpa}: {bare}")
            })
            .chain(unsupported.iter().map(ToString::to_string));
        if let Some(first) = lines.next() {
            f.write_str(&first)?;
        }
        for line in lines {
            write!(f, "\n{line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for MapError {}

impl MapError {
    /// Why a WPA in conflict does not run, without its own name (for its status).
    pub fn conflict_reason(&self) -> Option<String> {
        let MapError::TargetConflict { target, holder, .. } = self else { return None };
        Some(format!(
            "{target} is already scaled by {holder}; two autoscalers on one target would fight over its replicas. \
             This one runs once that one is gone (or delete this one, or mark it a shadow rule with the \
             {SHADOW_ANNOTATION}: \"true\" annotation)"
        ))
    }
}

/// `namespace/name`: how a WPA is named as an autoscaler, in problems, logs and metrics.
pub fn wpa_id(wpa: &WatermarkPodAutoscaler) -> String {
    let namespace = wpa.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
    format!("{namespace}/{}", wpa.metadata.name.as_deref().unwrap_or_default())
}

/// Maps a WPA to the autoscaler it describes, or says why it cannot run.
///
/// Every WPA metric becomes the rule's metric of the same index, so that the engine's
/// `metric[i]` is `spec.metrics[i]` and problems map back exactly.
pub fn map_wpa(
    wpa: &WatermarkPodAutoscaler,
    options: &MappingOptions,
    datadog_metrics: &dyn DatadogMetricQueries,
) -> Result<MappedWpa, MapError> {
    let id = wpa_id(wpa);
    let namespace = wpa.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
    let mut mapper = Mapper { id: id.clone(), paths: BTreeMap::new(), problems: Vec::new(), unsupported: Vec::new() };
    let mut notes = Vec::new();
    if wpa.metadata.name.as_deref().is_none_or(str::is_empty) {
        mapper.problem("metadata.name", "is required");
    }

    let spec = &wpa.spec;
    let mut document = Map::new();
    document.insert("name".into(), Value::String(id.clone()));
    mapper.path("name", "metadata.name");
    mapper.target(&mut document, spec, namespace);
    mapper.knobs(&mut document, spec);
    // With a recommender the metrics are not read at all, as in the Datadog controller.
    let no_metrics = Vec::new();
    let wpa_metrics = if spec.recommender.is_some() { &no_metrics } else { &spec.metrics };
    let has_resource_metric = wpa_metrics.iter().any(|m| m.type_ == "Resource");
    if let Some(delay) = spec.readiness_delay_seconds.filter(|_| !has_resource_metric) {
        // For External metrics the Datadog controller lists the target's pods and counts a
        // Pending pod as ready for this long after its readiness last changed. watermarkd takes
        // the ready count from the workload's status (its scale subresource), so there the field
        // has no effect; Resource metrics use it (which cpu samples count).
        notes.push(format!(
            "spec.readinessDelaySeconds ({delay}) has no effect without a Resource metric: watermarkd counts the \
             ready replicas the workload reports instead of listing its pods"
        ));
    }
    let annotations = wpa.metadata.annotations.as_ref();
    let pod_aggregation = annotations.and_then(|a| a.get(POD_AGGREGATION_ANNOTATION)).cloned();
    if pod_aggregation.is_some() && !has_resource_metric {
        let why = if spec.recommender.is_some() {
            "applies to Resource metrics, and with spec.recommender this WPA's metrics are not read"
        } else {
            "applies to Resource metrics, and this WPA has none"
        };
        mapper.problem(&annotation_key_path(POD_AGGREGATION_ANNOTATION), why);
    }
    match annotations.and_then(|a| a.get(SHADOW_ANNOTATION)).map(String::as_str) {
        None | Some("false") => {}
        Some("true") => {
            document.insert("shadow".into(), Value::Bool(true));
            mapper.path("shadow", &annotation_key_path(SHADOW_ANNOTATION));
        }
        Some(other) => mapper
            .problem(&annotation_key_path(SHADOW_ANNOTATION), format!("must be \"true\" or \"false\", not {other:?}")),
    }
    let context = ResourceContext { readiness_delay_seconds: spec.readiness_delay_seconds, pod_aggregation };
    if let Some(recommender) = &spec.recommender {
        notes.extend(mapper.recommender(&mut document, recommender, &options.recommender_policy));
        if !spec.metrics.is_empty() {
            notes.push(
                "spec.metrics has no effect: with spec.recommender the replica count comes from the recommender, as in \
                 the Datadog controller"
                    .into(),
            );
        }
    }

    let overrides = read_overrides(wpa.metadata.annotations.as_ref(), wpa_metrics);
    for (field, message) in overrides.problems {
        mapper.problem(&field, message);
    }
    let names = metric_names(wpa_metrics);
    let mut broken = BTreeSet::new();
    let mut metrics = Vec::new();
    for (index, metric) in wpa_metrics.iter().enumerate() {
        let entry = mapper.metric(
            index,
            metric,
            names.get(index).map(String::as_str).unwrap_or_default(),
            overrides.by_metric.get(&index),
            options,
            datadog_metrics,
            &context,
        );
        match entry {
            Some(entry) => metrics.push(Value::Object(entry)),
            None => {
                // Its problem is reported; an empty entry keeps the indexes aligned, and what
                // the reader says about it is dropped below as an echo of that problem.
                broken.insert(index);
                metrics.push(Value::Object(Map::new()));
            }
        }
    }
    if spec.recommender.is_none() {
        document.insert("metric".into(), Value::Array(metrics));
    }
    mapper.path("metric", "spec.metrics");

    let paths = &mapper.paths;
    let rename = |path: &str| rename_path(paths, path);
    let result = autoscaler_from_document(&Value::Object(document), options.backends.as_ref(), &rename);
    let Mapper { mut problems, unsupported, .. } = mapper;
    let autoscaler = match result {
        Ok(mut autoscaler) => {
            if let Some(recommender) = autoscaler.recommender.as_mut() {
                // Where the files must still be once symlinks are followed, checked as they are read.
                recommender.tls_dir = options.recommender_policy.tls_dir().map(Into::into);
            }
            Some(autoscaler)
        }
        Err(found) => {
            let echoes = |p: &Problem| broken.iter().any(|i| is_within(&p.field, &format!("spec.metrics[{i}]")));
            problems.extend(found.into_iter().filter(|p| !echoes(p)).map(wpa_vocabulary));
            None
        }
    };
    problems.sort_by(|a, b| a.field.cmp(&b.field));
    match autoscaler {
        _ if !problems.is_empty() => Err(MapError::Invalid { problems, unsupported }),
        _ if !unsupported.is_empty() => Err(MapError::Unsupported(unsupported)),
        Some(autoscaler) => Ok(MappedWpa { autoscaler, notes }),
        // Not reachable: the reader reports why it yields no autoscaler.
        None => Err(MapError::Invalid {
            problems: vec![Problem {
                line: None,
                autoscaler: Some(id),
                field: String::new(),
                message: "is invalid".into(),
            }],
            unsupported,
        }),
    }
}

/// What a WPA's `tlsConfig.serverName` becomes.
enum ServerNameUse {
    /// The name to verify the certificate against (and send as SNI). A name the rules reader
    /// refuses lands here too, so that its problem is said.
    Verify,
    /// The url's own host (an IP address): what is verified anyway.
    UrlHost,
    /// The url is `http://`: there is no certificate, and the Datadog controller ignores it too.
    NoTls,
    /// Another IP address: the client can only verify a DNS name other than the url's host.
    OtherAddress,
}

fn server_name_use(server_name: &str, url: &str) -> ServerNameUse {
    let Ok(parsed) = reqwest::Url::parse(url) else { return ServerNameUse::Verify };
    if parsed.scheme() == "http" {
        return ServerNameUse::NoTls;
    }
    let address = |text: &str| text.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().ok();
    let Some(named) = address(server_name) else { return ServerNameUse::Verify };
    if parsed.host_str().and_then(address) == Some(named) {
        ServerNameUse::UrlHost
    } else {
        ServerNameUse::OtherAddress
    }
}

/// The annotation that chooses how a WPA's Resource metrics combine their pods: `sum` (the
/// Datadog controller's way, the default) or `average` (per pod, as the HPA's `AverageValue`).
pub const POD_AGGREGATION_ANNOTATION: &str = "watermarkd.io/pod-aggregation";

/// The annotation that makes a WPA a shadow rule: `"true"`, and it is evaluated beside the
/// active WPA on the same target in its namespace, and never writes the scale or its status.
pub const SHADOW_ANNOTATION: &str = "watermarkd.io/shadow";

/// `metadata.annotations["KEY"]`, as problems name an annotation.
fn annotation_key_path(key: &str) -> String {
    format!("metadata.annotations[{key:?}]")
}

/// What every Resource metric of one WPA takes from the rest of the object.
struct ResourceContext {
    readiness_delay_seconds: Option<i64>,
    pod_aggregation: Option<String>,
}

/// Builds the rules document and remembers how each of its paths is named in the WPA.
struct Mapper {
    id: String,
    /// Engine path (`metric[0].low_watermark`) -> WPA path (`spec.metrics[0].external.lowWatermark`).
    paths: BTreeMap<String, String>,
    problems: Vec<Problem>,
    unsupported: Vec<Unsupported>,
}

impl Mapper {
    fn path(&mut self, engine: &str, wpa: &str) {
        self.paths.insert(engine.to_string(), wpa.to_string());
    }

    fn problem(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            line: None,
            autoscaler: Some(self.id.clone()),
            field: field.to_string(),
            message: message.into(),
        });
    }

    fn unsupported(&mut self, field: &str, message: impl Into<String>) {
        self.unsupported.push(Unsupported { wpa: self.id.clone(), field: field.to_string(), message: message.into() });
    }

    /// `scaleTargetRef` in the WPA's namespace. When it is absent the rules reader reports
    /// `spec.scaleTargetRef is required`, as the Datadog CRD does.
    fn target(&mut self, document: &mut Map<String, Value>, spec: &WatermarkPodAutoscalerSpec, namespace: &str) {
        self.path("target", "spec.scaleTargetRef");
        self.path("target.kind", "spec.scaleTargetRef.kind");
        self.path("target.name", "spec.scaleTargetRef.name");
        self.path("target.api_version", "spec.scaleTargetRef.apiVersion");
        self.path("target.namespace", "metadata.namespace");
        let Some(reference) = &spec.scale_target_ref else { return };
        let mut target = Map::new();
        // An empty apiVersion is Go's zero value for an omitted one; we default it to apps/v1
        // as the rules file does (the Datadog controller cannot resolve an empty one).
        if let Some(api_version) = reference.api_version.as_ref().filter(|v| !v.is_empty()) {
            target.insert("api_version".into(), Value::String(api_version.clone()));
        }
        if let Some(kind) = &reference.kind {
            target.insert("kind".into(), Value::String(kind.clone()));
        }
        if let Some(name) = &reference.name {
            target.insert("name".into(), Value::String(name.clone()));
        }
        target.insert("namespace".into(), Value::String(namespace.to_string()));
        document.insert("target".into(), Value::Object(target));
    }

    /// The rule's scalar knobs. Absent fields are left out so that the engine's defaults apply:
    /// they equal the Datadog controller's (`DefaultWatermarkPodAutoscaler`: minReplicas 1,
    /// modulo 1, algorithm absolute, tolerance 0.1, limit factors 50/20, forbidden windows
    /// 60s/300s; its 15s sync period is our default interval) except where noted.
    fn knobs(&mut self, document: &mut Map<String, Value>, spec: &WatermarkPodAutoscalerSpec) {
        // The Datadog controller silently disables convergence on an unknown value; like an
        // unknown algorithm, we report it instead.
        let converge = match spec.converge_towards_watermark.as_deref() {
            None | Some("") => None,
            Some("highwatermark") => Some("high"),
            Some("lowwatermark") => Some("low"),
            Some(other) => {
                self.problem(
                    "spec.convergeTowardsWatermark",
                    format!("({other:?}) must be \"highwatermark\" or \"lowwatermark\""),
                );
                None
            }
        };
        if spec.min_replicas == Some(0) {
            // Scale to zero needs an activation per metric, which a WPA has no field for; the
            // Datadog CRD's minimum is 1, and a WPA keeps that meaning.
            self.problem(
                "spec.minReplicas",
                "(0) must be at least 1: a WatermarkPodAutoscaler does not scale to zero (a rules-file autoscaler \
                 can, with min_replicas = 0 and an activation per metric)",
            );
        }
        let mut put = |document: &mut Map<String, Value>, key: &str, wpa: &str, value: Option<Value>| {
            self.paths.insert(key.to_string(), format!("spec.{wpa}"));
            if let Some(value) = value {
                document.insert(key.to_string(), value);
            }
        };
        let int = |v: Option<i64>| v.map(Value::from);
        let quantity = |q: &Option<Quantity>| q.as_ref().map(Quantity::to_json);
        let min_replicas = spec.min_replicas.filter(|&min| min != 0);
        put(document, "min_replicas", "minReplicas", int(min_replicas));
        put(document, "max_replicas", "maxReplicas", int(spec.max_replicas));
        // The Datadog controller defaults an empty algorithm (Go's zero value) to absolute.
        let algorithm = spec.algorithm.as_ref().filter(|a| !a.is_empty()).map(|a| Value::String(a.clone()));
        put(document, "algorithm", "algorithm", algorithm);
        // The Datadog controller treats a tolerance of 0 as unset and uses 10%, where the rules
        // file allows 0; a WPA keeps the behaviour it had.
        let tolerance = spec.tolerance.as_ref().filter(|t| !t.to_decimal().is_ok_and(|d| d.is_zero()));
        put(document, "tolerance", "tolerance", tolerance.map(Quantity::to_json));
        put(document, "scale_up_limit_factor", "scaleUpLimitFactor", quantity(&spec.scale_up_limit_factor));
        put(document, "scale_down_limit_factor", "scaleDownLimitFactor", quantity(&spec.scale_down_limit_factor));
        // 0 is Go's zero value for an omitted window, which the Datadog controller defaults.
        let window = |v: Option<i64>| v.filter(|&s| s != 0).map(Value::from);
        put(
            document,
            "upscale_forbidden_window",
            "upscaleForbiddenWindowSeconds",
            window(spec.upscale_forbidden_window_seconds),
        );
        put(
            document,
            "downscale_forbidden_window",
            "downscaleForbiddenWindowSeconds",
            window(spec.downscale_forbidden_window_seconds),
        );
        put(
            document,
            "upscale_delay_above_watermark",
            "upscaleDelayAboveWatermarkSeconds",
            int(spec.upscale_delay_above_watermark_seconds),
        );
        put(
            document,
            "downscale_delay_below_watermark",
            "downscaleDelayBelowWatermarkSeconds",
            int(spec.downscale_delay_below_watermark_seconds),
        );
        put(document, "replica_modulo", "replicaScalingAbsoluteModulo", int(spec.replica_scaling_absolute_modulo));
        put(document, "tolerate_zero", "tolerateZero", spec.tolerate_zero.map(Value::Bool));
        put(
            document,
            "min_available_replica_percentage",
            "minAvailableReplicaPercentage",
            int(spec.min_available_replica_percentage),
        );
        put(document, "dry_run", "dryRun", spec.dry_run.map(Value::Bool));

        put(
            document,
            "converge_towards_watermark",
            "convergeTowardsWatermark",
            converge.map(|c| Value::String(c.into())),
        );
    }

    /// `spec.recommender` as the rules file's `recommender` table; returns what of it has no
    /// effect. Its watermarks are the bounds sent to the service, and the rule's one metric.
    /// The url and the TLS files must be ones `policy` allows.
    fn recommender(
        &mut self,
        document: &mut Map<String, Value>,
        recommender: &RecommenderSpec,
        policy: &RecommenderPolicy,
    ) -> Vec<String> {
        let at = "spec.recommender";
        let mut notes = Vec::new();
        self.path("recommender", at);
        self.path("metric[0]", at);
        let mut table = Map::new();
        let mut put = |mapper: &mut Self, key: &str, wpa: &str, value: Option<Value>| {
            mapper.path(&format!("recommender.{key}"), &format!("{at}.{wpa}"));
            if let Some(value) = value {
                table.insert(key.to_string(), value);
            }
        };
        let text = |v: &Option<String>| v.as_ref().filter(|v| !v.is_empty()).map(|v| Value::String(v.clone()));
        put(self, "url", "url", Some(Value::String(recommender.url.clone())));
        if let Some(problem) = policy.url_problem(&recommender.url) {
            self.problem(&format!("{at}.url"), problem);
        }
        put(self, "target_type", "targetType", text(&recommender.target_type));
        let settings: Map<String, Value> =
            recommender.settings.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        put(self, "settings", "settings", (!settings.is_empty()).then_some(Value::Object(settings)));
        put(self, "high_watermark", "highWatermark", recommender.high_watermark.as_ref().map(Quantity::to_json));
        put(self, "low_watermark", "lowWatermark", recommender.low_watermark.as_ref().map(Quantity::to_json));
        self.path("metric[0].high_watermark", &format!("{at}.highWatermark"));
        self.path("metric[0].low_watermark", &format!("{at}.lowWatermark"));
        let tls = recommender.tls_config.clone().unwrap_or_default();
        for (key, wpa, path) in [
            ("ca_file", "tlsConfig.caFile", &tls.ca_file),
            ("client_cert_file", "tlsConfig.certFile", &tls.cert_file),
            ("client_key_file", "tlsConfig.keyFile", &tls.key_file),
        ] {
            let Some(path) = path.as_ref().filter(|p| !p.is_empty()) else {
                put(self, key, wpa, None);
                continue;
            };
            match policy.tls_file(path) {
                Ok(resolved) => put(self, key, wpa, Some(Value::String(resolved.display().to_string()))),
                Err(why) => {
                    // A stand-in keeps the reader from also calling the other half missing.
                    put(self, key, wpa, Some(Value::String(path.clone())));
                    self.problem(&format!("{at}.{wpa}"), why);
                }
            }
        }
        put(self, "insecure_skip_verify", "tlsConfig.insecureSkipVerify", tls.insecure_skip_verify.map(Value::Bool));
        if let Some(server_name) = tls.server_name.as_ref().filter(|n| !n.is_empty()) {
            let field = format!("{at}.tlsConfig.serverName");
            match server_name_use(server_name, &recommender.url) {
                ServerNameUse::Verify => put(self, "server_name", "tlsConfig.serverName", text(&tls.server_name)),
                ServerNameUse::UrlHost => {}
                ServerNameUse::NoTls => notes.push(format!(
                    "{field} ({server_name}) has no effect: the url is http://, without TLS, as in the Datadog controller"
                )),
                ServerNameUse::OtherAddress => self.unsupported(
                    &field,
                    format!(
                        "({server_name}) is an IP address other than the url's host: watermarkd verifies the \
                         certificate against another name only when it is a DNS name; put this address in the url"
                    ),
                ),
            }
        }
        for (field, version) in [("minVersion", &tls.min_version), ("maxVersion", &tls.max_version)] {
            if let Some(version) = version.as_ref().filter(|v| !v.is_empty()) {
                notes.push(format!(
                    "{at}.tlsConfig.{field} ({version}) has no effect: watermarkd always negotiates TLS 1.2 or 1.3"
                ));
            }
        }
        document.insert("recommender".into(), Value::Object(table));
        notes
    }

    /// One metric as a rules-file metric table, or `None` when it is broken beyond that (its
    /// problem reported).
    #[expect(clippy::too_many_arguments, reason = "one metric and the mapping's context, from its one caller")]
    fn metric(
        &mut self,
        index: usize,
        metric: &MetricSpec,
        name: &str,
        query_override: Option<&QueryOverride>,
        options: &MappingOptions,
        datadog_metrics: &dyn DatadogMetricQueries,
        context: &ResourceContext,
    ) -> Option<Map<String, Value>> {
        let at = format!("spec.metrics[{index}]");
        let engine = format!("metric[{index}]");
        self.path(&engine, &at);
        let mut entry = Map::new();
        entry.insert("name".into(), Value::String(name.to_string()));
        let (source, high, low) = match metric.type_.as_str() {
            "External" => {
                let Some(external) = &metric.external else {
                    self.problem(&format!("{at}.external"), "is required when type is External");
                    return None;
                };
                self.path(&format!("{engine}.name"), &format!("{at}.external.metricName"));
                match query_override {
                    Some(query_override) => self.overridden_query(&mut entry, &engine, query_override, options),
                    None => self.built_query(&mut entry, &engine, &at, external, options, datadog_metrics),
                }
                ("external", &external.high_watermark, &external.low_watermark)
            }
            "Resource" => {
                let Some(resource) = &metric.resource else {
                    self.problem(&format!("{at}.resource"), "is required when type is Resource");
                    return None;
                };
                self.resource(&mut entry, &engine, &at, resource, context);
                ("resource", &resource.high_watermark, &resource.low_watermark)
            }
            other => {
                self.problem(&format!("{at}.type"), format!("({other:?}) must be \"External\" or \"Resource\""));
                return None;
            }
        };
        for (key, wpa_key, value) in [("high_watermark", "highWatermark", high), ("low_watermark", "lowWatermark", low)]
        {
            self.path(&format!("{engine}.{key}"), &format!("{at}.{source}.{wpa_key}"));
            if let Some(value) = value {
                entry.insert(key.into(), value.to_json());
            }
        }
        Some(entry)
    }

    /// A Resource metric as a rules-file resource metric: the resource by name (the reader
    /// refuses other than cpu and memory), the selector as text, the WPA's readiness delay, and
    /// the pod aggregation of the annotation.
    fn resource(
        &mut self,
        entry: &mut Map<String, Value>,
        engine: &str,
        at: &str,
        resource: &ResourceMetricSource,
        context: &ResourceContext,
    ) {
        self.path(&format!("{engine}.name"), &format!("{at}.resource.name"));
        self.path(&format!("{engine}.resource"), &format!("{at}.resource.name"));
        entry.insert("resource".into(), Value::String(resource.name.clone()));
        self.path(&format!("{engine}.selector"), &format!("{at}.resource.metricSelector"));
        // A selector that could not be made is reported here; a stand-in keeps the reader from
        // also calling it missing.
        let stand_in = Value::String("unresolved".into());
        match &resource.metric_selector {
            // The Datadog controller would list the PodMetrics of the whole namespace and sum
            // them: never what was meant.
            None => {
                entry.insert("selector".into(), stand_in);
                self.problem(
                    &format!("{at}.resource.metricSelector"),
                    "is required: give the matchLabels of the target's pods (without one, every pod of the \
                     namespace would be summed)",
                );
            }
            Some(selector) => {
                let labels = selector.match_labels.clone().unwrap_or_default();
                let expressions: Vec<Expression> = selector
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|e| Expression {
                        key: e.key.clone(),
                        operator: e.operator.clone(),
                        values: e.values.clone().unwrap_or_default(),
                    })
                    .collect();
                match selector_text(&labels, &expressions) {
                    Ok(text) => {
                        entry.insert("selector".into(), Value::String(text));
                    }
                    Err(why) => {
                        entry.insert("selector".into(), stand_in);
                        self.problem(&format!("{at}.resource.metricSelector"), why);
                    }
                }
            }
        }
        if let Some(delay) = context.readiness_delay_seconds {
            self.path(&format!("{engine}.readiness_delay"), "spec.readinessDelaySeconds");
            entry.insert("readiness_delay".into(), Value::from(delay));
        }
        if let Some(aggregation) = &context.pod_aggregation {
            self.path(&format!("{engine}.pod_aggregation"), &annotation_key_path(POD_AGGREGATION_ANNOTATION));
            entry.insert("pod_aggregation".into(), Value::String(aggregation.clone()));
        }
    }

    /// The query (and backend, reducer, maxAge) the annotation gives.
    fn overridden_query(
        &mut self,
        entry: &mut Map<String, Value>,
        engine: &str,
        query_override: &QueryOverride,
        options: &MappingOptions,
    ) {
        let annotation = |key: &str| annotation_path(&format!("[{}].{key}", query_override.entry));
        for (key, value) in &query_override.fields {
            entry.insert(key.clone(), value.clone());
            let origin = query_override.origin.get(key).map(String::as_str).unwrap_or(key);
            self.path(&format!("{engine}.{key}"), &annotation(origin));
        }
        if !query_override.fields.contains_key("backend") {
            entry.insert("backend".into(), Value::String(options.default_backend.clone()));
            self.path(&format!("{engine}.backend"), annotation("").trim_end_matches('.'));
        }
        if !query_override.fields.contains_key("query") {
            // The reader reports it missing under this name.
            self.path(&format!("{engine}.query"), &annotation("query"));
        }
    }

    /// The query the Cluster Agent would use: built from the metric name and labels, or a
    /// `DatadogMetric`'s.
    fn built_query(
        &mut self,
        entry: &mut Map<String, Value>,
        engine: &str,
        at: &str,
        external: &ExternalMetricSource,
        options: &MappingOptions,
        datadog_metrics: &dyn DatadogMetricQueries,
    ) {
        self.path(&format!("{engine}.query"), &format!("{at}.external.metricName"));
        self.path(&format!("{engine}.backend"), at);
        // A default backend that does not exist is reported by the rules reader, as for any
        // metric; one of another type would take the Datadog query without complaint.
        if let (Some(problem), Some(_)) = (options.default_backend_problem(), options.default_backend_type()) {
            self.problem(
                &format!("{at}.external.metricName"),
                format!(
                    "has no query in the {QUERIES_ANNOTATION} annotation, and {problem}: give this metric a query \
                     there, or set default_backend to a datadog backend"
                ),
            );
        }
        entry.insert("backend".into(), Value::String(options.default_backend.clone()));
        let name = &external.metric_name;
        let query = match metric_reference(name) {
            MetricReference::DatadogMetric { namespace, name: object } => {
                let query = datadog_metrics.datadog_metric_query(&namespace, &object);
                if query.is_none() {
                    self.problem(
                        &format!("{at}.external.metricName"),
                        format!(
                            "({name:?}) refers to the DatadogMetric {namespace}/{object}, which does not exist or has \
                             no spec.query"
                        ),
                    );
                }
                query
            }
            MetricReference::MalformedDatadogMetric => {
                self.problem(
                    &format!("{at}.external.metricName"),
                    format!(
                        "({name:?}) must be datadogmetric@<namespace>:<name>, each a lowercase Kubernetes name, to \
                         refer to a DatadogMetric"
                    ),
                );
                None
            }
            MetricReference::Metric => self.selector_query(at, external, options),
        };
        // A query that could not be made is reported above; a stand-in keeps the reader from
        // also calling it missing.
        entry.insert("query".into(), Value::String(query.unwrap_or_else(|| "unresolved".into())));
    }

    fn selector_query(
        &mut self,
        at: &str,
        external: &ExternalMetricSource,
        options: &MappingOptions,
    ) -> Option<String> {
        let Some(selector) = &external.metric_selector else {
            // The Datadog controller rejects this too ("Missing Labels"): querying a metric over
            // every tag is rarely meant, so it must be asked for with `metricSelector: {}`.
            self.problem(
                &format!("{at}.external.metricSelector"),
                "is required (as the Datadog controller requires it): give matchLabels, or {} to query the metric \
                 over every tag ({*})",
            );
            return None;
        };
        if selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
            self.problem(
                &format!("{at}.external.metricSelector.matchExpressions"),
                "is not supported: the Cluster Agent builds a Datadog query from matchLabels only (tag:value \
                 filters); use matchLabels, or give the query in the watermarkd.io/queries annotation",
            );
            return None;
        }
        let labels = selector.match_labels.clone().unwrap_or_default();
        Some(datadog_query(&external.metric_name, &labels, &options.aggregator, options.rollup_seconds))
    }
}

/// The rule's name for each metric: its `metricName` (the Datadog controller's `metric_name`
/// label), with the tag scope added when several External metrics share one, so that names stay
/// unique. Resource metrics are named by their resource.
fn metric_names(metrics: &[MetricSpec]) -> Vec<String> {
    let external_name = |m: &MetricSpec| m.external.as_ref().map(|e| e.metric_name.clone());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for name in metrics.iter().filter(|m| m.type_ == "External").filter_map(external_name) {
        *counts.entry(name).or_default() += 1;
    }
    metrics
        .iter()
        .map(|m| match (m.type_.as_str(), &m.external, &m.resource) {
            ("External", Some(e), _) if counts.get(&e.metric_name).is_some_and(|&n| n > 1) => {
                let labels = e.metric_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
                format!("{}{{{}}}", e.metric_name, tag_scope(&labels))
            }
            ("External", Some(e), _) => e.metric_name.clone(),
            ("Resource", _, Some(r)) => r.name.clone(),
            _ => String::new(),
        })
        .collect()
}

/// The WPA path of an engine path; anything under `metric[i]` that has no path of its own is
/// named by the metric (`spec.metrics[i]`).
fn rename_path(paths: &BTreeMap<String, String>, path: &str) -> Option<String> {
    if let Some(known) = paths.get(path) {
        return Some(known.clone());
    }
    let rest = path.strip_prefix("metric[")?;
    let (index, _) = rest.split_once(']')?;
    Some(format!("spec.metrics[{index}]"))
}

/// Whether `field` is `prefix` or a field inside it (`spec.metrics[1].x`, not `spec.metrics[10]`).
fn is_within(field: &str, prefix: &str) -> bool {
    field.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// A rules-reader problem with the other fields its message names spelled as in the WPA.
fn wpa_vocabulary(mut problem: Problem) -> Problem {
    for (rules, wpa) in MESSAGE_WORDS {
        problem.message = problem.message.replace(rules, wpa);
    }
    problem
}

#[cfg(test)]
mod tests;
