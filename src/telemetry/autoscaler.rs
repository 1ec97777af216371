//! The `wpa_controller_*` series, with the Datadog controller's names and labels so that its
//! dashboards keep working. Gauges describe the latest evaluation: each evaluation sets every
//! series of its autoscaler (a metric without a value has its value series removed, never set to
//! 0), and an autoscaler that goes away takes all its series with it.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use watermarkd_engine::{Action, Decision, Limit, Rule};

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
    fn base(&self) -> [&str; 5] {
        [&self.wpa_name, &self.wpa_namespace, &self.resource_name, &self.resource_namespace, &self.resource_kind]
    }
}

const BASE: [&str; 5] = ["wpa_name", "wpa_namespace", "resource_name", "resource_namespace", "resource_kind"];
const RESTRICTIONS: [&str; 3] = ["within_bounds", "upscale_capping", "downscale_capping"];
const TRANSITIONS: [&str; 2] = ["upscale", "downscale"];

pub struct AutoscalerMetrics {
    value: GaugeVec,
    high_watermark: GaugeVec,
    low_watermark: GaugeVec,
    proposal: IntGaugeVec,
    effective: IntGaugeVec,
    restricted: IntGaugeVec,
    countdown: GaugeVec,
    min_replicas: IntGaugeVec,
    max_replicas: IntGaugeVec,
    scaling_active: IntGaugeVec,
    dry_run: IntGaugeVec,
    upscale_total: IntCounterVec,
    downscale_total: IntCounterVec,
    /// The metric names each autoscaler's per-metric series were set with, to remove them.
    metric_names: Mutex<HashMap<SeriesLabels, Vec<String>>>,
}

fn labels_with(extra: &str) -> Vec<&str> {
    let mut labels = BASE.to_vec();
    labels.push(extra);
    labels
}

impl AutoscalerMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let per_metric = labels_with("metric_name");
        let gauge = |name: &str, help: &str, labels: &[&str]| GaugeVec::new(Opts::new(name, help), labels);
        let int_gauge = |name: &str, help: &str, labels: &[&str]| IntGaugeVec::new(Opts::new(name, help), labels);
        let metrics = AutoscalerMetrics {
            value: gauge("wpa_controller_value", "The metric's value, as compared with the watermarks", &per_metric)?,
            high_watermark: gauge("wpa_controller_high_watermark", "The metric's high watermark", &per_metric)?,
            low_watermark: gauge("wpa_controller_low_watermark", "The metric's low watermark", &per_metric)?,
            proposal: int_gauge(
                "wpa_controller_replicas_scaling_proposal",
                "Replicas the metric proposes before limits",
                &per_metric,
            )?,
            effective: int_gauge(
                "wpa_controller_replicas_scaling_effective",
                "Replicas after limits and bounds: what the autoscaler sets",
                &BASE,
            )?,
            restricted: int_gauge(
                "wpa_controller_restricted_scaling",
                "1 for the limit that shaped the last decision",
                &labels_with("reason"),
            )?,
            countdown: gauge(
                "wpa_controller_transition_countdown",
                "Seconds until a scale in this direction is allowed (forbidden window or delay)",
                &labels_with("transition"),
            )?,
            min_replicas: int_gauge("wpa_controller_min_replicas", "The autoscaler's minimum replicas", &BASE)?,
            max_replicas: int_gauge("wpa_controller_max_replicas", "The autoscaler's maximum replicas", &BASE)?,
            scaling_active: int_gauge(
                "wpa_controller_scaling_active",
                "1 when the autoscaler could compute a replica count",
                &BASE,
            )?,
            dry_run: int_gauge("wpa_controller_dry_run", "1 when the autoscaler only reports", &BASE)?,
            upscale_total: IntCounterVec::new(
                Opts::new("wpa_controller_upscale_replicas_total", "Replicas added by scale-ups"),
                &BASE,
            )?,
            downscale_total: IntCounterVec::new(
                Opts::new("wpa_controller_downscale_replicas_total", "Replicas removed by scale-downs"),
                &BASE,
            )?,
            metric_names: Mutex::new(HashMap::new()),
        };
        registry.register(Box::new(metrics.value.clone()))?;
        registry.register(Box::new(metrics.high_watermark.clone()))?;
        registry.register(Box::new(metrics.low_watermark.clone()))?;
        registry.register(Box::new(metrics.proposal.clone()))?;
        registry.register(Box::new(metrics.effective.clone()))?;
        registry.register(Box::new(metrics.restricted.clone()))?;
        registry.register(Box::new(metrics.countdown.clone()))?;
        registry.register(Box::new(metrics.min_replicas.clone()))?;
        registry.register(Box::new(metrics.max_replicas.clone()))?;
        registry.register(Box::new(metrics.scaling_active.clone()))?;
        registry.register(Box::new(metrics.dry_run.clone()))?;
        registry.register(Box::new(metrics.upscale_total.clone()))?;
        registry.register(Box::new(metrics.downscale_total.clone()))?;
        Ok(metrics)
    }

    /// Sets every series of one evaluation. `scaled` says whether the decision's scale was
    /// written (or would have been, in a dry run), which is when the counters move.
    pub fn observe(&self, labels: &SeriesLabels, rule: &Rule, decision: &Decision, scaled: bool) {
        let base = labels.base();
        fn with<'a>(base: &[&'a str; 5], extra: &'a str) -> Vec<&'a str> {
            let mut values = base.to_vec();
            values.push(extra);
            values
        }
        let mut names = Vec::with_capacity(decision.metrics.len());
        for metric in &decision.metrics {
            let values = with(&base, &metric.name);
            match metric.value {
                Some(value) if value.is_finite() => self.value.with_label_values(&values).set(value),
                _ => {
                    let _ = self.value.remove_label_values(&values);
                }
            }
            self.high_watermark.with_label_values(&values).set(metric.high_watermark);
            self.low_watermark.with_label_values(&values).set(metric.low_watermark);
            match metric.proposal {
                Some(proposal) => self.proposal.with_label_values(&values).set(i64::from(proposal)),
                None => {
                    let _ = self.proposal.remove_label_values(&values);
                }
            }
            names.push(metric.name.clone());
        }
        self.forget_metrics_except(labels, &names);
        self.effective.with_label_values(&base).set(i64::from(decision.replicas));
        let active = match decision.limit {
            Limit::UpscaleCapping => "upscale_capping",
            Limit::DownscaleCapping | Limit::NotReady => "downscale_capping",
            Limit::TooFew | Limit::TooMany | Limit::WithinRange => "within_bounds",
        };
        for reason in RESTRICTIONS {
            let restricted = reason == active && decision.limit != Limit::WithinRange;
            self.restricted.with_label_values(&with(&base, reason)).set(i64::from(restricted));
        }
        let timing = &decision.timing;
        let up = timing.upscale_window_seconds_left.max(timing.upscale_delay_seconds_left);
        let down = timing.downscale_window_seconds_left.max(timing.downscale_delay_seconds_left);
        for (transition, seconds) in TRANSITIONS.iter().zip([up, down]) {
            self.countdown.with_label_values(&with(&base, transition)).set(seconds.max(0.0));
        }
        self.min_replicas.with_label_values(&base).set(i64::from(rule.min_replicas()));
        self.max_replicas.with_label_values(&base).set(i64::from(rule.max_replicas()));
        self.scaling_active.with_label_values(&base).set(i64::from(decision.proposal.is_some()));
        self.dry_run.with_label_values(&base).set(i64::from(decision.dry_run));
        if scaled {
            let from = u64::from(decision.spec_replicas);
            let to = u64::from(decision.replicas);
            match decision.action {
                Action::ScaleUp => self.upscale_total.with_label_values(&base).inc_by(to.saturating_sub(from)),
                Action::ScaleDown => self.downscale_total.with_label_values(&base).inc_by(from.saturating_sub(to)),
                Action::Hold => {}
            }
        }
    }

    /// An evaluation that could not decide (target unreadable): the autoscaler is not active
    /// and its per-evaluation series no longer describe anything current.
    pub fn observe_failure(&self, labels: &SeriesLabels, rule: &Rule) {
        let base = labels.base();
        self.forget_metrics_except(labels, &[]);
        let _ = self.effective.remove_label_values(&base);
        self.min_replicas.with_label_values(&base).set(i64::from(rule.min_replicas()));
        self.max_replicas.with_label_values(&base).set(i64::from(rule.max_replicas()));
        self.scaling_active.with_label_values(&base).set(0);
    }

    /// Removes every series of an autoscaler that stopped.
    pub fn remove(&self, labels: &SeriesLabels) {
        let base = labels.base();
        self.forget_metrics_except(labels, &[]);
        for vec in [&self.effective, &self.min_replicas, &self.max_replicas, &self.scaling_active, &self.dry_run] {
            let _ = vec.remove_label_values(&base);
        }
        for vec in [&self.upscale_total, &self.downscale_total] {
            let _ = vec.remove_label_values(&base);
        }
        for reason in RESTRICTIONS {
            let mut values = base.to_vec();
            values.push(reason);
            let _ = self.restricted.remove_label_values(&values);
        }
        for transition in TRANSITIONS {
            let mut values = base.to_vec();
            values.push(transition);
            let _ = self.countdown.remove_label_values(&values);
        }
        if let Ok(mut names) = self.metric_names.lock() {
            names.remove(labels);
        }
    }

    /// Removes the per-metric series of metric names not in `keep` (a metric renamed or
    /// dropped by a reload).
    fn forget_metrics_except(&self, labels: &SeriesLabels, keep: &[String]) {
        let Ok(mut known) = self.metric_names.lock() else { return };
        let previous = known.insert(labels.clone(), keep.to_vec()).unwrap_or_default();
        let base = labels.base();
        for name in previous.iter().filter(|n| !keep.contains(n)) {
            let mut values = base.to_vec();
            values.push(name);
            for vec in [&self.value, &self.high_watermark, &self.low_watermark] {
                let _ = vec.remove_label_values(&values);
            }
            let _ = self.proposal.remove_label_values(&values);
        }
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

    fn exported(registry: &Registry) -> String {
        let mut body = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut body).expect("encode");
        String::from_utf8(body).expect("utf-8")
    }

    #[test]
    fn series_follow_each_evaluation_and_go_with_the_autoscaler() {
        let registry = Registry::new();
        let metrics = AutoscalerMetrics::new(&registry).expect("register");
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
        let text = exported(&registry);
        assert!(text.contains(r#"wpa_controller_value{metric_name="load",resource_kind="Deployment",resource_name="web",resource_namespace="prod",wpa_name="web",wpa_namespace="prod"} 30"#), "{text}");
        assert!(text.contains(r#"wpa_controller_restricted_scaling{reason="upscale_capping""#), "{text}");
        assert!(text.contains("wpa_controller_upscale_replicas_total{"), "{text}");

        // No value: the value series goes (never 0), the watermarks stay.
        let none = [Reading::Unavailable { reason: "no data".into() }];
        let decision = decide(&rule, target, &none, &State::default(), now);
        metrics.observe(&labels("web"), &rule, &decision, false);
        let text = exported(&registry);
        assert!(!text.contains("wpa_controller_value{"), "{text}");
        assert!(text.contains("wpa_controller_high_watermark{"), "{text}");
        assert!(text.contains("wpa_controller_scaling_active{resource_kind=\"Deployment\",resource_name=\"web\",resource_namespace=\"prod\",wpa_name=\"web\",wpa_namespace=\"prod\"} 0"), "{text}");

        metrics.remove(&labels("web"));
        let text = exported(&registry);
        assert!(!text.contains("wpa_name=\"web\""), "every series of a removed autoscaler goes: {text}");
    }
}
