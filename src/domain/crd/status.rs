//! The status a WPA shows, in the shape the Datadog controller writes: the same condition types
//! and reasons, `currentMetrics`, `lastScaleTime`, `scalingEventsCount` and the
//! `lastConditionType`/`lastConditionState` pair its printer columns read. Building it is a
//! pure function of the previous status, the engine's decision and the time, so the daemon
//! writes it only when `status_changed` says it did.
//!
//! Conditions are set in the order the Datadog controller sets them in one reconcile (DryRun,
//! AbleToScale, AboveHighWatermark, BelowLowWatermark, ScalingActive, ScalingLimited, the
//! forbidden-window AbleToScale, then the scale's own AbleToScale), and `lastCondition*` name
//! the last one set, as there. Unlike there, each condition is compared with the previous
//! status once, after all of them are known, so `lastTransitionTime` moves only when a
//! condition's status really flipped (the Datadog controller sets AbleToScale True then False
//! within one reconcile during a forbidden window and so moves it on every reconcile).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use watermarkd_engine::{Action, Decision, Guard, Limit, Position, Timestamp};

use super::mapping::MapError;
use super::types::{
    Condition, ExternalMetricStatus, MetricSpec, MetricStatus, Quantity, ResourceMetricStatus,
    WatermarkPodAutoscalerSpec, WatermarkPodAutoscalerStatus,
};
use crate::domain::claims::ClaimNote;
use crate::domain::outcome::ScaleWrite;
use crate::domain::rules::Problem;

pub const ABLE_TO_SCALE: &str = "AbleToScale";
pub const SCALING_ACTIVE: &str = "ScalingActive";
pub const SCALING_LIMITED: &str = "ScalingLimited";
pub const ABOVE_HIGH_WATERMARK: &str = "AboveHighWatermark";
pub const BELOW_LOW_WATERMARK: &str = "BelowLowWatermark";
pub const DRY_RUN: &str = "DryRun";
/// The reason of `ScalingActive` = False on a WPA whose target another autoscaler scales (and
/// of the Warning event that says so).
pub const TARGET_CONFLICT: &str = "TargetConflict";
/// The reason of `AbleToScale` = False while another controller scales the WPA's target (or
/// none can be ruled out yet) and watermarkd writes nothing: the guard (`domain::claims`).
pub const TARGET_CLAIMED: &str = "TargetClaimed";
/// watermarkd's own: what the forecast says (`watermarkd.io/forecast`), and whether the WPA is in
/// its declared fallback (`watermarkd.io/fallback`). Only on a WPA that has one.
pub const FORECAST: &str = "Forecast";
pub const FALLBACK: &str = "Fallback";

/// One condition as a reconcile sets it.
struct Update {
    type_: &'static str,
    status: bool,
    reason: String,
    message: String,
}

impl Update {
    fn new(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Update { type_, status, reason: reason.into(), message: message.into() }
    }
}

fn status_word(status: bool) -> &'static str {
    if status {
        "True"
    } else {
        "False"
    }
}

/// Adds what looks ahead to a status: the `Forecast` condition (True with what it expects, or
/// False with why it cannot forecast) and the `Fallback` condition (True while in fallback),
/// each only when the WPA has one. `lastConditionType` stays the Datadog controller's last.
pub fn with_ahead(
    status: &mut WatermarkPodAutoscalerStatus,
    forecast: Option<Result<&str, &str>>,
    fallback: Option<bool>,
    now: Timestamp,
) {
    let last = (status.last_condition_type.take(), status.last_condition_state.take());
    match forecast {
        Some(Ok(says)) => set_condition(status, FORECAST, true, "Forecasting", says, now),
        Some(Err(why)) => set_condition(status, FORECAST, false, "NotForecasting", why, now),
        None => {}
    }
    match fallback {
        Some(true) => set_condition(status, FALLBACK, true, "NoUsableMetric", "in its declared fallback", now),
        Some(false) => set_condition(status, FALLBACK, false, "MetricsUsable", "not in fallback", now),
        None => {}
    }
    (status.last_condition_type, status.last_condition_state) = last;
}

/// Adds what the guard said to a status: while it withholds the write, `AbleToScale` is False
/// with [`TARGET_CLAIMED`], naming the other controller. It is set last, so that
/// `lastConditionType` (the printer column) shows it.
pub fn with_claims(status: &mut WatermarkPodAutoscalerStatus, note: &ClaimNote, now: Timestamp) {
    if note.withheld {
        set_condition(status, ABLE_TO_SCALE, false, TARGET_CLAIMED, &note.sentence, now);
    }
}

/// Sets one condition as the Datadog controller's `setCondition` does: `lastTransitionTime`
/// moves only when the status flips (or the condition is new), conditions stay sorted newest
/// transition first, and `lastConditionType`/`lastConditionState` name it.
pub fn set_condition(
    status: &mut WatermarkPodAutoscalerStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let word = status_word(value);
    match status.conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(condition) => {
            if condition.status != word {
                condition.last_transition_time = Some(now);
            }
            condition.status = word.into();
            condition.reason = Some(reason.into());
            condition.message = Some(message.into());
        }
        None => status.conditions.push(Condition {
            type_: type_.into(),
            status: word.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_transition_time: Some(now),
        }),
    }
    // Stable, so that conditions that flipped together keep their order.
    status.conditions.sort_by_key(|c| std::cmp::Reverse(c.last_transition_time));
    status.last_condition_type = Some(type_.into());
    status.last_condition_state = Some(word.into());
}

/// Applies a reconcile's updates against `base`: per type the last update wins, compared once
/// with the previous value.
fn apply(mut base: WatermarkPodAutoscalerStatus, updates: &[Update], now: Timestamp) -> WatermarkPodAutoscalerStatus {
    let Some(last) = updates.last() else { return base };
    let mut seen: Vec<&str> = Vec::new();
    for (i, update) in updates.iter().enumerate() {
        if seen.contains(&update.type_) {
            continue;
        }
        seen.push(update.type_);
        let final_update = updates.iter().skip(i).rfind(|u| u.type_ == update.type_).unwrap_or(update);
        set_condition(
            &mut base,
            final_update.type_,
            final_update.status,
            &final_update.reason,
            &final_update.message,
            now,
        );
    }
    base.last_condition_type = Some(last.type_.into());
    base.last_condition_state = Some(status_word(last.status).into());
    base
}

/// The status after one evaluation. `spec.metrics[i]` is the decision's metric `i` (the
/// mapping keeps them aligned); `write` is what became of the scale the decision asked for.
pub fn next_status(
    previous: Option<&WatermarkPodAutoscalerStatus>,
    spec: &WatermarkPodAutoscalerSpec,
    decision: &Decision,
    write: &ScaleWrite,
    now: Timestamp,
) -> WatermarkPodAutoscalerStatus {
    let base = previous.cloned().unwrap_or_default();
    let updates = updates(decision, write);
    let mut status = apply(base, &updates, now);
    let scaled = decision.action != Action::Hold && (decision.dry_run || *write == ScaleWrite::Succeeded);
    status.current_replicas = i64::from(decision.spec_replicas);
    status.desired_replicas = match write {
        // As the Datadog controller: a failed scale leaves the previous desired count.
        ScaleWrite::Failed(_) => previous.map_or(i64::from(decision.spec_replicas), |p| p.desired_replicas),
        _ => i64::from(decision.replicas),
    };
    if scaled {
        status.last_scale_time = Some(now);
        status.scaling_events_count = Some(status.scaling_events_count.unwrap_or(0).saturating_add(1));
    }
    status.current_metrics = current_metrics(previous, spec, decision);
    status
}

/// The conditions one evaluation sets, in the order the Datadog controller sets them.
fn updates(decision: &Decision, write: &ScaleWrite) -> Vec<Update> {
    // The Datadog controller stops before normalizing when it cannot read a metric or count
    // ready pods; so do these guards.
    let stopped = matches!(decision.guard, Some(Guard::NoData | Guard::MinAvailable | Guard::NoReadyReplicas));
    let mut updates = vec![
        if decision.dry_run {
            Update::new(DRY_RUN, true, "DryRun mode enabled", "Scaling changes won't be applied")
        } else {
            Update::new(DRY_RUN, false, "DryRun mode disabled", "Scaling changes can be applied")
        },
        Update::new(ABLE_TO_SCALE, true, "SucceededGetScale", "watermarkd was able to get the target's current scale"),
        // Reasons as the Datadog controller words them, except that it calls the below-low
        // condition "Value above Low Watermark" (a slip we do not copy).
        Update::new(
            ABOVE_HIGH_WATERMARK,
            // The engine's "above since" clock, not this tick's comparison: the condition's
            // lastTransitionTime is then exactly that clock's start, which is what a restart
            // restores the upscale delay from (`state::from_wpa_status`). The two differ only
            // while no metric has data, when the clock keeps running.
            decision.state.above_since.is_some(),
            "Value above High Watermark",
            "Allow upscaling if the value stays over the Watermark",
        ),
        Update::new(
            BELOW_LOW_WATERMARK,
            // Likewise: below on complete data only, as the downscale delay counts it.
            decision.state.below_since.is_some(),
            "Value below Low Watermark",
            "Allow downscaling if the value stays under the Watermark",
        ),
        scaling_active(decision),
    ];
    if !stopped {
        updates.extend(scaling_limited(decision));
        updates.extend(backoff(decision));
        updates.extend(scale_result(decision, write));
    }
    updates
}

/// The conditions one evaluation leaves, whatever the autoscaler's source: each type once, with
/// its last setting (AbleToScale is set up to three times), in the order first set. A WPA's
/// status shows them (`next_status`); the daemon's metrics show them for every autoscaler.
pub fn conditions(decision: &Decision, write: &ScaleWrite) -> Vec<(&'static str, bool)> {
    let mut conditions: Vec<(&'static str, bool)> = Vec::new();
    for update in updates(decision, write) {
        match conditions.iter_mut().find(|(type_, _)| *type_ == update.type_) {
            Some(condition) => condition.1 = update.status,
            None => conditions.push((update.type_, update.status)),
        }
    }
    conditions
}

fn scaling_active(decision: &Decision) -> Update {
    let unavailable: Vec<String> = decision
        .metrics
        .iter()
        .filter(|m| m.position == Position::Unavailable)
        .map(|m| format!("{}: {}", m.name, m.note.as_deref().unwrap_or("unavailable")))
        .collect();
    match decision.guard {
        Some(Guard::Paused | Guard::AtZero) => Update::new(
            SCALING_ACTIVE,
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
        ),
        Some(Guard::NoData) if unavailable.len() == decision.metrics.len() => {
            let mut message = format!("the WPA was unable to compute the replica count: {}", unavailable.join("; "));
            if let Some(fallback) = &decision.fallback {
                message.push_str(&format!("; in fallback: {fallback}"));
            }
            Update::new(SCALING_ACTIVE, false, "FailedGetExternalMetric", message)
        }
        Some(Guard::MinAvailable | Guard::NoReadyReplicas) => {
            Update::new(SCALING_ACTIVE, false, "NotEnoughReadyReplicas", decision.reason.clone())
        }
        _ => {
            let from = decision.proposal_metric.as_deref().unwrap_or("its metrics");
            let mut message = format!("the WPA was able to successfully calculate a replica count from {from}");
            if !unavailable.is_empty() {
                message.push_str(&format!(" (unavailable: {})", unavailable.join("; ")));
            }
            Update::new(SCALING_ACTIVE, true, "ValidMetricFound", message)
        }
    }
}

/// What limited the proposal, with the Datadog controller's reasons.
fn scaling_limited(decision: &Decision) -> Option<Update> {
    let limited = |reason: &str, message: &str| Some(Update::new(SCALING_LIMITED, true, reason, message));
    match (decision.guard, decision.limit) {
        (Some(Guard::AboveMax), _) => {
            limited("TooManyReplicas", "the current replica count is above the maximum replica count")
        }
        (Some(Guard::BelowMin), _) => match decision.bounds_by.as_ref().and_then(|b| b.min_by.as_deref()) {
            Some(by) => limited(
                "TooFewReplicas",
                &format!("the current replica count is below the minimum replica count, raised by {by}"),
            ),
            None => limited("TooFewReplicas", "the current replica count is below the minimum replica count"),
        },
        _ if decision.normalized.is_none() => None,
        (_, Limit::WithinRange) => Some(Update::new(
            SCALING_LIMITED,
            false,
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
        )),
        (_, Limit::UpscaleCapping) => {
            limited("ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate")
        }
        (_, Limit::DownscaleCapping) => {
            limited("ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate")
        }
        (_, Limit::TooFew) => limited("TooFewReplicas", "the desired replica count is below the minimum replica count"),
        (_, Limit::TooMany) => {
            limited("TooManyReplicas", "the desired replica count is above the maximum replica count")
        }
        // Guards have no normalized count, so they were answered above.
        (
            _,
            Limit::Paused
            | Limit::ScaledToZero
            | Limit::NoData
            | Limit::AboveMax
            | Limit::BelowMin
            | Limit::MinAvailable
            | Limit::NoReadyReplicas,
        ) => None,
        (_, Limit::NotReady) => limited(
            "ScaleDownLimit",
            "scaling down is held: some replicas are not ready and the scale-down limit is above the ready count",
        ),
    }
}

/// The forbidden windows, as the Datadog controller reports them whatever the proposal.
fn backoff(decision: &Decision) -> Option<Update> {
    let up = decision.timing.upscale_window_seconds_left > 0.0;
    let down = decision.timing.downscale_window_seconds_left > 0.0;
    let (reason, message) = match (up, down) {
        (true, true) => (
            "BackoffBoth",
            "the time since the previous scale is still within both the downscale and upscale forbidden windows",
        ),
        (false, true) => {
            ("BackoffDownscale", "the time since the previous scale is still within the downscale forbidden window")
        }
        (true, false) => {
            ("BackoffUpscale", "the time since the previous scale is still within the upscale forbidden window")
        }
        (false, false) => return None,
    };
    Some(Update::new(ABLE_TO_SCALE, false, reason, message))
}

fn scale_result(decision: &Decision, write: &ScaleWrite) -> Option<Update> {
    if decision.action == Action::Hold {
        return None;
    }
    Some(match write {
        ScaleWrite::Succeeded => Update::new(
            ABLE_TO_SCALE,
            true,
            "SuccessfulScale",
            format!("watermarkd updated the target scale to {}", decision.replicas),
        ),
        ScaleWrite::Failed(error) => Update::new(
            ABLE_TO_SCALE,
            false,
            "FailedScale",
            format!("watermarkd was unable to update the target scale: {error}"),
        ),
        ScaleWrite::NotAttempted => Update::new(
            ABLE_TO_SCALE,
            true,
            "ReadyForScale",
            "the last scaling time was sufficiently old as to warrant a new scale",
        ),
    })
}

/// Each metric's value per replica (what the watermarks compare, as the Datadog controller
/// reports it), truncated to thousandths: `external.currentValue` for an External metric,
/// `resource.currentAverageValue` for a Resource one (in cores or bytes; the sum over the pods
/// unless the pod aggregation is `average`, as there). A metric without a value this time keeps
/// its previous entry, so a blip does not blank the `value` column.
fn current_metrics(
    previous: Option<&WatermarkPodAutoscalerStatus>,
    spec: &WatermarkPodAutoscalerSpec,
    decision: &Decision,
) -> Vec<MetricStatus> {
    let previous_entry = |metric: &MetricSpec| {
        previous?
            .current_metrics
            .iter()
            .find(|m| match (&metric.external, &metric.resource) {
                (Some(e), _) if metric.type_ == "External" => {
                    m.external.as_ref().is_some_and(|x| x.metric_name == e.metric_name)
                }
                (_, Some(r)) if metric.type_ == "Resource" => m.resource.as_ref().is_some_and(|x| x.name == r.name),
                _ => false,
            })
            .cloned()
    };
    if spec.recommender.is_some() {
        // As the Datadog controller reports a recommender: one entry named after it, with the
        // value the recommender observed, under type Resource with an `external` body.
        let Some(outcome) = decision.metrics.first() else { return Vec::new() };
        let milli = outcome.value.map(|v| (v * 1000.0).trunc()).filter(|m| m.is_finite() && m.abs() < 9.0e18);
        return match milli {
            Some(milli) => vec![MetricStatus {
                type_: "Resource".into(),
                external: Some(ExternalMetricStatus {
                    metric_name: outcome.name.clone(),
                    metric_selector: Some(LabelSelector::default()),
                    current_value: Some(Quantity::from_milli(milli as i64)),
                    current_average_value: None,
                }),
                ..MetricStatus::default()
            }],
            None => previous
                .into_iter()
                .flat_map(|p| &p.current_metrics)
                .find(|m| m.external.as_ref().is_some_and(|e| e.metric_name == outcome.name))
                .cloned()
                .into_iter()
                .collect(),
        };
    }
    spec.metrics
        .iter()
        .zip(&decision.metrics)
        .filter_map(|(metric, outcome)| {
            let milli = outcome.usage.map(|u| (u * 1000.0).trunc()).filter(|m| m.is_finite() && m.abs() < 9.0e18);
            // Truncation to whole thousandths is what `int64(...)` does there.
            let Some(value) = milli.map(|m| Quantity::from_milli(m as i64)) else { return previous_entry(metric) };
            match (metric.type_.as_str(), &metric.external, &metric.resource) {
                ("External", Some(external), _) => Some(MetricStatus {
                    type_: "External".into(),
                    external: Some(ExternalMetricStatus {
                        metric_name: external.metric_name.clone(),
                        metric_selector: external.metric_selector.clone(),
                        current_value: Some(value),
                        current_average_value: None,
                    }),
                    ..MetricStatus::default()
                }),
                ("Resource", _, Some(resource)) => Some(MetricStatus {
                    type_: "Resource".into(),
                    resource: Some(ResourceMetricStatus {
                        name: resource.name.clone(),
                        current_average_utilization: None,
                        current_average_value: Some(value),
                    }),
                    ..MetricStatus::default()
                }),
                _ => None,
            }
        })
        .collect()
}

/// The status of a WPA that does not run: invalid (AbleToScale False, `FailedSpecCheck`, as the
/// Datadog controller reports a spec it rejects) or using what watermarkd does not support yet
/// (ScalingActive False, `NotSupported`). Replica counts and metrics are kept as they were.
pub fn rejected_status(
    previous: Option<&WatermarkPodAutoscalerStatus>,
    error: &MapError,
    now: Timestamp,
) -> WatermarkPodAutoscalerStatus {
    let base = previous.cloned().unwrap_or_default();
    let updates = match error {
        MapError::Invalid { problems, unsupported } => {
            let mut parts: Vec<String> = problems.iter().map(describe_problem).collect();
            parts.extend(unsupported.iter().map(|u| format!("{} {}", u.field, u.message)));
            vec![
                Update::new(SCALING_ACTIVE, false, "FailedProcessWPA", "Error happened while processing the WPA"),
                Update::new(
                    ABLE_TO_SCALE,
                    false,
                    "FailedSpecCheck",
                    format!("Invalid WPA specification: {}", parts.join("; ")),
                ),
            ]
        }
        MapError::Unsupported(unsupported) => {
            let parts: Vec<String> = unsupported.iter().map(|u| format!("{} {}", u.field, u.message)).collect();
            vec![Update::new(
                SCALING_ACTIVE,
                false,
                "NotSupported",
                format!("watermarkd does not run this WPA: {}", parts.join("; ")),
            )]
        }
        MapError::TargetConflict { .. } => vec![Update::new(
            SCALING_ACTIVE,
            false,
            TARGET_CONFLICT,
            format!("watermarkd does not run this WPA: {}", error.conflict_reason().unwrap_or_default()),
        )],
    };
    apply(base, &updates, now)
}

/// `field message` without the WPA's name, which the status is already about.
fn describe_problem(problem: &Problem) -> String {
    Problem { autoscaler: None, line: None, ..problem.clone() }.to_string()
}

/// Whether `next` differs from what the object shows, so that it is written only then (as the
/// Datadog controller's `updateStatusIfNeeded`). Quantities compare by value.
pub fn status_changed(previous: Option<&WatermarkPodAutoscalerStatus>, next: &WatermarkPodAutoscalerStatus) -> bool {
    previous != Some(next)
}

#[cfg(test)]
mod tests;
