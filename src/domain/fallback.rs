//! Fallback: what an autoscaler does once every one of its metrics has had no usable value for
//! a while, declared by its operator instead of guessed. It enters fallback when the data has
//! been missing for `after`, and leaves only when the data has been good again for
//! `recover_after`, so that data coming and going does not make it flap. While it is in
//! fallback and the data is missing, the engine goes to the declared count (up only, unless the
//! operator allowed a scale down); while the data is back but not yet for long enough, that
//! count stays a floor (from the first evaluation with usable data on).
//!
//! A count that may scale down is gone to only when the data has been missing for `after`
//! without a break: on entering, and again if the data comes back and then stays away that
//! long. A shorter gap in fallback holds the replicas, as missing data does outside fallback.
//! Otherwise each missing row of intermittent data would drop to the count at once, around the
//! forbidden windows and the limits, and each good row would scale back up.
//!
//! A pure state machine: the runtime keeps one [`FallbackMemory`] per autoscaler and tells it,
//! at each evaluation, whether any metric was usable.

use std::borrow::Cow;
use std::time::Duration;

use watermarkd_engine::{Bounds, Decision, Fallback, Position, Rule, Timestamp};

/// The default time every metric must be missing before fallback.
pub const DEFAULT_AFTER: Duration = Duration::from_secs(300);
/// The default time the data must be good again before leaving fallback.
pub const DEFAULT_RECOVER_AFTER: Duration = Duration::from_secs(120);

/// An autoscaler's declared fallback (`[autoscaler.fallback]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackRule {
    pub after: Duration,
    pub recover_after: Duration,
    pub action: FallbackAction,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackAction {
    /// Keep the replicas as they are (what an autoscaler without a fallback does), and say so.
    Hold,
    /// Go to `replicas`: up only, unless `scale_down`.
    Replicas { replicas: u32, scale_down: bool },
    /// Keep at least the count last decided while the data was good.
    LastGood,
}

/// What one autoscaler remembers of its data's absence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FallbackMemory {
    /// Since when no metric has been usable, while that lasts.
    missing_since: Option<Timestamp>,
    /// The count last decided with usable data, outside fallback.
    last_good: Option<u32>,
    active: Option<Active>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Active {
    entered: Timestamp,
    /// Since when the data has been good again, while it is.
    good_since: Option<Timestamp>,
    /// The count it falls back to, fixed when it entered.
    replicas: Option<u32>,
    /// Whether the data has been missing for `after` without a break (since it entered, or
    /// since it went again): only then does a count that may scale down apply.
    missing_long: bool,
}

/// A change of fallback at one evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Entered { why: String },
    Left { why: String },
}

impl FallbackMemory {
    /// Notes what this evaluation found (whether any metric was usable), and says whether that
    /// enters or leaves fallback.
    pub fn observe(&mut self, rule: &FallbackRule, any_usable: bool, now: Timestamp) -> Option<Change> {
        if any_usable {
            self.missing_since = None;
            let active = self.active.as_mut()?;
            active.missing_long = false;
            let good_since = *active.good_since.get_or_insert(now);
            if now.since(good_since) >= rule.recover_after {
                self.active = None;
                let why = format!("metric data usable again for {}", shown(rule.recover_after));
                return Some(Change::Left { why });
            }
            return None;
        }
        let missing_since = *self.missing_since.get_or_insert(now);
        if let Some(active) = self.active.as_mut() {
            // The data went again before it had been good for long enough.
            active.good_since = None;
            active.missing_long = now.since(missing_since) >= rule.after;
            return None;
        }
        if now.since(missing_since) < rule.after {
            return None;
        }
        let replicas = match rule.action {
            FallbackAction::Hold => None,
            FallbackAction::Replicas { replicas, .. } => Some(replicas),
            FallbackAction::LastGood => self.last_good,
        };
        self.active = Some(Active { entered: now, good_since: None, replicas, missing_long: true });
        Some(Change::Entered { why: self.because(rule) })
    }

    /// Notes the count decided with usable data, the one `last_good` falls back to.
    pub fn decided(&mut self, any_usable: bool, replicas: u32) {
        if any_usable && self.active.is_none() {
            self.last_good = Some(replicas);
        }
    }

    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// `rule` as it holds in fallback, after [`FallbackMemory::observe`] has noted this
    /// evaluation: with the declared count to go to when no metric is usable, and, while the
    /// data is back but not yet for long, that count as a floor.
    pub fn apply<'r>(&self, rule: &FallbackRule, engine: Cow<'r, Rule>) -> Cow<'r, Rule> {
        let Some(active) = &self.active else { return engine };
        let because = self.because(rule);
        // Holding is falling back to no count: the decisions still say they are in fallback.
        let Some(replicas) = active.replicas else {
            return Cow::Owned(engine.into_owned().falling_back(Fallback { replicas: 0, scale_down: false, because }));
        };
        let scale_down = matches!(rule.action, FallbackAction::Replicas { scale_down: true, .. });
        if scale_down && !active.missing_long {
            // The data came back and went again, not yet for `after`: hold, as without a count.
            let because = format!(
                "in fallback; the data came back and has been missing again for less than {}, too short to go to \
                 {replicas} replicas",
                shown(rule.after)
            );
            return Cow::Owned(engine.into_owned().falling_back(Fallback { replicas: 0, scale_down: false, because }));
        }
        let mut engine = engine.into_owned().falling_back(Fallback { replicas, scale_down, because });
        let floor = replicas.min(engine.max_replicas());
        if active.good_since.is_some() && !scale_down && floor > engine.min_replicas() {
            let max = engine.max_replicas();
            let min_by = Some(format!("fallback, until the data has been usable for {}", shown(rule.recover_after)));
            engine = engine.within(Bounds { min: floor, max, min_by, max_by: None });
        }
        Cow::Owned(engine)
    }

    fn because(&self, rule: &FallbackRule) -> String {
        let target = match (rule.action, self.active.as_ref().and_then(|a| a.replicas)) {
            (FallbackAction::Hold, _) => "holding the replicas".to_string(),
            (_, Some(replicas)) => format!("falling back to {replicas} replicas"),
            (_, None) => "holding the replicas (no count was decided on good data yet)".to_string(),
        };
        format!("no usable metric value for {}: {target}", shown(rule.after))
    }

    /// Decides under the declared fallback: whether any metric was usable moves it in or out
    /// of fallback, and a decision made as that changed is made again under the new state.
    /// `decide` is the engine's decision on this evaluation's readings with a given rule.
    pub fn decide(
        &mut self,
        declared: &FallbackRule,
        rule: &Rule,
        now: Timestamp,
        decide: impl Fn(&Rule) -> Decision,
    ) -> (Decision, Option<Change>) {
        // Whether a metric is usable does not depend on the fallback, so the rule as it is
        // tells; the fallback then notes this evaluation before deciding under it, so that the
        // first good evaluation after a gap is already floored by the count.
        let plain = decide(rule);
        let any_usable = plain.metrics.iter().any(|m| m.position != Position::Unavailable);
        let change = self.observe(declared, any_usable, now);
        let decision = if self.active.is_some() { decide(&self.apply(declared, Cow::Borrowed(rule))) } else { plain };
        self.decided(any_usable, decision.replicas);
        (decision, change)
    }

    /// When it entered fallback, if it is in it.
    pub fn entered(&self) -> Option<Timestamp> {
        self.active.as_ref().map(|a| a.entered)
    }
}

fn shown(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::{decide, MetricSpec, Reading, RuleSpec, State, Target};

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_unix_millis(1_700_000_000_000).plus(Duration::from_secs(seconds))
    }

    fn fallback(action: FallbackAction) -> FallbackRule {
        FallbackRule { after: Duration::from_secs(300), recover_after: Duration::from_secs(120), action }
    }

    #[test]
    fn it_enters_after_the_data_has_been_missing_long_enough_and_leaves_only_after_it_has_been_good() {
        let rule = fallback(FallbackAction::Replicas { replicas: 8, scale_down: false });
        let mut memory = FallbackMemory::default();
        assert_eq!(memory.observe(&rule, false, at(0)), None);
        assert_eq!(memory.observe(&rule, false, at(299)), None);
        assert_eq!(
            memory.observe(&rule, false, at(300)),
            Some(Change::Entered { why: "no usable metric value for 5m: falling back to 8 replicas".into() })
        );
        assert_eq!(memory.entered(), Some(at(300)));
        // Data for a minute, then gone again: still in fallback, and the recovery starts over.
        assert_eq!(memory.observe(&rule, true, at(360)), None);
        assert_eq!(memory.observe(&rule, false, at(420)), None);
        assert_eq!(memory.observe(&rule, true, at(480)), None);
        assert_eq!(memory.observe(&rule, true, at(599)), None);
        assert!(memory.is_active());
        assert_eq!(
            memory.observe(&rule, true, at(600)),
            Some(Change::Left { why: "metric data usable again for 2m".into() })
        );
        assert!(!memory.is_active());
        // A short gap afterwards does not enter again.
        assert_eq!(memory.observe(&rule, false, at(700)), None);
        assert_eq!(memory.observe(&rule, true, at(710)), None);
        assert_eq!(memory.observe(&rule, false, at(800)), None);
        assert_eq!(memory.observe(&rule, false, at(1099)), None);
    }

    fn engine_rule() -> Rule {
        Rule::new(RuleSpec {
            min_replicas: Some(1),
            max_replicas: Some(20),
            metrics: vec![MetricSpec {
                name: "m".into(),
                low_watermark: Some(watermarkd_engine::Decimal::from_int(5)),
                high_watermark: Some(watermarkd_engine::Decimal::from_int(10)),
                max_age: None,
                activation: None,
            }],
            ..RuleSpec::default()
        })
        .unwrap()
    }

    fn replicas(rule: &Rule, spec: u32, reading: Reading, now: Timestamp) -> u32 {
        let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
        decide(rule, target, &[reading], &State::default(), now).replicas
    }

    #[test]
    fn in_fallback_the_count_is_gone_to_without_data_and_held_as_a_floor_while_it_recovers() {
        let rule = fallback(FallbackAction::Replicas { replicas: 8, scale_down: false });
        let engine = engine_rule();
        let mut memory = FallbackMemory::default();
        memory.observe(&rule, false, at(0));
        memory.observe(&rule, false, at(300));
        let missing = Reading::Unavailable { reason: "timeout".into() };
        assert_eq!(replicas(&memory.apply(&rule, Cow::Borrowed(&engine)), 3, missing, at(300)), 8);
        // The data is back, low: the floor keeps 8 until it has been good for 2m.
        memory.observe(&rule, true, at(360));
        let low = Reading::Value { value: 1.0, at: at(360) };
        assert_eq!(replicas(&memory.apply(&rule, Cow::Borrowed(&engine)), 8, low.clone(), at(360)), 8);
        memory.observe(&rule, true, at(480));
        assert!(matches!(memory.apply(&rule, Cow::Borrowed(&engine)), Cow::Borrowed(_)), "out of fallback");
        assert!(replicas(&engine, 8, low, at(480)) < 8);
    }

    #[test]
    fn last_good_falls_back_to_the_count_last_decided_on_good_data() {
        let rule = fallback(FallbackAction::LastGood);
        let mut memory = FallbackMemory::default();
        memory.decided(true, 6);
        memory.observe(&rule, false, at(0));
        memory.decided(false, 2);
        let entered = memory.observe(&rule, false, at(300));
        assert_eq!(
            entered,
            Some(Change::Entered { why: "no usable metric value for 5m: falling back to 6 replicas".into() })
        );
        let missing = Reading::Unavailable { reason: "timeout".into() };
        let engine = engine_rule();
        assert_eq!(replicas(&memory.apply(&rule, Cow::Borrowed(&engine)), 2, missing, at(300)), 6);
        // Hold says so, and changes nothing.
        let hold = fallback(FallbackAction::Hold);
        let mut memory = FallbackMemory::default();
        memory.observe(&hold, false, at(0));
        let entered = memory.observe(&hold, false, at(300));
        assert_eq!(
            entered,
            Some(Change::Entered { why: "no usable metric value for 5m: holding the replicas".into() })
        );
        let holding = memory.apply(&hold, Cow::Borrowed(&engine));
        let missing = Reading::Unavailable { reason: "timeout".into() };
        let target = Target { spec_replicas: 4, status_replicas: Some(4), ready_replicas: Some(4) };
        let decision = decide(&holding, target, &[missing], &State::default(), at(300));
        assert_eq!(decision.replicas, 4);
        assert_eq!(decision.fallback.as_deref(), Some("no usable metric value for 5m: holding the replicas"));
        assert!(
            decision.reason.ends_with("(no usable metric value for 5m: holding the replicas): holding 4 replicas"),
            "{}",
            decision.reason
        );
    }

    /// One evaluation through [`FallbackMemory::decide`], as the daemon and `simulate` make it:
    /// the replicas decided from `spec` and the decision's reason.
    fn evaluate(
        memory: &mut FallbackMemory,
        rule: &FallbackRule,
        spec: u32,
        value: Option<f64>,
        now: Timestamp,
    ) -> (u32, String) {
        let reading = match value {
            Some(value) => Reading::Value { value, at: now },
            None => Reading::Unavailable { reason: "timeout".into() },
        };
        let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
        let engine = engine_rule();
        let decide = |rule: &Rule| decide(rule, target, std::slice::from_ref(&reading), &State::default(), now);
        let (decision, _) = memory.decide(rule, &engine, now, decide);
        (decision.replicas, decision.reason)
    }

    #[test]
    fn the_count_is_a_floor_from_the_first_good_evaluation_after_the_gap() {
        let rule = fallback(FallbackAction::Replicas { replicas: 8, scale_down: false });
        let mut memory = FallbackMemory::default();
        assert_eq!(evaluate(&mut memory, &rule, 4, None, at(0)).0, 4);
        assert_eq!(evaluate(&mut memory, &rule, 4, None, at(300)).0, 8);
        // Low data (it would ask for fewer) on the very first good evaluation: still 8.
        let (replicas, reason) = evaluate(&mut memory, &rule, 8, Some(1.0), at(315));
        assert_eq!(replicas, 8, "{reason}");
        assert_eq!(evaluate(&mut memory, &rule, 8, Some(1.0), at(330)).0, 8);
        // Good for 2m: out of fallback, and the data decides.
        assert!(evaluate(&mut memory, &rule, 8, Some(1.0), at(435)).0 < 8);
        assert!(!memory.is_active());
    }

    #[test]
    fn a_count_that_may_scale_down_is_gone_to_again_only_after_the_data_has_been_missing_for_after() {
        let rule = fallback(FallbackAction::Replicas { replicas: 2, scale_down: true });
        let mut memory = FallbackMemory::default();
        assert_eq!(evaluate(&mut memory, &rule, 6, None, at(0)).0, 6);
        assert_eq!(evaluate(&mut memory, &rule, 6, None, at(300)).0, 2, "entered: down to the count");
        assert_eq!(evaluate(&mut memory, &rule, 6, None, at(315)).0, 2, "still missing: at the count");
        // The data comes back asking for more, and goes again: the gap holds, says why, and is
        // still in fallback.
        assert!(evaluate(&mut memory, &rule, 2, Some(60.0), at(330)).0 > 2);
        let (replicas, reason) = evaluate(&mut memory, &rule, 6, None, at(345));
        assert_eq!(replicas, 6, "{reason}");
        assert!(
            reason.contains("in fallback; the data came back and has been missing again for less than 5m, too short to go to 2 replicas"),
            "{reason}"
        );
        assert!(memory.is_active());
        assert_eq!(evaluate(&mut memory, &rule, 6, Some(7.0), at(360)).0, 6, "inside the band");
        assert_eq!(evaluate(&mut memory, &rule, 6, None, at(375)).0, 6);
        assert_eq!(evaluate(&mut memory, &rule, 6, None, at(674)).0, 6, "missing for 4m59s");
        // Missing for `after` without a break: the count again.
        let (replicas, reason) = evaluate(&mut memory, &rule, 6, None, at(675));
        assert_eq!(replicas, 2, "{reason}");
        assert!(reason.contains("falling back to 2 replicas"), "{reason}");
    }
}
