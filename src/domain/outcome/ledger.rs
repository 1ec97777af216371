//! The ledger: every running autoscaler, who it is, its last [`Outcome`] and what accumulates
//! across its evaluations (the series' counters, the recent history, the scale events). A
//! synchronous store, written by the runtime's fan-out (admit, record, failed, remove) and read
//! by the exported series and the status board, each of which is a view of it: nothing it
//! holds is held a second time elsewhere.
//!
//! Readers must never keep an evaluation waiting: under the lock a read copies shared pointers
//! and a few numbers per autoscaler, or decodes one autoscaler's history; everything else
//! (searching, sorting, wording, rendering) happens after the lock is released, on the
//! listener's threads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Action, Algorithm, Position, Timestamp};

use super::Outcome;
use crate::domain::observed::{self, Comparison, Step};
use crate::domain::restriction::Restriction;
use crate::domain::sparse::Sparse;
use crate::domain::status::history::{Bands, History, Marks, Sample, BLOCK};

/// The most samples one autoscaler keeps, whatever its interval and the history asked for: a
/// day at 10 s, and the default hour at the shortest interval, 1 s.
pub const MAX_SAMPLES: u16 = 8_640;

/// Scale events kept per autoscaler, at most (and none older than its history).
const MAX_EVENTS: usize = 64;

/// Who an autoscaler's series are about: its exported label set.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesLabels {
    /// The WPA name, or the rules-file autoscaler's name.
    pub wpa_name: Arc<str>,
    /// The WPA namespace; for a rules-file autoscaler, its target's namespace.
    pub wpa_namespace: Arc<str>,
    pub resource_name: Arc<str>,
    pub resource_namespace: Arc<str>,
    pub resource_kind: Arc<str>,
    /// Labels-as-tags for `wpa_controller_labels_info`: (Prometheus label name, value) of the
    /// object's Kubernetes labels that the daemon's `labels_as_tags` selects, sorted by name,
    /// empty values left out.
    pub tags: Vec<(String, String)>,
    /// Whether the autoscaler only reports: its rule's `dry_run` or the daemon's `--dry-run`.
    /// Exported as the `dry_run` label, which users' dashboards filter on; when it flips, the
    /// autoscaler's series start over under the new label set.
    pub dry_run: bool,
}

impl SeriesLabels {
    /// The label set of an autoscaler named `name` whose target is the Deployment of the same
    /// name in `namespace`, with no tags: the simplest autoscaler there is.
    pub fn deployment(name: &str, namespace: &str, dry_run: bool) -> SeriesLabels {
        let name: Arc<str> = name.into();
        let namespace: Arc<str> = namespace.into();
        SeriesLabels {
            wpa_name: Arc::clone(&name),
            wpa_namespace: Arc::clone(&namespace),
            resource_name: name,
            resource_namespace: namespace,
            resource_kind: "Deployment".into(),
            tags: Vec::new(),
            dry_run,
        }
    }
}

/// Who an autoscaler is, as the scheduler runs it. Its names are the label set's, shared.
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    /// `file/NAME` or `crd/NAMESPACE/NAME`: the status API's path to it.
    pub id: Arc<str>,
    /// The name (the object's own, for a WPA), the namespace (the WPA's, or the target's for a
    /// rules-file autoscaler), the target, and whether it only reports.
    pub labels: Arc<SeriesLabels>,
    /// `file` or `crd`.
    pub source: &'static str,
    pub interval_seconds: u64,
    /// RFC 3339, when the rule pauses it until then.
    pub paused_until: Option<String>,
    /// The backends its metrics are read from, sorted.
    pub backends: Vec<Arc<str>>,
    /// The names of the shadow rules evaluated with it.
    pub shadows: Vec<Arc<str>>,
    /// The rule's bounds, for the series of an autoscaler that could not decide.
    pub min_replicas: u32,
    pub max_replicas: u32,
}

impl Identity {
    /// A rules-file autoscaler (`file/NAME`) with these labels, reading from `backends`, every
    /// `interval_seconds`, between `bounds`; no pause, no shadow rules.
    pub fn rules_file(
        labels: Arc<SeriesLabels>,
        backends: &[&str],
        interval_seconds: u64,
        bounds: (u32, u32),
    ) -> Identity {
        Identity {
            id: format!("file/{}", labels.wpa_name).into(),
            labels,
            source: "file",
            interval_seconds,
            paused_until: None,
            backends: backends.iter().map(|b| Arc::from(*b)).collect(),
            shadows: Vec::new(),
            min_replicas: bounds.0,
            max_replicas: bounds.1,
        }
    }

    pub fn name(&self) -> &Arc<str> {
        &self.labels.wpa_name
    }

    pub fn namespace(&self) -> &Arc<str> {
        &self.labels.wpa_namespace
    }
}

/// A change of the replicas decided, recorded as it was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleEvent {
    /// Unix seconds.
    pub at: i64,
    pub from: u32,
    pub to: u32,
    /// Whether it was only decided (a dry run or a pause), not written.
    pub written: bool,
}

/// The WPA condition types exported by `wpa_controller_conditions`, in the series' order.
pub const CONDITION_TYPES: [&str; 6] =
    ["AbleToScale", "ScalingLimited", "ScalingActive", "DryRun", "AboveHighWatermark", "BelowLowWatermark"];

/// One shadow rule's counts across the evaluations of its active autoscaler.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowCount {
    pub name: Arc<str>,
    /// What it would have set at the last evaluation; `None` after one that could not decide.
    pub replicas: Option<u32>,
    pub evaluations_total: u64,
    pub divergence_total: u64,
}

/// What accumulates across an autoscaler's evaluations under one label set: the series'
/// counters and the WPA conditions as last set. They start over when the label set changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub upscale_replicas_total: u64,
    pub downscale_replicas_total: u64,
    /// Per [`CONDITION_TYPES`] entry: its status as last set (`None`: never set).
    pub conditions: [Option<bool>; CONDITION_TYPES.len()],
    pub shadows: Sparse<ShadowCount>,
    /// For an observing autoscaler, its running comparison with the live controller. Boxed:
    /// most autoscalers do not observe.
    pub observed: Option<Box<Comparison>>,
}

impl Counters {
    fn set_conditions<'a>(&mut self, set: impl IntoIterator<Item = &'a (&'static str, bool)>) {
        for (type_, status) in set {
            if let Some(i) = CONDITION_TYPES.iter().position(|t| t == type_) {
                if let Some(slot) = self.conditions.get_mut(i) {
                    *slot = Some(*status);
                }
            }
        }
    }

    fn count(&mut self, outcome: &Outcome, interval_seconds: u64) {
        let decision = &outcome.decision;
        let (from, to) = (u64::from(decision.spec_replicas), u64::from(decision.replicas));
        if outcome.scaled {
            match decision.action {
                Action::ScaleUp => self.upscale_replicas_total += to.saturating_sub(from),
                Action::ScaleDown => self.downscale_replicas_total += from.saturating_sub(to),
                Action::Hold => {}
            }
        }
        self.set_conditions(&outcome.conditions);
        self.compare(outcome, interval_seconds);
        // Without shadow rules (none now, or none any more) there are no shadow counts.
        if let Some(shadows) = &outcome.shadows {
            let before = self.shadows.take();
            let counts: Vec<ShadowCount> = shadows
                .iter()
                .map(|shadow| {
                    let (evaluations, divergences) = before
                        .iter()
                        .find(|s| s.name == shadow.name)
                        .map_or((0, 0), |s| (s.evaluations_total, s.divergence_total));
                    ShadowCount {
                        name: Arc::clone(&shadow.name),
                        replicas: Some(shadow.replicas),
                        evaluations_total: evaluations + 1,
                        divergence_total: divergences + u64::from(shadow.diverged),
                    }
                })
                .collect();
            self.shadows = Sparse::from(counts);
        } else {
            self.shadows = Sparse::default();
        }
    }
}

impl Counters {
    /// Adds an observing autoscaler's evaluation to its comparison with the live controller;
    /// one that does not observe (any more) has none.
    fn compare(&mut self, outcome: &Outcome, interval_seconds: u64) {
        let Some(live) = outcome.live.as_deref() else {
            self.observed = None;
            return;
        };
        let decision = &outcome.decision;
        let algorithm = if outcome.per_replica { Algorithm::Average } else { Algorithm::Absolute };
        let step = Step {
            at: decision.now,
            watermarkd: decision.replicas,
            watermarkd_standing: observed::standing(decision, algorithm, outcome.tolerances, decision.replicas),
            live: live.replicas,
            live_standing: observed::standing(decision, algorithm, outcome.tolerances, live.replicas),
        };
        // Twice the interval: a late evaluation still counts, a daemon that was down does not.
        let max_gap = 2.0 * interval_seconds.max(1) as f64;
        self.observed.get_or_insert_with(Box::default).record(step, max_gap);
    }
}

/// Why the last evaluation could not decide, while it cannot.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub message: Arc<str>,
    /// The first failed evaluation of this run of failures.
    pub since: Timestamp,
    /// The last one.
    pub at: Timestamp,
}

/// One running autoscaler in the ledger, as a reader copies it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub identity: Arc<Identity>,
    /// The last decision, when there was one.
    pub last: Option<Arc<Outcome>>,
    /// Set while the evaluations fail; the last decision stays meanwhile.
    pub failure: Option<Failure>,
    pub counters: Counters,
    /// Whether an evaluation has reported under the current label set: until one has, its
    /// series are not exported (they start over when the labels change).
    pub reported: bool,
    /// The last change of the replicas within the history.
    pub last_scale: Option<ScaleEvent>,
}

struct Slot {
    entry: Entry,
    history: History,
    /// The changes of the replicas decided, oldest first: recorded as they are decided, so the
    /// first one after a start (which no earlier sample precedes) is one too.
    events: VecDeque<ScaleEvent>,
}

/// One autoscaler's recent history, read back for the status API and page.
#[derive(Clone, Debug)]
pub struct Recent {
    pub entry: Entry,
    pub samples: Vec<Sample>,
    pub bands: Vec<Bands>,
    pub events: Vec<ScaleEvent>,
}

/// The slots by id. Boxed: the table keeps about a third of its places empty, and a slot is
/// some 300 bytes (at 10,000 autoscalers, 1.5 MiB of empty places unboxed).
type Slots = HashMap<Arc<str>, Box<Slot>>;

/// The ledger. See the module comment.
pub struct Ledger {
    slots: Mutex<Slots>,
    /// How much history each autoscaler keeps (0: none).
    history: Duration,
}

impl Ledger {
    /// A ledger keeping `history` of each autoscaler's evaluations (zero: none).
    pub fn new(history: Duration) -> Ledger {
        Ledger { slots: Mutex::default(), history }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The samples that cover the history at `interval` (at least one block, at most
    /// `MAX_SAMPLES`).
    fn capacity(&self, interval_seconds: u64) -> u16 {
        let samples = self.history.as_secs().div_ceil(interval_seconds.max(1)) + 1;
        u16::try_from(samples).unwrap_or(u16::MAX).clamp(BLOCK, MAX_SAMPLES)
    }

    /// An autoscaler runs, or runs with a new rule. Its last decision and history stay (a
    /// watermark change is recorded as such); if its label set changed, its series start over:
    /// counters from zero, and nothing exported until an evaluation reports under the new one.
    pub fn admit(&self, identity: Identity) {
        let identity = Arc::new(identity);
        let mut slots = self.lock();
        match slots.get_mut(&identity.id) {
            Some(slot) => {
                if slot.entry.identity.labels != identity.labels {
                    slot.entry.counters = Counters::default();
                    slot.entry.reported = false;
                }
                slot.entry.identity = identity;
            }
            None => {
                let history = if self.history.is_zero() {
                    History::default()
                } else {
                    History::new(self.capacity(identity.interval_seconds))
                };
                let entry = Entry {
                    identity: Arc::clone(&identity),
                    last: None,
                    failure: None,
                    counters: Counters::default(),
                    reported: false,
                    last_scale: None,
                };
                slots.insert(Arc::clone(&identity.id), Box::new(Slot { entry, history, events: VecDeque::new() }));
            }
        }
    }

    /// An autoscaler stopped: everything about it goes.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// The slot of `id`, if it runs under `labels` still: a report from an evaluation that was
    /// under way when its autoscaler stopped or changed labels is late, and dropped.
    fn current<'s>(slots: &'s mut Slots, id: &str, labels: &SeriesLabels) -> Option<&'s mut Slot> {
        slots.get_mut(id).map(|slot| &mut **slot).filter(|slot| *slot.entry.identity.labels == *labels)
    }

    /// One decision, under the label set it was made with. The ledger keeps what the views
    /// read of it (see [`Outcome::reported`]).
    pub fn record(&self, id: &str, labels: &SeriesLabels, outcome: Outcome) {
        let decision = &outcome.decision;
        let paused = outcome.paused();
        let marks = Marks::empty()
            .with(Marks::SCALED_UP, outcome.moved(Action::ScaleUp))
            .with(Marks::SCALED_DOWN, outcome.moved(Action::ScaleDown))
            .with(Marks::FALLBACK, decision.fallback.is_some())
            .with(Marks::PAUSED, paused)
            .with(Marks::NO_DATA, decision.metrics.iter().all(|m| m.position == Position::Unavailable))
            .with(Marks::RESTRICTED, outcome.restricted())
            .restricted_by(Restriction::dominant(decision));
        let at = decision.now.unix_millis().div_euclid(1000);
        let sample = Sample {
            at,
            values: decision.metrics.iter().map(|m| outcome.compared_value(m).map(|v| v as f32)).collect(),
            proposed: decision.proposal,
            replicas: decision.replicas,
            marks,
        };
        let watermarks: Vec<(f32, f32)> =
            decision.metrics.iter().map(|m| (m.low_watermark as f32, m.high_watermark as f32)).collect();
        let replicas = decision.replicas;
        let spec = decision.spec_replicas;
        let mut slots = self.lock();
        let Some(slot) = Self::current(&mut slots, id, labels) else { return };
        let interval = slot.entry.identity.interval_seconds;
        slot.entry.counters.count(&outcome, interval);
        let outcome = Arc::new(outcome.reported());
        if slot.history.keeps() {
            // Against the replicas decided before, or, at the first evaluation, the ones found.
            let before = slot.entry.last.as_ref().map_or(spec, |l| l.decision.replicas);
            if before != replicas {
                let written = !paused && !labels.dry_run;
                let event = ScaleEvent { at, from: before, to: replicas, written };
                if slot.events.len() >= MAX_EVENTS {
                    slot.events.pop_front();
                }
                slot.events.push_back(event);
            }
            slot.history.push(sample, &watermarks);
            // What the history no longer covers is no longer an event.
            let oldest = slot.history.oldest_at();
            while slot.events.front().is_some_and(|e| oldest.is_some_and(|o| e.at < o)) {
                slot.events.pop_front();
            }
            slot.entry.last_scale = slot.events.back().copied();
        }
        slot.entry.last = Some(outcome);
        slot.entry.failure = None;
        slot.entry.reported = true;
    }

    /// An evaluation that could not decide. As the Datadog controller does on a failed
    /// reconcile, AbleToScale and ScalingActive turn False; the shadows keep their counts and
    /// lose their value.
    pub fn failed(&self, id: &str, labels: &SeriesLabels, at: Timestamp, message: &str) {
        let mut slots = self.lock();
        let Some(slot) = Self::current(&mut slots, id, labels) else { return };
        if let (true, Some(last)) = (slot.history.keeps(), &slot.entry.last) {
            let metrics = &last.decision.metrics;
            let sample = Sample {
                at: at.unix_millis().div_euclid(1000),
                values: vec![None; metrics.len()],
                proposed: None,
                replicas: last.decision.replicas,
                marks: Marks::FAILED,
            };
            let watermarks: Vec<(f32, f32)> =
                metrics.iter().map(|m| (m.low_watermark as f32, m.high_watermark as f32)).collect();
            slot.history.push(sample, &watermarks);
        }
        let counters = &mut slot.entry.counters;
        counters.set_conditions(&[("AbleToScale", false), ("ScalingActive", false), ("DryRun", labels.dry_run)]);
        let shadows: Vec<ShadowCount> =
            counters.shadows.iter().map(|s| ShadowCount { replicas: None, ..s.clone() }).collect();
        counters.shadows = Sparse::from(shadows);
        let since = slot.entry.failure.as_ref().map_or(at, |f| f.since);
        slot.entry.failure = Some(Failure { message: Arc::from(message), since, at });
        slot.entry.reported = true;
    }

    /// Every running autoscaler, copied: shared pointers and a few numbers each.
    pub fn entries(&self) -> Vec<Entry> {
        self.lock().values().map(|slot| slot.entry.clone()).collect()
    }

    /// One autoscaler with its history, by id.
    pub fn recent(&self, id: &str) -> Option<Recent> {
        let slots = self.lock();
        let slot = slots.get(id)?;
        Some(Recent {
            entry: slot.entry.clone(),
            samples: slot.history.samples(),
            bands: slot.history.bands().to_vec(),
            events: slot.events.iter().copied().collect(),
        })
    }

    /// Every autoscaler's history bytes, added up: what the benchmark reports.
    pub fn history_bytes(&self) -> usize {
        self.lock().values().map(|slot| slot.history.heap_bytes()).sum()
    }
}

#[cfg(test)]
mod tests;
