//! `watermarkd query` as a person runs it: the real binary, a rules file, and a real Prometheus
//! scraping an exporter this test controls.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/fake_datadog.rs"]
mod fake_datadog;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fake_datadog::{Behavior, FakeDatadog, SeriesSpec};
use prometheus_server::{Exporter, PrometheusServer};
use watermarkd::adapters::backend::prometheus::PrometheusClient;
use watermarkd::adapters::backend::MetricQuery;
use watermarkd::adapters::telemetry::BackendMetrics;
use watermarkd::domain::rules::{load_rules, Backend};
use watermarkd_engine::{Reading, Timestamp};

fn rules(url: &str) -> String {
    format!(
        r#"
[backend.prom]
type = "prometheus"
url = "{url}"

[[autoscaler]]
name = "queue"
target = {{ kind = "Deployment", namespace = "jobs", name = "worker" }}
max_replicas = 10

[[autoscaler.metric]]
name = "depth"
backend = "prom"
query = "wm_query_queue_depth"
high_watermark = 100
low_watermark = 20

[[autoscaler]]
name = "ghost"
target = {{ kind = "Deployment", namespace = "jobs", name = "ghost" }}
max_replicas = 10

[[autoscaler.metric]]
name = "missing"
backend = "prom"
query = "wm_query_no_such_series"
high_watermark = 1
"#
    )
}

fn watermarkd_query(config: &std::path::Path, autoscaler: Option<&str>) -> (i32, String) {
    watermarkd_query_env(config, autoscaler, &[])
}

fn watermarkd_query_env(config: &std::path::Path, autoscaler: Option<&str>, env: &[(&str, &str)]) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_watermarkd"));
    command.envs(env.iter().copied());
    command.arg("query").arg("--config").arg(config);
    if let Some(name) = autoscaler {
        command.args(["--autoscaler", name]);
    }
    let out = command.output().expect("run watermarkd query");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_shows_what_prometheus_answers_now() {
    let exporter = Exporter::start("wm_query_queue_depth 250\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    std::fs::write(&config, rules(&prometheus.url())).unwrap();

    // Wait until Prometheus has scraped the exporter once.
    let parsed = load_rules(&config).unwrap();
    let Backend::Prometheus(backend) = &parsed.backends["prom"] else { panic!("prometheus backend") };
    let client = PrometheusClient::new("prom", backend, Arc::new(BackendMetrics::detached())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let query = MetricQuery { query: "wm_query_queue_depth".into(), reducer: None };
    loop {
        let now = Timestamp::from_system_time(SystemTime::now());
        let answer = client
            .evaluate(std::slice::from_ref(&query), now, tokio::time::Instant::now() + client.timeout() * 2)
            .await;
        if matches!(answer[0].reading, Reading::Value { .. }) {
            break;
        }
        assert!(Instant::now() < deadline, "Prometheus never scraped the exporter:\n{}", prometheus.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (code, out) = watermarkd_query(&config, Some("queue"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("queue\n  depth via prom: wm_query_queue_depth"), "{out}");
    assert!(out.contains("    value 250 at "), "{out}");
    assert!(out.contains("watermarks 20..100: above the band"), "{out}");
    assert!(!out.contains("ghost"), "{out}");

    // All autoscalers: the missing series is reported as no data and the exit code says so.
    let (code, out) = watermarkd_query(&config, None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("ghost\n  missing via prom: wm_query_no_such_series\n    unavailable: no data"), "{out}");

    // A value change shows on the next run.
    exporter.set("wm_query_queue_depth 50\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out) = watermarkd_query(&config, Some("queue"));
        if out.contains("value 50 at") {
            assert!(out.contains("inside the band"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "the new value never showed:\n{out}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let (code, out) = watermarkd_query(&config, Some("nope"));
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no autoscaler named \"nope\"") && out.contains("queue, ghost"), "{out}");

    // A forecast reads its history as the daemon would, and says it has too little of it.
    let forecast = rules(&prometheus.url()).replacen(
        "max_replicas = 10\n",
        "max_replicas = 10\nalgorithm = \"average\"\n[autoscaler.forecast]\nlead_time = \"10m\"\n",
        1,
    );
    std::fs::write(&config, forecast).unwrap();
    let (_, out) = watermarkd_query(&config, Some("queue"));
    assert!(out.contains("  forecast 10m ahead for depth (observed only): "), "{out}");
    assert!(out.contains("no history") || out.contains("too little history"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_shows_which_datadog_point_was_chosen_and_the_budget() {
    let fake = FakeDatadog::start().await;
    // Dense 30 s buckets, the newest still empty: the penultimate non-null point is chosen.
    fake.set("avg:trace.http.request.duration{service:billing}.rollup(30)", Behavior::Series(SeriesSpec::default()));
    fake.set("avg:nothing{*}", Behavior::NoData);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[backend.dd]
type = "datadog"
url = "{url}"
api_key_env = "WM_TEST_DD_API_KEY"
app_key_env = "WM_TEST_DD_APP_KEY"

[[autoscaler]]
name = "billing"
target = {{ kind = "Deployment", namespace = "prod", name = "billing" }}
max_replicas = 10

[[autoscaler.metric]]
name = "latency"
backend = "dd"
query = "avg:trace.http.request.duration{{service:billing}}.rollup(30)"
high_watermark = 400
low_watermark = 50

[[autoscaler.metric]]
name = "empty"
backend = "dd"
query = "avg:nothing{{*}}"
high_watermark = 1
"#,
            url = fake.url
        ),
    )
    .unwrap();
    let keys = [("WM_TEST_DD_API_KEY", fake_datadog::API_KEY), ("WM_TEST_DD_APP_KEY", fake_datadog::APP_KEY)];
    let (code, out) = watermarkd_query_env(&config, None, &keys);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("latency via dd: avg:trace.http.request.duration{service:billing}.rollup(30)"), "{out}");
    // The penultimate non-null bucket: point N-1 of N (N depends on where now falls in a bucket).
    let line = out.lines().find(|l| l.contains("non-null")).unwrap_or_else(|| panic!("no point line: {out}"));
    let numbers: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    assert_eq!(numbers.len(), 4, "{line}");
    let (series, chosen, points, rollup) = (numbers[0], numbers[1], numbers[2], numbers[3]);
    assert_eq!((series, chosen, rollup), (1, points - 1, 30), "{line}");
    assert!(out.contains("empty via dd: avg:nothing{*}\n    unavailable: no data"), "{out}");
    assert!(out.contains("backend dd: Datadog rate limit "), "{out}");
    assert_eq!(fake.requests(), 1, "both metrics in one request");
    for (_, key) in keys {
        assert!(!out.contains(key), "a key was printed: {out}");
    }

    // Without the keys in the environment: a clear error naming the variable, exit 2.
    let (code, out) = watermarkd_query_env(&config, None, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("environment variable WM_TEST_DD_API_KEY is not set"), "{out}");
}

/// The plan: which autoscalers share which request, and which are folded into a grouped query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_shows_which_autoscalers_share_a_grouped_query() {
    let fake = FakeDatadog::start().await;
    let mut text = format!(
        "[backend.dd]\ntype = \"datadog\"\nurl = \"{}\"\napi_key_env = \"WM_TEST_DD_API_KEY\"\napp_key_env = \"WM_TEST_DD_APP_KEY\"\n",
        fake.url
    );
    let queries = [
        ("web-a", "avg:nginx.requests{env:prod,app:web-a}"),
        ("web-b", "avg:nginx.requests{env:prod,app:web-b}"),
        ("top", "top(avg:nginx.requests{env:prod} by {app}, 1, 'mean', 'desc')"),
    ];
    for (i, (name, query)) in queries.iter().enumerate() {
        fake.set(
            query,
            Behavior::Series(SeriesSpec { trailing_nulls: 0, ..SeriesSpec::constant(10.0 * (i + 1) as f64) }),
        );
        text.push_str(&format!(
            "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"Deployment\", namespace = \"prod\", name = \"{name}\" }}\n\
             max_replicas = 10\n[[autoscaler.metric]]\nname = \"rps\"\nbackend = \"dd\"\nquery = \"{query}\"\nhigh_watermark = 100\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    std::fs::write(&config, text).unwrap();
    let keys = [("WM_TEST_DD_API_KEY", fake_datadog::API_KEY), ("WM_TEST_DD_APP_KEY", fake_datadog::APP_KEY)];
    let (code, out) = watermarkd_query_env(&config, None, &keys);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("backend dd: 1 request(s) for 3 queries (2 folded into 1 grouped queries, 1 sent as they are)"),
        "{out}"
    );
    assert!(
        out.contains(
            "    grouped: avg:nginx.requests{env:prod AND app IN (web-a, web-b)} by {app}\n      for web-a (rps), web-b (rps)"
        ),
        "{out}"
    );
    assert!(
        out.contains("    as is: top(avg:nginx.requests{env:prod} by {app}, 1, 'mean', 'desc')\n      for top (rps)"),
        "{out}"
    );
    // Each member has its own group's value.
    assert!(out.contains("web-a\n  rps via dd: avg:nginx.requests{env:prod,app:web-a}\n    value 10 "), "{out}");
    assert!(out.contains("web-b\n  rps via dd: avg:nginx.requests{env:prod,app:web-b}\n    value 20 "), "{out}");
    assert_eq!(fake.requests(), 1, "one request for all three");
}

/// A metric's own `max_age` is the daemon's staleness rule, and `query` applies the same one:
/// a point the daemon would refuse is not shown as usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_refuses_a_point_older_than_the_metrics_max_age() {
    let fake = FakeDatadog::start().await;
    // Two 10 s buckets, 60 s and 40 s before now: the penultimate one (60 s old) is chosen,
    // well within the backend's own bound (120 s) but past the metric's 30 s.
    fake.set("avg:old{*}", Behavior::Points { interval: 10, points: vec![(60, Some(5.0)), (40, Some(6.0))] });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    let rules = |max_age: &str| {
        format!(
            "[backend.dd]\ntype = \"datadog\"\nurl = \"{url}\"\napi_key_env = \"WM_TEST_DD_API_KEY\"\n\
             app_key_env = \"WM_TEST_DD_APP_KEY\"\n\n[[autoscaler]]\nname = \"old\"\n\
             target = {{ kind = \"Deployment\", namespace = \"prod\", name = \"old\" }}\nmax_replicas = 10\n\n\
             [[autoscaler.metric]]\nname = \"aged\"\nbackend = \"dd\"\nquery = \"avg:old{{*}}\"\n\
             high_watermark = 10\n{max_age}\n",
            url = fake.url
        )
    };
    let keys = [("WM_TEST_DD_API_KEY", fake_datadog::API_KEY), ("WM_TEST_DD_APP_KEY", fake_datadog::APP_KEY)];
    std::fs::write(&config, rules("max_age = \"30s\"")).unwrap();
    let (code, out) = watermarkd_query_env(&config, None, &keys);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("    unavailable: stale: the data point is 6"), "{out}");
    assert!(out.contains("max_age is 30s (value 5 at "), "{out}");
    assert!(!out.contains("    value 5 at"), "shown as usable: {out}");

    // Without the metric's bound the same point is usable.
    std::fs::write(&config, rules("")).unwrap();
    let (code, out) = watermarkd_query_env(&config, None, &keys);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("    value 5 at "), "{out}");
}

#[test]
fn query_names_a_recommender_without_asking_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    std::fs::write(
        &config,
        r#"
[[autoscaler]]
name = "web"
target = { kind = "Deployment", namespace = "prod", name = "web" }
max_replicas = 10
recommender = { url = "https://ops:hunter2@127.0.0.1:1/recommend", target_type = "cpu", high_watermark = 1 }
"#,
    )
    .expect("write rules");
    let (code, out) = watermarkd_query(&config, None);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        "web\n  recommender{targetType:cpu}\n    not asked: recommender https://127.0.0.1:1/recommend (only the daemon asks \
         recommenders)\n"
    );
}
