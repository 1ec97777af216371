//! One evaluation of one autoscaler, its metrics already queried: the async executor of
//! `evaluation::Evaluation`. It answers each need from the cluster (the target from the cache,
//! the API server's version of it, the persisted state, the scale write, each bounded by the
//! time this daemon can still prove its lease), then reports and persists what was decided.
//! Every decision is the state machine's; nothing here chooses.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::evaluation::{Answer, Ending, Evaluation, Need};
use super::fanout;
use super::memory::Memory;
use super::source::Desired;
use super::Shared;
use crate::adapters::backend::Observation;
use crate::adapters::workload::WorkloadError;
use crate::domain::rules::TargetRef;

/// How long to wait for the cache to show the object that caused a conflict.
const CONFLICT_REFRESH: Duration = Duration::from_secs(2);

/// Evaluates `desired` on `observations`, with its memory.
pub async fn evaluate(
    shared: &Shared,
    desired: &Desired,
    memory: &mut Memory,
    observations: Vec<Observation>,
) -> Ending {
    let target = &desired.autoscaler.target;
    memory.persisted.follow(&desired.source);
    let epoch = shared.epoch.load(Ordering::Acquire);
    let claims = shared.claims.claims(target);
    let live_hpa = desired.autoscaler.observe.then(|| shared.claims.hpa_replicas(target).into_iter().next()).flatten();
    let mut evaluation = Evaluation::new(desired, observations, epoch, shared.dry_run, claims).beside(live_hpa);
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
                fanout::target_failed(shared, desired, memory, &err).await;
                return Ending::Failed;
            }
            Need::StateUnreadable(err) => {
                fanout::state_unreadable(shared, desired, memory, &err);
                return Ending::Failed;
            }
            Need::End(outcome) => return outcome,
            Need::Done(done) => return fanout::record(shared, desired, memory, *done).await,
        };
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
