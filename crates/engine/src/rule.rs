//! Autoscaler rules: what a person configured, checked once so that a decision never meets an
//! impossible rule. Defaults live here, in one place, for both the rules file and CRD mode.

use std::fmt;
use std::time::Duration;

use crate::decision::Limit;
use crate::number::{human, Decimal};
use crate::time::Timestamp;

/// How a metric value relates to the load on one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// The value already is per-replica load (average CPU %, p99 latency).
    Absolute,
    /// The value is a total over all replicas (requests/s at the load balancer): usage = value / ready.
    Average,
}

impl Algorithm {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "absolute" => Some(Algorithm::Absolute),
            "average" => Some(Algorithm::Average),
            _ => None,
        }
    }
}

/// Which watermark the optional convergence steps towards while inside the band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvergeTowards {
    High,
    Low,
}

impl ConvergeTowards {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "high" => Some(ConvergeTowards::High),
            "low" => Some(ConvergeTowards::Low),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectPolicy {
    /// Allow the largest change any policy allows (the default).
    Max,
    /// Allow the smallest change any policy allows.
    Min,
    /// Never scale in this direction.
    Disabled,
}

impl SelectPolicy {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "max" => Some(SelectPolicy::Max),
            "min" => Some(SelectPolicy::Min),
            "disabled" => Some(SelectPolicy::Disabled),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Pods,
    Percent,
}

impl PolicyKind {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "pods" => Some(PolicyKind::Pods),
            "percent" => Some(PolicyKind::Percent),
            _ => None,
        }
    }
}

/// One HPA scaling policy: at most `value` pods or percent of change per `period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Policy {
    pub kind: PolicyKind,
    pub value: u32,
    #[serde(with = "crate::serde_secs")]
    pub period: Duration,
}

/// One direction of a `behavior` block as configured; `None` means the HPA default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScalingRulesSpec {
    /// This direction's tolerance (Kubernetes 1.33+ HPA); unset: the rule's own.
    pub tolerance: Option<Decimal>,
    pub stabilization_window: Option<Duration>,
    pub select_policy: Option<SelectPolicy>,
    pub policies: Option<Vec<Policy>>,
}

/// One direction of a `behavior` block with defaults applied.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ScalingRules {
    #[serde(with = "crate::serde_secs")]
    pub stabilization_window: Duration,
    pub select_policy: SelectPolicy,
    pub policies: Vec<Policy>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct BehaviorSpec {
    pub scale_up: Option<ScalingRulesSpec>,
    pub scale_down: Option<ScalingRulesSpec>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Behavior {
    pub scale_up: ScalingRules,
    pub scale_down: ScalingRules,
}

/// The WPA velocity knobs with defaults applied.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WatermarkVelocity {
    /// Percent of `spec` that one upscale may add; 0 disables upscaling.
    pub scale_up_limit_factor: Decimal,
    /// Percent of `spec` that one downscale may remove; 0 disables downscaling.
    pub scale_down_limit_factor: Decimal,
    #[serde(with = "crate::serde_secs")]
    pub upscale_forbidden_window: Duration,
    #[serde(with = "crate::serde_secs")]
    pub downscale_forbidden_window: Duration,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Velocity {
    Watermark(WatermarkVelocity),
    Behavior(Behavior),
}

/// One metric as configured. A lone watermark serves as both bounds.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct MetricSpec {
    pub name: String,
    pub low_watermark: Option<Decimal>,
    pub high_watermark: Option<Decimal>,
    /// Readings older than this are unavailable. `None`: the backend alone judges staleness.
    pub max_age: Option<Duration>,
    /// With `min_replicas = 0`: a value above this wakes the workload from zero, and one at or
    /// below it lets it go to zero (docs/engine.md §5b).
    pub activation: Option<Decimal>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MetricRule {
    pub name: String,
    pub low_watermark: Decimal,
    pub high_watermark: Decimal,
    #[serde(with = "crate::serde_secs::option")]
    pub max_age: Option<Duration>,
}

/// Everything a person may configure, each field optional where docs/engine.md gives a default.
/// `Rule::new` turns it into a `Rule` or lists every problem.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleSpec {
    pub min_replicas: Option<u32>,
    pub max_replicas: Option<u32>,
    pub algorithm: Option<Algorithm>,
    pub tolerance: Option<Decimal>,
    /// The tolerance above the high watermark only; unset: `tolerance`.
    pub upscale_tolerance: Option<Decimal>,
    /// The tolerance below the low watermark only; unset: `tolerance`.
    pub downscale_tolerance: Option<Decimal>,
    pub metrics: Vec<MetricSpec>,
    pub scale_up_limit_factor: Option<Decimal>,
    pub scale_down_limit_factor: Option<Decimal>,
    pub upscale_forbidden_window: Option<Duration>,
    pub downscale_forbidden_window: Option<Duration>,
    pub upscale_delay_above_watermark: Option<Duration>,
    pub downscale_delay_below_watermark: Option<Duration>,
    pub behavior: Option<BehaviorSpec>,
    pub replica_modulo: Option<u32>,
    pub converge_towards_watermark: Option<ConvergeTowards>,
    pub tolerate_zero: Option<bool>,
    pub min_available_replica_percentage: Option<u32>,
    pub dry_run: Option<bool>,
    /// With `min_replicas = 0`: how long every metric must have stayed at or below its
    /// activation before one replica goes to zero.
    pub scale_to_zero_delay: Option<Duration>,
}

/// Scale to zero, on with `min_replicas = 0` (docs/engine.md §5b).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ScaleToZero {
    /// Per metric, in the rule's order: above it, the workload is active.
    pub activations: Vec<Decimal>,
    /// How long every metric must have been at or below its activation before 1 -> 0.
    #[serde(with = "crate::serde_secs")]
    pub delay: Duration,
}

/// A validated rule. Its fields can only be built through `Rule::new`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Rule {
    min_replicas: u32,
    max_replicas: u32,
    algorithm: Algorithm,
    /// Above iff usage > high x (1 + upscale_tolerance).
    upscale_tolerance: Decimal,
    /// Below iff usage < low x (1 - downscale_tolerance).
    downscale_tolerance: Decimal,
    metrics: Vec<MetricRule>,
    velocity: Velocity,
    #[serde(with = "crate::serde_secs")]
    upscale_delay_above_watermark: Duration,
    #[serde(with = "crate::serde_secs")]
    downscale_delay_below_watermark: Duration,
    replica_modulo: u32,
    converge_towards_watermark: Option<ConvergeTowards>,
    tolerate_zero: bool,
    min_available_replica_percentage: u32,
    dry_run: bool,
    /// Boxed: most rules never go to zero, and a rule lives as long as its autoscaler.
    #[serde(skip_serializing_if = "Option::is_none")]
    scale_to_zero: Option<Box<ScaleToZero>>,
    /// What set `min_replicas` and `max_replicas` when they are not the rule's own
    /// ([`Rule::within`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    bounds_by: Option<Box<BoundsBy>>,
    /// Where to go when no metric has a usable value, instead of holding
    /// ([`Rule::falling_back`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<Box<Fallback>>,
}

/// One problem with a rule, naming the field as the rules file spells it
/// (`metric[1].low_watermark`, `behavior.scale_up.policies[0].period`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RuleError {
    pub field: String,
    /// Says what is wrong in the rules file's words, other fields included.
    pub message: String,
    /// When the problem is between this field and another: the same problem as data, so that
    /// a caller whose source names fields otherwise (a WPA's `maxReplicas`) can say it in
    /// that source's words.
    pub relation: Option<Relation>,
}

/// How a problem ties its field to another field of the rule, named by its engine path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Relation {
    /// The field's `value` exceeds `other`'s value `bound`, which it must not.
    Exceeds { value: String, other: String, bound: String },
    /// Neither the field nor `other` is given, and one of them must be.
    OneOfRequired { other: String },
}

impl RuleError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        RuleError { field: field.into(), message: message.into(), relation: None }
    }

    /// `field`'s `value` must not exceed `other`'s `bound`.
    fn exceeds(field: impl Into<String>, value: impl fmt::Display, other: &str, bound: impl fmt::Display) -> Self {
        let (value, bound) = (value.to_string(), bound.to_string());
        let other_key = other.rsplit('.').next().unwrap_or(other);
        RuleError {
            field: field.into(),
            message: format!("({value}) must not exceed {other_key} ({bound})"),
            relation: Some(Relation::Exceeds { value, other: other.to_string(), bound }),
        }
    }
}

/// A rule that says nothing keeps one replica running, as the HPA does.
pub const DEFAULT_MIN_REPLICAS: u32 = 1;
pub const DEFAULT_TOLERANCE_PERCENT: i128 = 10;
pub const DEFAULT_SCALE_UP_LIMIT_FACTOR: i64 = 50;
pub const DEFAULT_SCALE_DOWN_LIMIT_FACTOR: i64 = 20;
pub const DEFAULT_UPSCALE_FORBIDDEN_WINDOW: Duration = Duration::from_secs(60);
pub const DEFAULT_DOWNSCALE_FORBIDDEN_WINDOW: Duration = Duration::from_secs(300);
/// KEP-853 limits.
pub const MAX_STABILIZATION_WINDOW: Duration = Duration::from_secs(3600);
pub const MAX_POLICY_PERIOD: Duration = Duration::from_secs(1800);
/// How long a workload must have been idle at one replica before it goes to zero, by default.
pub const DEFAULT_SCALE_TO_ZERO_DELAY: Duration = Duration::from_secs(300);

fn check_tolerance(field: &str, tolerance: &Decimal, errors: &mut Vec<RuleError>) {
    if tolerance.is_negative() || tolerance >= &Decimal::from_int(1) {
        errors.push(RuleError::new(
            field,
            format!("({tolerance}) must be a fraction from 0 (inclusive) to 1 (exclusive), e.g. 0.1 for 10%"),
        ));
    }
}

/// One direction's tolerance: the WPA-style knob or the `behavior` field (not both), else the
/// rule's `tolerance`, as the HPA falls back to the cluster-wide one.
fn directional_tolerance(
    (knob, knob_value): (&str, Option<Decimal>),
    (behavior, behavior_value): (&str, Option<Decimal>),
    fallback: &Decimal,
    errors: &mut Vec<RuleError>,
) -> Decimal {
    match (knob_value, behavior_value) {
        (Some(_), Some(_)) => {
            errors.push(RuleError::new(knob, format!("cannot be combined with {behavior}: set one of them")));
            fallback.clone()
        }
        (Some(value), None) => {
            check_tolerance(knob, &value, errors);
            value
        }
        (None, Some(value)) => {
            check_tolerance(behavior, &value, errors);
            value
        }
        (None, None) => fallback.clone(),
    }
}

fn default_scale_up() -> ScalingRules {
    ScalingRules {
        stabilization_window: Duration::ZERO,
        select_policy: SelectPolicy::Max,
        policies: vec![
            Policy { kind: PolicyKind::Pods, value: 4, period: Duration::from_secs(15) },
            Policy { kind: PolicyKind::Percent, value: 100, period: Duration::from_secs(15) },
        ],
    }
}

fn default_scale_down() -> ScalingRules {
    ScalingRules {
        stabilization_window: Duration::from_secs(300),
        select_policy: SelectPolicy::Max,
        policies: vec![Policy { kind: PolicyKind::Percent, value: 100, period: Duration::from_secs(15) }],
    }
}

/// Bounds in force for one decision instead of the rule's own: a schedule's floor, say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
    /// What raised `min`, as decisions name it (`schedule "office" (open)`); `None`: the rule.
    pub min_by: Option<String>,
    /// What lowered `max`; `None`: the rule.
    pub max_by: Option<String>,
}

/// Where a decision goes when no metric has a usable value, instead of holding: the operator's
/// declared fallback, in force once the data has been missing long enough.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Fallback {
    pub replicas: u32,
    /// Whether `replicas` may be below the current count. Without it a fallback only raises:
    /// missing data never scales down unless the operator asked for exactly that.
    pub scale_down: bool,
    /// Why, as decisions say it (`no usable metric value for 5m`).
    pub because: String,
}

/// What set a rule's bounds for one decision.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BoundsBy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_by: Option<String>,
}

impl Rule {
    /// This rule with `bounds` in place of its own `min_replicas` and `max_replicas`, for one
    /// decision. A floor above zero keeps the workload from going to zero while it holds (and
    /// wakes it if it is there); `max` is never below `min`.
    pub fn within(&self, bounds: Bounds) -> Rule {
        let mut rule = self.clone();
        rule.min_replicas = bounds.min;
        rule.max_replicas = bounds.max.max(bounds.min);
        if bounds.min > 0 {
            rule.scale_to_zero = None;
        }
        if bounds.min_by.is_some() || bounds.max_by.is_some() {
            rule.bounds_by = Some(Box::new(BoundsBy { min_by: bounds.min_by, max_by: bounds.max_by }));
        }
        rule
    }

    /// This rule with `fallback` in force for one decision.
    pub fn falling_back(&self, fallback: Fallback) -> Rule {
        let mut rule = self.clone();
        rule.fallback = Some(Box::new(fallback));
        rule
    }

    pub fn fallback(&self) -> Option<&Fallback> {
        self.fallback.as_deref()
    }

    /// What set the bounds of this decision, when not the rule itself.
    pub fn bounds_by(&self) -> Option<&BoundsBy> {
        self.bounds_by.as_deref()
    }

    /// `min_replicas`, as a guard's reason names it: with what raised it, if anything did.
    pub(crate) fn min_words(&self) -> String {
        match self.bounds_by().and_then(|b| b.min_by.as_deref()) {
            Some(by) => format!("min_replicas (raised by {by})"),
            None => "min_replicas".into(),
        }
    }

    /// `max_replicas`, as a guard's reason names it.
    pub(crate) fn max_words(&self) -> String {
        match self.bounds_by().and_then(|b| b.max_by.as_deref()) {
            Some(by) => format!("max_replicas (lowered by {by})"),
            None => "max_replicas".into(),
        }
    }

    /// What limited a proposal, named by the setting that did it and its value: the one
    /// vocabulary of the decision's reason (logs, Events, simulate) and of the status "why".
    pub fn limited_by(&self, limit: Limit) -> String {
        let bound = |by: Option<&str>, name: &str, value: u32, verb: &str| match by {
            Some(by) => format!("{name} {value} ({verb} by {by})"),
            None => format!("{name} {value}"),
        };
        let bounds = self.bounds_by();
        match (limit, self.velocity()) {
            (Limit::UpscaleCapping, Velocity::Watermark(w)) => {
                format!("scale_up_limit_factor {}%", human(w.scale_up_limit_factor.to_f64()))
            }
            (Limit::DownscaleCapping, Velocity::Watermark(w)) => {
                format!("scale_down_limit_factor {}%", human(w.scale_down_limit_factor.to_f64()))
            }
            (Limit::UpscaleCapping, Velocity::Behavior(_)) => "the scale-up policies".into(),
            (Limit::DownscaleCapping, Velocity::Behavior(_)) => "the scale-down policies".into(),
            (Limit::TooFew, _) => {
                bound(bounds.and_then(|b| b.min_by.as_deref()), "min_replicas", self.min_replicas(), "raised")
            }
            (Limit::TooMany, _) => {
                bound(bounds.and_then(|b| b.max_by.as_deref()), "max_replicas", self.max_replicas(), "lowered")
            }
            (Limit::NotReady, _) => "unready replicas (never below the ready count while some are not ready)".into(),
            // Guards decide before the velocity model; a reason never names them as a limit.
            (
                Limit::WithinRange
                | Limit::ScaledToZero
                | Limit::Paused
                | Limit::NoData
                | Limit::AboveMax
                | Limit::BelowMin
                | Limit::MinAvailable
                | Limit::NoReadyReplicas,
                _,
            ) => "the rule's bounds".into(),
        }
    }

    /// The tolerance that widened this direction's watermark, by the setting's name: `tolerance`
    /// when both directions share it.
    pub fn tolerance_words(&self, up: bool) -> String {
        let (this, name) = if up {
            (&self.upscale_tolerance, "upscale_tolerance")
        } else {
            (&self.downscale_tolerance, "downscale_tolerance")
        };
        let name = if self.upscale_tolerance == self.downscale_tolerance { "tolerance" } else { name };
        format!("{name} {}%", human(this.to_f64() * 100.0))
    }

    /// Applies the defaults and checks every invariant, returning all problems at once.
    pub fn new(spec: RuleSpec) -> Result<Rule, Vec<RuleError>> {
        let mut errors = Vec::new();
        let min_replicas = spec.min_replicas.unwrap_or(DEFAULT_MIN_REPLICAS);
        let scale_to_zero = check_scale_to_zero(&spec, min_replicas, &mut errors);
        let max_replicas = check_max_replicas(&spec, min_replicas, &mut errors);
        let (upscale_tolerance, downscale_tolerance) = check_tolerances(&spec, &mut errors);
        let metrics = check_metrics(&spec.metrics, &mut errors);
        let velocity = check_velocity(&spec, &mut errors);
        let replica_modulo = spec.replica_modulo.unwrap_or(1);
        if replica_modulo == 0 {
            errors.push(RuleError::new("replica_modulo", "must be at least 1"));
        }
        let min_available_replica_percentage = spec.min_available_replica_percentage.unwrap_or(0);
        if min_available_replica_percentage > 100 {
            errors.push(RuleError::new(
                "min_available_replica_percentage",
                format!("({min_available_replica_percentage}) must be from 0 to 100"),
            ));
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Rule {
            min_replicas,
            max_replicas,
            algorithm: spec.algorithm.unwrap_or(Algorithm::Absolute),
            upscale_tolerance,
            downscale_tolerance,
            metrics,
            velocity,
            upscale_delay_above_watermark: spec.upscale_delay_above_watermark.unwrap_or(Duration::ZERO),
            downscale_delay_below_watermark: spec.downscale_delay_below_watermark.unwrap_or(Duration::ZERO),
            replica_modulo,
            converge_towards_watermark: spec.converge_towards_watermark,
            tolerate_zero: spec.tolerate_zero.unwrap_or(false),
            min_available_replica_percentage,
            dry_run: spec.dry_run.unwrap_or(false),
            scale_to_zero,
            bounds_by: None,
            fallback: None,
        })
    }

    /// As configured: 0 when the rule scales to zero.
    pub fn min_replicas(&self) -> u32 {
        self.min_replicas
    }
    /// The fewest replicas the watermark formulas and velocity limits go to: a running workload
    /// goes to zero only by the scale-to-zero rule.
    pub fn min_running_replicas(&self) -> u32 {
        self.min_replicas.max(1)
    }
    /// Scale to zero, when `min_replicas` is 0.
    pub fn scale_to_zero(&self) -> Option<&ScaleToZero> {
        self.scale_to_zero.as_deref()
    }
    pub fn max_replicas(&self) -> u32 {
        self.max_replicas
    }
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// `metric`'s band under this rule's tolerances (see [`MetricRule::band`]).
    pub fn band(&self, metric: &MetricRule) -> (Decimal, Decimal) {
        metric.band(&self.downscale_tolerance, &self.upscale_tolerance)
    }
    /// The fraction above the high watermark that still counts as inside.
    pub fn upscale_tolerance(&self) -> &Decimal {
        &self.upscale_tolerance
    }
    /// The fraction below the low watermark that still counts as inside.
    pub fn downscale_tolerance(&self) -> &Decimal {
        &self.downscale_tolerance
    }
    pub fn metrics(&self) -> &[MetricRule] {
        &self.metrics
    }
    pub fn velocity(&self) -> &Velocity {
        &self.velocity
    }
    pub fn upscale_delay_above_watermark(&self) -> Duration {
        self.upscale_delay_above_watermark
    }
    pub fn downscale_delay_below_watermark(&self) -> Duration {
        self.downscale_delay_below_watermark
    }
    pub fn replica_modulo(&self) -> u32 {
        self.replica_modulo
    }
    pub fn converge_towards_watermark(&self) -> Option<ConvergeTowards> {
        self.converge_towards_watermark
    }
    pub fn tolerate_zero(&self) -> bool {
        self.tolerate_zero
    }
    pub fn min_available_replica_percentage(&self) -> u32 {
        self.min_available_replica_percentage
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// The same rule with dry-run forced on (a global dry-run switch).
    pub fn with_dry_run(mut self, dry_run: bool) -> Rule {
        self.dry_run = dry_run;
        self
    }

    /// How far back scale events matter: the longest behavior policy period.
    pub(crate) fn scale_event_horizon(&self) -> Duration {
        match &self.velocity {
            Velocity::Watermark(_) => Duration::ZERO,
            Velocity::Behavior(b) => {
                b.scale_up.policies.iter().chain(&b.scale_down.policies).map(|p| p.period).max().unwrap_or_default()
            }
        }
    }

    /// How far back recommendations matter: the longer stabilization window (zero without
    /// stabilization).
    pub fn recommendation_horizon(&self) -> Duration {
        match &self.velocity {
            Velocity::Watermark(_) => Duration::ZERO,
            Velocity::Behavior(b) => b.scale_up.stabilization_window.max(b.scale_down.stabilization_window),
        }
    }
}

impl MetricRule {
    /// The band after tolerance, `(low x (1 - down), high x (1 + up))`: a usage is below iff it
    /// is under the first, above iff it is over the second (both strict).
    pub fn band(&self, down: &Decimal, up: &Decimal) -> (Decimal, Decimal) {
        let one = Decimal::from_int(1);
        (self.low_watermark.mul(&one.sub(down)), self.high_watermark.mul(&one.add(up)))
    }

    /// Whether a value read at `at` may be used at `now`: the exact value, or why not (not a
    /// number, negative, older than `max_age`). The one staleness rule: decisions and
    /// `watermarkd query` both ask it.
    pub fn judge(&self, value: f64, at: Timestamp, now: Timestamp) -> Result<Decimal, String> {
        let Some(exact) = Decimal::from_f64(value) else {
            return Err(format!("value is {value}, not a number"));
        };
        if exact.is_negative() {
            return Err(format!("negative value {value} cannot be a load"));
        }
        if let Some(max_age) = self.max_age {
            let age = now.since(at);
            if age > max_age {
                return Err(format!(
                    "stale: the data point is {}s old, max_age is {}s",
                    age.as_secs(),
                    max_age.as_secs()
                ));
            }
        }
        Ok(exact)
    }
}

/// `max_replicas`: required, and not below `min_replicas`. When missing, the minimum stands in
/// so that the other checks still run and report their own problems.
fn check_max_replicas(spec: &RuleSpec, min_replicas: u32, errors: &mut Vec<RuleError>) -> u32 {
    let Some(max_replicas) = spec.max_replicas else {
        errors.push(RuleError::new("max_replicas", "is required"));
        return min_replicas;
    };
    if min_replicas > max_replicas {
        errors.push(RuleError::exceeds("min_replicas", min_replicas, "max_replicas", max_replicas));
    }
    max_replicas
}

/// `tolerance` and the two directions' own: `(upscale, downscale)`.
fn check_tolerances(spec: &RuleSpec, errors: &mut Vec<RuleError>) -> (Decimal, Decimal) {
    let tolerance = spec.tolerance.clone().unwrap_or(Decimal::from_parts(DEFAULT_TOLERANCE_PERCENT, -2));
    check_tolerance("tolerance", &tolerance, errors);
    let behavior_tolerance = |direction: fn(&BehaviorSpec) -> Option<&ScalingRulesSpec>| {
        spec.behavior.as_ref().and_then(direction).and_then(|rules| rules.tolerance.clone())
    };
    let upscale_tolerance = directional_tolerance(
        ("upscale_tolerance", spec.upscale_tolerance.clone()),
        ("behavior.scale_up.tolerance", behavior_tolerance(|b| b.scale_up.as_ref())),
        &tolerance,
        errors,
    );
    let downscale_tolerance = directional_tolerance(
        ("downscale_tolerance", spec.downscale_tolerance.clone()),
        ("behavior.scale_down.tolerance", behavior_tolerance(|b| b.scale_down.as_ref())),
        &tolerance,
        errors,
    );
    (upscale_tolerance, downscale_tolerance)
}

/// One or more metrics, each checked on its own.
fn check_metrics(specs: &[MetricSpec], errors: &mut Vec<RuleError>) -> Vec<MetricRule> {
    if specs.is_empty() {
        errors.push(RuleError::new("metric", "at least one metric is required"));
    }
    let mut metrics: Vec<MetricRule> =
        specs.iter().enumerate().filter_map(|(i, m)| check_metric(i, m, errors)).collect();
    // A filtered collect starts at four places; a rule lives as long as its autoscaler,
    // and 10,000 of them would keep 3.6 MB of spare room.
    metrics.shrink_to_fit();
    metrics
}

fn check_metric(index: usize, m: &MetricSpec, errors: &mut Vec<RuleError>) -> Option<MetricRule> {
    let field = |name: &str| format!("metric[{index}].{name}");
    let before = errors.len();
    if m.name.trim().is_empty() {
        errors.push(RuleError::new(field("name"), "must not be empty"));
    }
    let (low, high) = match (&m.low_watermark, &m.high_watermark) {
        (None, None) => {
            errors.push(RuleError {
                field: field("high_watermark"),
                message: "at least one of low_watermark and high_watermark is required".into(),
                relation: Some(Relation::OneOfRequired { other: field("low_watermark") }),
            });
            return None;
        }
        (Some(low), None) => (low.clone(), low.clone()),
        (None, Some(high)) => (high.clone(), high.clone()),
        (Some(low), Some(high)) => (low.clone(), high.clone()),
    };
    for (name, value) in [("low_watermark", &low), ("high_watermark", &high)] {
        if value.is_negative() || value.is_zero() {
            errors.push(RuleError::new(field(name), format!("({value}) must be greater than 0")));
        }
    }
    if low > high {
        errors.push(RuleError::exceeds(field("low_watermark"), &low, &field("high_watermark"), &high));
    }
    if m.max_age == Some(Duration::ZERO) {
        errors.push(RuleError::new(field("max_age"), "must be longer than 0s"));
    }
    (errors.len() == before).then(|| MetricRule {
        name: m.name.clone(),
        low_watermark: low,
        high_watermark: high,
        max_age: m.max_age,
    })
}

/// `min_replicas = 0` needs an activation on every metric; activations and the delay mean
/// nothing otherwise, and are refused rather than silently ignored.
fn check_scale_to_zero(spec: &RuleSpec, min_replicas: u32, errors: &mut Vec<RuleError>) -> Option<Box<ScaleToZero>> {
    let field = |i: usize| format!("metric[{i}].activation");
    if min_replicas > 0 {
        for (i, metric) in spec.metrics.iter().enumerate() {
            if metric.activation.is_some() {
                errors.push(RuleError::new(field(i), "only applies with min_replicas = 0 (scale to zero)"));
            }
        }
        if spec.scale_to_zero_delay.is_some() {
            errors.push(RuleError::new("scale_to_zero_delay", "only applies with min_replicas = 0 (scale to zero)"));
        }
        return None;
    }
    let mut activations = Vec::with_capacity(spec.metrics.len());
    for (i, metric) in spec.metrics.iter().enumerate() {
        match &metric.activation {
            Some(activation) if activation.is_negative() => {
                errors.push(RuleError::new(field(i), format!("({activation}) must not be negative")));
            }
            Some(activation) => activations.push(activation.clone()),
            None => errors.push(RuleError::new(
                field(i),
                "is required with min_replicas = 0: the value above which the workload wakes from zero",
            )),
        }
    }
    Some(Box::new(ScaleToZero { activations, delay: spec.scale_to_zero_delay.unwrap_or(DEFAULT_SCALE_TO_ZERO_DELAY) }))
}

/// Velocity: the WPA knobs (docs/engine.md §3) or a `behavior` block (§3b), never both.
fn check_velocity(spec: &RuleSpec, errors: &mut Vec<RuleError>) -> Velocity {
    let Some(behavior) = &spec.behavior else {
        return Velocity::Watermark(check_watermark_velocity(spec, errors));
    };
    let knobs = [
        ("scale_up_limit_factor", spec.scale_up_limit_factor.is_some()),
        ("scale_down_limit_factor", spec.scale_down_limit_factor.is_some()),
        ("upscale_forbidden_window", spec.upscale_forbidden_window.is_some()),
        ("downscale_forbidden_window", spec.downscale_forbidden_window.is_some()),
    ];
    for (knob, set) in knobs {
        if set {
            errors.push(RuleError::new(
                knob,
                "cannot be combined with a behavior block: use the behavior policies, or remove behavior",
            ));
        }
    }
    Velocity::Behavior(Behavior {
        scale_up: check_scaling_rules("behavior.scale_up", behavior.scale_up.as_ref(), default_scale_up(), errors),
        scale_down: check_scaling_rules(
            "behavior.scale_down",
            behavior.scale_down.as_ref(),
            default_scale_down(),
            errors,
        ),
    })
}

/// §3: the limit factors and forbidden windows, with their defaults.
fn check_watermark_velocity(spec: &RuleSpec, errors: &mut Vec<RuleError>) -> WatermarkVelocity {
    let up = spec.scale_up_limit_factor.clone().unwrap_or(Decimal::from_int(DEFAULT_SCALE_UP_LIMIT_FACTOR));
    if up.is_negative() {
        errors.push(RuleError::new("scale_up_limit_factor", format!("({up}) must not be negative")));
    }
    let down = spec.scale_down_limit_factor.clone().unwrap_or(Decimal::from_int(DEFAULT_SCALE_DOWN_LIMIT_FACTOR));
    if down.is_negative() || down >= Decimal::from_int(100) {
        errors.push(RuleError::new(
            "scale_down_limit_factor",
            format!("({down}) must be a percentage from 0 (inclusive) to 100 (exclusive)"),
        ));
    }
    WatermarkVelocity {
        scale_up_limit_factor: up,
        scale_down_limit_factor: down,
        upscale_forbidden_window: spec.upscale_forbidden_window.unwrap_or(DEFAULT_UPSCALE_FORBIDDEN_WINDOW),
        downscale_forbidden_window: spec.downscale_forbidden_window.unwrap_or(DEFAULT_DOWNSCALE_FORBIDDEN_WINDOW),
    }
}

fn check_scaling_rules(
    path: &str,
    spec: Option<&ScalingRulesSpec>,
    default: ScalingRules,
    errors: &mut Vec<RuleError>,
) -> ScalingRules {
    let Some(spec) = spec else { return default };
    let window = spec.stabilization_window.unwrap_or(default.stabilization_window);
    if window > MAX_STABILIZATION_WINDOW {
        errors.push(RuleError::new(
            format!("{path}.stabilization_window"),
            format!("({}s) must be at most 3600s", window.as_secs()),
        ));
    }
    let policies = spec.policies.clone().unwrap_or(default.policies);
    let select_policy = spec.select_policy.unwrap_or(SelectPolicy::Max);
    if policies.is_empty() && select_policy != SelectPolicy::Disabled {
        errors.push(RuleError::new(
            format!("{path}.policies"),
            "must list at least one policy (or set select_policy = \"disabled\")",
        ));
    }
    for (i, p) in policies.iter().enumerate() {
        if p.value == 0 {
            errors.push(RuleError::new(format!("{path}.policies[{i}].value"), "must be greater than 0"));
        }
        if p.period < Duration::from_secs(1) || p.period > MAX_POLICY_PERIOD {
            errors.push(RuleError::new(
                format!("{path}.policies[{i}].period"),
                format!("({}s) must be from 1s to 1800s", p.period.as_secs_f64()),
            ));
        }
    }
    ScalingRules { stabilization_window: window, select_policy, policies }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Absolute => "absolute",
            Algorithm::Average => "average",
        })
    }
}
