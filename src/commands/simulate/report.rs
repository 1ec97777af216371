//! What a replay amounts to: the scale events and a summary, as text for a terminal or as JSON.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;
use watermarkd_engine::{Guard, Limit, Position, Timestamp};

use super::replay::{Cause, LoadModel, Replay, Restriction, ScaleChange};

/// The numbers a replay is judged by.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub autoscaler: String,
    pub start: Timestamp,
    pub end: Timestamp,
    pub duration_seconds: f64,
    pub interval_seconds: f64,
    pub readiness_lag_seconds: f64,
    /// How the recorded values were related to the simulated replicas.
    pub load_model: LoadModel,
    pub evaluations: usize,
    /// Scales the engine decided.
    pub scale_ups: usize,
    pub scale_downs: usize,
    /// Changes a person made (the trace's `replicas` column).
    pub manual_changes: usize,
    /// The integral of spec replicas over the trace, in replica-hours.
    pub replica_hours: f64,
    pub average_replicas: f64,
    pub initial_replicas: u32,
    pub peak_replicas: u32,
    pub lowest_replicas: u32,
    pub final_replicas: u32,
    /// Time some metric spent above its high watermark (with tolerance), measured per evaluation.
    pub seconds_above_high_watermark: f64,
    pub seconds_below_low_watermark: f64,
    /// How often the metrics went from not-above to above the high watermark.
    pub high_watermark_crossings: usize,
    pub low_watermark_crossings: usize,
    pub restricted: RestrictionCounts,
}

/// How many evaluations each restriction affected. An evaluation may count under a limit
/// *and* under a timing block (capped, then held by a window).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RestrictionCounts {
    /// `decision.limit`: what bound the proposal.
    pub upscale_capping: usize,
    pub downscale_capping: usize,
    pub too_few: usize,
    pub too_many: usize,
    pub not_ready: usize,
    /// A scale was due and a forbidden window or a delay held it.
    pub upscale_window: usize,
    pub upscale_delay: usize,
    pub downscale_window: usize,
    pub downscale_delay: usize,
    /// Some metric had no data.
    pub missing_data: usize,
    /// Guards that held the decision, by name (`no_data`, `min_available`, ...).
    pub guards: BTreeMap<String, usize>,
}

/// The JSON document `--json` prints.
#[derive(Serialize)]
pub struct JsonReport<'a> {
    pub events: &'a [ScaleChange],
    pub summary: &'a Summary,
    /// The same rule without its schedule and forecast, when it has either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without_ahead: Option<&'a Summary>,
}

/// One line comparing a replay with its schedule, forecast and fallback against one without them.
pub fn write_ahead_comparison(out: &mut impl Write, with: &Summary, without: &Summary) -> io::Result<()> {
    let minutes = |s: &Summary| s.seconds_above_high_watermark / 60.0;
    writeln!(
        out,
        "\nWith its schedule, forecast and fallback: {:.0} minutes above the high watermark, {:.1} \
         replica-hours; without them: {:.0} minutes, {:.1} replica-hours.",
        minutes(with),
        with.replica_hours,
        minutes(without),
        without.replica_hours
    )
}

pub fn summarize(autoscaler: &str, replay: &Replay) -> Summary {
    let duration = replay.end.since(replay.start);
    let interval = replay.options.interval;
    let mut summary = Summary {
        autoscaler: autoscaler.to_string(),
        start: replay.start,
        end: replay.end,
        duration_seconds: duration.as_secs_f64(),
        interval_seconds: interval.as_secs_f64(),
        readiness_lag_seconds: replay.options.readiness_lag.as_secs_f64(),
        load_model: replay.options.load_model,
        evaluations: replay.ticks.len(),
        scale_ups: 0,
        scale_downs: 0,
        manual_changes: 0,
        replica_hours: replica_hours(replay.initial_replicas, &replay.changes, replay.start, replay.end),
        average_replicas: 0.0,
        initial_replicas: replay.initial_replicas,
        peak_replicas: replay.initial_replicas,
        lowest_replicas: replay.initial_replicas,
        final_replicas: replay.changes.last().map_or(replay.initial_replicas, |c| c.to),
        seconds_above_high_watermark: 0.0,
        seconds_below_low_watermark: 0.0,
        high_watermark_crossings: 0,
        low_watermark_crossings: 0,
        restricted: RestrictionCounts::default(),
    };
    summary.average_replicas = if duration.is_zero() {
        f64::from(replay.initial_replicas)
    } else {
        summary.replica_hours * 3600.0 / duration.as_secs_f64()
    };
    for change in &replay.changes {
        match (change.cause, change.is_up()) {
            (Cause::Manual, _) => summary.manual_changes += 1,
            (Cause::Autoscaler, true) => summary.scale_ups += 1,
            (Cause::Autoscaler, false) => summary.scale_downs += 1,
        }
        summary.peak_replicas = summary.peak_replicas.max(change.to);
        summary.lowest_replicas = summary.lowest_replicas.min(change.to);
    }

    let (mut was_above, mut was_below) = (false, false);
    for tick in &replay.ticks {
        let decision = &tick.decision;
        // Each evaluation stands for the time until the next one (the last for none).
        let covered = replay.end.since(tick.at()).min(interval).as_secs_f64();
        if decision.above_high_watermark {
            summary.seconds_above_high_watermark += covered;
        }
        if decision.below_low_watermark {
            summary.seconds_below_low_watermark += covered;
        }
        summary.high_watermark_crossings += usize::from(decision.above_high_watermark && !was_above);
        summary.low_watermark_crossings += usize::from(decision.below_low_watermark && !was_below);
        (was_above, was_below) = (decision.above_high_watermark, decision.below_low_watermark);

        let counts = &mut summary.restricted;
        match decision.limit {
            Limit::WithinRange
            | Limit::ScaledToZero
            | Limit::Paused
            | Limit::NoData
            | Limit::MinAvailable
            | Limit::NoReadyReplicas => {}
            Limit::UpscaleCapping => counts.upscale_capping += 1,
            Limit::DownscaleCapping => counts.downscale_capping += 1,
            Limit::TooFew | Limit::BelowMin => counts.too_few += 1,
            Limit::TooMany | Limit::AboveMax => counts.too_many += 1,
            Limit::NotReady => counts.not_ready += 1,
        }
        match Restriction::timing_block(decision) {
            Some(Restriction::UpscaleWindow) => counts.upscale_window += 1,
            Some(Restriction::UpscaleDelay) => counts.upscale_delay += 1,
            Some(Restriction::DownscaleWindow) => counts.downscale_window += 1,
            Some(Restriction::DownscaleDelay) => counts.downscale_delay += 1,
            _ => {}
        }
        if decision.metrics.iter().any(|m| m.position == Position::Unavailable) {
            counts.missing_data += 1;
        }
        if let Some(guard) = decision.guard {
            *counts.guards.entry(guard_name(guard).to_string()).or_default() += 1;
        }
    }
    summary
}

fn guard_name(guard: Guard) -> &'static str {
    match guard {
        Guard::Paused => "paused",
        Guard::AtZero => "at_zero",
        Guard::NoData => "no_data",
        Guard::AboveMax => "above_max",
        Guard::BelowMin => "below_min",
        Guard::MinAvailable => "min_available",
        Guard::NoReadyReplicas => "no_ready_replicas",
    }
}

/// The integral of the spec replica count from `start` to `end`, in replica-hours. The count
/// is a step function: `initial` until the first change, then each change's `to`.
pub fn replica_hours(initial: u32, changes: &[ScaleChange], start: Timestamp, end: Timestamp) -> f64 {
    let mut replica_ms: f64 = 0.0;
    let (mut replicas, mut since) = (initial, start);
    for change in changes {
        let at = change.at.clamp(start, end);
        replica_ms += f64::from(replicas) * at.since(since).as_millis() as f64;
        (replicas, since) = (change.to, at);
    }
    replica_ms += f64::from(replicas) * end.since(since).as_millis() as f64;
    replica_ms / 3_600_000.0
}

/// A duration as a person reads it: `2h 5m`, `45s`, `0s`.
pub fn human_duration(seconds: f64) -> String {
    let total = seconds.round().max(0.0) as u64;
    let (days, hours, minutes, secs) = (total / 86_400, total / 3600 % 24, total / 60 % 60, total % 60);
    let parts: Vec<String> = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
        .iter()
        .filter(|(value, _)| *value > 0)
        .map(|(value, unit)| format!("{value}{unit}"))
        .collect();
    if parts.is_empty() {
        "0s".into()
    } else {
        parts.join(" ")
    }
}

/// `+HH:MM:SS` since the start: easier to relate to the chart than a wall-clock time alone.
fn offset(at: Timestamp, start: Timestamp) -> String {
    let secs = at.since(start).as_secs();
    format!("+{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// `1 crossing`, `3 crossings`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn percent(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        return "0%".into();
    }
    let p = 100.0 * part / whole;
    if p > 0.0 && p < 0.1 {
        "<0.1%".into()
    } else {
        format!("{p:.1}%")
    }
}

/// The text report: one line per scale event, then the summary.
pub fn write_text(out: &mut impl Write, replay: &Replay, summary: &Summary) -> io::Result<()> {
    writeln!(
        out,
        "Autoscaler {:?}: {} to {} ({}), evaluated every {}, readiness lag {}, load model: {}",
        summary.autoscaler,
        summary.start,
        summary.end,
        human_duration(summary.duration_seconds),
        human_duration(summary.interval_seconds),
        human_duration(summary.readiness_lag_seconds),
        summary.load_model.describe(),
    )?;
    writeln!(out)?;
    if replay.changes.is_empty() {
        writeln!(out, "No scale events: the replica count stayed at {}.", replay.initial_replicas)?;
    } else {
        writeln!(out, "Scale events ({}):", replay.changes.len())?;
        let width = replay.changes.iter().map(|c| c.from.max(c.to)).max().unwrap_or(0).to_string().len();
        for change in &replay.changes {
            let who = match change.cause {
                Cause::Autoscaler => "",
                Cause::Manual => "manual: ",
            };
            writeln!(
                out,
                "  {}  {}  {:>width$} -> {:<width$}  {who}{}",
                change.at,
                offset(change.at, replay.start),
                change.from,
                change.to,
                change.reason
            )?;
        }
    }
    writeln!(out)?;
    write_summary(out, summary)
}

fn write_summary(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    let row = |out: &mut dyn Write, label: &str, value: String| writeln!(out, "  {label:<26}{value}");
    writeln!(out, "Summary:")?;
    row(out, "evaluations", s.evaluations.to_string())?;
    let manual = if s.manual_changes > 0 { format!(", plus {} manual", s.manual_changes) } else { String::new() };
    row(
        out,
        "scale events",
        format!("{} ({} up, {} down{manual})", s.scale_ups + s.scale_downs, s.scale_ups, s.scale_downs),
    )?;
    row(out, "replica-hours", format!("{:.1} (average {:.1} replicas)", s.replica_hours, s.average_replicas))?;
    row(
        out,
        "replicas",
        format!(
            "start {}, peak {}, lowest {}, final {}",
            s.initial_replicas, s.peak_replicas, s.lowest_replicas, s.final_replicas
        ),
    )?;
    row(
        out,
        "above high watermark",
        format!(
            "{} ({} of the time, {})",
            human_duration(s.seconds_above_high_watermark),
            percent(s.seconds_above_high_watermark, s.duration_seconds),
            count(s.high_watermark_crossings, "crossing")
        ),
    )?;
    row(
        out,
        "below low watermark",
        format!(
            "{} ({} of the time, {})",
            human_duration(s.seconds_below_low_watermark),
            percent(s.seconds_below_low_watermark, s.duration_seconds),
            count(s.low_watermark_crossings, "crossing")
        ),
    )?;

    let r = &s.restricted;
    let lines: Vec<(&str, usize)> = [
        ("upscale capped (limit)", r.upscale_capping),
        ("downscale capped (limit)", r.downscale_capping),
        ("raised to min_replicas", r.too_few),
        ("lowered to max_replicas", r.too_many),
        ("held: replicas not ready", r.not_ready),
        ("upscale held by window", r.upscale_window),
        ("upscale held by delay", r.upscale_delay),
        ("downscale held by window", r.downscale_window),
        ("downscale held by delay", r.downscale_delay),
        ("metric data missing", r.missing_data),
    ]
    .into_iter()
    .filter(|(_, count)| *count > 0)
    .collect();
    let guards: Vec<String> = r.guards.iter().map(|(name, count)| format!("{name} {count}")).collect();
    if lines.is_empty() && guards.is_empty() {
        writeln!(out, "  restricted evaluations    none")?;
        return Ok(());
    }
    writeln!(out, "  restricted evaluations (of {}):", s.evaluations)?;
    for (label, count) in lines {
        writeln!(out, "    {label:<26}{count:>6}")?;
    }
    if !guards.is_empty() {
        writeln!(out, "    {:<26}{}", "guards", guards.join(", "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_millis(secs * 1000)
    }

    fn change(secs: i64, from: u32, to: u32) -> ScaleChange {
        ScaleChange { at: at(secs), from, to, cause: Cause::Autoscaler, reason: String::new() }
    }

    #[test]
    fn the_summary_adds_up_a_small_replay() {
        use crate::commands::simulate::replay::{replay, ReplayOptions};
        use crate::commands::simulate::trace::parse_trace;
        use std::time::Duration;
        use watermarkd_engine::{Decimal, MetricSpec, Rule, RuleSpec};

        let rule = Rule::new(RuleSpec {
            min_replicas: Some(1),
            max_replicas: Some(4),
            tolerance: Some(Decimal::zero()),
            metrics: vec![MetricSpec {
                name: "m".into(),
                low_watermark: Some(Decimal::from_int(50)),
                high_watermark: Some(Decimal::from_int(100)),
                max_age: None,
                activation: None,
            }],
            upscale_forbidden_window: Some(Duration::ZERO),
            downscale_forbidden_window: Some(Duration::ZERO),
            scale_up_limit_factor: Some(Decimal::from_int(1000)),
            scale_down_limit_factor: Some(Decimal::from_int(99)),
            ..Default::default()
        })
        .unwrap();
        // Evaluations every 30s: inside, above (2 -> 3), above (3 -> 5, max 4), inside,
        // below (4 -> 2), inside.
        let text = "timestamp,m,replicas\n0,70,2\n30,150,\n60,150,\n90,70,\n120,30,\n150,70,\n";
        let trace = parse_trace(text, &["m".to_string()]).unwrap();
        let options = ReplayOptions {
            interval: Duration::from_secs(30),
            readiness_lag: Duration::ZERO,
            initial_replicas: None,
            load_model: LoadModel::Recorded,
        };
        let replay = replay(&rule, &trace, options).unwrap();
        let summary = summarize("test", &replay);

        assert_eq!(summary.evaluations, 6);
        assert_eq!((summary.scale_ups, summary.scale_downs, summary.manual_changes), (2, 1, 0));
        assert_eq!(
            (summary.initial_replicas, summary.peak_replicas, summary.lowest_replicas, summary.final_replicas),
            (2, 4, 2, 2)
        );
        // 2 x 30s + 3 x 30s + 4 x 60s + 2 x 30s = 450 replica-seconds.
        assert!((summary.replica_hours - 450.0 / 3600.0).abs() < 1e-12, "{}", summary.replica_hours);
        assert!((summary.average_replicas - 3.0).abs() < 1e-12, "{}", summary.average_replicas);
        assert_eq!(summary.seconds_above_high_watermark, 60.0);
        assert_eq!(summary.seconds_below_low_watermark, 30.0);
        assert_eq!((summary.high_watermark_crossings, summary.low_watermark_crossings), (1, 1));
        assert_eq!(summary.restricted, RestrictionCounts { too_many: 1, ..Default::default() });

        let mut text = Vec::new();
        write_text(&mut text, &replay, &summary).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("scale events              3 (2 up, 1 down)"), "{text}");
        assert!(text.contains("replica-hours             0.1 (average 3.0 replicas)"), "{text}");
        assert!(text.contains("lowered to max_replicas        1"), "{text}");
        assert!(text.contains("+00:01:00  3 -> 4"), "{text}");
    }

    #[test]
    fn replica_hours_integrate_the_step_function() {
        // 2 replicas for 1h, 5 for 30m, 3 for 30m: 2 + 2.5 + 1.5 = 6.
        let changes = [change(3600, 2, 5), change(5400, 5, 3)];
        let hours = replica_hours(2, &changes, at(0), at(7200));
        assert!((hours - 6.0).abs() < 1e-9, "{hours}");
        // No change at all: replicas x hours.
        assert!((replica_hours(4, &[], at(0), at(1800)) - 2.0).abs() < 1e-9);
        // A change at the very end adds nothing.
        assert!((replica_hours(4, &[change(1800, 4, 9)], at(0), at(1800)) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn durations_read_like_a_person_wrote_them() {
        assert_eq!(human_duration(0.0), "0s");
        assert_eq!(human_duration(45.0), "45s");
        assert_eq!(human_duration(3600.0 + 5.0 * 60.0), "1h 5m");
        assert_eq!(human_duration(2.0 * 86_400.0 + 30.0), "2d 30s");
        assert_eq!(offset(at(3600 * 25 + 61), at(0)), "+25:01:01");
        assert_eq!(percent(1.0, 3.0), "33.3%");
        assert_eq!(percent(1.0, 10_000.0), "<0.1%");
    }
}
