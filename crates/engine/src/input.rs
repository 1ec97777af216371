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
    /// A source that answers with a replica count directly.
    Replicas { replicas: u32 },
}

/// A past recommendation, kept for the `behavior` stabilization windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recommendation {
    pub replicas: u32,
    pub at: Timestamp,
}

/// A scale this autoscaler performed (recorded after the write succeeded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleEvent {
    pub from: u32,
    pub to: u32,
    pub at: Timestamp,
}

impl ScaleEvent {
    pub fn added(&self) -> u32 {
        self.to.saturating_sub(self.from)
    }
    pub fn removed(&self) -> u32 {
        self.from.saturating_sub(self.to)
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
    /// Unstabilized recommendations younger than the longer stabilization window.
    pub recommendations: Vec<Recommendation>,
    /// Scale events younger than the longest policy period.
    pub scale_events: Vec<ScaleEvent>,
}
