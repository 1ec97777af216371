//! The TOML rules file: backends and autoscalers, each compiled into an engine `Rule`.
//!
//! Reading happens in steps. The text becomes a small document tree whose nodes know their
//! line (`tree`). Typed reads over that tree (`reader`) turn each `[[autoscaler]]` into a
//! draft (`document` -> `draft`), reporting what the document's shape gets wrong; `compile`
//! then checks the draft (what is required, what cannot go together, the engine's own
//! `Rule::new`) and names each problem where its field was written. A WPA (`crate::crd`) and a
//! JSON rule for `decide` become the same draft and go through the same `compile`, so the
//! sources cannot drift apart. Every problem is collected, so one `watermarkd check` lists all
//! of them.

mod backend;
mod check;
mod compile;
mod document;
pub(crate) mod draft;
mod problem;
pub mod quantity;
pub(crate) mod reader;
pub mod selector;
pub(crate) mod tree;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use watermarkd_engine::Rule;

pub use check::{run_check, warnings};
pub(crate) use compile::{compile, Require};
pub(crate) use document::{parse_reducer, ALGORITHMS, POD_AGGREGATIONS, REDUCERS, RESOURCES};
use document::{read_autoscaler, Source};
pub(crate) use problem::{Problem, RulesError, Sink, TableScope};
pub(crate) use quantity::parse_quantity;
use reader::Table;

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

/// Where metrics are queried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Datadog(DatadogBackend),
    Prometheus(PrometheusBackend),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatadogBackend {
    /// The Datadog site, e.g. `datadoghq.eu` (default `datadoghq.com`).
    pub site: String,
    /// A full URL that replaces the one derived from `site` (for proxies and tests).
    pub url: Option<String>,
    pub api_key: SecretSource,
    pub app_key: SecretSource,
    /// How far back each query looks (default 300s, as the Cluster Agent).
    pub window: Duration,
    /// Points older than this are stale. `None`: `max(120s, 3 x the series' rollup)`.
    pub max_age: Option<Duration>,
    /// Per request (default 10s).
    pub timeout: Duration,
    /// Requests in flight at once (default 4).
    pub max_in_flight: u32,
    /// How long a query Datadog rejected (HTTP 400) is not asked again (default 10 minutes).
    pub bad_query_retry: Duration,
    /// Lets `url` be plain `http://` to a host other than loopback (default false: the keys
    /// would cross the network unencrypted).
    pub allow_insecure_http: bool,
    /// The largest share of the rate budget, in percent, that the queries of one namespace's
    /// WPAs may use (default 100: no bound).
    pub namespace_budget_percent: u32,
    /// Whether queries that differ only in one or two tag values are asked as one grouped
    /// query (default true; `backend::datadog` folding).
    pub fold_queries: bool,
}

/// Where a secret is read from when the daemon starts; never the secret itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// The name of an environment variable.
    Env(String),
    /// A file holding the secret (surrounding whitespace is not part of it).
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusBackend {
    /// The server's base URL with any path prefix, e.g. `http://prometheus.monitoring:9090` or
    /// `https://mimir.example/prometheus`; `/api/v1/query` is appended.
    pub url: String,
    /// Per request (default 10s).
    pub timeout: Duration,
    /// Requests in flight at once (default 8).
    pub max_in_flight: u32,
    /// A value whose data is older is stale (no default: not checked). Only a query whose data
    /// time can be asked for has one; others are dated at the evaluation time.
    pub max_age: Option<Duration>,
    /// Sent as `X-Scope-OrgID` (Mimir, Cortex).
    pub tenant: Option<String>,
    /// Extra request headers (not for secrets: use `basic_auth` or `bearer_token_*`).
    pub headers: BTreeMap<String, String>,
    /// Extra query parameters, e.g. `dedup = "true"` for Thanos.
    pub params: BTreeMap<String, String>,
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization: Bearer`; a file is re-read when it changes (rotated service-account tokens).
    pub bearer_token: Option<SecretSource>,
    pub tls: TlsSettings,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicAuth {
    pub username: String,
    pub password: SecretSource,
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
}

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

const TOP_LEVEL_KEYS: &[&str] = &["backend", "autoscaler"];

/// Parses and validates a rules file. `origin` names it in problems (usually its path).
pub fn parse_rules(text: &str, origin: &str) -> Result<RulesFile, RulesError> {
    let fail = |problems| RulesError { origin: origin.to_string(), problems };
    let root = tree::from_toml(text).map_err(|err| {
        fail(vec![Problem {
            line: err.line,
            autoscaler: None,
            field: String::new(),
            message: format!("invalid TOML: {}", err.message),
        }])
    })?;
    let mut sink = Sink::default();
    let Some(mut table) = Table::new(&root, TableScope::default(), &mut sink) else {
        return Err(fail(sink.into_sorted()));
    };
    let declared = backend::read_backends(&mut table, &mut sink);
    let autoscalers = read_autoscalers(&mut table, &declared, &mut sink);
    table.finish(&mut sink, TOP_LEVEL_KEYS);
    if sink.has_problems() {
        return Err(fail(sink.into_sorted()));
    }
    let backends = declared.into_iter().filter_map(|(name, backend)| Some((name, backend?))).collect();
    let scaled = autoscalers.iter().filter(|a| !a.shadow).map(|a| (a.target.clone(), Arc::clone(&a.name))).collect();
    Ok(RulesFile { backends, autoscalers, scaled })
}

fn read_autoscalers(
    root: &mut Table<'_>,
    backends: &BTreeMap<String, Option<Backend>>,
    sink: &mut Sink,
) -> Vec<Autoscaler> {
    let Some(nodes) = root.list(sink, "autoscaler", "[[autoscaler]] sections") else { return Vec::new() };
    let mut first_line_of: HashMap<String, Option<usize>> = HashMap::new();
    let mut autoscalers = Vec::new();
    let mut shadow_lines = Vec::new();
    // Every entry's target, also of entries with other problems, so that one `check` lists
    // every conflict too.
    let mut claims = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        // Within one autoscaler, its problems are kept apart to know whether it has any.
        let mut own = Sink::default();
        let Some(draft) = read_autoscaler(node, Source::File { index }, &mut own) else {
            sink.problems.append(&mut own.problems);
            continue;
        };
        let compiled = compile(&draft, Require::Everything { backends: Some(backends) }, &mut own);
        sink.problems.append(&mut own.problems);
        let Some(name) = compiled.name.clone() else { continue };
        let name_line = draft.name.origin.line;
        if let Some(first) = first_line_of.get(&name) {
            let on_line = first.map(|l| format!(" on line {l}")).unwrap_or_default();
            sink.problems.push(Problem {
                line: name_line,
                autoscaler: Some(name),
                field: "name".into(),
                message: format!("is already used by the autoscaler{on_line}; autoscaler names must be unique"),
            });
            continue;
        }
        first_line_of.insert(name.clone(), name_line);
        let shadow = draft.shadow.value().copied().unwrap_or(false);
        if let Some(target) = compiled.target.as_ref().filter(|_| !shadow) {
            claims.push(Claim { name: name.clone(), target: target.clone(), line: draft.target.origin.line });
        }
        if let Some(autoscaler) = compiled.into_autoscaler(&draft) {
            autoscalers.push(autoscaler);
            shadow_lines.push(draft.shadow.origin.line);
        }
    }
    check_target_conflicts(&claims, sink);
    check_shadow_pairs(&autoscalers, &shadow_lines, sink);
    autoscalers
}

/// Two active autoscalers on one object would fight over its replicas, and, since each keeps
/// its state on the target, overwrite each other's, so that after a restart neither has its
/// forbidden windows: the second is refused, naming the first. Shadow rules never write and may
/// share a target.
fn check_target_conflicts(claims: &[Claim], sink: &mut Sink) {
    let mut first_on: HashMap<ObjectIdentity<'_>, &Claim> = HashMap::new();
    for claim in claims {
        let Some(first) = first_on.get(&claim.target.identity()) else {
            first_on.insert(claim.target.identity(), claim);
            continue;
        };
        let target = &claim.target;
        let on_line = first.line.map(|l| format!(" on line {l}")).unwrap_or_default();
        sink.problems.push(Problem {
            line: claim.line,
            autoscaler: Some(claim.name.clone()),
            field: "target".into(),
            message: format!(
                "names the same {} {}/{} as the autoscaler {:?}{on_line}: two active autoscalers on one target fight \
                 over its replicas and overwrite each other's saved state (remove one, or make one a shadow rule \
                 with shadow = true)",
                target.kind, target.namespace, target.name, first.name
            ),
        });
    }
}

/// An active autoscaler's target, where the file names it.
struct Claim {
    name: String,
    target: TargetRef,
    line: Option<usize>,
}

/// Every shadow rule needs exactly one active autoscaler on its target, the one it is compared
/// with.
fn check_shadow_pairs(autoscalers: &[Autoscaler], shadow_lines: &[Option<usize>], sink: &mut Sink) {
    let mut active_on: HashMap<&TargetRef, Vec<&Autoscaler>> = HashMap::new();
    for active in autoscalers.iter().filter(|a| !a.shadow) {
        active_on.entry(&active.target).or_default().push(active);
    }
    for (shadow, line) in autoscalers.iter().zip(shadow_lines).filter(|(a, _)| a.shadow) {
        let target = &shadow.target;
        let message = match active_on.get(target).map_or(&[][..], Vec::as_slice) {
            // It is decided with the active rule, so at its pace: another interval would be
            // silently ignored.
            [active] if shadow.interval_set.is_some_and(|i| Some(i) != active.interval_set) => {
                sink.problems.push(Problem {
                    line: *line,
                    autoscaler: Some(shadow.name.to_string()),
                    field: "interval".into(),
                    message: format!(
                        "cannot differ from the active autoscaler {:?}'s: a shadow rule is decided at each of its \
                         evaluations (remove interval, or give both the same)",
                        active.name
                    ),
                });
                continue;
            }
            [_] => continue,
            [] => format!(
                "is true, but no active autoscaler in this file targets {} {}/{}: a shadow rule runs beside the \
                 active rule on its target and is compared with it",
                target.kind, target.namespace, target.name
            ),
            several => format!(
                "is true, and several active autoscalers target {} {}/{} ({}): a shadow rule is compared with the \
                 one active rule on its target",
                target.kind,
                target.namespace,
                target.name,
                several.iter().map(|a| &*a.name).collect::<Vec<_>>().join(", ")
            ),
        };
        sink.problems.push(Problem {
            line: *line,
            autoscaler: Some(shadow.name.to_string()),
            field: "shadow".into(),
            message,
        });
    }
}

/// Reads and parses a rules file; a file that cannot be read is a `RulesError` too.
pub fn load_rules(path: &Path) -> Result<RulesFile, RulesError> {
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => parse_rules(&text, &origin),
        Err(err) => Err(RulesError {
            origin,
            problems: vec![Problem {
                line: None,
                autoscaler: None,
                field: String::new(),
                message: format!("cannot read the rules file: {err}"),
            }],
        }),
    }
}

/// For the `decide` command: one autoscaler entry given as JSON (same field names as a
/// `[[autoscaler]]` TOML entry) -> engine Rule. Here `name`, `target`, `interval`, and each
/// metric's `backend`/`query` are optional (checked when given); each metric needs a `name` or
/// a `query`, which names its reading.
pub fn rule_from_json(value: &serde_json::Value) -> Result<Rule, Vec<Problem>> {
    let node = tree::from_json(value);
    let mut sink = Sink::default();
    let compiled =
        read_autoscaler(&node, Source::Json, &mut sink).map(|draft| compile(&draft, Require::Rule, &mut sink));
    match compiled.and_then(|compiled| compiled.rule) {
        Some(rule) if !sink.has_problems() => Ok(rule),
        _ if sink.has_problems() => Err(sink.into_sorted()),
        // Not reachable (no rule means a problem was reported), but never return Err(empty).
        _ => Err(vec![Problem {
            line: None,
            autoscaler: None,
            field: String::new(),
            message: "the rule is invalid".into(),
        }]),
    }
}

#[cfg(test)]
mod tests;
