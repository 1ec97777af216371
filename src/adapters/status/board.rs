//! The status board: what every running autoscaler last decided and its recent history, for
//! the status API, `watermarkd status` and the page. A view of the ledger
//! (`domain::outcome::Ledger`), which the evaluations feed, plus what the board alone says:
//! whether this daemon leads, and whether the rules file on disk was refused.
//!
//! A read copies the ledger's shared pointers under its lock (a few atomic increments per
//! autoscaler, about a millisecond at 10,000) or, for one autoscaler, decodes its history;
//! searching, counting, sorting and formatting happen after the lock is released, on the
//! listener's threads, never on the one that evaluates.

use crate::domain::observed::{Comparison, Live};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Action, Guard, Limit, MetricOutcome, Position, Timestamp};

use crate::domain::outcome::{self, Entry, Ledger, Outcome, Recent};
pub use crate::domain::outcome::{ScaleEvent, Sentences};
use crate::domain::restriction::Restriction;

/// Who an autoscaler is, as the scheduler runs it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Identity {
    /// `file/NAME` or `crd/NAMESPACE/NAME`: the API's path to it.
    pub id: Arc<str>,
    pub name: Arc<str>,
    /// The WPA's namespace; for a rules-file autoscaler, its target's.
    pub namespace: Arc<str>,
    /// `file` or `crd`.
    pub source: &'static str,
    pub target: TargetView,
    pub interval_seconds: u64,
    pub dry_run: bool,
    /// RFC 3339, when the rule pauses it until then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_until: Option<String>,
    /// The backends its metrics are read from.
    pub backends: Vec<String>,
    /// The names of the shadow rules evaluated with it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadows: Vec<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetView {
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// One metric at the last evaluation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MetricNow {
    pub name: String,
    /// The value read, when there was a usable one.
    pub value: Option<f64>,
    /// What was compared with the watermarks (the value, or per ready replica).
    pub usage: Option<f64>,
    pub low_watermark: f64,
    pub high_watermark: f64,
    /// `above`, `below`, `inside` or `unavailable`.
    pub position: Position,
    pub proposal: Option<u32>,
    pub age_seconds: Option<f64>,
    /// Why it did not count, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a shadow rule would have done at the last evaluation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShadowNow {
    pub name: Arc<str>,
    pub replicas: u32,
    pub diverged: bool,
}

/// The last decision, as shown.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Last {
    pub at: Timestamp,
    pub spec_replicas: u32,
    pub ready_replicas: u32,
    /// The replicas decided.
    pub replicas: u32,
    pub action: Action,
    /// Whether the scale was written (or would have been, in a dry run).
    pub scaled: bool,
    /// What the metrics asked for, before limits.
    pub proposal: Option<u32>,
    /// What bounded the proposal (`within_range`: nothing).
    pub limit: Limit,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<Guard>,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Whether each metric's `usage` is its value or its value per ready replica.
    pub compared: Compared,
    /// The fraction above the high and below the low watermark that still holds (the band).
    pub upscale_tolerance: f64,
    pub downscale_tolerance: f64,
    pub metrics: Vec<MetricNow>,
    /// Seconds left of the forbidden window or delay that holds a move, each way (0: none).
    pub upscale_blocked_seconds: f64,
    pub downscale_blocked_seconds: f64,
    /// The decision in plain sentences, the headline first.
    pub explanation: Sentences,
    pub paused: bool,
    /// `Some` for an autoscaler with a fallback: whether it is in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_active: Option<bool>,
    /// The floor its forecast sets (or would set, observing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_replicas: Option<u32>,
    /// What its forecast says, or why it cannot forecast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadows: Vec<ShadowNow>,
    /// The other controllers that scale the target (`Kind/namespace/name`): while any does,
    /// the autoscaler writes nothing unless it takes over (the explanation says which).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claimed_by: Vec<Arc<str>>,
}

/// One autoscaler's state, in one word, for the table and its filter. The first that applies,
/// in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The last evaluation could not decide (the target or the state was unreadable).
    Failing,
    /// Not evaluated yet.
    Pending,
    /// No metric had a usable value.
    NoData,
    /// The declared fallback decides.
    Fallback,
    /// Paused until a time: decides, writes nothing.
    Paused,
    /// A limit, window or delay kept the replicas from what the metrics asked for.
    Limited,
    /// The last evaluation changed the replicas.
    Scaling,
    /// Held, every metric readable, nothing limiting.
    Ok,
}

impl State {
    pub const ALL: [State; 8] = [
        State::Failing,
        State::Pending,
        State::NoData,
        State::Fallback,
        State::Paused,
        State::Limited,
        State::Scaling,
        State::Ok,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Failing => "failing",
            State::Pending => "pending",
            State::NoData => "no_data",
            State::Fallback => "fallback",
            State::Paused => "paused",
            State::Limited => "limited",
            State::Scaling => "scaling",
            State::Ok => "ok",
        }
    }

    /// The table's order: what needs a look first. Failing and without data, then a fallback
    /// deciding, limits holding replicas back, pauses, moves, not yet evaluated, and calm last.
    pub fn urgency(self) -> u8 {
        match self {
            State::Failing => 0,
            State::NoData => 1,
            State::Fallback => 2,
            State::Limited => 3,
            State::Paused => 4,
            State::Scaling => 5,
            State::Pending => 6,
            State::Ok => 7,
        }
    }

    pub fn parse(text: &str) -> Option<State> {
        State::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// One row of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    #[serde(flatten)]
    pub identity: Identity,
    pub state: State,
    pub spec_replicas: Option<u32>,
    pub ready_replicas: Option<u32>,
    pub min_replicas: Option<u32>,
    pub max_replicas: Option<u32>,
    /// The metric that set the proposal (or the first), against its band.
    pub metric: Option<MetricNow>,
    /// The last evaluation's time and headline.
    pub evaluated_at: Option<Timestamp>,
    pub why: Option<String>,
    /// The last time the replicas changed within the history: (when, from, to).
    pub last_scale: Option<ScaleEvent>,
    /// Why the last evaluation could not decide, while it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
    /// Since when the evaluations have failed, while they do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<Timestamp>,
}

/// One autoscaler in full.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Detail {
    #[serde(flatten)]
    pub summary: Summary,
    pub last: Option<Last>,
    pub history: HistoryView,
    /// For an observing autoscaler, what the live controller ran last and how the two compare
    /// over the time observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedView>,
}

/// An observing autoscaler beside the live controller.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObservedView {
    /// What the live controller ran at the last evaluation (none after a failed one that had
    /// no decision before it).
    pub live: Option<Live>,
    pub comparison: Comparison,
}

/// The history as the API gives it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HistoryView {
    /// The metrics' names, in the order of each sample's `values`.
    pub metrics: Vec<String>,
    /// What `values` are: `value` (the metric as read, for an `absolute` rule) or
    /// `per_replica` (the metric divided by the ready replicas, for an `average` rule). Either
    /// way the quantity the watermarks are compared with.
    pub compared: Compared,
    pub samples: Vec<SampleView>,
    pub events: Vec<ScaleEvent>,
}

/// What a history's values are: see [`HistoryView::compared`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compared {
    #[default]
    Value,
    PerReplica,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleView {
    /// Unix seconds.
    pub at: i64,
    /// Each metric's quantity compared with its watermarks (see [`HistoryView::compared`]).
    pub values: Vec<Option<f32>>,
    /// Each metric's watermarks then: [low, high].
    pub watermarks: Vec<[f32; 2]>,
    pub proposed: Option<u32>,
    pub replicas: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "super::wire::marks")]
    pub marks: Vec<&'static str>,
    /// What held or bent the evaluation (`upscale_window`, `no_data`, ...), as the simulator's
    /// chart shades it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restricted_by: Option<Restriction>,
}

/// A page of the table: which rows, of how many.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Words that must all appear in the name, namespace or target (any case).
    pub search: String,
    pub state: Option<State>,
    /// By id alone, instead of the most urgent first.
    pub by_id: bool,
    pub offset: usize,
    pub limit: usize,
}

/// Whether this daemon decides: only the leader evaluates, so a follower's board has nothing
/// to say but who leads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leadership {
    /// `None` until the first look at the Lease.
    pub leader: Option<bool>,
    /// The daemon holding the Lease, when another does and it is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_identity: Option<String>,
}

/// The rules file as this daemon last read it: whether what is on disk was refused, and why,
/// until a good file is read (the rules that run stay the previous ones meanwhile).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RulesView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<RulesRejected>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RulesRejected {
    pub at: Timestamp,
    /// What was wrong, in one line.
    pub reason: String,
    /// Each problem, naming its line, autoscaler and field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ListPage {
    /// Whether this daemon is the one deciding.
    pub daemon: Leadership,
    /// Whether the rules file on disk is the one running.
    pub rules: RulesView,
    /// Autoscalers running.
    pub total: usize,
    /// Of those, the ones the search and the state filter keep.
    pub matched: usize,
    pub offset: usize,
    /// How many are in each state (all of them, whatever the filter).
    pub states: Vec<(State, usize)>,
    pub autoscalers: Vec<Summary>,
}

/// The board. See the module comment.
pub struct Board {
    ledger: Arc<Ledger>,
    leadership: Mutex<Leadership>,
    rules: Mutex<RulesView>,
}

impl Board {
    /// The board of what `ledger` holds.
    pub fn new(ledger: Arc<Ledger>) -> Board {
        Board { ledger, leadership: Mutex::default(), rules: Mutex::default() }
    }

    /// This daemon leads (it decides), or follows the named holder of the Lease.
    pub fn set_leadership(&self, leadership: Leadership) {
        *self.leadership.lock().unwrap_or_else(PoisonError::into_inner) = leadership;
    }

    pub fn leadership(&self) -> Leadership {
        self.leadership.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The rules file on disk was refused: say so until a good one is read.
    pub fn rules_rejected(&self, at: Timestamp, reason: &str, problems: &[String]) {
        let rejected = RulesRejected { at, reason: reason.to_string(), problems: problems.to_vec() };
        self.rules.lock().unwrap_or_else(PoisonError::into_inner).rejected = Some(rejected);
    }

    /// The rules file on disk is the one running.
    pub fn rules_accepted(&self) {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner).rejected = None;
    }

    pub fn rules(&self) -> RulesView {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Per backend: the autoscalers reading from it, and how many of them have no usable
    /// value at all.
    pub fn backend_counts(&self) -> Vec<(String, usize, usize)> {
        let mut counts: std::collections::BTreeMap<String, (usize, usize)> = std::collections::BTreeMap::new();
        for entry in self.ledger.entries() {
            let no_data = state_of(&entry) == State::NoData;
            for backend in &entry.identity.backends {
                let count = counts.entry(backend.to_string()).or_default();
                count.0 += 1;
                count.1 += usize::from(no_data);
            }
        }
        counts.into_iter().map(|(name, (all, without))| (name, all, without)).collect()
    }

    /// A page of the table: the most urgent states first (see [`State::urgency`]), each by id;
    /// or by id alone. The ledger's lock is held only to copy each entry's pointers; the
    /// search, the counts and the order are worked out after.
    pub fn list(&self, query: &ListQuery) -> ListPage {
        let entries = self.ledger.entries();
        let words: Vec<&str> = query.search.split_whitespace().collect();
        let mut counts = [0usize; State::ALL.len()];
        let total = entries.len();
        let mut kept: Vec<(Entry, State)> = Vec::new();
        for entry in entries {
            let state = state_of(&entry);
            if let Some(count) = State::ALL.iter().position(|s| *s == state).and_then(|i| counts.get_mut(i)) {
                *count += 1;
            }
            if query.state.is_some_and(|s| s != state) || !matches(&entry.identity, &words) {
                continue;
            }
            kept.push((entry, state));
        }
        let matched = kept.len();
        if query.by_id {
            kept.sort_by(|a, b| a.0.identity.id.cmp(&b.0.identity.id));
        } else {
            kept.sort_by(|a, b| a.1.urgency().cmp(&b.1.urgency()).then_with(|| a.0.identity.id.cmp(&b.0.identity.id)));
        }
        let autoscalers = kept
            .into_iter()
            .skip(query.offset)
            .take(query.limit)
            .map(|(entry, state)| summary(&entry, state))
            .collect();
        ListPage {
            daemon: self.leadership(),
            rules: self.rules(),
            total,
            matched,
            offset: query.offset,
            states: State::ALL.into_iter().zip(counts).collect(),
            autoscalers,
        }
    }

    /// One autoscaler in full, by id.
    pub fn detail(&self, id: &str) -> Option<Detail> {
        let Recent { entry, samples, bands, events } = self.ledger.recent(id)?;
        let summary = summary(&entry, state_of(&entry));
        let last = entry.last.as_deref().map(last_view);
        let compared = last.as_ref().map(|l| l.compared).unwrap_or_default();
        let metrics = last.as_ref().map(|l| l.metrics.iter().map(|m| m.name.clone()).collect()).unwrap_or_default();
        let samples = samples
            .into_iter()
            .map(|s| {
                let watermarks = bands
                    .iter()
                    .rev()
                    .find(|b| b.at <= s.at)
                    .or(bands.first())
                    .map(|b| b.watermarks.iter().map(|(l, h)| [*l, *h]).collect())
                    .unwrap_or_default();
                SampleView {
                    at: s.at,
                    values: s.values,
                    watermarks,
                    proposed: s.proposed,
                    replicas: s.replicas,
                    marks: s.marks.names(),
                    restricted_by: s.marks.restriction(),
                }
            })
            .collect();
        let observed = entry.counters.observed.as_deref().map(|comparison| ObservedView {
            live: entry.last.as_ref().and_then(|l| l.live.as_deref().cloned()),
            comparison: comparison.clone(),
        });
        Some(Detail { summary, last, history: HistoryView { metrics, compared, samples, events }, observed })
    }
}

/// One autoscaler's state, from its ledger entry.
fn state_of(entry: &Entry) -> State {
    let Some(last) = entry.last.as_deref() else {
        return if entry.failure.is_some() { State::Failing } else { State::Pending };
    };
    let decision = &last.decision;
    if entry.failure.is_some() {
        State::Failing
    } else if decision.metrics.iter().all(|m| m.position == Position::Unavailable)
        && last.fallback_active() != Some(true)
    {
        State::NoData
    } else if last.fallback_active() == Some(true) {
        State::Fallback
    } else if last.paused() {
        State::Paused
    } else if last.restricted() {
        State::Limited
    } else if decision.action != Action::Hold {
        State::Scaling
    } else {
        State::Ok
    }
}

/// Whether every word appears in the id, name, namespace or target, in any case. The API caps
/// the words and their length (`http::MAX_SEARCH_WORDS`), and nothing here allocates.
fn matches(identity: &outcome::Identity, words: &[&str]) -> bool {
    let labels = &identity.labels;
    words.iter().all(|word| {
        [&identity.id, &labels.wpa_name, &labels.wpa_namespace, &labels.resource_name, &labels.resource_kind]
            .iter()
            .any(|field| contains_ignoring_case(field, word))
    })
}

/// `needle` in `haystack`, ASCII letters compared in any case; other characters exactly.
/// Kubernetes names are ASCII; a search for a non-ASCII letter matches only its own case.
fn contains_ignoring_case(haystack: &str, needle: &str) -> bool {
    let (haystack, needle) = (haystack.as_bytes(), needle.as_bytes());
    needle.is_empty() || haystack.windows(needle.len()).any(|window| window.eq_ignore_ascii_case(needle))
}

/// Who an autoscaler is, as the API shows it.
fn identity_view(identity: &outcome::Identity) -> Identity {
    let labels = &identity.labels;
    Identity {
        id: Arc::clone(&identity.id),
        name: Arc::clone(&labels.wpa_name),
        namespace: Arc::clone(&labels.wpa_namespace),
        source: identity.source,
        target: TargetView {
            kind: Arc::clone(&labels.resource_kind),
            namespace: Arc::clone(&labels.resource_namespace),
            name: Arc::clone(&labels.resource_name),
        },
        interval_seconds: identity.interval_seconds,
        dry_run: labels.dry_run,
        paused_until: identity.paused_until.clone(),
        backends: identity.backends.iter().map(|b| b.to_string()).collect(),
        shadows: identity.shadows.clone(),
    }
}

/// The last decision, as the API shows it.
fn last_view(outcome: &Outcome) -> Last {
    let decision = &outcome.decision;
    let (upscale_blocked_seconds, downscale_blocked_seconds) = outcome.blocked_seconds();
    Last {
        at: decision.now,
        spec_replicas: decision.spec_replicas,
        ready_replicas: decision.ready_replicas,
        replicas: decision.replicas,
        action: decision.action,
        scaled: outcome.scaled,
        proposal: decision.proposal,
        limit: decision.limit,
        guard: decision.guard,
        min_replicas: outcome.min_replicas,
        max_replicas: outcome.max_replicas,
        compared: if outcome.per_replica { Compared::PerReplica } else { Compared::Value },
        upscale_tolerance: outcome.tolerances.0,
        downscale_tolerance: outcome.tolerances.1,
        upscale_blocked_seconds,
        downscale_blocked_seconds,
        explanation: outcome.explanation.clone(),
        paused: outcome.paused(),
        fallback_active: outcome.fallback_active(),
        forecast_replicas: outcome.ahead.as_ref().and_then(|a| a.forecast_replicas),
        forecast: outcome.forecast_says.clone().map(|says| says.unwrap_or_else(|why| why)),
        shadows: outcome
            .shadows
            .iter()
            .flatten()
            .map(|s| ShadowNow { name: Arc::clone(&s.name), replicas: s.replicas, diverged: s.diverged })
            .collect(),
        claimed_by: outcome.claims.iter().flat_map(|c| c.claimed_by.iter().cloned()).collect(),
        metrics: decision.metrics.iter().map(metric_view).collect(),
    }
}

/// One metric of the last decision, as the API shows it: a value only when it was usable.
fn metric_view(m: &MetricOutcome) -> MetricNow {
    MetricNow {
        value: m.usable_value(),
        usage: m.usage.filter(|u| u.is_finite() && m.position != Position::Unavailable),
        age_seconds: m.age_seconds.filter(|a| a.is_finite()),
        name: m.name.clone(),
        low_watermark: m.low_watermark,
        high_watermark: m.high_watermark,
        position: m.position,
        proposal: m.proposal,
        note: m.note.clone(),
    }
}

fn summary(entry: &Entry, state: State) -> Summary {
    let last = entry.last.as_deref();
    let metric = last.and_then(|l| {
        let metrics = &l.decision.metrics;
        let deciding = metrics.iter().filter(|m| m.proposal.is_some()).max_by_key(|m| m.proposal);
        deciding.or(metrics.first()).map(metric_view)
    });
    let failing = entry.failure.as_ref();
    Summary {
        identity: identity_view(&entry.identity),
        state,
        spec_replicas: last.map(|l| l.decision.replicas),
        ready_replicas: last.map(|l| l.decision.ready_replicas),
        min_replicas: last.map(|l| l.min_replicas),
        max_replicas: last.map(|l| l.max_replicas),
        metric,
        evaluated_at: last.map(|l| l.decision.now),
        why: last.and_then(|l| l.explanation.first().map(str::to_string)),
        last_scale: entry.last_scale,
        failing: failing.map(|f| f.message.to_string()),
        failing_since: failing.map(|f| f.since),
    }
}

#[cfg(test)]
mod tests;
