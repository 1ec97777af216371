//! What the daemon tells the cluster about its autoscalers besides the scale: WPA status
//! writes and Kubernetes events. Every such request goes through here, bounded by the time
//! this daemon can still prove its lease.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::Mutex;
use watermarkd_engine::{Action, Decision, Guard};

use super::evaluation::describe;
use super::memory::Persisted;
use super::source::Desired;
use super::wpa_index::{ObjectKey, Rejection};
use super::Shared;
use crate::adapters::events::{EventType, Repeats};
use crate::adapters::workload::WorkloadError;
use crate::domain::claims::ClaimNote;
use crate::domain::crd::{self, MapError, WatermarkPodAutoscaler, WatermarkPodAutoscalerStatus};
use crate::domain::fallback;
use crate::domain::outcome::ScaleWrite;

/// Merge-patches a WPA's status; true when it was written.
pub async fn write_status(
    shared: &Shared,
    wpa: &WatermarkPodAutoscaler,
    status: &WatermarkPodAutoscalerStatus,
) -> bool {
    let namespace = wpa.metadata.namespace.as_deref().unwrap_or("default");
    let name = wpa.metadata.name.as_deref().unwrap_or_default();
    let api: Api<WatermarkPodAutoscaler> = Api::namespaced(shared.client.clone(), namespace);
    let patch = serde_json::json!({ "status": status });
    let params = PatchParams { field_manager: Some("watermarkd".into()), ..PatchParams::default() };
    let Some(budget) = shared.write_budget() else { return false };
    let error = match tokio::time::timeout(budget, api.patch_status(name, &params, &Patch::Merge(&patch))).await {
        Ok(Ok(_)) => {
            shared.daemon.write("status", "ok");
            return true;
        }
        Ok(Err(err)) => err.to_string(),
        Err(_) => format!("no answer within {:.1}s", budget.as_secs_f64()),
    };
    shared.daemon.write("status", "error");
    tracing::warn!(wpa = %format!("{namespace}/{name}"), error, "could not write the WPA status");
    false
}

/// Records an event; failures are counted and logged at debug, never fatal.
pub async fn publish(
    shared: &Shared,
    object: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
    action: &str,
    repeats: Repeats,
) {
    let Some(events) = &shared.events else { return };
    match events.publish(object, type_, reason, note, action, repeats).await {
        Ok(crate::adapters::events::Published::Sent) => shared.daemon.write("event", "ok"),
        Ok(crate::adapters::events::Published::Suppressed) => {}
        Err(err) => {
            shared.daemon.write("event", "error");
            tracing::debug!(error = %err, reason, "could not record an event");
        }
    }
}

/// The events of one decision: each scale, a failed write, and a hold for want of data (not
/// one the Datadog pacing deferred).
pub async fn decision_events(
    shared: &Shared,
    desired: &Desired,
    decision: &Decision,
    write: &ScaleWrite,
    deferred: bool,
) {
    let object = target_reference(desired);
    match write {
        ScaleWrite::Succeeded => {
            let reason = if decision.action == Action::ScaleUp { "ScaledUp" } else { "ScaledDown" };
            let note = format!(
                "New size: {}; old size: {}; reason: {}",
                decision.replicas, decision.spec_replicas, decision.reason
            );
            publish(shared, &object, EventType::Normal, reason, &note, "Scale", Repeats::Keep).await;
        }
        ScaleWrite::Failed(err) => {
            let note = format!("could not scale to {}: {err}", decision.replicas);
            publish(shared, &object, EventType::Warning, "FailedRescale", &note, "Scale", Repeats::Suppress).await;
        }
        ScaleWrite::NotAttempted => {}
    }
    if decision.guard == Some(Guard::NoData) && !deferred {
        if let Some(recommender) = &desired.autoscaler.recommender {
            // A recommender's reasons carry no ages: the reason itself is the news. In CRD
            // mode it goes on the WPA, as the Datadog controller reports it.
            let why = decision.metrics.first().and_then(|m| m.note.as_deref()).unwrap_or("no reply");
            let note = format!("no usable recommendation from {}, holding: {why}", recommender.display_url());
            let object = desired.source.wpa().map_or(object, |wpa| wpa_reference(wpa));
            publish(shared, &object, EventType::Warning, "FailedGetMetrics", &note, "Decide", Repeats::Suppress).await;
            return;
        }
        // Names only, not the reasons (which carry ages): the same outage is one event.
        let names: Vec<&str> = decision.metrics.iter().map(|m| m.name.as_str()).collect();
        let note = format!("no usable metric value, holding: {}", names.join(", "));
        publish(shared, &object, EventType::Warning, "FailedGetMetrics", &note, "Decide", Repeats::Suppress).await;
    }
}

/// Entering fallback is a warning on the target (and on the WPA, which declared it); leaving it
/// is news.
pub async fn fallback_event(shared: &Shared, desired: &Desired, change: &fallback::Change) {
    let (type_, reason, note) = match change {
        fallback::Change::Entered { why } => (EventType::Warning, "FallbackEntered", why),
        fallback::Change::Left { why } => (EventType::Normal, "FallbackLeft", why),
    };
    tracing::warn!(autoscaler = %desired.autoscaler.name, "{reason}: {note}");
    let object = desired.source.wpa().map_or_else(|| target_reference(desired), |wpa| wpa_reference(wpa));
    publish(shared, &object, type_, reason, note, "Decide", Repeats::Keep).await;
}

/// The guard's word changed: another controller claims the target now (a Warning: nothing is
/// written while it does), this autoscaler takes over from it, or the claim is gone (writes
/// resume). Said in the log and as an Event on the WPA (a rules-file autoscaler's on the
/// target), once per change. A target not yet known to be free (the watches have not listed)
/// is only logged: it lasts moments at a start.
pub async fn claims_changed(shared: &Shared, desired: &Desired, before: Option<&ClaimNote>, now: Option<&ClaimNote>) {
    let autoscaler = &desired.autoscaler;
    let workload = describe(&autoscaler.target);
    let object = desired.source.wpa().map_or_else(|| target_reference(desired), |wpa| wpa_reference(wpa));
    let (type_, reason, note) = match now {
        Some(note) if note.withheld && note.claimed_by.is_empty() => {
            tracing::info!(autoscaler = %autoscaler.name, workload = %workload, "not writing yet: {}", note.sentence);
            return;
        }
        Some(note) if note.withheld => {
            let claimed_by = note.claimed_by.join(", ");
            tracing::warn!(autoscaler = %autoscaler.name, workload = %workload, claimed_by, "{}", note.sentence);
            (EventType::Warning, crd::TARGET_CLAIMED, note.sentence.clone())
        }
        Some(note) if note.taking_over => {
            tracing::info!(autoscaler = %autoscaler.name, workload = %workload, "{}", note.sentence);
            (EventType::Normal, "TakingOver", note.sentence.clone())
        }
        Some(note) => {
            tracing::info!(autoscaler = %autoscaler.name, workload = %workload, "{}", note.sentence);
            return;
        }
        None if before.is_some_and(|b| b.withheld) => {
            let note = format!("no other controller claims {workload} any more: watermarkd writes its scale again");
            tracing::info!(autoscaler = %autoscaler.name, workload = %workload, "{note}");
            (EventType::Normal, "TargetReleased", note)
        }
        None => return,
    };
    publish(shared, &object, type_, reason, &note, "Guard", Repeats::SuppressSameText).await;
}

/// Reports a target that cannot be read: on the WPA (an event and the AbleToScale condition),
/// or for a rules-file autoscaler on the target itself, unless it is missing (no object to
/// carry an event: the log says it).
pub async fn target_unreadable(shared: &Shared, desired: &Desired, persisted: &mut Persisted, err: &WorkloadError) {
    let message = err.to_string();
    let reason = match err {
        WorkloadError::NoScaleSubresource { .. } | WorkloadError::UnknownKind { .. } => "InvalidTarget",
        _ => "FailedGetScale",
    };
    match persisted {
        Persisted::Status { wpa, status, .. } => {
            let note = format!("cannot read the target: {message}");
            publish(shared, &wpa_reference(wpa), EventType::Warning, reason, &note, "GetScale", Repeats::Suppress)
                .await;
            let previous = status.as_deref().cloned().or_else(|| wpa.status.clone());
            let mut next = previous.clone().unwrap_or_default();
            crd::set_condition(
                &mut next,
                crd::ABLE_TO_SCALE,
                false,
                "FailedGetScale",
                &format!("the WPA controller was unable to get the target's current scale: {message}"),
                shared.clock.now(),
            );
            if crd::status_changed(previous.as_ref(), &next) && write_status(shared, wpa, &next).await {
                *status = Some(Box::new(next));
            }
        }
        Persisted::ConfigMap { .. } if matches!(err, WorkloadError::NotFound { .. }) => {}
        Persisted::ConfigMap { .. } => {
            let note = format!("cannot scale: {message}");
            let object = target_reference(desired);
            publish(shared, &object, EventType::Warning, reason, &note, "GetScale", Repeats::Suppress).await;
        }
    }
}

/// Reports the WPAs that do not run, as the loop receives their complete sets: each report is
/// spawned, so the loop never waits on the API. The reports run one at a time, in the order
/// they were made; one that finds a newer set reported already is dropped, the newer says it.
#[derive(Default)]
pub struct RejectionReports {
    /// How many reports were made; each is numbered by it.
    made: u64,
    reported: Arc<Mutex<Reported>>,
}

#[derive(Default)]
struct Reported {
    /// The number of the newest report run.
    newest: u64,
    statuses: RejectedStatuses,
}

impl RejectionReports {
    /// The report of `rejected`, the complete set of the WPAs that do not run now, to spawn.
    pub fn report(
        &mut self,
        shared: Arc<Shared>,
        rejected: Vec<Rejection>,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.made += 1;
        let number = self.made;
        let reported = Arc::clone(&self.reported);
        async move {
            let mut reported = reported.lock().await;
            if reported.newest > number {
                return;
            }
            reported.newest = number;
            reported.statuses.report(&shared, &rejected).await;
        }
    }
}

/// The statuses written to WPAs that do not run, so that each is written once per change.
#[derive(Default)]
struct RejectedStatuses {
    written: HashMap<ObjectKey, WatermarkPodAutoscalerStatus>,
}

impl RejectedStatuses {
    /// Reports each WPA that does not run (its status when it changed, and a Warning event),
    /// and forgets the ones that run again or are gone. Only the leader writes.
    async fn report(&mut self, shared: &Shared, rejected: &[Rejection]) {
        let still: std::collections::HashSet<ObjectKey> =
            rejected.iter().map(|r| ObjectKey::of(&r.wpa.metadata)).collect();
        self.written.retain(|key, _| still.contains(key));
        if !shared.is_leader() {
            return;
        }
        for Rejection { wpa, error } in rejected {
            let key = ObjectKey::of(&wpa.metadata);
            let previous = self.written.get(&key).cloned().or_else(|| wpa.status.clone());
            let next = crd::rejected_status(previous.as_ref(), error, shared.clock.now());
            if crd::status_changed(previous.as_ref(), &next) && write_status(shared, wpa, &next).await {
                self.written.insert(key, next);
            }
            let reason = match error {
                MapError::Invalid { .. } => "FailedSpecCheck",
                MapError::Unsupported(_) => "NotSupported",
                MapError::TargetConflict { .. } => crd::TARGET_CONFLICT,
            };
            let note = error.to_string();
            publish(
                shared,
                &wpa_reference(wpa),
                EventType::Warning,
                reason,
                &note,
                "Validate",
                Repeats::SuppressSameText,
            )
            .await;
        }
    }
}

fn target_reference(desired: &Desired) -> ObjectReference {
    let target = &desired.autoscaler.target;
    ObjectReference {
        api_version: Some(target.api_version.to_string()),
        kind: Some(target.kind.to_string()),
        namespace: Some(target.namespace.to_string()),
        name: Some(target.name.to_string()),
        ..ObjectReference::default()
    }
}

fn wpa_reference(wpa: &WatermarkPodAutoscaler) -> ObjectReference {
    ObjectReference {
        api_version: Some(crd::API_VERSION.into()),
        kind: Some(crd::KIND.into()),
        namespace: wpa.metadata.namespace.clone(),
        name: wpa.metadata.name.clone(),
        uid: wpa.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}
