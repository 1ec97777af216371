//! The text format of one scrape: the families in their output order, each written out a slice
//! of autoscalers at a time from the ledger's entries.

use std::fmt::Write;

use watermarkd_engine::{Limit, MetricOutcome, Position};

use super::{escape, Render, CONDITIONS};
use crate::domain::observed::Side;
use crate::domain::outcome::{Counters, Entry, Outcome, Outlook};

/// The series of one scrape, written out a family and a slice of autoscalers at a time.
pub struct Snapshot {
    records: Vec<Rendered>,
    /// Whether any autoscaler has a shadow rule (see [`shadow_family`]).
    shadows: bool,
    /// Whether any autoscaler has a forecast, fallback or pause (see [`ahead_family`]).
    ahead: bool,
    /// Whether any autoscaler's target is claimed by another controller.
    claimed: bool,
    /// Whether any autoscaler observes (see [`observed_family`]).
    observed: bool,
}

/// An entry with its label sets rendered for this scrape.
struct Rendered {
    labels: String,
    info_labels: String,
    entry: Entry,
}

impl Rendered {
    /// The last decision, unless the last evaluation could not decide: then the series of an
    /// autoscaler that is not active (no values, no effective replicas).
    fn deciding(&self) -> Option<&Outcome> {
        self.entry.last.as_deref().filter(|_| self.entry.failure.is_none())
    }

    /// What looks ahead or stands in, as it last said: a fallback and a pause keep saying it
    /// after a failed evaluation.
    fn ahead(&self) -> Option<&Outlook> {
        self.entry.last.as_ref()?.ahead.as_ref()
    }

    /// The forecast's part of that, unless the last evaluation failed: then nothing was
    /// forecast.
    fn forecast(&self) -> Option<&Outlook> {
        self.ahead().filter(|_| self.entry.failure.is_none())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Value,
    Age,
    HighWatermark,
    LowWatermark,
    Proposal,
    Effective,
    Restricted,
    Countdown,
    MinReplicas,
    MaxReplicas,
    ScalingActive,
    DryRun,
    UpscaleTotal,
    DownscaleTotal,
    Conditions,
    LabelsInfo,
    ShadowReplicas,
    ShadowEvaluations,
    ShadowDivergence,
    ForecastDemand,
    ForecastReplicas,
    FallbackActive,
    Paused,
    TargetClaimed,
    ObservedLive,
    ObservedReplicaSeconds,
    ObservedAboveBand,
    ObservedBelowBand,
    ObservedScaleEvents,
    ObservedLargestGap,
}

/// The families, in output order: what, name, type, help. The Datadog controller still
/// exports the watermarks under their first, misspelled names (`..._watermak`) beside the
/// correct ones; dashboards built on either keep working, so both are here.
const FAMILIES: [(Family, &str, &str, &str); 32] = [
    (Family::Value, "wpa_controller_value", "gauge", "The metric's value, as compared with the watermarks"),
    (
        Family::Age,
        "watermarkd_metric_age_seconds",
        "gauge",
        "How old the data point behind wpa_controller_value was when the decision used it",
    ),
    (Family::HighWatermark, "wpa_controller_high_watermark", "gauge", "The metric's high watermark"),
    (
        Family::HighWatermark,
        "wpa_controller_high_watermak",
        "gauge",
        "The metric's high watermark (the Datadog controller's first, misspelled name)",
    ),
    (Family::LowWatermark, "wpa_controller_low_watermark", "gauge", "The metric's low watermark"),
    (
        Family::LowWatermark,
        "wpa_controller_low_watermak",
        "gauge",
        "The metric's low watermark (the Datadog controller's first, misspelled name)",
    ),
    (
        Family::Proposal,
        "wpa_controller_replicas_scaling_proposal",
        "gauge",
        "Replicas the metric proposes before limits",
    ),
    (
        Family::Effective,
        "wpa_controller_replicas_scaling_effective",
        "gauge",
        "Replicas after limits and bounds: what the autoscaler sets",
    ),
    (Family::Restricted, "wpa_controller_restricted_scaling", "gauge", "1 for the limit that shaped the last decision"),
    (
        Family::Countdown,
        "wpa_controller_transition_countdown",
        "gauge",
        "Seconds until a scale in this direction is allowed (forbidden window or delay)",
    ),
    (Family::MinReplicas, "wpa_controller_min_replicas", "gauge", "The autoscaler's minimum replicas"),
    (Family::MaxReplicas, "wpa_controller_max_replicas", "gauge", "The autoscaler's maximum replicas"),
    (
        Family::ScalingActive,
        "wpa_controller_scaling_active",
        "gauge",
        "1 when the autoscaler could compute a replica count",
    ),
    (Family::DryRun, "wpa_controller_dry_run", "gauge", "1 when the autoscaler only reports"),
    (Family::UpscaleTotal, "wpa_controller_upscale_replicas_total", "counter", "Replicas added by scale-ups"),
    (Family::DownscaleTotal, "wpa_controller_downscale_replicas_total", "counter", "Replicas removed by scale-downs"),
    (
        Family::Conditions,
        "wpa_controller_conditions",
        "gauge",
        "1 when the WPA condition is True, 0 when False, as last set",
    ),
    (
        Family::LabelsInfo,
        "wpa_controller_labels_info",
        "gauge",
        "Always 1: the autoscaler's labels-as-tags, to join on wpa_name and resource_namespace",
    ),
    (
        Family::ShadowReplicas,
        "watermarkd_shadow_replicas",
        "gauge",
        "Replicas the shadow rule would set, decided on the same readings as the active rule, never written",
    ),
    (
        Family::ShadowEvaluations,
        "watermarkd_shadow_evaluations_total",
        "counter",
        "Evaluations of the shadow rule beside the active rule",
    ),
    (
        Family::ShadowDivergence,
        "watermarkd_shadow_divergence_total",
        "counter",
        "Evaluations in which the shadow rule would have set another replica count than the active rule",
    ),
    (
        Family::ForecastDemand,
        "watermarkd_forecast_demand",
        "gauge",
        "The demand the forecast expects lead_time ahead, per metric (a total: the value times the ready replicas under absolute)",
    ),
    (
        Family::ForecastReplicas,
        "watermarkd_forecast_replicas",
        "gauge",
        "The floor the forecast sets (or, observing, would set) when it raises the rule's",
    ),
    (
        Family::FallbackActive,
        "watermarkd_fallback_active",
        "gauge",
        "1 while the autoscaler is in its declared fallback (no usable metric value for long enough)",
    ),
    (Family::Paused, "watermarkd_paused", "gauge", "1 while the autoscaler is paused (paused_until, or observe)"),
    (
        Family::TargetClaimed,
        "watermarkd_target_claimed",
        "gauge",
        "Per other controller that scales the autoscaler's target (claimed_by): 1 while watermarkd writes nothing for it, 0 while it takes over or observes",
    ),
    (
        Family::ObservedLive,
        "watermarkd_observed_live_replicas",
        "gauge",
        "Beside an observing autoscaler: the replicas the live controller (controller) set on the target",
    ),
    (
        Family::ObservedReplicaSeconds,
        "watermarkd_observed_replica_seconds_total",
        "counter",
        "Beside an observing autoscaler: replicas times seconds, for what watermarkd decided and what the live controller ran (side)",
    ),
    (
        Family::ObservedAboveBand,
        "watermarkd_observed_above_band_seconds_total",
        "counter",
        "Beside an observing autoscaler: seconds a metric was above its band at each side's replicas (side)",
    ),
    (
        Family::ObservedBelowBand,
        "watermarkd_observed_below_band_seconds_total",
        "counter",
        "Beside an observing autoscaler: seconds every metric was below its band at each side's replicas (side)",
    ),
    (
        Family::ObservedScaleEvents,
        "watermarkd_observed_scale_events_total",
        "counter",
        "Beside an observing autoscaler: changes of each side's replica count (side)",
    ),
    (
        Family::ObservedLargestGap,
        "watermarkd_observed_largest_gap_replicas",
        "gauge",
        "Beside an observing autoscaler: the largest difference between what watermarkd decided and what the live controller ran",
    ),
];

/// Families only an observing autoscaler has: left out without one, headers included.
fn observed_family(family: Family) -> bool {
    matches!(
        family,
        Family::ObservedLive
            | Family::ObservedReplicaSeconds
            | Family::ObservedAboveBand
            | Family::ObservedBelowBand
            | Family::ObservedScaleEvents
            | Family::ObservedLargestGap
    )
}

/// Families only a shadow rule has: without one they are left out, headers included.
fn shadow_family(family: Family) -> bool {
    matches!(family, Family::ShadowReplicas | Family::ShadowEvaluations | Family::ShadowDivergence)
}

/// Families only a forecast, fallback or pause has: left out without one, headers included.
fn ahead_family(family: Family) -> bool {
    matches!(family, Family::ForecastDemand | Family::ForecastReplicas | Family::FallbackActive | Family::Paused)
}

impl Snapshot {
    /// The entries of one scrape with their label sets rendered, in the order of those. Only
    /// entries an evaluation has reported for under their current labels; where two running
    /// autoscalers share a label set (a rules-file autoscaler and a WPA of the same name,
    /// namespace and target), the one evaluated last speaks for it.
    pub(super) fn of(entries: Vec<Entry>) -> Snapshot {
        let mut records: Vec<Rendered> = entries
            .into_iter()
            .filter(|e| e.reported)
            .map(|entry| Rendered {
                labels: entry.identity.labels.render(),
                info_labels: entry.identity.labels.render_info(),
                entry,
            })
            .collect();
        // By label set, the one evaluated last first; then one per label set.
        let at = |r: &Rendered| (r.entry.last.as_ref().map(|l| l.decision.now), r.entry.failure.as_ref().map(|f| f.at));
        records.sort_by(|a, b| a.labels.cmp(&b.labels).then_with(|| at(b).cmp(&at(a))));
        records.dedup_by(|later, kept| later.labels == kept.labels);
        let shadows = records.iter().any(|r| !r.entry.counters.shadows.is_empty());
        let ahead = records.iter().any(|r| r.entry.last.as_ref().is_some_and(|l| l.ahead.is_some()));
        let claimed = records.iter().any(|r| r.entry.last.as_ref().is_some_and(|l| l.claims.is_some()));
        let observed = records.iter().any(|r| r.entry.counters.observed.is_some());
        Snapshot { records, shadows, ahead, claimed, observed }
    }

    /// How many chunks [`Snapshot::render`] writes, each at most `per_chunk` autoscalers of one
    /// family.
    pub fn chunks(&self, per_chunk: usize) -> usize {
        FAMILIES.len() * self.records.len().div_ceil(per_chunk.max(1))
    }

    /// Writes chunk `index` (see [`Snapshot::chunks`]): a family's header before its first
    /// slice. Empty when the slice has no samples.
    pub fn render(&self, index: usize, per_chunk: usize) -> String {
        let per_chunk = per_chunk.max(1);
        let slices = self.records.len().div_ceil(per_chunk);
        if slices == 0 {
            return String::new();
        }
        let (family, slice) = (index / slices, index % slices);
        let Some(&(family, name, kind, help)) = FAMILIES.get(family) else { return String::new() };
        let absent = (shadow_family(family) && !self.shadows)
            || (ahead_family(family) && !self.ahead)
            || (family == Family::TargetClaimed && !self.claimed)
            || (observed_family(family) && !self.observed);
        if absent {
            return String::new();
        }
        let mut out = String::new();
        if slice == 0 {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        }
        for rendered in self.records.chunks(per_chunk).nth(slice).unwrap_or_default() {
            write_samples(&mut out, family, name, rendered);
        }
        out
    }

    /// The whole text at once (tests, small registries).
    pub(crate) fn render_all(&self) -> String {
        (0..self.chunks(1024)).map(|i| self.render(i, 1024)).collect()
    }
}

/// One sample: the autoscaler's labels, then `extra` (label, escaped value) pairs.
fn line(out: &mut String, name: &str, labels: &str, extra: Option<(&str, &str)>, value: impl std::fmt::Display) {
    let _ = match extra {
        Some((label, text)) => writeln!(out, "{name}{{{labels},{label}=\"{text}\"}} {value}"),
        None => writeln!(out, "{name}{{{labels}}} {value}"),
    };
}

/// The `wpa_controller_restricted_scaling` reason set by a decision's limit, as the Datadog
/// controller sets it (an index into [`RESTRICTIONS`]; none for the others).
fn restriction(limit: Limit) -> Option<usize> {
    match limit {
        Limit::TooFew | Limit::TooMany | Limit::AboveMax | Limit::BelowMin => Some(0),
        Limit::UpscaleCapping => Some(1),
        Limit::DownscaleCapping | Limit::NotReady => Some(2),
        Limit::WithinRange
        | Limit::ScaledToZero
        | Limit::Paused
        | Limit::NoData
        | Limit::MinAvailable
        | Limit::NoReadyReplicas => None,
    }
}

/// A metric's value, when the decision could use it.
fn usable_age(m: &MetricOutcome) -> Option<f64> {
    m.usable_value().and(m.age_seconds).filter(|a| a.is_finite() && m.position != Position::Unavailable)
}

fn write_samples(out: &mut String, family: Family, name: &str, rendered: &Rendered) {
    let labels = rendered.labels.as_str();
    let (identity, counters) = (&rendered.entry.identity, &rendered.entry.counters);
    let deciding = rendered.deciding();
    let per_metric = |out: &mut String, value: &dyn Fn(&MetricOutcome) -> Option<String>| {
        for m in deciding.iter().flat_map(|d| &d.decision.metrics) {
            if let Some(v) = value(m) {
                line(out, name, labels, Some(("metric_name", &escape(&m.name))), v);
            }
        }
    };
    match family {
        Family::Value => per_metric(out, &|m| m.usable_value().map(number)),
        Family::Age => per_metric(out, &|m| usable_age(m).map(number)),
        Family::HighWatermark => per_metric(out, &|m| Some(number(m.high_watermark))),
        Family::LowWatermark => per_metric(out, &|m| Some(number(m.low_watermark))),
        Family::Proposal => per_metric(out, &|m| m.proposal.map(|p| p.to_string())),
        Family::Effective => {
            if let Some(d) = deciding {
                line(out, name, labels, None, d.decision.replicas);
            }
        }
        Family::Restricted => {
            if let Some(d) = deciding {
                let on = restriction(d.decision.limit);
                for (i, reason) in RESTRICTIONS.iter().enumerate() {
                    line(out, name, labels, Some(("reason", reason)), u8::from(on == Some(i)));
                }
            }
        }
        Family::Countdown => {
            if let Some(d) = deciding {
                let (up, down) = d.blocked_seconds();
                for (transition, seconds) in TRANSITIONS.iter().zip([up, down]) {
                    line(out, name, labels, Some(("transition", transition)), number(seconds));
                }
            }
        }
        Family::MinReplicas => {
            line(out, name, labels, None, deciding.map_or(identity.min_replicas, |d| d.min_replicas))
        }
        Family::MaxReplicas => {
            line(out, name, labels, None, deciding.map_or(identity.max_replicas, |d| d.max_replicas))
        }
        Family::ScalingActive => {
            line(out, name, labels, None, u8::from(deciding.is_some_and(|d| d.decision.proposal.is_some())))
        }
        // The label's value, which is the decision's (both come from the rule and the daemon's
        // --dry-run), so the gauge never contradicts the label.
        Family::DryRun => line(out, name, labels, None, u8::from(identity.labels.dry_run)),
        Family::UpscaleTotal => line(out, name, labels, None, counters.upscale_replicas_total),
        Family::DownscaleTotal => line(out, name, labels, None, counters.downscale_replicas_total),
        Family::Conditions => {
            for ((_, condition), status) in CONDITIONS.iter().zip(counters.conditions) {
                if let Some(status) = status {
                    line(out, name, labels, Some(("condition", condition)), u8::from(status));
                }
            }
        }
        Family::LabelsInfo => {
            let _ = writeln!(out, "{name}{{{}}} 1", rendered.info_labels);
        }
        Family::ShadowReplicas => {
            for shadow in counters.shadows.iter() {
                if let Some(replicas) = shadow.replicas {
                    line(out, name, labels, Some(("shadow", &escape(&shadow.name))), replicas);
                }
            }
        }
        Family::ShadowEvaluations => {
            for shadow in counters.shadows.iter() {
                line(out, name, labels, Some(("shadow", &escape(&shadow.name))), shadow.evaluations_total);
            }
        }
        Family::ShadowDivergence => {
            for shadow in counters.shadows.iter() {
                line(out, name, labels, Some(("shadow", &escape(&shadow.name))), shadow.divergence_total);
            }
        }
        Family::ForecastDemand => {
            for (metric, demand) in rendered.forecast().iter().flat_map(|a| &a.forecast_demand) {
                line(out, name, labels, Some(("metric_name", &escape(metric))), number(*demand));
            }
        }
        Family::ForecastReplicas => {
            if let Some(replicas) = rendered.forecast().and_then(|a| a.forecast_replicas) {
                line(out, name, labels, None, replicas);
            }
        }
        Family::FallbackActive => {
            if let Some(active) = rendered.ahead().and_then(|a| a.fallback_active) {
                line(out, name, labels, None, u8::from(active));
            }
        }
        Family::Paused => {
            if let Some(paused) = rendered.ahead().and_then(|a| a.paused) {
                line(out, name, labels, None, u8::from(paused));
            }
        }
        Family::TargetClaimed => {
            // As last said: a claim keeps being said after a failed evaluation.
            if let Some(claims) = rendered.entry.last.as_ref().and_then(|l| l.claims.as_deref()) {
                for by in &claims.claimed_by {
                    line(out, name, labels, Some(("claimed_by", &escape(by))), u8::from(claims.withheld));
                }
            }
        }
        Family::ObservedLive => {
            if let Some(live) = rendered.entry.last.as_ref().and_then(|l| l.live.as_deref()) {
                let controller = live.controller.as_deref().map(escape).unwrap_or_default();
                line(out, name, labels, Some(("controller", &controller)), live.replicas);
            }
        }
        Family::ObservedReplicaSeconds => sides(out, name, labels, counters, |s| number(s.replica_seconds)),
        Family::ObservedAboveBand => sides(out, name, labels, counters, |s| number(s.above_band_seconds)),
        Family::ObservedBelowBand => sides(out, name, labels, counters, |s| number(s.below_band_seconds)),
        Family::ObservedScaleEvents => sides(out, name, labels, counters, |s| s.scale_events.to_string()),
        Family::ObservedLargestGap => {
            if let Some(compared) = &counters.observed {
                line(out, name, labels, None, compared.largest_gap);
            }
        }
    }
}

/// One sample per side of an observing autoscaler's comparison (`side`: `watermarkd`, `live`).
fn sides(out: &mut String, name: &str, labels: &str, counters: &Counters, value: impl Fn(&Side) -> String) {
    if let Some(compared) = &counters.observed {
        for (side, totals) in [("watermarkd", &compared.watermarkd), ("live", &compared.live)] {
            line(out, name, labels, Some(("side", side)), value(totals));
        }
    }
}

/// A sample value as the text format writes it.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{value}")
    }
}

/// The `reason` labels of `wpa_controller_restricted_scaling` and the `transition` labels of
/// `wpa_controller_transition_countdown`, in their order.
const RESTRICTIONS: [&str; 3] = ["within_bounds", "upscale_capping", "downscale_capping"];
const TRANSITIONS: [&str; 2] = ["upscale", "downscale"];
