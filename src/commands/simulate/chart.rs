//! The simulator's and backtest's chart: a replay (and in a comparison the other rule's, and
//! the actual replicas) as the input of the chart drawer (`domain::chart`), which lays it out
//! as a report: one panel per metric (usage against the watermarks and the tolerance band), a
//! replicas panel (proposed vs effective, min/max), and shaded spans where scaling was
//! restricted, all on one time axis.

use watermarkd_engine::{Algorithm, Rule, Timestamp};

use super::replay::{Cause, LoadModel, Replay, Restriction};
use super::report::{human_duration, Summary};
use crate::domain::chart::{
    self, short_time, Chart, EventKind, EventMark, Header, Layout, LineKind, MetricPanel, ReplicaLine, ReplicasPanel,
    SpanKind, Watermarks,
};

/// The rest of a `backtest --against` chart: the other rule's replay over the same history, and
/// what the target actually ran.
pub struct Against<'a> {
    /// How the legend and the header name the other rule (`--against FILE`).
    pub label: String,
    pub rule: &'a Rule,
    pub replay: &'a Replay,
    pub summary: &'a Summary,
    /// The target's actual replicas at each step, where the history had them.
    pub actual: &'a [(Timestamp, Option<u32>)],
}

impl Against<'_> {
    /// The other rule's watermarks (low, high) for the metric of this name, as its replay
    /// first evaluated them.
    fn watermarks(&self, metric: &str) -> Option<(f64, f64)> {
        let index = self.rule.metrics().iter().position(|m| m.name == metric)?;
        let first = self.replay.ticks.iter().find_map(|t| t.decision.metrics.get(index))?;
        Some((first.low_watermark, first.high_watermark))
    }

    /// The label shortened for the header's name column and the legend, keeping the end of a
    /// long path (the file name).
    fn short_label(&self) -> String {
        const MAX_CHARS: usize = 22;
        let count = self.label.chars().count();
        if count <= MAX_CHARS {
            return self.label.clone();
        }
        let tail: String = self.label.chars().skip(count - (MAX_CHARS - 1)).collect();
        format!("…{tail}")
    }
}

/// Renders the whole chart.
pub fn render_svg(rule: &Rule, replay: &Replay, summary: &Summary) -> String {
    chart::render(&replay_chart(rule, replay, summary, None))
}

/// Renders the chart of a backtest with `--against`: this rule's replay as `render_svg` draws
/// it, with the other rule's watermarks and effective replicas and the actual replicas beside.
pub fn render_comparison_svg(rule: &Rule, replay: &Replay, summary: &Summary, against: &Against<'_>) -> String {
    chart::render(&replay_chart(rule, replay, summary, Some(against)))
}

/// The replay as the drawer's input.
fn replay_chart(rule: &Rule, replay: &Replay, summary: &Summary, against: Option<&Against<'_>>) -> Chart {
    let (command, description) = match against {
        None => ("simulate", summary_line(summary)),
        Some(a) => {
            ("backtest", format!("this rule: {}. {}: {}", summary_line(summary), a.label, summary_line(a.summary)))
        }
    };
    let evaluations: Vec<(Timestamp, Option<SpanKind>)> =
        replay.ticks.iter().map(|t| (t.at(), Restriction::dominant(&t.decision).map(SpanKind::of))).collect();
    Chart {
        layout: Layout::report(against.is_some()),
        title: format!("watermarkd {command}: {}", summary.autoscaler),
        description,
        header: Some(header(rule, summary, against)),
        start: replay.start,
        end: replay.end,
        metrics: (0..rule.metrics().len()).map(|index| metric_panel(rule, replay, index, against)).collect(),
        replicas: replicas_panel(rule, replay, against),
        spans: chart::spans(&evaluations, replay.end),
    }
}

fn summary_line(s: &Summary) -> String {
    format!(
        "{} evaluations every {}; {} scale events ({} up, {} down{}); {:.1} replica-hours (average {:.1}); \
         replicas start {}, peak {}, final {}; above high watermark {}, below low watermark {}",
        s.evaluations,
        human_duration(s.interval_seconds),
        s.scale_ups + s.scale_downs,
        s.scale_ups,
        s.scale_downs,
        if s.manual_changes > 0 { format!(", {} manual", s.manual_changes) } else { String::new() },
        s.replica_hours,
        s.average_replicas,
        s.initial_replicas,
        s.peak_replicas,
        s.final_replicas,
        human_duration(s.seconds_above_high_watermark),
        human_duration(s.seconds_below_low_watermark),
    )
}

fn header(rule: &Rule, s: &Summary, against: Option<&Against<'_>>) -> Header {
    let compared = against.map_or(String::new(), |a| format!(": this rule and {}", a.label));
    let lag = if s.readiness_lag_seconds > 0.0 {
        format!(" · readiness lag {}", human_duration(s.readiness_lag_seconds))
    } else {
        String::new()
    };
    Header {
        headline: format!(
            "Autoscaler “{}” replayed over {}{compared}",
            s.autoscaler,
            human_duration(s.duration_seconds)
        ),
        context: format!(
            "{} → {} (UTC) · evaluated every {}{lag} · {} algorithm · load model: {} · replicas {}–{}",
            short_time(s.start),
            short_time(s.end),
            human_duration(s.interval_seconds),
            rule.algorithm(),
            s.load_model.describe(),
            rule.min_replicas(),
            rule.max_replicas(),
        ),
        figures: figures(s).into_iter().map(|(label, value)| (label.to_string(), value)).collect(),
        compared: against.map(|a| (a.short_label(), figures(a.summary).into_iter().map(|(_, value)| value).collect())),
    }
}

/// A replay's headline numbers, labelled.
fn figures(s: &Summary) -> [(&'static str, String); 6] {
    let manual = if s.manual_changes > 0 { format!(" +{} manual", s.manual_changes) } else { String::new() };
    [
        ("scale events", format!("{} ({}↑ {}↓{manual})", s.scale_ups + s.scale_downs, s.scale_ups, s.scale_downs)),
        ("replica-hours", format!("{:.1} (avg {:.1})", s.replica_hours, s.average_replicas)),
        ("replicas", format!("{} → peak {} → {}", s.initial_replicas, s.peak_replicas, s.final_replicas)),
        ("above high", percent_of(s.seconds_above_high_watermark, s.duration_seconds)),
        ("below low", percent_of(s.seconds_below_low_watermark, s.duration_seconds)),
        ("evaluations", s.evaluations.to_string()),
    ]
}

fn percent_of(part: f64, whole: f64) -> String {
    let percent = if whole > 0.0 { 100.0 * part / whole } else { 0.0 };
    format!("{} ({percent:.0}%)", human_duration(part))
}

/// One metric's usage at each evaluation, against the watermarks of its first evaluation.
fn metric_panel(rule: &Rule, replay: &Replay, index: usize, against: Option<&Against<'_>>) -> MetricPanel {
    let name = rule.metrics().get(index).map_or("", |m| m.name.as_str());
    let outcomes = || replay.ticks.iter().filter_map(|t| t.decision.metrics.get(index).map(|m| (t.at(), m)));
    let watermarks = outcomes().next().map(|(at, first)| Watermarks {
        from: at,
        low: first.low_watermark,
        high: first.high_watermark,
        band_low: first.band_low,
        band_high: first.band_high,
    });
    MetricPanel {
        titles: metric_titles(rule, replay, name),
        value_label: "usage".to_string(),
        values: outcomes().map(|(at, outcome)| (at, outcome.usage)).collect(),
        watermarks: watermarks.into_iter().collect(),
        tolerance: Some((rule.upscale_tolerance().to_f64(), rule.downscale_tolerance().to_f64())),
        theirs: against.and_then(|a| a.watermarks(name)),
    }
}

/// A metric panel's titles: the metric and what its value is per the algorithm and load model,
/// a shorter explanation, the name alone.
fn metric_titles(rule: &Rule, replay: &Replay, name: &str) -> Vec<String> {
    let (full, short) = match rule.algorithm() {
        Algorithm::Absolute if replay.options.load_model == LoadModel::PerReplica => (
            "per ready replica (per-replica load model: trace demand ÷ simulated ready replicas)",
            "per ready replica (demand ÷ ready)",
        ),
        Algorithm::Absolute => {
            ("(absolute: the value is the per-replica load, replayed as recorded)", "(absolute, as recorded)")
        }
        Algorithm::Average => {
            ("per ready replica (average: trace total ÷ ready replicas)", "per ready replica (total ÷ ready)")
        }
    };
    vec![format!("{name} {full}"), format!("{name} {short}"), name.to_string()]
}

/// The replicas: proposed, ready when it lags, the spec this rule ran (and in a comparison
/// the other rule's and the actual), and where a person set the count.
fn replicas_panel(rule: &Rule, replay: &Replay, against: Option<&Against<'_>>) -> ReplicasPanel {
    let line = |kind, label: &str, points| ReplicaLine { kind, label: label.to_string(), points };
    let mut lines = vec![line(
        LineKind::Proposed,
        "proposed by the metrics",
        replay.ticks.iter().map(|t| (t.at(), t.decision.proposal)).collect(),
    )];
    if replay.options.readiness_lag > std::time::Duration::ZERO {
        lines.push(line(
            LineKind::Ready,
            "ready",
            replay.ticks.iter().map(|t| (t.at(), Some(t.decision.ready_replicas))).collect(),
        ));
    }
    match against {
        None => lines.push(line(LineKind::Effective, "effective (spec)", effective_points(replay))),
        Some(a) => {
            lines.push(line(LineKind::Effective, "this rule", effective_points(replay)));
            lines.push(line(LineKind::Against, &a.short_label(), effective_points(a.replay)));
            if a.actual.iter().any(|(_, r)| r.is_some()) {
                lines.push(line(LineKind::Actual, "actual", a.actual.to_vec()));
            }
        }
    }
    let events = replay
        .changes
        .iter()
        .filter(|c| c.cause == Cause::Manual)
        .map(|c| EventMark { at: c.at, from: c.from, to: c.to, kind: EventKind::Manual })
        .collect();
    ReplicasPanel { min: rule.min_replicas(), max: rule.max_replicas(), lines, events }
}

/// The spec the workload ran, from the exact change times.
fn effective_points(replay: &Replay) -> Vec<(Timestamp, Option<u32>)> {
    let mut points = vec![(replay.start, Some(replay.initial_replicas))];
    points.extend(replay.changes.iter().map(|c| (c.at, Some(c.to))));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `d` of the one path drawn with this class.
    fn path_of<'s>(svg: &'s str, class: &str) -> &'s str {
        let marker = format!("class=\"{class}\"");
        let line = svg.lines().find(|l| l.contains(&marker)).unwrap_or_else(|| panic!("no {class} in the chart"));
        let d = line.strip_prefix("<path d=\"").unwrap_or_else(|| panic!("{class} is not a path: {line}"));
        &d[..d.find('"').unwrap()]
    }

    #[test]
    fn a_comparison_draws_both_rules_and_the_actual_replicas() {
        use crate::commands::simulate::replay::tests::{options, rule, trace, T0};
        use crate::commands::simulate::simulate;
        use watermarkd_engine::Decimal;

        // 300 is above this rule's high watermark (100), not above the other's (400).
        let this = rule(|_| {});
        let other = rule(|spec| spec.metrics[0].high_watermark = Some(Decimal::from_int(400)));
        let rows = trace(&[
            (0, Some(80.0), Some(2)),
            (60, Some(300.0), None),
            (120, Some(300.0), None),
            (180, Some(80.0), None),
        ]);
        let ours = simulate("web", &this, &rows, options(60)).unwrap();
        let theirs = simulate("web", &other, &rows, options(60)).unwrap();
        assert!(ours.summary.scale_ups > 0 && theirs.summary.scale_ups == 0, "{:?} {:?}", ours.summary, theirs.summary);
        let at = |offset: i64| Timestamp::from_unix_millis((T0 + offset) * 1000);
        let actual = [(at(0), Some(2)), (at(60), Some(3)), (at(120), None), (at(180), Some(3))];
        let against = Against {
            label: "--against <old>.toml".to_string(),
            rule: &other,
            replay: &theirs.replay,
            summary: &theirs.summary,
            actual: &actual,
        };
        let svg = render_comparison_svg(&this, &ours.replay, &ours.summary, &against);

        let (rule_line, against_line, actual_line) =
            (path_of(&svg, "replicas-rule"), path_of(&svg, "replicas-against"), path_of(&svg, "replicas-actual"));
        assert!(rule_line.starts_with('M') && against_line.starts_with('M'), "{rule_line} / {against_line}");
        // This rule steps up; the other holds at 2 (one segment); the actual replicas lift the
        // pen where they are unknown.
        assert!(rule_line.matches(" L").count() > 1, "{rule_line}");
        assert_eq!(against_line.matches(" L").count(), 1, "{against_line}");
        assert_eq!(actual_line.matches('M').count(), 2, "{actual_line}");

        for text in
            [">this rule<", ">--against &lt;old&gt;.toml<", ">actual<", ">against high 400<", ">against low 50<"]
        {
            assert!(svg.contains(text), "no {text} in the chart");
        }
        assert!(!svg.contains("<old>"), "an unescaped label");
        assert!(svg.contains("<title>watermarkd backtest: web</title>"));

        // The single-rule chart is unchanged by all this.
        let single = render_svg(&this, &ours.replay, &ours.summary);
        assert!(!single.contains("against") && !single.contains("class=\"replicas-"), "{single}");
        assert!(single.contains(">effective (spec)<") && !svg.contains(">effective (spec)<"));
    }
}
