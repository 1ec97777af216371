//! The `wpa_controller_*` series, with the Datadog controller's names and labels so that its
//! dashboards keep working. Gauges describe the latest evaluation: each evaluation replaces every
//! series of its autoscaler (a metric without a value has no value sample, never a 0), and an
//! autoscaler that goes away takes all its series with it.
//!
//! They are not kept in `prometheus` collectors: they are a view of the ledger
//! (`domain::outcome::Ledger`), which holds each autoscaler's last outcome and counters once,
//! written out in the text format at scrape time in chunks (`exposition.rs`). The `prometheus`
//! crate's labelled vectors cost about 14 kB per autoscaler for these families (per-child label
//! pairs and protobuf copies on every gather), which is 140 MB at 10,000 autoscalers. The
//! daemon's own few series stay in the registry.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use crate::domain::outcome::Ledger;
pub use crate::domain::outcome::SeriesLabels;

mod exposition;

pub use exposition::Snapshot;

/// The label sets of an autoscaler's series.
trait Render {
    fn render(&self) -> String;
    fn render_info(&self) -> String;
}

impl Render for SeriesLabels {
    /// The label set of every per-autoscaler series, sorted by label name as the text format
    /// conventionally is. `target_name` and `namespace` repeat `resource_name` and the WPA
    /// namespace, as the Datadog controller adds them (to compare with its newer autoscaler).
    /// `dry_run` is watermarkd's own: the Datadog controller has no such label.
    fn render(&self) -> String {
        render_pairs(&[
            ("dry_run", if self.dry_run { "true" } else { "false" }),
            ("namespace", &self.wpa_namespace),
            ("resource_kind", &self.resource_kind),
            ("resource_name", &self.resource_name),
            ("resource_namespace", &self.resource_namespace),
            ("target_name", &self.resource_name),
            ("wpa_name", &self.wpa_name),
            ("wpa_namespace", &self.wpa_namespace),
        ])
    }

    /// The label set of `wpa_controller_labels_info`: the Datadog controller's join keys and the
    /// tags.
    fn render_info(&self) -> String {
        let mut pairs: Vec<(&str, &str)> = vec![
            ("namespace", &self.wpa_namespace),
            ("resource_namespace", &self.resource_namespace),
            ("wpa_name", &self.wpa_name),
            ("wpa_namespace", &self.wpa_namespace),
        ];
        pairs.extend(self.tags.iter().map(|(name, value)| (name.as_str(), value.as_str())));
        pairs.sort_by(|a, b| a.0.cmp(b.0));
        render_pairs(&pairs)
    }
}

fn render_pairs(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{name}=\"{}\"", escape(value));
    }
    out
}

/// The labels of `wpa_controller_labels_info` that [`LabelsAsTags`] reserves for itself.
const INFO_LABELS: [&str; 4] = ["namespace", "resource_namespace", "wpa_name", "wpa_namespace"];

/// Which Kubernetes labels of a WPA become labels of its `wpa_controller_labels_info` series
/// (the Datadog controller's `DD_LABELS_AS_TAGS`): each key is exported under its own name,
/// made a valid Prometheus label name (see [`label_name`]), so that an Agent check's
/// `label_joins` on `wpa_controller_labels_info` with `labels_to_get` of those names works
/// unchanged. Only the chosen keys are kept, so the series stays one per autoscaler with a
/// bounded label set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelsAsTags {
    /// (Kubernetes label key, Prometheus label name).
    keys: Vec<(String, String)>,
}

impl LabelsAsTags {
    /// Checks the keys: none empty, and no two (nor one and a join label of the info series)
    /// with the same label name once made valid.
    pub fn new<S: AsRef<str>>(keys: &[S]) -> Result<Self, String> {
        let mut out: Vec<(String, String)> = Vec::new();
        for key in keys {
            let key = key.as_ref().trim();
            if key.is_empty() {
                return Err("labels_as_tags: a label key is empty".into());
            }
            if out.iter().any(|(k, _)| k == key) {
                continue;
            }
            let name = label_name(key);
            if INFO_LABELS.contains(&name.as_str()) {
                return Err(format!(
                    "labels_as_tags: {key:?} would be exported as {name:?}, which wpa_controller_labels_info already \
                     has"
                ));
            }
            if let Some((other, _)) = out.iter().find(|(_, n)| *n == name) {
                return Err(format!("labels_as_tags: {other:?} and {key:?} would both be exported as {name:?}"));
            }
            out.push((key.to_string(), name));
        }
        out.sort_by(|a, b| a.1.cmp(&b.1));
        Ok(LabelsAsTags { keys: out })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tags of an object with these Kubernetes labels: (label name, value) for each chosen
    /// key the object has with a non-empty value (an empty label value is the same as no label
    /// in Prometheus), sorted by label name.
    pub fn tags(&self, labels: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
        let Some(labels) = labels else { return Vec::new() };
        self.keys
            .iter()
            .filter_map(|(key, name)| {
                labels.get(key).filter(|value| !value.is_empty()).map(|value| (name.clone(), value.clone()))
            })
            .collect()
    }
}

/// A Kubernetes label key as a Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`, and not
/// starting with the reserved `__`): every other character becomes `_`, a leading digit gets
/// a `_` in front, and a leading `__` gets `label` in front. `team` stays `team`;
/// `app.kubernetes.io/name` becomes `app_kubernetes_io_name`.
pub fn label_name(key: &str) -> String {
    let mut name: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    if name.starts_with("__") {
        name.insert_str(0, "label");
    }
    name
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

/// The WPA condition types exported by `wpa_controller_conditions`, with their `condition`
/// label. The first two are the ones the Datadog controller tracks (with its label values);
/// the others are the rest of the conditions a WPA status carries, in the same spelling. The
/// Datadog controller's third, `scaling_blocked`, belongs to its lifecycle control (a
/// DatadogMonitor gating the WPA), which watermarkd does not have.
pub const CONDITIONS: [(&str, &str); 6] = [
    ("AbleToScale", "able_to_scale"),
    ("ScalingLimited", "scaling_limited"),
    ("ScalingActive", "scaling_active"),
    ("DryRun", "dry_run"),
    ("AboveHighWatermark", "above_high_watermark"),
    ("BelowLowWatermark", "below_low_watermark"),
];

/// The per-autoscaler series: a view of the ledger.
pub struct AutoscalerMetrics {
    ledger: Arc<Ledger>,
    labels_as_tags: LabelsAsTags,
}

impl AutoscalerMetrics {
    /// The series of what `ledger` holds, with `wpa_controller_labels_info` carrying these
    /// labels-as-tags.
    pub fn new(ledger: Arc<Ledger>, labels_as_tags: LabelsAsTags) -> Self {
        AutoscalerMetrics { ledger, labels_as_tags }
    }

    /// The tags of an object with these Kubernetes labels, for [`SeriesLabels::tags`].
    pub fn tags(&self, labels: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
        self.labels_as_tags.tags(labels)
    }

    /// The series as they are now, for one scrape.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::of(self.ledger.entries())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::outcome::{Identity, Outcome, Outlook, ShadowOutcome, CONDITION_TYPES};
    use watermarkd_engine::{decide, Decision, Reading, Rule, State, Target, Timestamp};

    /// The series over a ledger, fed as the runtime's fan-out feeds it.
    struct Metrics {
        ledger: Arc<Ledger>,
        series: AutoscalerMetrics,
    }

    impl Metrics {
        fn new() -> Metrics {
            let ledger = Arc::new(Ledger::new(std::time::Duration::ZERO));
            Metrics { series: AutoscalerMetrics::new(Arc::clone(&ledger), LabelsAsTags::default()), ledger }
        }

        /// An autoscaler with this label set runs, under `id`.
        fn admit_as(&self, id: &str, labels: &SeriesLabels) {
            let identity = Identity::rules_file(Arc::new(labels.clone()), &[], 15, (1, 10));
            self.ledger.admit(Identity { id: id.into(), ..identity });
        }

        fn admit(&self, labels: &SeriesLabels) {
            self.admit_as(&format!("file/{}", labels.wpa_name), labels);
        }

        fn remove_id(&self, id: &str) {
            self.ledger.remove(id);
        }

        fn remove(&self, labels: &SeriesLabels) {
            self.remove_id(&format!("file/{}", labels.wpa_name));
        }

        #[expect(clippy::too_many_arguments, reason = "each part of an outcome a test sets")]
        fn report(
            &self,
            labels: &SeriesLabels,
            rule: &Rule,
            decision: &Decision,
            scaled: bool,
            conditions: &[(&'static str, bool)],
            ahead: Option<Outlook>,
            shadows: Option<Vec<ShadowOutcome>>,
        ) {
            let mut outcome = Outcome::of_decision(decision.clone(), rule, scaled);
            outcome.conditions = conditions.to_vec();
            outcome.ahead = ahead;
            outcome.shadows = shadows;
            self.ledger.record(&format!("file/{}", labels.wpa_name), labels, outcome);
        }

        fn observe(
            &self,
            labels: &SeriesLabels,
            rule: &Rule,
            decision: &Decision,
            scaled: bool,
            conditions: &[(&'static str, bool)],
            ahead: Option<Outlook>,
        ) {
            self.report(labels, rule, decision, scaled, conditions, ahead, None);
        }

        fn observe_failure(&self, labels: &SeriesLabels) {
            let now = Timestamp::from_unix_millis(1_700_000_030_000);
            self.ledger.failed(&format!("file/{}", labels.wpa_name), labels, now, "the target is unreadable");
        }

        fn snapshot(&self) -> Snapshot {
            self.series.snapshot()
        }
    }

    fn labels(name: &str) -> SeriesLabels {
        SeriesLabels::deployment(name, "prod", false)
    }

    /// Metrics with these label sets admitted, as the scheduler does for running autoscalers.
    fn admitted(running: &[&SeriesLabels]) -> Metrics {
        let metrics = Metrics::new();
        running.iter().for_each(|labels| metrics.admit(labels));
        metrics
    }

    const WEB: &str = r#"dry_run="false",namespace="prod",resource_kind="Deployment",resource_name="web",resource_namespace="prod",target_name="web",wpa_name="web",wpa_namespace="prod""#;

    fn exported(metrics: &Metrics) -> String {
        metrics.snapshot().render_all()
    }

    #[test]
    fn series_follow_each_evaluation_and_go_with_the_autoscaler() {
        let metrics = admitted(&[&labels("web")]);
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "algorithm": "absolute",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .expect("rule");
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let high = [Reading::Value { value: 30.0, at: Timestamp::from_unix_millis(1_699_999_985_000) }];
        let decision = decide(&rule, target, &high, &State::default(), now);
        metrics.observe(
            &labels("web"),
            &rule,
            &decision,
            true,
            &[("AbleToScale", true), ("ScalingLimited", true)],
            None,
        );
        let text = exported(&metrics);
        assert!(text.contains(&format!("wpa_controller_value{{{WEB},metric_name=\"load\"}} 30\n")), "{text}");
        assert!(text.contains(&format!("watermarkd_metric_age_seconds{{{WEB},metric_name=\"load\"}} 15\n")), "{text}");
        assert!(text.contains(&format!("wpa_controller_high_watermak{{{WEB},metric_name=\"load\"}} 10\n")), "{text}");
        assert!(text.contains(&format!("wpa_controller_low_watermak{{{WEB},metric_name=\"load\"}} 5\n")), "{text}");
        assert!(
            text.contains(&format!("wpa_controller_conditions{{{WEB},condition=\"scaling_limited\"}} 1\n")),
            "{text}"
        );
        assert!(!text.contains("condition=\"dry_run\""), "a condition never set has no series: {text}");
        assert!(text.contains("wpa_controller_labels_info{namespace=\"prod\",resource_namespace=\"prod\",wpa_name=\"web\",wpa_namespace=\"prod\"} 1\n"), "{text}");
        assert!(text.contains(r#"wpa_namespace="prod",reason="upscale_capping"} 1"#), "{text}");
        assert!(text.contains("wpa_controller_upscale_replicas_total{"), "{text}");

        // No value: the value series goes (never 0), the watermarks stay.
        let none = [Reading::Unavailable { reason: "no data".into() }];
        let decision = decide(&rule, target, &none, &State::default(), now);
        metrics.observe(&labels("web"), &rule, &decision, false, &[("ScalingActive", false)], None);
        let text = exported(&metrics);
        assert!(!text.contains("wpa_controller_value{"), "{text}");
        assert!(!text.contains("watermarkd_metric_age_seconds{"), "{text}");
        assert!(text.contains("wpa_controller_high_watermark{"), "{text}");
        assert!(text.contains(&format!("wpa_controller_scaling_active{{{WEB}}} 0\n")), "{text}");
        // Conditions not set this time keep their status, as in a WPA status.
        assert!(
            text.contains(&format!("wpa_controller_conditions{{{WEB},condition=\"scaling_limited\"}} 1\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("wpa_controller_conditions{{{WEB},condition=\"scaling_active\"}} 0\n")),
            "{text}"
        );

        // A stale value (past the metric's max_age) is refused, so it is not exported either.
        let rule_max_age = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "algorithm": "absolute",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5, "max_age": "30s" }]
        }))
        .expect("rule");
        let old = [Reading::Value { value: 30.0, at: Timestamp::from_unix_millis(1_700_000_000_000 - 40_000) }];
        let decision = decide(&rule_max_age, target, &old, &State::default(), now);
        assert_eq!(decision.metrics[0].value, Some(30.0), "the decision still says what was read");
        metrics.observe(&labels("web"), &rule_max_age, &decision, false, &[], None);
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

    #[test]
    fn a_failed_evaluation_turns_able_to_scale_and_scaling_active_false() {
        let metrics = admitted(&[&labels("web")]);
        metrics.observe_failure(&labels("web"));
        let text = exported(&metrics);
        for (condition, status) in [("able_to_scale", 0), ("scaling_active", 0), ("dry_run", 0)] {
            let expected = format!("wpa_controller_conditions{{{WEB},condition=\"{condition}\"}} {status}\n");
            assert!(text.contains(&expected), "{expected} in {text}");
        }
        assert!(!text.contains("wpa_controller_replicas_scaling_effective{"), "{text}");
        assert_eq!(text.matches("wpa_controller_labels_info{").count(), 1, "{text}");
    }

    #[test]
    fn the_condition_labels_follow_the_ledgers_condition_types() {
        let types: Vec<&str> = CONDITIONS.iter().map(|(type_, _)| *type_).collect();
        assert_eq!(types, CONDITION_TYPES);
    }

    #[test]
    fn label_names_are_made_valid_and_values_escaped() {
        assert_eq!(label_name("team"), "team");
        assert_eq!(label_name("app.kubernetes.io/name"), "app_kubernetes_io_name");
        assert_eq!(label_name("9lives"), "_9lives");
        assert_eq!(label_name("__meta"), "label__meta");
        assert_eq!(label_name("ünïcode-key"), "_n_code_key");
        assert_eq!(label_name(""), "_");

        let tags = LabelsAsTags::new(&["team", "app.kubernetes.io/name", "absent", "empty", "team"]).expect("valid");
        let object: BTreeMap<String, String> =
            [("team", "pay\"ments\\eu\nwest"), ("app.kubernetes.io/name", "web"), ("empty", ""), ("unchosen", "x")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let metrics = Metrics::new();
        let mut series = labels("web");
        series.tags = AutoscalerMetrics::new(Arc::clone(&metrics.ledger), tags).tags(Some(&object));
        assert_eq!(
            series.tags,
            vec![("app_kubernetes_io_name".into(), "web".into()), ("team".into(), "pay\"ments\\eu\nwest".into())]
        );
        metrics.admit(&series);
        metrics.observe_failure(&series);
        let text = exported(&metrics);
        let info = r#"wpa_controller_labels_info{app_kubernetes_io_name="web",namespace="prod",resource_namespace="prod",team="pay\"ments\\eu\nwest",wpa_name="web",wpa_namespace="prod"} 1"#;
        assert!(text.contains(info), "{text}");
        assert!(!text.contains("unchosen") && !text.contains("empty") && !text.contains("absent"), "{text}");
        // The other series do not carry the tags: the info series is joined on.
        assert!(text.contains(&format!("wpa_controller_max_replicas{{{WEB}}} 10\n")), "{text}");

        assert!(LabelsAsTags::new(&["wpa_name"]).is_err(), "collides with a join label");
        assert!(LabelsAsTags::new(&["a.b", "a/b"]).is_err(), "two keys, one label name");
        assert!(LabelsAsTags::new(&[" "]).is_err());
        assert!(LabelsAsTags::new::<&str>(&[]).expect("none").is_empty());
    }

    /// Every series line of `text` about the autoscaler `wpa_name`.
    fn lines_of<'a>(text: &'a str, wpa_name: &str) -> Vec<&'a str> {
        let needle = format!("wpa_name=\"{wpa_name}\"");
        text.lines().filter(|l| !l.starts_with('#') && l.contains(&needle)).collect()
    }

    #[test]
    fn a_dry_run_flip_starts_the_series_over_and_a_late_report_brings_back_none() {
        let metrics = Metrics::new();
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "algorithm": "absolute",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .expect("rule");
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let high = [Reading::Value { value: 30.0, at: now }];
        let reporting = labels("web");
        let dry = SeriesLabels { dry_run: true, ..labels("web") };

        // Not admitted: nothing is exported for it.
        let decision = decide(&rule, target, &high, &State::default(), now);
        metrics.observe(&reporting, &rule, &decision, true, &[("AbleToScale", true)], None);
        assert_eq!(exported(&metrics), "", "a report before the autoscaler is admitted is dropped");

        metrics.admit(&reporting);
        metrics.observe(&reporting, &rule, &decision, true, &[("AbleToScale", true)], None);
        let before = exported(&metrics);
        let per_autoscaler: Vec<&str> =
            lines_of(&before, "web").into_iter().filter(|l| !l.starts_with("wpa_controller_labels_info")).collect();
        assert!(
            !per_autoscaler.is_empty() && per_autoscaler.iter().all(|l| l.contains("dry_run=\"false\"")),
            "{before}"
        );
        assert!(before.contains(&format!("wpa_controller_dry_run{{{WEB}}} 0\n")), "{before}");

        // The flip, as the scheduler makes it: the autoscaler is admitted again, with the new
        // label set.
        metrics.admit(&dry);
        // An evaluation still under way with the old labels reports late: dropped.
        metrics.observe(&reporting, &rule, &decision, true, &[("AbleToScale", true)], None);
        metrics.observe_failure(&reporting);
        assert_eq!(exported(&metrics), "", "no series under the old label set; the new has not reported yet");

        let dry_rule = rule.clone().with_dry_run(true);
        let decision = decide(&dry_rule, target, &high, &State::default(), now);
        metrics.observe(&dry, &dry_rule, &decision, true, &[("AbleToScale", true), ("DryRun", true)], None);
        let after = exported(&metrics);
        let lines = lines_of(&after, "web");
        let per_autoscaler: Vec<&&str> =
            lines.iter().filter(|l| !l.starts_with("wpa_controller_labels_info")).collect();
        assert!(per_autoscaler.iter().all(|l| l.contains("dry_run=\"true\"")), "no stale duplicate: {after}");
        // The DryRun condition is the one series more than before.
        assert_eq!(lines.len(), lines_of(&before, "web").len() + 1, "each series once: {after}");
        assert_eq!(after.matches("wpa_controller_labels_info{").count(), 1, "{after}");
        let dry_labels = WEB.replace("dry_run=\"false\"", "dry_run=\"true\"");
        assert!(after.contains(&format!("wpa_controller_dry_run{{{dry_labels}}} 1\n")), "{after}");
        // The counters start over: one scale-up counted, as after the first report.
        let counted = |text: &str, labels: &str| {
            let prefix = format!("wpa_controller_upscale_replicas_total{{{labels}}} ");
            text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).map(String::from)
        };
        assert_eq!(counted(&after, &dry_labels), counted(&before, WEB), "{after}");
        assert_ne!(counted(&before, WEB).as_deref(), Some("0"), "the first report counted a scale-up: {before}");

        // A label set two autoscalers share (a rules-file autoscaler and a WPA of the same name,
        // namespace and target) is exported once, by the one evaluated last, and stays while
        // either reports.
        metrics.admit_as("crd/prod/web", &dry);
        let later = Timestamp::from_unix_millis(1_700_000_015_000);
        let decision = decide(&dry_rule, target, &[Reading::Value { value: 7.0, at: later }], &State::default(), later);
        let mut outcome = Outcome::of_decision(decision, &dry_rule, false);
        outcome.conditions = vec![("AbleToScale", true)];
        metrics.ledger.record("crd/prod/web", &dry, outcome);
        let both = exported(&metrics);
        assert_eq!(both.matches("wpa_controller_labels_info{").count(), 1, "{both}");
        assert!(both.contains(&format!("wpa_controller_replicas_scaling_effective{{{dry_labels}}} 2\n")), "{both}");
        metrics.remove(&dry);
        assert!(!exported(&metrics).is_empty(), "one left");
        metrics.remove_id("crd/prod/web");
        assert_eq!(exported(&metrics), "");
    }
    #[test]
    fn shadow_series_count_evaluations_and_divergences_and_exist_only_with_a_shadow() {
        let metrics = admitted(&[&labels("web")]);
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10,
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .expect("rule");
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let decision = decide(&rule, target, &[Reading::Value { value: 7.0, at: now }], &State::default(), now);
        metrics.observe(&labels("web"), &rule, &decision, false, &[], None);
        assert!(!exported(&metrics).contains("watermarkd_shadow"), "no shadow, no family: {}", exported(&metrics));

        let next =
            |replicas: u32, diverged: bool| Some(vec![ShadowOutcome { name: "web-next".into(), replicas, diverged }]);
        metrics.report(&labels("web"), &rule, &decision, false, &[], None, next(3, true));
        metrics.report(&labels("web"), &rule, &decision, false, &[], None, next(2, false));
        let text = exported(&metrics);
        assert!(text.contains(&format!("watermarkd_shadow_replicas{{{WEB},shadow=\"web-next\"}} 2\n")), "{text}");
        assert!(
            text.contains(&format!("watermarkd_shadow_evaluations_total{{{WEB},shadow=\"web-next\"}} 2\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("watermarkd_shadow_divergence_total{{{WEB},shadow=\"web-next\"}} 1\n")),
            "{text}"
        );
        assert!(text.contains("# TYPE watermarkd_shadow_divergence_total counter\n"), "{text}");

        // A failed evaluation: the counts stay, the would-be replicas go.
        metrics.observe_failure(&labels("web"));
        let text = exported(&metrics);
        assert!(!text.contains("watermarkd_shadow_replicas{"), "{text}");
        assert!(
            text.contains(&format!("watermarkd_shadow_divergence_total{{{WEB},shadow=\"web-next\"}} 1\n")),
            "{text}"
        );

        // The shadow is removed from the rules: its series go with the next evaluation.
        metrics.observe(&labels("web"), &rule, &decision, false, &[], None);
        assert!(!exported(&metrics).contains("watermarkd_shadow"), "{}", exported(&metrics));
    }

    #[test]
    fn a_forecast_fallback_or_pause_has_series_only_where_there_is_one() {
        let web = labels("web");
        let metrics = admitted(&[&web]);
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "metric": [{ "name": "rps", "high_watermark": 10 }]
        }))
        .unwrap();
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let decision = decide(
            &rule,
            Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) },
            &[Reading::Value { value: 7.0, at: now }],
            &State::default(),
            now,
        );
        metrics.observe(&web, &rule, &decision, false, &[], None);
        assert!(!metrics.snapshot().render_all().contains("watermarkd_forecast"), "no family without a forecast");
        let ahead = Outlook {
            forecast_demand: vec![("rps".into(), 130.0)],
            forecast_replicas: Some(13),
            fallback_active: Some(false),
            paused: None,
        };
        metrics.observe(&web, &rule, &decision, false, &[], Some(ahead));
        let text = metrics.snapshot().render_all();
        for expected in [
            "watermarkd_forecast_demand{",
            ",metric_name=\"rps\"} 130",
            "watermarkd_forecast_replicas{",
            "watermarkd_fallback_active{",
        ] {
            assert!(text.contains(expected), "{expected} in:\n{text}");
        }
        assert!(!text.contains("watermarkd_paused{"), "no pause, no series:\n{text}");
    }

    #[test]
    fn a_claimed_target_has_one_series_per_claimant_and_none_without_one() {
        let web = labels("web");
        let metrics = admitted(&[&web]);
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10, "metric": [{ "name": "rps", "high_watermark": 10 }]
        }))
        .unwrap();
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let decision = decide(&rule, target, &[Reading::Value { value: 7.0, at: now }], &State::default(), now);
        metrics.observe(&web, &rule, &decision, false, &[], None);
        assert!(!exported(&metrics).contains("watermarkd_target_claimed"), "no family without a claim");
        let record = |withheld: bool| {
            let mut outcome = Outcome::of_decision(decision.clone(), &rule, false);
            outcome.claims = Some(Box::new(crate::domain::claims::ClaimNote {
                claimed_by: vec!["HorizontalPodAutoscaler/prod/web".into(), "ScaledObject/prod/web".into()],
                withheld,
                taking_over: !withheld,
                sentence: String::new(),
            }));
            metrics.ledger.record("file/web", &web, outcome);
        };
        record(true);
        let text = exported(&metrics);
        assert!(text.contains("# TYPE watermarkd_target_claimed gauge\n"), "{text}");
        for by in ["HorizontalPodAutoscaler/prod/web", "ScaledObject/prod/web"] {
            let line = format!("watermarkd_target_claimed{{{WEB},claimed_by=\"{by}\"}} 1\n");
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
        record(false);
        let taken = format!("watermarkd_target_claimed{{{WEB},claimed_by=\"ScaledObject/prod/web\"}} 0\n");
        assert!(exported(&metrics).contains(&taken), "taken over: 0");
        metrics.observe(&web, &rule, &decision, false, &[], None);
        assert!(!exported(&metrics).contains("watermarkd_target_claimed"), "gone with the claim");
    }
}
