use serde_json::json;
use watermarkd_engine::{decide, Reading, Rule, State, Target};

use super::*;
use crate::domain::outcome::ShadowOutcome;

fn labels(name: &str, dry_run: bool) -> Arc<SeriesLabels> {
    Arc::new(SeriesLabels::deployment(name, "prod", dry_run))
}

fn identity(name: &str, dry_run: bool) -> Identity {
    Identity::rules_file(labels(name, dry_run), &[], 15, (1, 20))
}

fn rule() -> Rule {
    crate::domain::rules::rule_from_json(&json!({
        "min_replicas": 1, "max_replicas": 20, "algorithm": "absolute",
        "upscale_forbidden_window": "0s", "downscale_forbidden_window": "0s",
        "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
    }))
    .unwrap()
}

/// A scale-up from `spec` at second `at`, written.
fn scale_up(at: i64, spec: u32) -> Outcome {
    let now = Timestamp::from_unix_millis(at * 1000);
    let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
    let decision = decide(&rule(), target, &[Reading::Value { value: 30.0, at: now }], &State::default(), now);
    assert_eq!(decision.action, Action::ScaleUp);
    let mut outcome = Outcome::of_decision(decision, &rule(), true);
    outcome.conditions = vec![("AbleToScale", true), ("ScalingLimited", true)];
    outcome
}

#[test]
fn an_hour_is_kept_at_any_interval_and_no_more_than_the_cap() {
    let hour = Ledger::new(Duration::from_secs(3600));
    assert_eq!((hour.capacity(1), hour.capacity(15), hour.capacity(300)), (3_601, 241, BLOCK));
    assert_eq!(Ledger::new(Duration::from_secs(86_400)).capacity(1), MAX_SAMPLES);
}

#[test]
fn counters_add_the_replicas_each_written_scale_moved_and_keep_the_conditions_set() {
    let ledger = Ledger::new(Duration::from_secs(3600));
    ledger.admit(identity("web", false));
    ledger.record("file/web", &labels("web", false), scale_up(1_000, 2));
    ledger.record("file/web", &labels("web", false), scale_up(1_015, 3));
    let entry = ledger.entries().remove(0);
    // 2 -> 3 and 3 -> 4, each at the default 50% limit.
    assert_eq!(entry.counters.upscale_replicas_total, 2);
    assert_eq!(entry.counters.conditions[0..2], [Some(true), Some(true)]);
    assert_eq!(entry.counters.conditions[2], None, "never set");
    // The ledger keeps the decision without its next states.
    assert_eq!(entry.last.unwrap().decision.state, State::default());
}

#[test]
fn a_late_report_under_old_labels_or_for_a_stopped_autoscaler_is_dropped() {
    let ledger = Ledger::new(Duration::from_secs(3600));
    ledger.admit(identity("web", false));
    ledger.record("file/web", &labels("web", false), scale_up(1_000, 2));
    // The rule's dry_run flips: the label set changes and the series start over.
    ledger.admit(identity("web", true));
    let entry = ledger.entries().remove(0);
    assert!(!entry.reported, "nothing exported under the new labels until an evaluation reports");
    assert_eq!(entry.counters, Counters::default());
    assert!(entry.last.is_some(), "the board still shows the last decision");
    // An evaluation that started before the flip reports under the old labels: dropped.
    ledger.record("file/web", &labels("web", false), scale_up(1_015, 3));
    ledger.failed("file/web", &labels("web", false), Timestamp::from_unix_millis(1_015_000), "x");
    let entry = ledger.entries().remove(0);
    assert!(!entry.reported && entry.failure.is_none());
    assert_eq!(entry.counters.upscale_replicas_total, 0);
    ledger.record("file/web", &labels("web", true), scale_up(1_030, 3));
    assert!(ledger.entries().remove(0).reported);
    ledger.remove("file/web");
    ledger.record("file/web", &labels("web", true), scale_up(1_045, 5));
    assert!(ledger.entries().is_empty(), "a report after the autoscaler stopped brings nothing back");
}

#[test]
fn a_failed_evaluation_turns_able_to_scale_and_scaling_active_false_and_keeps_the_shadow_counts() {
    let ledger = Ledger::new(Duration::from_secs(3600));
    ledger.admit(identity("web", false));
    let mut outcome = scale_up(1_000, 2);
    outcome.shadows = Some(vec![ShadowOutcome { name: "candidate".into(), replicas: 4, diverged: true }]);
    ledger.record("file/web", &labels("web", false), outcome);
    ledger.failed("file/web", &labels("web", false), Timestamp::from_unix_millis(1_015_000), "forbidden");
    ledger.failed("file/web", &labels("web", false), Timestamp::from_unix_millis(1_030_000), "forbidden");
    let entry = ledger.entries().remove(0);
    let failure = entry.failure.unwrap();
    assert_eq!(
        (failure.since, failure.at),
        (Timestamp::from_unix_millis(1_015_000), Timestamp::from_unix_millis(1_030_000))
    );
    assert_eq!(&entry.counters.conditions[0..4], [Some(false), Some(true), Some(false), Some(false)]);
    let shadow = entry.counters.shadows.iter().next().cloned().unwrap();
    assert_eq!((shadow.replicas, shadow.evaluations_total, shadow.divergence_total), (None, 1, 1));
}
