//! The one fan-out of what the scheduler runs and what its evaluations produce. An autoscaler
//! that starts, changes or stops is admitted to or removed from the ledger here; an evaluation's
//! outcome is persisted, published as Events and recorded here, once. The ledger
//! (`domain::outcome::Ledger`) is what the exported series and the status board read, so they
//! cannot drift apart.

use std::time::Duration;

use super::evaluation::{self, describe, Done, Ending, Persist};
use super::memory::Memory;
use super::report;
use super::source::Desired;
use super::Shared;
use crate::adapters::state_store;
use crate::adapters::workload::WorkloadError;
use crate::domain::outcome::Ledger;

/// An autoscaler runs, or runs with new settings: the ledger follows who it is (a new label set
/// starts its series over).
pub fn admit(ledger: &Ledger, desired: &Desired, default_interval: Duration) {
    ledger.admit(desired.identity(default_interval));
}

/// An autoscaler stopped: everything about it goes from the ledger.
pub fn remove(ledger: &Ledger, desired: &Desired) {
    ledger.remove(&desired.key.to_string());
}

/// An evaluation decided: it persists what a later decision depends on (the state, or a WPA's
/// status), publishes its Events, and goes into the ledger, which the series and the status
/// board show.
pub async fn record(shared: &Shared, desired: &Desired, memory: &mut Memory, done: Done) -> Ending {
    persist(shared, desired, memory, &done).await;
    let outcome = &done.outcome;
    report::decision_events(shared, desired, &outcome.decision, &outcome.write, outcome.deferred).await;
    if let Some(change) = &outcome.fallback {
        report::fallback_event(shared, desired, change).await;
    }
    if memory.claims_said != outcome.claims {
        report::claims_changed(shared, desired, memory.claims_said.as_deref(), outcome.claims.as_deref()).await;
        memory.claims_said = outcome.claims.clone();
    }
    memory.failing = None;
    shared.ledger.record(&desired.key.to_string(), &desired.labels, done.outcome);
    done.ending
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

/// An evaluation that could not decide, told to the ledger (the series and the status board).
fn report_failure(shared: &Shared, desired: &Desired, message: &str) {
    shared.ledger.failed(&desired.key.to_string(), &desired.labels, shared.clock.now(), message);
}

pub fn state_unreadable(shared: &Shared, desired: &Desired, memory: &mut Memory, err: &state_store::StateObjectError) {
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

pub async fn target_failed(shared: &Shared, desired: &Desired, memory: &mut Memory, err: &WorkloadError) {
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
