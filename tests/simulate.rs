//! `watermarkd simulate` end to end: the real binary, the shipped traces, config/demo.toml.
//!
//! The assertions are about behaviour a person would check on the chart (scaled up during the
//! spike, held through the scraper gap, followed the daily curve, did not flap), computed from
//! the trace itself where possible so that a wrong summary cannot vouch for itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::UNIX_EPOCH;

use serde_json::Value;

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn simulate(args: &[&str]) -> Output {
    let config = repo_path("config/demo.toml");
    Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .arg("simulate")
        .arg("--config")
        .arg(&config)
        .args(args)
        .output()
        .expect("running watermarkd")
}

fn trace_path(name: &str) -> String {
    repo_path(&format!("traces/{name}.csv")).display().to_string()
}

/// Runs one shipped trace with `--json` and returns the report.
fn simulate_json(autoscaler: &str, extra: &[&str]) -> Value {
    let trace = trace_path(autoscaler);
    let mut args = vec!["--autoscaler", autoscaler, "--trace", &trace, "--json"];
    args.extend_from_slice(extra);
    let output = simulate(&args);
    assert!(output.status.success(), "simulate {autoscaler} failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("the JSON report")
}

/// Unix seconds from an RFC 3339 time or a Unix-seconds cell.
fn unix_seconds(text: &str) -> i64 {
    if let Ok(seconds) = text.parse::<i64>() {
        return seconds;
    }
    let time = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    i64::try_from(time.duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

/// The trace as `(unix seconds, metric cell)` rows, `None` for an empty cell.
fn trace_column(name: &str, column: &str) -> Vec<(i64, Option<f64>)> {
    let text = std::fs::read_to_string(trace_path(name)).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let index = header.iter().position(|h| *h == column).unwrap();
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            (unix_seconds(cells[0]), cells[index].parse().ok())
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
struct Event {
    at: i64,
    from: u64,
    to: u64,
    manual: bool,
}

fn events(report: &Value) -> Vec<Event> {
    report["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| Event {
            at: unix_seconds(e["at"].as_str().unwrap()),
            from: e["from"].as_u64().unwrap(),
            to: e["to"].as_u64().unwrap(),
            manual: e["cause"] == "manual",
        })
        .collect()
}

/// The spec replicas at `at`, rebuilt from the start count and the events.
fn replicas_at(report: &Value, at: i64) -> u64 {
    let initial = report["summary"]["initial_replicas"].as_u64().unwrap();
    events(report).iter().rfind(|e| e.at <= at).map_or(initial, |e| e.to)
}

#[test]
fn spike_scales_up_during_the_spike_and_back_down_after() {
    let report = simulate_json("spike", &[]);
    let trace = trace_column("spike", "latency_seconds");
    // The spike: every row above the high watermark (0.4); the baseline never gets there.
    let spike: Vec<i64> = trace.iter().filter(|(_, v)| v.is_some_and(|v| v > 0.4)).map(|(t, _)| *t).collect();
    let (spike_start, spike_end) = (spike[0], *spike.last().unwrap());
    assert!(spike_end - spike_start >= 15 * 60, "the shipped spike lasts about 20 minutes");

    let events = events(&report);
    let before: Vec<&Event> = events.iter().filter(|e| e.at < spike_start).collect();
    assert!(before.is_empty(), "no scaling on the baseline before the spike: {before:?}");

    let during: Vec<&Event> = events.iter().filter(|e| (spike_start..=spike_end).contains(&e.at)).collect();
    assert!(!during.is_empty() && during.iter().all(|e| e.to > e.from), "only scale-ups during the spike: {during:?}");
    // Reacts within a minute of the spike and stays within max_replicas.
    assert!(during[0].at - spike_start <= 60, "first scale-up {}s after the spike began", during[0].at - spike_start);
    let peak = report["summary"]["peak_replicas"].as_u64().unwrap();
    assert!((20..=30).contains(&peak), "peak {peak}");
    assert!(replicas_at(&report, spike_end) >= 20);

    let after: Vec<&Event> = events.iter().filter(|e| e.at > spike_end).collect();
    assert!(after.len() >= 3 && after.iter().all(|e| e.to < e.from), "scale-downs after the spike: {after:?}");
    let final_replicas = report["summary"]["final_replicas"].as_u64().unwrap();
    assert!(final_replicas < peak / 2, "back down after the spike: final {final_replicas}, peak {peak}");
    assert!(final_replicas >= 3, "never below min_replicas");
}

#[test]
fn spike_holds_through_the_scraper_gap() {
    let report = simulate_json("spike", &[]);
    let trace = trace_column("spike", "latency_seconds");
    // The longest run of empty cells is the scraper outage.
    let (mut best, mut run_start, mut run_len) = ((0, 0, 0usize), 0, 0usize);
    for (i, (at, value)) in trace.iter().enumerate() {
        if value.is_none() {
            if run_len == 0 {
                run_start = *at;
            }
            run_len += 1;
            if run_len > best.2 {
                best = (run_start, trace[i + 1].0, run_len);
            }
        } else {
            run_len = 0;
        }
    }
    let (gap_start, gap_end, gap_rows) = best;
    assert!(gap_rows >= 20, "the shipped trace has a scraper gap of several minutes, found {gap_rows} rows");

    let events = events(&report);
    let in_gap: Vec<&Event> = events.iter().filter(|e| e.at >= gap_start && e.at < gap_end).collect();
    assert!(in_gap.is_empty(), "no scaling on missing data: {in_gap:?}");
    // The gap falls in the scale-down phase, longer than the downscale window: without the
    // no-data hold the replay would have scaled down inside it.
    assert!(events.iter().any(|e| e.at < gap_start && e.to < e.from), "scale-downs before the gap");
    assert!(events.iter().any(|e| e.at >= gap_end && e.to < e.from), "scale-downs after the gap");
    let missing = report["summary"]["restricted"]["missing_data"].as_u64().unwrap();
    assert!(missing as usize >= gap_rows, "{missing} evaluations without data, gap has {gap_rows} rows");
    assert_eq!(report["summary"]["restricted"]["guards"]["no_data"], missing);
}

#[test]
fn daily_replicas_follow_the_curve_within_min_and_max() {
    let report = simulate_json("daily", &[]);
    let trace = trace_column("daily", "rps");
    let values: Vec<(i64, f64)> = trace.iter().filter_map(|(t, v)| v.map(|v| (*t, v))).collect();

    for event in events(&report) {
        assert!((2..=20).contains(&event.to), "{event:?} leaves min/max 2..20");
    }
    // Compare busy and quiet hours of the first day (its hourly means, from the trace).
    let start = values[0].0;
    let hourly_mean = |hour: i64| {
        let in_hour: Vec<f64> = values.iter().filter(|(t, _)| (t - start) / 3600 == hour).map(|(_, v)| *v).collect();
        in_hour.iter().sum::<f64>() / in_hour.len() as f64
    };
    let busiest = (1..24).max_by(|a, b| hourly_mean(*a).total_cmp(&hourly_mean(*b))).unwrap();
    let quietest = (1..24).min_by(|a, b| hourly_mean(*a).total_cmp(&hourly_mean(*b))).unwrap();
    assert!(hourly_mean(busiest) > 4.0 * hourly_mean(quietest), "the trace has a daily curve");
    let busy_replicas = replicas_at(&report, start + busiest * 3600 + 1800);
    let quiet_replicas = replicas_at(&report, start + quietest * 3600 + 1800);
    assert!(busy_replicas >= 15, "{busy_replicas} replicas at the busiest hour ({busiest}:30)");
    assert!(quiet_replicas <= 6, "{quiet_replicas} replicas at the quietest hour ({quietest}:30)");

    // Per-replica load stays in the band almost all the time: the replicas tracked the load.
    let summary = &report["summary"];
    let duration = summary["duration_seconds"].as_f64().unwrap();
    let out_of_band = summary["seconds_above_high_watermark"].as_f64().unwrap()
        + summary["seconds_below_low_watermark"].as_f64().unwrap();
    assert!(out_of_band < 0.05 * duration, "{out_of_band}s of {duration}s outside the band");
    assert!(summary["scale_ups"].as_u64().unwrap() >= 10 && summary["scale_downs"].as_u64().unwrap() >= 10);
}

#[test]
fn flapping_delays_keep_scale_events_far_below_watermark_crossings() {
    let report = simulate_json("flapping", &[]);
    let trace = trace_column("flapping", "cpu");
    // Count crossings of the high watermark in the trace itself.
    let mut crossings = 0;
    let mut above = false;
    for (_, value) in &trace {
        let now_above = value.is_some_and(|v| v > 0.75);
        crossings += usize::from(now_above && !above);
        above = now_above;
    }
    assert!(crossings >= 20, "the shipped trace oscillates across the high watermark ({crossings} crossings)");

    let summary = &report["summary"];
    let scale_events = summary["scale_ups"].as_u64().unwrap() + summary["scale_downs"].as_u64().unwrap();
    assert!(
        (scale_events as usize) * 3 < crossings,
        "{scale_events} scale events for {crossings} crossings of the high watermark"
    );
    assert!(summary["restricted"]["upscale_delay"].as_u64().unwrap() > 0, "the upscale delay held scale-ups back");
    assert!(summary["high_watermark_crossings"].as_u64().unwrap() >= 10);

    // Every scale the autoscaler made was earned: the trace stayed beyond the band for the
    // whole delay before it (config/demo.toml: high 0.75 and low 0.5 with the default 10%
    // tolerance, upscale delay 60s, downscale delay 120s). Without the delays the first crest
    // would already scale up.
    let cpu_between = |from: i64, to: i64| -> Vec<f64> {
        trace.iter().filter(|(t, _)| (from..=to).contains(t)).filter_map(|(_, v)| *v).collect()
    };
    let autoscaler_events: Vec<Event> = events(&report).into_iter().filter(|e| !e.manual).collect();
    assert!(!autoscaler_events.is_empty());
    for event in &autoscaler_events {
        if event.to > event.from {
            let window = cpu_between(event.at - 60, event.at);
            assert!(window.iter().all(|v| *v > 0.825), "{event:?} after {window:?}");
        } else {
            let window = cpu_between(event.at - 120, event.at);
            assert!(window.iter().all(|v| *v < 0.45), "{event:?} after {window:?}");
        }
    }

    // The one manual change is replayed at its row's time with its value.
    let manual: Vec<Event> = events(&report).into_iter().filter(|e| e.manual).collect();
    assert_eq!(manual.len(), 1, "{manual:?}");
    assert_eq!(manual[0].to, 7);
    assert_eq!(manual[0].at, unix_seconds("2024-05-07T10:10:00Z"));
    assert_eq!(summary["initial_replicas"], 4, "the first row's replicas is the start count");
}

#[test]
fn initial_replicas_and_readiness_lag_are_applied() {
    let report = simulate_json("spike", &["--initial-replicas", "10", "--readiness-lag", "2m"]);
    let summary = &report["summary"];
    assert_eq!(summary["initial_replicas"], 10);
    assert_eq!(summary["readiness_lag_seconds"], 120.0);
    assert_eq!(events(&report)[0].from, 10);

    // On an `average` rule the total is divided by the ready replicas: while new ones are not
    // ready, each ready replica carries more, so the same trace spends longer above the band.
    let prompt = simulate_json("daily", &[]);
    let lagged = simulate_json("daily", &["--readiness-lag", "5m"]);
    let above = |r: &Value| r["summary"]["seconds_above_high_watermark"].as_f64().unwrap();
    assert!(above(&lagged) > above(&prompt) + 600.0, "lagged {}s, prompt {}s above", above(&lagged), above(&prompt));
    assert_eq!(lagged["summary"]["evaluations"], prompt["summary"]["evaluations"]);
}

#[test]
fn text_report_lists_events_and_summary() {
    let trace = trace_path("flapping");
    let output = simulate(&["--autoscaler", "flapping", "--trace", &trace]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.starts_with("Autoscaler \"flapping\": 2024-05-07T09:00:00Z to 2024-05-07T11:00:00Z (2h)"), "{text}");
    assert!(text.contains("Scale events ("), "{text}");
    assert!(text.contains("2024-05-07T10:10:00Z  +01:10:00"), "{text}");
    assert!(text.contains("manual: set by a person (trace line "), "{text}");
    assert!(text.contains("Summary:\n  evaluations               481\n"), "{text}");
    assert!(text.contains("upscale held by delay"), "{text}");
}

/// Checks that every tag is closed in order and that attribute quotes balance: enough to
/// catch a broken hand-written SVG without an XML parser.
fn assert_well_formed(svg: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let close = after.find('>').expect("unterminated tag");
        let tag = &after[..close];
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            let expected = stack.pop().unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(expected, name.trim(), "</{name}> closes <{expected}>");
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            stack.push(tag.split_whitespace().next().unwrap().to_string());
        }
        rest = &after[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
}

#[test]
fn writes_a_well_formed_svg_chart() {
    let dir = tempfile::tempdir().unwrap();
    for (autoscaler, metric) in [("spike", "latency_seconds"), ("daily", "rps"), ("flapping", "cpu")] {
        let chart = dir.path().join(format!("{autoscaler}.svg"));
        let chart_arg = chart.display().to_string();
        let trace = trace_path(autoscaler);
        let output = simulate(&["--autoscaler", autoscaler, "--trace", &trace, "--out", &chart_arg]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stdout).contains(&format!("Chart written to {chart_arg}")));

        let svg = std::fs::read_to_string(&chart).unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_well_formed(&svg);
        assert!(svg.contains(&format!("Autoscaler “{autoscaler}”")), "title");
        assert!(svg.contains(&format!(">{metric} ")), "a panel for the metric {metric}");
        assert!(svg.contains(">Replicas</text>"), "the replicas panel");
        for label in ["high watermark", "low watermark", "hold band", "effective (spec)", "proposed by the metrics"] {
            assert!(svg.contains(label), "legend entry {label:?}");
        }
        for restriction in ["upscale capped", "downscale capped", "forbidden window", "watermark delay", "no data"] {
            assert!(svg.contains(restriction), "restriction legend {restriction:?}");
        }
        // No unformatted placeholder or broken number made it into the file.
        assert!(!svg.contains('{') && !svg.contains("NaN") && !svg.contains("inf"), "{autoscaler}: stray text");
        assert!(!dir.path().join(format!("{autoscaler}.svg.tmp")).exists(), "temporary file left behind");
    }
    // The spike has a scraper gap: the chart shows no-data spans, and the usage line breaks.
    let spike = std::fs::read_to_string(dir.path().join("spike.svg")).unwrap();
    assert!(spike.contains("fill=\"#e15759\""), "no-data spans are drawn");
}

#[test]
fn reports_unknown_autoscalers_and_bad_traces() {
    let trace = trace_path("spike");
    let output = simulate(&["--autoscaler", "nope", "--trace", &trace]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no autoscaler named \"nope\""), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("wrong-column.csv", "timestamp,p99\n0,0.2\n", "unknown column `p99`"),
        ("missing-column.csv", "timestamp\n0\n", "missing column `latency_seconds`"),
        (
            "bad-number.csv",
            "timestamp,latency_seconds\n0,0.2\n15,fast\n",
            "line 3: latency_seconds: \"fast\" is not a number",
        ),
    ];
    for (name, contents, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        let path_arg = path.display().to_string();
        let output = simulate(&["--autoscaler", "spike", "--trace", &path_arg]);
        assert_eq!(output.status.code(), Some(2), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{name}: {stderr}");
        assert!(stderr.contains(name), "{name}: the message names the file: {stderr}");
    }
}

#[test]
fn an_autoscaler_with_a_recommender_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    std::fs::write(
        &config,
        "[[autoscaler]]\nname = \"web\"\ntarget = { kind = \"Deployment\", namespace = \"prod\", name = \"web\" }\n\
         max_replicas = 10\nrecommender = { url = \"http://127.0.0.1:1/\", high_watermark = 1 }\n",
    )
    .expect("write rules");
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["simulate", "--config"])
        .arg(&config)
        .args(["--autoscaler", "web", "--trace", &trace_path("spike")])
        .output()
        .expect("running watermarkd");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("autoscaler \"web\" takes its replicas from a recommender"), "{stderr}");
}

#[test]
fn the_per_replica_load_model_lets_added_replicas_bring_the_metric_down() {
    let recorded = simulate_json("spike", &[]);
    let modelled = simulate_json("spike", &["--load-model", "per-replica"]);
    assert_eq!(recorded["summary"]["load_model"], "recorded");
    assert_eq!(modelled["summary"]["load_model"], "per-replica");
    // The spike's latency, read as total demand, is shared by the replicas the rule adds, so
    // the rule needs fewer of them and spends less time above the high watermark.
    let peak = |report: &Value| report["summary"]["peak_replicas"].as_u64().unwrap();
    let above = |report: &Value| report["summary"]["seconds_above_high_watermark"].as_f64().unwrap();
    assert!(peak(&modelled) < peak(&recorded), "peak {} vs {}", peak(&modelled), peak(&recorded));
    assert!(above(&modelled) < above(&recorded), "above {} vs {}", above(&modelled), above(&recorded));

    let trace = trace_path("spike");
    let output = simulate(&["--autoscaler", "spike", "--trace", &trace, "--load-model", "per-replica"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("load model: per-replica"), "{text}");
}

/// config/ahead.toml on traces/ahead.csv (two weeks of a weekday curve with a steep morning
/// ramp, new replicas ready after 2 minutes): the forecast at least halves the time above the
/// high watermark for at most 10% more replica-hours than the same rule without it.
#[test]
fn the_forecast_meets_the_morning_ramp_at_most_half_as_late_for_at_most_a_tenth_more() {
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["simulate", "--rules"])
        .arg(repo_path("config/ahead.toml"))
        .args(["--autoscaler", "daily", "--trace", &trace_path("ahead"), "--readiness-lag", "2m", "--json"])
        .output()
        .expect("running watermarkd");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("the JSON report");
    let (with, without) = (&report["summary"], &report["without_ahead"]);
    let above = |s: &Value| s["seconds_above_high_watermark"].as_f64().unwrap();
    let hours = |s: &Value| s["replica_hours"].as_f64().unwrap();
    assert!(above(without) > 3_600.0, "the reactive rule is late on the ramps: {without}");
    assert!(
        above(with) * 2.0 <= above(without),
        "{} s above with the forecast, {} without",
        above(with),
        above(without)
    );
    assert!(
        hours(with) <= hours(without) * 1.10,
        "{} replica-hours with the forecast, {} without",
        hours(with),
        hours(without)
    );
    // The forecast raised the floor before the ramps: some scale up names it.
    let events = report["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["reason"].as_str().is_some_and(|r| r.contains("raised by the forecast 10m ahead"))),
        "no scale names the forecast"
    );
}

/// `--out -` is standard output, as for most tools: the SVG alone there, the report on standard
/// error, and no file named `-`.
#[test]
fn out_dash_writes_the_chart_to_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = trace_path("spike");
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .current_dir(dir.path())
        .args(["simulate", "--config", &repo_path("config/demo.toml").display().to_string()])
        .args(["--autoscaler", "spike", "--trace", &trace, "--out", "-"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let svg = String::from_utf8(output.stdout).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.trim_end().ends_with("</svg>"), "standard output is the SVG alone");
    assert_well_formed(&svg);
    let report = String::from_utf8(output.stderr).unwrap();
    assert!(report.contains("Scale events ("), "the report goes to standard error: {report}");
    assert!(!report.contains("Chart written to"), "{report}");
    assert!(!dir.path().join("-").exists(), "a file named - was written");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing written beside");
}

/// Each metric panel's title as drawn (without its tooltip), and where the legend on its line
/// begins: the first x of the `<g font-size="11">` group that follows it.
fn titles_and_legends(svg: &str) -> Vec<(String, f64)> {
    const TITLE: &str = "font-size=\"13\" font-weight=\"600\">";
    let mut found = Vec::new();
    let mut rest = svg;
    while let Some(at) = rest.find(TITLE) {
        let after = &rest[at + TITLE.len()..];
        let end = after.find("</text>").unwrap();
        let mut title = after[..end].to_string();
        if let (Some(open), Some(close)) = (title.find("<title>"), title.find("</title>")) {
            title.replace_range(open..close + "</title>".len(), "");
        }
        let legend = &after[after.find("<g font-size=\"11\">").unwrap()..];
        let x_at = legend.find(" x=\"").or_else(|| legend.find(" x1=\"")).unwrap();
        let x_text = &legend[x_at..];
        let x_text = &x_text[x_text.find('"').unwrap() + 1..];
        let x: f64 = x_text[..x_text.find('"').unwrap()].parse().unwrap();
        found.push((title, x));
        rest = &after[end..];
    }
    found
}

/// A panel title (13 px, semibold, from x = 76) ends before its legend begins, measured at
/// 0.66 em a character, wider than DejaVu Sans Bold's average; and a long metric name is cut
/// rather than run into the legend.
#[test]
fn a_metric_panels_title_never_runs_into_its_legend() {
    let dir = tempfile::tempdir().unwrap();
    let long = "http_server_request_duration_seconds_bucket_p99_by_route_and_method_and_status_code";
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        format!(
            "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\n\n[[autoscaler]]\nname = \"long\"\n\
             target = {{ kind = \"Deployment\", namespace = \"demo\", name = \"api\" }}\nmin_replicas = 1\nmax_replicas = 10\n\
             [[autoscaler.metric]]\nname = \"{long}\"\nbackend = \"prom\"\nquery = \"q\"\nhigh_watermark = 0.5\nlow_watermark = 0.2\n"
        ),
    )
    .unwrap();
    let trace = dir.path().join("long.csv");
    std::fs::write(&trace, format!("timestamp,{long}\n0,0.3\n60,0.9\n120,0.1\n")).unwrap();
    let mut charts = Vec::new();
    for (i, (config, autoscaler, trace, extra)) in [
        (repo_path("config/demo.toml"), "spike", trace_path("spike"), None),
        (repo_path("config/demo.toml"), "spike", trace_path("spike"), Some("per-replica")),
        (repo_path("config/demo.toml"), "daily", trace_path("daily"), None),
        (repo_path("config/demo.toml"), "flapping", trace_path("flapping"), None),
        (rules.clone(), "long", trace.display().to_string(), None),
    ]
    .into_iter()
    .enumerate()
    {
        let chart = dir.path().join(format!("{i}.svg"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_watermarkd"));
        command.args(["simulate", "--config", &config.display().to_string(), "--autoscaler", autoscaler]);
        command.args(["--trace", &trace, "--out", &chart.display().to_string()]);
        if let Some(model) = extra {
            command.args(["--load-model", model]);
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{autoscaler}: {}", String::from_utf8_lossy(&output.stderr));
        charts.push((autoscaler, std::fs::read_to_string(&chart).unwrap()));
    }
    for (autoscaler, svg) in &charts {
        let panels = titles_and_legends(svg);
        assert!(!panels.is_empty(), "{autoscaler}: no metric panel title found");
        for (title, legend_x) in panels {
            let right = 76.0 + 0.66 * 13.0 * title.chars().count() as f64;
            assert!(
                right < legend_x,
                "{autoscaler}: the title {title:?} ends at {right:.0}, the legend begins at {legend_x}"
            );
        }
    }
    let (_, long_chart) = &charts[4];
    assert!(long_chart.contains(&format!("<title>{long} (absolute")), "the full title is the tooltip");
    assert!(long_chart.contains('…'), "the long name is cut");
}
