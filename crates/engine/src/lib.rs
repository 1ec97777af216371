//! The watermark engine: one autoscaling decision as a pure function.
//!
//! `decide(rule, target, readings, state, now)` reads no clock, socket or file; the daemon,
//! the `decide` command and the simulator all drive it the same way. `docs/engine.md` at the
//! repository root is the specification this crate implements.

// Pure arithmetic on owned data: nothing here could need it, so no local allow may add it.
#![forbid(unsafe_code)]

mod decide;
mod decision;
mod history;
mod input;
mod number;
mod rule;
mod serde_secs;
mod time;
mod zero;

pub use decision::{Action, Decision, Guard, Limit, MetricOutcome, Position, Stabilization, Timing};
pub use history::{BUCKETS_PER_WINDOW, MAX_SCALE_EVENTS};
pub use input::{Reading, Recommendation, ScaleEvent, State, Target, ZeroState};
pub use number::{human, Decimal, ParseDecimalError};
pub use rule::{
    Algorithm, Behavior, BehaviorSpec, Bounds, BoundsBy, ConvergeTowards, Fallback, MetricRule, MetricSpec, Policy,
    PolicyKind, Relation, Rule, RuleError, RuleSpec, ScaleToZero, ScalingRules, ScalingRulesSpec, SelectPolicy,
    Velocity, WatermarkVelocity, DEFAULT_MIN_REPLICAS, DEFAULT_SCALE_TO_ZERO_DELAY, MAX_POLICY_PERIOD,
    MAX_STABILIZATION_WINDOW,
};
pub use time::Timestamp;

/// Decides the replica count for one evaluation. Pure: the same inputs give the same output.
///
/// `readings[i]` is the reading for `rule.metrics()[i]`; a missing entry counts as unavailable.
pub fn decide(rule: &Rule, target: Target, readings: &[Reading], state: &State, now: Timestamp) -> Decision {
    match rule.scale_to_zero() {
        Some(zero) => zero::decide(rule, zero, target, readings, state, now),
        None => {
            let mut decision = decide::decide_running(rule, target, readings, state, now);
            if target.spec_replicas > 0 {
                // Running under a rule that does not scale to zero: nothing of it is left.
                decision.state.zero = None;
                decision.state_if_not_written.zero = None;
            }
            decision
        }
    }
}
