//! Scale to zero (docs/engine.md §5b): a rule with `min_replicas = 0` runs the ordinary decision
//! with a floor of one replica, and around it decides the two moves to and from zero.
//!
//! - At one replica, when every metric has been at or below its activation threshold for
//!   `scale_to_zero_delay` without a break (a missing or unusable reading is a break) and the
//!   downscale forbidden window is over, and the ordinary decision holds: 1 -> 0.
//! - At zero, when this rule put it there: any metric above its activation wakes it, 0 -> 1.
//!   Unavailable data never wakes it and never counts as idle.
//! - At zero without that mark, a person paused the workload, and it is left alone (§5).
//!
//! The activation compares the metric's value as read (a queue depth, a request rate at the
//! load balancer), never divided by replicas: at zero there are none to divide by.

use std::time::Duration;

use crate::decide::{decide_running, record_scale};
use crate::decision::{Action, Decision, Guard, Limit};
use crate::input::{Reading, State, Target, ZeroState};
use crate::number::human;
use crate::rule::{Rule, ScaleToZero};
use crate::time::Timestamp;

/// Where one metric stands against its activation threshold.
enum Activity {
    /// Above it: the workload has work.
    Active(String),
    /// At or below it.
    Idle(String),
    /// Not known: no usable reading.
    Unknown(String),
}

/// §5b around §1 to §5: from zero, wake or stay; while running, the ordinary decision with the
/// idle clock carried, and at one replica the wait for (and the move to) zero.
pub(crate) fn decide(
    rule: &Rule,
    zero: &ScaleToZero,
    target: Target,
    readings: &[Reading],
    state: &State,
    now: Timestamp,
) -> Decision {
    let activity = activity(rule, zero, readings, now);
    if target.spec_replicas == 0 {
        return at_zero(rule, target, readings, state, now, &activity);
    }
    let mut decision = decide_running(rule, target, readings, state, now);
    let idle = !activity.is_empty() && activity.iter().all(|a| matches!(a, Activity::Idle(_)));
    let idle_since = match &state.zero {
        _ if !idle => None,
        Some(z) => z.idle_since.or(Some(now)),
        None => Some(now),
    };
    // Running again, whoever took it off zero: the mark is spent.
    let carried = ZeroState { idle_since, scaled_to_zero_at: None }.boxed();
    decision.state.zero.clone_from(&carried);
    decision.state_if_not_written.zero = carried;

    // Only from one replica, when the ordinary decision stays there and nothing is above its
    // band (an activation above the high watermark must not take a loaded workload to zero).
    let Some(since) = idle_since else { return decision };
    let stays_at_one = target.spec_replicas == 1
        && decision.action == Action::Hold
        && decision.guard.is_none()
        && !decision.above_high_watermark;
    if !stays_at_one {
        return decision;
    }
    let idle_for = now.since(since);
    let delay_left = zero.delay.saturating_sub(idle_for).as_secs_f64();
    let window_left = decision.timing.downscale_window_seconds_left.max(0.0);
    if delay_left > 0.0 || window_left > 0.0 {
        let left = delay_left.max(window_left);
        decision.timing.downscale_delay_seconds_left = decision.timing.downscale_delay_seconds_left.max(delay_left);
        decision.timing.downscale_allowed = false;
        decision.reason.push_str(&format!(
            "; every metric at or below its activation for {}s: to zero in {}s",
            human(idle_for.as_secs_f64()),
            human(left)
        ));
        return decision;
    }
    to_zero(rule, zero, decision, &activity, idle_for, now)
}

/// 1 -> 0, once the idle delay and the downscale window are over: the decision that held at one
/// replica becomes the scale to zero, and the state marks the zero as this rule's own.
fn to_zero(
    rule: &Rule,
    zero: &ScaleToZero,
    mut decision: Decision,
    activity: &[Activity],
    idle_for: Duration,
    now: Timestamp,
) -> Decision {
    let mut reason = format!(
        "{} for {}s (scale_to_zero_delay {}s): scaling 1 -> 0",
        summary(activity),
        human(idle_for.as_secs_f64()),
        zero.delay.as_secs()
    );
    if rule.dry_run() {
        reason.push_str("; dry-run: nothing written");
    }
    decision.reason = reason;
    decision.replicas = 0;
    decision.normalized = Some(0);
    decision.action = Action::ScaleDown;
    decision.write = !rule.dry_run();
    decision.limit = Limit::ScaledToZero;
    let mut next = decision.state_if_not_written.clone();
    record_scale(rule, &mut next, 1, 0, now);
    next.zero = ZeroState { idle_since: None, scaled_to_zero_at: Some(now) }.boxed();
    decision.state = next;
    decision
}

/// At zero: paused by a person (left alone), or put there by this rule (woken by activity).
fn at_zero(
    rule: &Rule,
    target: Target,
    readings: &[Reading],
    state: &State,
    now: Timestamp,
    activity: &[Activity],
) -> Decision {
    let Some(at) = state.zero.as_ref().and_then(|z| z.scaled_to_zero_at) else {
        return decide_running(rule, target, readings, state, now);
    };
    // The ordinary decision's view of the metrics, as if paused, and nothing else of it.
    let unmarked = State { zero: None, ..state.clone() };
    let mut decision = decide_running(rule, target, readings, &unmarked, now);
    decision.state = state.clone();
    decision.state_if_not_written = state.clone();
    decision.guard = Some(Guard::AtZero);
    decision.limit = Limit::ScaledToZero;
    let woken = activity.iter().find_map(|a| match a {
        Activity::Active(why) => Some(why.as_str()),
        _ => None,
    });
    let Some(woken) = woken else {
        decision.reason = format!(
            "at zero, where this rule put it {}s ago; {}: staying at zero",
            human(now.since(at).as_secs_f64()),
            summary(activity)
        );
        return decision;
    };
    let mut reason = format!("{woken}: waking from zero to 1 replica");
    if rule.dry_run() {
        reason.push_str("; dry-run: nothing written");
    }
    decision.reason = reason;
    decision.proposal = Some(1);
    decision.normalized = Some(1);
    decision.replicas = 1;
    decision.action = Action::ScaleUp;
    decision.write = !rule.dry_run();
    let mut next = State { zero: None, ..state.clone() };
    record_scale(rule, &mut next, 0, 1, now);
    decision.state = next;
    decision
}

/// Each metric against its activation, in the rule's order.
fn activity(rule: &Rule, zero: &ScaleToZero, readings: &[Reading], now: Timestamp) -> Vec<Activity> {
    rule.metrics()
        .iter()
        .zip(&zero.activations)
        .enumerate()
        .map(|(i, (metric, activation))| {
            let name = &metric.name;
            let (value, exact) = match readings.get(i) {
                None => return Activity::Unknown(format!("{name} has no reading")),
                Some(Reading::Unavailable { reason }) => {
                    return Activity::Unknown(format!("{name} unavailable ({reason})"))
                }
                Some(Reading::Replicas { replicas, .. }) => {
                    (f64::from(*replicas), crate::number::Decimal::from_int(i64::from(*replicas)))
                }
                Some(Reading::Value { value, at }) => match metric.judge(*value, *at, now) {
                    Ok(exact) => (*value, exact),
                    Err(why) => return Activity::Unknown(format!("{name} unavailable ({why})")),
                },
            };
            if exact > *activation {
                Activity::Active(format!("{name} {value} > activation {activation}"))
            } else if exact.is_zero() && !rule.tolerate_zero() {
                Activity::Unknown(format!("{name} reads exactly 0, which counts as idle only with tolerate_zero"))
            } else {
                Activity::Idle(format!("{name} {value} <= activation {activation}"))
            }
        })
        .collect()
}

/// Every metric's standing, in one clause.
fn summary(activity: &[Activity]) -> String {
    let parts: Vec<&str> = activity
        .iter()
        .map(|a| match a {
            Activity::Active(s) | Activity::Idle(s) | Activity::Unknown(s) => s.as_str(),
        })
        .collect();
    parts.join(", ")
}
