//! `watermarkd simulate` end to end on what looks ahead of or stands in for the metrics: a
//! fallback on data that comes and goes, a forecast over several metrics, a schedule window in
//! a summer-time gap. Each case writes its rules file and trace, runs the real binary with
//! `--json`, and asserts on the scale events it reports (the same `FallbackMemory`, `Forecaster`
//! and `schedule::rule_at` the daemon calls).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// 2027-01-01T09:00:00Z.
const T0: i64 = 1_798_794_000;

const BACKEND: &str = "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\n\n";

/// An `absolute` rule on one metric `load` (high 10, low 5) every 15 s, with `extra` lines at
/// the end of its `[[autoscaler]]` table and `tables` after its metric.
fn rule(extra: &str, tables: &str) -> String {
    format!(
        "{BACKEND}[[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"shop\", name = \"web\" }}\n\
         interval = \"15s\"\nmin_replicas = 1\nmax_replicas = 20\nalgorithm = \"absolute\"\n{extra}\n\
         [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = 'sum(rate(x[1m]))'\n\
         high_watermark = 10\nlow_watermark = 5\n\n{tables}"
    )
}

/// Runs `simulate --json` on `rules` and a trace of `header` and `rows` (Unix seconds, then
/// the cells), with `args` added.
fn simulate(rules: &str, header: &str, rows: &[(i64, String)], args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let rules_path = dir.path().join("rules.toml");
    std::fs::write(&rules_path, rules).unwrap();
    let trace_path = dir.path().join("trace.csv");
    let mut trace = format!("timestamp,{header}\n");
    for (at, cells) in rows {
        trace.push_str(&format!("{at},{cells}\n"));
    }
    std::fs::write(&trace_path, trace).unwrap();
    run(&rules_path, "web", &trace_path, args)
}

fn run(rules: &Path, autoscaler: &str, trace: &Path, args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .arg("simulate")
        .arg("--rules")
        .arg(rules)
        .args(["--autoscaler", autoscaler, "--trace"])
        .arg(trace)
        .arg("--json")
        .args(args)
        .output()
        .expect("running watermarkd");
    assert!(output.status.success(), "simulate failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("the JSON report")
}

#[derive(Debug, Clone, PartialEq)]
struct Event {
    /// Seconds since `T0`.
    at: i64,
    from: u64,
    to: u64,
    reason: String,
}

fn events(report: &Value) -> Vec<Event> {
    report["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            let at = humantime::parse_rfc3339(e["at"].as_str().unwrap()).unwrap();
            let at = i64::try_from(at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).unwrap();
            Event {
                at: at - T0,
                from: e["from"].as_u64().unwrap(),
                to: e["to"].as_u64().unwrap(),
                reason: e["reason"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// `(seconds since T0, from, to)` of each event.
fn moves(events: &[Event]) -> Vec<(i64, u64, u64)> {
    events.iter().map(|e| (e.at, e.from, e.to)).collect()
}

/// The fallback declared with `after = "60s"`, `recover_after = "120s"`, going to `replicas`.
fn fallback(replicas: u32, scale_down: bool) -> String {
    format!(
        "[autoscaler.fallback]\nafter = \"60s\"\nrecover_after = \"120s\"\naction = \"replicas\"\n\
         replicas = {replicas}\nscale_down = {scale_down}\n"
    )
}

/// A row every 15 s from `T0` to `T0 + end`, with the demand `value(offset)` or an empty cell.
fn rows(end: i64, value: impl Fn(i64) -> Option<f64>) -> Vec<(i64, String)> {
    (0..=end / 15)
        .map(|i| {
            let offset = i * 15;
            (T0 + offset, value(offset).map(|v| v.to_string()).unwrap_or_default())
        })
        .collect()
}

/// REVIEW-4 T4-5, with `scale_down = true`: five minutes of a total demand of 60 (6 replicas at
/// the high watermark 10), two minutes with no data, then ten minutes where every other row is
/// missing. The fallback goes to 2 once, after the minute without data; after that the data
/// that comes back scales up again, and the rows that miss in between hold: they do not go
/// back to 2 around `downscale_forbidden_window` on each gap (before the fix, 19 scale events
/// alternating 2 -> 3 and 3 -> 2).
#[test]
fn a_fallback_that_may_scale_down_goes_to_its_count_once_and_intermittent_data_does_not_flap_it() {
    let rules = rule("downscale_forbidden_window = \"300s\"", &fallback(2, true));
    let trace = rows(17 * 60, |t| match t {
        _ if t < 300 => Some(60.0),
        _ if t < 420 => None,
        _ => ((t - 420) / 15 % 2 == 0).then_some(60.0),
    });
    let report = simulate(&rules, "load", &trace, &["--load-model", "per-replica"]);
    let events = events(&report);
    // Up to 6 at the upscale rate limit, to 2 after a minute without data, and up to 6 again.
    let expected =
        [(0, 1, 2), (60, 2, 3), (120, 3, 4), (180, 4, 6), (360, 6, 2), (420, 2, 3), (480, 3, 4), (540, 4, 6)];
    assert_eq!(moves(&events), expected, "{events:#?}");
    assert!(events[4].reason.contains("falling back to 2 replicas"), "{}", events[4].reason);
}

/// REVIEW-4 T4-5, with `scale_down = false`: a demand of 20 (4 replicas), two minutes with no
/// data (fallback to 8 after one), then the data continuously. The first good row must not go
/// 8 -> 7 and the next back 7 -> 8: the count is a floor from the first good evaluation on,
/// until the data has been good for `recover_after`.
#[test]
fn the_fallback_count_is_a_floor_from_the_first_good_evaluation_after_a_gap() {
    let rules = rule("downscale_forbidden_window = \"15s\"", &fallback(8, false));
    let trace = rows(15 * 60, |t| (!(300..420).contains(&t)).then_some(20.0));
    let report = simulate(&rules, "load", &trace, &["--load-model", "per-replica"]);
    let events = events(&report);
    // At 8 from the first good row (420 s) until it has been good for 2m, then down one step at
    // a time at the downscale rate limit.
    let expected = [(0, 1, 2), (360, 2, 8), (540, 8, 7), (555, 7, 6), (570, 6, 5), (585, 5, 4)];
    assert_eq!(moves(&events), expected, "{events:#?}");
}

/// 2026-10-05T00:00:00Z, a Monday.
const MONDAY: i64 = 1_791_158_400;

/// A `[[autoscaler.metric]]` named `name` with its watermarks.
fn metric(name: &str, high: f64, low: f64) -> String {
    format!(
        "[[autoscaler.metric]]\nname = \"{name}\"\nbackend = \"prom\"\nquery = 'sum(rate({name}[1m]))'\n\
         high_watermark = {high}\nlow_watermark = {low}\n\n"
    )
}

/// The scale events whose reason names the forecast, for an `absolute` rule every 2 minutes
/// over `metrics`, forecasting 10 minutes ahead, on four weekdays of a CPU demand of 4 cores
/// that ramps to 16 from 09:00 to 09:20 (and an `rps` column that stays at 100).
fn raised_by_the_forecast(metrics: &str, columns: &str) -> usize {
    let rules = format!(
        "{BACKEND}[[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"shop\", name = \"web\" }}\n\
         interval = \"2m\"\nmin_replicas = 2\nmax_replicas = 40\nalgorithm = \"absolute\"\n\n{metrics}\
         [autoscaler.forecast]\nlead_time = \"10m\"\nmode = \"scale\"\nmax_error = 0.5\n"
    );
    let cores = |offset: i64| {
        let minute = offset % 86_400 / 60;
        match minute {
            _ if minute < 540 => 4.0,
            _ if minute < 560 => 4.0 + 12.0 * (minute - 540) as f64 / 20.0,
            _ if minute < 1_020 => 16.0,
            _ => 4.0,
        }
    };
    let rows: Vec<(i64, String)> = (0..4 * 86_400 / 120)
        .map(|step| {
            let offset = step * 120;
            let cells = if columns == "cpu" { format!("{}", cores(offset)) } else { format!("{},100", cores(offset)) };
            (MONDAY + offset, cells)
        })
        .collect();
    let report = simulate(&rules, columns, &rows, &["--load-model", "per-replica"]);
    let events = events(&report);
    events.iter().filter(|e| e.reason.contains("raised by the forecast 10m ahead")).count()
}

/// REVIEW-4 T4-8: a metric's forecast demand is divided by that metric's own high watermark.
/// A second metric with a much higher watermark (requests/s, high 100) must not take away the
/// CPU metric's floor (high 0.8): before the fix, cpu alone gave forecast-raised scale-ups and
/// cpu with rps none.
#[test]
fn each_metric_forecast_needs_replicas_at_its_own_high_watermark() {
    let cpu = metric("cpu", 0.8, 0.5);
    let alone = raised_by_the_forecast(&cpu, "cpu");
    assert!(alone > 0, "the forecast raises the floor ahead of the morning ramps");
    let with_rps = raised_by_the_forecast(&format!("{cpu}{}", metric("rps", 100.0, 50.0)), "cpu,rps");
    assert_eq!(with_rps, alone, "rps (always within one replica's worth) changes nothing");
}

/// The `(seconds since the Unix epoch, from, to)` of the scale-ups to 10 replicas of a rule whose
/// only floor above 2 is `schedule`, over a trace from 2027-03-26T22:00Z to 2027-03-29T06:00Z
/// whose CPU stays low (replicas come back down after each window).
fn scheduled_scale_ups(schedule: &str) -> Vec<i64> {
    let rules = format!(
        "{BACKEND}[[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"shop\", name = \"web\" }}\n\
         interval = \"1m\"\nmin_replicas = 2\nmax_replicas = 20\nalgorithm = \"absolute\"\n\n{}\
         [[autoscaler.schedule]]\ntime_zone = \"Europe/Paris\"\nmin_replicas = 10\n{schedule}",
        metric("cpu", 0.8, 0.5)
    );
    let start = 1_806_098_400; // 2027-03-26T22:00:00Z
    let end = 1_806_300_000; // 2027-03-29T06:00:00Z
    let rows: Vec<(i64, String)> = (start..=end).step_by(300).map(|at| (at, "0.1".to_string())).collect();
    let report = simulate(&rules, "cpu", &rows, &[]);
    events(&report).iter().filter(|e| e.to == 10 && e.from < 10).map(|e| e.at + T0).collect()
}

/// REVIEW-4 T4-9: a daily window 02:30-03:15 in Paris. On 2027-03-28 the clock goes from 02:00
/// straight to 03:00, so 02:30 never happens: the window opens when the clock jumps (03:00,
/// 01:00Z) and keeps its end. Before the fix the start resolved to 03:30, after the end, and
/// the window did not open that day at all.
#[test]
fn a_window_that_starts_in_the_spring_forward_gap_opens_when_the_clock_jumps() {
    let ups = scheduled_scale_ups("days = [\"daily\"]\nstart = \"02:30\"\nend = \"03:15\"\n");
    // 02:30 Paris is 01:30Z in winter (the 27th) and 00:30Z in summer (the 29th).
    assert_eq!(ups, [1_806_111_000, 1_806_195_600, 1_806_280_200], "27th 01:30Z, 28th 01:00Z, 29th 00:30Z");
    // A cron window in the gap opens there too.
    let ups = scheduled_scale_ups("cron = \"30 2 * * *\"\nduration = \"45m\"\n");
    assert_eq!(ups, [1_806_111_000, 1_806_195_600, 1_806_280_200]);
}
