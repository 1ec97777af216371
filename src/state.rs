//! The engine state that must outlive the daemon: where it is kept, when it is written, and how
//! a restarted daemon gets it back.
//!
//! - Rules-file mode: a `watermarkd.io/state` annotation on the target, JSON of the engine's
//!   `State` and the autoscaler's name.
//! - CRD mode: the WPA status as the Datadog controller shapes it. `lastScaleTime` is the last
//!   scale; the AboveHighWatermark / BelowLowWatermark conditions follow the engine's "since"
//!   clocks, so a True condition's `lastTransitionTime` is where the delay started. A WPA has no
//!   `behavior`, so no recommendation or scale-event history is needed.
//!
//! Either way the state is written when it changes in a way a later decision depends on: a
//! scale, or a since-clock starting or stopping. Never on every tick.
//!
//! A daemon killed between a scale and its state write would lose the scale's time. So the
//! restore also reads the target's `managedFields`, where an API server that records field
//! managers for `/scale` writes says when watermarkd's last wrote the scale, and never restores
//! an earlier time. (Not every one does: a write that lands unseen is also caught by its
//! effect, see [`note_unaccounted_change`].)

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Recommendation, Rule, State, Timestamp};

use crate::crd::{WatermarkPodAutoscalerStatus, ABOVE_HIGH_WATERMARK, BELOW_LOW_WATERMARK};
use crate::workload::Marks;

/// The annotation's format version.
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Annotation {
    v: u32,
    autoscaler: String,
    state: State,
}

/// The annotation value for `autoscaler`'s `state`.
pub fn encode_annotation(autoscaler: &str, state: &State) -> String {
    let annotation = Annotation { v: VERSION, autoscaler: autoscaler.to_string(), state: state.clone() };
    // A struct of plain fields always serializes.
    serde_json::to_string(&annotation).unwrap_or_default()
}

/// The state in an annotation: `Ok(None)` when it belongs to another autoscaler (the target was
/// handed over), an error when it cannot be read.
pub fn decode_annotation(autoscaler: &str, text: &str) -> Result<Option<State>, String> {
    let annotation: Annotation = serde_json::from_str(text).map_err(|e| format!("unreadable state annotation: {e}"))?;
    if annotation.v != VERSION {
        return Err(format!("state annotation version {} is not {VERSION}", annotation.v));
    }
    Ok((annotation.autoscaler == autoscaler).then_some(annotation.state))
}

/// What [`needs_write`] compares with, of the state last written. Not the state itself: an
/// autoscaler keeps this for as long as it runs, and a whole state is about a hundred bytes
/// more, a megabyte at 10,000 autoscalers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// A hash of what a later decision depends on, but for how many scale events there are.
    fingerprint: u64,
    scale_events: usize,
}

impl Written {
    pub fn of(state: &State) -> Written {
        use std::hash::{Hash, Hasher};
        // Fixed keys: the same state always gives the same fingerprint.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        state.last_scale_time.hash(&mut hasher);
        state.above_since.hash(&mut hasher);
        state.below_since.hash(&mut hasher);
        state.scale_events.last().map(|e| (e.from, e.to, e.at)).hash(&mut hasher);
        stabilization_profile(&state.recommendations).hash(&mut hasher);
        state.zero.as_ref().map(|z| (z.idle_since, z.scaled_to_zero_at)).hash(&mut hasher);
        Written { fingerprint: hasher.finish(), scale_events: state.scale_events.len() }
    }
}

/// Whether going from `written` to `next` changes anything a later decision depends on enough
/// to write it now: the last scale, a since-clock, a new scale event, what the stabilization
/// windows can still see (see [`stabilization_profile`]), or scale to zero's clock and mark.
/// Scale events that age out alone are not worth a write.
pub fn needs_write(written: Option<&Written>, next: &State) -> bool {
    let Some(written) = written else {
        return next.last_scale_time.is_some()
            || next.above_since.is_some()
            || next.below_since.is_some()
            || !next.scale_events.is_empty()
            || !next.recommendations.is_empty()
            || next.zero.is_some();
    };
    let next = Written::of(next);
    written.scale_events < next.scale_events || written.fingerprint != next.fingerprint
}

/// Replica counts, each with its time unless it is the newest.
type Profile = Vec<(u32, Option<Timestamp>)>;

/// What of a recommendation history a stabilization window can ever use: the running maxima
/// (the scale-down window takes the highest recommendation it holds) and the running minima
/// (the scale-up window takes the lowest), newest last; an older entry the newer ones dominate
/// can never be chosen again. Only their values and the times of all but the newest entry
/// matter: while the same recommendation repeats, only the newest entry's time moves, and that
/// is not worth a write per tick (a restart takes it as made at the restart, see [`restore`]).
fn stabilization_profile(recommendations: &[Recommendation]) -> (Profile, Profile) {
    let mut maxima: Vec<Recommendation> = Vec::new();
    let mut minima: Vec<Recommendation> = Vec::new();
    for r in recommendations {
        while maxima.last().is_some_and(|m| m.replicas <= r.replicas) {
            maxima.pop();
        }
        maxima.push(*r);
        while minima.last().is_some_and(|m| m.replicas >= r.replicas) {
            minima.pop();
        }
        minima.push(*r);
    }
    let profile = |entries: Vec<Recommendation>| {
        let newest = entries.len().saturating_sub(1);
        entries.into_iter().enumerate().map(|(i, r)| (r.replicas, (i < newest).then_some(r.at))).collect()
    };
    (profile(maxima), profile(minima))
}

/// The CRD-mode state in a WPA status.
pub fn from_wpa_status(status: Option<&WatermarkPodAutoscalerStatus>) -> State {
    let Some(status) = status else { return State::default() };
    let since =
        |type_: &str| status.condition(type_).filter(|c| c.status == "True").and_then(|c| c.last_transition_time);
    State {
        last_scale_time: status.last_scale_time,
        above_since: since(ABOVE_HIGH_WATERMARK),
        below_since: since(BELOW_LOW_WATERMARK),
        recommendations: Vec::new(),
        scale_events: Vec::new(),
        // A WPA's minimum is at least 1: it never scales to zero.
        zero: None,
    }
}

/// The state a (re)started daemon runs an autoscaler with, from what it persisted and what the
/// API server recorded.
///
/// - The last scale time is the later of the persisted one and the `managedFields` record. That
///   record has whole seconds; when it is the later one it is rounded up, so a window never
///   opens early.
/// - The recommendation history is as written, which is every change a stabilization window can
///   see, except how long the newest recommendation went on being made: it is taken as made at
///   the restart, so a window never opens early (it may hold the newest value up to the
///   downtime longer).
/// - A time after `now` is clock skew between hosts, or an edited annotation: it is taken as
///   `now` (and named in `future`), so no window or delay ever holds longer than its own length
///   from the restart.
pub fn restore(persisted: State, marks: &Marks, rule: &Rule, now: Timestamp) -> Restored {
    let mut state = persisted;
    merge_recorded_scale(&mut state, marks);
    let mut future = Vec::new();
    let mut clamp = |time: &mut Timestamp, field: &'static str| {
        if time.unix_millis() > now.unix_millis() {
            *time = now;
            if !future.contains(&field) {
                future.push(field);
            }
        }
    };
    for (time, field) in [
        (&mut state.last_scale_time, "last scale time"),
        (&mut state.above_since, "above-high-watermark since"),
        (&mut state.below_since, "below-low-watermark since"),
    ] {
        if let Some(time) = time {
            clamp(time, field);
        }
    }
    for recommendation in &mut state.recommendations {
        clamp(&mut recommendation.at, "recommendation time");
    }
    for event in &mut state.scale_events {
        clamp(&mut event.at, "scale event time");
    }
    if let Some(zero) = state.zero.as_deref_mut() {
        for (time, field) in [(&mut zero.idle_since, "idle since"), (&mut zero.scaled_to_zero_at, "scaled to zero at")]
        {
            if let Some(time) = time {
                clamp(time, field);
            }
        }
    }
    if !rule.recommendation_horizon().is_zero() {
        if let Some(newest) = state.recommendations.last_mut() {
            newest.at = newest.at.max(now);
        }
    }
    Restored { state, future }
}

/// Takes the time the API server recorded for watermarkd's last scale write (`managedFields`,
/// whole seconds, so the end of that second) as the last scale when the state does not already
/// cover it. (API servers that record no field manager for `/scale` writes leave this unset;
/// [`note_unaccounted_change`] covers what it would.)
fn merge_recorded_scale(state: &mut State, marks: &Marks) {
    if let Some(recorded) = marks.scaled_at {
        let covers = state.last_scale_time.is_some_and(|t| t.unix_millis() >= recorded.unix_millis());
        if !covers {
            state.last_scale_time = Some(Timestamp::from_unix_millis(recorded.unix_millis().saturating_add(999)));
        }
    }
}

/// Before each decision: the target's record of watermarkd's last scale, merged as at a restore
/// and never later than `now` (the API server's clock may run ahead of ours).
pub fn note_recorded_scale(state: &mut State, marks: &Marks, now: Timestamp) {
    merge_recorded_scale(state, marks);
    if let Some(time) = state.last_scale_time.as_mut() {
        *time = (*time).min(now);
    }
}

/// Why a change of the target's replica count that this process did not confirm as its own
/// write may be a scale: a write of unknown outcome (its own, or a previous leader's) that
/// landed late. Such a change starts the windows when it was seen.
#[derive(Clone, Copy, Debug, Default)]
pub struct Suspicion {
    /// This process sent a write at this time whose outcome it never learnt.
    pub unconfirmed_since: Option<Timestamp>,
    /// This process gained the lead at this time (a previous leader's write may land around
    /// then); changes seen before it, or within `TAKEOVER_GRACE` after it, are suspect.
    pub leading_since: Option<Timestamp>,
    /// The replica count of this process's last confirmed write.
    pub written: Option<u32>,
}

/// How long after gaining the lead a change of the replica count is still taken as a previous
/// leader's write landing late rather than a person's: the watch delivers it within moments of
/// etcd applying it, and etcd applies it before the lease this process took.
pub const TAKEOVER_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts the windows at `changed_at` (when this process saw the replica count change) if
/// the change is not accounted for (see [`Suspicion`]). A person's change seen while leading
/// stays what it is for the Datadog controller: not a scale.
pub fn note_unaccounted_change(
    state: &mut State,
    spec_replicas: u32,
    changed_at: Option<Timestamp>,
    suspicion: &Suspicion,
    now: Timestamp,
) {
    let Some(seen) = changed_at else { return };
    if suspicion.written == Some(spec_replicas) && suspicion.unconfirmed_since.is_none() {
        return;
    }
    let after_unconfirmed = suspicion.unconfirmed_since.is_some_and(|sent| seen >= sent);
    let around_takeover = suspicion.leading_since.is_some_and(|since| {
        seen.unix_millis() <= since.unix_millis().saturating_add(TAKEOVER_GRACE.as_millis() as i64)
    });
    if after_unconfirmed || around_takeover {
        let seen = seen.min(now);
        if state.last_scale_time.is_none_or(|t| t < seen) {
            state.last_scale_time = Some(seen);
        }
    }
}

/// A decision stamps its scale with the time it was made; the write is known to have landed
/// only at `confirmed`, and the windows count from then.
pub fn stamp_confirmed_scale(state: &mut State, decided: Timestamp, confirmed: Timestamp) {
    if state.last_scale_time == Some(decided) {
        state.last_scale_time = Some(confirmed);
    }
    for event in state.scale_events.iter_mut().filter(|e| e.at == decided) {
        event.at = confirmed;
    }
}

/// What [`restore`] made of the persisted state.
#[derive(Debug)]
pub struct Restored {
    pub state: State,
    /// The persisted times that lay in the future and were taken as `now`.
    pub future: Vec<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::{ScaleEvent, ZeroState};

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    fn state() -> State {
        State {
            last_scale_time: Some(t(1_700_000_000_500)),
            above_since: Some(t(1_700_000_010_000)),
            below_since: None,
            recommendations: vec![Recommendation { replicas: 4, at: t(1_700_000_011_000) }],
            scale_events: vec![ScaleEvent { from: 3, to: 4, at: t(1_700_000_000_500) }],
            zero: Some(Box::new(ZeroState { idle_since: Some(t(1_700_000_012_000)), scaled_to_zero_at: None })),
        }
    }

    #[test]
    fn annotations_round_trip_and_belong_to_one_autoscaler() {
        let text = encode_annotation("billing", &state());
        assert_eq!(decode_annotation("billing", &text), Ok(Some(state())));
        assert_eq!(decode_annotation("search", &text), Ok(None));
        assert!(decode_annotation("billing", "{not json").is_err());
        assert!(decode_annotation("billing", &text.replace("\"v\":1", "\"v\":9")).is_err());
    }

    #[test]
    fn writes_on_scales_and_clock_flips_only() {
        let written = state();
        let mut next = written.clone();
        next.recommendations.push(Recommendation { replicas: 4, at: t(1_700_000_026_000) });
        let digest = Written::of(&written);
        assert!(!needs_write(Some(&digest), &written), "nothing changed");
        assert!(!needs_write(Some(&digest), &next), "the same recommendation again is not written");
        let mut higher = next.clone();
        higher.recommendations.push(Recommendation { replicas: 5, at: t(1_700_000_041_000) });
        assert!(needs_write(Some(&Written::of(&next)), &higher), "a new maximum is");
        let mut expired = written.clone();
        expired.recommendations.clear();
        assert!(needs_write(Some(&digest), &expired), "so is one leaving the window");
        let mut pruned = written.clone();
        pruned.scale_events.insert(0, ScaleEvent { from: 2, to: 3, at: t(1_700_000_000_000) });
        assert!(!needs_write(Some(&Written::of(&pruned)), &written), "an old event aging out is not");
        next.below_since = Some(t(1_700_000_026_000));
        assert!(needs_write(Some(&digest), &next));
        let mut scaled = written.clone();
        scaled.last_scale_time = Some(t(1_700_000_030_000));
        assert!(needs_write(Some(&digest), &scaled));
        let mut idle = written.clone();
        idle.zero = None;
        assert!(needs_write(Some(&digest), &idle), "scale to zero's clock too");
        assert!(!needs_write(None, &State::default()));
        assert!(needs_write(None, &written));
    }

    #[test]
    fn the_newest_recommendation_counts_as_made_at_the_restart() {
        let rule = crate::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10,
            "behavior": { "scale_down": { "stabilization_window": "300s" } },
            "metric": [{ "query": "q", "high_watermark": 10.0, "low_watermark": 5.0 }]
        }))
        .expect("rule");
        let persisted = State {
            recommendations: vec![
                Recommendation { replicas: 8, at: t(1_700_000_000_000) },
                Recommendation { replicas: 6, at: t(1_700_000_030_000) },
            ],
            ..State::default()
        };
        let now = t(1_700_000_100_000);
        let restored = restore(persisted, &Marks::default(), &rule, now).state;
        assert_eq!(
            restored.recommendations,
            vec![Recommendation { replicas: 8, at: t(1_700_000_000_000) }, Recommendation { replicas: 6, at: now }]
        );
    }

    #[test]
    fn the_api_servers_record_of_a_scale_is_never_ignored() {
        let rule = crate::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10,
            "metric": [{ "query": "q", "high_watermark": 10.0, "low_watermark": 5.0 }]
        }))
        .expect("rule");
        let now = t(1_700_000_100_000);
        // The daemon died after scaling at ...050.250 and before writing its state.
        let marks = Marks { state_annotation: None, scaled_at: Some(t(1_700_000_050_000)) };
        let restored = restore(state(), &marks, &rule, now).state;
        assert_eq!(restored.last_scale_time, Some(t(1_700_000_050_999)));
        // The persisted time is exact and covers the record of the same second.
        let mut precise = state();
        precise.last_scale_time = Some(t(1_700_000_050_250));
        assert_eq!(restore(precise, &marks, &rule, now).state.last_scale_time, Some(t(1_700_000_050_250)));
    }

    #[test]
    fn a_scale_recorded_on_the_target_that_the_state_misses_starts_the_window() {
        let now = t(1_700_000_100_000);
        // Our own confirmed write: its record (same second, apiserver clock) is covered.
        let mut known = State { last_scale_time: Some(t(1_700_000_090_400)), ..State::default() };
        let marks = Marks { state_annotation: None, scaled_at: Some(t(1_700_000_090_000)) };
        note_recorded_scale(&mut known, &marks, now);
        assert_eq!(known.last_scale_time, Some(t(1_700_000_090_400)));
        // A write that timed out here and landed at ...095 is taken, to the end of its second.
        let later = Marks { state_annotation: None, scaled_at: Some(t(1_700_000_095_000)) };
        note_recorded_scale(&mut known, &later, now);
        assert_eq!(known.last_scale_time, Some(t(1_700_000_095_999)));
        // A record ahead of our clock is taken as now.
        let ahead = Marks { state_annotation: None, scaled_at: Some(t(1_700_000_100_000)) };
        let mut fresh = State::default();
        note_recorded_scale(&mut fresh, &ahead, now);
        assert_eq!(fresh.last_scale_time, Some(now));
    }

    #[test]
    fn a_change_not_accounted_for_starts_the_window_when_it_was_seen() {
        let t0 = t(1_700_000_050_500);
        let seen = t(1_700_000_095_000);
        let now = t(1_700_000_096_000);
        let fresh = || State { last_scale_time: Some(t0), ..State::default() };
        // Our own write of unknown outcome, sent at ...070, landed and seen at ...095.
        let unconfirmed = Suspicion { unconfirmed_since: Some(t(1_700_000_070_000)), ..Suspicion::default() };
        let mut state = fresh();
        note_unaccounted_change(&mut state, 6, Some(seen), &unconfirmed, now);
        assert_eq!(state.last_scale_time, Some(seen));
        // A previous leader's write seen just after this process took the lead at ...090, or
        // while it followed.
        for since in [1_700_000_090_000, 1_700_000_099_000] {
            let takeover = Suspicion { leading_since: Some(t(since)), ..Suspicion::default() };
            let mut state = fresh();
            note_unaccounted_change(&mut state, 6, Some(seen), &takeover, now);
            assert_eq!(state.last_scale_time, Some(seen), "leading since {since}");
        }
        // A person's change seen long after this process took the lead is not a scale.
        let leading = Suspicion { leading_since: Some(t(1_700_000_000_000)), ..Suspicion::default() };
        let mut state = fresh();
        note_unaccounted_change(&mut state, 6, Some(seen), &leading, now);
        assert_eq!(state.last_scale_time, Some(t0));
        // Our own confirmed write is accounted for; a first reading's age is unknown.
        let ours = Suspicion { leading_since: Some(t(1_700_000_090_000)), written: Some(6), ..Suspicion::default() };
        let mut state = fresh();
        note_unaccounted_change(&mut state, 6, Some(seen), &ours, now);
        assert_eq!(state.last_scale_time, Some(t0));
        let mut state = fresh();
        note_unaccounted_change(&mut state, 6, None, &unconfirmed, now);
        assert_eq!(state.last_scale_time, Some(t0));
    }

    #[test]
    fn a_scale_counts_from_when_its_write_was_confirmed() {
        let decided = t(1_700_000_100_000);
        let confirmed = t(1_700_000_108_500);
        let mut next = State {
            last_scale_time: Some(decided),
            scale_events: vec![
                ScaleEvent { from: 2, to: 3, at: t(1_700_000_050_000) },
                ScaleEvent { from: 3, to: 5, at: decided },
            ],
            ..State::default()
        };
        stamp_confirmed_scale(&mut next, decided, confirmed);
        assert_eq!(next.last_scale_time, Some(confirmed));
        assert_eq!(
            next.scale_events,
            vec![ScaleEvent { from: 2, to: 3, at: t(1_700_000_050_000) }, ScaleEvent { from: 3, to: 5, at: confirmed }]
        );
        // A state that did not scale at this decision keeps its times.
        let mut held = State { last_scale_time: Some(t(1_700_000_050_000)), ..State::default() };
        stamp_confirmed_scale(&mut held, decided, confirmed);
        assert_eq!(held.last_scale_time, Some(t(1_700_000_050_000)));
    }

    #[test]
    fn times_from_the_future_are_taken_as_now() {
        let rule = crate::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 10,
            "metric": [{ "query": "q", "high_watermark": 10.0, "low_watermark": 5.0 }]
        }))
        .expect("rule");
        let now = t(1_700_000_100_000);
        let year = 365 * 24 * 3_600_000;
        let persisted = State {
            last_scale_time: Some(t(1_700_000_100_000 + year)),
            above_since: Some(t(1_700_000_050_000)),
            below_since: Some(t(1_700_000_100_001)),
            recommendations: vec![Recommendation { replicas: 4, at: t(1_700_000_100_000 + year) }],
            scale_events: vec![ScaleEvent { from: 3, to: 4, at: t(1_700_000_200_000) }],
            zero: Some(Box::new(ZeroState { idle_since: None, scaled_to_zero_at: Some(t(1_700_000_100_000 + year)) })),
        };
        let restored = restore(persisted, &Marks::default(), &rule, now);
        assert_eq!(restored.state.last_scale_time, Some(now));
        assert_eq!(restored.state.above_since, Some(t(1_700_000_050_000)), "a past time is kept");
        assert_eq!(restored.state.zero.as_ref().and_then(|z| z.scaled_to_zero_at), Some(now));
        assert_eq!(restored.state.below_since, Some(now));
        assert_eq!(restored.state.recommendations[0].at, now);
        assert_eq!(restored.state.scale_events[0].at, now);
        assert_eq!(
            restored.future,
            [
                "last scale time",
                "below-low-watermark since",
                "recommendation time",
                "scale event time",
                "scaled to zero at"
            ]
        );
        // The API server's record of a scale, from a skewed clock, is no exception.
        let marks = Marks { state_annotation: None, scaled_at: Some(t(1_700_000_500_000)) };
        let restored = restore(State::default(), &marks, &rule, now);
        assert_eq!(restored.state.last_scale_time, Some(now));
        assert_eq!(restored.future, ["last scale time"]);
        assert!(restore(state(), &Marks::default(), &rule, now).future.is_empty());
    }
}
