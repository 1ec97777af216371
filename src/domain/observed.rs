//! An observing autoscaler (`observe = true`) beside the controller that really scales its
//! target: what that controller ran at each evaluation, and the running comparison of the two
//! (replica-hours, time above and below the band, scale events, the largest gap), so that a team
//! can watch a week before cutting over. Pure: the evaluation hands in what it read and decided,
//! with the instant; nothing here reads a clock or the cluster.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Algorithm, Decision, Timestamp};

/// What the live controller ran at one evaluation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Live {
    /// `Kind/namespace/name` of the controller that scales the target, when one is known (an
    /// HPA, KEDA's HPA, a ScaledObject, another controller's WPA); `None`: the target's own
    /// replicas, whoever sets them.
    pub controller: Option<Arc<str>>,
    /// The replicas it set: the target's `spec.replicas` as this evaluation read it.
    pub replicas: u32,
    /// An HPA's own say, when the controller is one: `status.desiredReplicas` (what it asked
    /// for last) and `status.currentReplicas` (what it saw running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u32>,
}

/// One side's totals over the observed time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// Replicas times seconds.
    pub replica_seconds: f64,
    /// Seconds during which a metric was above its band, at this side's replicas.
    pub above_band_seconds: f64,
    /// Seconds during which every metric was below its band, at this side's replicas.
    pub below_band_seconds: f64,
    /// Changes of its replica count.
    pub scale_events: u64,
    /// The replicas at the last evaluation.
    pub replicas: u32,
}

/// The running comparison of an observing autoscaler with the live controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Unix seconds of the first and the last evaluation compared.
    pub since: i64,
    pub last_at: i64,
    /// Seconds covered: the time between evaluations, each gap at most twice the interval (a
    /// daemon that was down compares nothing for the time it was down).
    pub seconds: f64,
    /// What watermarkd decided.
    pub watermarkd: Side,
    /// What the live controller ran.
    pub live: Side,
    /// Evaluations compared, and those where the two counts differed.
    pub evaluations: u64,
    pub differed: u64,
    /// The largest difference of the two counts, and when it was (unix seconds).
    pub largest_gap: u32,
    pub largest_gap_at: i64,
}

/// Where a metric stood against its band.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    pub above: bool,
    pub below: bool,
}

/// Where the metrics of `decision` stand against their bands at `replicas`: a metric of an
/// `average` rule is compared per ready replica, so at other replicas the same total is spread
/// over those (the load is assumed to follow the replicas, as the rule itself assumes); an
/// `absolute` rule's value does not depend on the replicas. `tolerances`: the fractions above
/// the high and below the low watermark that still hold. A metric without a usable value counts
/// for neither: missing data is never "below".
pub fn standing(decision: &Decision, algorithm: Algorithm, tolerances: (f64, f64), replicas: u32) -> Standing {
    let ready = f64::from(decision.ready_replicas);
    let mut standing = Standing { above: false, below: true };
    let mut any = false;
    for metric in &decision.metrics {
        let Some(value) = metric.usable_value().and(metric.usage).filter(|v| v.is_finite()) else {
            standing.below = false;
            continue;
        };
        any = true;
        let value = match algorithm {
            Algorithm::Average if replicas > 0 && ready > 0.0 => value * ready / f64::from(replicas),
            _ => value,
        };
        standing.above |= value > metric.high_watermark * (1.0 + tolerances.0);
        standing.below &= value < metric.low_watermark * (1.0 - tolerances.1);
    }
    Standing { above: standing.above, below: standing.below && any }
}

/// One evaluation of both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub at: Timestamp,
    /// What watermarkd decided, and where the metrics stand at it.
    pub watermarkd: u32,
    pub watermarkd_standing: Standing,
    /// What the live controller ran, and where the metrics stand at it.
    pub live: u32,
    pub live_standing: Standing,
}

impl Side {
    fn add(&mut self, seconds: f64, standing: Standing, replicas: u32, first: bool) {
        self.replica_seconds += seconds * f64::from(self.replicas);
        if standing.above {
            self.above_band_seconds += seconds;
        }
        if standing.below {
            self.below_band_seconds += seconds;
        }
        if !first && replicas != self.replicas {
            self.scale_events += 1;
        }
        self.replicas = replicas;
    }
}

impl Comparison {
    /// Adds one evaluation. The time since the last one (at most `max_gap_seconds`) counts at
    /// the replicas the two sides ran until now, and in the band standing found now.
    pub fn record(&mut self, step: Step, max_gap_seconds: f64) {
        let at = step.at.unix_millis().div_euclid(1000);
        let first = self.evaluations == 0;
        let seconds = if first { 0.0 } else { ((at - self.last_at) as f64).clamp(0.0, max_gap_seconds.max(0.0)) };
        if first {
            self.since = at;
        }
        self.seconds += seconds;
        self.watermarkd.add(seconds, step.watermarkd_standing, step.watermarkd, first);
        self.live.add(seconds, step.live_standing, step.live, first);
        self.last_at = at;
        self.evaluations += 1;
        let gap = step.watermarkd.abs_diff(step.live);
        if gap > 0 {
            self.differed += 1;
        }
        if gap > self.largest_gap || first {
            self.largest_gap = gap;
            self.largest_gap_at = at;
        }
    }
}

/// Unix seconds as RFC 3339.
fn instant(seconds: i64) -> String {
    Timestamp::from_unix_seconds_f64(seconds as f64).map_or_else(|| seconds.to_string(), |t| t.to_string())
}

/// A duration as a person reads it: `45 s`, `12 min`, `3.5 h`.
fn span(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else if seconds < 7200.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

/// The comparison in plain sentences, for `watermarkd status` and the page: who runs the
/// target and what, then each total side by side.
pub fn describe(comparison: &Comparison, live: Option<&Live>) -> Vec<String> {
    let (ours, theirs) = (&comparison.watermarkd, &comparison.live);
    let mut out = Vec::new();
    let who = live.and_then(|l| l.controller.as_deref()).unwrap_or("the target's own replica count");
    let mut now = format!("beside {who}: it runs {}, watermarkd would set {}", theirs.replicas, ours.replicas);
    if let Some(live) = live {
        let said: Vec<String> = [("desiredReplicas", live.desired), ("currentReplicas", live.current)]
            .into_iter()
            .filter_map(|(field, value)| Some(format!("{field} {}", value?)))
            .collect();
        if !said.is_empty() {
            now.push_str(&format!(" (its status: {})", said.join(", ")));
        }
    }
    out.push(now);
    out.push(format!(
        "observed {} since {} over {} evaluations; they differed in {}",
        span(comparison.seconds),
        instant(comparison.since),
        comparison.evaluations,
        comparison.differed
    ));
    let hours = |side: &Side| side.replica_seconds / 3600.0;
    out.push(format!("replica-hours: watermarkd {:.2}, live {:.2}", hours(ours), hours(theirs)));
    out.push(format!(
        "a metric above its band: watermarkd {}, live {}; every metric below it: watermarkd {}, live {}",
        span(ours.above_band_seconds),
        span(theirs.above_band_seconds),
        span(ours.below_band_seconds),
        span(theirs.below_band_seconds)
    ));
    out.push(format!(
        "scale events: watermarkd {}, live {}; largest gap {} replicas, at {}",
        ours.scale_events,
        theirs.scale_events,
        comparison.largest_gap,
        instant(comparison.largest_gap_at)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_unix_millis(seconds * 1000)
    }

    fn step(seconds: i64, watermarkd: u32, live: u32, above_live: bool) -> Step {
        Step {
            at: at(seconds),
            watermarkd,
            watermarkd_standing: Standing::default(),
            live,
            live_standing: Standing { above: above_live, below: false },
        }
    }

    #[test]
    fn each_side_accumulates_its_own_replica_time_events_and_band_time() {
        let mut c = Comparison::default();
        c.record(step(1000, 4, 4, false), 30.0);
        c.record(step(1015, 6, 4, true), 30.0);
        c.record(step(1030, 6, 7, false), 30.0);
        c.record(step(1045, 5, 7, false), 30.0);
        assert_eq!(c.evaluations, 4);
        assert_eq!(c.since, 1000);
        assert_eq!(c.seconds, 45.0);
        // 15 s at 4, 6 and 6 replicas; the live side 15 s at 4, 4 and 7.
        assert_eq!(c.watermarkd.replica_seconds, 15.0 * 16.0);
        assert_eq!(c.live.replica_seconds, 15.0 * 15.0);
        assert_eq!((c.watermarkd.scale_events, c.live.scale_events), (2, 1));
        assert_eq!(c.live.above_band_seconds, 15.0);
        assert_eq!(c.watermarkd.above_band_seconds, 0.0);
        assert_eq!((c.differed, c.largest_gap, c.largest_gap_at), (3, 2, 1015));
    }

    #[test]
    fn the_sentences_name_the_controller_and_both_sides() {
        let mut c = Comparison::default();
        c.record(step(1_800_000_000, 4, 6, true), 30.0);
        c.record(step(1_800_000_015, 5, 6, false), 30.0);
        let live = Live {
            controller: Some("HorizontalPodAutoscaler/shop/web".into()),
            replicas: 6,
            desired: Some(7),
            current: Some(6),
        };
        let text = describe(&c, Some(&live)).join("\n");
        assert!(text.contains("beside HorizontalPodAutoscaler/shop/web: it runs 6, watermarkd would set 5 (its status: desiredReplicas 7, currentReplicas 6)"), "{text}");
        assert!(
            text.contains("observed 15 s since 2027-01-15T08:00:00Z over 2 evaluations; they differed in 2"),
            "{text}"
        );
        assert!(text.contains("replica-hours: watermarkd 0.02, live 0.03"), "{text}");
        assert!(
            text.contains("scale events: watermarkd 1, live 0; largest gap 2 replicas, at 2027-01-15T08:00:00Z"),
            "{text}"
        );
    }

    #[test]
    fn downtime_counts_at_most_the_largest_gap() {
        let mut c = Comparison::default();
        c.record(step(0, 3, 3, false), 30.0);
        c.record(step(3600, 3, 3, false), 30.0);
        assert_eq!(c.seconds, 30.0);
        assert_eq!(c.live.replica_seconds, 90.0);
    }

    fn decided(value: Option<f64>) -> Decision {
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 20, "algorithm": "average",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 0.5, "low_watermark": 0.2 }]
        }))
        .unwrap();
        let now = at(1_800_000_000);
        let readings = match value {
            Some(value) => vec![watermarkd_engine::Reading::Value { value, at: now }],
            None => vec![watermarkd_engine::Reading::Unavailable { reason: "no data".into() }],
        };
        let target = watermarkd_engine::Target { spec_replicas: 4, status_replicas: Some(4), ready_replicas: Some(4) };
        watermarkd_engine::decide(&rule, target, &readings, &watermarkd_engine::State::default(), now)
    }

    #[test]
    fn an_average_rules_load_is_spread_over_the_replicas_each_side_runs() {
        // A total of 2.4 on 4 ready replicas: 0.6 each.
        let decision = decided(Some(2.4));
        let at = |replicas| standing(&decision, Algorithm::Average, (0.0, 0.0), replicas);
        assert_eq!(at(4), Standing { above: true, below: false });
        assert_eq!(at(6), Standing { above: false, below: false });
        assert_eq!(at(20), Standing { above: false, below: true });
        // Within the tolerance is not above.
        assert!(!standing(&decision, Algorithm::Average, (0.25, 0.0), 4).above);
        // An absolute rule's value is what it is at any count.
        assert!(standing(&decision, Algorithm::Absolute, (0.0, 0.0), 20).above);
    }

    #[test]
    fn missing_data_is_neither_above_nor_below() {
        let decision = decided(None);
        assert_eq!(standing(&decision, Algorithm::Average, (0.0, 0.0), 100), Standing::default());
    }

    #[test]
    fn a_clock_that_goes_back_counts_no_time() {
        let mut c = Comparison::default();
        c.record(step(100, 3, 3, false), 30.0);
        c.record(step(90, 3, 3, false), 30.0);
        assert_eq!(c.seconds, 0.0);
    }
}
