//! The fault matrix: `watermarkd run` (the real binary) against a real kube-apiserver, the
//! Datadog stand-in and a real Prometheus (behind a proxy that injects what a real Prometheus
//! cannot be made to answer), through every kind of backend fault at once, each on its own
//! autoscaler and Deployment in one namespace.
//!
//! Every autoscaler starts at 4 replicas with its metric inside the band (5..10), so it holds.
//! Then, all at once, every fault is switched on and every metric's true value goes to 30 (over
//! the band: 4 -> 6). The faults hide it: while they last, no faulty target may change (a misread
//! would scale: `tolerate_zero` is on, so a 0 scales down; the garbage, stale and extra series
//! values are outside the band), the daemon must show no value for them in /metrics, and the
//! healthy autoscalers whose queries share a batch (Datadog) or a backend (Prometheus) with the
//! faulty ones scale to 6 meanwhile. Then every fault clears, and each faulty target must reach
//! 6 within one interval (with the slack the observation needs), within one rate-limit wait
//! after its last 429 for a 429, and within `bad_query_retry` more for a 400. The forbidden
//! windows are 5 minutes, longer than the test, so a target that scaled wrongly could not hide it
//! by scaling back, and one that scaled rightly does not scale on.
//!
//! Every change of every Deployment is recorded from a watch on the API server, so "never
//! changed while the fault lasted" is every write, not a sample.
//!
//! The three 429s that carry no believable reset (no headers at all, negative numbers, a reset
//! beyond the period) wait the fallback minute by design, so the test takes about 80 s.
//! Needs kube-apiserver, etcd and prometheus: scripts/install-test-deps installs them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[macro_use]
#[path = "support/eventually.rs"]
mod eventually;
#[path = "support/daemon_process.rs"]
mod daemon_process;
#[path = "support/fake_datadog.rs"]
mod fake_datadog;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daemon_process::{write, DaemonProcess};
use fake_datadog::{Behavior, Budget, FakeDatadog, Fault, SeriesSpec};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use kube::runtime::watcher;
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use prometheus_server::{Exporter, Injected, PrometheusProxy, PrometheusServer, Reply};
use tokio::time::Instant;

/// Every autoscaler's interval.
const INTERVAL: Duration = Duration::from_secs(2);
/// From a decision to the test seeing its write (the scale, the watch event), on a loaded
/// 2-core machine. "Within one interval" is asserted as within `INTERVAL + SLACK`.
const SLACK: Duration = Duration::from_millis(1500);
/// Prometheus scrapes the exporter this often: a value it serves is queryable this much later.
const SCRAPE: Duration = Duration::from_secs(1);
/// `bad_query_retry` of the batched Datadog backend.
const BAD_QUERY_RETRY: Duration = Duration::from_secs(3);
/// How long every fault lasts: four intervals.
const FAULT_PHASE: Duration = Duration::from_secs(8);
/// The request timeout of every backend; the slow answers take longer.
const TIMEOUT_SECONDS: u64 = 1;
const SLOW: Duration = Duration::from_secs(5);
const STARTUP: Duration = Duration::from_secs(30);

const REPLICAS: i32 = 4;
/// 4 + 50 % (the default scale_up_limit_factor), from 30 against a high watermark of 10.
const SCALED: i64 = 6;
const IN_BAND: f64 = 8.0;
const OVER: f64 = 30.0;

const HEALTHY_DATADOG: &str = "dd-healthy";
const HEALTHY_PROMETHEUS: &str = "prom-healthy";

/// How one case's fault is made, and where its query goes.
enum FaultKind {
    /// A request-level fault of the case's own Datadog stand-in (its own backend).
    Datadog(Fault),
    /// A 429 from its own stand-in; nothing may be sent for `wait` after it.
    RateLimited { fault: Fault, wait: Duration },
    /// The case's own stand-in closes its port.
    DatadogRefused,
    /// The answer for the case's query in the batch it shares with `dd-healthy`.
    DatadogQuery(Behavior),
    /// Injected by the proxy for the case's query (the backend it shares with `prom-healthy`).
    Proxy(Injected),
    /// What the exporter serves for the case instead of one series, as real Prometheus answers
    /// it (same backend as `prom-healthy`).
    Exported(Vec<String>),
    /// The case's own proxy closes its port.
    PrometheusRefused,
}

struct Case {
    name: &'static str,
    fault: FaultKind,
    /// More lines for the metric (its `max_age`).
    metric_extra: &'static str,
}

impl Case {
    fn datadog(&self) -> bool {
        matches!(
            self.fault,
            FaultKind::Datadog(_)
                | FaultKind::RateLimited { .. }
                | FaultKind::DatadogRefused
                | FaultKind::DatadogQuery(_)
        )
    }

    /// Whether the case has a Datadog stand-in of its own.
    fn own_datadog(&self) -> bool {
        self.datadog() && !matches!(self.fault, FaultKind::DatadogQuery(_))
    }

    fn backend(&self) -> String {
        match self.fault {
            FaultKind::DatadogQuery(_) => "dd_batch".to_string(),
            FaultKind::Proxy(_) | FaultKind::Exported(_) => "prom".to_string(),
            FaultKind::PrometheusRefused => "prom_refused".to_string(),
            _ => self.name.replace('-', "_"),
        }
    }

    fn query(&self) -> String {
        query_of(self.name, self.datadog())
    }
}

fn query_of(name: &str, datadog: bool) -> String {
    if datadog {
        format!("avg:fault.load{{case:{name}}}")
    } else {
        format!("load{{case=\"{name}\"}}")
    }
}

fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// 30 everywhere but at the point a Cluster Agent would choose (the penultimate non-null one,
/// 60 s before the end), which is `token`.
fn one_bad_point(token: &str) -> Behavior {
    let points = [(120, "30"), (90, "30"), (60, token), (30, "30"), (0, "null")];
    Behavior::RawPoints { interval: 30, points: points.iter().map(|(ago, t)| (*ago, t.to_string())).collect() }
}

fn cases() -> Vec<Case> {
    let case = |name, fault| Case { name, fault, metric_extra: "" };
    let sane = |reset: &str| {
        headers(&[
            ("x-ratelimit-limit", "1000000"),
            ("x-ratelimit-period", "3600"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", reset),
            ("x-ratelimit-name", "query"),
        ])
    };
    let limited = |name, answer_headers, html, wait_seconds| {
        let fault = Fault::RateLimited { headers: answer_headers, html };
        case(name, FaultKind::RateLimited { fault, wait: secs(wait_seconds) })
    };
    let html = |status: u16, text: &str| Reply {
        status,
        content_type: "text/html",
        body: format!("<html><body><h1>{status} {text}</h1></body></html>"),
        delay: Duration::ZERO,
    };
    vec![
        // Datadog, faults of the whole request, each on a backend of its own.
        case("dd-500", FaultKind::Datadog(Fault::Status(500))),
        case("dd-502", FaultKind::Datadog(Fault::Status(502))),
        case("dd-503", FaultKind::Datadog(Fault::Status(503))),
        case("dd-slow", FaultKind::Datadog(Fault::Delay(SLOW))),
        case("dd-refused", FaultKind::DatadogRefused),
        case("dd-html-200", FaultKind::Datadog(Fault::Html)),
        case("dd-truncated-200", FaultKind::Datadog(Fault::Truncated)),
        case("dd-empty-200", FaultKind::Datadog(Fault::EmptyBody)),
        case("dd-status-error", FaultKind::Datadog(Fault::StatusError("Internal error processing the query".into()))),
        case("dd-403", FaultKind::Datadog(Fault::Forbidden)),
        // 429s: the wait is the reset when believable, else the period when under a minute,
        // else a minute.
        limited("dd-429", sane("4"), false, 4),
        limited("dd-429-html", sane("4"), true, 4),
        limited("dd-429-bare", Vec::new(), true, 60),
        limited(
            "dd-429-limit-0",
            headers(&[
                ("x-ratelimit-limit", "0"),
                ("x-ratelimit-period", "3600"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "4"),
            ]),
            false,
            4,
        ),
        limited(
            "dd-429-negative",
            headers(&[
                ("x-ratelimit-limit", "-1"),
                ("x-ratelimit-period", "-3600"),
                ("x-ratelimit-remaining", "-5"),
                ("x-ratelimit-reset", "-4"),
            ]),
            true,
            60,
        ),
        limited("dd-429-huge-reset", sane("999999999"), false, 60),
        limited(
            "dd-429-reset-0",
            headers(&[
                ("x-ratelimit-limit", "1000000"),
                ("x-ratelimit-period", "5"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "0"),
            ]),
            false,
            5,
        ),
        // Datadog, faults of one query in the batch it shares with dd-healthy.
        case("dd-no-data", FaultKind::DatadogQuery(Behavior::NoData)),
        case("dd-all-null", FaultKind::DatadogQuery(Behavior::Series(SeriesSpec::all_null()))),
        case("dd-nan", FaultKind::DatadogQuery(one_bad_point("NaN"))),
        case("dd-infinity", FaultKind::DatadogQuery(one_bad_point("Infinity"))),
        case("dd-1e999", FaultKind::DatadogQuery(one_bad_point("1e999"))),
        // Two series of 100 and more: either one would scale.
        case("dd-several", FaultKind::DatadogQuery(Behavior::Several(2))),
        // Points of 1 (under the band), 4 minutes old: past the default max_age of 2 minutes.
        case(
            "dd-stale",
            FaultKind::DatadogQuery(Behavior::Points {
                interval: 30,
                points: vec![(240, Some(1.0)), (210, Some(1.0))],
            }),
        ),
        case("dd-bad-query", FaultKind::DatadogQuery(Behavior::BadQuery)),
        // Prometheus, injected by the proxy for one query of the backend prom-healthy uses.
        case("prom-503", FaultKind::Proxy(Injected::Reply(html(503, "Service Unavailable")))),
        case("prom-429-html", FaultKind::Proxy(Injected::Reply(html(429, "Too Many Requests")))),
        case("prom-403", FaultKind::Proxy(Injected::Reply(Reply::text(403, "forbidden: tenant not allowed")))),
        case("prom-slow", FaultKind::Proxy(Injected::Slow(SLOW))),
        case("prom-html-200", FaultKind::Proxy(Injected::Reply(html(200, "Maintenance")))),
        case("prom-truncated-200", FaultKind::Proxy(Injected::Truncated)),
        case("prom-empty-200", FaultKind::Proxy(Injected::Reply(Reply::json(200, "")))),
        case(
            "prom-status-error",
            FaultKind::Proxy(Injected::Reply(Reply::json(
                200,
                r#"{"status":"error","errorType":"internal","error":"query processing failed"}"#,
            ))),
        ),
        case(
            "prom-bad-data-400",
            FaultKind::Proxy(Injected::Reply(Reply::json(
                400,
                r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected character"}"#,
            ))),
        ),
        // A sample of 1 dated 10 minutes back (a lagging replica), with max_age 30s.
        Case {
            name: "prom-old-sample",
            fault: FaultKind::Proxy(Injected::Old { age: Duration::from_secs(600), value: "1".into() }),
            metric_extra: "max_age = \"30s\"\n",
        },
        // Prometheus, real answers of the same backend.
        case("prom-nan", FaultKind::Exported(vec!["load{case=\"prom-nan\"} NaN".into()])),
        case("prom-inf", FaultKind::Exported(vec!["load{case=\"prom-inf\"} +Inf".into()])),
        case(
            "prom-several",
            FaultKind::Exported(vec![
                "load{case=\"prom-several\",replica=\"a\"} 30".into(),
                "load{case=\"prom-several\",replica=\"b\"} 2".into(),
            ]),
        ),
        // The series goes: Prometheus marks it stale and answers an empty vector.
        case("prom-stale", FaultKind::Exported(Vec::new())),
        case("prom-refused", FaultKind::PrometheusRefused),
    ]
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

fn autoscaler(namespace: &str, name: &str, backend: &str, query: &str, metric_extra: &str) -> String {
    format!(
        "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"Deployment\", namespace = \"{namespace}\", name = \"{name}\" }}\n\
         interval = \"{}s\"\nmin_replicas = 1\nmax_replicas = 10\ntolerate_zero = true\n\
         upscale_forbidden_window = \"300s\"\ndownscale_forbidden_window = \"300s\"\n\
         [[autoscaler.metric]]\nname = \"load\"\nbackend = \"{backend}\"\nquery = '{query}'\n\
         high_watermark = 10\nlow_watermark = 5\n{metric_extra}",
        INTERVAL.as_secs()
    )
}

fn datadog_backend(name: &str, url: &str) -> String {
    format!(
        "\n[backend.{name}]\ntype = \"datadog\"\nurl = \"{url}\"\napi_key_env = \"DD_API_KEY\"\napp_key_env = \"DD_APP_KEY\"\n\
         timeout = \"{TIMEOUT_SECONDS}s\"\nbad_query_retry = \"{}s\"\n",
        BAD_QUERY_RETRY.as_secs()
    )
}

fn prometheus_backend(name: &str, url: &str) -> String {
    format!(
        "\n[backend.{name}]\ntype = \"prometheus\"\nurl = \"{url}\"\ntimeout = \"{TIMEOUT_SECONDS}s\"\nmax_in_flight = 64\n"
    )
}

/// What the exporter serves: per case, its lines.
struct Exported {
    exporter: Exporter,
    lines: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Exported {
    fn set(&self, case: &str, lines: Vec<String>) {
        let mut all = self.lines.lock().expect("lines");
        all.insert(case.to_string(), lines);
        let text: String = all.values().flatten().map(|line| format!("{line}\n")).collect();
        self.exporter.set(&text);
    }

    fn set_value(&self, case: &str, value: f64) {
        self.set(case, vec![format!("{} {value}", query_of(case, false))]);
    }
}

/// Every value `spec.replicas` of each Deployment took, in order, with when the watch saw it.
type History = Arc<Mutex<HashMap<String, Vec<(Instant, i64)>>>>;

/// Records every change of `spec.replicas` in `namespace` until the task is aborted.
fn watch_replicas(cluster: &KubeCluster, namespace: &str) -> (History, tokio::task::JoinHandle<()>) {
    let history: History = Arc::new(Mutex::new(HashMap::new()));
    let api: Api<Deployment> = Api::namespaced(cluster.client(), namespace);
    let recorded = Arc::clone(&history);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = watermarkd::testing::next_event(&mut stream).await {
            let object = match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => object,
                _ => continue,
            };
            let name = object.metadata.name.clone().unwrap_or_default();
            let replicas = object.spec.as_ref().and_then(|s| s.replicas).map_or(-1, i64::from);
            let mut all = recorded.lock().expect("history");
            let values = all.entry(name).or_default();
            if values.last().map(|(_, r)| *r) != Some(replicas) {
                values.push((Instant::now(), replicas));
            }
        }
    });
    (history, task)
}

fn values_since(history: &History, name: &str, since: Instant) -> Vec<(Instant, i64)> {
    let all = history.lock().expect("history");
    all.get(name).map(|v| v.iter().filter(|(at, _)| *at >= since).copied().collect()).unwrap_or_default()
}

fn current(history: &History, name: &str) -> Option<i64> {
    history.lock().expect("history").get(name).and_then(|v| v.last()).map(|(_, r)| *r)
}

/// Datadog, Prometheus and the Kubernetes API through every fault at once; see the module
/// comment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_fault_holds_the_replicas_and_recovers_at_the_first_interval_after_it() {
    let started = Instant::now();
    let cases = cases();
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("faults").await;
    let mut names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    names.extend([HEALTHY_DATADOG, HEALTHY_PROMETHEUS]);
    let (history, watch) = watch_replicas(cluster, &ns);
    let mut creating = tokio::task::JoinSet::new();
    for name in &names {
        let (ns, name) = (ns.clone(), name.to_string());
        creating.spawn(async move {
            cluster.create_deployment(&ns, &name, REPLICAS).await;
            cluster.set_workload_status("Deployment", &ns, &name, REPLICAS, REPLICAS).await;
        });
    }
    while let Some(created) = creating.join_next().await {
        created.expect("create a Deployment");
    }

    // The backends. A budget so large that pacing never defers a cycle of these tests.
    let budget = Budget { limit: 1_000_000, period: Duration::from_secs(3_600), offset: Duration::ZERO };
    let batch = FakeDatadog::with_budget(budget).await;
    let mut own: HashMap<&str, FakeDatadog> = HashMap::new();
    for case in cases.iter().filter(|c| c.own_datadog()) {
        let fake = FakeDatadog::with_budget(budget).await;
        fake.set_default(Behavior::Series(SeriesSpec::constant(IN_BAND)));
        own.insert(case.name, fake);
    }
    for case in cases.iter().filter(|c| matches!(c.fault, FaultKind::DatadogQuery(_))) {
        batch.set(&case.query(), Behavior::Series(SeriesSpec::constant(IN_BAND)));
    }
    let healthy_datadog = query_of(HEALTHY_DATADOG, true);
    batch.set(&healthy_datadog, Behavior::Series(SeriesSpec::constant(IN_BAND)));
    let exported = Exported { exporter: Exporter::start("").await, lines: Mutex::new(BTreeMap::new()) };
    for case in cases.iter().filter(|c| !c.datadog()) {
        exported.set_value(case.name, IN_BAND);
    }
    exported.set_value(HEALTHY_PROMETHEUS, IN_BAND);
    let prometheus = PrometheusServer::start(&exported.exporter.target()).await;
    let proxy = PrometheusProxy::start(&prometheus.url()).await;
    let refusing_proxy = PrometheusProxy::start(&prometheus.url()).await;

    let mut rules = datadog_backend("dd_batch", &batch.url);
    for case in cases.iter().filter(|c| c.own_datadog()) {
        rules.push_str(&datadog_backend(&case.backend(), &own[case.name].url));
    }
    rules.push_str(&prometheus_backend("prom", &proxy.url()));
    rules.push_str(&prometheus_backend("prom_refused", &refusing_proxy.url()));
    for case in &cases {
        rules.push_str(&autoscaler(&ns, case.name, &case.backend(), &case.query(), case.metric_extra));
    }
    rules.push_str(&autoscaler(&ns, HEALTHY_DATADOG, "dd_batch", &healthy_datadog, ""));
    rules.push_str(&autoscaler(&ns, HEALTHY_PROMETHEUS, "prom", &query_of(HEALTHY_PROMETHEUS, false), ""));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    write(&config, &rules);
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let mut daemon = DaemonProcess::start(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "--no-leader-election",
            "--lease-namespace",
            &ns,
        ],
        &[("DD_API_KEY", fake_datadog::API_KEY), ("DD_APP_KEY", fake_datadog::APP_KEY)],
    );
    daemon.wait_ready(STARTUP).await;

    // Before the faults: every autoscaler reads 8 and holds at 4.
    eventually!(Duration::from_secs(30), "every autoscaler reads its metric before the faults", {
        let text = daemon.metrics().await;
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| daemon_process::sample_in(&text, "wpa_controller_value", &[("wpa_name", n)]) != Some(IN_BAND))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("no value of {IN_BAND} yet for {missing:?}"))
        }
    });
    for name in &names {
        assert_eq!(current(&history, name), Some(i64::from(REPLICAS)), "{name} held inside the band");
    }

    // The faults, all at once; every true value goes over the band.
    let arrivals_before: HashMap<&str, usize> = own.iter().map(|(name, fake)| (*name, fake.arrivals())).collect();
    let seen_before: HashMap<&str, usize> =
        cases.iter().filter(|c| !c.datadog()).map(|c| (c.name, proxy.seen(&c.query()))).collect();
    let fault_on = Instant::now();
    for case in &cases {
        let query = case.query();
        match &case.fault {
            FaultKind::Datadog(fault) | FaultKind::RateLimited { fault, .. } => {
                // The fault first: no answer may carry the new value before it.
                let fake = &own[case.name];
                fake.set_fault(Some(fault.clone()));
                fake.set_default(Behavior::Series(SeriesSpec::constant(OVER)));
            }
            FaultKind::DatadogRefused => {
                let fake = &own[case.name];
                fake.refuse_connections().await;
                fake.set_default(Behavior::Series(SeriesSpec::constant(OVER)));
            }
            FaultKind::DatadogQuery(behavior) => batch.set(&query, behavior.clone()),
            FaultKind::Proxy(injected) => {
                proxy.inject(&query, Some(injected.clone()));
                exported.set_value(case.name, OVER);
            }
            FaultKind::Exported(lines) => exported.set(case.name, lines.clone()),
            FaultKind::PrometheusRefused => {
                refusing_proxy.refuse_connections().await;
                exported.set_value(case.name, OVER);
            }
        }
    }
    batch.set(&healthy_datadog, Behavior::Series(SeriesSpec::constant(OVER)));
    exported.set_value(HEALTHY_PROMETHEUS, OVER);

    // While they last: the daemon asks, gets the fault, shows no value for the faulty
    // autoscalers, and the healthy ones next to them scale.
    eventually!(FAULT_PHASE, "the daemon sees every fault and the healthy autoscalers scale", {
        let text = daemon.metrics().await;
        let mut pending: Vec<String> = Vec::new();
        for case in &cases {
            if let Some(value) = daemon_process::sample_in(&text, "wpa_controller_value", &[("wpa_name", case.name)]) {
                pending.push(format!("{} still reads {value}", case.name));
            }
            let asked = match &case.fault {
                FaultKind::DatadogQuery(_) => true,
                FaultKind::DatadogRefused => {
                    let backend = case.backend();
                    let labels = [("backend", backend.as_str()), ("outcome", "transport")];
                    daemon_process::sample_in(&text, "watermarkd_backend_requests_total", &labels).is_some()
                }
                FaultKind::Datadog(_) | FaultKind::RateLimited { .. } => {
                    own[case.name].arrivals() > arrivals_before[case.name]
                }
                FaultKind::Proxy(_) => proxy.injected(&case.query()) > 0,
                FaultKind::Exported(_) => proxy.seen(&case.query()) > seen_before[case.name],
                FaultKind::PrometheusRefused => {
                    let labels = [("backend", "prom_refused"), ("outcome", "transport")];
                    daemon_process::sample_in(&text, "watermarkd_backend_requests_total", &labels).is_some()
                }
            };
            if !asked {
                pending.push(format!("{} not asked during its fault", case.name));
            }
        }
        for healthy in [HEALTHY_DATADOG, HEALTHY_PROMETHEUS] {
            if current(&history, healthy) != Some(SCALED) {
                pending.push(format!("{healthy} at {:?}", current(&history, healthy)));
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending.join("; "))
        }
    });
    // For the rest of the fault: every evaluation of a healthy autoscaler read its value, and
    // none of a faulty one did.
    let mut samples = 0;
    while Instant::now() < fault_on + FAULT_PHASE {
        let text = daemon.metrics().await;
        for healthy in [HEALTHY_DATADOG, HEALTHY_PROMETHEUS] {
            let value = daemon_process::sample_in(&text, "wpa_controller_value", &[("wpa_name", healthy)]);
            assert_eq!(value, Some(OVER), "{healthy} reads its value throughout the faults");
        }
        for case in &cases {
            let value = daemon_process::sample_in(&text, "wpa_controller_value", &[("wpa_name", case.name)]);
            assert_eq!(value, None, "{} shows no value while its fault lasts", case.name);
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(samples >= 2, "sampled the metrics {samples} times while the faults lasted");
    // The faulty queries were in the same requests as the healthy one (answered, or a 400 for
    // the whole batch that was then asked query by query).
    let log: Vec<_> = batch.log().into_iter().filter(|r| batch.started() + r.at >= fault_on).collect();
    let per_query: Vec<String> = cases
        .iter()
        .filter(|c| matches!(c.fault, FaultKind::DatadogQuery(ref b) if !matches!(b, Behavior::BadQuery)))
        .map(Case::query)
        .collect();
    assert!(
        log.iter().any(|r| r.status == 200
            && r.sub_queries.contains(&healthy_datadog)
            && per_query.iter().all(|q| r.sub_queries.contains(q))),
        "a batch carried the healthy query and every faulty one: {log:#?}"
    );
    let bad = query_of("dd-bad-query", true);
    assert!(
        log.iter().any(|r| r.status == 400 && r.sub_queries.contains(&healthy_datadog) && r.sub_queries.contains(&bad)),
        "the 400 came for a batch with the healthy query in it: {log:#?}"
    );
    for case in &cases {
        let changes = values_since(&history, case.name, fault_on);
        assert!(changes.is_empty(), "{} changed while its fault lasted: {changes:?}", case.name);
    }
    // A closed port is refused, not reset or timed out.
    let log = daemon.log();
    for refused in ["dd-refused", "prom-refused"] {
        let autoscaler = format!("autoscaler={refused} ");
        assert!(
            log.lines().any(|l| l.contains(&autoscaler) && l.contains("Connection refused")),
            "{refused} held because the connection was refused"
        );
    }

    // The faults clear.
    let fault_off = Instant::now();
    for case in &cases {
        let query = case.query();
        match &case.fault {
            FaultKind::Datadog(_) | FaultKind::RateLimited { .. } => own[case.name].set_fault(None),
            FaultKind::DatadogRefused => own[case.name].accept_connections().await,
            FaultKind::DatadogQuery(_) => batch.set(&query, Behavior::Series(SeriesSpec::constant(OVER))),
            FaultKind::Proxy(_) => proxy.inject(&query, None),
            FaultKind::Exported(_) => exported.set_value(case.name, OVER),
            FaultKind::PrometheusRefused => refusing_proxy.accept_connections().await,
        }
    }

    // Each reaches 6 by its bound: the first decision after the fault is right.
    let last_429 = |name: &str| {
        let fake = &own[name];
        fake.log().iter().filter(|r| r.status == 429).map(|r| fake.started() + r.at).max()
    };
    let bound = |case: &Case| -> (Instant, Duration) {
        match &case.fault {
            FaultKind::RateLimited { wait, .. } => {
                let last = last_429(case.name).unwrap_or_else(|| panic!("{}: no 429 was answered", case.name));
                (fault_off.max(last + *wait), INTERVAL + SLACK)
            }
            FaultKind::DatadogQuery(Behavior::BadQuery) => (fault_off, BAD_QUERY_RETRY + INTERVAL + SLACK),
            FaultKind::Exported(_) => (fault_off, SCRAPE + INTERVAL + SLACK),
            _ => (fault_off, INTERVAL + SLACK),
        }
    };
    let longest = cases.iter().map(|c| {
        let (from, within) = bound(c);
        from + within
    });
    let give_up = longest.max().expect("cases") + Duration::from_secs(5);
    let mut recovered: BTreeMap<&str, Instant> = BTreeMap::new();
    while recovered.len() < cases.len() && Instant::now() < give_up {
        for case in &cases {
            if recovered.contains_key(case.name) {
                continue;
            }
            if let Some((at, _)) = values_since(&history, case.name, fault_off).first() {
                recovered.insert(case.name, *at);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A settled second more: nothing scales on from 6 (the windows are 5 minutes).
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut report = String::new();
    let mut failures = Vec::new();
    for case in &cases {
        let (from, within) = bound(case);
        let changes = values_since(&history, case.name, fault_on);
        let values: Vec<i64> = changes.iter().map(|(_, r)| *r).collect();
        match recovered.get(case.name) {
            Some(at) => {
                let after_clear = at.saturating_duration_since(fault_off);
                let late = at.saturating_duration_since(from);
                report.push_str(&format!(
                    "{:<20} {:>6.1}s after the fault cleared ({:>4.1}s after it could; bound {:.1}s)\n",
                    case.name,
                    after_clear.as_secs_f64(),
                    late.as_secs_f64(),
                    within.as_secs_f64()
                ));
                if late > within {
                    failures.push(format!("{}: recovered {late:?} after it could, bound {within:?}", case.name));
                }
            }
            None => failures.push(format!("{}: never recovered", case.name)),
        }
        if values != [SCALED] {
            failures.push(format!("{}: replicas since the fault {values:?}, expected only [{SCALED}]", case.name));
        }
    }
    for healthy in [HEALTHY_DATADOG, HEALTHY_PROMETHEUS] {
        let values: Vec<i64> = values_since(&history, healthy, fault_on).iter().map(|(_, r)| *r).collect();
        if values != [SCALED] {
            failures.push(format!("{healthy}: replicas since the faults {values:?}, expected only [{SCALED}]"));
        }
    }

    // After a 429, nothing was sent before its wait was over.
    for case in &cases {
        let FaultKind::RateLimited { wait, .. } = &case.fault else { continue };
        let log = own[case.name].log();
        for pair in log.windows(2) {
            let gap = pair[1].at.saturating_sub(pair[0].at);
            if pair[0].status == 429 && gap + Duration::from_millis(200) < *wait {
                failures.push(format!(
                    "{}: a request {gap:?} after a 429 whose wait is {wait:?}: {:?}",
                    case.name,
                    log.iter().map(|r| (r.at, r.status)).collect::<Vec<_>>()
                ));
            }
        }
    }
    // Nothing stalled: no autoscaler's evaluation ran into its next turn.
    let skipped = daemon.sample("watermarkd_evaluations_total", &[("result", "skipped")]).await;
    if skipped.unwrap_or(0.0) > 0.0 {
        failures.push(format!("{skipped:?} evaluations skipped because the previous one still ran"));
    }
    eprintln!("recovery after each fault (interval {INTERVAL:?}):\n{report}");
    assert!(failures.is_empty(), "{}\n{report}", failures.join("\n"));
    watch.abort();
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM");
    eprintln!("fault matrix: {:?} in all", started.elapsed());
}
