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

pub use decide::decide;
pub use decision::{Action, Decision, Guard, Limit, MetricOutcome, Position, Stabilization, Timing};
pub use history::{BUCKETS_PER_WINDOW, MAX_SCALE_EVENTS};
pub use input::{Reading, Recommendation, ScaleEvent, State, Target, ZeroState};
pub use number::{Decimal, ParseDecimalError};
pub use rule::{
    Algorithm, Behavior, BehaviorSpec, ConvergeTowards, MetricRule, MetricSpec, Policy, PolicyKind, Rule, RuleError,
    RuleSpec, ScaleToZero, ScalingRules, ScalingRulesSpec, SelectPolicy, Velocity, WatermarkVelocity,
    DEFAULT_SCALE_TO_ZERO_DELAY,
};
pub use time::Timestamp;
