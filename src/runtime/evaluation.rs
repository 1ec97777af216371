//! One evaluation of one autoscaler as a state machine without I/O: it says what it needs
//! next ([`Need`]: the target, the API server's version of it, the persisted state, a scale
//! write, a wait for the cache), is given the answer ([`Answer`]), and ends in what to report
//! and persist ([`Done`]). `evaluate.rs` is the thin async executor that answers from the
//! cluster; the tests here answer from a fake.
//!
//! The order: settle a scale write whose outcome is unknown (the API server's version of the
//! target, then the cache's, waiting a little for the cache to catch up), read the target, restore the state when a leadership begins, decide (partial data
//! only ever scaling up), write the scale (reading the target again and deciding again on a
//! conflict, up to [`CONFLICT_ATTEMPTS`] times), then the state and the shadow rules.

use std::borrow::Cow;
use std::mem;
use std::sync::Arc;

use watermarkd_engine::{
    decide, Action, Algorithm, Decision, Guard, Position, Reading, Rule, State, Target, Timestamp,
};

use super::memory::{Memory, Persisted, ShadowMemory};
use super::source::Desired;
use crate::adapters::backend::{Observation, QueryError};
use crate::adapters::state_store;
use crate::adapters::state_store::{StateObjectError, Stored};
use crate::adapters::workload::{ScaleReading, WorkloadError};
use crate::domain::claims::{self, ClaimNote, Claims, HpaReplicas, Verdict};
use crate::domain::crd::{self, WatermarkPodAutoscaler, WatermarkPodAutoscalerStatus};
use crate::domain::fallback;
use crate::domain::forecast::{Ahead, Forecast, ForecastMode, ForecastRule, Forecaster};
use crate::domain::observed::Live;
use crate::domain::outcome::{Outcome, Outlook, ScaleWrite, ShadowOutcome};
use crate::domain::rules::{self, TargetRef};
use crate::domain::schedule;
use crate::domain::sparse::Sparse;
use crate::domain::state;
use crate::domain::status::explain::Context;

/// Attempts at a scale write that keeps meeting a newer object.
pub const CONFLICT_ATTEMPTS: usize = 3;

/// What an evaluation ended in, for the evaluations counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Scaled,
    Held,
    DryRun,
    Failed,
}

impl Ending {
    pub fn label(self) -> &'static str {
        match self {
            Ending::Scaled => "scaled",
            Ending::Held => "held",
            Ending::DryRun => "dry_run",
            Ending::Failed => "failed",
        }
    }
}

/// What the evaluation needs next.
#[derive(Debug)]
pub enum Need {
    /// The target, from the cache.
    Target,
    /// The target's resourceVersion from the API server itself: a scale write's outcome is
    /// unknown. Answered with [`Answer::ApiVersion`], or [`Answer::NoWriteBudget`].
    ApiVersion,
    /// That the cache shows this resourceVersion (waiting a little for it).
    CacheAt(String),
    /// The rules-file autoscaler's persisted state (its ConfigMap).
    PersistedState,
    /// A scale write of this many replicas, based on this reading (its resourceVersion guards
    /// the write). Answered with [`Answer::Scaled`], or [`Answer::NoWriteBudget`].
    Scale(u32, Box<ScaleReading>),
    /// That the cache shows a newer version than this one (a conflict said one exists).
    CacheAfter(String),
    /// The evaluation failed on the target: report it (see `evaluate::target_failed`).
    TargetFailed(WorkloadError),
    /// The evaluation failed on the persisted state: report it, decide next time.
    StateUnreadable(StateObjectError),
    /// The decision stands: report and persist it.
    Done(Box<Done>),
    /// Nothing to report: leadership was lost, or the hold only kept a pacing budget.
    End(Ending),
}

/// The answer to the last [`Need`].
#[derive(Debug)]
pub enum Answer {
    /// The first call: nothing asked yet.
    Start,
    /// The target, read at `now`.
    Target(Result<ScaleReading, WorkloadError>, Timestamp),
    ApiVersion(Result<String, WorkloadError>),
    /// Whether the cache reached the version asked for.
    CacheReached(bool),
    PersistedState(Result<Stored, StateObjectError>),
    /// The scale write's result, and when its success was known.
    Scaled(Result<(), WorkloadError>, Timestamp),
    /// This daemon may not write: it no longer leads, or cannot prove it does.
    NoWriteBudget,
    /// The cache moved on (or the wait for it ended).
    CacheMoved,
}

/// What an evaluation decided, for the executor to report and persist.
#[derive(Debug)]
pub struct Done {
    /// What it produced, for everything that reports it.
    pub outcome: Outcome,
    /// The state after this evaluation, as persisted.
    pub next_state: State,
    pub ending: Ending,
}

#[derive(Debug)]
enum Phase {
    /// Settling an unknown write: asking the API server for the target's version.
    SettleAsk,
    /// Settling: reading the target from the cache, to compare with the API server's version.
    SettleRead(String),
    /// Settling: waiting for the cache to reach the API server's version.
    SettleWait(String),
    /// Reading the target (the main loop).
    Read,
    /// Reading the persisted state, on this reading, taken at that time.
    Restore(ScaleReading, Timestamp),
    /// Writing the scale, for this decision.
    Write(Box<Pending>),
    /// Waiting for the cache to move on after a conflict.
    Refresh,
    Over,
}

/// A decision waiting for its write.
#[derive(Debug)]
struct Pending {
    reading: ScaleReading,
    decision: Decision,
    observed: Target,
    current: State,
    now: Timestamp,
    /// The autoscaler entered or left fallback at this evaluation.
    fallback: Option<fallback::Change>,
    /// The series of its forecast, fallback and pause, when it has one of them.
    ahead: Option<Outlook>,
    /// What its forecast says (`Ok`), or why it cannot forecast (`Err`), when it has one.
    forecast_says: Option<Result<String, String>>,
    /// `min_replicas` and `max_replicas` in force: the rule's, or a schedule's or forecast's.
    bounds: (u32, u32),
    /// Why it wrote nothing, said after "but": a pause, observing, or the guard.
    held: Option<String>,
    /// What the guard said, when another controller claims the target (or may).
    claims: Option<Box<ClaimNote>>,
    /// For an observing autoscaler, what the live controller ran.
    live: Option<Box<Live>>,
    /// Nothing is written and nothing counts as written: it observes, or the guard holds it
    /// for another controller. Its would-be scale starts no forbidden window (the windows run
    /// from the target's real scales, as a shadow rule's do), so the count it would set is
    /// what it would set from what runs, and a cut-over is not held by a scale that never was.
    unwritten: bool,
}

/// One evaluation: its inputs, and how far it has got.
pub struct Evaluation<'a> {
    desired: &'a Desired,
    /// The autoscaler's rule, or a dry-run copy of it under `--dry-run`.
    rule: Cow<'a, Rule>,
    readings: Vec<Reading>,
    /// Partial readings (lower bounds), by index, with why.
    partial: Vec<(usize, String)>,
    shadow_observations: Vec<Observation>,
    deferred: bool,
    /// What the guard lets it do, from what the claim index knew of the target when the
    /// evaluation began.
    verdict: Verdict,
    /// For an observing autoscaler, the HPA that scales its target, by its `claimed_by` label,
    /// with what it last said it did.
    live_hpa: Option<(String, HpaReplicas)>,
    /// The leadership epoch of this evaluation.
    epoch: u64,
    attempt: usize,
    phase: Phase,
}

impl<'a> Evaluation<'a> {
    /// An evaluation of `desired` on `observations` (its metrics', then its shadows'), in
    /// leadership `epoch`; `dry_run` as the daemon's `--dry-run`; `claims`, what the claim
    /// index knows of its target (the guard withholds the write when another controller
    /// scales it, or may).
    pub fn new(
        desired: &'a Desired,
        mut observations: Vec<Observation>,
        epoch: u64,
        dry_run: bool,
        claims: Claims,
    ) -> Self {
        let autoscaler = &desired.autoscaler;
        let shadow_observations = observations.split_off(autoscaler.rule.metrics().len().min(observations.len()));
        // Skipped by the Datadog pacing: the engine holds, but nothing failed.
        let deferred = observations.iter().any(|o| matches!(o.detail.error, Some(QueryError::Deferred { .. })));
        let (readings, partial) = readings_of(observations);
        let rule = if dry_run {
            Cow::Owned(autoscaler.rule.clone().with_dry_run(true))
        } else {
            Cow::Borrowed(&autoscaler.rule)
        };
        let verdict = claims::guard(claims, autoscaler.take_over, autoscaler.observe);
        Evaluation {
            desired,
            rule,
            readings,
            partial,
            shadow_observations,
            deferred,
            verdict,
            live_hpa: None,
            epoch,
            attempt: 0,
            phase: Phase::Read,
        }
    }

    /// What the HPA on the target last said it did, for an observing autoscaler to record
    /// beside its decisions.
    pub fn beside(mut self, hpa: Option<(String, HpaReplicas)>) -> Self {
        self.live_hpa = hpa;
        self
    }

    /// What the live controller ran beside this decision: the target's replicas as read, and
    /// who set them (the HPA the evaluation was handed, else the first other controller the
    /// guard found).
    fn live(&self, spec_replicas: u32) -> Live {
        let claimant = match &self.verdict {
            Verdict::Observe(claimants) => claimants.first().map(|c| Arc::from(c.label())),
            _ => None,
        };
        let hpa = self.live_hpa.as_ref();
        Live {
            controller: hpa.map(|(label, _)| Arc::from(label.as_str())).or(claimant),
            replicas: spec_replicas,
            desired: hpa.and_then(|(_, r)| r.desired),
            current: hpa.and_then(|(_, r)| r.current),
        }
    }

    /// The next need, given the answer to the last one. After `TargetFailed`,
    /// `StateUnreadable`, `Done` or `End` the evaluation is over.
    pub fn resume(&mut self, memory: &mut Memory, answer: Answer) -> Need {
        let phase = mem::replace(&mut self.phase, Phase::Over);
        match (phase, answer) {
            (Phase::Read, Answer::Start) if memory.unconfirmed_write.is_some() => {
                self.ask(Phase::SettleAsk, Need::ApiVersion)
            }
            (Phase::Read, Answer::Start) | (Phase::Refresh, Answer::CacheMoved) => self.read(),
            (Phase::SettleAsk, Answer::NoWriteBudget) | (Phase::Write(_), Answer::NoWriteBudget) => {
                // Leadership was lost, or can no longer be proven: the leader decides.
                Need::End(Ending::Held)
            }
            (Phase::SettleAsk, Answer::ApiVersion(Err(why))) => {
                Need::TargetFailed(WorkloadError::Unsettled(format!("the API server cannot say which yet: {why}")))
            }
            (Phase::SettleAsk, Answer::ApiVersion(Ok(current))) => self.ask(Phase::SettleRead(current), Need::Target),
            (Phase::SettleRead(_), Answer::Target(Err(err), _)) | (Phase::Read, Answer::Target(Err(err), _)) => {
                Need::TargetFailed(err)
            }
            (Phase::SettleRead(current), Answer::Target(Ok(reading), _)) if current != reading.resource_version => {
                self.ask(Phase::SettleWait(current.clone()), Need::CacheAt(current))
            }
            (Phase::SettleRead(_), Answer::Target(Ok(_), _)) | (Phase::SettleWait(_), Answer::CacheReached(true)) => {
                memory.unconfirmed_write = None;
                self.read()
            }
            (Phase::SettleWait(version), Answer::CacheReached(false)) => Need::TargetFailed(WorkloadError::Unsettled(
                format!("the watch does not show resourceVersion {version} yet"),
            )),
            (Phase::Read, Answer::Target(Ok(reading), now)) => self.restore_or_decide(memory, reading, now),
            (Phase::Restore(..), Answer::PersistedState(Err(err))) => Need::StateUnreadable(err),
            (Phase::Restore(reading, now), Answer::PersistedState(Ok(stored))) => {
                self.restored(memory, Some(stored), &reading, now);
                self.decide(memory, reading, now)
            }
            (Phase::Write(pending), Answer::Scaled(result, confirmed)) => {
                self.written(memory, *pending, result, confirmed)
            }
            (phase, answer) => {
                // The executor answers each need with its answer: anything else is a bug there,
                // and ends the evaluation without a decision rather than deciding on a guess.
                tracing::error!(?phase, ?answer, "evaluation answered out of turn; holding");
                Need::End(Ending::Failed)
            }
        }
    }

    fn ask(&mut self, phase: Phase, need: Need) -> Need {
        self.phase = phase;
        need
    }

    fn read(&mut self) -> Need {
        self.attempt += 1;
        self.ask(Phase::Read, Need::Target)
    }

    /// On a reading: the state first, when this leadership has not restored it yet.
    fn restore_or_decide(&mut self, memory: &mut Memory, reading: ScaleReading, now: Timestamp) -> Need {
        if memory.state.is_some() && memory.epoch == self.epoch {
            return self.decide(memory, reading, now);
        }
        if memory.epoch != self.epoch {
            // Another daemon may have led meanwhile: what it wrote is in the cluster.
            memory.persisted.forget();
        }
        match memory.persisted {
            Persisted::ConfigMap { .. } => self.ask(Phase::Restore(reading, now), Need::PersistedState),
            Persisted::Status { .. } => {
                self.restored(memory, None, &reading, now);
                self.decide(memory, reading, now)
            }
        }
    }

    /// Restores the state from what was found (a WPA's from its status).
    fn restored(&mut self, memory: &mut Memory, stored: Option<Stored>, reading: &ScaleReading, now: Timestamp) {
        let found = stored.map_or(Found::Nowhere, |stored| found_text(self.desired, stored, reading));
        restore(self.desired, memory, found, reading, now);
        memory.epoch = self.epoch;
        memory.suspicion.leading_since = Some(now);
    }

    fn decide(&mut self, memory: &mut Memory, reading: ScaleReading, now: Timestamp) -> Need {
        let mut current = memory.state.clone().unwrap_or_default();
        // A scale of ours this process does not know of (a write that timed out and landed
        // anyway, or another daemon's while it led) starts the window from when it landed, or
        // from when it was seen.
        state::note_recorded_scale(&mut current, &reading.marks, now);
        state::note_unaccounted_change(
            &mut current,
            reading.spec_replicas,
            reading.spec_changed_at,
            &memory.suspicion,
            now,
        );
        let observed = Target {
            spec_replicas: reading.spec_replicas,
            status_replicas: Some(reading.status_replicas),
            ready_replicas: reading.ready_replicas,
        };
        // A schedule's window sets the bounds of this decision, a forecast may raise its floor,
        // and a pause keeps it from writing.
        let mut rule = schedule::rule_at(&self.rule, &self.desired.autoscaler.schedules, now);
        let autoscaler = &self.desired.autoscaler;
        let mut ahead = Outlook::default();
        // What the forecast says, for a WPA's status.
        let mut says = None;
        if let Some(forecast) = autoscaler.forecast.as_deref() {
            let forecaster = memory.forecaster.get_or_insert_with(Box::default);
            let ready = observed.ready_replicas.unwrap_or(observed.spec_replicas).min(observed.spec_replicas);
            forecaster.observe(&self.rule, &self.readings, ready, now);
            let said = forecaster.floor(&rule, forecast, observed.spec_replicas, now);
            ahead.forecast_demand = self
                .rule
                .metrics()
                .iter()
                .zip(&said.forecasts)
                .filter_map(|(metric, forecast)| match forecast {
                    Forecast::Ready { demand, .. } => Some((metric.name.clone(), *demand)),
                    Forecast::Unable(_) => None,
                })
                .collect();
            ahead.forecast_replicas = said.floor;
            says = Some(forecast_says(&self.rule, forecast, &said));
            rule = Forecaster::apply(rule, forecast, &said);
        }
        // The guard holds a write the way a pause does: it decides and reports as always.
        let claims = ClaimNote::of(&self.verdict, &describe(&autoscaler.target));
        let withheld = claims.as_ref().and_then(|c| c.held().map(str::to_string));
        let pause = autoscaler.pause_note(now).or_else(|| withheld.clone());
        let held = if autoscaler.paused_at(now) {
            // As the status has always said a pause: the instant as the engine prints it.
            let until = autoscaler.paused_until.map(|t| t.to_string()).unwrap_or_default();
            Some(if autoscaler.observe { rules::OBSERVING.to_string() } else { format!("paused until {until}") })
        } else {
            withheld
        };
        if pause.is_some() && !rule.dry_run() {
            rule = Cow::Owned(rule.into_owned().with_dry_run(true));
        }
        let bounds = (rule.min_replicas(), rule.max_replicas());
        let (mut decision, change) = self.decide_with_fallback(memory, rule, observed, &current, now);
        if let Some(pause) = pause {
            decision.reason = format!("{pause}: {}", decision.reason);
        }
        ahead.fallback_active =
            autoscaler.fallback.as_ref().map(|_| memory.fallback.as_ref().is_some_and(|f| f.is_active()));
        ahead.paused = autoscaler.pausable().then(|| autoscaler.paused_at(now));
        let looks_ahead = autoscaler.forecast.is_some() || ahead.fallback_active.is_some() || ahead.paused.is_some();
        let ahead = looks_ahead.then_some(ahead);
        for (i, why) in &self.partial {
            let kept = decision.metrics.get(*i).filter(|m| m.position == Position::Above);
            if let (Some(metric), true) = (kept, decision.action == Action::ScaleUp) {
                tracing::info!(
                    autoscaler = %self.desired.autoscaler.name,
                    metric = %metric.name,
                    "scaling up on partial data: {why}"
                );
            }
        }
        let claims = claims.map(Box::new);
        let live = autoscaler.observe.then(|| Box::new(self.live(observed.spec_replicas)));
        let unwritten = autoscaler.observe || claims.as_ref().is_some_and(|c| c.withheld);
        let pending = Pending {
            reading,
            decision,
            observed,
            current,
            now,
            fallback: change,
            ahead,
            forecast_says: says,
            bounds,
            held,
            claims,
            live,
            unwritten,
        };
        if pending.decision.write {
            let need = Need::Scale(pending.decision.replicas, Box::new(pending.reading.clone()));
            return self.ask(Phase::Write(Box::new(pending)), need);
        }
        self.finish(memory, pending, ScaleWrite::NotAttempted, None)
    }

    /// Decides under the autoscaler's fallback, when it declares one: whether any metric was
    /// usable moves it in or out of fallback, and a decision made as that changed is made
    /// again under the new state.
    fn decide_with_fallback(
        &self,
        memory: &mut Memory,
        rule: Cow<'_, Rule>,
        observed: Target,
        current: &State,
        now: Timestamp,
    ) -> (Decision, Option<fallback::Change>) {
        let decide = |rule: &Rule| decide_on_partial_data(rule, observed, &self.readings, &self.partial, current, now);
        let Some(declared) = self.desired.autoscaler.fallback.as_deref() else { return (decide(&rule), None) };
        memory.fallback.get_or_insert_with(Box::default).decide(declared, &rule, now, decide)
    }

    fn written(
        &mut self,
        memory: &mut Memory,
        written: Pending,
        result: Result<(), WorkloadError>,
        confirmed: Timestamp,
    ) -> Need {
        match result {
            Ok(()) => {
                memory.suspicion.written = Some(written.decision.replicas);
                // The forbidden window starts when the write is known to have landed.
                self.finish(memory, written, ScaleWrite::Succeeded, Some(confirmed))
            }
            Err(WorkloadError::Conflict { .. }) if self.attempt < CONFLICT_ATTEMPTS => {
                tracing::info!(
                    autoscaler = %self.desired.autoscaler.name,
                    workload = %describe(&self.desired.autoscaler.target),
                    "the target changed since it was read; reading it again and deciding again"
                );
                self.ask(Phase::Refresh, Need::CacheAfter(written.reading.resource_version))
            }
            Err(err) => {
                if err.outcome_unknown() {
                    // It may land yet: the next evaluation first finds out what the API
                    // server has.
                    memory.unconfirmed_write = Some(written.reading.resource_version.clone());
                    memory.suspicion.unconfirmed_since = Some(written.now);
                }
                self.finish(memory, written, ScaleWrite::Failed(err.to_string()), None)
            }
        }
    }

    fn finish(
        &mut self,
        memory: &mut Memory,
        pending: Pending,
        write: ScaleWrite,
        confirmed: Option<Timestamp>,
    ) -> Need {
        let Pending {
            decision,
            observed,
            current,
            now,
            fallback,
            ahead,
            forecast_says,
            bounds,
            held,
            claims,
            live,
            unwritten,
            ..
        } = pending;
        let mut next_state = match write {
            ScaleWrite::Failed(_) => decision.state_if_not_written.clone(),
            _ if unwritten => decision.state_if_not_written.clone(),
            _ => decision.state.clone(),
        };
        if let Some(confirmed) = confirmed {
            state::stamp_confirmed_scale(&mut next_state, now, confirmed);
        }
        memory.state = Some(next_state.clone());
        if memory.unconfirmed_write.is_none() {
            // Settled: what landed is in the state now.
            memory.suspicion.unconfirmed_since = None;
        }
        let scaled = decision.action != Action::Hold && (decision.dry_run || write == ScaleWrite::Succeeded);
        log_decision(self.desired, memory, &decision, &write);
        if paced_hold(self.deferred, &decision) {
            // Skipped to stay within the Datadog budget: nothing failed and nothing is known
            // that was not known last time, so the series, the WPA conditions and the persisted
            // state stay as the last real evaluation left them.
            return Need::End(Ending::Held);
        }
        // The conditions this evaluation sets (a WPA's status shows them too); the metrics keep
        // the status of those it does not set.
        let conditions = crd::conditions(&decision, &write);
        let shadows = (!self.desired.shadows.is_empty()).then(|| {
            let observations = mem::take(&mut self.shadow_observations);
            evaluate_shadows(self.desired, memory, observed, observations, (&current, &decision, &next_state), now)
        });
        let ending = match (&write, decision.action) {
            (ScaleWrite::Failed(_), _) => Ending::Failed,
            (_, Action::Hold) => Ending::Held,
            _ if decision.dry_run => Ending::DryRun,
            _ => Ending::Scaled,
        };
        let rule = &*self.rule;
        let context = Context { held: held.as_deref(), scaled };
        let outcome = Outcome {
            write,
            conditions,
            shadows,
            deferred: self.deferred,
            fallback,
            ahead,
            forecast_says,
            claims,
            live,
            ..Outcome::worded(decision, rule, context, bounds)
        };
        Need::Done(Box::new(Done { outcome, next_state, ending }))
    }
}

/// A status whose only change is `currentMetrics` is written at most this often.
pub const METRICS_STATUS_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// What a decision leaves to persist, where the autoscaler keeps its state, with the place in
/// its memory that records it once written ([`Persist::stored`]).
#[derive(Debug)]
pub enum Persist<'m> {
    /// The state, encoded, to the target's state ConfigMap.
    ConfigMap { text: String, written: &'m mut Option<state::Written> },
    /// The next status, to the WPA.
    Status {
        wpa: &'m Arc<WatermarkPodAutoscaler>,
        next: Box<WatermarkPodAutoscalerStatus>,
        status: &'m mut Option<Box<WatermarkPodAutoscalerStatus>>,
        written_at: &'m mut Option<tokio::time::Instant>,
    },
}

impl Persist<'_> {
    /// Records that it was written (at `at`), so that it is not written again until it changes.
    pub fn stored(self, next_state: &State, at: tokio::time::Instant) {
        match self {
            Persist::ConfigMap { written, .. } => *written = Some(state::Written::of(next_state)),
            Persist::Status { next, status, written_at, .. } => {
                *status = Some(next);
                *written_at = Some(at);
            }
        }
    }
}

/// What `done` leaves to persist, if anything: for a rules-file autoscaler the state when it
/// changed in what a later decision depends on (never in a dry run, which writes nothing);
/// for a WPA the status when it changed, a change of the metrics alone at most every
/// [`METRICS_STATUS_PERIOD`]. `now` is the status's time, `at` this process's clock.
pub fn to_persist<'m>(
    desired: &Desired,
    persisted: &'m mut Persisted,
    done: &Done,
    now: Timestamp,
    at: tokio::time::Instant,
) -> Option<Persist<'m>> {
    let decision = &done.outcome.decision;
    match persisted {
        Persisted::ConfigMap { written } => {
            let rule = &desired.autoscaler.rule;
            if decision.dry_run || !state::needs_write(written.as_ref(), &done.next_state, rule, decision.now) {
                return None;
            }
            let text = state::encode_annotation(&desired.autoscaler.name, &done.next_state);
            Some(Persist::ConfigMap { text, written })
        }
        Persisted::Status { wpa, status, written_at } => {
            let previous = status.as_deref().cloned().or_else(|| wpa.status.clone());
            let mut next = crd::next_status(previous.as_ref(), &wpa.spec, decision, &done.outcome.write, now);
            if let Some(ahead) = &done.outcome.ahead {
                let forecast = done.outcome.forecast_says.as_ref().map(|says| says.as_deref().map_err(String::as_str));
                crd::with_ahead(&mut next, forecast, ahead.fallback_active, now);
            }
            if let Some(note) = &done.outcome.claims {
                crd::with_claims(&mut next, note, now);
            }
            if !crd::status_changed(previous.as_ref(), &next) {
                return None;
            }
            let only_metrics = previous.as_ref().is_some_and(|p| {
                let mut same = p.clone();
                same.current_metrics = next.current_metrics.clone();
                same == next
            });
            if only_metrics && written_at.is_some_and(|when| at.saturating_duration_since(when) < METRICS_STATUS_PERIOD)
            {
                return None;
            }
            Some(Persist::Status { wpa, next: Box::new(next), status, written_at })
        }
    }
}

/// What a forecast says, in a sentence for a WPA's status: per metric what it expects, and the
/// floor; or, when no metric could be forecast, why.
fn forecast_says(rule: &Rule, forecast: &ForecastRule, said: &Ahead) -> Result<String, String> {
    let lead = humantime::format_duration(forecast.lead_time);
    let mut expects = Vec::new();
    let mut unable = Vec::new();
    for (metric, forecast) in rule.metrics().iter().zip(&said.forecasts) {
        match forecast {
            Forecast::Ready { demand, .. } => expects.push(format!("{} {demand:.1}", metric.name)),
            Forecast::Unable(why) => unable.push(format!("{}: {why}", metric.name)),
        }
    }
    if expects.is_empty() {
        return Err(unable.join("; "));
    }
    let floor = said.floor.map_or_else(|| "no floor above the rule's".into(), |f| format!("a floor of {f} replicas"));
    let mode = match forecast.mode {
        ForecastMode::Observe => " (observed only)",
        ForecastMode::Scale => "",
    };
    Ok(format!("expects {} in {lead}: {floor}{mode}", expects.join(", ")))
}

/// Where a rules-file autoscaler's persisted state was found.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// Its ConfigMap (`state::configmap`).
    ConfigMap(String),
    /// The `watermarkd.io/state` annotation on the target, as earlier versions wrote it: read
    /// only while there is no ConfigMap, and written to one at the next chance.
    Annotation(String),
    /// Nowhere (or the autoscaler comes from a WPA, whose status the restore reads).
    Nowhere,
}

/// What the target's ConfigMap held, or else the annotation an earlier version left on the
/// target.
fn found_text(desired: &Desired, stored: Stored, reading: &ScaleReading) -> Found {
    let autoscaler = &desired.autoscaler;
    match stored {
        Stored::State(text) => return Found::ConfigMap(text),
        Stored::Absent => {}
        Stored::OtherTarget(about) => tracing::warn!(
            autoscaler = %autoscaler.name,
            workload = %describe(&autoscaler.target),
            configmap = %state_store::object_name(&autoscaler.target),
            about = about.as_deref().unwrap_or("no target"),
            "the state ConfigMap of this target's name is about another target; ignoring it"
        ),
    }
    reading.marks.state_annotation.clone().map_or(Found::Nowhere, Found::Annotation)
}

/// The state a (re)started daemon, or a new leader, continues from.
fn restore(desired: &Desired, memory: &mut Memory, found: Found, reading: &ScaleReading, now: Timestamp) {
    let autoscaler = &desired.autoscaler;
    let persisted = match &mut memory.persisted {
        Persisted::Status { wpa, status, .. } => {
            if status.is_none() {
                *status = wpa.status.clone().map(Box::new);
            }
            state::from_wpa_status(status.as_deref())
        }
        Persisted::ConfigMap { written } => {
            let (text, in_configmap) = match &found {
                Found::ConfigMap(text) => (Some(text.as_str()), true),
                Found::Annotation(text) => (Some(text.as_str()), false),
                Found::Nowhere => (None, true),
            };
            let decoded = match text {
                None => None,
                Some(text) => match state::decode_annotation(&autoscaler.name, text) {
                    Ok(decoded) => decoded,
                    Err(err) => {
                        tracing::warn!(
                            autoscaler = %autoscaler.name,
                            workload = %describe(&autoscaler.target),
                            error = %err,
                            "ignoring the persisted state; the autoscaler starts without one"
                        );
                        None
                    }
                },
            };
            let restored = decoded.as_ref().map(|d| d.state.clone()).unwrap_or_default();
            // A state in an older format, or still on the target's annotation, is written again
            // in the current format, to the ConfigMap, at the next evaluation that has anything
            // to keep.
            *written = match &decoded {
                Some(decoded) if decoded.legacy || !in_configmap => None,
                _ => Some(state::Written::of(&restored)),
            };
            restored
        }
    };
    let restored = state::restore(persisted, &reading.marks, &autoscaler.rule, now);
    if !restored.future.is_empty() {
        tracing::warn!(
            autoscaler = %autoscaler.name,
            workload = %describe(&autoscaler.target),
            fields = %restored.future.join(", "),
            "the persisted state holds times after now (clock skew, or an edited annotation or status): \
             taking them as now, so no window holds longer than its length from here"
        );
    }
    tracing::debug!(autoscaler = %autoscaler.name, state = ?restored.state, "state restored");
    memory.state = Some(restored.state);
}

/// The readings of observations, and which of them are partial (a lower bound), with why.
fn readings_of(observations: Vec<Observation>) -> (Vec<Reading>, Vec<(usize, String)>) {
    let partial = observations.iter().enumerate().filter_map(|(i, o)| Some((i, o.detail.partial.clone()?))).collect();
    (observations.into_iter().map(|o| o.reading).collect(), partial)
}

/// Decides each shadow rule on its readings (taken in the same cycle as the active rule's, and
/// the same answers where the queries are the same), against the same observation of the
/// target and at the same instant, and compares it with what the active rule decided. Nothing
/// is written. A shadow keeps its own delays and stabilization history, while its windows
/// count from the target's real scales (the active rule's `active` states before and after
/// this decision), since that is the workload it would have taken over.
fn evaluate_shadows(
    desired: &Desired,
    memory: &mut Memory,
    target: Target,
    observations: Vec<Observation>,
    active: (&State, &Decision, &State),
    now: Timestamp,
) -> Vec<ShadowOutcome> {
    let (before, decision, after) = active;
    let mut kept = memory.shadows.take();
    let mut observations = observations.into_iter();
    let mut memories = Vec::with_capacity(desired.shadows.len());
    let mut outcomes = Vec::with_capacity(desired.shadows.len());
    for shadow in desired.shadows.iter() {
        let rule = &shadow.autoscaler.rule;
        let (readings, partial) = readings_of(observations.by_ref().take(rule.metrics().len()).collect());
        let mut own = match kept.iter().position(|m| m.autoscaler == shadow.autoscaler) {
            Some(i) => kept.swap_remove(i),
            None => ShadowMemory {
                autoscaler: shadow.autoscaler.clone(),
                state: State {
                    last_scale_time: before.last_scale_time,
                    scale_events: before.scale_events.clone(),
                    ..State::default()
                },
                diverging: false,
            },
        };
        let rule = schedule::rule_at(rule, &shadow.autoscaler.schedules, now);
        let would = decide_on_partial_data(&rule, target, &readings, &partial, &own.state, now);
        let diverged = would.replicas != decision.replicas;
        if diverged != own.diverging {
            tracing::info!(
                autoscaler = %desired.autoscaler.name,
                shadow = %shadow.name,
                active_replicas = decision.replicas,
                shadow_replicas = would.replicas,
                shadow_reason = %would.reason,
                "{}",
                if diverged { "the shadow rule diverges from the active rule" } else { "the shadow rule agrees again" }
            );
        } else {
            tracing::debug!(
                autoscaler = %desired.autoscaler.name,
                shadow = %shadow.name,
                shadow_replicas = would.replicas,
                shadow_reason = %would.reason,
                "shadow decision"
            );
        }
        own.diverging = diverged;
        own.state = State {
            last_scale_time: after.last_scale_time,
            scale_events: after.scale_events.clone(),
            ..would.state_if_not_written
        };
        outcomes.push(ShadowOutcome { name: shadow.name.clone(), replicas: would.replicas, diverged });
        memories.push(own);
    }
    memory.shadows = Sparse::from(memories);
    outcomes
}

/// Decides, with partial readings (lower bounds: some pods had no usable sample) used only to
/// scale up. A partial reading that is not above its band cannot tell where the metric is, so
/// it becomes unavailable (the engine then never goes below `spec` on the other metrics); and if
/// the result would still be a scale-down (the maximum bound, say), every partial reading does.
/// The HPA instead assumes the missing pods at 0% for a scale-up and at 100% of their request
/// for a scale-down; a watermark has no request to assume, so missing data never scales down.
fn decide_on_partial_data(
    rule: &Rule,
    target: Target,
    readings: &[Reading],
    partial: &[(usize, String)],
    state: &State,
    now: Timestamp,
) -> Decision {
    let decision = decide(rule, target, readings, state, now);
    if partial.is_empty() {
        return decision;
    }
    let unusable = |why: &str| Reading::Unavailable {
        reason: format!("partial data, which can show usage above the band only: {why}"),
    };
    let mut readings = readings.to_vec();
    let mut changed = false;
    for (i, why) in partial {
        let above = decision.metrics.get(*i).is_some_and(|m| m.position == Position::Above);
        if let (false, Some(reading)) = (above, readings.get_mut(*i)) {
            *reading = unusable(why);
            changed = true;
        }
    }
    let decision = if changed { decide(rule, target, &readings, state, now) } else { decision };
    if decision.action != Action::ScaleDown {
        return decision;
    }
    for (i, why) in partial {
        if let Some(reading) = readings.get_mut(*i) {
            *reading = unusable(why);
        }
    }
    decide(rule, target, &readings, state, now)
}

/// A hold only because Datadog pacing deferred the queries this turn (no metric was usable and
/// at least one was deferred): not a failure, and not news.
fn paced_hold(deferred: bool, decision: &Decision) -> bool {
    deferred && decision.guard == Some(Guard::NoData) && decision.action == Action::Hold
}

fn log_decision(desired: &Desired, memory: &mut Memory, decision: &Decision, write: &ScaleWrite) {
    let autoscaler = &desired.autoscaler;
    let values: Vec<String> = decision
        .metrics
        .iter()
        .map(|m| metric_for_log(m, autoscaler.rule.algorithm(), decision.ready_replicas))
        .collect();
    let done = match (write, decision.action) {
        (ScaleWrite::Succeeded, _) => "scaled",
        (ScaleWrite::Failed(_), _) => "scale failed",
        (_, Action::Hold) => "held",
        _ => "dry run",
    };
    // Reasons carry countdowns and ages ("resets in 12s", "40s old") that change every turn:
    // only a change in what the reason says, not in its numbers, is news.
    let shape = reason_shape(&decision.reason);
    let shape = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        shape.hash(&mut hasher);
        hasher.finish()
    };
    let changed = memory.last_reason != Some(shape);
    memory.last_reason = Some(shape);
    let error = match write {
        ScaleWrite::Failed(err) => Some(err.as_str()),
        _ => None,
    };
    // A hold that says what the previous one said is only worth a debug line.
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                autoscaler = %autoscaler.name,
                workload = %describe(&autoscaler.target),
                metrics = %values.join("; "),
                proposal = ?decision.proposal,
                limit = ?decision.limit,
                from = decision.spec_replicas,
                to = decision.replicas,
                result = done,
                error,
                reason = %decision.reason,
                "decision"
            )
        };
    }
    if decision.action != Action::Hold || changed || error.is_some() {
        line!(info);
    } else {
        line!(debug);
    }
}

/// One metric for the decision's log line: the quantity compared with the band (per ready
/// replica for an `average` rule, with the total it came from), the band as written, and the
/// band the tolerance widened it to when it differs.
fn metric_for_log(m: &watermarkd_engine::MetricOutcome, algorithm: Algorithm, ready: u32) -> String {
    let (Some(value), Some(usage)) = (m.usable_value(), m.usage) else {
        return format!("{}=unavailable ({})", m.name, m.note.as_deref().unwrap_or("no value"));
    };
    let compared = match algorithm {
        Algorithm::Absolute => format!("{}={value}", m.name),
        Algorithm::Average => format!("{} per replica={usage} ({value} over {ready} ready)", m.name),
    };
    let widened = if (m.band_low, m.band_high) == (m.low_watermark, m.high_watermark) {
        String::new()
    } else {
        format!(" (with the tolerance [{}, {}])", m.band_low, m.band_high)
    };
    format!("{compared} band [{}, {}]{widened} {:?}", m.low_watermark, m.high_watermark, m.position)
}

/// The reason with every number replaced by `#`.
fn reason_shape(reason: &str) -> String {
    let mut shape = String::with_capacity(reason.len());
    let mut in_number = false;
    for c in reason.chars() {
        let part_of_number = c.is_ascii_digit() || (in_number && c == '.');
        if part_of_number {
            if !in_number {
                shape.push('#');
            }
        } else {
            shape.push(c);
        }
        in_number = part_of_number;
    }
    shape
}

pub fn describe(target: &TargetRef) -> String {
    format!("{} {}/{}", target.kind, target.namespace, target.name)
}

#[cfg(test)]
mod machine_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::{Reading, Target, Timestamp};

    #[test]
    fn reasons_differing_only_in_numbers_have_one_shape() {
        let a = reason_shape("latency unavailable: rate limited: the budget resets in 12s");
        let b = reason_shape("latency unavailable: rate limited: the budget resets in 9s");
        assert_eq!(a, b);
        assert_eq!(reason_shape("value 0.52 > 0.40 (+1%), 40s old."), "value # > # (+#%), #s old.");
        assert_ne!(reason_shape("above high watermark: 5"), reason_shape("below low watermark: 5"));
    }

    #[test]
    fn only_a_hold_for_want_of_data_while_deferred_is_a_paced_hold() {
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10,
            "metric": [{ "query": "q", "high_watermark": 10.0, "low_watermark": 5.0 }]
        }))
        .expect("rule");
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let deferred = QueryError::Deferred { stretched_interval_seconds: 30 };
        let none = [Reading::Unavailable { reason: deferred.to_string() }];
        let held = decide(&rule, target, &none, &State::default(), now);
        assert!(paced_hold(true, &held));
        assert!(!paced_hold(false, &held), "an outage is news");
        let high = [Reading::Value { value: 30.0, at: now }];
        let scaled = decide(&rule, target, &high, &State::default(), now);
        assert!(!paced_hold(true, &scaled));
    }

    #[test]
    fn partial_data_scales_up_and_never_down() {
        let rule = |max: u32| {
            crate::domain::rules::rule_from_json(&serde_json::json!({
                "min_replicas": 1, "max_replicas": max,
                "downscale_forbidden_window": "1s", "upscale_forbidden_window": "1s",
                "metric": [{ "query": "cpu", "high_watermark": 1.0, "low_watermark": 0.5 }]
            }))
            .expect("rule")
        };
        let target = Target { spec_replicas: 4, status_replicas: Some(4), ready_replicas: Some(4) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let partial = [(0, "1 of the 4 pods that count have no usable metrics".to_string())];
        let at = |value: f64| [Reading::Value { value, at: now }];
        let decide_at = |max: u32, value: f64, target: Target| {
            decide_on_partial_data(&rule(max), target, &at(value), &partial, &State::default(), now)
        };
        // Above even with the missing pod at 0: up, on the lower bound.
        let up = decide_at(10, 2.0, target);
        assert_eq!((up.action, up.replicas), (Action::ScaleUp, 6), "{}", up.reason);
        // Below: it could be anywhere, so no value at all, and a hold.
        let below = decide_at(10, 0.1, target);
        assert_eq!(below.action, Action::Hold, "{}", below.reason);
        assert!(
            below.metrics[0].note.as_deref().unwrap_or_default().starts_with("partial data, which can show usage"),
            "{:?}",
            below.metrics[0]
        );
        let inside = decide_at(10, 0.7, target);
        assert_eq!((inside.action, inside.metrics[0].position), (Action::Hold, Position::Unavailable));
        // Above the band but above the maximum too: the bound would scale down; not on partial data.
        let over = Target { spec_replicas: 12, status_replicas: Some(12), ready_replicas: Some(12) };
        let bounded = decide_at(10, 5.0, over);
        assert_eq!(bounded.action, Action::Hold, "{}", bounded.reason);
        // The same reading complete does all of that.
        let complete = decide(&rule(10), target, &at(0.1), &State::default(), now);
        assert_eq!(complete.action, Action::ScaleDown);
        let complete = decide(&rule(10), over, &at(5.0), &State::default(), now);
        assert_eq!((complete.action, complete.replicas), (Action::ScaleDown, 10));
    }
}
