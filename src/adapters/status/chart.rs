//! An autoscaler's recent history as the status page draws it: the board's samples as the input
//! of the chart drawer (`domain::chart`), the one the simulator uses. Each metric's panel shows
//! the quantity its band is compared with (per ready replica for an `average` rule), against
//! the watermarks and the hold band as they were at each sample; the replicas panel the
//! replicas decided and proposed and the scale events; the spans shade what held or bent each
//! evaluation, a fallback deciding, an evaluation failing.

use watermarkd_engine::Timestamp;

use super::board::{Compared, Detail, Last, SampleView};
use crate::domain::chart::{
    self, Chart, EventKind, EventMark, Layout, LineKind, MetricPanel, ReplicaLine, ReplicasPanel, SpanKind, Watermarks,
};
use crate::domain::markup::escape;
use crate::domain::status::explain::span;
use crate::domain::status::history::Marks;

/// The figure's width on a wide screen and on a phone, in px: the page shows the one that fits.
pub const WIDE: f64 = 960.0;
pub const NARROW: f64 = 360.0;

/// The chart of the detail's history at a wide and a narrow width (the page's style shows one),
/// with its caption; `None` without history.
pub fn figure(detail: &Detail, now: i64) -> Option<String> {
    let wide = history_chart(detail, now, Layout::figure(WIDE))?;
    let narrow = Chart { layout: Layout::figure(NARROW), ..wide.clone() };
    let caption = caption(detail);
    Some(format!(
        "<figure class=\"history\"><div class=\"wide\">{}</div><div class=\"narrow\">{}</div><figcaption>{}</figcaption></figure>",
        chart::render(&wide),
        chart::render(&narrow),
        escape(&caption)
    ))
}

/// What the values are, in words under the chart.
fn caption(detail: &Detail) -> String {
    let quantity = match detail.history.compared {
        Compared::PerReplica => {
            "each metric per ready replica (an average rule compares its total ÷ the ready replicas)"
        }
        Compared::Value => "each metric's value as read (an absolute rule compares it as it is)",
    };
    format!("Times in UTC. Values: {quantity}, against its watermarks and the band they hold in.")
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_unix_millis(seconds.saturating_mul(1000))
}

/// The history as the drawer's input: from the first sample to now.
pub fn history_chart(detail: &Detail, now: i64, layout: Layout) -> Option<Chart> {
    let samples = &detail.history.samples;
    let (first, newest) = (samples.first()?, samples.last()?);
    let last = detail.last.as_ref()?;
    let (start, end) = (at(first.at), at(newest.at.max(now)));
    let evaluations: Vec<(Timestamp, Option<SpanKind>)> = samples.iter().map(|s| (at(s.at), shade(s))).collect();
    let name = &detail.summary.identity.name;
    let compared = match detail.history.compared {
        Compared::PerReplica => "per ready replica",
        Compared::Value => "as read",
    };
    Some(Chart {
        layout,
        title: format!("{name}: the last {} of evaluations", span((newest.at - first.at) as f64)),
        description: format!(
            "Each metric {compared} against its watermarks and hold band, the replicas decided and proposed, \
             and where scaling was held back, from {} to {} (UTC).",
            chart::short_time(start),
            chart::short_time(end)
        ),
        header: None,
        start,
        end,
        metrics: detail
            .history
            .metrics
            .iter()
            .enumerate()
            .map(|(index, metric)| metric_panel(detail, last, index, metric))
            .collect(),
        replicas: replicas_panel(detail, last),
        spans: chart::spans(&evaluations, end),
    })
}

/// What a sample's span shades: a failure, a fallback deciding, else what held or bent it.
fn shade(sample: &SampleView) -> Option<SpanKind> {
    let marks = Marks::from_names(&sample.marks);
    if marks.contains(Marks::FAILED) {
        Some(SpanKind::Failed)
    } else if marks.contains(Marks::FALLBACK) {
        Some(SpanKind::Fallback)
    } else {
        sample.restricted_by.map(SpanKind::of)
    }
}

fn metric_panel(detail: &Detail, last: &Last, index: usize, name: &str) -> MetricPanel {
    let samples = &detail.history.samples;
    let (up, down) = (last.upscale_tolerance, last.downscale_tolerance);
    let mut watermarks: Vec<Watermarks> = Vec::new();
    for sample in samples {
        let Some([low, high]) = sample.watermarks.get(index).copied() else { continue };
        let (low, high) = (f64::from(low), f64::from(high));
        if watermarks.last().is_none_or(|w| (w.low, w.high) != (low, high)) {
            let band = (low * (1.0 - down), high * (1.0 + up));
            watermarks.push(Watermarks { from: at(sample.at), low, high, band_low: band.0, band_high: band.1 });
        }
    }
    let (titles, value_label) = match detail.history.compared {
        Compared::PerReplica => (
            vec![
                format!("{name} per ready replica (average: the total ÷ the ready replicas)"),
                format!("{name} per ready replica"),
                name.to_string(),
            ],
            "value per ready replica",
        ),
        Compared::Value => (
            vec![format!("{name} (absolute: the value as read)"), format!("{name} (absolute)"), name.to_string()],
            "value",
        ),
    };
    MetricPanel {
        titles,
        value_label: value_label.to_string(),
        values: samples
            .iter()
            .map(|s| (at(s.at), s.values.get(index).copied().flatten().map(f64::from).filter(|v| v.is_finite())))
            .collect(),
        watermarks,
        tolerance: Some((up, down)),
        theirs: None,
    }
}

fn replicas_panel(detail: &Detail, last: &Last) -> ReplicasPanel {
    let samples = &detail.history.samples;
    let lines = vec![
        ReplicaLine {
            kind: LineKind::Proposed,
            label: "proposed by the metrics".to_string(),
            points: samples.iter().map(|s| (at(s.at), s.proposed)).collect(),
        },
        ReplicaLine {
            kind: LineKind::Effective,
            label: "decided".to_string(),
            points: samples.iter().map(|s| (at(s.at), Some(s.replicas))).collect(),
        },
    ];
    let events = detail
        .history
        .events
        .iter()
        .map(|e| EventMark { at: at(e.at), from: e.from, to: e.to, kind: EventKind::Scaled { written: e.written } })
        .collect();
    ReplicasPanel { min: last.min_replicas, max: last.max_replicas, lines, events }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::status::board::Board;
    use crate::domain::outcome::{Identity, Ledger, Outcome, SeriesLabels};
    use serde_json::json;
    use std::sync::Arc;
    use watermarkd_engine::{decide, Reading, State as EngineState, Target};

    const T0: i64 = 1_714_600_800; // 2024-05-01T22:00:00Z

    fn board(name: &str, rule: &serde_json::Value, totals: &[Option<f64>]) -> (Board, String) {
        let ledger = Arc::new(Ledger::new(std::time::Duration::from_secs(3600)));
        let id = format!("file/{name}");
        let labels = Arc::new(SeriesLabels::deployment(name, "prod", false));
        ledger.admit(Identity::rules_file(Arc::clone(&labels), &["prom"], 60, (1, 10)));
        let rule = crate::domain::rules::rule_from_json(rule).unwrap();
        let (mut spec, mut state) = (2, EngineState::default());
        for (i, total) in totals.iter().enumerate() {
            let now = Timestamp::from_unix_millis((T0 + 60 * i as i64) * 1000);
            let reading = match total {
                Some(value) => Reading::Value { value: *value, at: now },
                None => Reading::Unavailable { reason: "no data".into() },
            };
            let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
            let decision = decide(&rule, target, &[reading], &state, now);
            let scaled = decision.replicas != spec;
            (spec, state) = (decision.replicas, decision.state.clone());
            ledger.record(&id, &labels, Outcome::of_decision(decision, &rule, scaled));
        }
        (Board::new(ledger), id)
    }

    fn average_rule() -> serde_json::Value {
        json!({
            "min_replicas": 1, "max_replicas": 10, "algorithm": "average", "tolerance": 0.1,
            "upscale_forbidden_window": "1h", "downscale_forbidden_window": "1h",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        })
    }

    #[test]
    fn an_average_rule_is_drawn_per_replica_against_its_band_with_the_window_that_held_it() {
        // 40 over 2 ready is 20 per replica, above the band: up to 3, as far as the rate limit
        // lets it; then 45 over 3 is 15, still above, and the upscale window holds it.
        let totals = [Some(40.0), Some(45.0), Some(45.0), Some(45.0), None, Some(45.0)];
        let (board, id) = board("web", &average_rule(), &totals);
        let detail = board.detail(&id).unwrap();
        let now = T0 + 6 * 60;
        let chart = history_chart(&detail, now, Layout::figure(WIDE)).unwrap();
        let values: Vec<Option<f64>> = chart.metrics[0].values.iter().map(|(_, v)| *v).collect();
        assert_eq!(values, [Some(20.0), Some(15.0), Some(15.0), Some(15.0), None, Some(15.0)]);
        let band = chart.metrics[0].watermarks[0];
        assert_eq!((band.low, band.high, band.band_low, band.band_high), (5.0, 10.0, 4.5, 11.0));
        let kinds: Vec<SpanKind> = chart.spans.iter().map(|s| s.kind).collect();
        let expected = [SpanKind::UpscaleCapping, SpanKind::Window, SpanKind::NoData, SpanKind::Window];
        assert_eq!(kinds, expected, "{:?}", chart.spans);
        assert_eq!(chart.end, at(now));

        let svg = chart::render(&chart);
        for expected in [
            ">load per ready replica (average: the total ÷ the ready replicas)<",
            ">value per ready replica<",
            ">hold band (±10%: 4.5 – 11)<",
            ">high 10<",
            ">low 5<",
            ">now 15<",
            "<rect class=\"shade window\"",
            "<title>forbidden window: 2024-05-01 22:01 to 2024-05-01 22:04 (UTC)</title>",
            "<rect class=\"shade no-data\"",
            ">restricted:<",
            ">22:00<",
            ">Wed 05-01<",
            "class=\"replicas-rule\"",
            "<g class=\"event\"><title>scaled up from 2 to 3 at 2024-05-01 22:00 (UTC)</title>",
        ] {
            assert!(svg.contains(expected), "{expected} in {svg}");
        }
        // The value's line breaks where there was no value: two pieces.
        let value_path = svg.lines().find(|l| l.starts_with("<path class=\"value\"")).unwrap();
        assert_eq!(value_path.matches('M').count(), 2, "{value_path}");
        assert!(value_path.contains(" h0\""), "the value alone after the gap is a dot: {value_path}");

        let page = figure(&detail, now).unwrap();
        assert_eq!(page.matches("<svg class=\"chart\"").count(), 2, "a wide and a narrow drawing");
        assert!(page.contains("viewBox=\"0 0 960 ") && page.contains("viewBox=\"0 0 360 "), "{page}");
    }

    #[test]
    fn without_history_there_is_no_chart() {
        let (board, id) = board("idle", &average_rule(), &[]);
        assert!(figure(&board.detail(&id).unwrap(), T0).is_none());
    }
}
