//! What one evaluation observes: the target's replicas, the metric readings and the state
//! carried over from earlier evaluations.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// The scale target as observed just before the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// Replicas the workload is asked to run (`spec.replicas`). Every decision compares to it.
    pub spec_replicas: u32,
    /// Replicas that exist (`status.replicas`), when known.
    #[serde(default)]
    pub status_replicas: Option<u32>,
    /// Replicas that are ready, when known; `spec_replicas` stands in when unknown.
    #[serde(default)]
    pub ready_replicas: Option<u32>,
}

impl Target {
    /// The replica count the formulas multiply by: ready (or spec when unknown), never more
    /// than exist.
    pub fn effective_ready(&self) -> u32 {
        let ready = self.ready_replicas.unwrap_or(self.spec_replicas);
        match self.status_replicas {
            Some(status) => ready.min(status),
            None => ready,
        }
    }
}

/// One metric's reading for this evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reading {
    /// A value in the metric's own unit, with the time of the data point it came from.
    Value { value: f64, at: Timestamp },
    /// No usable value: the backend failed, had no data, or the data was stale or garbage.
    Unavailable { reason: String },
    /// A source that answers with a replica count directly (a recommender). It may also say
    /// which replica counts would keep its observed value at its lower and upper bound: then
    /// whether the workload is above, inside or below its band is judged by where `spec`
    /// stands between them (docs/engine.md §1).
    Replicas {
        replicas: u32,
        /// The count below which the observed value would go above the upper bound: `spec`
        /// under it is *above* the band.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lower_bound: Option<u32>,
        /// The count above which the observed value would go below the lower bound: `spec`
        /// over it is *below* the band.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upper_bound: Option<u32>,
        /// The value the source observed, in its own unit (reported, never computed with).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        observed: Option<f64>,
    },
}

impl Reading {
    /// A replica count with nothing else known.
    pub fn replicas(replicas: u32) -> Self {
        Reading::Replicas { replicas, lower_bound: None, upper_bound: None, observed: None }
    }
}

/// A past recommendation, kept for the `behavior` stabilization windows. One the engine kept
/// may stand for several of a bucket (docs/engine.md §3b): then `at` is the newest one's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recommendation {
    pub replicas: u32,
    pub at: Timestamp,
}

/// A scale this autoscaler performed (recorded after the write succeeded), or several scales in
/// one direction merged into one (docs/engine.md §3b): their total change, from `since` (the
/// oldest) to `at` (the newest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleEvent {
    pub from: u32,
    pub to: u32,
    pub at: Timestamp,
    /// Only on merged scales: the time of the oldest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

impl ScaleEvent {
    /// One scale, from `from` to `to` replicas at `at`.
    pub fn new(from: u32, to: u32, at: Timestamp) -> Self {
        ScaleEvent { from, to, at, since: None }
    }
    pub fn added(&self) -> u32 {
        self.to.saturating_sub(self.from)
    }
    pub fn removed(&self) -> u32 {
        self.from.saturating_sub(self.to)
    }
    pub(crate) fn is_up(&self) -> bool {
        self.to > self.from
    }
    /// The time of its oldest scale.
    pub fn oldest(&self) -> Timestamp {
        self.since.map_or(self.at, |since| since.min(self.at))
    }
}

/// Memory of earlier evaluations. Persisted by the daemon so that a restart does not open a
/// window early.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    /// Last scale in either direction.
    pub last_scale_time: Option<Timestamp>,
    /// Since when some metric has been above its high watermark (with tolerance).
    pub above_since: Option<Timestamp>,
    /// Since when some metric has been below its low watermark (with tolerance).
    pub below_since: Option<Timestamp>,
    /// Unstabilized recommendations younger than the longer stabilization window, as far as a
    /// window can still use them: at most 61 per window (docs/engine.md §3b). Any history is
    /// accepted; the next decision reduces it.
    pub recommendations: Vec<Recommendation>,
    /// Scale events younger than the longest policy period, at most 32 (docs/engine.md §3b).
    pub scale_events: Vec<ScaleEvent>,
    /// Scale to zero's clocks, for a rule with `min_replicas = 0` (boxed: most rules have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero: Option<Box<ZeroState>>,
}

impl State {
    /// Whether a rule scaled the workload to zero (and nothing has moved it since): a workload
    /// at 0 without this was paused by a person.
    pub(crate) fn scaled_to_zero_here(&self) -> bool {
        self.zero.as_ref().is_some_and(|z| z.scaled_to_zero_at.is_some())
    }
}

/// What scale to zero remembers (docs/engine.md §5b).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZeroState {
    /// Since when every metric has been at or below its activation threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Timestamp>,
    /// When this rule took the workload to zero. A workload at 0 replicas without it was paused
    /// by a person, and is left alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaled_to_zero_at: Option<Timestamp>,
}

impl ZeroState {
    /// `None` when there is nothing to remember.
    pub(crate) fn boxed(self) -> Option<Box<ZeroState>> {
        (self != ZeroState::default()).then(|| Box::new(self))
    }
}
