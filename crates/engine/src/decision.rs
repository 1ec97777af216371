//! The full outcome of one evaluation: every intermediate result, so that a person (or a
//! dashboard) can see why the replica count is what it is.

use serde::{Deserialize, Serialize};

use crate::input::State;
use crate::time::Timestamp;

/// Where one metric stands relative to its band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    Above,
    Below,
    Inside,
    Unavailable,
}

/// The per-metric part of a decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricOutcome {
    pub name: String,
    /// The reading's value, when there was one.
    pub value: Option<f64>,
    /// Load per replica compared with the watermarks (`value` or `value / ready`).
    pub usage: Option<f64>,
    pub low_watermark: f64,
    pub high_watermark: f64,
    /// The band after tolerance: below iff `usage < band_low`, above iff `usage > band_high`.
    pub band_low: f64,
    pub band_high: f64,
    pub position: Position,
    /// What this metric alone asks for.
    pub proposal: Option<u32>,
    /// Time of the data point, and its age at `now` in seconds.
    pub data_time: Option<Timestamp>,
    pub age_seconds: Option<f64>,
    /// Why the metric did not count, or why a zero reading was held.
    pub note: Option<String>,
}

impl MetricOutcome {
    /// The value, when the decision could use it: a refused one (stale, negative, not a
    /// number) is not the metric's current value, and a dashboard or page must not show it as
    /// one.
    pub fn usable_value(&self) -> Option<f64> {
        self.value.filter(|v| v.is_finite() && self.position != Position::Unavailable)
    }
}

/// What bounded the proposal on its way to the normalized value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// Nothing: the proposal was usable as it was.
    WithinRange,
    /// The scale-up rate limit (limit factor or behavior policies).
    UpscaleCapping,
    /// The scale-down rate limit (limit factor or behavior policies).
    DownscaleCapping,
    /// `min_replicas` raised the proposal.
    TooFew,
    /// `max_replicas` lowered the proposal.
    TooMany,
    /// Scaling down was held because replicas are not ready and the floor is above ready.
    NotReady,
    /// Scale to zero set the count: to zero after the idle delay, or from zero on activation.
    ScaledToZero,
    /// A guard decided (§5), not the velocity model: which one.
    Paused,
    NoData,
    AboveMax,
    BelowMin,
    MinAvailable,
    NoReadyReplicas,
}

impl Limit {
    /// The limit a decision reports when `guard` decided it.
    pub fn of_guard(guard: Guard) -> Limit {
        match guard {
            Guard::Paused => Limit::Paused,
            Guard::AtZero => Limit::ScaledToZero,
            Guard::NoData => Limit::NoData,
            Guard::AboveMax => Limit::AboveMax,
            Guard::BelowMin => Limit::BelowMin,
            Guard::MinAvailable => Limit::MinAvailable,
            Guard::NoReadyReplicas => Limit::NoReadyReplicas,
        }
    }
}

/// `behavior` stabilization: the band of recent recommendations the current spec is held in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stabilization {
    /// Smallest recommendation in the scale-up window (the floor).
    pub lower: u32,
    /// Largest recommendation in the scale-down window (the ceiling).
    pub upper: u32,
    pub stabilized: u32,
}

/// Whether time-based rules allow a move now.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Timing {
    pub upscale_allowed: bool,
    pub downscale_allowed: bool,
    /// Seconds until the forbidden window after the last scale closes (0 when open).
    pub upscale_window_seconds_left: f64,
    pub downscale_window_seconds_left: f64,
    /// Seconds the above/below condition still has to hold (0 when satisfied or not configured).
    pub upscale_delay_seconds_left: f64,
    pub downscale_delay_seconds_left: f64,
}

/// A rule that took over before or instead of the metric formulas (docs/engine.md §2 and §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guard {
    /// `spec == 0`: a person paused the workload.
    Paused,
    /// `spec == 0`, and this rule scaled it there: it wakes when a metric crosses its activation.
    AtZero,
    /// No metric was available: hold.
    NoData,
    /// `spec > max_replicas`: go to max.
    AboveMax,
    /// `spec < min_replicas`: go to min.
    BelowMin,
    /// Fewer ready replicas than `min_available_replica_percentage`: hold.
    MinAvailable,
    /// No replica is ready: hold.
    NoReadyReplicas,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    ScaleUp,
    ScaleDown,
    Hold,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    pub now: Timestamp,
    pub spec_replicas: u32,
    /// The ready count the formulas used.
    pub ready_replicas: u32,
    pub metrics: Vec<MetricOutcome>,
    /// The combined proposal (max over metrics, modulo applied), before velocity limits.
    pub proposal: Option<u32>,
    /// The metric that set the proposal.
    pub proposal_metric: Option<String>,
    pub above_high_watermark: bool,
    pub below_low_watermark: bool,
    /// True when the move is a convergence step inside the band.
    pub converging: bool,
    pub stabilization: Option<Stabilization>,
    /// The highest and lowest counts the rate limits allow from `spec` now.
    pub upscale_limit: Option<u32>,
    pub downscale_limit: Option<u32>,
    /// The proposal after stabilization, rate limits and min/max.
    pub normalized: Option<u32>,
    pub limit: Limit,
    pub timing: Timing,
    pub guard: Option<Guard>,
    /// The replica count to run.
    pub replicas: u32,
    pub action: Action,
    /// Whether to write `replicas` to the target (false on hold and in dry-run).
    pub write: bool,
    pub dry_run: bool,
    /// One sentence a person can act on.
    pub reason: String,
    /// What set this decision's bounds, when not the rule itself (a schedule, a forecast).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds_by: Option<crate::rule::BoundsBy>,
    /// Why a declared fallback decided, when one did (no metric had a usable value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The state after this evaluation, as if a scale it decided had been written.
    #[serde(rename = "new_state")]
    pub state: State,
    /// The state to keep instead when the write failed: the scale did not happen.
    #[serde(skip)]
    pub state_if_not_written: State,
}
