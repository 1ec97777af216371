//! A decision in plain sentences, for `watermarkd status` and the status page: what was done,
//! where each metric stood against its band, what it asked for, and each limit, window or
//! delay that kept the replicas from it. Worded from the decision and the rule it was made
//! with (the schedule's or forecast's bounds already applied), so that the sentence names the
//! setting an operator would change.

use std::time::Duration;

use watermarkd_engine::{Action, Decision, Guard, MetricOutcome, Position, Rule, Velocity};

/// What the decision alone does not say.
#[derive(Clone, Copy, Debug, Default)]
pub struct Context<'a> {
    /// Why the autoscaler decided and wrote nothing, as said after "but": `paused until
    /// 2026-12-01T08:00:00Z` (RFC 3339), `observing only (observe = true)`, or the guard's word
    /// that another controller scales the target.
    pub held: Option<&'a str>,
    /// Whether the scale was written (or would have been, in a dry run or a pause).
    pub scaled: bool,
}

/// A number as a person reads it: the engine's way, as in its reasons (four significant
/// digits, no trailing zeros).
pub use watermarkd_engine::human as number;

/// Seconds as `3m 12s` (whole seconds, rounded up: "0s left" would be wrong while it is not).
pub fn span(seconds: f64) -> String {
    let whole = if seconds.is_finite() && seconds > 0.0 { seconds.ceil() as u64 } else { 0 };
    humantime::format_duration(Duration::from_secs(whole)).to_string()
}

/// The headline: what this evaluation did with the replicas.
pub fn headline(decision: &Decision, context: Context<'_>) -> String {
    let (spec, to) = (decision.spec_replicas, decision.replicas);
    let way = match decision.action {
        Action::Hold => return format!("held at {spec}"),
        Action::ScaleUp => "up",
        Action::ScaleDown => "down",
    };
    let moved = format!("{way} from {spec} to {to}");
    if let Some(held) = context.held {
        format!("would scale {moved}, but {held}")
    } else if decision.dry_run {
        format!("would scale {moved} (dry run: nothing written)")
    } else if context.scaled {
        format!("scaled {moved}")
    } else {
        format!("tried to scale {moved}, and the write did not happen")
    }
}

/// Where one metric stood: "usage 0.81 is inside [0.6, 0.9]". The band named is the
/// watermarks; the tolerance around them is named only when it decided (a value outside the
/// watermarks that the tolerance still counts as inside).
pub fn metric_sentence(metric: &MetricOutcome, ready: u32, per_replica: bool) -> String {
    let name = &metric.name;
    let Some(usage) = metric.usage.filter(|_| metric.position != Position::Unavailable) else {
        let why = metric.note.as_deref().unwrap_or("no reading");
        return format!("{name} has no usable value: {why}");
    };
    let what = match (per_replica, metric.value) {
        (true, Some(value)) => {
            format!("{name} per replica {} ({} over {ready} ready)", number(usage), number(value))
        }
        _ => format!("{name} {}", number(usage)),
    };
    let band = format!("[{}, {}]", number(metric.low_watermark), number(metric.high_watermark));
    let position = match metric.position {
        Position::Above => format!("is above {band}"),
        Position::Below => format!("is below {band}"),
        Position::Inside | Position::Unavailable if usage > metric.high_watermark || usage < metric.low_watermark => {
            format!(
                "is outside {band} but inside the tolerance [{}, {}]",
                number(metric.band_low),
                number(metric.band_high)
            )
        }
        Position::Inside | Position::Unavailable => format!("is inside {band}"),
    };
    let age = metric.age_seconds.map(|a| format!(", {} old", span(a))).unwrap_or_default();
    let asks = match (metric.position, metric.proposal) {
        (Position::Above | Position::Below, Some(p)) => format!(", asks for {p}"),
        _ => String::new(),
    };
    let note = metric.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
    format!("{what} {position}{age}{asks}{note}")
}

/// The forbidden window of a direction, as configured (behavior rules have none).
fn window(rule: &Rule, up: bool) -> Option<Duration> {
    match rule.velocity() {
        Velocity::Watermark(w) if up => Some(w.upscale_forbidden_window),
        Velocity::Watermark(w) => Some(w.downscale_forbidden_window),
        Velocity::Behavior(_) => None,
    }
}

/// Why a guard decided instead of the metrics.
fn guard_sentence(guard: Guard, decision: &Decision, rule: &Rule) -> String {
    let spec = decision.spec_replicas;
    match guard {
        Guard::Paused => "spec.replicas is 0: a person paused the workload, so nothing is changed".into(),
        Guard::AtZero => "the workload is at zero; a metric above its activation wakes it".into(),
        Guard::NoData => match &decision.fallback {
            Some(because) => format!("no metric has a usable value ({because}): the fallback decides"),
            None if decision.metrics.iter().all(|m| m.position == Position::Unavailable) => {
                format!("no metric has a usable value: holding {spec} (missing data is never read as 0)")
            }
            None => format!("spec {spec} is outside the bounds, and not every metric is available: holding"),
        },
        Guard::AboveMax => format!("spec {spec} is above max_replicas {}", rule.max_replicas()),
        Guard::BelowMin => format!("spec {spec} is below min_replicas {}", rule.min_running_replicas()),
        Guard::MinAvailable => format!(
            "only {} of {spec} replicas are ready, under min_available_replica_percentage {}%: holding",
            decision.ready_replicas,
            rule.min_available_replica_percentage()
        ),
        Guard::NoReadyReplicas => "no replica is ready: holding".into(),
    }
}

/// Every sentence of one decision, the headline first. The headline says what bound this
/// decision: a guard, else a forbidden window or delay that held a move (ahead of the limit
/// that cut the move down), else the limit, else stabilization, else what the metrics asked.
pub fn explain(decision: &Decision, rule: &Rule, context: Context<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let why = match decision.guard {
        Some(guard) => guard_sentence(guard, decision, rule),
        None => decision_sentence(decision, rule),
    };
    out.push(format!("{}: {why}", headline(decision, context)));
    let per_replica = matches!(rule.algorithm(), watermarkd_engine::Algorithm::Average);
    for metric in &decision.metrics {
        out.push(metric_sentence(metric, decision.ready_replicas, per_replica));
    }
    if let Some(s) = decision.stabilization.filter(|s| Some(s.stabilized) != decision.proposal) {
        let sentence = stabilized_sentence(s);
        // Unless the headline already says it, as what held the replicas.
        if !why.contains(&sentence) {
            out.push(sentence);
        }
    }
    if let Some(by) = rule.bounds_by() {
        if let Some(min_by) = &by.min_by {
            out.push(format!("min_replicas is {} now, set by {min_by}", rule.min_replicas()));
        }
        if let Some(max_by) = &by.max_by {
            out.push(format!("max_replicas is {} now, set by {max_by}", rule.max_replicas()));
        }
    }
    out
}

fn stabilized_sentence(s: watermarkd_engine::Stabilization) -> String {
    format!("stabilized to {}: the recent recommendations range from {} to {}", s.stabilized, s.lower, s.upper)
}

/// The velocity model's part: what bound the replicas, and the proposal it bound.
fn decision_sentence(decision: &Decision, rule: &Rule) -> String {
    let spec = decision.spec_replicas;
    let (Some(proposal), Some(normalized)) = (decision.proposal, decision.normalized) else {
        return format!("nothing to propose: holding {spec}");
    };
    let stabilized = decision.stabilization.map_or(proposal, |s| s.stabilized);
    let limited = (normalized != stabilized).then(|| rule.limited_by(decision.limit));
    // A window or delay that kept a move the limits allowed: that, not the limit, is why the
    // replicas stayed where they are.
    if let Some(held) = held_sentence(decision, rule) {
        let way = if normalized > spec { "up" } else { "down" };
        let toward = match &limited {
            Some(by) => format!(" (wanted {stabilized}, limited by {by})"),
            None => String::new(),
        };
        return format!("{held} before a scale {way} to {normalized}{toward}");
    }
    if let Some(by) = limited {
        return format!("wanted {stabilized}, limited to {normalized} by {by}");
    }
    if stabilized != proposal {
        if let Some(s) = decision.stabilization {
            return format!("{} (the metrics ask for {proposal})", stabilized_sentence(s));
        }
    }
    let inside = decision.metrics.iter().all(|m| matches!(m.position, Position::Inside | Position::Unavailable));
    match (decision.converging, inside, normalized == spec) {
        (true, _, _) => format!("converging one step to {normalized}"),
        (false, true, true) => "every metric is inside its band".into(),
        (false, _, true) if decision.ready_replicas < spec => {
            format!("the metrics ask for {spec}, as many as run ({} of them ready yet)", decision.ready_replicas)
        }
        (false, _, true) => format!("the metrics ask for {spec}, as many as run"),
        (false, _, false) => format!("the metrics ask for {normalized}"),
    }
}

/// The forbidden window or delay that held a move the metrics and limits allowed, if one did.
fn held_sentence(decision: &Decision, rule: &Rule) -> Option<String> {
    if decision.action != Action::Hold || decision.guard.is_some() {
        return None;
    }
    let normalized = decision.normalized?;
    let t = &decision.timing;
    let spec = decision.spec_replicas;
    let held = if normalized > spec {
        Held {
            way: "up",
            window_left: t.upscale_window_seconds_left,
            delay_left: t.upscale_delay_seconds_left,
            condition: "above the high",
            delay: rule.upscale_delay_above_watermark(),
            delay_setting: "upscale_delay_above_watermark",
        }
    } else if normalized < spec {
        Held {
            way: "down",
            window_left: t.downscale_window_seconds_left,
            delay_left: t.downscale_delay_seconds_left,
            condition: "below the low",
            delay: rule.downscale_delay_below_watermark(),
            delay_setting: "downscale_delay_below_watermark",
        }
    } else {
        return None;
    };
    held.sentence(window(rule, held.way == "up"))
}

/// What holds a move one way: its forbidden window, else its delay.
struct Held {
    way: &'static str,
    window_left: f64,
    delay_left: f64,
    condition: &'static str,
    delay: Duration,
    delay_setting: &'static str,
}

impl Held {
    fn sentence(&self, configured: Option<Duration>) -> Option<String> {
        if self.window_left > 0.0 {
            let configured = configured.map(|w| format!(" {}", span(w.as_secs_f64()))).unwrap_or_default();
            let setting = if self.way == "up" { "upscale" } else { "downscale" };
            Some(format!("{setting}_forbidden_window{configured} has {} left", span(self.window_left)))
        } else if self.delay_left > 0.0 {
            Some(format!(
                "the metric must stay {} watermark {} more ({} {})",
                self.condition,
                span(self.delay_left),
                self.delay_setting,
                span(self.delay.as_secs_f64())
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use watermarkd_engine::{decide, Fallback, Limit, Reading, Recommendation, State, Target, Timestamp};

    fn rule(extra: serde_json::Value) -> Rule {
        let mut spec = json!({
            "min_replicas": 1, "max_replicas": 30, "algorithm": "average",
            "metric": [{ "name": "usage", "query": "q", "high_watermark": 0.9, "low_watermark": 0.6 }]
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        crate::domain::rules::rule_from_json(&spec).expect("rule")
    }

    const NOW: i64 = 1_700_000_000_000;

    fn decision(rule: &Rule, spec: u32, total: f64, state: &State) -> Decision {
        let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
        let reading = [Reading::Value { value: total, at: Timestamp::from_unix_millis(NOW - 10_000) }];
        decide(rule, target, &reading, state, Timestamp::from_unix_millis(NOW))
    }

    fn sentences(rule: &Rule, spec: u32, total: f64, state: &State) -> Vec<String> {
        explain(&decision(rule, spec, total, state), rule, Context { scaled: true, ..Context::default() })
    }

    #[test]
    fn a_hold_inside_the_band_names_the_value_and_the_band() {
        // 12 replicas at 0.75 each.
        let said = sentences(&rule(json!({})), 12, 9.0, &State::default());
        assert_eq!(said[0], "held at 12: every metric is inside its band", "{said:?}");
        assert_eq!(said[1], "usage per replica 0.75 (9 over 12 ready) is inside [0.6, 0.9], 10s old", "{said:?}");
    }

    #[test]
    fn a_capped_scale_up_names_the_factor() {
        // 2 replicas at 1.8 each ask for 4; a 50% factor allows 3.
        let rule = rule(json!({ "scale_up_limit_factor": 50 }));
        let said = sentences(&rule, 2, 3.6, &State::default());
        assert_eq!(said[0], "scaled up from 2 to 3: wanted 4, limited to 3 by scale_up_limit_factor 50%", "{said:?}");
        assert!(said[1].ends_with("is above [0.6, 0.9], 10s old, asks for 4"), "{said:?}");
    }

    #[test]
    fn a_forbidden_window_says_how_long_is_left() {
        let rule = rule(json!({ "downscale_forbidden_window": "5m" }));
        let state = State { last_scale_time: Some(Timestamp::from_unix_millis(NOW - 108_000)), ..State::default() };
        let said = sentences(&rule, 10, 1.0, &state);
        // 10 replicas at 0.1 each ask for floor(1 / 0.6) = 1; the default 20% scale-down limit allows 8.
        assert_eq!(
            said[0],
            "held at 10: downscale_forbidden_window 5m has 3m 12s left before a scale down to 8 (wanted 1, limited by \
             scale_down_limit_factor 20%)",
            "{said:?}"
        );
        assert_eq!(said.len(), 2, "the window is said once, in the headline: {said:?}");
    }

    /// The review's case: a limit lowered the proposal, and the window held even that. The
    /// window is what kept the replicas at 18, so it leads; the limit says what it would allow.
    #[test]
    fn a_window_that_held_the_replicas_leads_ahead_of_the_limit() {
        let rule = rule(json!({ "max_replicas": 20, "upscale_forbidden_window": "15s" }));
        let state = State { last_scale_time: Some(Timestamp::from_unix_millis(NOW - 10_000)), ..State::default() };
        // 18 replicas at 1.4 each (25.2) ask for 28.
        let d = decision(&rule, 18, 25.2, &state);
        assert_eq!((d.action, d.proposal, d.normalized, d.limit), (Action::Hold, Some(28), Some(20), Limit::TooMany));
        let said = explain(&d, &rule, Context::default());
        assert_eq!(
            said[0],
            "held at 18: upscale_forbidden_window 15s has 5s left before a scale up to 20 (wanted 28, limited by \
             max_replicas 20)",
            "{said:?}"
        );
    }

    #[test]
    fn a_delay_that_held_the_replicas_leads() {
        let rule = rule(json!({ "upscale_delay_above_watermark": "1m" }));
        let state = State { above_since: Some(Timestamp::from_unix_millis(NOW - 20_000)), ..State::default() };
        // 2 replicas at 1.8 each ask for 4; the default 50% factor allows 3.
        let said = sentences(&rule, 2, 3.6, &state);
        assert_eq!(
            said[0],
            "held at 2: the metric must stay above the high watermark 40s more (upscale_delay_above_watermark 1m) \
             before a scale up to 3 (wanted 4, limited by scale_up_limit_factor 50%)",
            "{said:?}"
        );
    }

    #[test]
    fn max_replicas_that_held_the_replicas_is_named() {
        let rule = rule(json!({ "max_replicas": 20 }));
        let said = sentences(&rule, 20, 25.2, &State::default());
        assert_eq!(said[0], "held at 20: wanted 28, limited to 20 by max_replicas 20", "{said:?}");
    }

    #[test]
    fn stabilization_that_held_the_replicas_leads() {
        let rule = rule(json!({ "behavior": { "scale_down": { "stabilization_window": "5m" } } }));
        let earlier = Recommendation { replicas: 10, at: Timestamp::from_unix_millis(NOW - 60_000) };
        let state = State { recommendations: vec![earlier], ..State::default() };
        // 10 replicas at 0.36 each (3.6) ask for floor(3.6 / 0.6) = 6; a recommendation of 10 a
        // minute ago holds it.
        let d = decision(&rule, 10, 3.6, &state);
        assert_eq!((d.action, d.proposal), (Action::Hold, Some(6)), "{}", d.reason);
        let said = explain(&d, &rule, Context::default());
        assert_eq!(
            said[0],
            "held at 10: stabilized to 10: the recent recommendations range from 6 to 10 (the metrics ask for 6)",
            "{said:?}"
        );
        assert_eq!(said.iter().filter(|s| s.contains("stabilized to")).count(), 1, "said once: {said:?}");
    }

    #[test]
    fn a_guard_leads_when_it_decided() {
        let rule = rule(json!({ "max_replicas": 20 }));
        let said = sentences(&rule, 25, 1.0, &State::default());
        assert_eq!(said[0], "scaled down from 25 to 20: spec 25 is above max_replicas 20", "{said:?}");
    }

    #[test]
    fn a_pause_leads_what_would_have_been_done() {
        let rule = rule(json!({ "max_replicas": 20 }));
        let d = decision(&rule, 18, 25.2, &State::default());
        let paused = Context { held: Some("paused until 2026-12-01T08:00:00Z"), scaled: false };
        assert_eq!(
            explain(&d, &rule, paused)[0],
            "would scale up from 18 to 20, but paused until 2026-12-01T08:00:00Z: wanted 28, limited to 20 by \
             max_replicas 20"
        );
    }

    #[test]
    fn a_fallback_that_decided_is_named() {
        let because = "no usable metric value for 5m: falling back to 6 replicas".to_string();
        let rule = rule(json!({})).falling_back(Fallback { replicas: 6, scale_down: false, because });
        let target = Target { spec_replicas: 4, status_replicas: Some(4), ready_replicas: Some(4) };
        let none = [Reading::Unavailable { reason: "no data".into() }];
        let d = decide(&rule, target, &none, &State::default(), Timestamp::from_unix_millis(NOW));
        assert_eq!(
            explain(&d, &rule, Context { scaled: true, ..Context::default() })[0],
            "scaled up from 4 to 6: no metric has a usable value (no usable metric value for 5m: falling back to 6 \
             replicas): the fallback decides"
        );
    }

    #[test]
    fn missing_data_is_said_never_read_as_zero() {
        let rule = rule(json!({}));
        let target = Target { spec_replicas: 4, status_replicas: Some(4), ready_replicas: Some(4) };
        let none = [Reading::Unavailable { reason: "no data in the last 5m".into() }];
        let d = decide(&rule, target, &none, &State::default(), Timestamp::from_unix_millis(NOW));
        let said = explain(&d, &rule, Context::default());
        assert_eq!(said[0], "held at 4: no metric has a usable value: holding 4 (missing data is never read as 0)");
        assert_eq!(said[1], "usage has no usable value: no data in the last 5m");
    }

    #[test]
    fn a_dry_run_and_a_pause_say_what_would_have_been_done() {
        let rule = rule(json!({ "dry_run": true }));
        let d = decision(&rule, 2, 3.6, &State::default());
        let said = explain(&d, &rule, Context::default());
        assert!(said[0].starts_with("would scale up from 2 to 3 (dry run"), "{said:?}");
        let paused = Context { held: Some("paused until 2026-12-01T08:00:00Z"), scaled: false };
        assert!(headline(&d, paused).ends_with("but paused until 2026-12-01T08:00:00Z"));
    }

    #[test]
    fn numbers_and_spans_read_as_a_person_writes_them() {
        assert_eq!(number(0.8100000001), "0.81");
        assert_eq!(number(1234.5678), "1235");
        assert_eq!(number(0.0000125), "0.0000125");
        assert_eq!(span(191.2), "3m 12s");
        assert_eq!(span(f64::NAN), "0s");
    }
}
