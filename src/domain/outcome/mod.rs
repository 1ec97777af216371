//! What one evaluation produced, in one record: what was read and decided (the engine's
//! [`Decision`], with every metric's value, band and proposal), what limited it, whether the
//! scale was written, what the forecast, fallback and pause said, what the shadow rules would
//! have done, and which WPA conditions it sets. The evaluation builds it once; everything that
//! reports (the exported series, a WPA's status and Events, the status board and page, the log
//! line) reads it and derives nothing of its own from the evaluation.
//!
//! The record of every running autoscaler is kept once, in the [`Ledger`]: the series and the
//! status board are two views of it.

mod ledger;

use std::sync::Arc;

use watermarkd_engine::{Action, Algorithm, Decision, Limit, MetricOutcome, Rule, State};

use crate::domain::claims::ClaimNote;
use crate::domain::fallback;
use crate::domain::observed::Live;
use crate::domain::status::explain::{self, Context};

pub use ledger::{
    Counters, Entry, Failure, Identity, Ledger, Recent, ScaleEvent, SeriesLabels, ShadowCount, CONDITION_TYPES,
    MAX_SAMPLES,
};

/// What became of the scale write the decision asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScaleWrite {
    /// Nothing was written: the decision holds, or it is a dry run.
    NotAttempted,
    /// The new replica count was written to the target's `/scale`.
    Succeeded,
    /// The write failed with this error; the target keeps its replicas.
    Failed(String),
}

/// What looks ahead or stands in, for an autoscaler that has a forecast (also in `observe`
/// mode, where it is reported and not used), a fallback or a pause: each field only for an
/// autoscaler that has that part.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outlook {
    /// Per metric (its name), the demand forecast `lead_time` ahead, when there is one.
    pub forecast_demand: Vec<(String, f64)>,
    /// The floor the forecast sets (or would set, observing), when it raises the rule's.
    pub forecast_replicas: Option<u32>,
    /// `Some` for an autoscaler with a fallback: whether it is in it.
    pub fallback_active: Option<bool>,
    /// `Some` for an autoscaler with `paused_until`: whether it is paused.
    pub paused: Option<bool>,
}

/// What one shadow rule made of an evaluation of its active autoscaler.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowOutcome {
    /// The shadow's name (its `shadow` label).
    pub name: Arc<str>,
    /// What it would have set.
    pub replicas: u32,
    /// Whether that differs from what the active rule set (or, in a dry run, would have).
    pub diverged: bool,
}

/// One evaluation's outcome. See the module comment.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The engine's decision. The ledger keeps it without what only the reporters before it
    /// read: see [`Outcome::reported`].
    pub decision: Decision,
    pub write: ScaleWrite,
    /// Whether the target was scaled (or would have been, in a dry run or while paused).
    pub scaled: bool,
    /// The WPA conditions this evaluation sets, by type; those it does not set keep their
    /// status.
    pub conditions: Vec<(&'static str, bool)>,
    /// The shadow rules' decisions; `None` without shadow rules.
    pub shadows: Option<Vec<ShadowOutcome>>,
    /// Whether a metric was deferred by a backend's pacing (a hold then is no news).
    pub deferred: bool,
    /// The autoscaler entered or left fallback at this evaluation.
    pub fallback: Option<fallback::Change>,
    /// Its forecast's, fallback's and pause's say, when it has one of them.
    pub ahead: Option<Outlook>,
    /// What its forecast says (`Ok`), or why it cannot forecast (`Err`).
    pub forecast_says: Option<Result<String, String>>,
    /// What the guard said: the other controllers that claim the target, and whether the write
    /// was withheld for them or taken over; `None` while no one else claims it. Boxed: most
    /// autoscalers never have one.
    pub claims: Option<Box<ClaimNote>>,
    /// For an observing autoscaler (`observe = true`), what the live controller ran beside
    /// this decision. Boxed: most autoscalers do not observe.
    pub live: Option<Box<Live>>,
    /// The bounds of the rule the decision was made with (a schedule's or a forecast's
    /// applied).
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Whether the metrics were compared with their watermarks per ready replica (an
    /// `average` rule) rather than as read.
    pub per_replica: bool,
    /// The fractions above the high and below the low watermark that still hold: the band
    /// the metrics were compared with.
    pub tolerances: (f64, f64),
    /// The decision in plain sentences, the headline first: the why of the status board,
    /// `watermarkd status` and the page.
    pub explanation: Sentences,
}

impl Outcome {
    /// The outcome as the ledger keeps it, once the log line, the Events and the persisted
    /// state have used it: without the decision's two next states (persisted), its one-line
    /// reason (logged; the status surfaces have the explanation, worded already), the texts
    /// the explanation was worded from (which metric proposed, what set the bounds), and the
    /// conditions (counted into the series' conditions). At 10,000 autoscalers these would be
    /// several MiB that nothing reads.
    pub fn reported(mut self) -> Outcome {
        self.decision.state = State::default();
        self.decision.state_if_not_written = State::default();
        self.decision.reason = String::new();
        self.decision.proposal_metric = None;
        self.decision.bounds_by = None;
        self.conditions = Vec::new();
        self
    }

    /// The outcome of a decision and nothing more: no forecast, fallback, pause or shadow, no
    /// conditions, nothing published; `scaled` says whether its scale was written. Worded with
    /// `rule`, the one it was made with.
    pub fn of_decision(decision: Decision, rule: &Rule, scaled: bool) -> Outcome {
        let bounds = (rule.min_replicas(), rule.max_replicas());
        Outcome::worded(decision, rule, Context { held: None, scaled }, bounds)
    }

    /// A decision worded with `rule` in `context`, made within `bounds` (`min_replicas`,
    /// `max_replicas` in force); the rest as [`Outcome::of_decision`] leaves it, for the
    /// caller to fill in.
    pub fn worded(decision: Decision, rule: &Rule, context: Context<'_>, bounds: (u32, u32)) -> Outcome {
        let explanation = explain::explain(&decision, rule, context);
        let scaled = context.scaled;
        Outcome {
            write: if scaled && !decision.dry_run { ScaleWrite::Succeeded } else { ScaleWrite::NotAttempted },
            decision,
            scaled,
            conditions: Vec::new(),
            shadows: None,
            deferred: false,
            fallback: None,
            ahead: None,
            forecast_says: None,
            claims: None,
            live: None,
            min_replicas: bounds.0,
            max_replicas: bounds.1,
            per_replica: rule.algorithm() == Algorithm::Average,
            tolerances: (rule.upscale_tolerance().to_f64(), rule.downscale_tolerance().to_f64()),
            explanation: Sentences::new(&explanation),
        }
    }

    /// Whether the replicas moved this way (decided, and written or only reported because of a
    /// dry run or a pause).
    pub fn moved(&self, action: Action) -> bool {
        self.decision.action == action && (self.scaled || self.paused())
    }

    /// Whether a pause (`paused_until`, `observe`) or the guard (another controller scales
    /// the target) kept this decision from being written.
    pub fn paused(&self) -> bool {
        self.ahead.as_ref().and_then(|a| a.paused) == Some(true) || self.claims.as_ref().is_some_and(|c| c.withheld)
    }

    /// Whether the declared fallback decided.
    pub fn fallback_active(&self) -> Option<bool> {
        self.ahead.as_ref().and_then(|a| a.fallback_active)
    }

    /// Seconds left of the forbidden window or delay that holds a move each way (0: none).
    pub fn blocked_seconds(&self) -> (f64, f64) {
        let t = &self.decision.timing;
        (
            t.upscale_window_seconds_left.max(t.upscale_delay_seconds_left).max(0.0),
            t.downscale_window_seconds_left.max(t.downscale_delay_seconds_left).max(0.0),
        )
    }

    /// Whether the replicas were kept from what the metrics asked for: a limit on the
    /// proposal, or a forbidden window or delay holding a move that way. The one definition
    /// of the board's `limited` state and the history's `restricted` mark.
    pub fn restricted(&self) -> bool {
        let d = &self.decision;
        let limited = d.limit != Limit::WithinRange && d.guard.is_none();
        let wanted =
            |more: bool| d.proposal.is_some_and(|p| if more { p > d.spec_replicas } else { p < d.spec_replicas });
        let (up, down) = self.blocked_seconds();
        limited || up > 0.0 && wanted(true) || down > 0.0 && wanted(false)
    }

    /// What a metric was compared with its watermarks: for an `average` rule the value per
    /// ready replica, for an `absolute` rule the value; only a usable one.
    pub fn compared_value(&self, metric: &MetricOutcome) -> Option<f64> {
        metric.usable_value().and(metric.usage).filter(|u| u.is_finite())
    }
}

/// Sentences kept as one text, a line each: one allocation per decision instead of one per
/// sentence. Given as a list, and read back from one.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(from = "Vec<String>")]
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

/// The API gives sentences as a list.
impl From<Vec<String>> for Sentences {
    fn from(sentences: Vec<String>) -> Sentences {
        Sentences::new(&sentences)
    }
}

impl serde::Serialize for Sentences {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}
