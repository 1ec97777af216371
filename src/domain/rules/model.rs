//! What the rules compile to: backends, autoscalers, their targets and metric sources. Plain
//! data the runtime reads; how it is read and checked is elsewhere in this module.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use watermarkd_engine::Rule;

use super::backend::Backend;
use crate::domain::fallback::FallbackRule;
use crate::domain::forecast::ForecastRule;
use crate::domain::schedule::Schedule;
use crate::domain::sparse::Sparse;

/// A parsed and validated rules file.
#[derive(Clone, Debug)]
pub struct RulesFile {
    /// Backends by name (`[backend.NAME]`).
    pub backends: BTreeMap<String, Backend>,
    /// Autoscalers in file order; their names are unique.
    pub autoscalers: Vec<Autoscaler>,
    /// The target of every active (not shadow) autoscaler, with the autoscaler's name; no two
    /// name the same object. Kept when the autoscalers are moved out to run
    /// (`runtime::rules_file::split`): in CRD mode no WPA runs on an object the file scales.
    pub scaled: Vec<(TargetRef, Arc<str>)>,
}

impl Autoscaler {
    /// How often it is evaluated: its own interval, or `default` (the daemon's
    /// `default_interval`, 15s unless set).
    pub fn interval(&self, default: Duration) -> Duration {
        self.interval_set.unwrap_or(default)
    }
}

/// The interval of an autoscaler that sets none, unless the daemon settings say otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

impl RulesFile {
    pub fn autoscaler(&self, name: &str) -> Option<&Autoscaler> {
        self.autoscalers.iter().find(|a| &*a.name == name)
    }
}

/// Where a secret is read from when the daemon starts; never the secret itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// The name of an environment variable.
    Env(String),
    /// A file holding the secret (surrounding whitespace is not part of it).
    File(PathBuf),
}

/// TLS options of an `https://` backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file with the CA certificates to trust, added to the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// Accept any server certificate. Only with an explicit opt-in.
    pub insecure_skip_verify: bool,
}

/// One autoscaler: what it scales, how often, by which rule, from which queries.
#[derive(Clone, Debug, PartialEq)]
pub struct Autoscaler {
    pub name: Arc<str>,
    pub target: TargetRef,
    /// How often it is evaluated (at least 1s), when the rule says; see [`Autoscaler::interval`].
    pub interval_set: Option<Duration>,
    pub rule: Rule,
    /// Metric `i` here is metric `i` of `rule.metrics()`. Empty with a recommender.
    pub metrics: Vec<MetricSource>,
    /// The replica source that replaces the metrics (`[autoscaler.recommender]`, a WPA's
    /// `spec.recommender`); the rule then has one metric, named after it, carrying its watermarks.
    pub recommender: Option<Box<Recommender>>,
    /// A shadow rule (`shadow = true`): evaluated live beside the active autoscaler on the same
    /// target, on the same kind of readings, and never written; it only reports what it would do.
    pub shadow: bool,
    /// Evaluates and reports every interval and never writes (`observe = true`, a WPA's
    /// `watermarkd.io/observe`): a pause without an end, for watching beside the controller
    /// that scales the target now. The guard never holds it (it writes nothing to guard).
    pub observe: bool,
    /// Writes even though another controller claims the target (`take_over = true`, a WPA's
    /// `watermarkd.io/take-over`): the cut-over, from the target's current replicas.
    pub take_over: bool,
    /// Windows of time that raise the floor (`[[autoscaler.schedule]]`); usually none.
    pub schedules: Sparse<Schedule>,
    /// Until this instant it decides and reports as always, and writes nothing
    /// (`paused_until`, a WPA's `watermarkd.io/paused-until`); then it resumes by itself.
    pub paused_until: Option<watermarkd_engine::Timestamp>,
    /// What it does once no metric has had a usable value for a while (`[autoscaler.fallback]`,
    /// a WPA's `watermarkd.io/fallback`); without one it holds.
    pub fallback: Option<Box<FallbackRule>>,
    /// A forecast of its own metric that raises the floor ahead of demand
    /// (`[autoscaler.forecast]`).
    pub forecast: Option<Box<ForecastRule>>,
}

impl Autoscaler {
    /// Whether it is paused at `now`: before `paused_until`, or always while it observes.
    pub fn paused_at(&self, now: watermarkd_engine::Timestamp) -> bool {
        self.observe || self.paused_until.is_some_and(|until| now < until)
    }

    /// Whether it can be paused at all (`paused_until` or `observe`), so that its series and
    /// status say whether it is.
    pub fn pausable(&self) -> bool {
        self.observe || self.paused_until.is_some()
    }

    /// `paused until 2026-12-01T18:00:00Z`, or `observing only (observe = true)`, when it is
    /// paused at `now`.
    pub fn pause_note(&self, now: watermarkd_engine::Timestamp) -> Option<String> {
        if self.observe {
            return Some(OBSERVING.to_string());
        }
        let until = self.paused_until.filter(|_| self.paused_at(now))?;
        let shown = jiff::Timestamp::from_millisecond(until.unix_millis())
            .map_or_else(|_| format!("{} ms after the epoch", until.unix_millis()), |t| t.to_string());
        Some(format!("paused until {shown}"))
    }
}

/// What an observing autoscaler's decisions say instead of a write.
pub const OBSERVING: &str = "observing only (observe = true)";

/// An HTTP service that recommends a replica count, asked with the request and read with the
/// reply of the Datadog WPA controller's recommender client.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommender {
    /// Where the request is POSTed (`http://` or `https://`).
    pub url: String,
    /// `targets[0].type` of the request (e.g. `cpu`); may be empty.
    pub target_type: String,
    /// Sent as `settings`, every value a string.
    pub settings: BTreeMap<String, String>,
    /// `targets[0].lowerBound` / `upperBound`: the watermarks, 0 when not given (as there).
    pub lower_bound: f64,
    pub upper_bound: f64,
    /// Per request (default 10s, the Datadog controller's fixed timeout).
    pub timeout: Duration,
    /// `targetRef.cluster`; `None`: the daemon's `K8S_CLUSTER_NAME`, else empty.
    pub cluster_name: Option<String>,
    pub tls: TlsSettings,
    /// The name the server's certificate is verified against (and sent as SNI) instead of the
    /// url's host: a DNS name, for `https://` urls only (a WPA's `tlsConfig.serverName`).
    pub server_name: Option<String>,
    /// The directory every TLS file must resolve inside (after following symlinks), when the
    /// files were named by someone other than the operator: a WPA's files must lie in the
    /// daemon's `recommender_tls_dir`. `None` for a rules file, the operator's own.
    pub tls_dir: Option<PathBuf>,
}

impl Recommender {
    /// The URL as it may be shown in logs, events, series labels and errors: without the
    /// credentials (`user:password@`) or the query string a URL may carry, which could be secrets.
    pub fn display_url(&self) -> String {
        Self::redact(&self.url)
    }

    pub(crate) fn redact(url: &str) -> String {
        match reqwest::Url::parse(url) {
            Ok(mut parsed) => {
                // Both only fail for URLs that cannot have credentials, which then have none.
                let _ = parsed.set_username("");
                let _ = parsed.set_password(None);
                parsed.set_query(None);
                parsed.set_fragment(None);
                parsed.to_string()
            }
            // Not a URL at all: show where it points, never what follows.
            Err(_) => match url.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://(unparsable URL)"),
                None => "(unparsable URL)".into(),
            },
        }
    }

    /// The metric name the Datadog controller gives a recommender:
    /// `recommender{targetType:cpu,key:value,...}`, settings sorted by key.
    pub fn metric_name(&self) -> String {
        let mut args = format!("targetType:{}", self.target_type);
        for (key, value) in &self.settings {
            args.push_str(&format!(",{key}:{value}"));
        }
        format!("recommender{{{args}}}")
    }
}

/// A resource with a `/scale` subresource.
///
/// Shared text: the series labels of the autoscaler reuse these, and the API version, kind and
/// namespace are interned (see [`intern`]), since thousands of targets repeat a handful of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TargetRef {
    /// Default `apps/v1`.
    pub api_version: Arc<str>,
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// What identifies the object a [`TargetRef`] names: API group (not version), kind, namespace
/// and name. `apps/v1` and `apps/v1beta2` reach the same Deployment.
pub type ObjectIdentity<'a> = (&'a str, &'a str, &'a str, &'a str);

impl TargetRef {
    /// The API group of `api_version` (`apps` of `apps/v1`; empty for the core `v1`).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    /// The object named, whatever the version it is reached through: two autoscalers whose
    /// targets have the same identity scale the same object.
    pub fn identity(&self) -> ObjectIdentity<'_> {
        (self.group(), &self.kind, &self.namespace, &self.name)
    }
}

/// The one shared copy of `text` among the texts interned and still in use.
///
/// Entries no rule holds any more are dropped whenever the set has doubled since the last
/// sweep, so namespaces that come and go cost amortised constant time and no lasting memory.
pub fn intern(text: &str) -> Arc<str> {
    static INTERNED: Mutex<Interned> = Mutex::new(Interned { texts: None, swept_at: 0 });
    let Ok(mut interned) = INTERNED.lock() else {
        // A panic elsewhere while holding the lock: sharing is an optimisation, not a need.
        return Arc::from(text);
    };
    let Interned { texts, swept_at } = &mut *interned;
    let texts = texts.get_or_insert_with(HashSet::new);
    if let Some(shared) = texts.get(text) {
        return Arc::clone(shared);
    }
    if texts.len() >= 2 * (*swept_at).max(64) {
        texts.retain(|t| Arc::strong_count(t) > 1);
        *swept_at = texts.len();
    }
    let shared: Arc<str> = Arc::from(text);
    texts.insert(Arc::clone(&shared));
    shared
}

struct Interned {
    texts: Option<HashSet<Arc<str>>>,
    swept_at: usize,
}

/// Where one metric's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricSource {
    /// The metric's name in the rule (its query when no name was given).
    pub name: String,
    /// The name of a `[backend.NAME]`.
    pub backend: String,
    pub query: String,
    /// How a Prometheus query that returns several series becomes one value.
    pub reducer: Option<Reducer>,
    /// A resource metric (cpu or memory of the selected pods, from the Kubernetes metrics
    /// API) instead of a query; `backend` is then [`RESOURCE_BACKEND`] and `query` describes it.
    pub resource: Option<ResourceSource>,
}

/// What `backend` says of a resource metric: it is read from the API server's `metrics.k8s.io`,
/// not from a `[backend.NAME]`.
pub const RESOURCE_BACKEND: &str = "metrics.k8s.io";

/// The default `max_age` of a resource metric: a pod sample older than this is no sample.
/// metrics-server samples every 15 s by default (60 s in old versions), so two minutes allow for
/// one missed scrape of the slowest setting.
pub const RESOURCE_MAX_AGE: Duration = Duration::from_secs(120);

/// A resource metric: usage of one resource by the pods a selector selects, in the target's
/// namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceSource {
    pub resource: ResourceName,
    /// A label selector in the API server's text form, checked (`app=web,tier in (a,b)`).
    pub selector: String,
    pub aggregation: PodAggregation,
    /// cpu: a pod counts once it has been Ready this long (the WPA's `readinessDelaySeconds`).
    pub readiness_delay: Duration,
    /// Per pod sample: older is no sample (the metric's `max_age`, else [`RESOURCE_MAX_AGE`]).
    pub max_age: Duration,
}

/// A resource the Kubernetes metrics API reports per container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceName {
    /// In cores (`"500m"` = half a core), as the WPA's watermarks are written.
    Cpu,
    /// In bytes.
    Memory,
}

impl ResourceName {
    pub fn parse(text: &str) -> Option<ResourceName> {
        match text {
            "cpu" => Some(ResourceName::Cpu),
            "memory" => Some(ResourceName::Memory),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ResourceName::Cpu => "cpu",
            ResourceName::Memory => "memory",
        }
    }
}

impl std::fmt::Display for ResourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the pods' usages become the metric's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PodAggregation {
    /// The sum over the pods: what the Datadog controller compares with the watermarks, so a
    /// WPA runs unchanged (with `algorithm = "average"` the engine then divides it by the ready
    /// replicas, which makes it the per-pod average).
    #[default]
    Sum,
    /// The average per pod (the HPA's `AverageValue`), for `algorithm = "absolute"`.
    Average,
}

impl PodAggregation {
    pub fn parse(text: &str) -> Option<PodAggregation> {
        match text {
            "sum" => Some(PodAggregation::Sum),
            "average" => Some(PodAggregation::Average),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reducer {
    Max,
    Min,
    Sum,
    Avg,
}
