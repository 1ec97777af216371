//! The problems `Rule::new` finds in a rule: every one at once, each naming its field, in the
//! order of the fields.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

mod common;

use common::*;
use watermarkd_engine::{BehaviorSpec, MetricSpec, Rule, RuleSpec};

#[test]
fn behavior_and_the_wpa_knobs_are_exclusive() {
    let err = Rule::new(RuleSpec {
        max_replicas: Some(3),
        metrics: vec![metric("m", "1", "2")],
        scale_up_limit_factor: Some(dec("50")),
        behavior: Some(BehaviorSpec::default()),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(err[0].field, "scale_up_limit_factor");
}

#[test]
fn a_problem_between_two_fields_says_which_as_data_too() {
    use watermarkd_engine::Relation;
    let err = Rule::new(RuleSpec {
        min_replicas: Some(5),
        max_replicas: Some(4),
        metrics: vec![metric("m", "3", "2")],
        ..Default::default()
    })
    .unwrap_err();
    let shown: Vec<String> = err.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "min_replicas: (5) must not exceed max_replicas (4)",
            "metric[0].low_watermark: (3) must not exceed high_watermark (2)"
        ]
    );
    assert_eq!(
        err[0].relation,
        Some(Relation::Exceeds { value: "5".into(), other: "max_replicas".into(), bound: "4".into() })
    );
    assert_eq!(
        err[1].relation,
        Some(Relation::Exceeds { value: "3".into(), other: "metric[0].high_watermark".into(), bound: "2".into() })
    );
}

#[test]
fn min_replicas_zero_needs_an_activation_on_every_metric_and_nothing_else_takes_one() {
    let problems = |change: &dyn Fn(&mut RuleSpec)| {
        let mut spec = RuleSpec {
            max_replicas: Some(5),
            metrics: vec![metric("queue", "10", "100"), metric("rate", "1", "2")],
            ..Default::default()
        };
        change(&mut spec);
        Rule::new(spec).err().unwrap_or_default().iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    assert_eq!(
        problems(&|s| {
            s.min_replicas = Some(0);
            s.metrics[0].activation = Some(dec("5"));
        }),
        ["metric[1].activation: is required with min_replicas = 0: the value above which the workload wakes from zero"]
    );
    assert_eq!(
        problems(&|s| {
            s.metrics[1].activation = Some(dec("5"));
            s.scale_to_zero_delay = Some(secs(60));
        }),
        [
            "metric[1].activation: only applies with min_replicas = 0 (scale to zero)",
            "scale_to_zero_delay: only applies with min_replicas = 0 (scale to zero)"
        ]
    );
    assert_eq!(
        problems(&|s| {
            s.min_replicas = Some(0);
            s.metrics[0].activation = Some(dec("-1"));
            s.metrics[1].activation = Some(dec("0"));
        }),
        ["metric[0].activation: (-1) must not be negative"]
    );
    let r = Rule::new(RuleSpec {
        min_replicas: Some(0),
        max_replicas: Some(5),
        metrics: vec![MetricSpec { activation: Some(dec("5")), ..metric("queue", "10", "100") }],
        scale_to_zero_delay: Some(secs(120)),
        ..Default::default()
    })
    .unwrap();
    assert_eq!((r.min_replicas(), r.min_running_replicas()), (0, 1));
    assert_eq!(r.scale_to_zero().map(|z| z.delay), Some(secs(120)));
}

#[test]
fn every_problem_of_a_rule_is_named_at_once_in_the_order_of_its_fields() {
    let err = Rule::new(RuleSpec {
        min_replicas: Some(5),
        max_replicas: Some(4),
        tolerance: Some(dec("1.5")),
        metrics: vec![metric("m", "3", "2")],
        upscale_forbidden_window: Some(secs(60)),
        scale_up_limit_factor: None,
        scale_down_limit_factor: None,
        behavior: Some(BehaviorSpec::default()),
        ..Default::default()
    })
    .unwrap_err();
    let shown: Vec<String> = err.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "min_replicas: (5) must not exceed max_replicas (4)",
            "tolerance: (1.5) must be a fraction from 0 (inclusive) to 1 (exclusive), e.g. 0.1 for 10%",
            "metric[0].low_watermark: (3) must not exceed high_watermark (2)",
            "upscale_forbidden_window: cannot be combined with a behavior block: use the behavior policies, or remove behavior"
        ]
    );
}
