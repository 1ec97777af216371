//! The status board: what every running autoscaler last decided and its recent history, for
//! the status API, `watermarkd status` and the page. A synchronous store, fed by the
//! evaluations (`record`, `failed`) and by the scheduler (`admit`, `remove`), read by the
//! listener.
//!
//! The evaluations write here, so a read must never keep them waiting: under the lock a read
//! only clones the shared pointers of what it shows (a few atomic increments per autoscaler,
//! about a millisecond at 10,000) or, for one autoscaler, decodes its history; searching,
//! counting, sorting and formatting happen after the lock is released, on the listener's
//! threads, never on the one that evaluates.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use watermarkd_engine::{Action, Algorithm, Decision, Guard, Limit, Position, Rule, Timestamp};

use crate::adapters::telemetry::{AheadSeries, ShadowOutcome};
use crate::domain::restriction::Restriction;
use crate::domain::status::explain::{self, Context};
use crate::domain::status::history::{Bands, History, Marks, Sample, BLOCK};

/// The most samples one autoscaler keeps, whatever its interval and the history asked for: a
/// day at 10 s, and the default hour at the shortest interval, 1 s.
pub const MAX_SAMPLES: u16 = 8_640;

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

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetView {
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

/// One metric at the last evaluation.
#[derive(Clone, Debug, Serialize)]
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
#[derive(Clone, Debug, Serialize)]
pub struct ShadowNow {
    pub name: Arc<str>,
    pub replicas: u32,
    pub diverged: bool,
}

/// The last decision, as shown.
#[derive(Clone, Debug, Serialize)]
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadows: Vec<ShadowNow>,
}

/// Sentences kept as one text, a line each, and given as a list: one allocation per decision
/// instead of one per sentence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sentences(Box<str>);

impl Sentences {
    pub fn new(sentences: &[String]) -> Sentences {
        let lines: Vec<String> = sentences.iter().map(|s| s.replace(['\n', '\r'], " ")).collect();
        Sentences(lines.join("\n").into())
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.split('\n').filter(|s| !s.is_empty())
    }

    pub fn first(&self) -> Option<&str> {
        self.iter().next()
    }
}

impl Serialize for Sentences {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// What an evaluation adds besides its decision.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    pub scaled: bool,
    pub ahead: Option<AheadSeries>,
    pub forecast_says: Option<Result<String, String>>,
    pub shadows: Option<Vec<ShadowOutcome>>,
}

/// One autoscaler's state, in one word, for the table and its filter. The first that applies,
/// in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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

impl Last {
    /// Whether the replicas were kept from what the metrics asked for: a limit on the
    /// proposal, or a forbidden window or delay holding a move that way. The one definition
    /// of the `limited` state and the history's `restricted` mark.
    pub fn restricted(&self) -> bool {
        let limited = self.limit != Limit::WithinRange && self.guard.is_none();
        let wanted = |more: bool| {
            self.proposal.is_some_and(|p| if more { p > self.spec_replicas } else { p < self.spec_replicas })
        };
        limited
            || self.upscale_blocked_seconds > 0.0 && wanted(true)
            || self.downscale_blocked_seconds > 0.0 && wanted(false)
    }
}

fn state_of(last: Option<&Last>, failing: bool) -> State {
    let Some(last) = last else { return if failing { State::Failing } else { State::Pending } };
    if failing {
        State::Failing
    } else if last.metrics.iter().all(|m| m.position == Position::Unavailable) && last.fallback_active != Some(true) {
        State::NoData
    } else if last.fallback_active == Some(true) {
        State::Fallback
    } else if last.paused {
        State::Paused
    } else if last.restricted() {
        State::Limited
    } else if last.action != Action::Hold {
        State::Scaling
    } else {
        State::Ok
    }
}

/// One row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub identity: Arc<Identity>,
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

/// A change of the replicas decided, recorded as it was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ScaleEvent {
    /// Unix seconds.
    pub at: i64,
    pub from: u32,
    pub to: u32,
    /// Whether it was only decided (a dry run or a pause), not written.
    pub written: bool,
}

/// One autoscaler in full.
#[derive(Clone, Debug, Serialize)]
pub struct Detail {
    #[serde(flatten)]
    pub summary: Summary,
    pub last: Option<Arc<Last>>,
    pub history: HistoryView,
}

/// The history as the API gives it.
#[derive(Clone, Debug, Serialize)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compared {
    #[default]
    Value,
    PerReplica,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SampleView {
    /// Unix seconds.
    pub at: i64,
    /// Each metric's quantity compared with its watermarks (see [`HistoryView::compared`]).
    pub values: Vec<Option<f32>>,
    /// Each metric's watermarks then: [low, high].
    pub watermarks: Vec<[f32; 2]>,
    pub proposed: Option<u32>,
    pub replicas: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<&'static str>,
    /// What held or bent the evaluation (`upscale_window`, `no_data`, ...), as the simulator's
    /// chart shades it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restricted_by: Option<Restriction>,
}

/// Scale events kept per autoscaler, at most (and none older than its history).
const MAX_EVENTS: usize = 64;

struct Entry {
    identity: Arc<Identity>,
    last: Option<Arc<Last>>,
    failing: Option<Arc<str>>,
    failing_since: Option<Timestamp>,
    history: History,
    /// The changes of the replicas decided, oldest first: recorded as they are decided, so the
    /// first one after a start (which no earlier sample precedes) is one too.
    events: std::collections::VecDeque<ScaleEvent>,
}

/// What a read of the table copies of one entry under the lock: shared pointers and a few
/// numbers, so the lock is held for a moment whatever the search.
struct Row {
    identity: Arc<Identity>,
    last: Option<Arc<Last>>,
    failing: Option<(Arc<str>, Timestamp)>,
    last_scale: Option<ScaleEvent>,
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Leadership {
    /// `None` until the first look at the Lease.
    pub leader: Option<bool>,
    /// The daemon holding the Lease, when another does and it is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_identity: Option<String>,
}

/// The rules file as this daemon last read it: whether what is on disk was refused, and why,
/// until a good file is read (the rules that run stay the previous ones meanwhile).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RulesView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<RulesRejected>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RulesRejected {
    pub at: Timestamp,
    /// What was wrong, in one line.
    pub reason: String,
    /// Each problem, naming its line, autoscaler and field.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
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
    /// `false` when the status service is off: nothing is admitted, so nothing is kept.
    enabled: bool,
    entries: Mutex<HashMap<Arc<str>, Entry>>,
    leadership: Mutex<Leadership>,
    rules: Mutex<RulesView>,
    /// How much history each autoscaler keeps (0: none).
    history: Duration,
}

impl Board {
    pub fn new(history: Duration) -> Board {
        Board {
            enabled: true,
            entries: Mutex::default(),
            leadership: Mutex::default(),
            rules: Mutex::default(),
            history,
        }
    }

    /// A board that keeps nothing, for a daemon whose status service is off.
    pub fn disabled() -> Board {
        Board { enabled: false, ..Board::new(Duration::ZERO) }
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The samples that cover `history` at `interval` (at least one block, at most
    /// `MAX_SAMPLES`).
    fn capacity(&self, interval_seconds: u64) -> u16 {
        let samples = self.history.as_secs().div_ceil(interval_seconds.max(1)) + 1;
        u16::try_from(samples).unwrap_or(u16::MAX).clamp(BLOCK, MAX_SAMPLES)
    }

    /// An autoscaler runs, or runs with a new rule: its history stays (a watermark change is
    /// recorded as such), its last decision stays until the next.
    pub fn admit(&self, identity: Identity) {
        if !self.enabled {
            return;
        }
        let capacity = self.capacity(identity.interval_seconds);
        let keep = !self.history.is_zero();
        let mut entries = self.lock();
        let id = Arc::clone(&identity.id);
        let identity = Arc::new(identity);
        match entries.get_mut(&id) {
            Some(entry) => entry.identity = identity,
            None => {
                let history = if keep { History::new(capacity) } else { History::default() };
                let events = std::collections::VecDeque::new();
                entries.insert(id, Entry { identity, last: None, failing: None, failing_since: None, history, events });
            }
        }
    }

    /// An autoscaler stopped: everything about it goes.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// One decision. `rule` is the one it was made with (a schedule's or forecast's bounds
    /// applied). Nothing is worded for an autoscaler the board does not hold.
    pub fn record(&self, id: &str, rule: &Rule, decision: Decision, extras: Extras) {
        let Some(paused_until) = self.lock().get(id).map(|e| e.identity.paused_until.clone()) else { return };
        let paused = extras.ahead.as_ref().and_then(|a| a.paused) == Some(true);
        let context = Context { paused_until: paused_until.as_deref().filter(|_| paused), scaled: extras.scaled };
        let explanation = explain::explain(&decision, rule, context);
        let moved = |action: Action| decision.action == action && (extras.scaled || paused);
        let marks = Marks::empty()
            .with(Marks::SCALED_UP, moved(Action::ScaleUp))
            .with(Marks::SCALED_DOWN, moved(Action::ScaleDown))
            .with(Marks::FALLBACK, decision.fallback.is_some())
            .with(Marks::PAUSED, paused)
            .with(Marks::NO_DATA, decision.metrics.iter().all(|m| m.position == Position::Unavailable))
            .restricted_by(Restriction::dominant(&decision));
        // The quantity the band is compared with: for an `average` rule the value per ready
        // replica, not the total (a total drawn against a per-replica band means nothing).
        let values = decision.metrics.iter().map(|m| compared_value(m).map(|v| v as f32)).collect();
        let watermarks: Vec<(f32, f32)> =
            decision.metrics.iter().map(|m| (m.low_watermark as f32, m.high_watermark as f32)).collect();
        let t = decision.timing;
        let last = Last {
            at: decision.now,
            spec_replicas: decision.spec_replicas,
            ready_replicas: decision.ready_replicas,
            replicas: decision.replicas,
            action: decision.action,
            scaled: extras.scaled,
            proposal: decision.proposal,
            limit: decision.limit,
            guard: decision.guard,
            min_replicas: rule.min_replicas(),
            max_replicas: rule.max_replicas(),
            compared: match rule.algorithm() {
                Algorithm::Absolute => Compared::Value,
                Algorithm::Average => Compared::PerReplica,
            },
            upscale_tolerance: rule.upscale_tolerance().to_f64(),
            downscale_tolerance: rule.downscale_tolerance().to_f64(),
            upscale_blocked_seconds: t.upscale_window_seconds_left.max(t.upscale_delay_seconds_left).max(0.0),
            downscale_blocked_seconds: t.downscale_window_seconds_left.max(t.downscale_delay_seconds_left).max(0.0),
            explanation: Sentences::new(&explanation),
            paused,
            fallback_active: extras.ahead.as_ref().and_then(|a| a.fallback_active),
            forecast_replicas: extras.ahead.as_ref().and_then(|a| a.forecast_replicas),
            forecast: extras.forecast_says.map(|says| says.unwrap_or_else(|why| why)),
            shadows: extras
                .shadows
                .unwrap_or_default()
                .into_iter()
                .map(|s| ShadowNow { name: s.name, replicas: s.replicas, diverged: s.diverged })
                .collect(),
            metrics: decision
                .metrics
                .into_iter()
                .map(|m| MetricNow {
                    value: m.usable_value(),
                    usage: m.usage.filter(|u| u.is_finite() && m.position != Position::Unavailable),
                    age_seconds: m.age_seconds.filter(|a| a.is_finite()),
                    name: m.name,
                    low_watermark: m.low_watermark,
                    high_watermark: m.high_watermark,
                    position: m.position,
                    proposal: m.proposal,
                    note: m.note,
                })
                .collect(),
        };
        let sample = Sample {
            at: last.at.unix_millis().div_euclid(1000),
            values,
            proposed: last.proposal,
            replicas: last.replicas,
            marks: marks.with(Marks::RESTRICTED, last.restricted()),
        };
        let written = !paused;
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(id) else { return };
        if entry.history.keeps() {
            // Against the replicas decided before, or, at the first evaluation, the ones found.
            let before = entry.last.as_ref().map_or(last.spec_replicas, |l| l.replicas);
            if before != last.replicas {
                let written = written && !entry.identity.dry_run;
                let event = ScaleEvent { at: sample.at, from: before, to: last.replicas, written };
                if entry.events.len() >= MAX_EVENTS {
                    entry.events.pop_front();
                }
                entry.events.push_back(event);
            }
            entry.history.push(sample, &watermarks);
            // What the history no longer covers is no longer an event.
            let oldest = entry.history.oldest_at();
            while entry.events.front().is_some_and(|e| oldest.is_some_and(|o| e.at < o)) {
                entry.events.pop_front();
            }
        }
        entry.last = Some(Arc::new(last));
        entry.failing = None;
        entry.failing_since = None;
    }

    /// An evaluation that could not decide.
    pub fn failed(&self, id: &str, at: Timestamp, message: &str) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(id) else { return };
        if entry.history.keeps() {
            if let Some(last) = &entry.last {
                let sample = Sample {
                    at: at.unix_millis().div_euclid(1000),
                    values: vec![None; last.metrics.len()],
                    proposed: None,
                    replicas: last.replicas,
                    marks: Marks::FAILED,
                };
                let watermarks: Vec<(f32, f32)> =
                    last.metrics.iter().map(|m| (m.low_watermark as f32, m.high_watermark as f32)).collect();
                entry.history.push(sample, &watermarks);
            }
        }
        entry.failing = Some(Arc::from(message));
        entry.failing_since.get_or_insert(at);
    }

    /// Every autoscaler's history bytes, added up: what the benchmark reports.
    pub fn history_bytes(&self) -> usize {
        self.lock().values().map(|e| e.history.heap_bytes()).sum()
    }

    /// Per backend: the autoscalers reading from it, and how many of them have no usable
    /// value at all.
    pub fn backend_counts(&self) -> Vec<(String, usize, usize)> {
        let mut counts: std::collections::BTreeMap<String, (usize, usize)> = std::collections::BTreeMap::new();
        for entry in self.lock().values() {
            let no_data = state_of(entry.last.as_deref(), entry.failing.is_some()) == State::NoData;
            for backend in &entry.identity.backends {
                let count = counts.entry(backend.clone()).or_default();
                count.0 += 1;
                count.1 += usize::from(no_data);
            }
        }
        counts.into_iter().map(|(name, (all, without))| (name, all, without)).collect()
    }

    /// A page of the table: the most urgent states first (see [`State::urgency`]), each by id;
    /// or by id alone. The lock is held only to copy each entry's pointers; the search, the
    /// counts and the order are worked out after.
    pub fn list(&self, query: &ListQuery) -> ListPage {
        let rows: Vec<Row> = self
            .lock()
            .values()
            .map(|entry| Row {
                identity: Arc::clone(&entry.identity),
                last: entry.last.clone(),
                failing: entry.failing.clone().zip(entry.failing_since),
                last_scale: entry.events.back().copied(),
            })
            .collect();
        let words: Vec<&str> = query.search.split_whitespace().collect();
        let mut counts = [0usize; State::ALL.len()];
        let total = rows.len();
        let mut kept: Vec<(Row, State)> = Vec::new();
        for row in rows {
            let state = state_of(row.last.as_deref(), row.failing.is_some());
            if let Some(count) = State::ALL.iter().position(|s| *s == state).and_then(|i| counts.get_mut(i)) {
                *count += 1;
            }
            if query.state.is_some_and(|s| s != state) || !matches(&row.identity, &words) {
                continue;
            }
            kept.push((row, state));
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
            .map(|(row, state)| {
                summary(&row.identity, row.last.as_deref(), row.failing.as_ref(), state, row.last_scale)
            })
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
        let entries = self.lock();
        let entry = entries.get(id)?;
        let samples = entry.history.samples();
        let bands: Vec<Bands> = entry.history.bands().to_vec();
        let events: Vec<ScaleEvent> = entry.events.iter().copied().collect();
        let failing = entry.failing.clone().zip(entry.failing_since);
        let (identity, last) = (Arc::clone(&entry.identity), entry.last.clone());
        drop(entries);
        let state = state_of(last.as_deref(), failing.is_some());
        let summary = summary(&identity, last.as_deref(), failing.as_ref(), state, events.last().copied());
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
        Some(Detail { summary, last, history: HistoryView { metrics, compared, samples, events } })
    }
}

/// Whether every word appears in the id, name, namespace or target, in any case. The API caps
/// the words and their length (`http::MAX_SEARCH_WORDS`), and nothing here allocates.
fn matches(identity: &Identity, words: &[&str]) -> bool {
    words.iter().all(|word| {
        [&identity.id, &identity.name, &identity.namespace, &identity.target.name, &identity.target.kind]
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

/// What an `average` rule's metric is compared with is its value per ready replica (`usage`);
/// an `absolute` rule's, its value. Only a usable one.
fn compared_value(m: &watermarkd_engine::MetricOutcome) -> Option<f64> {
    m.usable_value().and(m.usage).filter(|u| u.is_finite())
}

fn summary(
    identity: &Arc<Identity>,
    last: Option<&Last>,
    failing: Option<&(Arc<str>, Timestamp)>,
    state: State,
    last_scale: Option<ScaleEvent>,
) -> Summary {
    let metric = last.and_then(|l| {
        let deciding = l.metrics.iter().filter(|m| m.proposal.is_some()).max_by_key(|m| m.proposal);
        deciding.or(l.metrics.first()).cloned()
    });
    Summary {
        identity: Arc::clone(identity),
        state,
        spec_replicas: last.map(|l| l.replicas),
        ready_replicas: last.map(|l| l.ready_replicas),
        min_replicas: last.map(|l| l.min_replicas),
        max_replicas: last.map(|l| l.max_replicas),
        metric,
        evaluated_at: last.map(|l| l.at),
        why: last.and_then(|l| l.explanation.first().map(str::to_string)),
        last_scale,
        failing: failing.map(|(why, _)| why.to_string()),
        failing_since: failing.map(|(_, since)| *since),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use watermarkd_engine::{decide, Reading, State as EngineState, Target};

    fn identity(name: &str, interval_seconds: u64) -> Identity {
        Identity {
            id: format!("file/{name}").into(),
            name: name.into(),
            namespace: "prod".into(),
            source: "file",
            target: TargetView { kind: "Deployment".into(), namespace: "prod".into(), name: name.into() },
            interval_seconds,
            dry_run: false,
            paused_until: None,
            backends: vec!["prom".into()],
            shadows: Vec::new(),
        }
    }

    fn rule() -> Rule {
        crate::domain::rules::rule_from_json(&json!({
            "min_replicas": 1, "max_replicas": 20, "algorithm": "absolute",
            "upscale_forbidden_window": "0s", "downscale_forbidden_window": "0s",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .unwrap()
    }

    /// One evaluation of `name` at second `at` with `spec` replicas and this reading.
    fn evaluate(board: &Board, name: &str, at: i64, spec: u32, reading: Option<f64>) {
        let now = Timestamp::from_unix_millis(at * 1000);
        let reading = match reading {
            Some(value) => Reading::Value { value, at: now },
            None => Reading::Unavailable { reason: "no data".into() },
        };
        let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
        let decision = decide(&rule(), target, &[reading], &EngineState::default(), now);
        let scaled = decision.action != Action::Hold;
        board.record(&format!("file/{name}"), &rule(), decision, Extras { scaled, ..Extras::default() });
    }

    #[test]
    fn the_table_says_each_autoscalers_state_and_filters_and_pages() {
        let board = Board::new(Duration::from_secs(3600));
        for name in ["a-busy", "b-calm", "c-quiet", "d-new", "e-up"] {
            board.admit(identity(name, 15));
        }
        // 30 asks for 6 and the default 50% limit allows 3; 12 asks for 3.
        evaluate(&board, "a-busy", 1_000, 2, Some(30.0));
        evaluate(&board, "b-calm", 1_000, 2, Some(7.0));
        evaluate(&board, "c-quiet", 1_000, 2, None);
        evaluate(&board, "e-up", 1_000, 2, Some(12.0));
        let all = board.list(&ListQuery { limit: 10, ..ListQuery::default() });
        let states: Vec<(&str, State)> = all.autoscalers.iter().map(|s| (s.identity.name.as_ref(), s.state)).collect();
        assert_eq!(
            states,
            [
                ("c-quiet", State::NoData),
                ("a-busy", State::Limited),
                ("e-up", State::Scaling),
                ("d-new", State::Pending),
                ("b-calm", State::Ok)
            ],
            "what needs a look first"
        );
        let by_id = board.list(&ListQuery { by_id: true, limit: 10, ..ListQuery::default() });
        let names: Vec<&str> = by_id.autoscalers.iter().map(|s| s.identity.name.as_ref()).collect();
        assert_eq!(names, ["a-busy", "b-calm", "c-quiet", "d-new", "e-up"]);
        assert!(all.autoscalers[0].metric.as_ref().is_some_and(|m| m.value.is_none()), "no value, never 0");
        let quiet = board.list(&ListQuery { state: Some(State::NoData), limit: 10, ..ListQuery::default() });
        assert_eq!((quiet.matched, quiet.total), (1, 5));
        let searched = board.list(&ListQuery { search: "CALM prod".into(), limit: 10, ..ListQuery::default() });
        assert_eq!(searched.autoscalers.len(), 1);
        let page = board.list(&ListQuery { offset: 4, limit: 2, ..ListQuery::default() });
        assert_eq!((page.matched, page.autoscalers.len()), (5, 1));
        board.remove("file/d-new");
        assert_eq!(board.list(&ListQuery { limit: 10, ..ListQuery::default() }).total, 4);
    }

    #[test]
    fn the_history_keeps_an_hour_at_the_interval_and_the_scale_events() {
        let board = Board::new(Duration::from_secs(3600));
        board.admit(identity("web", 15));
        let mut spec = 2;
        for i in 0..400 {
            let value = if (100..110).contains(&i) { 30.0 } else { 7.0 };
            evaluate(&board, "web", 1_000 + i * 15, spec, Some(value));
            if value > 10.0 {
                spec = 6.min(spec + 1);
            }
        }
        let detail = board.detail("file/web").unwrap();
        let samples = &detail.history.samples;
        assert!(samples.len() >= 241 && samples.len() < 241 + usize::from(BLOCK), "{}", samples.len());
        assert_eq!(samples.last().unwrap().at, 1_000 + 399 * 15);
        assert_eq!(samples[0].watermarks, vec![[5.0, 10.0]]);
        // The scale-up happened before the hour kept: not an event any more.
        assert!(detail.history.events.is_empty(), "{:?}", detail.history.events);
        assert_eq!(detail.summary.last_scale, None);
        assert!(board.history_bytes() < 241 * 6, "{} bytes", board.history_bytes());

        board.admit(identity("fresh", 15));
        evaluate(&board, "fresh", 1_000, 2, Some(7.0));
        evaluate(&board, "fresh", 1_015, 2, Some(30.0));
        evaluate(&board, "fresh", 1_030, 3, Some(30.0));
        let events = board.detail("file/fresh").unwrap().history.events;
        assert_eq!(
            events,
            [
                ScaleEvent { at: 1_015, from: 2, to: 3, written: true },
                ScaleEvent { at: 1_030, from: 3, to: 4, written: true }
            ]
        );
    }

    #[test]
    fn a_failed_evaluation_is_failing_until_the_next_decision() {
        let board = Board::new(Duration::from_secs(3600));
        board.admit(identity("web", 15));
        evaluate(&board, "web", 1_000, 2, Some(7.0));
        board.failed("file/web", Timestamp::from_unix_millis(1_015_000), "cannot read the target: forbidden");
        let row = board.list(&ListQuery { limit: 1, ..ListQuery::default() }).autoscalers.remove(0);
        assert_eq!((row.state, row.failing.as_deref()), (State::Failing, Some("cannot read the target: forbidden")));
        // Since the first failure, not the latest.
        board.failed("file/web", Timestamp::from_unix_millis(1_030_000), "cannot read the target: forbidden");
        let row = board.list(&ListQuery { limit: 1, ..ListQuery::default() }).autoscalers.remove(0);
        assert_eq!(row.failing_since, Some(Timestamp::from_unix_millis(1_015_000)));
        let detail = board.detail("file/web").unwrap();
        assert_eq!(detail.history.samples.last().unwrap().marks, vec!["failed"]);
        evaluate(&board, "web", 1_045, 2, Some(7.0));
        let detail = board.detail("file/web").unwrap();
        assert_eq!((detail.summary.state, detail.summary.failing_since), (State::Ok, None));
        // Reports for an autoscaler that is not on the board are dropped.
        board.failed("file/gone", Timestamp::from_unix_millis(0), "x");
        evaluate(&board, "gone", 1_000, 2, Some(7.0));
        assert!(board.detail("file/gone").is_none());
    }

    #[test]
    fn an_hour_is_kept_at_any_interval_and_no_more_than_the_cap() {
        let hour = Board::new(Duration::from_secs(3600));
        assert_eq!((hour.capacity(1), hour.capacity(15), hour.capacity(300)), (3_601, 241, BLOCK));
        assert_eq!(Board::new(Duration::from_secs(86_400)).capacity(1), MAX_SAMPLES);
    }

    #[test]
    fn without_history_only_the_last_decision_is_kept() {
        let board = Board::new(Duration::ZERO);
        board.admit(identity("web", 15));
        evaluate(&board, "web", 1_000, 2, Some(7.0));
        let detail = board.detail("file/web").unwrap();
        assert!(detail.history.samples.is_empty());
        assert!(detail.last.is_some());
        assert_eq!(board.history_bytes(), 0);
        // With the status service off, nothing at all.
        let off = Board::disabled();
        off.admit(identity("web", 15));
        evaluate(&off, "web", 1_000, 2, Some(7.0));
        assert!(off.detail("file/web").is_none());
        assert_eq!(off.list(&ListQuery { limit: 10, ..ListQuery::default() }).total, 0);
    }
}
