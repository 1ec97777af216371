//! `watermarkd backtest` end to end: the real binary against a real Prometheus whose storage
//! holds six hours of generated history (written into TSDB blocks by promtool before it starts).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/prometheus_server.rs"]
mod prometheus_server;

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use prometheus_server::PrometheusServer;
use serde_json::Value;

const STEP: i64 = 15;
/// The history: six hours, ending an hour before now (Prometheus keeps the head block for the
/// newest data; the blocks hold the past).
const HOURS: i64 = 6;
/// Offsets (seconds from the start) of the spike and of the gap with no samples at all.
const SPIKE: (i64, i64) = (2 * 3600, 2 * 3600 + 1800);
const GAP: (i64, i64) = (4 * 3600, 4 * 3600 + 1200);

fn start() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    (now - (HOURS + 1) * 3600) / 3600 * 3600
}

/// Latency 0.2 s, 0.9 s during the spike, no samples in the gap; the daemon's exported
/// effective replicas (3, and 6 during the spike); and a metric with two series.
fn history(start: i64) -> String {
    let times: Vec<i64> = (0..HOURS * 3600 / STEP).map(|k| k * STEP).filter(|t| !(GAP.0..GAP.1).contains(t)).collect();
    let in_spike = |t: i64| (SPIKE.0..SPIKE.1).contains(&t);
    let mut text = String::from("# TYPE app_latency_seconds gauge\n");
    for t in &times {
        let value = if in_spike(*t) { 0.9 } else { 0.2 };
        writeln!(text, "app_latency_seconds{{service=\"web\"}} {value} {}", start + t).unwrap();
    }
    text.push_str("# TYPE wpa_controller_replicas_scaling_effective gauge\n");
    for t in &times {
        let replicas = if in_spike(*t) { 6 } else { 3 };
        writeln!(
            text,
            "wpa_controller_replicas_scaling_effective{{wpa_name=\"web\",wpa_namespace=\"demo\"}} {replicas} {}",
            start + t
        )
        .unwrap();
    }
    text.push_str("# TYPE app_queue_depth gauge\n");
    for shard in ["a", "b"] {
        for t in &times {
            writeln!(text, "app_queue_depth{{shard=\"{shard}\"}} 10 {}", start + t).unwrap();
        }
    }
    text.push_str("# EOF\n");
    text
}

fn rules(prometheus: &str, high: &str, query: &str) -> String {
    format!(
        "[backend.prom]\ntype = \"prometheus\"\nurl = \"{prometheus}\"\n\n\
         [[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"demo\", name = \"web\" }}\n\
         min_replicas = 2\nmax_replicas = 12\nalgorithm = \"absolute\"\ndownscale_forbidden_window = \"5m\"\n\
         [[autoscaler.metric]]\nname = \"latency\"\nbackend = \"prom\"\nquery = '{query}'\n\
         high_watermark = {high}\nlow_watermark = 0.1\n"
    )
}

fn backtest(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .arg("backtest")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running watermarkd backtest")
}

#[tokio::test(flavor = "multi_thread")]
async fn replays_the_history_through_both_rules_and_holds_through_the_gap() {
    let start = start();
    let prometheus = PrometheusServer::start_with_history(&history(start)).await;
    let dir = tempfile::tempdir().unwrap();
    let query = r#"max(app_latency_seconds{service="web"})"#;
    std::fs::write(dir.path().join("new.toml"), rules(&prometheus.url(), "0.5", query)).unwrap();
    std::fs::write(dir.path().join("old.toml"), rules(&prometheus.url(), "1.0", query)).unwrap();
    let until = (start + HOURS * 3600 - STEP).to_string();

    let output = backtest(
        dir.path(),
        &[
            "--rules",
            "new.toml",
            "--autoscaler",
            "web",
            "--since",
            "6h",
            "--until",
            &until,
            "--against",
            "old.toml",
            "--json",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "backtest failed: {stderr}");
    assert!(stderr.contains("reading web / latency"), "no progress on stderr: {stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();

    // The new rule (high 0.5) scales up during the spike, and not before it.
    let events = report["rule"]["events"].as_array().unwrap();
    let offset = |event: &Value| {
        let at = humantime::parse_rfc3339(event["at"].as_str().unwrap()).unwrap();
        at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 - start
    };
    let first_up = events.iter().find(|e| e["to"].as_u64() > e["from"].as_u64()).expect("a scale-up");
    assert!((SPIKE.0..SPIKE.0 + 120).contains(&offset(first_up)), "first scale-up at {}s", offset(first_up));
    // The gap is no data: nothing scales while it lasts, and it is counted as such.
    assert!(events.iter().all(|e| !(GAP.0..GAP.1).contains(&offset(e))), "scaled during the gap: {events:?}");
    // An instant query still sees a sample for Prometheus' five-minute lookback, live as here.
    let missing = report["rule"]["summary"]["restricted"]["missing_data"].as_u64().unwrap() as i64;
    let expected = (GAP.1 - GAP.0 - 300) / STEP;
    assert!((expected - 1..=expected + 1).contains(&missing), "{missing} evaluations without data, not {expected}");
    // The old rule (high 1.0) never crossed.
    assert_eq!(report["against"]["summary"]["scale_ups"], 0);

    // The table: both rules and the actual replicas the daemon exported (3, 6 in the spike).
    let rows = report["comparison"]["rows"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["measure"] == name).unwrap_or_else(|| panic!("no row {name}"));
    assert_eq!(row("peak replicas")["actual"], 6.0);
    assert_eq!(row("scale-ups")["against"], 0.0);
    assert!(row("scale-ups")["rule"].as_f64().unwrap() >= 1.0);
    assert_eq!(row("scale-ups")["actual"], 1.0);

    // The text report says the same as a table.
    let text = backtest(
        dir.path(),
        &["--rules", "new.toml", "--autoscaler", "web", "--since", "6h", "--until", &until, "--against", "old.toml"],
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("--against") && text.contains("actual"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("peak replicas")), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_with_several_series_is_refused_naming_the_backend() {
    let start = start();
    let prometheus = PrometheusServer::start_with_history(&history(start)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.toml"), rules(&prometheus.url(), "50", "app_queue_depth")).unwrap();
    let until = (start + HOURS * 3600 - STEP).to_string();
    let output =
        backtest(dir.path(), &["--rules", "rules.toml", "--autoscaler", "web", "--since", "1h", "--until", &until]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(r#"backend "prom""#) && stderr.contains("2 series"), "{stderr}");
    assert!(stderr.contains("metric needs one: aggregate"), "one space between the words: {stderr}");

    // A history that is not there (before the data starts, or a query that matches nothing) is
    // an error naming the backend, not a replay of nothing but holds.
    std::fs::write(dir.path().join("rules.toml"), rules(&prometheus.url(), "50", "app_latency_seconds")).unwrap();
    let before = (start - 600).to_string();
    let output =
        backtest(dir.path(), &["--rules", "rules.toml", "--autoscaler", "web", "--since", "1h", "--until", &before]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(r#"backend "prom": query "app_latency_seconds" has a value at only 0 of the evaluations"#)
            && stderr.contains("a backtest needs at least 25, a tenth"),
        "{stderr}"
    );
}
