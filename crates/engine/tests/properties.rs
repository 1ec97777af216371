//! Property tests: invariants that must hold for every rule, target, reading and state.

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
use proptest::prelude::*;
use watermarkd_engine::{
    decide, Algorithm, BehaviorSpec, ConvergeTowards, Decimal, Guard, MetricSpec, Position, Reading, Recommendation,
    Rule, RuleSpec, ScaleEvent, State, Target,
};

/// A decimal with up to four fractional digits, as people write watermarks and APIs print values.
fn decimal_text() -> impl Strategy<Value = String> {
    (1u64..200_000, 0u32..5).prop_map(|(units, scale)| {
        let d = Decimal::from_parts(i128::from(units), -(scale as i32));
        d.to_string()
    })
}

#[derive(Debug, Clone)]
struct Case {
    rule: Rule,
    target: Target,
    state: State,
}

fn rule_strategy() -> impl Strategy<Value = Rule> {
    (
        (1u32..20, 0u32..40),
        (decimal_text(), decimal_text()),
        (0u32..50, prop_oneof![Just(Algorithm::Absolute), Just(Algorithm::Average)]),
        (0u32..300, 0u32..99, 0u64..400, 0u64..400),
        (0u64..200, 0u64..200, 1u32..5),
        (prop_oneof![Just(None), Just(Some(ConvergeTowards::High)), Just(Some(ConvergeTowards::Low))], any::<bool>()),
        any::<bool>(),
    )
        .prop_map(
            |(
                (min, extra),
                (a, b),
                (tol, algorithm),
                (up, down, upw, downw),
                (upd, downd, modulo),
                (converge, behavior),
                zero,
            )| {
                let (a, b) = (dec(&a), dec(&b));
                let (low, high) = if a <= b { (a, b) } else { (b, a) };
                let mut spec = RuleSpec {
                    min_replicas: Some(min),
                    max_replicas: Some(min + extra),
                    algorithm: Some(algorithm),
                    tolerance: Some(Decimal::from_parts(i128::from(tol), -2)),
                    metrics: vec![MetricSpec {
                        name: "m".into(),
                        low_watermark: Some(low),
                        high_watermark: Some(high),
                        max_age: None,
                        activation: None,
                    }],
                    replica_modulo: Some(modulo),
                    converge_towards_watermark: converge,
                    tolerate_zero: Some(zero),
                    ..Default::default()
                };
                // Delays do not apply to convergence steps (docs/engine.md §4), so a convergence step up
                // can outrun a delayed upscale: keep the two apart where monotonicity is checked.
                if converge.is_none() {
                    spec.upscale_delay_above_watermark = Some(secs(upd));
                    spec.downscale_delay_below_watermark = Some(secs(downd));
                }
                if behavior {
                    spec.behavior = Some(BehaviorSpec::default());
                } else {
                    spec.scale_up_limit_factor = Some(Decimal::from_int(i64::from(up)));
                    spec.scale_down_limit_factor = Some(Decimal::from_int(i64::from(down)));
                    spec.upscale_forbidden_window = Some(secs(upw));
                    spec.downscale_forbidden_window = Some(secs(downw));
                }
                Rule::new(spec).unwrap()
            },
        )
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        rule_strategy(),
        (0u32..60, 0u32..60),
        (proptest::option::of(0u64..600), proptest::option::of(0u64..600), proptest::option::of(0u64..600)),
        proptest::collection::vec((1u32..60, 0u64..600), 0..6),
    )
        .prop_map(|(rule, (spec, ready), (last, above, below), history)| Case {
            rule,
            target: Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(ready.min(spec)) },
            state: State {
                last_scale_time: last.map(ago),
                above_since: above.map(ago),
                below_since: below.map(ago),
                recommendations: history.iter().map(|&(r, a)| Recommendation { replicas: r, at: ago(a) }).collect(),
                scale_events: history.iter().map(|&(r, a)| ScaleEvent::new(r, r.saturating_add(2), ago(a))).collect(),
                zero: None,
            },
        })
}

fn reading_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        (0u64..2_000_000).prop_map(|v| v as f64 / 1000.0),
        Just(0.0),
        (0u64..100).prop_map(|v| v as f64 * 1000.0),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn result_stays_within_bounds_unless_a_guard_holds(case in case_strategy(), v in reading_value()) {
        let d = decide(&case.rule, case.target, &[value(v)], &case.state, now());
        let (min, max) = (case.rule.min_replicas(), case.rule.max_replicas());
        let holding = matches!(d.guard, Some(Guard::Paused | Guard::NoData | Guard::MinAvailable | Guard::NoReadyReplicas));
        if !holding && d.replicas != case.target.spec_replicas {
            prop_assert!(d.replicas >= min && d.replicas <= max, "{} outside {min}..{max}: {}", d.replicas, d.reason);
        }
        if (min..=max).contains(&case.target.spec_replicas) {
            prop_assert!(d.replicas >= min && d.replicas <= max || d.guard == Some(Guard::Paused));
        }
    }

    #[test]
    fn nothing_moves_inside_the_band(case in case_strategy(), v in reading_value()) {
        let d = decide(&case.rule, case.target, &[value(v)], &case.state, now());
        let in_bounds = (case.rule.min_replicas()..=case.rule.max_replicas()).contains(&case.target.spec_replicas);
        let stabilizing = d.stabilization.is_some();
        if d.metrics[0].position == Position::Inside && !d.converging && in_bounds && !stabilizing {
            prop_assert_eq!(d.replicas, case.target.spec_replicas, "{}", d.reason);
        }
    }

    #[test]
    fn a_higher_reading_never_gives_fewer_replicas(case in case_strategy(), a in 1u64..2_000_000, b in 1u64..2_000_000) {
        let (lo, hi) = (a.min(b) as f64 / 1000.0, a.max(b) as f64 / 1000.0);
        let d_lo = decide(&case.rule, case.target, &[value(lo)], &case.state, now());
        let d_hi = decide(&case.rule, case.target, &[value(hi)], &case.state, now());
        prop_assert!(d_hi.replicas >= d_lo.replicas, "{lo} -> {} ({}) but {hi} -> {} ({})", d_lo.replicas, d_lo.reason, d_hi.replicas, d_hi.reason);
    }

    #[test]
    fn unavailable_data_never_scales_down(
        case in case_strategy(),
        v in reading_value(),
        kind in 0usize..4,
        second in any::<bool>(),
    ) {
        let bad = match kind {
            0 => Reading::Unavailable { reason: "timeout".into() },
            1 => value(f64::NAN),
            2 => value(f64::INFINITY),
            _ => value(-1.0),
        };
        let mut spec_rule = case.rule.clone();
        // Two metrics: one good, one bad; or the bad one alone.
        let readings = if second {
            spec_rule = two_metric_copy(&case.rule);
            vec![value(v), bad]
        } else {
            vec![bad]
        };
        let d = decide(&spec_rule, case.target, &readings, &case.state, now());
        prop_assert!(d.replicas >= case.target.spec_replicas, "{}", d.reason);
        if d.guard != Some(Guard::Paused) {
            prop_assert!(d.state.below_since.is_none());
        }
    }

    #[test]
    fn the_same_inputs_give_the_same_output(case in case_strategy(), v in reading_value()) {
        let first = decide(&case.rule, case.target, &[value(v)], &case.state, now());
        let again = decide(&case.rule.clone(), case.target, &[value(v)], &case.state.clone(), now());
        prop_assert_eq!(first, again);
    }

    /// ceil/floor of `ready x value / watermark` equal exact integer arithmetic for decimal inputs.
    #[test]
    fn replica_formulas_are_exact_for_decimals(
        ready in 1u32..500,
        value_units in 1u64..10_000_000,
        value_scale in 0u32..5,
        mark_units in 1u64..10_000_000,
        mark_scale in 0u32..5,
    ) {
        let v = Decimal::from_parts(i128::from(value_units), -(value_scale as i32));
        let w = Decimal::from_parts(i128::from(mark_units), -(mark_scale as i32));
        let r = Rule::new(RuleSpec {
            min_replicas: Some(1),
            max_replicas: Some(u32::MAX),
            tolerance: Some(Decimal::zero()),
            scale_up_limit_factor: Some(Decimal::from_int(1_000_000_000)),
            scale_down_limit_factor: Some(Decimal::from_parts(9999, -2)),
            metrics: vec![MetricSpec { name: "m".into(), low_watermark: Some(w.clone()), high_watermark: Some(w.clone()), max_age: None, activation: None }],
            ..Default::default()
        }).unwrap();
        let reading: f64 = v.to_string().parse().unwrap();
        let d = decide(&r, Target { spec_replicas: ready, status_replicas: None, ready_replicas: None }, &[value(reading)], &State::default(), now());
        // ready x (value_units / 10^vs) / (mark_units / 10^ms) = ready x value_units x 10^ms / (mark_units x 10^vs)
        let num = u128::from(ready) * u128::from(value_units) * 10u128.pow(mark_scale);
        let den = u128::from(mark_units) * 10u128.pow(value_scale);
        let (ceil, floor) = (num.div_ceil(den), num / den);
        let expected = match d.metrics[0].position {
            Position::Above => u128::from(ready).max(ceil),
            Position::Below => floor.max(1).min(u128::from(ready)),
            _ => u128::from(ready),
        };
        prop_assert_eq!(u128::from(d.metrics[0].proposal.unwrap()), expected.min(u128::from(u32::MAX)));
        // And the position agrees with exact comparison too.
        let above = u128::from(value_units) * 10u128.pow(mark_scale) > u128::from(mark_units) * 10u128.pow(value_scale);
        prop_assert_eq!(d.metrics[0].position == Position::Above, above);
    }
}

/// The same rule with a second metric of the same watermarks, for partial-data cases.
fn two_metric_copy(rule: &Rule) -> Rule {
    let m = &rule.metrics()[0];
    let metric = |name: &str| MetricSpec {
        name: name.into(),
        low_watermark: Some(m.low_watermark.clone()),
        high_watermark: Some(m.high_watermark.clone()),
        max_age: None,
        activation: None,
    };
    Rule::new(RuleSpec {
        min_replicas: Some(rule.min_replicas()),
        max_replicas: Some(rule.max_replicas()),
        algorithm: Some(rule.algorithm()),
        tolerance: Some(rule.upscale_tolerance().clone()),
        metrics: vec![metric("a"), metric("b")],
        ..Default::default()
    })
    .unwrap()
}
