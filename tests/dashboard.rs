//! The Grafana dashboard in deploy/grafana/watermarkd.json queries only series the daemon
//! exports, with label names those series carry, so that a rename in the code or a typo in the
//! dashboard shows up here rather than as an empty panel.
//!
//! The exported series are built in-process from the telemetry types: the daemon's, backend and
//! recommender-client metrics on one registry, the per-autoscaler series from an
//! `AutoscalerMetrics` over a ledger that has seen one decision (with a forecast, a fallback and a pause) and
//! one shadow outcome.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{Registry, TextEncoder};
use serde_json::Value;
use watermarkd::adapters::telemetry::{
    AutoscalerMetrics, BackendMetrics, DaemonMetrics, HttpClientMetrics, LabelsAsTags, SeriesLabels,
};
use watermarkd::domain::outcome::{Identity, Ledger, Outcome, Outlook, ShadowOutcome};
use watermarkd_engine::{decide, Reading, State, Target, Timestamp};

const DASHBOARD: &str = "deploy/grafana/watermarkd.json";

/// Labels Prometheus attaches when it scrapes, which the daemon itself does not export.
const SCRAPE_LABELS: &[&str] = &["instance", "job"];

/// Families the dashboard must show: the panels the dashboard exists for. Without this, an
/// emptied dashboard would pass every other check.
const REQUIRED: &[&str] = &[
    "wpa_controller_value",
    "wpa_controller_high_watermark",
    "wpa_controller_low_watermark",
    "wpa_controller_replicas_scaling_proposal",
    "wpa_controller_replicas_scaling_effective",
    "wpa_controller_min_replicas",
    "wpa_controller_max_replicas",
    "wpa_controller_restricted_scaling",
    "wpa_controller_transition_countdown",
    "wpa_controller_conditions",
    "wpa_controller_upscale_replicas_total",
    "wpa_controller_downscale_replicas_total",
    "watermarkd_shadow_replicas",
    "watermarkd_shadow_divergence_total",
    "watermarkd_forecast_demand",
    "watermarkd_forecast_replicas",
    "watermarkd_fallback_active",
    "watermarkd_paused",
    "watermarkd_evaluations_total",
    "watermarkd_evaluation_duration_seconds",
    "watermarkd_query_cycle_duration_seconds",
    "watermarkd_backend_requests_total",
    "watermarkd_backend_request_duration_seconds",
    "watermarkd_datadog_rate_limit",
    "watermarkd_datadog_stretched_interval_seconds",
    "watermarkd_datadog_deferred_queries_total",
    "watermarkd_kubernetes_writes_total",
    "watermarkd_config_reloads_total",
    "watermarkd_leader",
    "watermarkd_autoscalers",
];

// ---------------------------------------------------------------------------------------------
// What the daemon exports

#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
}

/// Families and the label names of their samples, from Prometheus text. A sample's labels go to
/// the family of the `# TYPE` line above it, so a histogram's `le` is one of its labels.
fn parse_text(text: &str, into: &mut BTreeMap<String, Family>) {
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            let family = into.entry(name.to_string()).or_default();
            assert!(family.kind.is_empty() || family.kind == kind, "{name} exported as {} and {kind}", family.kind);
            family.kind = kind.to_string();
            current = Some(name.to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = current.as_ref().unwrap_or_else(|| panic!("a sample before any # TYPE: {line}"));
            let Some((_, rest)) = line.split_once('{') else { continue };
            // Label values in these fixtures are plain words, so `name="value"` pairs split on
            // `",` without unescaping.
            let inner = rest.rsplit_once('}').expect("closing brace").0;
            for pair in inner.split("\",") {
                let label = pair.split_once('=').expect("label=value").0;
                into.get_mut(name).expect("family").labels.insert(label.trim().to_string());
            }
        }
    }
}

/// Gives a labelled metric a child, since a registry leaves out families with no sample.
fn touch<T: MetricVecBuilder>(vec: &MetricVec<T>) {
    let labels = vec.desc().first().expect("a description").variable_labels.len();
    vec.get_metric_with_label_values(&vec!["x"; labels]).expect("label count from its own description");
}

/// The daemon's, backend and recommender-client families, registered as `runtime::run` registers
/// them.
fn registry_text() -> String {
    let registry = Registry::new();
    let backend = BackendMetrics::new(&registry).expect("register backend metrics");
    let http = HttpClientMetrics::new(&registry).expect("register http client metrics");
    let daemon = DaemonMetrics::new(&registry).expect("register daemon metrics");
    touch(&daemon.evaluations);
    touch(&daemon.evaluation_seconds);
    touch(&daemon.cycle_seconds);
    touch(&daemon.kubernetes_writes);
    touch(&daemon.reloads);
    touch(&daemon.autoscalers);
    touch(&backend.requests);
    touch(&backend.request_seconds);
    touch(&backend.rate_limit);
    touch(&backend.stretched_interval_seconds);
    touch(&backend.deferred_queries);
    touch(&backend.warnings);
    touch(&backend.suppressed_queries);
    touch(&http.request_duration);
    touch(&http.requests);
    touch(&http.errors);
    touch(&http.inflight);
    let mut out = String::new();
    TextEncoder::new().encode_utf8(&registry.gather(), &mut out).expect("encode");
    out
}

/// The per-autoscaler series after one decision and one shadow outcome, which is when every
/// family (the shadow ones included) has a sample.
fn autoscaler_text() -> String {
    let ledger = Arc::new(Ledger::new(std::time::Duration::ZERO));
    let metrics = AutoscalerMetrics::new(Arc::clone(&ledger), LabelsAsTags::default());
    let labels = Arc::new(SeriesLabels::deployment("web", "prod", false));
    let rule = watermarkd::domain::rules::rule_from_json(&serde_json::json!({
        "min_replicas": 1, "max_replicas": 10,
        "metric": [{ "name": "latency", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
    }))
    .expect("rule");
    let now = Timestamp::from_unix_millis(1_700_000_000_000);
    let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
    let decision = decide(&rule, target, &[Reading::Value { value: 30.0, at: now }], &State::default(), now);
    let identity = Identity::rules_file(Arc::clone(&labels), &[], 15, (1, 10));
    ledger.admit(Identity { shadows: vec!["web-next".into()], ..identity });
    // An autoscaler with a forecast, a fallback and a pause, so that their series are exported.
    let ahead = Outlook {
        forecast_demand: vec![("latency".into(), 12.0)],
        forecast_replicas: Some(4),
        fallback_active: Some(false),
        paused: Some(false),
    };
    let mut outcome = Outcome::of_decision(decision, &rule, true);
    outcome.conditions = vec![("AbleToScale", true), ("ScalingLimited", false)];
    outcome.ahead = Some(ahead);
    outcome.shadows = Some(vec![ShadowOutcome { name: "web-next".into(), replicas: 3, diverged: true }]);
    ledger.record("file/web", &labels, outcome);
    watermarkd::testing::render_all(&metrics)
}

fn exported() -> BTreeMap<String, Family> {
    let mut families = BTreeMap::new();
    parse_text(&registry_text(), &mut families);
    parse_text(&autoscaler_text(), &mut families);
    families
}

/// The family a queried series belongs to: itself, or the histogram of a `_bucket`, `_sum` or
/// `_count` series.
fn family_of<'a>(families: &'a BTreeMap<String, Family>, series: &str) -> Option<(&'a str, &'a Family)> {
    if let Some((name, family)) = families.get_key_value(series) {
        return Some((name, family));
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        let (name, family) = families.get_key_value(base)?;
        (family.kind == "histogram").then_some((name.as_str(), family))
    })
}

// ---------------------------------------------------------------------------------------------
// PromQL, as far as the dashboard needs it

/// Aggregation operators, keywords and binary operators written as words: identifiers that are
/// never series names.
const KEYWORDS: &str = "\
    sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio by \
    without on ignoring group_left group_right offset bool and or unless atan2 inf nan";

/// Keywords followed by a parenthesised list of label names.
const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// PromQL's functions; a call to anything else is a typo.
const FUNCTIONS: &str = "\
    abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp \
    clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg \
    delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile \
    histogram_stddev histogram_stdvar histogram_sum hour idelta increase irate label_join label_replace \
    last_over_time ln log10 log2 max_over_time min_over_time minute month pi predict_linear \
    present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_desc \
    sort_by_label sort_by_label_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time \
    timestamp vector year";

#[derive(Debug, PartialEq)]
struct Selector {
    series: String,
    /// (label, operator, value)
    matchers: Vec<(String, String, String)>,
}

#[derive(Debug, Default, PartialEq)]
struct Parsed {
    selectors: Vec<Selector>,
    /// Labels named in `by (...)`, `on (...)` and the like.
    grouping: Vec<String>,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The string literal starting at `chars[*i]` (a quote), unescaped; `*i` moves past it.
fn read_string(chars: &[char], i: &mut usize) -> String {
    let quote = chars[*i];
    *i += 1;
    let mut out = String::new();
    while let Some(&c) = chars.get(*i) {
        *i += 1;
        match c {
            '\\' if quote != '`' => {
                out.push(*chars.get(*i).expect("an escaped character"));
                *i += 1;
            }
            c if c == quote => return out,
            c => out.push(c),
        }
    }
    panic!("unterminated string");
}

fn skip_space(chars: &[char], i: &mut usize) {
    while chars.get(*i).is_some_and(|c| c.is_whitespace()) {
        *i += 1;
    }
}

fn read_ident(chars: &[char], i: &mut usize) -> String {
    let start = *i;
    while chars.get(*i).is_some_and(|c| is_ident(*c)) {
        *i += 1;
    }
    chars[start..*i].iter().collect()
}

/// The matchers of `{...}`, `*i` at the `{`.
fn read_matchers(expr: &str, chars: &[char], i: &mut usize) -> Vec<(String, String, String)> {
    *i += 1;
    let mut matchers = Vec::new();
    loop {
        skip_space(chars, i);
        match chars.get(*i) {
            Some('}') => {
                *i += 1;
                return matchers;
            }
            Some(',') => *i += 1,
            Some(c) if is_ident_start(*c) => {
                let label = read_ident(chars, i);
                skip_space(chars, i);
                let op: String = ["=~", "!~", "!=", "="]
                    .iter()
                    .find(|op| chars[*i..].iter().take(op.len()).copied().eq(op.chars()))
                    .unwrap_or_else(|| panic!("no matcher operator after {label} in {expr}"))
                    .to_string();
                *i += op.len();
                skip_space(chars, i);
                assert!(matches!(chars.get(*i), Some('"' | '\'' | '`')), "no quoted value after {label}{op} in {expr}");
                let value = read_string(chars, i);
                matchers.push((label, op, value));
            }
            other => panic!("unexpected {other:?} in the matchers of {expr}"),
        }
    }
}

/// The series selectors and grouping labels of one PromQL expression. Panics on what it does
/// not understand (a selector without a series name, an unknown function) so that the
/// dashboard stays within what this test can check.
fn parse_promql(expr: &str) -> Parsed {
    let chars: Vec<char> = expr.chars().collect();
    let mut parsed = Parsed::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while chars.get(i).is_some_and(|c| *c != '\n') {
                i += 1;
            }
        } else if matches!(c, '"' | '\'' | '`') {
            read_string(&chars, &mut i);
        } else if c == '[' {
            // A range or subquery: durations and Grafana's interval variables, no series.
            while chars.get(i).is_some_and(|c| *c != ']') {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            panic!("a selector without a series name in {expr}");
        } else if c == '$' {
            // A Grafana variable outside a range: `$name` or `${name}`.
            i += 1;
            if chars.get(i) == Some(&'{') {
                while chars.get(i).is_some_and(|c| *c != '}') {
                    i += 1;
                }
                i += 1;
            } else {
                read_ident(&chars, &mut i);
            }
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // Numbers, and durations after `offset` (`1h30m`).
            while chars.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let ident = read_ident(&chars, &mut i);
            let mut next = i;
            skip_space(&chars, &mut next);
            let lower = ident.to_ascii_lowercase();
            if GROUPING.contains(&lower.as_str()) {
                if chars.get(next) == Some(&'(') {
                    let close = next + chars[next..].iter().position(|c| *c == ')').expect("closing )");
                    let list: String = chars[next + 1..close].iter().collect();
                    parsed.grouping.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()).map(String::from));
                    i = close + 1;
                }
            } else if KEYWORDS.split_whitespace().any(|k| k == lower) {
                // An aggregation (called or before its `by`), or an operator word.
            } else if chars.get(next) == Some(&'(') {
                assert!(
                    FUNCTIONS.split_whitespace().any(|f| f == ident),
                    "unknown PromQL function {ident}() in {expr}"
                );
            } else {
                let matchers =
                    if chars.get(i) == Some(&'{') { read_matchers(expr, &chars, &mut i) } else { Vec::new() };
                parsed.selectors.push(Selector { series: ident, matchers });
            }
        } else {
            // Operators, parentheses, commas.
            i += 1;
        }
    }
    parsed
}

/// A templating query: the PromQL it runs, and the label whose values it lists, if any.
fn templating_query(query: &str) -> (String, Option<String>) {
    let query = query.trim();
    if let Some(inner) = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')) {
        return match inner.rsplit_once(',') {
            Some((selector, label)) if !label.contains('}') => (selector.to_string(), Some(label.trim().to_string())),
            _ => (String::new(), Some(inner.trim().to_string())),
        };
    }
    if let Some(inner) = query.strip_prefix("query_result(").and_then(|q| q.strip_suffix(')')) {
        return (inner.to_string(), None);
    }
    panic!("a templating query this test does not read: {query}");
}

/// `{{label}}` placeholders of a legend.
fn legend_labels(legend: &str) -> Vec<String> {
    legend.split("{{").skip(1).filter_map(|rest| rest.split_once("}}")).map(|(l, _)| l.trim().to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// The dashboard

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every panel, those inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

fn title(panel: &Value) -> &str {
    panel["title"].as_str().unwrap_or("(untitled)")
}

/// Checks one expression's series and labels against the exported families; returns the
/// families it queries.
fn check_expr<'a>(
    families: &'a BTreeMap<String, Family>,
    place: &str,
    expr: &str,
    legend: Option<&str>,
    problems: &mut Vec<String>,
) -> Vec<(&'a str, &'a Family, Selector)> {
    let parsed = parse_promql(expr);
    let mut queried = Vec::new();
    for selector in parsed.selectors {
        let Some((name, family)) = family_of(families, &selector.series) else {
            problems.push(format!("{place}: {} is not a series the daemon exports (in `{expr}`)", selector.series));
            continue;
        };
        for (label, ..) in &selector.matchers {
            let bucket_le = label == "le" && selector.series.ends_with("_bucket");
            if !family.labels.contains(label) && !SCRAPE_LABELS.contains(&label.as_str()) && !bucket_le {
                problems.push(format!("{place}: {name} has no label {label} (it has {:?})", family.labels));
            }
        }
        queried.push((name, family, selector));
    }
    // An aggregation or a legend may name a label of any series of the expression.
    let known: BTreeSet<&str> = queried
        .iter()
        .flat_map(|(_, family, _)| family.labels.iter().map(String::as_str))
        .chain(SCRAPE_LABELS.iter().copied())
        .collect();
    let legend = legend.map(legend_labels).unwrap_or_default();
    for label in parsed.grouping.iter().chain(&legend) {
        if !known.contains(label.as_str()) && !queried.is_empty() {
            problems.push(format!("{place}: no series of `{expr}` has the label {label}"));
        }
    }
    queried
}

#[test]
fn every_series_the_dashboard_queries_is_exported() {
    let families = exported();
    // The sources above must have produced what they stand for, or the checks below pass on
    // too little.
    for name in ["wpa_controller_value", "watermarkd_shadow_divergence_total", "watermarkd_leader"] {
        assert!(families.contains_key(name), "{name} missing from the exported set: {:?}", families.keys());
    }
    let dashboard = dashboard();
    let mut problems = Vec::new();
    let mut used: BTreeSet<&str> = BTreeSet::new();

    let variables = dashboard["templating"]["list"].as_array().expect("templating.list");
    for variable in variables {
        let name = variable["name"].as_str().expect("a variable name");
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"].as_str().or_else(|| variable["query"].as_str()).expect("a query");
        let place = format!("variable ${name}");
        if variable["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("{place}: datasource is {}, not ${{datasource}}", variable["datasource"]));
        }
        let (expr, label) = templating_query(query);
        let queried = check_expr(&families, &place, &expr, None, &mut problems);
        if let Some(label) = label {
            if !queried.iter().any(|(_, family, _)| family.labels.contains(&label)) {
                problems.push(format!("{place}: lists values of {label}, which {expr} does not have"));
            }
        }
        used.extend(queried.iter().map(|(name, ..)| *name));
    }

    for panel in panels(&dashboard) {
        if panel["type"] == "row" {
            continue;
        }
        let title = title(panel);
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("panel {title:?}: no targets"));
        }
        let mut per_autoscaler = Vec::new();
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            let place = format!("panel {title:?} target {}", target["refId"]);
            let queried = check_expr(&families, &place, expr, target["legendFormat"].as_str(), &mut problems);
            used.extend(queried.iter().map(|(name, ..)| *name));
            // The per-autoscaler families are the ones labelled with the autoscaler's name.
            per_autoscaler.extend(
                queried.into_iter().filter(|(_, family, _)| family.labels.contains("wpa_name")).map(|(.., s)| s),
            );
        }
        for selector in per_autoscaler {
            for (label, variable) in [("wpa_name", "$autoscaler"), ("wpa_namespace", "$namespace")] {
                let filtered = selector.matchers.iter().any(|(l, op, v)| l == label && op == "=~" && v == variable);
                if !filtered {
                    problems.push(format!(
                        "panel {title:?}: {} is not filtered on {label}=~\"{variable}\" ({:?})",
                        selector.series, selector.matchers
                    ));
                }
            }
        }
    }

    for name in REQUIRED {
        assert!(families.contains_key(*name), "REQUIRED names {name}, which the daemon does not export");
        if !used.contains(name) {
            problems.push(format!("no panel shows {name}"));
        }
    }
    assert!(problems.is_empty(), "{DASHBOARD}:\n{}", problems.join("\n"));
}

#[test]
fn panels_use_the_datasource_variable_and_unique_ids() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "watermarkd");
    let variables = dashboard["templating"]["list"].as_array().expect("templating.list");
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
    let datasource = variable("datasource").expect("a datasource variable");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    for name in ["namespace", "autoscaler"] {
        assert!(variable(name).is_some(), "no ${name} variable");
    }

    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = title(panel);
        let id = panel["id"].as_u64().unwrap_or_else(|| panic!("panel {title:?} has no numeric id"));
        assert!(ids.insert(id), "panel id {id} used twice (again by {title:?})");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {title:?}");
        assert_eq!(panel["datasource"]["type"], "prometheus", "panel {title:?}");
        for target in panel["targets"].as_array().into_iter().flatten() {
            // A target may leave the datasource to the panel; one it names must be the same.
            if let Some(own) = target.get("datasource") {
                assert_eq!(own["uid"], "${datasource}", "panel {title:?} target {}", target["refId"]);
            }
        }
    }
}

/// The PromQL reader, on what it must tell apart: functions, aggregations and their grouping
/// labels, matchers (with parentheses inside a value), ranges, offsets and variables.
#[test]
fn promql_reader_finds_series_and_labels() {
    let parsed = parse_promql(
        r#"histogram_quantile(0.99, sum by (le, backend) (rate(a_seconds_bucket{x="b(c)", y=~"$v"}[$__rate_interval])))
           / on (x) group_left (y) max without (z) (b_total offset 1h) * 60 and c:recorded"#,
    );
    let series: Vec<&str> = parsed.selectors.iter().map(|s| s.series.as_str()).collect();
    assert_eq!(series, ["a_seconds_bucket", "b_total", "c:recorded"]);
    assert_eq!(parsed.grouping, ["le", "backend", "x", "y", "z"]);
    assert_eq!(
        parsed.selectors[0].matchers,
        [("x".into(), "=".into(), "b(c)".into()), ("y".into(), "=~".into(), "$v".into())]
    );
    assert_eq!(
        templating_query(r#"label_values(m{a=~"$b"}, wpa_name)"#),
        (r#"m{a=~"$b"}"#.to_string(), Some("wpa_name".to_string()))
    );
    assert_eq!(legend_labels("{{wpa_name}} {{ metric_name }} high"), ["wpa_name", "metric_name"]);
    let families = exported();
    assert_eq!(
        family_of(&families, "watermarkd_backend_request_duration_seconds_bucket").map(|f| f.0),
        Some("watermarkd_backend_request_duration_seconds")
    );
    assert_eq!(
        family_of(&families, "watermarkd_evaluations_total_count").map(|f| f.0),
        None,
        "a counter has no _count series"
    );
}
