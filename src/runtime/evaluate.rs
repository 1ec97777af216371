//! One evaluation of one autoscaler, its metrics already queried: the async executor of
//! `evaluation::Evaluation`. It answers each need from the cluster (the target from the cache,
//! the API server's version of it, the persisted state, the scale write, each bounded by the
//! time this daemon can still prove its lease), then reports and persists what was decided.
//! Every decision is the state machine's; nothing here chooses.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::evaluation::{self, describe, Answer, Done, Evaluation, Need, Outcome, Persist};
use super::memory::Memory;
use super::report;
use super::source::Desired;
use super::Shared;
use crate::adapters::backend::Observation;
use crate::adapters::state_store;
use crate::adapters::status::Extras;
use crate::adapters::workload::WorkloadError;
use crate::domain::rules::TargetRef;
use watermarkd_engine::Rule;

/// How long to wait for the cache to show the object that caused a conflict.
const CONFLICT_REFRESH: Duration = Duration::from_secs(2);

/// Evaluates `desired` on `observations`, with its memory.
pub async fn evaluate(
    shared: &Shared,
    desired: &Desired,
    memory: &mut Memory,
    observations: Vec<Observation>,
) -> Outcome {
    let target = &desired.autoscaler.target;
    memory.persisted.follow(&desired.source);
    let epoch = shared.epoch.load(Ordering::Acquire);
    let mut evaluation = Evaluation::new(desired, observations, epoch, shared.dry_run);
    let mut answer = Answer::Start;
    loop {
        answer = match evaluation.resume(memory, answer) {
            Need::Target => Answer::Target(shared.targets.read(target).await, shared.clock.now()),
            Need::ApiVersion => match shared.write_budget() {
                None => Answer::NoWriteBudget,
                Some(budget) => Answer::ApiVersion(
                    tokio::time::timeout(budget, shared.targets.current_version(target)).await.unwrap_or_else(|_| {
                        Err(WorkloadError::timeout(budget, "the time this daemon could still prove its lease"))
                    }),
                ),
            },
            Need::CacheAt(version) => Answer::CacheReached(cache_reaches(shared, target, &version).await),
            Need::PersistedState => Answer::PersistedState(shared.states.read(target).await),
            Need::Scale(replicas, from) => match shared.write_budget() {
                None => Answer::NoWriteBudget,
                Some(budget) => {
                    let written = tokio::time::timeout(budget, shared.targets.scale(target, &from, replicas)).await;
                    let written = written.unwrap_or_else(|_| {
                        Err(WorkloadError::timeout(
                            budget,
                            "the time this daemon could still prove its lease, or the write timeout",
                        ))
                    });
                    shared.daemon.write(
                        "scale",
                        match &written {
                            Ok(()) => "ok",
                            Err(WorkloadError::Conflict { .. }) => "conflict",
                            Err(_) => "error",
                        },
                    );
                    Answer::Scaled(written, shared.clock.now())
                }
            },
            Need::CacheAfter(version) => {
                wait_for_newer(shared, target, &version).await;
                Answer::CacheMoved
            }
            Need::TargetFailed(err) => {
                target_failed(shared, desired, memory, &err).await;
                return Outcome::Failed;
            }
            Need::StateUnreadable(err) => {
                state_unreadable(shared, desired, memory, &err);
                return Outcome::Failed;
            }
            Need::End(outcome) => return outcome,
            Need::Done(done) => return report_done(shared, desired, memory, evaluation.rule(), *done).await,
        };
    }
}

/// Reports a decision (the autoscaler's series, its shadows', events) and persists what a
/// later decision depends on.
async fn report_done(shared: &Shared, desired: &Desired, memory: &mut Memory, rule: &Rule, done: Done) -> Outcome {
    let metrics = &shared.autoscaler_metrics;
    let conditions = done.conditions.iter().copied();
    metrics.observe(&desired.labels, rule, &done.decision, done.scaled, conditions, done.ahead.clone());
    if let Some(shadows) = &done.shadows {
        metrics.observe_shadows(&desired.labels, shadows);
    }
    persist(shared, desired, memory, &done).await;
    report::decision_events(shared, desired, &done.decision, &done.write, done.deferred).await;
    if let Some(change) = &done.fallback {
        report::fallback_event(shared, desired, change).await;
    }
    memory.failing = None;
    let extras =
        Extras { scaled: done.scaled, ahead: done.ahead, forecast_says: done.forecast_says, shadows: done.shadows };
    shared.board.record(&desired.key.to_string(), rule, done.decision, extras);
    done.outcome
}

/// Persists what `done` leaves to persist (see `evaluation::to_persist`); only the leader
/// writes.
async fn persist(shared: &Shared, desired: &Desired, memory: &mut Memory, done: &Done) {
    if !shared.is_leader() {
        return;
    }
    let at = tokio::time::Instant::now();
    let now = shared.clock.now();
    let Some(what) = evaluation::to_persist(desired, &mut memory.persisted, done, now, at) else { return };
    let stored = match &what {
        Persist::ConfigMap { text, .. } => write_state(shared, desired, text).await,
        Persist::Status { wpa, next, .. } => report::write_status(shared, wpa, next).await,
    };
    if stored {
        what.stored(&done.next_state, at);
    }
}

/// Writes a rules-file autoscaler's state to its ConfigMap; true when it was written.
async fn write_state(shared: &Shared, desired: &Desired, value: &str) -> bool {
    let Some(budget) = shared.write_budget() else { return false };
    let target = &desired.autoscaler.target;
    let written_now = tokio::time::timeout(budget, shared.states.write(target, value));
    let result = written_now.await.unwrap_or_else(|_| {
        Err(state_store::StateObjectError::Timeout {
            namespace: shared.states.namespace().to_string(),
            name: state_store::object_name(target),
            seconds: budget.as_secs_f64(),
        })
    });
    match result {
        Ok(()) => {
            shared.daemon.write("state", "ok");
            true
        }
        Err(err) => {
            shared.daemon.write("state", "error");
            if shared.states.known(&err) {
                // The namespace is still missing: said once, and by /readyz meanwhile.
                tracing::debug!(autoscaler = %desired.autoscaler.name, error = %err, "could not persist the state");
            } else {
                tracing::warn!(
                    autoscaler = %desired.autoscaler.name,
                    error = %err,
                    "could not persist the state; trying again next evaluation"
                );
            }
            false
        }
    }
}

/// Waits (up to `CONFLICT_REFRESH`) for the cache to show `version` of the object.
async fn cache_reaches(shared: &Shared, target: &TargetRef, version: &str) -> bool {
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

/// Waits until the cache holds a newer version of the object than version `stale` (the conflict
/// means one exists), so the second decision is made on it.
async fn wait_for_newer(shared: &Shared, target: &TargetRef, stale: &str) {
    let deadline = tokio::time::Instant::now() + CONFLICT_REFRESH;
    while tokio::time::Instant::now() < deadline {
        match shared.targets.read(target).await {
            Ok(reading) if reading.resource_version != stale => return,
            Err(_) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// An evaluation that could not decide, told to the series and the status board.
fn report_failure(shared: &Shared, desired: &Desired, message: &str) {
    shared.autoscaler_metrics.observe_failure(&desired.labels, &desired.autoscaler.rule);
    shared.board.failed(&desired.key.to_string(), shared.clock.now(), message);
}

fn state_unreadable(shared: &Shared, desired: &Desired, memory: &mut Memory, err: &state_store::StateObjectError) {
    let autoscaler = &desired.autoscaler;
    let message = err.to_string();
    report_failure(shared, desired, &message);
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

async fn target_failed(shared: &Shared, desired: &Desired, memory: &mut Memory, err: &WorkloadError) {
    let autoscaler = &desired.autoscaler;
    let message = err.to_string();
    report_failure(shared, desired, &message);
    if memory.failing.as_deref() != Some(message.as_str()) {
        tracing::warn!(autoscaler = %autoscaler.name, workload = %describe(&autoscaler.target), error = %message, "cannot read the target");
    }
    memory.failing = Some(message);
    if shared.is_leader() {
        report::target_unreadable(shared, desired, &mut memory.persisted, err).await;
    }
}
