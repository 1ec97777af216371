//! One `[[autoscaler]]` entry, from the rules file or from JSON: read every field, build the
//! engine's `RuleSpec`, and let `Rule::new` check the invariants. Engine problems are mapped
//! back to the field names and lines of the document.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use watermarkd_engine::{
    Algorithm, BehaviorSpec, ConvergeTowards, MetricSpec, Policy, PolicyKind, Rule, RuleError, RuleSpec,
    ScalingRulesSpec, SelectPolicy,
};

use super::backend::{checked_url, positive_duration_at_most, read_tls, string_map, DEFAULT_TIMEOUT, MAX_TIMEOUT};
use super::problem::{Sink, TableScope};
use super::reader::Table;
use super::selector::{parse_selector, selector_text};
use super::tree::{Kind, Node};
use super::{
    intern, Backend, MetricSource, PodAggregation, Recommender, Reducer, ResourceName, ResourceSource, TargetRef,
    RESOURCE_BACKEND, RESOURCE_MAX_AGE,
};

pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The HPA's bounds (and the engine's), checked here too so that the problem names them
/// whatever the value.
const MAX_STABILIZATION_WINDOW: Duration = Duration::from_secs(3600);
const MAX_POLICY_PERIOD: Duration = Duration::from_secs(1800);
const DEFAULT_API_VERSION: &str = "apps/v1";

const AUTOSCALER_KEYS: &[&str] = &[
    "name",
    "target",
    "interval",
    "min_replicas",
    "max_replicas",
    "algorithm",
    "tolerance",
    "upscale_tolerance",
    "downscale_tolerance",
    "scale_up_limit_factor",
    "scale_down_limit_factor",
    "upscale_forbidden_window",
    "downscale_forbidden_window",
    "upscale_delay_above_watermark",
    "downscale_delay_below_watermark",
    "behavior",
    "replica_modulo",
    "converge_towards_watermark",
    "tolerate_zero",
    "min_available_replica_percentage",
    "dry_run",
    "scale_to_zero_delay",
    "shadow",
    "metric",
    "recommender",
];
const TARGET_KEYS: &[&str] = &["api_version", "kind", "namespace", "name"];
const METRIC_KEYS: &[&str] = &[
    "name",
    "backend",
    "query",
    "resource",
    "selector",
    "pod_aggregation",
    "readiness_delay",
    "high_watermark",
    "low_watermark",
    "max_age",
    "reducer",
    "activation",
];
/// The keys of a resource metric only.
const RESOURCE_KEYS: &[&str] = &["selector", "pod_aggregation", "readiness_delay"];
const RECOMMENDER_KEYS: &[&str] = &[
    "url",
    "target_type",
    "settings",
    "high_watermark",
    "low_watermark",
    "timeout",
    "cluster_name",
    "ca_file",
    "client_cert_file",
    "client_key_file",
    "insecure_skip_verify",
    "server_name",
];
const BEHAVIOR_KEYS: &[&str] = &["scale_up", "scale_down"];
const SCALING_RULES_KEYS: &[&str] = &["tolerance", "stabilization_window", "select_policy", "policies"];
const POLICY_KEYS: &[&str] = &["type", "value", "period"];

/// Where an autoscaler entry comes from, which decides what it must contain.
#[derive(Clone, Copy)]
pub(crate) enum Form<'b> {
    /// An `[[autoscaler]]` of a rules file: name, target, and each metric's backend and query
    /// are required, and backends must exist.
    /// A backend mapped to `None` was declared but has a problem of its own.
    File { index: usize, backends: &'b BTreeMap<String, Option<Backend>> },
    /// A rule given to `decide`: only what the engine needs is required.
    Json,
    /// A `WatermarkPodAutoscaler` translated to rules keys by `crate::crd`. Required like a rules
    /// file entry; backends are checked when known (the daemon's rules file declares them).
    /// `field` names an engine path (`metric[0].low_watermark`) the way the WPA spells it
    /// (`spec.metrics[0].external.lowWatermark`), so that problems point at the object.
    Crd { backends: Option<&'b BTreeMap<String, Option<Backend>>>, field: &'b dyn Fn(&str) -> Option<String> },
}

impl Form<'_> {
    /// Whether everything a running autoscaler needs (name, target, queries, backends) is required.
    fn is_complete(self) -> bool {
        !matches!(self, Form::Json)
    }

    fn backends(&self) -> Option<&BTreeMap<String, Option<Backend>>> {
        match self {
            Form::File { backends, .. } => Some(backends),
            Form::Crd { backends, .. } => *backends,
            Form::Json => None,
        }
    }
}

/// What one entry yielded. Fields are `None` where the entry had a problem there.
pub(crate) struct Parsed {
    pub name: Option<String>,
    pub target: Option<TargetRef>,
    pub interval: Option<Duration>,
    pub rule: Option<Rule>,
    pub metrics: Vec<MetricSource>,
    pub recommender: Option<Recommender>,
    /// `shadow = true`: evaluated beside the active rule on its target, never written.
    pub shadow: bool,
    /// The line of the entry's name (for duplicate-name problems).
    pub name_line: Option<usize>,
    /// The line of `shadow` (for problems with the shadow's pairing).
    pub shadow_line: Option<usize>,
    /// The line of `target` (for two autoscalers on one target).
    pub target_line: Option<usize>,
}

/// One metric as read, before we know whether the whole entry is valid.
struct MetricEntry {
    scope: TableScope,
    source: MetricSource,
    /// The engine's view of the same metric.
    spec: MetricSpec,
    /// The line of the key the name came from (`name`, or `query` when the name defaults to it).
    name_line: Option<usize>,
    /// The line of `pod_aggregation` when it asks for the average (checked against the algorithm).
    average_line: Option<Option<usize>>,
}

pub(crate) fn read_autoscaler(node: &Node, form: Form<'_>, sink: &mut Sink) -> Parsed {
    let name_line = node.entry("name").and_then(|e| e.line).or(node.line);
    let mut parsed = Parsed {
        name: None,
        target: None,
        interval: None,
        rule: None,
        metrics: Vec::new(),
        recommender: None,
        shadow: false,
        name_line,
        shadow_line: node.entry("shadow").and_then(|e| e.line),
        target_line: node.entry("target").and_then(|e| e.line).or(name_line),
    };
    if node.entries().is_none() {
        let message = match form {
            Form::File { .. } => format!("must be a table ([[autoscaler]]), not {}", node.kind.describe()),
            Form::Json | Form::Crd { .. } => format!("the rule must be a JSON object, not {}", node.kind.describe()),
        };
        sink.report_table(&unnamed_scope(form), node.line, message);
        return parsed;
    }
    // Within one autoscaler, engine paths are relative to it; a fresh sink keeps them apart.
    let mut own = Sink::default();
    let Some(mut table) = Table::new(node, unnamed_scope(form), &mut own) else { return parsed };
    let complete = form.is_complete();

    let name = table.text(&mut own, "name");
    parsed.name = if complete { table.require(&mut own, "name", name) } else { name };
    if let Some(name) = &parsed.name {
        // From here on every problem names the autoscaler instead of its position.
        table.scope = TableScope { autoscaler: Some(name.clone()), ..TableScope::default() };
    }

    let target = read_target(&mut table, &mut own);
    parsed.target = if complete { table.require(&mut own, "target", target) } else { target };
    parsed.interval = read_interval(&mut table, &mut own);
    parsed.shadow = table.flag(&mut own, "shadow").unwrap_or(false);

    let mut metrics = read_metrics(&mut table, form, &mut own);
    let recommender = read_recommender(&mut table, form, &mut own);
    if let Some((_, entry)) = &recommender {
        if metrics.is_empty() {
            metrics.push(MetricEntry {
                scope: entry.scope.clone(),
                source: entry.source.clone(),
                spec: entry.spec.clone(),
                name_line: entry.name_line,
                average_line: None,
            });
        } else {
            table.report(
                &mut own,
                "recommender",
                "cannot be combined with metrics: the recommender replaces them (remove one or the other)",
            );
        }
    }
    let spec = read_rule_spec(&mut table, &mut own, &metrics);
    table.finish(&mut own, AUTOSCALER_KEYS);
    if spec.algorithm == Some(Algorithm::Average) {
        // The engine divides every value by the ready replicas under `average`: a per-pod
        // average would be divided twice.
        for metric in &metrics {
            if let Some(line) = metric.average_line {
                own.report(
                    &metric.scope,
                    "pod_aggregation",
                    line,
                    "(\"average\") cannot go with algorithm = \"average\", which already divides the metric by the \
                     ready replicas: keep the default \"sum\" (the sum divided by the ready replicas is the per-pod \
                     average), or use algorithm = \"absolute\"",
                );
            }
        }
    }

    let rule = Rule::new(spec);
    if let Err(errors) = &rule {
        report_engine_errors(errors, node, &table.scope, &metrics, &mut own);
    }
    if !own.has_problems() {
        parsed.rule = rule.ok();
        match recommender {
            Some((recommender, _)) => parsed.recommender = Some(recommender),
            None => {
                parsed.metrics = metrics.into_iter().map(|m| m.source).collect();
                // Collected in place into the larger entries' allocation: keep only what is used.
                parsed.metrics.shrink_to_fit();
            }
        }
    }
    if let Form::Crd { field, .. } = form {
        own.rename_fields(field);
    }
    sink.problems.extend(own.problems);
    parsed
}

/// How fields of an autoscaler without a (valid) name are named.
fn unnamed_scope(form: Form<'_>) -> TableScope {
    match form {
        Form::File { index, .. } => {
            TableScope { label: format!("autoscaler[{index}]"), separator: ".", ..TableScope::default() }
        }
        Form::Json | Form::Crd { .. } => TableScope::default(),
    }
}

fn read_target(table: &mut Table<'_>, sink: &mut Sink) -> Option<TargetRef> {
    let mut target = table.table(sink, "target")?;
    let api_version = target.text(sink, "api_version");
    let kind = target.text(sink, "kind");
    let kind = target.require(sink, "kind", kind);
    let namespace = target.text(sink, "namespace");
    let namespace = target.require(sink, "namespace", namespace);
    let name = target.text(sink, "name");
    let name = target.require(sink, "name", name);
    target.finish(sink, TARGET_KEYS);
    Some(TargetRef {
        api_version: intern(api_version.as_deref().unwrap_or(DEFAULT_API_VERSION)),
        kind: intern(&kind?),
        namespace: intern(&namespace?),
        name: Arc::from(name?),
    })
}

fn read_interval(table: &mut Table<'_>, sink: &mut Sink) -> Option<Duration> {
    match table.duration(sink, "interval") {
        Some(interval) if interval < MIN_INTERVAL => {
            let shown = humantime::format_duration(interval);
            table.report(sink, "interval", format!("({shown}) must be at least 1s"));
            None
        }
        other => other,
    }
}

/// Reads every scalar knob of the rule; absent ones stay `None` so that the engine's defaults
/// (one place for the rules file and CRD mode) apply.
fn read_rule_spec(table: &mut Table<'_>, sink: &mut Sink, metrics: &[MetricEntry]) -> RuleSpec {
    RuleSpec {
        min_replicas: table.replicas(sink, "min_replicas"),
        max_replicas: table.replicas(sink, "max_replicas"),
        algorithm: table.choice(sink, "algorithm", Algorithm::parse, "\"absolute\" or \"average\""),
        tolerance: table.number(sink, "tolerance"),
        upscale_tolerance: table.number(sink, "upscale_tolerance"),
        downscale_tolerance: table.number(sink, "downscale_tolerance"),
        // Metric `i` of the rule is metric `i` of the entry, also when some metric had a
        // problem, so that engine problems map back to the right table.
        metrics: metrics.iter().map(|m| m.spec.clone()).collect(),
        scale_up_limit_factor: table.number(sink, "scale_up_limit_factor"),
        scale_down_limit_factor: table.number(sink, "scale_down_limit_factor"),
        upscale_forbidden_window: table.duration(sink, "upscale_forbidden_window"),
        downscale_forbidden_window: table.duration(sink, "downscale_forbidden_window"),
        upscale_delay_above_watermark: table.duration(sink, "upscale_delay_above_watermark"),
        downscale_delay_below_watermark: table.duration(sink, "downscale_delay_below_watermark"),
        behavior: read_behavior(table, sink),
        replica_modulo: table.replicas(sink, "replica_modulo"),
        converge_towards_watermark: table.choice(
            sink,
            "converge_towards_watermark",
            ConvergeTowards::parse,
            "\"high\" or \"low\"",
        ),
        tolerate_zero: table.flag(sink, "tolerate_zero"),
        min_available_replica_percentage: table.count(sink, "min_available_replica_percentage"),
        dry_run: table.flag(sink, "dry_run"),
        scale_to_zero_delay: table.duration(sink, "scale_to_zero_delay"),
    }
}

/// `[autoscaler.recommender]`: the recommender and the one engine metric that stands for it
/// (its name and watermarks; the engine checks the watermarks as a metric's).
fn read_recommender(table: &mut Table<'_>, form: Form<'_>, sink: &mut Sink) -> Option<(Recommender, MetricEntry)> {
    let mut rec = table.table(sink, "recommender")?;
    let url = rec.text(sink, "url");
    let url = if form.is_complete() { rec.require(sink, "url", url) } else { url };
    let url = url.and_then(|url| checked_url(&rec, sink, url)).and_then(|url| match reqwest::Url::parse(&url) {
        // Checked here rather than at the first request, so that `check` and a WPA's status say it.
        Ok(parsed) if parsed.host_str().is_some_and(|h| !h.is_empty()) => Some(url),
        Ok(_) => {
            rec.report(sink, "url", format!("({}) has no host", Recommender::redact(&url)));
            None
        }
        Err(e) => {
            rec.report(sink, "url", format!("({}) is not a URL: {e}", Recommender::redact(&url)));
            None
        }
    });
    let target_type = rec.text(sink, "target_type").unwrap_or_default();
    let settings = string_map(&mut rec, sink, "settings");
    let low = rec.number(sink, "low_watermark");
    let high = rec.number(sink, "high_watermark");
    let timeout = positive_duration_at_most(&mut rec, sink, "timeout", MAX_TIMEOUT).unwrap_or(DEFAULT_TIMEOUT);
    let cluster_name = rec.text(sink, "cluster_name");
    let tls = read_tls(&mut rec, sink);
    let server_name = rec.text(sink, "server_name").and_then(|name| match server_name_problem(&name, url.as_deref()) {
        None => Some(name),
        Some(problem) => {
            rec.report(sink, "server_name", problem);
            None
        }
    });
    rec.finish(sink, RECOMMENDER_KEYS);
    let recommender = Recommender {
        url: url.unwrap_or_default(),
        target_type,
        settings: settings.unwrap_or_default(),
        lower_bound: low.as_ref().map_or(0.0, |d| d.to_f64()),
        upper_bound: high.as_ref().map_or(0.0, |d| d.to_f64()),
        timeout,
        cluster_name,
        tls,
        server_name,
        tls_dir: None,
    };
    let name = recommender.metric_name();
    let entry = MetricEntry {
        scope: rec.scope.clone(),
        source: MetricSource {
            name: name.clone(),
            backend: String::new(),
            query: recommender.url.clone(),
            reducer: None,
            resource: None,
        },
        spec: MetricSpec { name, low_watermark: low, high_watermark: high, max_age: None, activation: None },
        name_line: rec.line,
        average_line: None,
    };
    Some((recommender, entry))
}

/// What is wrong with `server_name` for a recommender at `url` (when the url is valid): it must
/// be a DNS name, and it only means something over TLS.
pub(crate) fn server_name_problem(name: &str, url: Option<&str>) -> Option<String> {
    if url.is_some_and(|url| !url.starts_with("https://")) {
        return Some(format!("({name:?}) applies to https:// urls only: the url is http://"));
    }
    match rustls::pki_types::ServerName::try_from(name) {
        Ok(rustls::pki_types::ServerName::DnsName(_)) => None,
        Ok(_) => Some(format!(
            "({name:?}) must be a DNS name: to verify the certificate against an IP address, put the address in \
             the url"
        )),
        Err(_) => Some(format!("({name:?}) is not a DNS name")),
    }
}

fn read_metrics(table: &mut Table<'_>, form: Form<'_>, sink: &mut Sink) -> Vec<MetricEntry> {
    let Some(nodes) = table.list(sink, "metric", "[[autoscaler.metric]] sections in TOML") else {
        return Vec::new();
    };
    let entries: Vec<MetricEntry> =
        nodes.iter().enumerate().map(|(index, node)| read_metric(node, index, &table.scope, form, sink)).collect();
    report_duplicate_metric_names(&entries, sink);
    entries
}

fn read_metric(node: &Node, index: usize, parent: &TableScope, form: Form<'_>, sink: &mut Sink) -> MetricEntry {
    let positional = parent.element("metric", index);
    let mut entry = MetricEntry {
        scope: positional.clone(),
        source: MetricSource {
            name: String::new(),
            backend: String::new(),
            query: String::new(),
            reducer: None,
            resource: None,
        },
        spec: MetricSpec::default(),
        name_line: node.line,
        average_line: None,
    };
    let Some(mut metric) = Table::new(node, positional.clone(), sink) else { return entry };

    // The name is read first so that problems with the other keys can name the metric.
    let name = metric.text(sink, "name");
    if let Some(name) = &name {
        metric.scope = named_metric_scope(parent, &positional, name);
    }
    let query = metric.text(sink, "query");
    let resource = metric.choice(sink, "resource", ResourceName::parse, "\"cpu\" or \"memory\"");
    let is_resource = metric.has("resource");
    let has_label = name.is_some() || query.is_some() || metric.has("name") || metric.has("query") || is_resource;
    let label_key = if name.is_some() {
        "name"
    } else if query.is_some() {
        "query"
    } else {
        "resource"
    };
    match name.clone().or_else(|| query.clone()).or_else(|| resource.map(|r| r.as_str().to_string())) {
        Some(label) => {
            entry.source.name = label.clone();
            entry.name_line = metric.line_of(label_key);
            metric.scope = named_metric_scope(parent, &positional, &label);
        }
        // An invalid resource is reported: a stand-in name keeps the engine from also calling
        // the name empty.
        None if is_resource => entry.source.name = "resource".into(),
        None if !has_label => {
            let message = match form {
                Form::File { .. } | Form::Crd { .. } => {
                    "needs a query, or a resource (\"cpu\" or \"memory\") with a selector (and optionally a name, \
                     which defaults to the query or the resource)"
                }
                Form::Json => "needs a name (or a query, which then serves as its name)",
            };
            sink.report_table(&positional, node.line, message);
        }
        None => {}
    }
    entry.scope = metric.scope.clone();

    let backend = metric.text(sink, "backend");
    let reducer = metric.choice(sink, "reducer", parse_reducer, "\"max\", \"min\", \"sum\" or \"avg\"");
    let max_age = metric.duration(sink, "max_age");
    if is_resource {
        for key in ["query", "backend", "reducer"] {
            if metric.has(key) {
                metric.report(
                    sink,
                    key,
                    "does not apply to a resource metric, which is read from the Kubernetes metrics API \
                     (metrics.k8s.io) through the API server",
                );
            }
        }
        let selector = read_selector(&mut metric, sink);
        let selector = if form.is_complete() { metric.require(sink, "selector", selector) } else { selector };
        let aggregation = metric.choice(sink, "pod_aggregation", PodAggregation::parse, "\"sum\" or \"average\"");
        if aggregation == Some(PodAggregation::Average) {
            entry.average_line = Some(metric.line_of("pod_aggregation"));
        }
        let readiness_delay = metric.duration(sink, "readiness_delay");
        if let (Some(resource), Some(selector)) = (resource, selector) {
            entry.source.resource = Some(ResourceSource {
                resource,
                selector,
                aggregation: aggregation.unwrap_or_default(),
                readiness_delay: readiness_delay.unwrap_or_default(),
                max_age: max_age.unwrap_or(RESOURCE_MAX_AGE),
            });
        }
        entry.source.backend = RESOURCE_BACKEND.to_string();
        entry.source.query = format!(
            "{} of pods {}",
            resource.map_or("?", ResourceName::as_str),
            entry.source.resource.as_ref().map_or("?", |r| r.selector.as_str())
        );
    } else {
        for key in RESOURCE_KEYS {
            if metric.take(key).is_some() {
                metric.report(sink, key, "only applies to a resource metric (resource = \"cpu\" or \"memory\")");
            }
        }
        if form.is_complete() {
            if has_label {
                metric.require(sink, "query", query.clone());
            }
            let backend = metric.require(sink, "backend", backend.clone());
            if let Some(backends) = form.backends() {
                check_backend_reference(&metric, sink, backends, backend.as_deref(), reducer);
            }
        }
        entry.source.backend = backend.unwrap_or_default();
        entry.source.query = query.unwrap_or_default();
        entry.source.reducer = reducer;
    }
    entry.spec = MetricSpec {
        name: entry.source.name.clone(),
        low_watermark: metric.number(sink, "low_watermark"),
        high_watermark: metric.number(sink, "high_watermark"),
        max_age,
        activation: metric.number(sink, "activation"),
    };
    metric.finish(sink, METRIC_KEYS);
    entry
}

/// `selector`: the API server's text form (`"app=web,tier in (a,b)"`), or a table of labels
/// that must all match (`{ app = "web" }`).
fn read_selector(metric: &mut Table<'_>, sink: &mut Sink) -> Option<String> {
    let entry = metric.take("selector")?;
    let result = match &entry.value.kind {
        Kind::String(text) => parse_selector(text),
        Kind::Table(labels) => {
            let mut map = BTreeMap::new();
            let mut wrong = None;
            for label in labels {
                match &label.value.kind {
                    Kind::String(value) => {
                        map.insert(label.key.clone(), value.clone());
                    }
                    other => {
                        wrong.get_or_insert(format!(
                            "label {:?} must have a string value, not {}",
                            label.key,
                            other.describe()
                        ));
                    }
                }
            }
            match wrong {
                Some(why) => Err(why),
                None => selector_text(&map, &[]),
            }
        }
        other => Err(format!(
            "must be a label selector such as \"app=web\" or a table of labels such as {{ app = \"web\" }}, not {}",
            other.describe()
        )),
    };
    result.map_err(|message| metric.report(sink, "selector", message)).ok()
}

/// Problems about a named metric name it (`metric "latency": low_watermark`), not its position.
fn named_metric_scope(parent: &TableScope, positional: &TableScope, name: &str) -> TableScope {
    TableScope { label: parent.field(&format!("metric {name:?}")), separator: ": ", ..positional.clone() }
}

fn parse_reducer(name: &str) -> Option<Reducer> {
    match name {
        "max" => Some(Reducer::Max),
        "min" => Some(Reducer::Min),
        "sum" => Some(Reducer::Sum),
        "avg" => Some(Reducer::Avg),
        _ => None,
    }
}

fn check_backend_reference(
    metric: &Table<'_>,
    sink: &mut Sink,
    backends: &BTreeMap<String, Option<Backend>>,
    backend: Option<&str>,
    reducer: Option<Reducer>,
) {
    let Some(backend) = backend else { return };
    match backends.get(backend) {
        None => {
            let defined = if backends.is_empty() {
                "no backends are defined".to_string()
            } else {
                format!("defined: {}", backends.keys().map(String::as_str).collect::<Vec<_>>().join(", "))
            };
            metric.report(sink, "backend", format!("({backend:?}) names no [backend.{backend}] table ({defined})"));
        }
        Some(Some(Backend::Datadog(_))) if reducer.is_some() => metric.report(
            sink,
            "reducer",
            format!(
                "only applies to prometheus backends; {backend:?} is a datadog backend, whose queries \
                 aggregate series themselves (e.g. \"max:metric{{...}}\")"
            ),
        ),
        Some(_) => {}
    }
}

fn report_duplicate_metric_names(entries: &[MetricEntry], sink: &mut Sink) {
    for (i, entry) in entries.iter().enumerate() {
        let first = entries.iter().take(i).find(|e| !e.source.name.is_empty() && e.source.name == entry.source.name);
        if let Some(first) = first {
            let line = first.name_line.map(|l| format!(" on line {l}")).unwrap_or_default();
            sink.report(
                &entry.scope,
                "name",
                entry.name_line,
                format!("is already used by another metric of this autoscaler{line}; metric names must be unique"),
            );
        }
    }
}

fn read_behavior(table: &mut Table<'_>, sink: &mut Sink) -> Option<BehaviorSpec> {
    let mut behavior = table.table(sink, "behavior")?;
    let spec = BehaviorSpec {
        scale_up: read_scaling_rules(&mut behavior, sink, "scale_up"),
        scale_down: read_scaling_rules(&mut behavior, sink, "scale_down"),
    };
    behavior.finish(sink, BEHAVIOR_KEYS);
    Some(spec)
}

fn read_scaling_rules(behavior: &mut Table<'_>, sink: &mut Sink, key: &str) -> Option<ScalingRulesSpec> {
    let mut rules = behavior.table(sink, key)?;
    let spec = ScalingRulesSpec {
        tolerance: rules.number(sink, "tolerance"),
        stabilization_window: rules.duration_at_most(sink, "stabilization_window", MAX_STABILIZATION_WINDOW),
        select_policy: rules.choice(sink, "select_policy", SelectPolicy::parse, "\"max\", \"min\" or \"disabled\""),
        policies: read_policies(&mut rules, sink),
    };
    rules.finish(sink, SCALING_RULES_KEYS);
    Some(spec)
}

fn read_policies(rules: &mut Table<'_>, sink: &mut Sink) -> Option<Vec<Policy>> {
    let nodes = rules.list(sink, "policies", "e.g. [{ type = \"pods\", value = 4, period = \"15s\" }]")?;
    let policies: Vec<Option<Policy>> = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let mut policy = Table::new(node, rules.scope.element("policies", index), sink)?;
            let kind = policy.choice(sink, "type", PolicyKind::parse, "\"pods\" or \"percent\"");
            let kind = policy.require(sink, "type", kind);
            // A number of pods, or a percentage of them: an int32 in the HPA either way.
            let value = policy.replicas(sink, "value");
            let value = policy.require(sink, "value", value);
            let period = policy.duration_at_most(sink, "period", MAX_POLICY_PERIOD);
            let period = policy.require(sink, "period", period);
            policy.finish(sink, POLICY_KEYS);
            Some(Policy { kind: kind?, value: value?, period: period? })
        })
        .collect();
    // A policy with a problem is already reported; the engine checks the ones we could read.
    Some(policies.into_iter().flatten().collect())
}

/// Turns each engine problem into one about the document: `metric[0].low_watermark` becomes
/// `metric "latency": low_watermark` on the line of that key. Problems about values we already
/// reported (because we could not read them) are dropped.
fn report_engine_errors(
    errors: &[RuleError],
    node: &Node,
    scope: &TableScope,
    metrics: &[MetricEntry],
    sink: &mut Sink,
) {
    for error in errors {
        if sink.covers(&error.field) || echoes_lone_watermark(node, &error.field) {
            continue;
        }
        let line = locate(node, &document_path(node, &error.field));
        let (field_scope, key) =
            match split_metric_path(&error.field).and_then(|(i, rest)| Some((metrics.get(i)?, rest))) {
                Some((metric, rest)) => (&metric.scope, rest),
                None => (scope, error.field.as_str()),
            };
        sink.report(field_scope, key, line, error.message.clone());
    }
}

/// A watermark given alone serves as both, so the engine reports a bad value twice: once for
/// the watermark that is written and once for the one that is not. Only the first is useful.
fn echoes_lone_watermark(node: &Node, path: &str) -> bool {
    let Some((index, key)) = split_metric_path(path) else { return false };
    let sibling = match key {
        "low_watermark" => "high_watermark",
        "high_watermark" => "low_watermark",
        _ => return false,
    };
    let metric = match node.entry("metric").map(|e| &e.value.kind) {
        Some(Kind::Array(items)) => items.get(index),
        // The recommender's watermarks are the rule's only metric's.
        None if index == 0 => node.entry("recommender").map(|e| &e.value),
        _ => None,
    };
    metric.is_some_and(|m| m.entry(key).is_none() && m.entry(sibling).is_some())
}

/// Where an engine path is written in the document: `metric[0].X` is `recommender.X` in an
/// autoscaler whose one metric stands for its recommender.
fn document_path(node: &Node, path: &str) -> String {
    match path.strip_prefix("metric[0].") {
        Some(key) if node.entry("metric").is_none() && node.entry("recommender").is_some() => {
            format!("recommender.{key}")
        }
        _ => path.to_string(),
    }
}

/// `metric[3].low_watermark` -> (3, `low_watermark`).
fn split_metric_path(path: &str) -> Option<(usize, &str)> {
    let rest = path.strip_prefix("metric[")?;
    let (index, rest) = rest.split_once("].")?;
    Some((index.parse().ok()?, rest))
}

/// The line of the deepest part of an engine path (`behavior.scale_up.policies[0].period`) that
/// exists in the document: the key when it is there, else the table that should hold it.
fn locate(node: &Node, path: &str) -> Option<usize> {
    let mut current = node;
    let mut line = node.line;
    for segment in path.split('.') {
        let (key, index) = match segment.split_once('[') {
            Some((key, index)) => (key, index.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let Some(entry) = current.entry(key) else { return line };
        line = entry.line.or(line);
        current = &entry.value;
        if let Some(index) = index {
            let Kind::Array(items) = &current.kind else { return line };
            let Some(item) = items.get(index) else { return line };
            line = item.line.or(line);
            current = item;
        }
    }
    line
}
