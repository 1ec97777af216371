//! One evaluation of one autoscaler, its metrics already queried: read the target from the
//! cache, decide, write the scale (re-reading and deciding again on a conflict), persist what a
//! restart needs, report.

use std::sync::atomic::Ordering;
use std::time::Duration;

use watermarkd_engine::{decide, Action, Decision, Guard, Position, Reading, State, Target};

use super::report;
use super::source::{Desired, Persisted, Source, SourceKind};
use super::Shared;
use crate::backend::{Observation, QueryError};
use crate::crd::{self, ScaleWrite};
use crate::rules::Autoscaler;
use crate::sparse::Sparse;
use crate::state;
use crate::telemetry::ShadowOutcome;
use crate::workload::{ScaleReading, WorkloadError};

/// Attempts at a scale write that keeps meeting a newer object.
const CONFLICT_ATTEMPTS: usize = 3;
/// How long to wait for the cache to show the object that caused a conflict.
const CONFLICT_REFRESH: Duration = Duration::from_secs(2);

/// What one autoscaler remembers between evaluations.
#[derive(Debug)]
pub struct Memory {
    /// `None` until restored from the cluster.
    state: Option<State>,
    /// The leadership epoch the state was restored in; a new leadership restores again.
    epoch: u64,
    /// What was last persisted, where the source keeps it.
    persisted: Persisted,
    /// A hash of the last decision's reason shape (see `reason_shape`): only whether it
    /// changed matters, and at 10,000 autoscalers the texts would cost megabytes.
    last_reason: Option<u64>,
    /// The target error last reported, so a stuck target logs once.
    failing: Option<String>,
    /// The resourceVersion a scale write was based on whose outcome is unknown (timed out,
    /// or the API server failed): it may have landed, or may yet.
    unconfirmed_write: Option<String>,
    /// What makes a change of the target's replica count this process did not confirm look
    /// like a scale that landed late.
    suspicion: state::Suspicion,
    /// The shadow rules' own memories, in the order of `Desired::shadows`.
    shadows: Sparse<ShadowMemory>,
}

/// What a shadow rule remembers between evaluations.
#[derive(Debug)]
struct ShadowMemory {
    /// The rule it was kept for: a changed shadow rule starts over.
    autoscaler: Autoscaler,
    state: State,
    /// Whether its last evaluation diverged from the active rule (a change is logged).
    diverging: bool,
}

impl Memory {
    pub fn for_source(source: SourceKind) -> Memory {
        Memory {
            state: None,
            epoch: 0,
            persisted: Persisted::for_source(source),
            last_reason: None,
            failing: None,
            unconfirmed_write: None,
            suspicion: state::Suspicion::default(),
            shadows: Sparse::default(),
        }
    }
}

/// What an evaluation ended in, for the evaluations counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Scaled,
    Held,
    DryRun,
    Failed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Scaled => "scaled",
            Outcome::Held => "held",
            Outcome::DryRun => "dry_run",
            Outcome::Failed => "failed",
        }
    }
}

pub async fn evaluate(
    shared: &Shared,
    desired: &Desired,
    memory: &mut Memory,
    mut observations: Vec<Observation>,
) -> Outcome {
    let autoscaler = &desired.autoscaler;
    let target = &autoscaler.target;
    let mut shadow_observations = observations.split_off(autoscaler.rule.metrics().len().min(observations.len()));
    // Skipped by the Datadog pacing: the engine holds, but nothing failed.
    let deferred = observations.iter().any(|o| matches!(o.detail.error, Some(QueryError::Deferred { .. })));
    let (readings, partial) = readings_of(observations);
    let rule = if shared.dry_run { autoscaler.rule.clone().with_dry_run(true) } else { autoscaler.rule.clone() };
    let epoch = shared.epoch.load(Ordering::Acquire);

    if memory.unconfirmed_write.is_some() {
        if let Some(outcome) = reconcile_unconfirmed_write(shared, desired, memory).await {
            return outcome;
        }
    }

    let mut attempt = 0;
    loop {
        attempt += 1;
        let reading = match shared.targets.read(target).await {
            Ok(reading) => reading,
            Err(err) => {
                target_failed(shared, desired, memory, &err).await;
                return Outcome::Failed;
            }
        };
        let now = shared.clock.now();
        if memory.state.is_none() || memory.epoch != epoch {
            if memory.epoch != epoch {
                // Another daemon may have led meanwhile: what it wrote is on the object.
                memory.persisted = Persisted::for_source(desired.key.source());
            }
            let persisted = match persisted_text(shared, desired, &reading).await {
                Ok(persisted) => persisted,
                Err(err) => {
                    state_unreadable(shared, desired, memory, &err);
                    return Outcome::Failed;
                }
            };
            restore(desired, memory, persisted, &reading, now);
            memory.epoch = epoch;
            memory.suspicion.leading_since = Some(now);
        }
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
        let decision = decide_on_partial_data(&rule, observed, &readings, &partial, &current, now);
        for (i, why) in &partial {
            let kept = decision.metrics.get(*i).filter(|m| m.position == Position::Above);
            if let (Some(metric), true) = (kept, decision.action == Action::ScaleUp) {
                tracing::info!(
                    autoscaler = %autoscaler.name,
                    metric = %metric.name,
                    "scaling up on partial data: {why}"
                );
            }
        }

        let mut confirmed_at = None;
        let write = if decision.write {
            let Some(budget) = shared.write_budget() else {
                // Leadership was lost, or can no longer be proven: the leader decides.
                return Outcome::Held;
            };
            let written = tokio::time::timeout(budget, shared.targets.scale(target, &reading, decision.replicas)).await;
            let written = written.unwrap_or_else(|_| {
                Err(WorkloadError::Connection(format!(
                    "no answer within {:.1}s (the time this daemon could still prove its lease, or the write timeout)",
                    budget.as_secs_f64()
                )))
            });
            match written {
                Ok(()) => {
                    shared.daemon.write("scale", "ok");
                    // The forbidden window starts when the write is known to have landed.
                    confirmed_at = Some(shared.clock.now());
                    memory.suspicion.written = Some(decision.replicas);
                    ScaleWrite::Succeeded
                }
                Err(WorkloadError::Conflict { .. }) if attempt < CONFLICT_ATTEMPTS => {
                    shared.daemon.write("scale", "conflict");
                    tracing::info!(
                        autoscaler = %autoscaler.name,
                        workload = %describe(target),
                        "the target changed since it was read; reading it again and deciding again"
                    );
                    wait_for_newer(shared, target, &reading).await;
                    continue;
                }
                Err(err) => {
                    let outcome = if matches!(err, WorkloadError::Conflict { .. }) { "conflict" } else { "error" };
                    shared.daemon.write("scale", outcome);
                    if err.outcome_unknown() {
                        // It may land yet: the next evaluation first finds out what the API
                        // server has.
                        memory.unconfirmed_write = Some(reading.resource_version.clone());
                        memory.suspicion.unconfirmed_since = Some(now);
                    }
                    ScaleWrite::Failed(err.to_string())
                }
            }
        } else {
            ScaleWrite::NotAttempted
        };

        let mut next_state = match write {
            ScaleWrite::Failed(_) => decision.state_if_not_written.clone(),
            _ => decision.state.clone(),
        };
        if let Some(confirmed) = confirmed_at {
            state::stamp_confirmed_scale(&mut next_state, now, confirmed);
        }
        memory.state = Some(next_state.clone());
        if memory.unconfirmed_write.is_none() {
            // Reconciled: what landed is in the state now.
            memory.suspicion.unconfirmed_since = None;
        }
        let scaled = decision.action != Action::Hold && (decision.dry_run || write == ScaleWrite::Succeeded);
        log_decision(desired, memory, &decision, &write);
        if paced_hold(deferred, &decision) {
            // Skipped to stay within the Datadog budget: nothing failed and nothing is known
            // that was not known last time, so the series, the WPA conditions and the persisted
            // state stay as the last real evaluation left them.
            return Outcome::Held;
        }
        // The conditions this evaluation sets, as a WPA status shows them (for a rules-file
        // autoscaler too); the metrics keep the status of those it does not set.
        let conditions =
            crd::next_status(None, &crd::WatermarkPodAutoscalerSpec::default(), &decision, &write, shared.clock.now())
                .conditions;
        let conditions = conditions.iter().map(|c| (c.type_.as_str(), c.status == "True"));
        shared.autoscaler_metrics.observe(&desired.labels, &rule, &decision, scaled, conditions);
        if !desired.shadows.is_empty() {
            let shadows = std::mem::take(&mut shadow_observations);
            let outcomes =
                evaluate_shadows(desired, memory, observed, shadows, (&current, &decision, &next_state), now);
            shared.autoscaler_metrics.observe_shadows(&desired.labels, &outcomes);
        }
        persist(shared, desired, memory, &decision, &write, &next_state).await;
        report::decision_events(shared, desired, &decision, &write, deferred).await;
        memory.failing = None;
        return match (&write, decision.action) {
            (ScaleWrite::Failed(_), _) => Outcome::Failed,
            (_, Action::Hold) => Outcome::Held,
            _ if decision.dry_run => Outcome::DryRun,
            _ => Outcome::Scaled,
        };
    }
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
    now: watermarkd_engine::Timestamp,
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
        let would = decide_on_partial_data(rule, target, &readings, &partial, &own.state, now);
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
    rule: &watermarkd_engine::Rule,
    target: Target,
    readings: &[Reading],
    partial: &[(usize, String)],
    state: &State,
    now: watermarkd_engine::Timestamp,
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

/// After a scale write whose outcome is unknown (it timed out, or the API server failed), finds
/// out from the API server whether the object changed, and waits for the cache to show it, so
/// the next decision is made on what landed. `Some`: the evaluation ends here.
async fn reconcile_unconfirmed_write(shared: &Shared, desired: &Desired, memory: &mut Memory) -> Option<Outcome> {
    let target = &desired.autoscaler.target;
    let Some(budget) = shared.write_budget() else { return Some(Outcome::Held) };
    let reading = match shared.targets.read(target).await {
        Ok(reading) => reading,
        Err(err) => {
            target_failed(shared, desired, memory, &err).await;
            return Some(Outcome::Failed);
        }
    };
    let current = match tokio::time::timeout(budget, shared.targets.current_version(target)).await {
        Ok(result) => result.map_err(|err| err.to_string()),
        Err(_) => Err(format!("no answer within {:.1}s", budget.as_secs_f64())),
    };
    let current = match current {
        Ok(version) => version,
        Err(why) => {
            let err = WorkloadError::Connection(format!(
                "the last scale write may or may not have landed, and the API server cannot say which yet: {why}"
            ));
            target_failed(shared, desired, memory, &err).await;
            return Some(Outcome::Failed);
        }
    };
    if current != reading.resource_version && !cache_reaches(shared, target, &current).await {
        let err = WorkloadError::Connection(format!(
            "the last scale write may have landed and the watch does not show resourceVersion {current} yet"
        ));
        target_failed(shared, desired, memory, &err).await;
        return Some(Outcome::Failed);
    }
    memory.unconfirmed_write = None;
    None
}

/// Waits (up to `CONFLICT_REFRESH`) for the cache to show `version` of the object.
async fn cache_reaches(shared: &Shared, target: &crate::rules::TargetRef, version: &str) -> bool {
    let deadline = tokio::time::Instant::now() + CONFLICT_REFRESH;
    loop {
        match shared.targets.read(target).await {
            Ok(reading) if reading.resource_version == version => return true,
            Err(_) => return false,
            Ok(_) if tokio::time::Instant::now() >= deadline => return false,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn describe(target: &crate::rules::TargetRef) -> String {
    format!("{} {}/{}", target.kind, target.namespace, target.name)
}

/// Waits until the cache holds a newer version of the object than `stale` (the conflict
/// means one exists), so the second decision is made on it.
async fn wait_for_newer(shared: &Shared, target: &crate::rules::TargetRef, stale: &ScaleReading) {
    let deadline = tokio::time::Instant::now() + CONFLICT_REFRESH;
    while tokio::time::Instant::now() < deadline {
        match shared.targets.read(target).await {
            Ok(reading) if reading.resource_version != stale.resource_version => return,
            Err(_) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Where a rules-file autoscaler's persisted state was found.
enum PersistedText {
    /// Its ConfigMap (`state::configmap`).
    ConfigMap(String),
    /// The `watermarkd.io/state` annotation on the target, as earlier versions wrote it: read
    /// only while there is no ConfigMap, and written to one at the next chance.
    Annotation(String),
    /// Nowhere (or the autoscaler comes from a WPA, whose status the restore reads).
    Nowhere,
}

/// Reads a rules-file autoscaler's persisted state: its ConfigMap, or else the annotation
/// an earlier version left on the target. An error (the ConfigMap could not be read) stops
/// the evaluation: deciding without the windows could scale too early.
async fn persisted_text(
    shared: &Shared,
    desired: &Desired,
    reading: &ScaleReading,
) -> Result<PersistedText, state::configmap::StateObjectError> {
    use state::configmap::Stored;
    if !matches!(desired.source, Source::RulesFile) {
        return Ok(PersistedText::Nowhere);
    }
    let autoscaler = &desired.autoscaler;
    match shared.states.read(&autoscaler.target).await? {
        Stored::State(text) => return Ok(PersistedText::ConfigMap(text)),
        Stored::Absent => {}
        Stored::OtherTarget(about) => tracing::warn!(
            autoscaler = %autoscaler.name,
            workload = %describe(&autoscaler.target),
            configmap = %state::configmap::object_name(&autoscaler.target),
            about = about.as_deref().unwrap_or("no target"),
            "the state ConfigMap of this target's name is about another target; ignoring it"
        ),
    }
    Ok(reading.marks.state_annotation.clone().map_or(PersistedText::Nowhere, PersistedText::Annotation))
}

fn state_unreadable(shared: &Shared, desired: &Desired, memory: &mut Memory, err: &state::configmap::StateObjectError) {
    let autoscaler = &desired.autoscaler;
    shared.autoscaler_metrics.observe_failure(&desired.labels, &autoscaler.rule);
    let message = err.to_string();
    if memory.failing.as_deref() != Some(message.as_str()) {
        tracing::warn!(
            autoscaler = %autoscaler.name,
            workload = %describe(&autoscaler.target),
            error = %message,
            "cannot read the persisted state; not deciding without it, trying again next evaluation"
        );
    }
    memory.failing = Some(message);
}

/// The state a (re)started daemon, or a new leader, continues from.
fn restore(
    desired: &Desired,
    memory: &mut Memory,
    found: PersistedText,
    reading: &ScaleReading,
    now: watermarkd_engine::Timestamp,
) {
    let autoscaler = &desired.autoscaler;
    let persisted = match (&desired.source, &mut memory.persisted) {
        (Source::Wpa(wpa), Persisted::Status { status, .. }) => {
            if status.is_none() {
                *status = wpa.status.clone().map(Box::new);
            }
            state::from_wpa_status(status.as_deref())
        }
        (Source::Wpa(_), Persisted::ConfigMap { .. }) => State::default(),
        (Source::RulesFile, persisted) => {
            let (text, in_configmap) = match &found {
                PersistedText::ConfigMap(text) => (Some(text.as_str()), true),
                PersistedText::Annotation(text) => (Some(text.as_str()), false),
                PersistedText::Nowhere => (None, true),
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
            let written = match &decoded {
                Some(decoded) if decoded.legacy || !in_configmap => None,
                _ => Some(state::Written::of(&restored)),
            };
            *persisted = Persisted::ConfigMap { written };
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

fn log_decision(desired: &Desired, memory: &mut Memory, decision: &Decision, write: &ScaleWrite) {
    let autoscaler = &desired.autoscaler;
    let values: Vec<String> = decision
        .metrics
        .iter()
        .map(|m| match m.value {
            Some(v) => format!("{}={v} band [{}, {}] {:?}", m.name, m.band_low, m.band_high, m.position),
            None => format!("{}=unavailable ({})", m.name, m.note.as_deref().unwrap_or("no value")),
        })
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

/// Persists what a later decision depends on, where the autoscaler's source keeps it: the
/// target's state ConfigMap (rules file), or the WPA's status.
async fn persist(
    shared: &Shared,
    desired: &Desired,
    memory: &mut Memory,
    decision: &Decision,
    write: &ScaleWrite,
    next_state: &State,
) {
    if !shared.is_leader() {
        return;
    }
    match (&desired.source, &mut memory.persisted) {
        (Source::Wpa(wpa), persisted) => report::decision_status(shared, wpa, persisted, decision, write).await,
        (Source::RulesFile, Persisted::ConfigMap { written }) => {
            // A dry run writes nothing, its state included.
            let rule = &desired.autoscaler.rule;
            if decision.dry_run || !state::needs_write(written.as_ref(), next_state, rule, decision.now) {
                return;
            }
            let value = state::encode_annotation(&desired.autoscaler.name, next_state);
            let Some(budget) = shared.write_budget() else { return };
            let target = &desired.autoscaler.target;
            let written_now = tokio::time::timeout(budget, shared.states.write(target, &value));
            let result = written_now.await.unwrap_or_else(|_| {
                Err(state::configmap::StateObjectError::Timeout {
                    namespace: shared.states.namespace().to_string(),
                    name: state::configmap::object_name(target),
                    seconds: budget.as_secs_f64(),
                })
            });
            match result {
                Ok(()) => {
                    shared.daemon.write("state", "ok");
                    *written = Some(state::Written::of(next_state));
                }
                Err(err) => {
                    shared.daemon.write("state", "error");
                    tracing::warn!(
                        autoscaler = %desired.autoscaler.name,
                        error = %err,
                        "could not persist the state; trying again next evaluation"
                    );
                }
            }
        }
        (Source::RulesFile, Persisted::Status { .. }) => {}
    }
}

async fn target_failed(shared: &Shared, desired: &Desired, memory: &mut Memory, err: &WorkloadError) {
    let autoscaler = &desired.autoscaler;
    shared.autoscaler_metrics.observe_failure(&desired.labels, &autoscaler.rule);
    let message = err.to_string();
    if memory.failing.as_deref() != Some(message.as_str()) {
        tracing::warn!(autoscaler = %autoscaler.name, workload = %describe(&autoscaler.target), error = %message, "cannot read the target");
    }
    memory.failing = Some(message);
    if shared.is_leader() {
        report::target_unreadable(shared, desired, &mut memory.persisted, err).await;
    }
}

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
        let rule = crate::rules::rule_from_json(&serde_json::json!({
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
            crate::rules::rule_from_json(&serde_json::json!({
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
