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
use prometheus_server::{Exporter, FakeServer, PrometheusServer, Reply};
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

/// What Mimir answers a query past its per-query series limit.
const SERIES_LIMIT: &str = r#"{"status":"error","errorType":"execution","error":"the query exceeded the maximum number of series (limit: 1000) (err-mimir-max-series-per-query)"}"#;

/// A store that refuses every folded query (`=~`) at its series limit, as Mimir, Thanos and
/// Cortex do for a query selecting every member's series at once, and answers each member's own
/// query `sum(m{job="x",dep="d-N..."})` with N.
async fn series_limited_store() -> FakeServer {
    FakeServer::start(|_, request| {
        let query = request.written_query().unwrap_or_default();
        if query.contains("=~") {
            return Reply::json(422, SERIES_LIMIT);
        }
        let time: f64 = request.param("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let n = query.split("dep=\"d-").nth(1).and_then(|rest| rest.split(['"', '-']).next()).unwrap_or("x");
        Reply::vector(time, &[n])
    })
    .await
}

/// `count` autoscalers `d-N` (with `suffix` after N in the label value), each with the query
/// `sum(m{job="x",dep="d-N<suffix>"})`: they fold on `dep`.
fn folding_fleet(url: &str, backend_extra: &str, count: usize, suffix: &str) -> String {
    let mut text = format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"{url}\"\n{backend_extra}\n");
    for n in 0..count {
        text.push_str(&format!(
            "\n[[autoscaler]]\nname = \"d-{n}\"\ntarget = {{ kind = \"Deployment\", namespace = \"prod\", name = \"d-{n}\" }}\n\
             max_replicas = 10\n[[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\n\
             query = 'sum(m{{job=\"x\",dep=\"d-{n}{suffix}\"}})'\nhigh_watermark = 1000\n"
        ));
    }
    text
}

/// The regex of each folded query among `requests`, as sent.
fn folded_regexes(requests: &[prometheus_server::Recorded]) -> Vec<String> {
    requests
        .iter()
        .filter_map(|r| r.written_query())
        .filter_map(|q| q.split("dep=~\"").nth(1).and_then(|rest| rest.split('"').next()).map(str::to_string))
        .collect()
}

/// A folded query selects the series of all its members at once, so it can meet a store's
/// per-query limit (HTTP 422 `execution`) that each member alone stays under: the members are
/// then asked alone in the same run, and each gets its own value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_asks_the_members_of_a_folded_query_that_met_a_series_limit_alone() {
    let store = series_limited_store().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    std::fs::write(&config, folding_fleet(&store.url(), "", 18, "")).unwrap();

    let (code, out) = watermarkd_query(&config, None);
    assert_eq!(code, 0, "{out}");
    for n in 0..18 {
        let shown = format!("d-{n}\n  load via prom: sum(m{{job=\"x\",dep=\"d-{n}\"}})\n    value {n} at ");
        assert!(out.contains(&shown), "{shown}\nin:\n{out}");
    }
    // One folded query, refused; then each member once, on its own.
    let sent: Vec<String> = store.requests().iter().filter_map(|r| r.written_query()).collect();
    assert_eq!(sent.iter().filter(|q| q.contains("=~")).count(), 1, "{sent:#?}");
    for n in 0..18 {
        let own = format!("sum(m{{job=\"x\",dep=\"d-{n}\"}})");
        assert_eq!(sent.iter().filter(|q| **q == own).count(), 1, "{own} in {sent:#?}");
    }
    assert_eq!(sent.len(), 19);

    // fold_queries = false on a Prometheus backend: nothing is folded.
    std::fs::write(&config, folding_fleet(&store.url(), "fold_queries = false", 18, "")).unwrap();
    let before = store.requests().len();
    let (code, out) = watermarkd_query(&config, None);
    assert_eq!(code, 0, "{out}");
    let sent: Vec<String> = store.requests()[before..].iter().filter_map(|r| r.written_query()).collect();
    assert_eq!(sent.len(), 18, "{sent:#?}");
    assert!(sent.iter().all(|q| !q.contains("=~")), "{sent:#?}");
}

/// Mimir's query-frontend does not shard a query whose regex is longer than 4,096 bytes: a
/// fold stays under that, in as many folded queries as it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_splits_a_fold_past_four_kib_of_regex() {
    let store = series_limited_store().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    // 18 values of about 300 bytes: 5.5 KB of regex in one fold.
    let suffix = format!("-{}", "x".repeat(300));
    std::fs::write(&config, folding_fleet(&store.url(), "", 18, &suffix)).unwrap();
    let (code, out) = watermarkd_query(&config, None);
    assert_eq!(code, 0, "{out}");
    let regexes = folded_regexes(&store.requests());
    assert_eq!(regexes.len(), 2, "{regexes:?}");
    assert!(regexes.iter().all(|r| r.len() <= 4_096), "{:?}", regexes.iter().map(String::len).collect::<Vec<_>>());
    assert_eq!(regexes.iter().map(|r| r.split('|').count()).sum::<usize>(), 18);

    // A larger bound set on the backend: one fold.
    std::fs::write(&config, folding_fleet(&store.url(), "fold_max_regex_bytes = 8192", 18, &suffix)).unwrap();
    let before = store.requests().len();
    let (code, out) = watermarkd_query(&config, None);
    assert_eq!(code, 0, "{out}");
    let regexes = folded_regexes(&store.requests()[before..]);
    assert_eq!(regexes.len(), 1, "{regexes:?}");
}
