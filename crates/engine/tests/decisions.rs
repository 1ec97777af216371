//! Table tests: one decision per case, through the public API, for every rule in docs/engine.md.

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
use watermarkd_engine::{
    decide, Action, Algorithm, BehaviorSpec, ConvergeTowards, Guard, Limit, MetricSpec, Policy, PolicyKind, Position,
    Reading, Recommendation, ScaleEvent, ScalingRulesSpec, SelectPolicy, State, Target, Timestamp, ZeroState,
};

fn replicas(rule: &watermarkd_engine::Rule, t: Target, readings: &[Reading]) -> u32 {
    decide(rule, t, readings, &State::default(), now()).replicas
}

// ---- §1 per-metric proposal -------------------------------------------------------------

#[test]
fn decimal_inputs_are_exact() {
    // 10 ready x 0.44 / 0.40 is 11, not the 12 that binary floats give.
    let r = rule(|s| {
        s.tolerance = Some(dec("0.01"));
        s.metrics = vec![metric("latency", "0.15", "0.4")];
    });
    let d = decide(&r, target(10), &[value(0.44)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Above);
    assert_eq!(d.metrics[0].proposal, Some(11));
    assert_eq!(d.replicas, 11);
}

#[test]
fn tolerance_comparisons_are_strict_and_multiplicative() {
    let r = rule(|s| {
        s.tolerance = Some(dec("0.1"));
        s.metrics = vec![metric("m", "0.5", "1")];
    });
    // Exactly on the widened band: inside on both sides.
    for v in [1.1, 0.45] {
        let d = decide(&r, target(10), &[value(v)], &State::default(), now());
        assert_eq!(d.metrics[0].position, Position::Inside, "{v}");
        assert_eq!(d.replicas, 10);
    }
    assert_eq!(
        decide(&r, target(10), &[value(1.1000001)], &State::default(), now()).metrics[0].position,
        Position::Above
    );
    assert_eq!(
        decide(&r, target(10), &[value(0.4499999)], &State::default(), now()).metrics[0].position,
        Position::Below
    );
}

#[test]
fn each_direction_has_its_own_tolerance() {
    // As the HPA's behavior.scaleUp.tolerance / scaleDown.tolerance: 0% up, 20% down.
    let r = rule(|s| {
        s.tolerance = Some(dec("0.1"));
        s.upscale_tolerance = Some(dec("0"));
        s.downscale_tolerance = Some(dec("0.2"));
    });
    let d = decide(&r, target(10), &[value(1.01)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.metrics[0].band_high), (Position::Above, 1.0));
    assert!(d.reason.contains("(upscale_tolerance 0%)"), "{}", d.reason);
    let d = decide(&r, target(10), &[value(0.41)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.metrics[0].band_low), (Position::Inside, 0.4));
    let d = decide(&r, target(10), &[value(0.39)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Below);
    assert!(d.reason.contains("(downscale_tolerance 20%)"), "{}", d.reason);

    // Through behavior, and the unset direction keeps the rule's tolerance.
    let r = rule(|s| {
        s.tolerance = Some(dec("0.1"));
        s.scale_up_limit_factor = None;
        s.scale_down_limit_factor = None;
        s.behavior = Some(BehaviorSpec {
            scale_up: Some(ScalingRulesSpec { tolerance: Some(dec("0.05")), ..Default::default() }),
            scale_down: None,
        });
    });
    assert_eq!((r.upscale_tolerance(), r.downscale_tolerance()), (&dec("0.05"), &dec("0.1")));
    let d = decide(&r, target(10), &[value(1.06)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Above);
}

#[test]
fn above_uses_ceil_on_the_raw_high_watermark() {
    let r = rule(|s| s.tolerance = Some(dec("0.1")));
    // 10 x 1.15 / 1 = 11.5 -> 12 (not divided by the widened 1.1).
    assert_eq!(replicas(&r, target(10), &[value(1.15)]), 12);
}

#[test]
fn below_uses_floor_on_the_raw_low_watermark_and_never_below_one() {
    let r = rule(|s| {
        s.tolerance = Some(dec("0.01"));
        s.metrics = vec![metric("m", "0.15", "0.4")];
        s.scale_down_limit_factor = Some(dec("20"));
    });
    // The case: 6 ready at 0.127 -> floor(5.08) = 5.
    let d = decide(&r, target(6), &[value(0.127)], &State::default(), now());
    assert_eq!(d.metrics[0].proposal, Some(5));
    assert_eq!(d.replicas, 5);

    let r = rule(|s| s.metrics = vec![metric("m", "1", "2")]);
    let d = decide(&r, target(3), &[value(0.01)], &State::default(), now());
    assert_eq!(d.metrics[0].proposal, Some(1));
}

#[test]
fn average_divides_the_total_by_ready_replicas() {
    let r = rule(|s| {
        s.algorithm = Some(Algorithm::Average);
        s.metrics = vec![metric("rps", "60", "100")];
    });
    let d = decide(&r, target(10), &[value(1500.0)], &State::default(), now());
    assert_eq!(d.metrics[0].usage, Some(150.0));
    assert_eq!(d.metrics[0].proposal, Some(15));
    // Total 400 over 10 replicas = 40 per replica, below 60: floor(400 / 60) = 6.
    let d = decide(&r, target(10), &[value(400.0)], &State::default(), now());
    assert_eq!(d.metrics[0].proposal, Some(6));
}

#[test]
fn ready_replicas_drive_the_formula_and_spec_the_comparison() {
    let r = rule(|s| s.metrics = vec![metric("m", "0.5", "1")]);
    // 8 of 10 ready at 2.0 -> ceil(8 x 2 / 1) = 16.
    assert_eq!(replicas(&r, target_ready(10, 8), &[value(2.0)]), 16);
    // Ready is capped at status replicas.
    let t = Target { spec_replicas: 10, status_replicas: Some(6), ready_replicas: Some(9) };
    assert_eq!(decide(&r, t, &[value(2.0)], &State::default(), now()).ready_replicas, 6);
    // Readiness unknown: spec stands in.
    let t = Target { spec_replicas: 10, status_replicas: None, ready_replicas: None };
    assert_eq!(decide(&r, t, &[value(2.0)], &State::default(), now()).metrics[0].proposal, Some(20));
}

#[test]
fn above_never_proposes_below_spec_and_below_never_above_spec() {
    let r = rule(|s| s.metrics = vec![metric("m", "0.5", "1")]);
    // 2 of 10 ready at 1.5: ceil(2 x 1.5) = 3, but above never goes under spec.
    let d = decide(&r, target_ready(10, 2), &[value(1.5)], &State::default(), now());
    assert_eq!(d.metrics[0].proposal, Some(10));
}

#[test]
fn a_single_watermark_serves_as_both_bounds() {
    let mut m = metric("m", "1", "1");
    m.low_watermark = None;
    let r = rule(|s| s.metrics = vec![m]);
    assert_eq!(r.metrics()[0].low_watermark, dec("1"));
    assert_eq!(replicas(&r, target(10), &[value(1.2)]), 12);
    assert_eq!(replicas(&r, target(10), &[value(0.8)]), 8);
    assert_eq!(replicas(&r, target(10), &[value(1.0)]), 10);
}

#[test]
fn modulo_rounds_up_in_both_directions_without_passing_spec() {
    let r = rule(|s| s.replica_modulo = Some(4));
    assert_eq!(replicas(&r, target(8), &[value(1.3)]), 12); // 11 -> 12
    assert_eq!(replicas(&r, target(12), &[value(0.4)]), 12); // floor(12 x 0.4 / 0.5) = 9 -> 12 = spec
    assert_eq!(replicas(&r, target(20), &[value(0.2)]), 8); // 8 -> 8
    assert_eq!(replicas(&r, target(14), &[value(0.2)]), 8); // 5 -> 8
}

#[test]
fn above_the_band_an_off_grid_spec_rounds_up_to_the_modulo() {
    // docs/engine.md §1: 4 ready of 5 at 1.2 against 1 (tolerance 0.1) asks ceil(4 x 1.2) = 5,
    // which is spec; above the band it still rounds up to 8 and scales, as the WPA does.
    let r = rule(|s| {
        s.replica_modulo = Some(4);
        s.tolerance = Some(dec("0.1"));
        s.scale_up_limit_factor = Some(dec("100"));
    });
    let d = decide(&r, target_ready(5, 4), &[value(1.2)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Above);
    assert_eq!((d.metrics[0].proposal, d.proposal), (Some(8), Some(8)));
    assert_eq!((d.replicas, d.action), (8, Action::ScaleUp));
    // The case: spec 5, modulo 2 -> 6.
    let r = rule(|s| {
        s.replica_modulo = Some(2);
        s.tolerance = Some(dec("0.1"));
    });
    assert_eq!(decide(&r, target_ready(5, 4), &[value(1.2)], &State::default(), now()).replicas, 6);
    // Inside the band the off-grid spec stays: nothing asks for a change.
    assert_eq!(decide(&r, target(5), &[value(0.8)], &State::default(), now()).replicas, 5);
}

#[test]
fn above_the_band_an_off_grid_spec_over_the_rounded_formula_holds() {
    // The WPA rounds its formula's result to the modulo and then takes the larger of that and
    // `spec`: 40 ready at 272.9 against 95.6 ask ceil(114.2) = 115, on the grid 116, under the
    // off-grid spec of 122, which holds (rounding 122 itself up would scale to 124).
    let r = rule(|s| {
        s.replica_modulo = Some(4);
        s.max_replicas = Some(500);
        s.metrics = vec![metric("m", "50", "95.6")];
    });
    let d = decide(&r, target_ready(122, 40), &[value(272.9)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Above);
    assert_eq!((d.metrics[0].proposal, d.proposal), (Some(122), Some(122)));
    assert_eq!((d.replicas, d.action), (122, Action::Hold));
    // `average` reads the total: the same usage per ready replica gives the same answer.
    let r = rule(|s| {
        s.algorithm = Some(Algorithm::Average);
        s.replica_modulo = Some(4);
        s.max_replicas = Some(500);
        s.metrics = vec![metric("m", "50", "95.6")];
    });
    let d = decide(&r, target_ready(122, 40), &[value(272.9 * 40.0)], &State::default(), now());
    assert_eq!((d.replicas, d.action), (122, Action::Hold));
    // spec 9 with 2 ready, modulo 2, 37.669 against 13.3 (tolerance 0.02): ceil(5.66) = 6, on
    // the grid 6, under 9: hold at 9, not 10.
    let r = rule(|s| {
        s.replica_modulo = Some(2);
        s.tolerance = Some(dec("0.02"));
        s.metrics = vec![metric("m", "10", "13.3")];
    });
    let d = decide(&r, target_ready(9, 2), &[value(37.669)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Above);
    assert_eq!((d.replicas, d.action), (9, Action::Hold));
    // Once the rounded formula passes the off-grid spec it scales, to the grid: 3 ready at
    // 37.669 ask ceil(8.5) = 9, on the grid 10.
    let d = decide(&r, target_ready(9, 3), &[value(37.669)], &State::default(), now());
    assert_eq!((d.replicas, d.action), (10, Action::ScaleUp));
}

#[test]
fn a_zero_reading_holds_unless_tolerated() {
    let r = rule(|_| {});
    let d = decide(&r, target(10), &[value(0.0)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Inside);
    assert_eq!(d.replicas, 10);
    assert_eq!(d.action, Action::Hold);
    assert!(d.reason.contains("exactly 0"), "{}", d.reason);

    let r = rule(|s| s.tolerate_zero = Some(true));
    let d = decide(&r, target(10), &[value(0.0)], &State::default(), now());
    assert_eq!(d.metrics[0].position, Position::Below);
    assert_eq!(d.replicas, 1);
}

#[test]
fn garbage_and_stale_values_are_unavailable() {
    let mut m = metric("m", "0.5", "1");
    m.max_age = Some(secs(120));
    let r = rule(|s| s.metrics = vec![m]);
    for reading in [
        value(f64::NAN),
        value(f64::INFINITY),
        value(f64::NEG_INFINITY),
        value(-3.0),
        Reading::Value { value: 0.01, at: ago(121) },
        unavailable("timeout"),
    ] {
        let d = decide(&r, target(10), std::slice::from_ref(&reading), &State::default(), now());
        assert_eq!(d.metrics[0].position, Position::Unavailable, "{reading:?}");
        assert_eq!(d.guard, Some(Guard::NoData), "{reading:?}");
        assert_eq!(d.replicas, 10, "{reading:?}");
    }
    // A fresh enough point counts.
    let d = decide(&r, target(10), &[Reading::Value { value: 0.01, at: ago(119) }], &State::default(), now());
    assert_eq!(d.replicas, 1);
    assert_eq!(d.metrics[0].age_seconds, Some(119.0));
}

#[test]
fn a_direct_replica_recommendation_is_a_proposal() {
    let r = rule(|_| {});
    assert_eq!(replicas(&r, target(4), &[Reading::replicas(7)]), 7);
    assert_eq!(replicas(&r, target(4), &[Reading::replicas(2)]), 2);
}

fn bounded(replicas: u32, lower: u32, upper: u32) -> Reading {
    Reading::Replicas { replicas, lower_bound: Some(lower), upper_bound: Some(upper), observed: Some(0.7) }
}

#[test]
fn a_recommendation_with_bounds_is_judged_by_where_spec_stands_between_them() {
    let r = rule(|_| {});
    // spec under the lower bound: above the band.
    let d = decide(&r, target(4), &[bounded(7, 6, 9)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.proposal, d.replicas), (Position::Above, Some(7), 7));
    assert!(d.above_high_watermark && !d.converging);
    assert_eq!(d.metrics[0].value, Some(0.7), "the observed value is reported");
    assert_eq!(d.metrics[0].usage, None, "and never compared with the watermarks");
    // spec over the upper bound: below.
    let d = decide(&r, target(10), &[bounded(7, 5, 8)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.replicas), (Position::Below, 7));
    assert!(d.below_low_watermark);
    // spec between the bounds: inside, and the move is a convergence step.
    let d = decide(&r, target(6), &[bounded(7, 5, 8)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.replicas), (Position::Inside, 7));
    assert!(d.converging && !d.above_high_watermark);
    // Without bounds, the recommendation against spec decides, as before.
    let d = decide(&r, target(6), &[Reading::replicas(7)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.converging), (Position::Above, false));
}

#[test]
fn inside_the_bounds_the_delays_do_not_hold_a_recommendation() {
    let r = rule(|s| s.upscale_delay_above_watermark = Some(secs(300)));
    // Above the band the delay holds, as for a metric.
    let d = decide(&r, target(4), &[bounded(7, 6, 9)], &State::default(), now());
    assert_eq!((d.action, d.replicas), (Action::Hold, 4));
    // Inside it, the WPA's stable regime: no delay.
    let d = decide(&r, target(6), &[bounded(7, 5, 9)], &State::default(), now());
    assert_eq!((d.action, d.replicas), (Action::ScaleUp, 7));
}

#[test]
fn a_recommendation_equal_to_spec_converges_within_the_bounds() {
    let high = rule(|s| s.converge_towards_watermark = Some(ConvergeTowards::High));
    let d = decide(&high, target(6), &[bounded(6, 3, 8)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.proposal, d.converging), (Position::Inside, Some(5), true));
    // The step would leave the bounds: hold.
    let d = decide(&high, target(6), &[bounded(6, 6, 8)], &State::default(), now());
    assert_eq!((d.proposal, d.converging), (Some(6), false));
    let low = rule(|s| s.converge_towards_watermark = Some(ConvergeTowards::Low));
    assert_eq!(decide(&low, target(6), &[bounded(6, 3, 8)], &State::default(), now()).proposal, Some(7));
    assert_eq!(decide(&low, target(6), &[bounded(6, 3, 6)], &State::default(), now()).proposal, Some(6));
    // Without the feature, equal is a hold.
    let d = decide(&rule(|_| {}), target(6), &[bounded(6, 3, 8)], &State::default(), now());
    assert_eq!((d.proposal, d.action), (Some(6), Action::Hold));
}

#[test]
fn a_recommendation_of_zero_is_no_data_unless_zero_is_tolerated() {
    let r = rule(|_| {});
    let d = decide(&r, target(5), &[bounded(0, 0, 2)], &State::default(), now());
    assert_eq!((d.metrics[0].position, d.guard, d.replicas), (Position::Unavailable, Some(Guard::NoData), 5));
    assert!(d.reason.contains("tolerate_zero"), "{}", d.reason);
    let r = rule(|s| s.tolerate_zero = Some(true));
    assert_eq!(replicas(&r, target(5), &[Reading::replicas(0)]), 1, "0 is clamped to min_replicas");
}

#[test]
fn inverted_bounds_are_no_data() {
    let d = decide(&rule(|_| {}), target(5), &[bounded(7, 9, 6)], &State::default(), now());
    assert_eq!((d.guard, d.replicas), (Some(Guard::NoData), 5));
    assert!(d.reason.contains("inverted"), "{}", d.reason);
}

// ---- §2 several metrics -----------------------------------------------------------------

fn two_metrics() -> watermarkd_engine::Rule {
    rule(|s| s.metrics = vec![metric("cpu", "0.5", "0.8"), metric("latency", "0.1", "0.3")])
}

#[test]
fn the_largest_proposal_wins_and_names_the_reason() {
    let r = two_metrics();
    let d = decide(&r, target(10), &[value(0.96), value(0.45)], &State::default(), now());
    assert_eq!(d.metrics[0].proposal, Some(12));
    assert_eq!(d.metrics[1].proposal, Some(15));
    assert_eq!(d.replicas, 15);
    assert_eq!(d.proposal_metric.as_deref(), Some("latency"));
    assert!(d.reason.contains("latency above high watermark"), "{}", d.reason);
    // One below, one inside: the inside one keeps spec, so no scale down.
    let d = decide(&r, target(10), &[value(0.2), value(0.2)], &State::default(), now());
    assert!(d.below_low_watermark);
    assert_eq!(d.replicas, 10);
}

#[test]
fn partial_data_may_scale_up_but_never_down() {
    let r = two_metrics();
    let d = decide(&r, target(10), &[value(1.6), unavailable("timeout")], &State::default(), now());
    assert_eq!(d.replicas, 20);
    let d = decide(&r, target(10), &[value(0.1), unavailable("timeout")], &State::default(), now());
    assert_eq!(d.replicas, 10);
    assert_eq!(d.action, Action::Hold);
    assert!(d.reason.contains("partial data never scales down"), "{}", d.reason);
    // A missing reading (fewer readings than metrics) is unavailable too.
    let d = decide(&r, target(10), &[value(0.1)], &State::default(), now());
    assert_eq!(d.replicas, 10);
}

#[test]
fn nothing_available_holds() {
    let r = two_metrics();
    let d = decide(&r, target(10), &[unavailable("no data"), value(f64::NAN)], &State::default(), now());
    assert_eq!(d.guard, Some(Guard::NoData));
    assert_eq!(d.proposal, None);
    assert_eq!((d.replicas, d.write), (10, false));
    assert!(d.reason.contains("no metric data"), "{}", d.reason);
}

// ---- §3 WPA velocity ---------------------------------------------------------------------

fn limited(up: &str, down: &str) -> watermarkd_engine::Rule {
    rule(|s| {
        s.scale_up_limit_factor = Some(dec(up));
        s.scale_down_limit_factor = Some(dec(down));
    })
}

#[test]
fn limit_factors_cap_the_step() {
    // 10 replicas recommended 14 with a 30% up limit -> 13.
    let d = decide(&limited("30", "20"), target(10), &[value(1.4)], &State::default(), now());
    assert_eq!((d.proposal, d.replicas, d.limit), (Some(14), 13, Limit::UpscaleCapping));
    assert_eq!(d.upscale_limit, Some(13));
    // 29%: 13 is capped to 12; 7 is raised to 8.
    assert_eq!(replicas(&limited("29", "29"), target(10), &[value(1.3)]), 12);
    let d = decide(&limited("29", "29"), target(10), &[value(0.35)], &State::default(), now());
    assert_eq!((d.proposal, d.replicas, d.limit), (Some(7), 8, Limit::DownscaleCapping));
    // 1 replica at 50% may add one.
    assert_eq!(replicas(&limited("50", "20"), target(1), &[value(10.0)]), 2);
    // The minimum step is one replica down too.
    assert_eq!(replicas(&limited("50", "20"), target(2), &[value(0.1)]), 1);
}

#[test]
fn zero_limit_factors_disable_a_direction() {
    let d = decide(&limited("0", "20"), target(10), &[value(2.0)], &State::default(), now());
    assert_eq!((d.replicas, d.action), (10, Action::Hold));
    assert_eq!(d.limit, Limit::UpscaleCapping);
    let d = decide(&limited("50", "0"), target(10), &[value(0.1)], &State::default(), now());
    assert_eq!((d.replicas, d.action), (10, Action::Hold));
}

#[test]
fn min_beats_the_down_limit_and_max_beats_the_up_limit() {
    let r = rule(|s| {
        s.min_replicas = Some(7);
        s.max_replicas = Some(12);
        s.scale_up_limit_factor = Some(dec("50"));
        s.scale_down_limit_factor = Some(dec("50"));
    });
    let d = decide(&r, target(10), &[value(0.1)], &State::default(), now());
    assert_eq!((d.replicas, d.limit), (7, Limit::TooFew));
    let d = decide(&r, target(10), &[value(3.0)], &State::default(), now());
    assert_eq!((d.replicas, d.limit), (12, Limit::TooMany));
    // Within the rate limits but outside the bounds.
    let d = decide(&r, target(8), &[value(0.3)], &State::default(), now());
    assert_eq!((d.replicas, d.limit), (7, Limit::TooFew));
}

#[test]
fn unready_replicas_block_a_capped_scale_down_below_ready() {
    let r = limited("50", "20");
    // 10 spec, 5 ready; proposal 1 is raised to the floor 8, above ready: do not scale down.
    let d = decide(&r, target_ready(10, 5), &[value(0.05)], &State::default(), now());
    assert_eq!((d.replicas, d.limit, d.action), (10, Limit::NotReady, Action::Hold));
}

#[test]
fn forbidden_windows_count_from_the_last_scale_of_either_direction() {
    let r = rule(|s| {
        s.upscale_forbidden_window = Some(secs(60));
        s.downscale_forbidden_window = Some(secs(300));
    });
    let state = State { last_scale_time: Some(ago(30)), ..Default::default() };
    let d = decide(&r, target(10), &[value(2.0)], &state, now());
    assert_eq!((d.action, d.replicas), (Action::Hold, 10));
    assert_eq!(d.timing.upscale_window_seconds_left, 30.0);
    assert!(!d.timing.upscale_allowed);
    assert!(d.reason.contains("upscale forbidden for 30s more"), "{}", d.reason);

    let state = State { last_scale_time: Some(ago(60)), ..Default::default() };
    let d = decide(&r, target(10), &[value(2.0)], &state, now());
    assert_eq!((d.action, d.replicas), (Action::ScaleUp, 20));
    assert_eq!(d.state.last_scale_time, Some(now()));

    let state = State { last_scale_time: Some(ago(299)), ..Default::default() };
    let d = decide(&r, target(10), &[value(0.1)], &state, now());
    assert_eq!((d.action, d.timing.downscale_window_seconds_left), (Action::Hold, 1.0));
    let state = State { last_scale_time: Some(ago(300)), ..Default::default() };
    assert_eq!(decide(&r, target(10), &[value(0.1)], &state, now()).action, Action::ScaleDown);
}

#[test]
fn delays_require_the_condition_to_have_held() {
    let r = rule(|s| {
        s.upscale_delay_above_watermark = Some(secs(60));
        s.downscale_delay_below_watermark = Some(secs(120));
    });
    // First time above: the clock starts now.
    let d = decide(&r, target(10), &[value(2.0)], &State::default(), now());
    assert_eq!((d.action, d.state.above_since), (Action::Hold, Some(now())));
    assert_eq!(d.timing.upscale_delay_seconds_left, 60.0);
    let state = State { above_since: Some(ago(59)), ..Default::default() };
    assert_eq!(decide(&r, target(10), &[value(2.0)], &state, now()).action, Action::Hold);
    let state = State { above_since: Some(ago(60)), ..Default::default() };
    let d = decide(&r, target(10), &[value(2.0)], &state, now());
    assert_eq!(d.action, Action::ScaleUp);
    assert_eq!(d.state.above_since, Some(ago(60)));

    let state = State { below_since: Some(ago(119)), ..Default::default() };
    assert_eq!(decide(&r, target(10), &[value(0.1)], &state, now()).action, Action::Hold);
    let state = State { below_since: Some(ago(120)), ..Default::default() };
    assert_eq!(decide(&r, target(10), &[value(0.1)], &state, now()).action, Action::ScaleDown);
    // Back inside: both clocks reset.
    let state = State { above_since: Some(ago(500)), below_since: Some(ago(500)), ..Default::default() };
    let d = decide(&r, target(10), &[value(0.7)], &state, now());
    assert_eq!((d.state.above_since, d.state.below_since), (None, None));
}

#[test]
fn missing_data_resets_the_downscale_delay_but_not_the_upscale_one() {
    let r = rule(|s| s.metrics = vec![metric("a", "0.5", "1"), metric("b", "0.5", "1")]);
    let state = State { above_since: Some(ago(100)), below_since: Some(ago(100)), ..Default::default() };
    let d = decide(&r, target(10), &[unavailable("x"), unavailable("y")], &state, now());
    assert_eq!((d.state.above_since, d.state.below_since), (Some(ago(100)), None));
    let d = decide(&r, target(10), &[value(0.1), unavailable("y")], &state, now());
    assert_eq!(d.state.below_since, None);
}

// ---- §3b behavior -----------------------------------------------------------------------

fn behavior(up: Option<ScalingRulesSpec>, down: Option<ScalingRulesSpec>) -> watermarkd_engine::Rule {
    rule(|s| {
        s.scale_up_limit_factor = None;
        s.scale_down_limit_factor = None;
        s.behavior = Some(BehaviorSpec { scale_up: up, scale_down: down });
    })
}

fn policies(select: SelectPolicy, list: &[(PolicyKind, u32, u64)]) -> ScalingRulesSpec {
    ScalingRulesSpec {
        stabilization_window: Some(secs(0)),
        select_policy: Some(select),
        policies: Some(list.iter().map(|&(kind, value, p)| Policy { kind, value, period: secs(p) }).collect()),
        ..Default::default()
    }
}

#[test]
fn default_down_stabilization_keeps_the_highest_recent_recommendation() {
    let r = behavior(None, None);
    let state = State {
        recommendations: vec![
            Recommendation { replicas: 9, at: ago(299) },
            Recommendation { replicas: 12, at: ago(300) }, // exactly the window: too old
        ],
        ..Default::default()
    };
    let d = decide(&r, target(10), &[value(0.3)], &state, now());
    assert_eq!(d.proposal, Some(6));
    let s = d.stabilization.unwrap();
    assert_eq!((s.lower, s.upper, s.stabilized), (6, 9, 9));
    assert_eq!(d.replicas, 9);
    // The unclamped proposal is recorded; the expired one is pruned.
    assert_eq!(
        d.state.recommendations,
        vec![Recommendation { replicas: 9, at: ago(299) }, Recommendation { replicas: 6, at: now() }]
    );
}

#[test]
fn up_stabilization_keeps_the_lowest_recent_recommendation() {
    let up = ScalingRulesSpec { stabilization_window: Some(secs(60)), ..Default::default() };
    let r = behavior(Some(up), None);
    let state = State { recommendations: vec![Recommendation { replicas: 11, at: ago(30) }], ..Default::default() };
    let d = decide(&r, target(10), &[value(1.5)], &state, now());
    assert_eq!((d.proposal, d.replicas), (Some(15), 11));
}

#[test]
fn default_up_policies_allow_four_pods_or_double() {
    let r = behavior(None, None);
    assert_eq!(replicas(&r, target(2), &[value(10.0)]), 6); // max(2 + 4, 2 x 2)
    assert_eq!(replicas(&r, target(10), &[value(10.0)]), 20); // max(14, 20)
}

#[test]
fn select_policy_picks_the_largest_or_smallest_change() {
    let list = [(PolicyKind::Pods, 2, 60), (PolicyKind::Percent, 50, 60)];
    let r = behavior(Some(policies(SelectPolicy::Max, &list)), Some(policies(SelectPolicy::Max, &list)));
    assert_eq!(replicas(&r, target(10), &[value(5.0)]), 15);
    assert_eq!(replicas(&r, target(10), &[value(0.01)]), 5);
    let r = behavior(Some(policies(SelectPolicy::Min, &list)), Some(policies(SelectPolicy::Min, &list)));
    assert_eq!(replicas(&r, target(10), &[value(5.0)]), 12);
    assert_eq!(replicas(&r, target(10), &[value(0.01)]), 8);
    let r = behavior(Some(policies(SelectPolicy::Disabled, &list)), Some(policies(SelectPolicy::Disabled, &list)));
    assert_eq!(replicas(&r, target(10), &[value(5.0)]), 10);
    assert_eq!(replicas(&r, target(10), &[value(0.01)]), 10);
}

#[test]
fn percent_policies_use_exact_integer_rounding() {
    let up = policies(SelectPolicy::Max, &[(PolicyKind::Percent, 10, 60)]);
    let down = policies(SelectPolicy::Max, &[(PolicyKind::Percent, 10, 60)]);
    let r = behavior(Some(up), Some(down));
    // ceil(7 x 1.1) = ceil(7.7) = 8; floor(7 x 0.9) = 6.
    assert_eq!(replicas(&r, target(7), &[value(5.0)]), 8);
    assert_eq!(replicas(&r, target(7), &[value(0.01)]), 6);
    // ceil(10 x 1.1) is exactly 11 (floats say 11.000000000000002 -> 12).
    assert_eq!(replicas(&r, target(10), &[value(5.0)]), 11);
}

#[test]
fn policy_periods_count_this_autoscalers_recent_scale_events() {
    let up = policies(SelectPolicy::Max, &[(PolicyKind::Pods, 4, 60)]);
    let r = behavior(Some(up), None);
    // 3 were added 30s ago: the period started at 7, so 11 is the most allowed now.
    let state = State { scale_events: vec![ScaleEvent::new(7, 10, ago(30))], ..Default::default() };
    let d = decide(&r, target(10), &[value(5.0)], &state, now());
    assert_eq!((d.replicas, d.limit), (11, Limit::UpscaleCapping));
    assert_eq!(d.state.scale_events.len(), 2);
    assert_eq!(d.state.scale_events[1], ScaleEvent::new(10, 11, now()));
    // Older than the period: the whole budget is back.
    let state = State { scale_events: vec![ScaleEvent::new(7, 10, ago(60))], ..Default::default() };
    let d = decide(&r, target(10), &[value(5.0)], &state, now());
    assert_eq!(d.replicas, 14);
    assert_eq!(d.state.scale_events, vec![ScaleEvent::new(10, 14, now())]);
    // Budget used up: the limit never goes below spec.
    let state = State { scale_events: vec![ScaleEvent::new(2, 10, ago(10))], ..Default::default() };
    assert_eq!(replicas_with(&r, target(10), &[value(5.0)], &state), 10);
}

fn replicas_with(r: &watermarkd_engine::Rule, t: Target, readings: &[Reading], state: &State) -> u32 {
    decide(r, t, readings, state, now()).replicas
}

#[test]
fn behavior_has_no_forbidden_windows() {
    let r = behavior(None, Some(policies(SelectPolicy::Max, &[(PolicyKind::Percent, 100, 15)])));
    let state = State { last_scale_time: Some(ago(1)), ..Default::default() };
    assert_eq!(replicas_with(&r, target(10), &[value(0.01)], &state), 1);
}

// ---- §4 convergence ---------------------------------------------------------------------

#[test]
fn convergence_steps_towards_the_chosen_watermark_when_the_result_stays_inside() {
    let high = rule(|s| {
        s.converge_towards_watermark = Some(ConvergeTowards::High);
        s.upscale_delay_above_watermark = Some(secs(600));
        s.downscale_delay_below_watermark = Some(secs(600));
    });
    // 10 x 0.8 / 1 = 8 <= 9: step down to 9, delays do not apply.
    let d = decide(&high, target(10), &[value(0.8)], &State::default(), now());
    assert!(d.converging);
    assert_eq!((d.replicas, d.action), (9, Action::ScaleDown));
    // 10 x 0.95 = 9.5 > 9: hold.
    assert_eq!(replicas(&high, target(10), &[value(0.95)]), 10);

    let low = rule(|s| s.converge_towards_watermark = Some(ConvergeTowards::Low));
    // 10 x 0.6 / 0.5 = 12 >= 11: step up to 11.
    assert_eq!(replicas(&low, target(10), &[value(0.6)]), 11);
    // 10 x 0.52 / 0.5 = 10.4 < 11: hold.
    assert_eq!(replicas(&low, target(10), &[value(0.52)]), 10);
}

#[test]
fn convergence_respects_forbidden_windows() {
    let r = rule(|s| {
        s.converge_towards_watermark = Some(ConvergeTowards::High);
        s.downscale_forbidden_window = Some(secs(300));
    });
    let state = State { last_scale_time: Some(ago(10)), ..Default::default() };
    assert_eq!(replicas_with(&r, target(10), &[value(0.8)], &state), 10);
}

// ---- §5 guards ---------------------------------------------------------------------------

#[test]
fn a_paused_workload_is_left_alone() {
    let r = rule(|s| s.min_replicas = Some(2));
    let state = State { above_since: Some(ago(5)), ..Default::default() };
    let d = decide(&r, target(0), &[value(5.0)], &state, now());
    assert_eq!((d.guard, d.replicas, d.write), (Some(Guard::Paused), 0, false));
    assert_eq!(d.limit, Limit::Paused, "the guard that decided, not within_range");
    assert_eq!(d.state, state);
}

#[test]
fn out_of_bounds_spec_goes_to_the_bound_only_with_data() {
    let r = rule(|s| {
        s.min_replicas = Some(3);
        s.max_replicas = Some(9);
        s.upscale_forbidden_window = Some(secs(600));
        s.downscale_forbidden_window = Some(secs(600));
    });
    let recent = State { last_scale_time: Some(ago(1)), ..Default::default() };
    let d = decide(&r, target(15), &[value(0.7)], &recent, now());
    assert_eq!((d.guard, d.replicas, d.action), (Some(Guard::AboveMax), 9, Action::ScaleDown));
    assert_eq!(d.limit, Limit::AboveMax);
    let d = decide(&r, target(1), &[value(0.7)], &recent, now());
    assert_eq!((d.guard, d.replicas, d.action), (Some(Guard::BelowMin), 3, Action::ScaleUp));
    assert_eq!(d.limit, Limit::BelowMin);
    let d = decide(&r, target(15), &[unavailable("down")], &recent, now());
    assert_eq!((d.replicas, d.action, d.limit), (15, Action::Hold, Limit::NoData));
    let d = decide(&r, target(1), &[unavailable("down")], &recent, now());
    assert_eq!((d.replicas, d.action), (1, Action::Hold));
}

#[test]
fn too_few_available_replicas_hold() {
    let r = rule(|s| s.min_available_replica_percentage = Some(50));
    let d = decide(&r, target_ready(10, 4), &[value(5.0)], &State::default(), now());
    assert_eq!((d.guard, d.action, d.limit), (Some(Guard::MinAvailable), Action::Hold, Limit::MinAvailable));
    assert_eq!(decide(&r, target_ready(10, 5), &[value(5.0)], &State::default(), now()).action, Action::ScaleUp);
}

#[test]
fn no_ready_replica_holds_instead_of_scaling_to_one() {
    let r = rule(|_| {});
    let d = decide(&r, target_ready(10, 0), &[value(0.1)], &State::default(), now());
    assert_eq!((d.guard, d.replicas, d.limit), (Some(Guard::NoReadyReplicas), 10, Limit::NoReadyReplicas));
}

// ---- §6 output ---------------------------------------------------------------------------

#[test]
fn dry_run_advances_the_state_but_writes_nothing() {
    let r = rule(|s| s.dry_run = Some(true));
    let d = decide(&r, target(10), &[value(2.0)], &State::default(), now());
    assert_eq!((d.action, d.replicas, d.write, d.dry_run), (Action::ScaleUp, 20, false, true));
    assert_eq!(d.state.last_scale_time, Some(now()));
    assert!(d.reason.contains("dry-run"), "{}", d.reason);
    let live = rule(|_| {});
    let d = decide(&live, target(10), &[value(2.0)], &State::default(), now());
    assert!(d.write);
    assert_eq!(d.state_if_not_written.last_scale_time, None);
}

#[test]
fn the_reason_reads_like_a_sentence() {
    let r = rule(|s| {
        s.tolerance = Some(dec("0.01"));
        s.metrics = vec![metric("latency", "0.15", "0.4")];
        s.scale_up_limit_factor = Some(dec("10"));
    });
    let d = decide(&r, target(10), &[value(0.52)], &State::default(), now());
    assert_eq!(
        d.reason,
        "latency above high watermark: 0.52 > 0.4 (tolerance 1%); proposing 13, limited to 11 by scale_up_limit_factor 10%: scaling 10 -> 11"
    );
}

#[test]
fn with_unready_replicas_no_scale_down_stops_above_the_ready_count() {
    let r = limited("50", "50");
    // 10 spec, 8 ready: 9 would remove only an unready pod's worth but rests on partial
    // readiness; hold. Going to 8 (the ready count) or below is allowed.
    let d = decide(&r, target_ready(10, 8), &[Reading::replicas(9)], &State::default(), now());
    assert_eq!(d.proposal, Some(9));
    assert_eq!((d.replicas, d.limit), (10, Limit::NotReady));
    let d = decide(&r, target_ready(10, 8), &[value(0.3)], &State::default(), now());
    // floor(8 x 0.3 / 0.5) = 4, capped by the 50% limit to 5: at or below ready, so it goes.
    assert_eq!((d.proposal, d.replicas, d.action), (Some(4), 5, Action::ScaleDown));
}

// ---- §6 scale to zero ----------------------------------------------------------------------

/// A queue-depth rule that scales to zero: watermarks 10..100 per replica, activation 5, idle
/// delay 120 s, downscale window 60 s, tolerate_zero on (an empty queue reads 0).
fn zero_rule() -> watermarkd_engine::Rule {
    rule(|s| {
        s.min_replicas = Some(0);
        s.metrics = vec![MetricSpec { activation: Some(dec("5")), ..metric("queue", "10", "100") }];
        s.scale_to_zero_delay = Some(secs(120));
        s.downscale_forbidden_window = Some(secs(60));
        s.upscale_forbidden_window = Some(secs(60));
        s.tolerate_zero = Some(true);
    })
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_unix_millis(now().unix_millis() + seconds * 1000)
}

fn value_at(v: f64, seconds: i64) -> Reading {
    Reading::Value { value: v, at: at(seconds) }
}

#[test]
fn one_idle_replica_goes_to_zero_after_the_delay_and_the_window() {
    let r = zero_rule();
    let scaled = State { last_scale_time: Some(ago(30)), ..Default::default() };
    // Idle from now on: the delay starts; the window (60 s) has 30 s left.
    let d = decide(&r, target(1), &[value(0.0)], &scaled, now());
    assert_eq!((d.action, d.replicas), (Action::Hold, 1), "{}", d.reason);
    assert_eq!(d.state.zero.as_ref().and_then(|z| z.idle_since), Some(now()));
    assert_eq!(d.timing.downscale_delay_seconds_left, 120.0);
    assert!(d.reason.ends_with("every metric at or below its activation for 0s: to zero in 120s"), "{}", d.reason);

    // 119 s later still idle: one second to go.
    let d = decide(&r, target(1), &[value_at(3.0, 119)], &d.state, at(119));
    assert_eq!((d.action, d.replicas), (Action::Hold, 1), "{}", d.reason);
    assert_eq!(d.timing.downscale_delay_seconds_left, 1.0);

    // At 120 s: to zero, marked as this rule's.
    let d = decide(&r, target(1), &[value_at(3.0, 120)], &d.state, at(120));
    assert_eq!((d.action, d.replicas, d.write), (Action::ScaleDown, 0, true), "{}", d.reason);
    assert_eq!(d.limit, Limit::ScaledToZero);
    assert_eq!(d.reason, "queue 3 <= activation 5 for 120s (scale_to_zero_delay 120s): scaling 1 -> 0");
    assert_eq!(d.state.zero.as_ref().and_then(|z| z.scaled_to_zero_at), Some(at(120)));
    assert_eq!(d.state.last_scale_time, Some(at(120)));
    assert_eq!(d.state_if_not_written.zero.as_ref().and_then(|z| z.scaled_to_zero_at), None, "not written: not ours");
}

#[test]
fn only_from_one_replica_and_never_on_missing_data_or_an_unknown_zero() {
    let r = zero_rule();
    let idle_long = State {
        zero: Some(Box::new(ZeroState { idle_since: Some(ago(600)), scaled_to_zero_at: None })),
        ..Default::default()
    };
    // Three replicas idle: the watermark rule takes them down to one first.
    let d = decide(&r, target(3), &[value(0.0)], &idle_long, now());
    assert_eq!((d.action, d.replicas), (Action::ScaleDown, 1), "{}", d.reason);
    // Missing data at one replica: no scale, and the idle clock stops.
    let d = decide(&r, target(1), &[unavailable("timeout")], &idle_long, now());
    assert_eq!((d.action, d.replicas), (Action::Hold, 1), "{}", d.reason);
    assert_eq!(d.state.zero, None);
    // A 0 that could be a broken pipeline is not idle unless tolerate_zero says it is.
    let strict = rule(|s| {
        s.min_replicas = Some(0);
        s.metrics = vec![MetricSpec { activation: Some(dec("5")), ..metric("queue", "10", "100") }];
    });
    let d = decide(&strict, target(1), &[value(0.0)], &idle_long, now());
    assert_eq!((d.action, d.replicas), (Action::Hold, 1), "{}", d.reason);
    let d = decide(&strict, target(1), &[value(2.0)], &idle_long, now());
    assert_eq!((d.action, d.replicas), (Action::ScaleDown, 0), "{}", d.reason);
    // An activation above the high watermark never takes a loaded workload to zero.
    let odd = rule(|s| {
        s.min_replicas = Some(0);
        s.metrics = vec![MetricSpec { activation: Some(dec("500")), ..metric("queue", "10", "100") }];
        s.upscale_forbidden_window = Some(secs(600));
    });
    let recent = State { last_scale_time: Some(ago(1)), ..idle_long.clone() };
    let d = decide(&odd, target(1), &[value(300.0)], &recent, now());
    assert_eq!((d.action, d.replicas), (Action::Hold, 1), "{}", d.reason);
}

#[test]
fn at_zero_only_activity_above_the_activation_wakes_it_and_a_paused_workload_stays_paused() {
    let r = zero_rule();
    let ours = State {
        last_scale_time: Some(ago(10)),
        zero: Some(Box::new(ZeroState { idle_since: None, scaled_to_zero_at: Some(ago(10)) })),
        ..Default::default()
    };
    let zero = Target { spec_replicas: 0, status_replicas: Some(0), ready_replicas: Some(0) };
    for reading in [value(5.0), value(0.0), unavailable("no data")] {
        let d = decide(&r, zero, std::slice::from_ref(&reading), &ours, now());
        assert_eq!((d.guard, d.action, d.replicas), (Some(Guard::AtZero), Action::Hold, 0), "{}", d.reason);
        assert_eq!(d.state, ours, "{reading:?}");
        assert!(d.reason.ends_with(": staying at zero"), "{}", d.reason);
    }
    // Above the activation: up to one at once, the upscale window notwithstanding.
    let d = decide(&r, zero, &[value(5.5)], &ours, now());
    assert_eq!((d.action, d.replicas, d.write), (Action::ScaleUp, 1, true), "{}", d.reason);
    assert_eq!(d.reason, "queue 5.5 > activation 5: waking from zero to 1 replica");
    assert_eq!((d.state.zero.clone(), d.state.last_scale_time), (None, Some(now())));
    assert_eq!(d.state_if_not_written, ours, "a failed write leaves it ours, at zero");

    // Zero without the mark: a person paused it.
    let d = decide(&r, zero, &[value(500.0)], &State::default(), now());
    assert_eq!((d.guard, d.replicas, d.write), (Some(Guard::Paused), 0, false));

    // A rule that no longer scales to zero brings its own zero back to the minimum.
    let plain = rule(|s| s.min_replicas = Some(2));
    let d = decide(&plain, zero, &[value(0.7)], &ours, now());
    assert_eq!((d.guard, d.replicas, d.write), (Some(Guard::BelowMin), 2, true), "{}", d.reason);
    let running = decide(&plain, target(2), &[value(0.7)], &d.state, now());
    assert_eq!(running.state.zero, None, "nothing of scale to zero stays in a running rule's state");
}

#[test]
fn no_flapping_at_the_activation_edge() {
    // The value hovers around the activation every 15 s for an hour: once woken it never
    // accumulates the idle delay, so it goes to zero at most once and never comes back down.
    let r = zero_rule();
    let mut state = State {
        zero: Some(Box::new(ZeroState { idle_since: None, scaled_to_zero_at: Some(ago(1)) })),
        ..Default::default()
    };
    let mut spec = 0;
    let mut moves = Vec::new();
    for step in 0..240 {
        let t = step * 15;
        let v = if step % 2 == 0 { 5.1 } else { 4.9 };
        let d = decide(&r, target(spec), &[value_at(v, t)], &state, at(t));
        if d.replicas != spec {
            moves.push((t, spec, d.replicas));
        }
        spec = d.replicas;
        state = d.state;
    }
    assert_eq!(moves, [(0, 0, 1)], "woken once, then held at one");
}

#[test]
fn bounds_for_one_decision_raise_the_floor_and_say_what_raised_it() {
    let r = rule(|s| {
        s.min_replicas = Some(2);
        s.max_replicas = Some(20);
        s.scale_down_limit_factor = Some(dec("20"));
    });
    let office =
        watermarkd_engine::Bounds { min: 10, max: 20, min_by: Some("schedule \"office\" (open)".into()), max_by: None };
    let within = r.within(office);
    // Below the floor: straight to it, even though the metric asks for nothing.
    let d = decide(&within, target(4), &[value(0.5)], &State::default(), now());
    assert_eq!(d.replicas, 10);
    assert!(
        d.reason.ends_with("spec 4 is below min_replicas (raised by schedule \"office\" (open)) 10: scaling to 10"),
        "{}",
        d.reason
    );
    // Once the floor is gone, the rule's own limits bring the replicas down, not one drop.
    let after = decide(&r, target(10), &[value(0.01)], &State::default(), now());
    assert_eq!(after.replicas, 8, "{}", after.reason);
    // A lowered ceiling is named too, and never sits under the floor.
    let capped = r.within(watermarkd_engine::Bounds { min: 3, max: 1, min_by: None, max_by: Some("night".into()) });
    assert_eq!((capped.min_running_replicas(), capped.max_replicas()), (3, 3));
}

#[test]
fn a_floor_above_zero_wakes_a_workload_this_rule_sent_to_zero() {
    let r = rule(|s| {
        s.min_replicas = Some(0);
        s.max_replicas = Some(20);
        s.metrics = vec![MetricSpec { activation: Some(dec("0")), ..metric("m", "1", "2") }];
    });
    assert!(r.scale_to_zero().is_some());
    let floor = r.within(watermarkd_engine::Bounds { min: 5, max: 20, min_by: Some("schedule".into()), max_by: None });
    assert!(floor.scale_to_zero().is_none(), "no going to zero while a floor holds");
    let no_floor = r.within(watermarkd_engine::Bounds { min: 0, max: 20, min_by: None, max_by: None });
    assert!(no_floor.scale_to_zero().is_some());
}

#[test]
fn a_declared_fallback_goes_to_its_count_when_no_metric_is_usable_and_only_up_unless_told() {
    let r = rule(|s| s.max_replicas = Some(20));
    let fallback = |replicas, scale_down| watermarkd_engine::Fallback {
        replicas,
        scale_down,
        because: "no usable metric value for 5m".into(),
    };
    let missing = [unavailable("timeout")];
    let up = decide(&r.falling_back(fallback(8, false)), target(4), &missing, &State::default(), now());
    assert_eq!((up.replicas, up.action, up.write), (8, Action::ScaleUp, true));
    assert_eq!(
        up.reason,
        "m unavailable (timeout); no metric data (no usable metric value for 5m): falling back to 8 replicas"
    );
    let kept = decide(&r.falling_back(fallback(8, false)), target(12), &missing, &State::default(), now());
    assert_eq!((kept.replicas, kept.action), (12, Action::Hold), "missing data does not scale down: {}", kept.reason);
    let down = decide(&r.falling_back(fallback(8, true)), target(12), &missing, &State::default(), now());
    assert_eq!((down.replicas, down.action), (8, Action::ScaleDown), "unless the operator asked for it");
    // Without a fallback, or with any usable metric, nothing changes.
    assert_eq!(decide(&r, target(4), &missing, &State::default(), now()).replicas, 4);
    let with_data = decide(&r.falling_back(fallback(8, false)), target(4), &[value(0.7)], &State::default(), now());
    assert_eq!(with_data.replicas, 4, "{}", with_data.reason);
}
