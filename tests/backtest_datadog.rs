//! `watermarkd backtest` end to end against Datadog: the real binary reads six hours of history
//! from the fake Datadog API (tests/support/fake_datadog.rs) in one-hour windows, paced by the
//! rate-limit headers, and replays it.

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

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use fake_datadog::{Behavior, Budget, FakeDatadog, API_KEY, APP_KEY};
use serde_json::Value;

/// The end of the history (2024-06-01T12:00:00Z): a fixed time, since the fake serves any past.
const UNTIL: i64 = 1_717_243_200;
const HOURS: i64 = 6;
const START: i64 = UNTIL - HOURS * 3600;
/// The autoscaler's evaluation interval (the default) and the series' rollup.
const STEP: i64 = 15;
const BUCKET: i64 = 30;
/// The backend's staleness bound for 30 s buckets: max(120 s, 3 x rollup).
const MAX_AGE: i64 = 120;
/// The live query's window, which the first request reaches back by.
const LIVE_WINDOW: i64 = 300;
/// Offsets from START of the spike and of the gap (null buckets in every series).
const SPIKE: (i64, i64) = (2 * 3600, 2 * 3600 + 1800);
const GAP: (i64, i64) = (4 * 3600, 4 * 3600 + 1200);

const LATENCY: &str = "avg:trace.http.request.duration{service:web}";
const REPLICAS: &str =
    "max:watermarkpodautoscaler.wpa_controller_replicas_scaling_effective{wpa_name:web,wpa_namespace:demo}";

/// A budget the backtest's few requests never strain, with a short period so that the pacer
/// spaces them by milliseconds rather than by seconds.
const ROOMY: Budget = Budget { limit: 1_000, period: Duration::from_secs(60), offset: Duration::ZERO };

/// `normal` before and after, `spike` during the spike, null buckets in the gap.
fn timeline(normal: f64, spike: f64) -> Behavior {
    let at = |offset: i64| START + offset;
    Behavior::Timeline {
        interval: BUCKET as u64,
        segments: vec![
            (START - 3600, Some(normal)),
            (at(SPIKE.0), Some(spike)),
            (at(SPIKE.1), Some(normal)),
            (at(GAP.0), None),
            (at(GAP.1), Some(normal)),
        ],
    }
}

/// Latency 0.2, 0.9 in the spike; the daemon's exported effective replicas 3, 6 in the spike.
async fn fake(budget: Budget) -> FakeDatadog {
    let fake = FakeDatadog::with_budget(budget).await;
    fake.set(LATENCY, timeline(0.2, 0.9));
    fake.set(REPLICAS, timeline(3.0, 6.0));
    fake
}

/// `tolerate_zero`, so that a null bucket misread as 0 would scale down rather than hold.
fn rules(url: &str, high: &str) -> String {
    format!(
        "[backend.dd]\ntype = \"datadog\"\nurl = \"{url}\"\napi_key_env = \"WM_TEST_DD_API_KEY\"\n\
         app_key_env = \"WM_TEST_DD_APP_KEY\"\n\n\
         [[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"demo\", name = \"web\" }}\n\
         min_replicas = 2\nmax_replicas = 12\nalgorithm = \"absolute\"\ndownscale_forbidden_window = \"5m\"\n\
         tolerate_zero = true\n[[autoscaler.metric]]\nname = \"latency\"\nbackend = \"dd\"\nquery = \"{LATENCY}\"\n\
         high_watermark = {high}\nlow_watermark = 0.1\n"
    )
}

/// `backtest` of the autoscaler of `dir/new.toml` over `since` up to UNTIL, then `extra`. The
/// binary runs off the runtime's threads: the fake answers it from this test's runtime.
async fn backtest(dir: &Path, since: &str, extra: &[&str]) -> Output {
    let dir = dir.to_path_buf();
    let until = UNTIL.to_string();
    let mut args = vec!["--rules", "new.toml", "--autoscaler", "web", "--since", since, "--until", &until];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_watermarkd"))
            .arg("backtest")
            .args(&args)
            .env("WM_TEST_DD_API_KEY", API_KEY)
            .env("WM_TEST_DD_APP_KEY", APP_KEY)
            .current_dir(&dir)
            .output()
            .expect("running watermarkd backtest")
    })
    .await
    .unwrap()
}

/// A directory holding `new.toml`.
fn write_rules(fake: &FakeDatadog, high: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("new.toml"), rules(&fake.url, high)).unwrap();
    dir
}

/// Seconds from START of an event's `at`.
fn offset(event: &Value) -> i64 {
    let at = humantime::parse_rfc3339(event["at"].as_str().unwrap()).unwrap();
    at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 - START
}

/// The `(from, to)` of every request for `query`, in the order they were answered, each
/// checked to be answered 200 and to carry that one query.
fn windows(fake: &FakeDatadog, query: &str) -> Vec<(i64, i64)> {
    fake.log()
        .iter()
        .filter(|r| r.sub_queries.iter().any(|q| q == query))
        .map(|r| {
            assert_eq!((r.path.as_str(), r.status, r.sub_queries.len()), ("/api/v1/query", 200, 1), "{r:?}");
            (r.from.unwrap(), r.to.unwrap())
        })
        .collect()
}

/// The requests for `query` tile `[START - live window, UNTIL + 1]` with one-hour windows.
fn assert_hour_windows(fake: &FakeDatadog, query: &str, start: i64) {
    let windows = windows(fake, query);
    let (first, last) = (start - LIVE_WINDOW, UNTIL + 1);
    assert_eq!(windows.len() as i64, (last - first + 3599) / 3600, "{query}: {windows:?}");
    assert_eq!(windows[0].0, first, "{query}: {windows:?}");
    assert_eq!(windows[windows.len() - 1].1, last, "{query}: {windows:?}");
    for pair in windows.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "{query}: the windows do not meet: {windows:?}");
    }
    let (full, tail) = windows.split_at(windows.len() - 1);
    assert!(full.iter().all(|(from, to)| to - from == 3600), "{query}: {windows:?}");
    assert!((1..=3600).contains(&(tail[0].1 - tail[0].0)), "{query}: {windows:?}");
}

fn assert_within_budget(fake: &FakeDatadog, budget: Budget) {
    assert_eq!(fake.count_status(429), 0, "{:?}", fake.log());
    let used = fake.used_per_window();
    assert!(used.iter().all(|(_, n)| *n <= budget.limit), "past the budget: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_six_hours_read_in_hour_windows_through_both_rules() {
    let fake = fake(ROOMY).await;
    let dir = write_rules(&fake, "0.5");
    std::fs::write(dir.path().join("old.toml"), rules(&fake.url, "1.0")).unwrap();
    let output = backtest(dir.path(), "6h", &["--against", "old.toml", "--json", "--out", "chart.svg"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "backtest failed: {stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();

    // The first bucket of the spike is complete 30 s after it starts: the first evaluation
    // then scales up (a live query skips the bucket still filling).
    let events = report["rule"]["events"].as_array().unwrap();
    let first_up = events.iter().find(|e| e["to"].as_u64() > e["from"].as_u64()).expect("a scale-up");
    assert_eq!(offset(first_up), SPIKE.0 + BUCKET, "first scale-up: {first_up}");
    assert_eq!(first_up["from"], 3, "{first_up}");

    // Null buckets are no data, not zeros (which would scale down): nothing scales during the
    // gap.
    assert!(events.iter().all(|e| !(GAP.0..GAP.1 + BUCKET).contains(&offset(e))), "scaled during the gap: {events:?}");
    // The last value before the gap is used until it is older than the staleness bound; from
    // then until the first bucket after the gap is complete, every evaluation is without data.
    let last_before = GAP.0 - BUCKET;
    let without_data =
        (0..=HOURS * 3600 / STEP).map(|k| k * STEP).filter(|t| t - last_before > MAX_AGE && *t < GAP.1 + BUCKET);
    let expected = without_data.count() as u64;
    assert_eq!(report["rule"]["summary"]["restricted"]["missing_data"], expected, "{}", report["rule"]["summary"]);
    assert_eq!(report["against"]["summary"]["restricted"]["missing_data"], expected);

    // The old rule (high 1.0) never crossed its watermark.
    assert_eq!(report["against"]["summary"]["scale_ups"], 0, "{}", report["against"]);
    // The actual replicas the daemon exported: 3, 6 in the spike.
    let rows = report["comparison"]["rows"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["measure"] == name).unwrap_or_else(|| panic!("no row {name}"));
    assert_eq!(row("peak replicas")["actual"], 6.0);
    assert_eq!(row("scale-ups")["actual"], 1.0);
    assert_eq!(row("scale-ups")["against"], 0.0);

    // Each query (the rule's metric, the replicas) read once, in one-hour windows covering the
    // whole span, every answer 200, the budget never exceeded; the --against rule has the same
    // query and reuses the history.
    assert_hour_windows(&fake, LATENCY, START);
    assert_hour_windows(&fake, REPLICAS, START);
    assert_eq!(fake.requests(), 2 * windows(&fake, LATENCY).len(), "{:?}", fake.log());
    assert_within_budget(&fake, ROOMY);

    // One chart with both rules: each rule's effective replicas and the actual replicas as
    // lines of their own, named in the legend, and both rules' figures in the header.
    let svg = std::fs::read_to_string(dir.path().join("chart.svg")).unwrap();
    for class in ["replicas-rule", "replicas-against", "replicas-actual"] {
        let line =
            svg.lines().find(|l| l.contains(&format!("class=\"{class}\""))).unwrap_or_else(|| panic!("no {class}"));
        assert!(line.starts_with("<path d=\"M"), "{class}: not a drawn line: {line}");
    }
    for label in [">this rule<", ">--against old.toml<", ">actual<", ">against high 1<", ">against low 0.1<"] {
        assert!(svg.contains(label), "no {label} in the chart");
    }
    assert!(svg.contains(">0 (0↑ 0↓)<") && svg.contains(">4 (4↑ 0↓)<"), "both rules' scale events in the header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_with_several_series_is_refused_naming_the_backend() {
    let fake = fake(ROOMY).await;
    fake.set(LATENCY, Behavior::Several(2));
    let dir = write_rules(&fake, "0.5");
    let output = backtest(dir.path(), "1h", &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains(r#"backend "dd""#) && stderr.contains("returns 2 series"), "{stderr}");
    assert!(stderr.contains(LATENCY), "{stderr}");
}

/// Four requests per two seconds (one kept in reserve) for six requests: the backtest waits for
/// the next window instead of running into 429s or failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_budget_makes_the_backtest_wait_not_fail() {
    let budget = Budget { limit: 4, period: Duration::from_secs(2), offset: Duration::ZERO };
    let fake = fake(budget).await;
    let dir = write_rules(&fake, "0.5");
    let output = backtest(dir.path(), "2h", &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "backtest failed: {stderr}");
    let start = UNTIL - 2 * 3600;
    assert_hour_windows(&fake, LATENCY, start);
    assert_hour_windows(&fake, REPLICAS, start);
    assert_within_budget(&fake, budget);
    let spent: Vec<u64> = fake.log().iter().map(|r| r.window).collect();
    assert!(spent.first() < spent.last(), "all in one budget window: {:?}", fake.log());
}

/// A forecast's history on Datadog: the past latency times the replicas watermarkd set then
/// (the rule is `absolute`), asked a day per request from the budget the live queries share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forecast_reads_its_history_a_day_per_request_and_multiplies_by_the_past_replicas() {
    use std::sync::Arc;
    use watermarkd::adapters::backend::{demand_history, MetricBackend};
    use watermarkd::adapters::telemetry::BackendMetrics;
    use watermarkd::domain::forecast::Forecaster;
    use watermarkd::domain::rules::{parse_rules, Backend, SecretSource};

    let fake = fake(ROOMY).await;
    let keys = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("api"), API_KEY).unwrap();
    std::fs::write(keys.path().join("app"), APP_KEY).unwrap();
    let mut rules = parse_rules(&rules(&fake.url, "0.5"), "rules.toml").unwrap();
    let Some(Backend::Datadog(config)) = rules.backends.get_mut("dd") else { panic!("a datadog backend") };
    config.api_key = SecretSource::File(keys.path().join("api"));
    config.app_key = SecretSource::File(keys.path().join("app"));
    let client =
        Arc::new(MetricBackend::new("dd", &rules.backends["dd"], Arc::new(BackendMetrics::detached())).unwrap());
    let web = rules.autoscaler("web").unwrap();
    let now = watermarkd_engine::Timestamp::from_unix_millis(UNTIL * 1000);
    let read = demand_history(web, |_| Some(Arc::clone(&client)), Forecaster::backfill_span(now)).await;
    let [Ok(demand)] = read.as_slice() else { panic!("{read:?}") };
    // The fake's series start an hour before START: only the last hours have points.
    let normal = demand.iter().filter(|(at, _)| at.unix_millis() / 1000 < START + SPIKE.0).map(|(_, d)| *d);
    let normal: Vec<f64> = normal.collect();
    assert!(!normal.is_empty(), "{demand:?}");
    assert!(normal.iter().all(|d| (d - 0.6).abs() < 1e-9), "0.2 s times 3 replicas: {normal:?}");
    // 22 days, a day per request, for each of the two series; an hour each would be 528.
    for query in [LATENCY, REPLICAS] {
        let asked = windows(&fake, query);
        assert!(asked.len() <= 23, "{} requests for {query}", asked.len());
        assert!(asked.iter().all(|(from, to)| to - from <= 86_400), "{asked:?}");
    }
}
