//! The `wpa_controller_*` series, with the Datadog controller's names and labels so that its
//! dashboards keep working. Gauges describe the latest evaluation: each evaluation replaces every
//! series of its autoscaler (a metric without a value has no value sample, never a 0), and an
//! autoscaler that goes away takes all its series with it.
//!
//! They are kept here, not in `prometheus` collectors: one compact record per autoscaler (its
//! label set rendered once, then numbers), written out in the text format at scrape time in
//! chunks. The `prometheus` crate's labelled vectors cost about 14 kB per autoscaler for these
//! 13 families (per-child label pairs and protobuf copies on every gather), which is 140 MB at
//! 10,000 autoscalers; this costs well under 1 kB. The daemon's own few series stay in the
//! registry.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex, PoisonError};

use watermarkd_engine::{Action, Decision, Limit, Position, Rule};

/// Who an autoscaler's series are about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesLabels {
    /// The WPA name, or the rules-file autoscaler's name.
    pub wpa_name: String,
    /// The WPA namespace; for a rules-file autoscaler, its target's namespace.
    pub wpa_namespace: String,
    pub resource_name: String,
    pub resource_namespace: String,
    pub resource_kind: String,
}

impl SeriesLabels {
    /// `resource_kind="..",resource_name="..",...`, sorted by label name as the text format
    /// conventionally is.
    fn render(&self) -> String {
        let mut out = String::new();
        for (i, (name, value)) in [
            ("resource_kind", &self.resource_kind),
            ("resource_name", &self.resource_name),
            ("resource_namespace", &self.resource_namespace),
            ("wpa_name", &self.wpa_name),
            ("wpa_namespace", &self.wpa_namespace),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{name}=\"{}\"", escape(value));
        }
        out
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sample value as the text format writes it.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{value}")
    }
}

const RESTRICTIONS: [&str; 3] = ["within_bounds", "upscale_capping", "downscale_capping"];
const TRANSITIONS: [&str; 2] = ["upscale", "downscale"];

#[derive(Clone, Debug)]
struct MetricRecord {
    /// `metric_name="..."`.
    name_label: String,
    value: Option<f64>,
    high_watermark: f64,
    low_watermark: f64,
    proposal: Option<u32>,
}

/// Everything exported about one autoscaler.
#[derive(Clone, Debug)]
struct Record {
    labels: String,
    metrics: Vec<MetricRecord>,
    effective: Option<u32>,
    restricted: [bool; 3],
    countdown: [f64; 2],
    min_replicas: u32,
    max_replicas: u32,
    scaling_active: bool,
    dry_run: bool,
    upscale_total: u64,
    downscale_total: u64,
}

#[derive(Default)]
pub struct AutoscalerMetrics {
    records: Mutex<HashMap<SeriesLabels, Arc<Record>>>,
}

impl AutoscalerMetrics {
    pub fn new() -> Self {
        AutoscalerMetrics::default()
    }

    fn replace(&self, labels: &SeriesLabels, build: impl FnOnce(Option<&Record>) -> Record) {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let next = build(records.get(labels).map(Arc::as_ref));
        records.insert(labels.clone(), Arc::new(next));
    }

    /// Sets every series of one evaluation. `scaled` says whether the decision's scale was
    /// written (or would have been, in a dry run), which is when the counters move.
    pub fn observe(&self, labels: &SeriesLabels, rule: &Rule, decision: &Decision, scaled: bool) {
        let active = match decision.limit {
            Limit::UpscaleCapping => 1,
            Limit::DownscaleCapping | Limit::NotReady => 2,
            Limit::TooFew | Limit::TooMany | Limit::AboveMax | Limit::BelowMin => 0,
            Limit::WithinRange | Limit::Paused | Limit::NoData | Limit::MinAvailable | Limit::NoReadyReplicas => {
                usize::MAX
            }
        };
        let timing = &decision.timing;
        let up = timing.upscale_window_seconds_left.max(timing.upscale_delay_seconds_left).max(0.0);
        let down = timing.downscale_window_seconds_left.max(timing.downscale_delay_seconds_left).max(0.0);
        let from = u64::from(decision.spec_replicas);
        let to = u64::from(decision.replicas);
        let (added, removed) = match (scaled, decision.action) {
            (true, Action::ScaleUp) => (to.saturating_sub(from), 0),
            (true, Action::ScaleDown) => (0, from.saturating_sub(to)),
            _ => (0, 0),
        };
        self.replace(labels, |previous| Record {
            labels: previous.map_or_else(|| labels.render(), |p| p.labels.clone()),
            metrics: decision
                .metrics
                .iter()
                .map(|m| MetricRecord {
                    name_label: format!("metric_name=\"{}\"", escape(&m.name)),
                    // A value the decision refused (stale, negative) is not the metric's
                    // current value: a dashboard must not plot it as one.
                    value: m.value.filter(|v| v.is_finite() && m.position != Position::Unavailable),
                    high_watermark: m.high_watermark,
                    low_watermark: m.low_watermark,
                    proposal: m.proposal,
                })
                .collect(),
            effective: Some(decision.replicas),
            restricted: [active == 0, active == 1, active == 2],
            countdown: [up, down],
            min_replicas: rule.min_replicas(),
            max_replicas: rule.max_replicas(),
            scaling_active: decision.proposal.is_some(),
            dry_run: decision.dry_run,
            upscale_total: previous.map_or(0, |p| p.upscale_total) + added,
            downscale_total: previous.map_or(0, |p| p.downscale_total) + removed,
        });
    }

    /// An evaluation that could not decide (target unreadable): the autoscaler is not active
    /// and its per-evaluation series no longer describe anything current.
    pub fn observe_failure(&self, labels: &SeriesLabels, rule: &Rule) {
        self.replace(labels, |previous| Record {
            labels: previous.map_or_else(|| labels.render(), |p| p.labels.clone()),
            metrics: Vec::new(),
            effective: None,
            restricted: [false; 3],
            countdown: [0.0; 2],
            min_replicas: rule.min_replicas(),
            max_replicas: rule.max_replicas(),
            scaling_active: false,
            dry_run: rule.dry_run(),
            upscale_total: previous.map_or(0, |p| p.upscale_total),
            downscale_total: previous.map_or(0, |p| p.downscale_total),
        });
    }

    /// Removes every series of an autoscaler that stopped.
    pub fn remove(&self, labels: &SeriesLabels) {
        self.records.lock().unwrap_or_else(PoisonError::into_inner).remove(labels);
    }

    /// The records as they are now, for one scrape.
    pub fn snapshot(&self) -> Snapshot {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let mut records: Vec<Arc<Record>> = records.values().cloned().collect();
        records.sort_by(|a, b| a.labels.cmp(&b.labels));
        Snapshot { records }
    }
}

/// The series of one scrape, written out a family and a slice of autoscalers at a time.
pub struct Snapshot {
    records: Vec<Arc<Record>>,
}

/// The families, in output order: name, type, help.
const FAMILIES: [(&str, &str, &str); 13] = [
    ("wpa_controller_value", "gauge", "The metric's value, as compared with the watermarks"),
    ("wpa_controller_high_watermark", "gauge", "The metric's high watermark"),
    ("wpa_controller_low_watermark", "gauge", "The metric's low watermark"),
    ("wpa_controller_replicas_scaling_proposal", "gauge", "Replicas the metric proposes before limits"),
    (
        "wpa_controller_replicas_scaling_effective",
        "gauge",
        "Replicas after limits and bounds: what the autoscaler sets",
    ),
    ("wpa_controller_restricted_scaling", "gauge", "1 for the limit that shaped the last decision"),
    (
        "wpa_controller_transition_countdown",
        "gauge",
        "Seconds until a scale in this direction is allowed (forbidden window or delay)",
    ),
    ("wpa_controller_min_replicas", "gauge", "The autoscaler's minimum replicas"),
    ("wpa_controller_max_replicas", "gauge", "The autoscaler's maximum replicas"),
    ("wpa_controller_scaling_active", "gauge", "1 when the autoscaler could compute a replica count"),
    ("wpa_controller_dry_run", "gauge", "1 when the autoscaler only reports"),
    ("wpa_controller_upscale_replicas_total", "counter", "Replicas added by scale-ups"),
    ("wpa_controller_downscale_replicas_total", "counter", "Replicas removed by scale-downs"),
];

impl Snapshot {
    /// How many chunks [`Snapshot::render`] writes, each at most `per_chunk` autoscalers of one
    /// family.
    pub fn chunks(&self, per_chunk: usize) -> usize {
        FAMILIES.len() * self.records.len().div_ceil(per_chunk.max(1))
    }

    /// Writes chunk `index` (see [`Snapshot::chunks`]): a family's header before its first
    /// slice. Empty when the slice has no samples.
    pub fn render(&self, index: usize, per_chunk: usize) -> String {
        let per_chunk = per_chunk.max(1);
        let slices = self.records.len().div_ceil(per_chunk);
        if slices == 0 {
            return String::new();
        }
        let (family, slice) = (index / slices, index % slices);
        let Some(&(name, kind, help)) = FAMILIES.get(family) else { return String::new() };
        let mut out = String::new();
        if slice == 0 {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        }
        let end = ((slice + 1) * per_chunk).min(self.records.len());
        for record in &self.records[slice * per_chunk..end] {
            write_samples(&mut out, family, name, record);
        }
        out
    }

    /// The whole text at once (tests, small registries).
    pub fn render_all(&self) -> String {
        (0..self.chunks(1024)).map(|i| self.render(i, 1024)).collect()
    }
}

fn write_samples(out: &mut String, family: usize, name: &str, record: &Record) {
    let labels = &record.labels;
    let mut sample = |extra: Option<&str>, value: String| {
        let _ = match extra {
            Some(extra) => writeln!(out, "{name}{{{labels},{extra}}} {value}"),
            None => writeln!(out, "{name}{{{labels}}} {value}"),
        };
    };
    match family {
        0 => record.metrics.iter().for_each(|m| {
            if let Some(v) = m.value {
                sample(Some(&m.name_label), number(v));
            }
        }),
        1 => record.metrics.iter().for_each(|m| sample(Some(&m.name_label), number(m.high_watermark))),
        2 => record.metrics.iter().for_each(|m| sample(Some(&m.name_label), number(m.low_watermark))),
        3 => record.metrics.iter().for_each(|m| {
            if let Some(p) = m.proposal {
                sample(Some(&m.name_label), p.to_string());
            }
        }),
        4 => {
            if let Some(effective) = record.effective {
                sample(None, effective.to_string());
            }
        }
        5 if record.effective.is_some() => {
            for (reason, on) in RESTRICTIONS.iter().zip(record.restricted) {
                sample(Some(&format!("reason=\"{reason}\"")), u8::from(on).to_string());
            }
        }
        6 if record.effective.is_some() => {
            for (transition, seconds) in TRANSITIONS.iter().zip(record.countdown) {
                sample(Some(&format!("transition=\"{transition}\"")), number(seconds));
            }
        }
        7 => sample(None, record.min_replicas.to_string()),
        8 => sample(None, record.max_replicas.to_string()),
        9 => sample(None, u8::from(record.scaling_active).to_string()),
        10 => sample(None, u8::from(record.dry_run).to_string()),
        11 => sample(None, record.upscale_total.to_string()),
        12 => sample(None, record.downscale_total.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::{decide, Reading, State, Target, Timestamp};

    fn labels(name: &str) -> SeriesLabels {
        SeriesLabels {
            wpa_name: name.into(),
            wpa_namespace: "prod".into(),
            resource_name: name.into(),
            resource_namespace: "prod".into(),
            resource_kind: "Deployment".into(),
        }
    }

    fn exported(metrics: &AutoscalerMetrics) -> String {
        metrics.snapshot().render_all()
    }

    #[test]
    fn series_follow_each_evaluation_and_go_with_the_autoscaler() {
        let metrics = AutoscalerMetrics::new();
        let rule = crate::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "algorithm": "absolute",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .expect("rule");
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let high = [Reading::Value { value: 30.0, at: now }];
        let decision = decide(&rule, target, &high, &State::default(), now);
        metrics.observe(&labels("web"), &rule, &decision, true);
        let text = exported(&metrics);
        assert!(text.contains(r#"wpa_controller_value{resource_kind="Deployment",resource_name="web",resource_namespace="prod",wpa_name="web",wpa_namespace="prod",metric_name="load"} 30"#), "{text}");
        assert!(text.contains(r#"wpa_namespace="prod",reason="upscale_capping"} 1"#), "{text}");
        assert!(text.contains("wpa_controller_upscale_replicas_total{"), "{text}");

        // No value: the value series goes (never 0), the watermarks stay.
        let none = [Reading::Unavailable { reason: "no data".into() }];
        let decision = decide(&rule, target, &none, &State::default(), now);
        metrics.observe(&labels("web"), &rule, &decision, false);
        let text = exported(&metrics);
        assert!(!text.contains("wpa_controller_value{"), "{text}");
        assert!(text.contains("wpa_controller_high_watermark{"), "{text}");
        assert!(text.contains("wpa_controller_scaling_active{resource_kind=\"Deployment\",resource_name=\"web\",resource_namespace=\"prod\",wpa_name=\"web\",wpa_namespace=\"prod\"} 0"), "{text}");

        // A stale value (past the metric's max_age) is refused, so it is not exported either.
        let rule_max_age = crate::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "algorithm": "absolute",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5, "max_age": "30s" }]
        }))
        .expect("rule");
        let old = [Reading::Value { value: 30.0, at: Timestamp::from_unix_millis(1_700_000_000_000 - 40_000) }];
        let decision = decide(&rule_max_age, target, &old, &State::default(), now);
        assert_eq!(decision.metrics[0].value, Some(30.0), "the decision still says what was read");
        metrics.observe(&labels("web"), &rule_max_age, &decision, false);
        let text = exported(&metrics);
        assert!(!text.contains("wpa_controller_value{"), "{text}");

        // Chunked output is the same text, with one header per family.
        let snapshot = metrics.snapshot();
        let chunked: String = (0..snapshot.chunks(1)).map(|i| snapshot.render(i, 1)).collect();
        assert_eq!(chunked, text);
        assert_eq!(text.matches("# TYPE wpa_controller_max_replicas gauge").count(), 1);

        metrics.remove(&labels("web"));
        let text = exported(&metrics);
        assert!(!text.contains("wpa_name=\"web\""), "every series of a removed autoscaler goes: {text}");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
