//! What an autoscaler was understood to be, in one line (`summary`), and what is valid in it
//! but will not do what its author probably means (`warnings`): said by `watermarkd check`
//! and logged when the daemon loads the rules.

use std::time::Duration;

use watermarkd_engine::{
    Algorithm, ConvergeTowards, Policy, PolicyKind, ScalingRules, SelectPolicy, Timestamp, Velocity,
};

use super::quantity::format_quantity;
use super::Autoscaler;
use crate::domain::fallback::FallbackAction;
use crate::domain::forecast::ForecastMode;

/// `billing: Deployment prod/billing, 4..9 replicas, every 15s, 1 metric (latency via dd:
/// 150m..400m), watermark velocity up 50%/60s down 30%/300s`, plus whatever is not a default;
/// what depends on the time (a pause still to end) as it stands at `now`.
pub fn summary(autoscaler: &Autoscaler, now: Timestamp) -> String {
    let rule = &autoscaler.rule;
    let target = &autoscaler.target;
    let per_replica = if rule.algorithm() == Algorithm::Average { " per replica" } else { "" };
    let metrics: Vec<String> = rule
        .metrics()
        .iter()
        .zip(&autoscaler.metrics)
        .map(|(metric, source)| {
            let low = format_quantity(&metric.low_watermark);
            let high = format_quantity(&metric.high_watermark);
            match &source.resource {
                Some(resource) => {
                    let per_pod = match resource.aggregation {
                        super::PodAggregation::Sum => "summed over",
                        super::PodAggregation::Average => "averaged over",
                    };
                    format!(
                        "{} ({} {per_pod} pods {}): {low}..{high}{per_replica}",
                        metric.name, resource.resource, resource.selector
                    )
                }
                None => format!("{} via {}: {low}..{high}{per_replica}", metric.name, source.backend),
            }
        })
        .collect();
    let sources = match &autoscaler.recommender {
        Some(recommender) => format!("recommender {} ({})", recommender.display_url(), recommender.metric_name()),
        None => format!("{} ({})", plural(metrics.len(), "metric"), metrics.join(", ")),
    };
    let mut parts = vec![
        format!("{}: {} {}/{}", autoscaler.name, target.kind, target.namespace, target.name),
        format!("{}..{} replicas", rule.min_replicas(), rule.max_replicas()),
        format!("every {}", seconds(autoscaler.interval(super::DEFAULT_INTERVAL))),
        sources,
        velocity(rule.velocity()),
    ];
    let (up_delay, down_delay) = (rule.upscale_delay_above_watermark(), rule.downscale_delay_below_watermark());
    if !up_delay.is_zero() || !down_delay.is_zero() {
        parts.push(format!("delays up {} down {}", seconds(up_delay), seconds(down_delay)));
    }
    if let Some(towards) = rule.converge_towards_watermark() {
        let towards = match towards {
            ConvergeTowards::High => "high",
            ConvergeTowards::Low => "low",
        };
        parts.push(format!("converging towards {towards}"));
    }
    if rule.replica_modulo() > 1 {
        parts.push(format!("modulo {}", rule.replica_modulo()));
    }
    if rule.dry_run() {
        parts.push("dry run".into());
    }
    if let Some(zero) = rule.scale_to_zero() {
        let activations: Vec<String> = rule
            .metrics()
            .iter()
            .zip(&zero.activations)
            .map(|(metric, activation)| format!("{} > {}", metric.name, format_quantity(activation)))
            .collect();
        parts.push(format!("scales to zero after {} idle, wakes on {}", seconds(zero.delay), activations.join(" or ")));
    }
    if autoscaler.shadow {
        parts.push("shadow: compared with the active rule on its target, never written".into());
    }
    parts.extend(ahead(autoscaler, now));
    parts.join(", ")
}

/// What looks ahead or stands in: schedules, a forecast, a fallback, a pause still to end.
fn ahead(autoscaler: &Autoscaler, now: Timestamp) -> Vec<String> {
    let mut parts = Vec::new();
    if !autoscaler.schedules.is_empty() {
        // When each window next opens, on its own clock: what a cron expression and a time
        // zone are easiest to get wrong.
        let windows: Vec<String> = autoscaler
            .schedules
            .iter()
            .map(|s| {
                let open = if s.is_open(now) { "open now, " } else { "" };
                let next = s.next_opening(now).map_or_else(
                    || "no opening in the next nine years".to_string(),
                    |at| format!("next opens {}", s.local_time(at)),
                );
                format!("{} (floor {}, {open}{next})", s.name, s.min_replicas)
            })
            .collect();
        parts.push(format!("schedule: {}", windows.join(", ")));
    }
    if let Some(forecast) = &autoscaler.forecast {
        let mode = match forecast.mode {
            ForecastMode::Observe => "observed only",
            ForecastMode::Scale => "a floor",
        };
        parts.push(format!("forecast {}s ahead, {mode}", forecast.lead_time.as_secs()));
    }
    if let Some(fallback) = &autoscaler.fallback {
        let action = match fallback.action {
            FallbackAction::Hold => "hold".to_string(),
            FallbackAction::Replicas { replicas, scale_down: false } => format!("at least {replicas}"),
            FallbackAction::Replicas { replicas, scale_down: true } => format!("{replicas}"),
            FallbackAction::LastGood => "the last good count".to_string(),
        };
        parts.push(format!("fallback after {}s without data: {action}", fallback.after.as_secs()));
    }
    if let Some(until) = autoscaler.paused_until.filter(|until| *until > now) {
        parts.push(format!("paused until {}", shown(until)));
    }
    parts
}

fn shown(instant: Timestamp) -> String {
    jiff::Timestamp::from_millisecond(instant.unix_millis()).map_or_else(|_| "?".into(), |t| t.to_string())
}

/// [`warnings`], and what only the time makes so at `now`: a pause that has ended. That is no
/// error: a file that was valid stays valid as time passes, and a reload is not refused for it.
pub fn warnings_at(autoscaler: &Autoscaler, now: Timestamp) -> Vec<String> {
    let mut out = warnings(autoscaler);
    if let Some(until) = autoscaler.paused_until.filter(|until| *until <= now) {
        out.push(format!(
            "paused_until ({}) has passed: the autoscaler is not paused (remove the line, or set a time to come)",
            shown(until)
        ));
    }
    out
}

/// What is valid but will not do what its author probably means: today, scale to zero on
/// metrics that read nothing, or never read idle, at zero pods.
pub fn warnings(autoscaler: &Autoscaler) -> Vec<String> {
    let rule = &autoscaler.rule;
    let Some(zero) = rule.scale_to_zero() else { return Vec::new() };
    let mut out = Vec::new();
    if rule.algorithm() == Algorithm::Average {
        out.push(
            "min_replicas = 0 with algorithm = \"average\": a per-replica average reads nothing at zero replicas; \
             scale to zero suits metrics that do not come from the pods (a queue depth, a request rate at the load \
             balancer), compared as totals with each activation"
                .to_string(),
        );
    }
    for (source, activation) in autoscaler.metrics.iter().zip(&zero.activations) {
        if source.resource.is_some() {
            out.push(format!(
                "metric {:?} is read from the pods, so at zero replicas it reads nothing and can never wake the \
                 workload: another metric, from outside the pods, has to",
                source.name
            ));
        }
        if activation.is_zero() && !rule.tolerate_zero() {
            out.push(format!(
                "metric {:?} has activation 0 and tolerate_zero is off: a reading of exactly 0 is not taken as idle, \
                 so the workload never goes to zero; set tolerate_zero = true if 0 is a real reading (an empty queue)",
                source.name
            ));
        }
    }
    out
}

fn velocity(velocity: &Velocity) -> String {
    match velocity {
        Velocity::Watermark(v) => format!(
            "watermark velocity up {}%/{} down {}%/{}",
            v.scale_up_limit_factor,
            seconds(v.upscale_forbidden_window),
            v.scale_down_limit_factor,
            seconds(v.downscale_forbidden_window)
        ),
        Velocity::Behavior(b) => {
            format!("behavior up {}; down {}", scaling_rules(&b.scale_up), scaling_rules(&b.scale_down))
        }
    }
}

/// `max(4 pods/15s, 100%/15s), stabilization 0s`, or `disabled`.
fn scaling_rules(rules: &ScalingRules) -> String {
    let select = match rules.select_policy {
        SelectPolicy::Disabled => return "disabled".into(),
        SelectPolicy::Max => "max",
        SelectPolicy::Min => "min",
    };
    let policies: Vec<String> = rules.policies.iter().map(policy).collect();
    format!("{select}({}), stabilization {}", policies.join(", "), seconds(rules.stabilization_window))
}

fn policy(policy: &Policy) -> String {
    match policy.kind {
        PolicyKind::Pods => format!("{} pods/{}", policy.value, seconds(policy.period)),
        PolicyKind::Percent => format!("{}%/{}", policy.value, seconds(policy.period)),
    }
}

/// `300s` rather than `5m`: the unit every WPA and HPA field uses.
fn seconds(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}s", duration.as_secs_f64())
    }
}

/// `1 metric`, `2 metrics`.
pub(crate) fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}
