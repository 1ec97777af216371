//! An [`AutoscalerDraft`] -> the parts of a running [`Autoscaler`]: what is required, what
//! cannot go together, which backends exist, and the engine's own checks (`Rule::new`), each
//! problem named by the origin of the field it is about. The same steps for a rules file's
//! entry, a WPA and a `decide` rule, which therefore cannot drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use watermarkd_engine::{
    Algorithm, BehaviorSpec, Decimal, MetricSpec, Policy, Relation, Rule, RuleError, RuleSpec, ScalingRulesSpec,
    DEFAULT_MIN_REPLICAS,
};

use super::backend::{url_scheme_problem, DEFAULT_TIMEOUT, HALF_MISSING};
use super::draft::{
    AutoscalerDraft, BehaviorDraft, FallbackDraft, Field, ForecastDraft, Given, KnobsDraft, MetricDraft, Origin,
    RecommenderDraft, ScalingRulesDraft, ScheduleDraft, TargetDraft,
};
use super::problem::{Problem, Sink};
use super::{
    intern, Autoscaler, Backend, MetricSource, PodAggregation, Recommender, ResourceSource, TargetRef, TlsSettings,
    DEFAULT_INTERVAL, RESOURCE_BACKEND, RESOURCE_MAX_AGE,
};
use crate::domain::fallback::{FallbackAction, FallbackRule, DEFAULT_AFTER, DEFAULT_RECOVER_AFTER};
use crate::domain::forecast::{ForecastMode, ForecastRule, DEFAULT_MAX_ERROR, DEFAULT_MAX_FACTOR};
use crate::domain::schedule::{Schedule, When, Zone};
use jiff::tz::TimeZone;

const DEFAULT_API_VERSION: &str = "apps/v1";

/// What a draft must contain.
#[derive(Clone, Copy)]
pub(crate) enum Require<'b> {
    /// A rule for `decide`: only what the engine needs, and a name for each metric.
    Rule,
    /// A running autoscaler: its name, target, queries and backends. The backends are checked
    /// against `backends` when known; one mapped to `None` was declared but has a problem of
    /// its own.
    Everything { backends: Option<&'b BTreeMap<String, Option<Backend>>> },
}

/// What a draft compiled to. A part is `None` where the draft had a problem there; `rule`
/// (and with it the autoscaler) only when the draft had none at all.
pub(crate) struct Compiled {
    pub name: Option<String>,
    pub target: Option<TargetRef>,
    pub rule: Option<Rule>,
    pub metrics: Vec<MetricSource>,
    pub recommender: Option<Recommender>,
    pub schedules: Vec<Schedule>,
    pub fallback: Option<FallbackRule>,
    pub forecast: Option<ForecastRule>,
}

impl Compiled {
    /// The running autoscaler, when every part of it is there.
    pub fn into_autoscaler(self, draft: &AutoscalerDraft) -> Option<Autoscaler> {
        Some(Autoscaler {
            name: self.name?.into(),
            target: self.target?,
            interval_set: draft.interval.cloned(),
            rule: self.rule?,
            metrics: self.metrics,
            recommender: self.recommender.map(Box::new),
            shadow: draft.shadow.value().copied().unwrap_or(false),
            observe: draft.observe.value().copied().unwrap_or(false),
            take_over: draft.take_over.value().copied().unwrap_or(false),
            schedules: self.schedules.into(),
            paused_until: draft.paused_until.cloned(),
            fallback: self.fallback.map(Box::new),
            forecast: self.forecast.map(Box::new),
        })
    }
}

/// `shadow`, `observe` and `take_over` say whether and when an autoscaler writes: a shadow and
/// an observer never write, and `take_over` is the permission to write over another
/// controller's claim, which means nothing for one that never writes.
fn check_write_flags(draft: &AutoscalerDraft, report: &mut Report<'_>) {
    let set = |field: &Field<bool>| field.value() == Some(&true);
    if set(&draft.take_over) && set(&draft.observe) {
        report.at(
            &draft.take_over.origin,
            "cannot be combined with observe: observe never writes, and take_over lets it write over another \
             controller (set observe while you compare, then take_over to cut over: docs/cutover.md)",
        );
    }
    if set(&draft.shadow) {
        for (field, what) in [(&draft.observe, "observe"), (&draft.take_over, "take_over")] {
            if set(field) {
                report.at(
                    &field.origin,
                    format!("cannot be combined with shadow: a shadow rule never writes, so {what} has no meaning"),
                );
            }
        }
    }
}

/// Checks `draft`. `sink` holds what its reader found wrong with it, and gets what this finds.
pub(crate) fn compile(draft: &AutoscalerDraft, require: Require<'_>, sink: &mut Sink) -> Compiled {
    let mut report = Report { autoscaler: draft.label.as_deref(), sink };
    let complete = matches!(require, Require::Everything { .. });
    let name = if complete { report.required(&draft.name) } else { draft.name.cloned() };
    let target = draft.target.value().and_then(|target| compile_target(target, &mut report));
    if complete {
        report.required(&draft.target);
    }
    let mut metrics = compile_metrics(draft, require, &mut report);
    let recommender =
        draft.recommender.value().map(|recommender| compile_recommender(recommender, complete, &mut report));
    if let Some((_, stand_in)) = &recommender {
        if metrics.is_empty() {
            metrics.push(stand_in.clone());
        } else {
            report.at(
                &draft.recommender.origin,
                "cannot be combined with metrics: the recommender replaces them (remove one or the other)",
            );
        }
    }
    check_write_flags(draft, &mut report);
    let (behavior, policy_drafts) = compile_behavior(&draft.behavior, &mut report);
    let schedules = compile_schedules(draft, &mut report);
    let fallback = draft.fallback.value().and_then(|fallback| compile_fallback(fallback, draft, &mut report));
    let forecast = draft.forecast.value().and_then(|forecast| compile_forecast(forecast, &mut report));
    if draft.knobs.algorithm.value() == Some(&Algorithm::Average) {
        check_average_aggregation(&metrics, &mut report);
    }
    let spec = rule_spec(&draft.knobs, &metrics, behavior);
    let rule = Rule::new(spec);
    if let Err(errors) = &rule {
        let places = Places { draft, metrics: &metrics, policies: &policy_drafts };
        report_engine_errors(errors, &places, &mut report);
    }
    let valid = !report.sink.has_problems();
    let (recommender, metrics) = match recommender {
        Some((recommender, _)) => (Some(recommender), Vec::new()),
        None => (None, metrics.into_iter().map(|m| m.source).collect()),
    };
    Compiled {
        name,
        target,
        rule: rule.ok().filter(|_| valid),
        metrics,
        recommender: recommender.filter(|_| valid),
        schedules,
        fallback,
        forecast,
    }
}

/// Where problems go, for one autoscaler.
struct Report<'a> {
    autoscaler: Option<&'a str>,
    sink: &'a mut Sink,
}

impl Report<'_> {
    fn at(&mut self, origin: &Origin, message: impl Into<String>) {
        self.sink.problems.push(Problem {
            line: origin.line,
            autoscaler: self.autoscaler.map(str::to_string),
            field: origin.field().into_owned(),
            message: message.into(),
        });
    }

    /// The value of a required field, reporting it when it is not written.
    fn required<T: Clone>(&mut self, field: &Field<T>) -> Option<T> {
        if matches!(field.given, Given::Absent) {
            self.at(&field.origin, "is required");
        }
        field.cloned()
    }
}

fn compile_target(target: &TargetDraft, report: &mut Report<'_>) -> Option<TargetRef> {
    let kind = report.required(&target.kind);
    let namespace = report.required(&target.namespace);
    let name = report.required(&target.name);
    // A name the API server would refuse names no object: the autoscaler would only ever say
    // its target is not found.
    if let Some(problem) = namespace.as_deref().and_then(|ns| dns_label_problem(ns, "namespace")) {
        report.at(&target.namespace.origin, problem);
    }
    let what = kind.as_deref().map_or_else(|| "object".to_string(), |kind| kind.to_string());
    if let Some(problem) = name.as_deref().and_then(|name| dns_subdomain_problem(name, &what)) {
        report.at(&target.name.origin, problem);
    }
    Some(TargetRef {
        api_version: intern(target.api_version.value().map_or(DEFAULT_API_VERSION, String::as_str)),
        kind: intern(&kind?),
        namespace: intern(&namespace?),
        name: Arc::from(name?),
    })
}

/// What is wrong with `name` as the name of a `what` (`Deployment`): the API server takes
/// the names of workloads (Deployments, StatefulSets, ReplicaSets, and custom resources alike)
/// only as DNS subdomains (RFC 1123).
pub(crate) fn dns_subdomain_problem(name: &str, what: &str) -> Option<String> {
    // Kubernetes limits the whole name, not each of its labels.
    let valid = name.len() <= 253 && name.split('.').all(is_dns_label_text);
    (!valid).then(|| {
        format!(
            "({name:?}) is not a valid {what} name: a DNS subdomain (RFC 1123) of lower-case letters, digits, '-' \
             and '.', starting and ending with a letter or digit, at most 253 characters"
        )
    })
}

/// What is wrong with `name` as a `what` that must be a DNS label (RFC 1123), as a namespace's.
pub(crate) fn dns_label_problem(name: &str, what: &str) -> Option<String> {
    (!is_dns_label(name)).then(|| {
        format!(
            "({name:?}) is not a valid {what}: a DNS label (RFC 1123) of lower-case letters, digits and '-', \
             starting and ending with a letter or digit, at most 63 characters"
        )
    })
}

fn is_dns_label(label: &str) -> bool {
    label.len() <= 63 && is_dns_label_text(label)
}

/// Lower-case letters, digits and '-', starting and ending with a letter or digit.
fn is_dns_label_text(label: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    label.chars().all(|c| alphanumeric(c) || c == '-')
        && label.starts_with(alphanumeric)
        && label.ends_with(alphanumeric)
}

/// One metric of the rule, and the draft fields the engine's problems with it are about.
#[derive(Clone)]
struct CompiledMetric<'d> {
    source: MetricSource,
    spec: MetricSpec,
    /// `None` when the metric could not be read at all: nothing more is said of it.
    fields: Option<MetricFields<'d>>,
}

#[derive(Clone, Copy)]
struct MetricFields<'d> {
    origin: &'d Origin,
    name: &'d Origin,
    low_watermark: &'d Field<Decimal>,
    high_watermark: &'d Field<Decimal>,
    /// A metric's own, absent for the metric a recommender stands for.
    metric: Option<&'d MetricDraft>,
}

fn compile_metrics<'d>(
    draft: &'d AutoscalerDraft,
    require: Require<'_>,
    report: &mut Report<'_>,
) -> Vec<CompiledMetric<'d>> {
    let Some(drafts) = draft.metrics.value() else { return Vec::new() };
    let metrics: Vec<CompiledMetric<'d>> =
        drafts.iter().map(|metric| compile_metric(metric, require, report)).collect();
    for (i, metric) in metrics.iter().enumerate() {
        let Some(fields) = metric.fields else { continue };
        let name = &metric.source.name;
        let first = metrics.iter().take(i).find(|m| m.fields.is_some() && !name.is_empty() && &m.source.name == name);
        if let Some(first) = first.and_then(|m| m.fields) {
            let line = first.name.line.map(|l| format!(" on line {l}")).unwrap_or_default();
            report.at(
                fields.name,
                format!("is already used by another metric of this autoscaler{line}; metric names must be unique"),
            );
        }
    }
    metrics
}

fn compile_metric<'d>(
    metric: &'d Field<MetricDraft>,
    require: Require<'_>,
    report: &mut Report<'_>,
) -> CompiledMetric<'d> {
    let mut source = MetricSource {
        name: String::new(),
        backend: String::new(),
        query: String::new(),
        reducer: None,
        resource: None,
    };
    let Some(d) = metric.value() else {
        return CompiledMetric { source, spec: MetricSpec::default(), fields: None };
    };
    let complete = matches!(require, Require::Everything { .. });
    let is_resource = d.resource.is_written();
    let label = d.name.value().or(d.query.value()).cloned().or_else(|| d.resource.value().map(|r| r.to_string()));
    match label {
        Some(label) => source.name = label,
        // An unreadable resource is reported: a stand-in name keeps the engine from also
        // calling the name empty.
        None if is_resource => source.name = "resource".into(),
        // An unreadable name or query is reported.
        None => {}
    }
    if is_resource {
        let selector = if complete { report.required(&d.selector) } else { d.selector.cloned() };
        if let (Some(resource), Some(selector)) = (d.resource.value(), selector) {
            source.resource = Some(ResourceSource {
                resource: *resource,
                selector,
                aggregation: d.pod_aggregation.value().copied().unwrap_or_default(),
                readiness_delay: d.readiness_delay.value().copied().unwrap_or_default(),
                max_age: d.max_age.value().copied().unwrap_or(RESOURCE_MAX_AGE),
            });
        }
        source.backend = RESOURCE_BACKEND.to_string();
        source.query = format!(
            "{} of pods {}",
            d.resource.value().map_or("?", |r| r.as_str()),
            source.resource.as_ref().map_or("?", |r| r.selector.as_str())
        );
    } else {
        if complete {
            report.required(&d.query);
            let backend = report.required(&d.backend);
            if let (Require::Everything { backends: Some(backends) }, Some(backend)) = (require, &backend) {
                check_backend_reference(d, backends, backend, report);
            }
        }
        source.backend = d.backend.cloned().unwrap_or_default();
        source.query = d.query.cloned().unwrap_or_default();
        source.reducer = d.reducer.value().copied();
    }
    let spec = MetricSpec {
        name: source.name.clone(),
        low_watermark: d.low_watermark.cloned(),
        high_watermark: d.high_watermark.cloned(),
        max_age: d.max_age.cloned(),
        activation: d.activation.cloned(),
    };
    let fields = MetricFields {
        origin: &d.origin,
        name: &d.name.origin,
        low_watermark: &d.low_watermark,
        high_watermark: &d.high_watermark,
        metric: Some(d),
    };
    CompiledMetric { source, spec, fields: Some(fields) }
}

fn check_backend_reference(
    metric: &MetricDraft,
    backends: &BTreeMap<String, Option<Backend>>,
    backend: &str,
    report: &mut Report<'_>,
) {
    match backends.get(backend) {
        None => {
            let defined = if backends.is_empty() {
                "no backends are defined".to_string()
            } else {
                format!("defined: {}", backends.keys().map(String::as_str).collect::<Vec<_>>().join(", "))
            };
            report.at(&metric.backend.origin, format!("({backend:?}) names no [backend.{backend}] table ({defined})"));
        }
        Some(Some(config)) => {
            if let Some(problem) = config.reducer_problem(backend).filter(|_| metric.reducer.value().is_some()) {
                report.at(&metric.reducer.origin, problem);
            }
            // Found here, the daemon never loads it, instead of reading it as "no data".
            if let Some(problem) = metric.query.value().and_then(|query| config.query_problem(query)) {
                report.at(&metric.query.origin, problem);
            }
        }
        // The backend's own problems are reported where it is defined.
        Some(None) => {}
    }
}

/// The recommender, and the one engine metric that stands for it (its name and watermarks;
/// the engine checks the watermarks as a metric's).
fn compile_recommender<'d>(
    draft: &'d RecommenderDraft,
    complete: bool,
    report: &mut Report<'_>,
) -> (Recommender, CompiledMetric<'d>) {
    let url = if complete { report.required(&draft.url) } else { draft.url.cloned() };
    let url = url.and_then(|url| {
        let problem = url_scheme_problem(&url).or_else(|| match reqwest::Url::parse(&url) {
            // Checked here rather than at the first request, so that `check` and a WPA's status say it.
            Ok(parsed) if parsed.host_str().is_some_and(|h| !h.is_empty()) => None,
            Ok(_) => Some(format!("({}) has no host", Recommender::redact(&url))),
            Err(e) => Some(format!("({}) is not a URL: {e}", Recommender::redact(&url))),
        });
        match problem {
            None => Some(url),
            Some(problem) => {
                report.at(&draft.url.origin, problem);
                None
            }
        }
    });
    let tls = TlsSettings {
        ca_file: draft.ca_file.cloned(),
        client_cert_file: draft.client_cert_file.cloned(),
        client_key_file: draft.client_key_file.cloned(),
        insecure_skip_verify: draft.insecure_skip_verify.value().copied().unwrap_or(false),
    };
    if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
        let missing = if tls.client_cert_file.is_some() { &draft.client_key_file } else { &draft.client_cert_file };
        report.at(&missing.origin, HALF_MISSING);
    }
    let server_name = draft.server_name.cloned().and_then(|name| match server_name_problem(&name, url.as_deref()) {
        None => Some(name),
        Some(problem) => {
            report.at(&draft.server_name.origin, problem);
            None
        }
    });
    let (low, high) = (draft.low_watermark.cloned(), draft.high_watermark.cloned());
    let recommender = Recommender {
        url: url.unwrap_or_default(),
        target_type: draft.target_type.cloned().unwrap_or_default(),
        settings: draft.settings.cloned().unwrap_or_default(),
        lower_bound: low.as_ref().map_or(0.0, Decimal::to_f64),
        upper_bound: high.as_ref().map_or(0.0, Decimal::to_f64),
        timeout: draft.timeout.value().copied().unwrap_or(DEFAULT_TIMEOUT),
        cluster_name: draft.cluster_name.cloned(),
        tls,
        server_name,
        tls_dir: draft.tls_dir.clone(),
    };
    let name = recommender.metric_name();
    let stand_in = CompiledMetric {
        source: MetricSource {
            name: name.clone(),
            backend: String::new(),
            query: recommender.url.clone(),
            reducer: None,
            resource: None,
        },
        spec: MetricSpec { name, low_watermark: low, high_watermark: high, max_age: None, activation: None },
        fields: Some(MetricFields {
            origin: &draft.origin,
            name: &draft.origin,
            low_watermark: &draft.low_watermark,
            high_watermark: &draft.high_watermark,
            metric: None,
        }),
    };
    (recommender, stand_in)
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

/// `behavior` for the engine, and, per direction, which policy of the draft each of the
/// engine's policies is (a policy that could not be read is left out).
fn compile_behavior<'d>(
    behavior: &'d Field<BehaviorDraft>,
    report: &mut Report<'_>,
) -> (Option<BehaviorSpec>, PolicyDrafts<'d>) {
    let mut drafts = PolicyDrafts::default();
    let Some(draft) = behavior.value() else { return (None, drafts) };
    let mut direction = |rules: &'d Field<ScalingRulesDraft>, kept: &mut Vec<&'d Origin>| {
        let rules = rules.value()?;
        let policies = rules.policies.value().map(|policies| {
            let mut engine = Vec::new();
            for policy in policies.iter().filter_map(Field::value) {
                let kind = report.required(&policy.kind);
                let value = report.required(&policy.value);
                let period = report.required(&policy.period);
                if let (Some(kind), Some(value), Some(period)) = (kind, value, period) {
                    engine.push(Policy { kind, value, period });
                    kept.push(&policy.value.origin);
                    kept.push(&policy.period.origin);
                }
            }
            engine
        });
        Some(ScalingRulesSpec {
            tolerance: rules.tolerance.cloned(),
            stabilization_window: rules.stabilization_window.cloned(),
            select_policy: rules.select_policy.value().copied(),
            policies,
        })
    };
    let spec = BehaviorSpec {
        scale_up: direction(&draft.scale_up, &mut drafts.scale_up),
        scale_down: direction(&draft.scale_down, &mut drafts.scale_down),
    };
    (Some(spec), drafts)
}

/// Per direction, the origins of the `value` and `period` of each policy the engine was given,
/// two by two.
#[derive(Default)]
struct PolicyDrafts<'d> {
    scale_up: Vec<&'d Origin>,
    scale_down: Vec<&'d Origin>,
}

/// The windows of the autoscaler's schedule: each weekly or cron, its floor within the rule's
/// bounds, its name its own.
fn compile_schedules(draft: &AutoscalerDraft, report: &mut Report<'_>) -> Vec<Schedule> {
    let Some(windows) = draft.schedules.value() else { return Vec::new() };
    let max = &draft.knobs.max_replicas;
    let rule_min = &draft.knobs.min_replicas;
    let mut schedules: Vec<Schedule> = Vec::with_capacity(windows.len());
    let mut names: Vec<(String, &Origin)> = Vec::new();
    for (index, window) in windows.iter().enumerate() {
        let Some(w) = window.value() else { continue };
        let name = w.name.cloned().unwrap_or_else(|| format!("schedule[{index}]"));
        if let Some((_, first)) = names.iter().find(|(known, _)| *known == name) {
            let line = first.line.map(|l| format!(" on line {l}")).unwrap_or_default();
            report.at(
                &w.name.origin,
                format!("({name:?}) is already used by another window{line}; names must be unique"),
            );
        }
        names.push((name.clone(), &w.name.origin));
        let min = report.required(&w.min_replicas);
        if let (Some(min), Some(rule_max)) = (min, max.value()) {
            if min > *rule_max {
                let message = format!("({min}) must not exceed {} ({rule_max})", max.origin.key());
                report.at(&w.min_replicas.origin, message);
            }
        }
        if let (Some(min), Some(cap)) = (min, w.max_replicas.value()) {
            if *cap < min {
                report.at(
                    &w.max_replicas.origin,
                    format!("({cap}) must not be below {} ({min})", w.min_replicas.origin.key()),
                );
            }
        }
        if let (Some(cap), Some(floor)) = (w.max_replicas.value(), written_or_default(rule_min, DEFAULT_MIN_REPLICAS)) {
            if *cap < floor && w.min_replicas.value().is_none_or(|min| min <= cap) {
                report.at(
                    &w.max_replicas.origin,
                    format!(
                        "({cap}) must not be below {} ({floor}): the rule never goes below its own floor, so this \
                         cap would do nothing",
                        rule_min.origin.key()
                    ),
                );
            }
        }
        let when = compile_when(w, report);
        let time_zone = w.time_zone.cloned().unwrap_or_else(|| Zone { name: "UTC".into(), zone: TimeZone::UTC });
        if let (Some(when), Some(min_replicas)) = (when, min) {
            schedules.push(Schedule {
                name,
                when,
                time_zone,
                min_replicas,
                max_replicas: w.max_replicas.cloned(),
                ramp_in: w.ramp_in.cloned().unwrap_or_default(),
                ramp_out: w.ramp_out.cloned().unwrap_or_default(),
            });
        }
    }
    schedules
}

/// What the autoscaler does once no metric has had a usable value for a while: `replicas`
/// only with `action = "replicas"` (and there required), within `max_replicas`; `scale_down`
/// only with a count.
fn compile_fallback(
    draft: &FallbackDraft,
    autoscaler: &AutoscalerDraft,
    report: &mut Report<'_>,
) -> Option<FallbackRule> {
    let knobs = &autoscaler.knobs;
    let action = draft.action.value().map_or("hold", String::as_str);
    let replicas = if action == "replicas" {
        report.required(&draft.replicas)
    } else {
        if draft.replicas.is_written() {
            report
                .at(&draft.replicas.origin, format!("only applies with {} = \"replicas\"", draft.action.origin.key()));
        }
        None
    };
    if let (Some(count), Some(max)) = (replicas, knobs.max_replicas.value()) {
        if count > *max {
            report.at(
                &draft.replicas.origin,
                format!("({count}) must not exceed {} ({max})", knobs.max_replicas.origin.key()),
            );
        }
    }
    // The engine keeps a fallback's count within the bounds, and never at zero: a count below
    // them would say one thing and run another.
    if let (Some(count), Some(min)) = (replicas, written_or_default(&knobs.min_replicas, DEFAULT_MIN_REPLICAS)) {
        let key = knobs.min_replicas.origin.key();
        if count < min {
            let message = format!("({count}) must not be below {key} ({min}): the fallback would run {min}");
            report.at(&draft.replicas.origin, message);
        } else if count == 0 {
            let message =
                format!("(0) must be at least 1: with {key} = 0 the fallback never scales to zero, it would run 1");
            report.at(&draft.replicas.origin, message);
        }
    }
    let scale_down = draft.scale_down.value().copied().unwrap_or(false);
    let interval = autoscaler.interval.value().copied();
    let after = written_or_default(&draft.after, DEFAULT_AFTER);
    if let (true, Some(after)) = (scale_down && action == "replicas", after) {
        let (interval, which) = match interval {
            Some(interval) => (interval, "the interval"),
            None => (DEFAULT_INTERVAL, "the default interval"),
        };
        if after < interval {
            report.at(
                &draft.after.origin,
                format!(
                    "({}) must be at least {which} ({}) with {} = true: shorter, one or two failed reads in a row \
                     scale down to the count",
                    humantime::format_duration(after),
                    humantime::format_duration(interval),
                    draft.scale_down.origin.key()
                ),
            );
        }
    }
    if scale_down && action != "replicas" {
        let message =
            format!("only applies with {} = \"replicas\": a count to scale down to", draft.action.origin.key());
        report.at(&draft.scale_down.origin, message);
    }
    let action = match action {
        "replicas" => FallbackAction::Replicas { replicas: replicas?, scale_down },
        "last_good" => FallbackAction::LastGood,
        _ => FallbackAction::Hold,
    };
    Some(FallbackRule {
        after: draft.after.value().copied().unwrap_or(DEFAULT_AFTER),
        recover_after: draft.recover_after.value().copied().unwrap_or(DEFAULT_RECOVER_AFTER),
        action,
    })
}

/// The value of `field` when it is written, `default` when it is not, `None` when it could not
/// be read (its reader said why).
fn written_or_default<T: Copy>(field: &Field<T>, default: T) -> Option<T> {
    match &field.given {
        Given::Value(value) => Some(*value),
        Given::Absent => Some(default),
        Given::Unreadable => None,
    }
}

/// A forecast needs its lead time (how long new replicas take to be ready); it observes until
/// told to scale; its error bound is a fraction, its factor at least 1.
fn compile_forecast(draft: &ForecastDraft, report: &mut Report<'_>) -> Option<ForecastRule> {
    let lead_time = report.required(&draft.lead_time);
    if lead_time.is_some_and(|l| l.is_zero()) {
        report.at(&draft.lead_time.origin, "must be longer than 0s: new replicas take time to be ready");
    }
    let max_error = draft.max_error.value().map_or(DEFAULT_MAX_ERROR, Decimal::to_f64);
    if !(0.0..=1.0).contains(&max_error) || max_error == 0.0 {
        report.at(&draft.max_error.origin, format!("({max_error}) must be a fraction above 0 and at most 1, e.g. 0.3"));
    }
    let max_factor = draft.max_factor.value().map_or(DEFAULT_MAX_FACTOR, Decimal::to_f64);
    if !(1.0..=100.0).contains(&max_factor) {
        report.at(&draft.max_factor.origin, format!("({max_factor}) must be from 1 to 100"));
    }
    let mode = match draft.mode.value().map(String::as_str) {
        Some("scale") => ForecastMode::Scale,
        _ => ForecastMode::Observe,
    };
    Some(ForecastRule { lead_time: lead_time.filter(|l| !l.is_zero())?, mode, max_error, max_factor })
}

/// A window is weekly (days, start and end) or cron (an expression and a duration).
fn compile_when(w: &ScheduleDraft, report: &mut Report<'_>) -> Option<When> {
    let weekly = w.days.is_written() || w.start.is_written() || w.end.is_written();
    let cron = w.cron.is_written() || w.duration.is_written();
    match (weekly, cron) {
        (true, true) => {
            let message = format!(
                "cannot be combined with {}, {} and {}: a window is weekly or cron, not both",
                w.days.origin.key(),
                w.start.origin.key(),
                w.end.origin.key()
            );
            report.at(&w.cron.origin, message);
            None
        }
        (false, false) => {
            let message = format!(
                "needs {}, {} and {} (a weekly window), or {} and {} (a cron window)",
                w.days.origin.key(),
                w.start.origin.key(),
                w.end.origin.key(),
                w.cron.origin.key(),
                w.duration.origin.key()
            );
            report.at(&w.origin, message);
            None
        }
        (true, false) => {
            let (days, start, end) = (report.required(&w.days), report.required(&w.start), report.required(&w.end));
            Some(When::Weekly { days: days?, start: start?, end: end? })
        }
        (false, true) => {
            let (cron, duration) = (report.required(&w.cron), report.required(&w.duration));
            if duration.is_some_and(|d| d.is_zero()) {
                report.at(&w.duration.origin, "must be longer than 0s");
                return None;
            }
            Some(When::Cron { cron: cron?, duration: duration? })
        }
    }
}

/// The engine divides every value by the ready replicas under `average`: a per-pod average
/// would be divided twice.
fn check_average_aggregation(metrics: &[CompiledMetric<'_>], report: &mut Report<'_>) {
    let averaged = metrics.iter().filter_map(|m| m.fields?.metric).map(|m| &m.pod_aggregation);
    for aggregation in averaged.filter(|a| a.value() == Some(&PodAggregation::Average)) {
        report.at(
            &aggregation.origin,
            "(\"average\") cannot go with algorithm = \"average\", which already divides the metric by the ready \
             replicas: keep the default \"sum\" (the sum divided by the ready replicas is the per-pod average), or \
             use algorithm = \"absolute\"",
        );
    }
}

fn rule_spec(knobs: &KnobsDraft, metrics: &[CompiledMetric<'_>], behavior: Option<BehaviorSpec>) -> RuleSpec {
    RuleSpec {
        min_replicas: knobs.min_replicas.cloned(),
        max_replicas: knobs.max_replicas.cloned(),
        algorithm: knobs.algorithm.cloned(),
        tolerance: knobs.tolerance.cloned(),
        upscale_tolerance: knobs.upscale_tolerance.cloned(),
        downscale_tolerance: knobs.downscale_tolerance.cloned(),
        // Metric `i` of the rule is metric `i` of the draft, also when some metric had a
        // problem, so that the engine's problems map back to the right one.
        metrics: metrics.iter().map(|m| m.spec.clone()).collect(),
        scale_up_limit_factor: knobs.scale_up_limit_factor.cloned(),
        scale_down_limit_factor: knobs.scale_down_limit_factor.cloned(),
        upscale_forbidden_window: knobs.upscale_forbidden_window.cloned(),
        downscale_forbidden_window: knobs.downscale_forbidden_window.cloned(),
        upscale_delay_above_watermark: knobs.upscale_delay_above_watermark.cloned(),
        downscale_delay_below_watermark: knobs.downscale_delay_below_watermark.cloned(),
        behavior,
        replica_modulo: knobs.replica_modulo.cloned(),
        converge_towards_watermark: knobs.converge_towards_watermark.cloned(),
        tolerate_zero: knobs.tolerate_zero.cloned(),
        min_available_replica_percentage: knobs.min_available_replica_percentage.cloned(),
        dry_run: knobs.dry_run.cloned(),
        scale_to_zero_delay: knobs.scale_to_zero_delay.cloned(),
    }
}

/// The draft, seen through the engine's paths.
struct Places<'p, 'd> {
    draft: &'d AutoscalerDraft,
    metrics: &'p [CompiledMetric<'d>],
    policies: &'p PolicyDrafts<'d>,
}

/// Where the draft wrote (or would write) the field the engine names `path`.
fn origin_of<'d>(places: &Places<'_, 'd>, path: &str) -> Option<(&'d Origin, Presence)> {
    fn at<T>(field: &Field<T>) -> Option<(&Origin, Presence)> {
        let presence = match field.given {
            Given::Absent => Presence::Absent,
            Given::Unreadable => Presence::Unreadable,
            Given::Value(_) => Presence::Written,
        };
        Some((&field.origin, presence))
    }
    let draft = places.draft;
    if let Some(rest) = path.strip_prefix("metric[") {
        let (index, key) = rest.split_once(']')?;
        let fields = places.metrics.get(index.parse::<usize>().ok()?)?.fields?;
        return match (key.trim_start_matches('.'), fields.metric) {
            ("low_watermark", _) => {
                at(fields.low_watermark).map(|(origin, presence)| (origin, presence.beside(fields.high_watermark)))
            }
            ("high_watermark", _) => {
                at(fields.high_watermark).map(|(origin, presence)| (origin, presence.beside(fields.low_watermark)))
            }
            ("name", Some(metric)) if metric.name.is_unreadable() => Some((fields.name, Presence::Unreadable)),
            ("name", _) => Some((fields.name, Presence::Written)),
            ("max_age", Some(metric)) => at(&metric.max_age),
            ("activation", Some(metric)) => at(&metric.activation),
            _ => Some((fields.origin, Presence::Written)),
        };
    }
    if path == "metric" {
        return at(&draft.metrics);
    }
    if let Some(rest) = path.strip_prefix("behavior.") {
        let behavior = draft.behavior.value()?;
        let (direction, key) = rest.split_once('.').unwrap_or((rest, ""));
        let (rules, policies) = match direction {
            "scale_up" => (&behavior.scale_up, &places.policies.scale_up),
            "scale_down" => (&behavior.scale_down, &places.policies.scale_down),
            _ => return at(&draft.behavior),
        };
        let Some(scaling) = rules.value() else { return at(rules) };
        return match key {
            "tolerance" => at(&scaling.tolerance),
            "stabilization_window" => at(&scaling.stabilization_window),
            "policies" => at(&scaling.policies),
            _ => {
                // `policies[i].value` or `policies[i].period`, of the policies the engine was given.
                let rest = key.strip_prefix("policies[")?;
                let (index, field) = rest.split_once("].")?;
                let index: usize = index.parse().ok()?;
                let offset = usize::from(field == "period");
                Some((*policies.get(index * 2 + offset)?, Presence::Written))
            }
        };
    }
    match draft.knobs.origin_of(path) {
        Some((origin, unreadable)) => Some((origin, if unreadable { Presence::Unreadable } else { Presence::Written })),
        None => Some((&draft.origin, Presence::Written)),
    }
}

/// What the draft says of a field the engine has a problem with.
#[derive(Clone, Copy)]
enum Presence {
    Written,
    Absent,
    /// Its reader has already said what is wrong with it.
    Unreadable,
    /// A watermark not written whose sibling is: the engine takes the one for both and so
    /// reports a bad value twice; it is said once, of the one written.
    Echo,
}

impl Presence {
    fn beside(self, sibling: &Field<Decimal>) -> Presence {
        match self {
            Presence::Absent if sibling.value().is_some() => Presence::Echo,
            other => other,
        }
    }
}

/// Turns each engine problem into one about the draft's field, where its source wrote it; a
/// problem between two fields names the other one as its source does.
fn report_engine_errors(errors: &[RuleError], places: &Places<'_, '_>, report: &mut Report<'_>) {
    let key = |path: &str| origin_of(places, path).map_or_else(|| path.to_string(), |(o, _)| o.key().to_string());
    for error in errors {
        let Some((origin, presence)) = origin_of(places, &error.field) else { continue };
        if matches!(presence, Presence::Unreadable | Presence::Echo) {
            continue;
        }
        let message = match &error.relation {
            None => error.message.clone(),
            Some(Relation::Exceeds { value, other, bound }) => {
                format!("({value}) must not exceed {} ({bound})", key(other))
            }
            Some(Relation::OneOfRequired { other }) => {
                format!("at least one of {} and {} is required", key(other), origin.key())
            }
        };
        report.at(origin, message);
    }
}

#[cfg(test)]
mod tests;
