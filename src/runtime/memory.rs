//! What one autoscaler remembers between evaluations. The scheduler owns one per autoscaler
//! (behind a lock, so that one evaluation of it runs at a time) and hands it to each
//! evaluation; a changed rule starts a new one.

use std::sync::Arc;

use watermarkd_engine::State;

use super::source::Source;
use crate::domain::claims::ClaimNote;
use crate::domain::crd::{WatermarkPodAutoscaler, WatermarkPodAutoscalerStatus};
use crate::domain::fallback::FallbackMemory;
use crate::domain::forecast::Forecaster;
use crate::domain::rules::Autoscaler;
use crate::domain::sparse::Sparse;
use crate::domain::state;

/// What one autoscaler remembers between evaluations.
#[derive(Debug)]
pub struct Memory {
    /// `None` until restored from the cluster.
    pub(super) state: Option<State>,
    /// The leadership epoch the state was restored in; a new leadership restores again.
    pub(super) epoch: u64,
    /// Where the state is persisted, and what was last persisted there.
    pub(super) persisted: Persisted,
    /// A hash of the last decision's reason shape (see `evaluation::reason_shape`): only
    /// whether it changed matters, and at 10,000 autoscalers the texts would cost megabytes.
    pub(super) last_reason: Option<u64>,
    /// The target error last reported, so a stuck target logs once.
    pub(super) failing: Option<String>,
    /// The resourceVersion a scale write was based on whose outcome is unknown (timed out,
    /// or the API server failed): it may have landed, or may yet.
    pub(super) unconfirmed_write: Option<String>,
    /// What makes a change of the target's replica count this process did not confirm look
    /// like a scale that landed late.
    pub(super) suspicion: state::Suspicion,
    /// The shadow rules' own memories, in the order of `Desired::shadows`.
    pub(super) shadows: Sparse<ShadowMemory>,
    /// Whether the data has been missing, for an autoscaler that declares a fallback (only
    /// those have one).
    pub(super) fallback: Option<Box<FallbackMemory>>,
    /// The demand history of an autoscaler with a forecast (only those have one).
    pub(super) forecaster: Option<Box<Forecaster>>,
    /// What the guard last said of its target, so that the Events and log lines say each
    /// change once, not every evaluation.
    pub(super) claims_said: Option<Box<ClaimNote>>,
}

/// What a shadow rule remembers between evaluations.
#[derive(Debug)]
pub(super) struct ShadowMemory {
    /// The rule it was kept for: a changed shadow rule starts over.
    pub(super) autoscaler: Autoscaler,
    pub(super) state: State,
    /// Whether its last evaluation diverged from the active rule (a change is logged).
    pub(super) diverging: bool,
}

impl Memory {
    pub fn for_source(source: &Source) -> Memory {
        Memory {
            state: None,
            epoch: 0,
            persisted: Persisted::for_source(source),
            last_reason: None,
            failing: None,
            unconfirmed_write: None,
            suspicion: state::Suspicion::default(),
            shadows: Sparse::default(),
            fallback: None,
            forecaster: None,
            claims_said: None,
        }
    }
}

/// Where an autoscaler's state is persisted, with what it last persisted there. Every path
/// that reads or writes the state matches this alone.
#[derive(Debug)]
pub enum Persisted {
    /// A rules-file autoscaler: the target's state ConfigMap. `written`: the state last
    /// written there, or read from it (`None`: still to be written there).
    ConfigMap { written: Option<state::Written> },
    /// A WPA: its status.
    Status {
        /// The object as last seen (its spec shapes the status; its status is the last one
        /// the cluster holds).
        wpa: Arc<WatermarkPodAutoscaler>,
        /// The status last written, or read from the object. Boxed: most autoscalers at scale
        /// come from a rules file, and inline the status would make every one's memory 70
        /// bytes larger.
        status: Option<Box<WatermarkPodAutoscalerStatus>>,
        written_at: Option<tokio::time::Instant>,
    },
}

impl Persisted {
    pub fn for_source(source: &Source) -> Persisted {
        match source {
            Source::RulesFile => Persisted::ConfigMap { written: None },
            Source::Wpa(wpa) => Persisted::Status { wpa: Arc::clone(wpa), status: None, written_at: None },
        }
    }

    /// Takes the newest WPA object the source has seen (its status may be newer than the one
    /// this memory was made with). An autoscaler's key names its source, so the source's kind
    /// never changes under one memory; should it, the memory starts over for the new one.
    pub fn follow(&mut self, source: &Source) {
        match (self, source) {
            (Persisted::Status { wpa, .. }, Source::Wpa(newest)) => *wpa = Arc::clone(newest),
            (Persisted::ConfigMap { .. }, Source::RulesFile) => {}
            (persisted, source) => *persisted = Persisted::for_source(source),
        }
    }

    /// Forgets what was persisted: another daemon may have led meanwhile, and what it wrote is
    /// in the cluster.
    pub fn forget(&mut self) {
        match self {
            Persisted::ConfigMap { written } => *written = None,
            Persisted::Status { status, written_at, .. } => {
                *status = None;
                *written_at = None;
            }
        }
    }
}
