//! Dashboard and monitor parity: every series the Datadog WPA controller exports, with its
//! type and exactly its label names (plus the `dry_run` label users' dashboards filter on), is
//! in what `/metrics` serves, read over HTTP from the daemon's telemetry server after
//! evaluations have been observed.

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
use std::net::SocketAddr;
use std::sync::Arc;

use prometheus::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use watermarkd::adapters::listener::{serve, ListenerLimits};
use watermarkd::adapters::telemetry::{self, AutoscalerMetrics, HttpClientMetrics, LabelsAsTags, SeriesLabels};
use watermarkd::domain::crd;
use watermarkd::domain::outcome::{Identity, Ledger, Outcome, ScaleWrite};
use watermarkd_engine::{decide, Reading, State, Target, Timestamp};

/// The per-autoscaler labels of the Datadog controller (`defaultPromLabels`).
const DEFAULT: &[&str] =
    &["wpa_name", "wpa_namespace", "resource_namespace", "resource_name", "resource_kind", "target_name", "namespace"];

/// Labels watermarkd adds to every per-autoscaler series (every one with `DEFAULT`): the
/// Datadog controller has no `dry_run` label, but users' dashboards filter on one.
const ADDED: &[&str] = &["dry_run"];

/// One series of the Datadog controller: name, type, labels beyond `DEFAULT` (or all of its
/// labels when `with_default` is false: then `ADDED` is not required either).
struct Series {
    name: &'static str,
    kind: &'static str,
    with_default: bool,
    extra: &'static [&'static str],
}

const fn series(name: &'static str, kind: &'static str, extra: &'static [&'static str]) -> Series {
    Series { name, kind, with_default: true, extra }
}

/// The label set Datadog's labels-as-tags uses for the test (`DD_LABELS_AS_TAGS="team"`).
const TAG: &str = "team";

/// The Datadog controller's series, written out from DataDog/watermarkpodautoscaler,
/// controllers/datadoghq/metrics.go (commit 0159910e8cc2387081950368d63937c135e82d18: the
/// version whose `defaultPromLabels` has `target_name` and `namespace`), the `var (...)` block
/// of `prometheus.NewGaugeVec`/`NewCounterVec` registered in its `init()`.
const DATADOG: &[Series] = &[
    series("wpa_controller_upscale_replicas_total", "counter", &[]),
    series("wpa_controller_downscale_replicas_total", "counter", &[]),
    series("wpa_controller_value", "gauge", &["metric_name"]),
    series("wpa_controller_high_watermak", "gauge", &["metric_name"]),
    series("wpa_controller_high_watermark", "gauge", &["metric_name"]),
    series("wpa_controller_low_watermak", "gauge", &["metric_name"]),
    series("wpa_controller_low_watermark", "gauge", &["metric_name"]),
    series("wpa_controller_replicas_scaling_proposal", "gauge", &["metric_name"]),
    series("wpa_controller_replicas_scaling_effective", "gauge", &[]),
    series("wpa_controller_restricted_scaling", "gauge", &["reason"]),
    series("wpa_controller_transition_countdown", "gauge", &["transition"]),
    series("wpa_controller_min_replicas", "gauge", &[]),
    series("wpa_controller_max_replicas", "gauge", &[]),
    series("wpa_controller_dry_run", "gauge", &[]),
    series("wpa_controller_scaling_active", "gauge", &[]),
    series("wpa_controller_conditions", "gauge", &["condition"]),
    // `append(extraPromLabels, wpa_name, wpa_namespace, resource_namespace, namespace)`, the
    // extra labels being the `DD_LABELS_AS_TAGS` keys under their own names.
    Series {
        name: "wpa_controller_labels_info",
        kind: "gauge",
        with_default: false,
        extra: &[TAG, "wpa_name", "wpa_namespace", "resource_namespace", "namespace"],
    },
];

/// Series of the same file that watermarkd does not export, and why. The test fails if one of
/// them shows up without being moved to `DATADOG`, or if `DATADOG` and this list overlap.
const NOT_APPLICABLE: &[(&str, &str)] = &[(
    "wpa_controller_lifecycle_control_status",
    "lifecycle control (a DatadogMonitor gating the WPA, annotation wpa.datadoghq.com/lifecycle-control.enabled) is \
         not supported",
)];

/// The Datadog controller's series about its recommender HTTP client (same file): name, type
/// and labels. They are not per autoscaler; `client` is the recommender's URL.
const HTTP_CLIENT: &[(&str, &str, &[&str])] = &[
    ("http_client_request_duration_seconds", "histogram", &["client", "method", "code"]),
    ("http_client_requests_total", "counter", &["client", "method", "code"]),
    ("http_client_requests_errors_total", "counter", &["client"]),
    ("http_client_requests_inflight", "gauge", &["client"]),
];

/// Label values the Datadog controller's dashboards filter on: `reasonValues`, the transitions
/// its `shouldScale` sets, and `trackedConditions` (less `scaling_blocked`, lifecycle control's).
const VALUES: &[(&str, &str, &[&str])] = &[
    ("wpa_controller_restricted_scaling", "reason", &["downscale_capping", "upscale_capping", "within_bounds"]),
    ("wpa_controller_transition_countdown", "transition", &["downscale", "upscale"]),
    ("wpa_controller_conditions", "condition", &["able_to_scale", "scaling_limited"]),
];

/// One sample line: name and labels (values unescaped enough to compare plain ones).
fn parse_sample(line: &str) -> (String, BTreeMap<String, String>) {
    let Some((name, rest)) = line.split_once('{') else {
        let name = line.split_whitespace().next().unwrap_or_default();
        return (name.to_string(), BTreeMap::new());
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        let label: String = chars.by_ref().take_while(|c| *c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "a quoted value after {label} in {line}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => panic!("dangling escape in {line}"),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        assert!(labels.insert(label.clone(), value).is_none(), "label {label} twice in {line}");
        match chars.next() {
            Some(',') => continue,
            Some('}') => break,
            other => panic!("unexpected {other:?} in {line}"),
        }
    }
    (name.to_string(), labels)
}

async fn get_metrics(address: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await.expect("request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("response");
    let response = String::from_utf8(response).expect("utf-8");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let (_, body) = response.split_once("\r\n\r\n").expect("a body");
    // Chunked transfer encoding: drop the chunk-size lines (hex only), keep the text.
    body.lines().filter(|l| l.is_empty() || !l.chars().all(|c| c.is_ascii_hexdigit())).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn every_datadog_controller_series_and_label_is_served() {
    let overlap: Vec<_> = NOT_APPLICABLE.iter().filter(|(n, _)| DATADOG.iter().any(|s| s.name == *n)).collect();
    assert!(overlap.is_empty(), "both required and not applicable: {overlap:?}");

    let tags = LabelsAsTags::new(&[TAG]).expect("valid");
    let ledger = Arc::new(Ledger::new(std::time::Duration::ZERO));
    let metrics = Arc::new(AutoscalerMetrics::new(Arc::clone(&ledger), tags));
    // Two autoscalers, one that scales and one that only reports, so both values of `dry_run`
    // are checked: (wpa_name, namespace, target, team label, dry_run).
    let autoscalers =
        [("web", "prod", "web-deploy", "payments", false), ("batch", "jobs", "batch-deploy", "data", true)];
    let now = Timestamp::from_unix_millis(1_700_000_000_000);
    let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
    for (name, namespace, target_name, team, dry_run) in autoscalers {
        let object_labels: BTreeMap<String, String> =
            [(TAG.to_string(), team.to_string()), ("other".to_string(), "x".to_string())].into_iter().collect();
        let labels = std::sync::Arc::new(SeriesLabels {
            wpa_name: name.into(),
            wpa_namespace: namespace.into(),
            resource_name: target_name.into(),
            resource_namespace: namespace.into(),
            resource_kind: "Deployment".into(),
            tags: metrics.tags(Some(&object_labels)),
            dry_run,
        });
        let rule = watermarkd::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "dry_run": dry_run,
            "metric": [{ "name": "latency", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .expect("rule");
        let decision = decide(&rule, target, &[Reading::Value { value: 30.0, at: now }], &State::default(), now);
        // The conditions as the daemon derives them for the metrics and a WPA's status.
        let conditions = crd::conditions(&decision, &ScaleWrite::Succeeded);
        // As the scheduler does for a running autoscaler, before its evaluations report.
        let id = format!("crd/{namespace}/{name}");
        ledger.admit(Identity {
            id: id.as_str().into(),
            labels: Arc::clone(&labels),
            source: "crd",
            interval_seconds: 15,
            paused_until: None,
            backends: Vec::new(),
            shadows: Vec::new(),
            min_replicas: 1,
            max_replicas: 10,
        });
        let mut outcome = Outcome::of_decision(decision, &rule, true);
        outcome.conditions = conditions;
        ledger.record(&id, &labels, outcome);
    }

    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let address: SocketAddr = "127.0.0.1:0".parse().expect("address");
    // The recommender client's series, on the daemon's registry as `run` registers them, after
    // one answered request, one that got no answer, and one still waiting.
    let registry = Registry::new();
    let http = HttpClientMetrics::new(&registry).expect("register");
    http.response("https://recommender.test/recommend", "POST", 200, 0.05);
    http.error("https://recommender.test/recommend");
    let _waiting = http.in_flight("https://recommender.test/recommend");
    let routes = telemetry::routes(registry, Arc::clone(&metrics));
    let (bound, _server) = serve(address, ListenerLimits::default(), routes, stop).await.expect("serve");
    let text = get_metrics(bound).await;

    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    // The `wpa_controller_dry_run` gauge per value of the `dry_run` label.
    let mut dry_run_gauge: Vec<(Option<String>, String)> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            types.insert(name.into(), kind.into());
        } else if !line.starts_with('#') {
            let (name, labels) = parse_sample(line);
            if name == "wpa_controller_dry_run" {
                let value = line.rsplit_once(' ').map(|(_, v)| v.to_string()).unwrap_or_default();
                dry_run_gauge.push((labels.get("dry_run").cloned(), value));
            }
            samples.entry(name).or_default().push(labels);
        }
    }

    let mut missing = Vec::new();
    for (name, kind, labels) in HTTP_CLIENT {
        // A histogram's samples are its `_bucket`s (with `le`), `_sum` and `_count`.
        let sample = if *kind == "histogram" { format!("{name}_count") } else { name.to_string() };
        let want: BTreeSet<&str> = labels.iter().copied().collect();
        match (types.get(*name), samples.get(&sample)) {
            (Some(k), Some(found)) if k == kind => {
                for labels in found {
                    let have: BTreeSet<&str> = labels.keys().map(String::as_str).collect();
                    if have != want {
                        missing.push(format!("{name}: labels {have:?}, the Datadog controller's are {want:?}"));
                    }
                }
            }
            (found, _) => {
                missing.push(format!("{name}: type {found:?} or no sample, the Datadog controller's is {kind}"))
            }
        }
    }
    for s in DATADOG {
        let mut want: BTreeSet<&str> = s.extra.iter().copied().collect();
        if s.with_default {
            want.extend(DEFAULT);
            want.extend(ADDED);
        }
        match (types.get(s.name), samples.get(s.name)) {
            (None, _) | (_, None) => missing.push(format!("{}: not exported", s.name)),
            (Some(kind), Some(found)) => {
                if kind != s.kind {
                    missing.push(format!("{}: type {kind}, the Datadog controller's is {}", s.name, s.kind));
                }
                for labels in found {
                    let have: BTreeSet<&str> = labels.keys().map(String::as_str).collect();
                    if have != want {
                        missing.push(format!("{}: labels {have:?}, wanted {want:?}", s.name));
                    }
                    let wpa = labels.get("wpa_name").map(String::as_str);
                    let Some((_, namespace, target_name, team, dry_run)) =
                        autoscalers.iter().find(|a| Some(a.0) == wpa)
                    else {
                        missing.push(format!("{}: a sample of no autoscaler: {labels:?}", s.name));
                        continue;
                    };
                    let dry_run = if *dry_run { "true" } else { "false" };
                    for (name, value) in
                        [("target_name", *target_name), ("namespace", *namespace), (TAG, *team), ("dry_run", dry_run)]
                    {
                        if want.contains(name) && labels.get(name).map(String::as_str) != Some(value) {
                            missing.push(format!("{}: {name} is {:?}, not {value:?}", s.name, labels.get(name)));
                        }
                    }
                }
                // Every series is there for each autoscaler, whichever its `dry_run`.
                for (name, ..) in autoscalers {
                    if !found.iter().any(|l| l.get("wpa_name").map(String::as_str) == Some(name)) {
                        missing.push(format!("{}: no sample for {name}", s.name));
                    }
                }
            }
        }
    }
    for (name, label, values) in VALUES {
        let found: BTreeSet<&str> =
            samples.get(*name).into_iter().flatten().filter_map(|l| l.get(*label)).map(String::as_str).collect();
        for value in *values {
            if !found.contains(value) {
                missing.push(format!("{name}: no sample with {label}={value:?} (found {found:?})"));
            }
        }
    }
    assert!(
        samples.get("wpa_controller_labels_info").is_some_and(|s| s.len() == autoscalers.len()),
        "one info series per autoscaler"
    );
    // The label and the gauge say the same.
    dry_run_gauge.sort();
    assert_eq!(
        dry_run_gauge,
        vec![(Some("false".to_string()), "0".to_string()), (Some("true".to_string()), "1".to_string())],
        "wpa_controller_dry_run per dry_run label"
    );
    for (name, why) in NOT_APPLICABLE {
        assert!(!samples.contains_key(*name), "{name} is exported now: move it to DATADOG (was: {why})");
    }
    assert!(
        missing.is_empty(),
        "watermarkd lacks what the Datadog controller exports (with dry_run):\n{}\n\n{text}",
        missing.join("\n")
    );
}
