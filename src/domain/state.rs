//! The engine state that must outlive the daemon: where it is kept, when it is written, and how
//! a restarted daemon gets it back.
//!
//! - Rules-file mode: a ConfigMap per target in the daemon's own namespace ([`configmap`]),
//!   holding JSON of the engine's `State` and the autoscaler's name. Earlier versions wrote the
//!   same JSON as the target's `watermarkd.io/state` annotation; a target without a ConfigMap
//!   is restored from that annotation, and the next write goes to the ConfigMap.
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

use std::time::Duration;

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Recommendation, Rule, ScaleEvent, State, Timestamp, Velocity, ZeroState};

use crate::domain::crd::{WatermarkPodAutoscalerStatus, ABOVE_HIGH_WATERMARK, BELOW_LOW_WATERMARK};

/// The annotation's format version: 2 writes times as Unix milliseconds and each entry as an
/// array. Version 1 (RFC 3339 times, named fields, any number of recommendations) is still read,
/// so that a daemon upgraded in place keeps its windows; the next write is version 2.
const VERSION: u32 = 2;
const LEGACY_VERSION: u32 = 1;

/// The largest annotation the engine's bounds allow (61 recommendations per stabilization
/// window, 32 scale events; see `the_largest_possible_annotation_stays_small`): far below
/// the API server's 256 KiB for all of an object's annotations.
pub const MAX_ANNOTATION_BYTES: usize = 8 * 1024;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Annotation<S> {
    v: u32,
    autoscaler: String,
    state: S,
}

#[derive(Debug, Deserialize)]
struct Version {
    v: u32,
}

/// The state as version 2 writes it: times in Unix milliseconds, entries as arrays, empty
/// fields left out.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CompactState {
    #[serde(skip_serializing_if = "Option::is_none")]
    last_scale: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    above_since: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    below_since: Option<i64>,
    /// `[replicas, at]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    recommendations: Vec<(u32, i64)>,
    /// `[from, to, at]`, or `[from, to, at, since]` for merged scales.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    scale_events: Vec<Vec<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_since: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scaled_to_zero_at: Option<i64>,
}

impl CompactState {
    fn of(state: &State) -> CompactState {
        let ms = |t: Option<Timestamp>| t.map(Timestamp::unix_millis);
        CompactState {
            last_scale: ms(state.last_scale_time),
            above_since: ms(state.above_since),
            below_since: ms(state.below_since),
            recommendations: state.recommendations.iter().map(|r| (r.replicas, r.at.unix_millis())).collect(),
            scale_events: state
                .scale_events
                .iter()
                .map(|e| {
                    let mut entry = vec![i64::from(e.from), i64::from(e.to), e.at.unix_millis()];
                    entry.extend(e.since.map(Timestamp::unix_millis));
                    entry
                })
                .collect(),
            idle_since: state.zero.as_ref().and_then(|z| ms(z.idle_since)),
            scaled_to_zero_at: state.zero.as_ref().and_then(|z| ms(z.scaled_to_zero_at)),
        }
    }

    fn into_state(self) -> Result<State, String> {
        let time = |ms: i64, field: &str| {
            // Exact: every valid time is far below 2^53 ms.
            Timestamp::from_unix_millis_f64(ms as f64)
                .ok_or_else(|| format!("state.{field}: {ms} is not a time between 1970 and 9999 in Unix milliseconds"))
        };
        let optional = |ms: Option<i64>, field: &str| ms.map(|ms| time(ms, field)).transpose();
        let replicas =
            |n: i64, field: &str| u32::try_from(n).map_err(|_| format!("state.{field}: {n} is not a replica count"));
        let recommendations = self
            .recommendations
            .iter()
            .enumerate()
            .map(|(i, &(replicas, at))| {
                Ok(Recommendation { replicas, at: time(at, &format!("recommendations[{i}]"))? })
            })
            .collect::<Result<_, String>>()?;
        let scale_events = self
            .scale_events
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let field = format!("scale_events[{i}]");
                match *entry.as_slice() {
                    [from, to, at] => {
                        Ok(ScaleEvent::new(replicas(from, &field)?, replicas(to, &field)?, time(at, &field)?))
                    }
                    [from, to, at, since] => Ok(ScaleEvent {
                        since: Some(time(since, &field)?),
                        ..ScaleEvent::new(replicas(from, &field)?, replicas(to, &field)?, time(at, &field)?)
                    }),
                    _ => Err(format!("state.{field}: not [from, to, at] or [from, to, at, since]")),
                }
            })
            .collect::<Result<_, String>>()?;
        let zero = ZeroState {
            idle_since: optional(self.idle_since, "idle_since")?,
            scaled_to_zero_at: optional(self.scaled_to_zero_at, "scaled_to_zero_at")?,
        };
        Ok(State {
            last_scale_time: optional(self.last_scale, "last_scale")?,
            above_since: optional(self.above_since, "above_since")?,
            below_since: optional(self.below_since, "below_since")?,
            recommendations,
            scale_events,
            zero: (zero != ZeroState::default()).then(|| Box::new(zero)),
        })
    }
}

/// The annotation value for `autoscaler`'s `state`.
pub fn encode_annotation(autoscaler: &str, state: &State) -> String {
    let annotation = Annotation { v: VERSION, autoscaler: autoscaler.to_string(), state: CompactState::of(state) };
    // A struct of plain fields always serializes.
    serde_json::to_string(&annotation).unwrap_or_default()
}

/// What an annotation held for this autoscaler.
#[derive(Debug, PartialEq)]
pub struct Decoded {
    pub state: State,
    /// Written in an older format: write it again in the current one.
    pub legacy: bool,
}

/// The state in an annotation: `Ok(None)` when it belongs to another autoscaler (the target was
/// handed over), an error when it cannot be read.
pub fn decode_annotation(autoscaler: &str, text: &str) -> Result<Option<Decoded>, String> {
    let unreadable = |e: serde_json::Error| format!("unreadable state annotation: {e}");
    let version: Version = serde_json::from_str(text).map_err(unreadable)?;
    let (owner, state, legacy) = match version.v {
        VERSION => {
            let annotation: Annotation<CompactState> = serde_json::from_str(text).map_err(unreadable)?;
            let state = annotation.state.into_state().map_err(|e| format!("unreadable state annotation: {e}"))?;
            (annotation.autoscaler, state, false)
        }
        LEGACY_VERSION => {
            let annotation: Annotation<State> = serde_json::from_str(text).map_err(unreadable)?;
            (annotation.autoscaler, annotation.state, true)
        }
        other => return Err(format!("state annotation version {other} is neither {VERSION} nor {LEGACY_VERSION}")),
    };
    Ok((owner == autoscaler).then_some(Decoded { state, legacy }))
}

/// What [`needs_write`] compares with, of the state last written. Not the whole state: an
/// autoscaler keeps this for as long as it runs, so only what the comparison needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// A hash of what a later decision depends on, but for the recommendations and how many
    /// scale events there are.
    fingerprint: u64,
    scale_events: usize,
    /// The recommendations as written (at most 61 per stabilization window).
    recommendations: Vec<Recommendation>,
}

impl Written {
    pub fn of(state: &State) -> Written {
        use std::hash::{Hash, Hasher};
        // Fixed keys: the same state always gives the same fingerprint.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        state.last_scale_time.hash(&mut hasher);
        state.above_since.hash(&mut hasher);
        state.below_since.hash(&mut hasher);
        state.scale_events.last().map(|e| (e.from, e.to, e.at, e.since)).hash(&mut hasher);
        state.zero.as_ref().map(|z| (z.idle_since, z.scaled_to_zero_at)).hash(&mut hasher);
        Written {
            fingerprint: hasher.finish(),
            scale_events: state.scale_events.len(),
            recommendations: state.recommendations.clone(),
        }
    }
}

/// Whether going from `written` to `next` (at `now`, under `rule`) changes anything a later
/// decision depends on enough to write it now: the last scale, a since-clock, a new scale event,
/// scale to zero's clock and mark, or what the stabilization windows would say after a restart
/// (see [`windows_covered`]). Scale events that age out alone are not worth a write.
pub fn needs_write(written: Option<&Written>, next: &State, rule: &Rule, now: Timestamp) -> bool {
    let Some(written) = written else {
        return next.last_scale_time.is_some()
            || next.above_since.is_some()
            || next.below_since.is_some()
            || !next.scale_events.is_empty()
            || !next.recommendations.is_empty()
            || next.zero.is_some();
    };
    let next_written = Written::of(next);
    written.scale_events < next_written.scale_events
        || written.fingerprint != next_written.fingerprint
        || !windows_covered(&written.recommendations, &next.recommendations, rule, now)
}

/// The stabilization windows of `rule`: (scale-up, scale-down); zero when it has none.
fn stabilization_windows(rule: &Rule) -> (Duration, Duration) {
    match rule.velocity() {
        Velocity::Behavior(b) => (b.scale_up.stabilization_window, b.scale_down.stabilization_window),
        Velocity::Watermark(_) => (Duration::ZERO, Duration::ZERO),
    }
}

/// Whether the recommendations last written, read back by a restart after `now` (see
/// [`restore`]: the newest written ones count as made at the restart), still serve the windows:
///
/// - covered: at `now` and every later time, they make the scale-down window at least as high
///   and the scale-up window at least as low as `live` does, so a restart allows nothing the
///   live history forbids. A noisy metric whose recommendations stay within those last written
///   costs no write.
/// - fresh: a window whose answer the live history has let go of (a high leaving the scale-down
///   window) is written again once the newest written entry has left that window too, so that a
///   restart does not hold it for another window's length. Not sooner: a window's answer may
///   change with every reading, and a restart holds the newest written entry for one window
///   length at most.
fn windows_covered(written: &[Recommendation], live: &[Recommendation], rule: &Rule, now: Timestamp) -> bool {
    let newest = written.iter().map(|r| r.at).max();
    // A time no window ever reaches past.
    let restored_at =
        |r: &Recommendation| if Some(r.at) == newest { Timestamp::from_unix_millis(i64::MAX) } else { r.at };
    let (up, down) = stabilization_windows(rule);
    // `stricter(a, b)`: a holds at least as much as b in that window.
    type Stricter = fn(u32, u32) -> bool;
    let windows: [(Duration, Stricter); 2] = [(down, |a, b| a >= b), (up, |a, b| a <= b)];
    windows.into_iter().filter(|(window, _)| !window.is_zero()).all(|(window, stricter)| {
        let young = |at: Timestamp| now.since(at) < window;
        let answer = |entries: &mut dyn Iterator<Item = u32>| entries.reduce(|a, b| if stricter(a, b) { a } else { b });
        let covered = live
            .iter()
            .filter(|l| young(l.at))
            .all(|l| written.iter().any(|w| stricter(w.replicas, l.replicas) && restored_at(w) >= l.at));
        let written_now = answer(&mut written.iter().filter(|w| young(restored_at(w))).map(|w| w.replicas));
        let live_now = answer(&mut live.iter().filter(|l| young(l.at)).map(|l| l.replicas));
        let fresh = written_now == live_now || newest.is_some_and(young);
        covered && fresh
    })
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

/// What watermarkd left on a target: its persisted state, and when it last wrote the scale.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// The `watermarkd.io/state` annotation, as earlier versions wrote it (read only while
    /// the target has no state ConfigMap).
    pub state_annotation: Option<String>,
    /// When the API server last recorded a write by watermarkd's scale field manager (the
    /// `managedFields` entry's time, whole seconds, rounded down). It is the API server's own
    /// record, so it survives the daemon dying between a scale and its state write.
    pub scaled_at: Option<watermarkd_engine::Timestamp>,
}

/// The state a (re)started daemon runs an autoscaler with, from what it persisted and what the
/// API server recorded.
///
/// - The last scale time is the later of the persisted one and the `managedFields` record. That
///   record has whole seconds; when it is the later one it is rounded up, so a window never
///   opens early.
/// - The recommendations are as written, which is all a stabilization window can use (see
///   [`needs_write`]), except how long the newest went on being made: the newest written ones
///   (the latest bucket's highest and lowest) are taken as made at the restart, so a window
///   never opens early (it may hold them up to the downtime longer).
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
        if let Some(newest) = state.recommendations.iter().map(|r| r.at).max() {
            for recommendation in state.recommendations.iter_mut().filter(|r| r.at == newest) {
                recommendation.at = recommendation.at.max(now);
            }
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

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    fn state() -> State {
        State {
            last_scale_time: Some(t(1_700_000_000_500)),
            above_since: Some(t(1_700_000_010_000)),
            below_since: None,
            recommendations: vec![Recommendation { replicas: 4, at: t(1_700_000_011_000) }],
            scale_events: vec![ScaleEvent::new(3, 4, t(1_700_000_000_500))],
            zero: Some(Box::new(ZeroState { idle_since: Some(t(1_700_000_012_000)), scaled_to_zero_at: None })),
        }
    }

    fn behavior_rule(up_window: &str, down_window: &str) -> Rule {
        crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 100,
            "behavior": {
                "scale_up": { "stabilization_window": up_window },
                "scale_down": { "stabilization_window": down_window }
            },
            "metric": [{ "query": "q", "high_watermark": 10.0, "low_watermark": 10.0 }]
        }))
        .expect("rule")
    }

    #[test]
    fn annotations_round_trip_and_belong_to_one_autoscaler() {
        let text = encode_annotation("billing", &state());
        let current = Decoded { state: state(), legacy: false };
        assert_eq!(decode_annotation("billing", &text), Ok(Some(current)));
        assert_eq!(decode_annotation("search", &text), Ok(None));
        assert!(decode_annotation("billing", "{not json").is_err());
        assert!(decode_annotation("billing", &text.replace("\"v\":2", "\"v\":9")).is_err());
        // A merged scale keeps the time of its oldest scale.
        let mut merged = state();
        merged.scale_events[0].since = Some(t(1_700_000_000_000));
        let text = encode_annotation("billing", &merged);
        assert_eq!(decode_annotation("billing", &text).map(|d| d.map(|d| d.state)), Ok(Some(merged)));
        let bad = r#"{"v":2,"autoscaler":"billing","state":{"scale_events":[[3,4]]}}"#;
        let err = decode_annotation("billing", bad).expect_err("two numbers");
        assert!(err.contains("state.scale_events[0]"), "{err}");
        let bad = r#"{"v":2,"autoscaler":"billing","state":{"recommendations":[[3,-5]]}}"#;
        let err = decode_annotation("billing", bad).expect_err("before 1970");
        assert!(err.contains("state.recommendations[0]: -5"), "{err}");
    }

    #[test]
    fn a_legacy_annotation_is_read_and_written_again_in_the_current_format() {
        // What a daemon before the bound wrote at one recommendation a second for an hour.
        let recommendations: Vec<serde_json::Value> = (0..3600)
            .map(|i| {
                let at = Timestamp::from_unix_millis(1_700_000_000_000 + i * 1000).to_string();
                serde_json::json!({ "replicas": 4 + (i * 7919) % 9, "at": at })
            })
            .collect();
        let legacy = serde_json::json!({
            "v": 1, "autoscaler": "billing",
            "state": {
                "last_scale_time": "2023-11-14T22:13:20.500Z", "above_since": null, "below_since": null,
                "recommendations": recommendations,
                "scale_events": [{ "from": 3, "to": 4, "at": "2023-11-14T22:13:20.500Z" }]
            }
        })
        .to_string();
        assert!(legacy.len() > 150_000, "{} bytes", legacy.len());
        let decoded = decode_annotation("billing", &legacy).expect("readable").expect("ours");
        assert!(decoded.legacy);
        assert_eq!(decoded.state.recommendations.len(), 3600);
        // Its windows hold after the restart: the highest of the hour counts, and the next
        // decision keeps only what the windows can use.
        let rule = behavior_rule("0s", "3600s");
        let now = t(1_700_000_000_000 + 3_600_000);
        let restored = restore(decoded.state, &Marks::default(), &rule, now).state;
        let target =
            watermarkd_engine::Target { spec_replicas: 12, status_replicas: Some(12), ready_replicas: Some(12) };
        let low = [watermarkd_engine::Reading::Value { value: 10.0, at: now }];
        let decision = watermarkd_engine::decide(&rule, target, &low, &restored, now);
        assert_eq!(decision.stabilization.map(|s| s.upper), Some(12), "{}", decision.reason);
        // A legacy annotation is never taken for a written current one.
        assert!(needs_write(None, &decision.state, &rule, now));
        let rewritten = encode_annotation("billing", &decision.state);
        assert!(rewritten.len() < 2_000, "{rewritten}");
        let again = decode_annotation("billing", &rewritten).expect("readable").expect("ours");
        assert_eq!((again.state, again.legacy), (decision.state, false));
    }

    /// A noisy metric every second under an hour's scale-down window, decided by the engine and
    /// written as the daemon writes it, for three hours of synthetic time. Scaling down is
    /// disabled, so that the recommendations are all that changes: no scale, no since-clock.
    #[test]
    fn an_hour_window_at_one_second_keeps_the_annotation_small_and_rarely_written() {
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 1, "max_replicas": 100,
            "behavior": {
                "scale_down": { "stabilization_window": "3600s", "select_policy": "disabled", "policies": [] }
            },
            "metric": [{ "query": "q", "high_watermark": 10.0, "low_watermark": 10.0 }]
        }))
        .expect("rule");
        let start = 1_700_000_000_000;
        let mut spec = 20;
        let mut state = State::default();
        let mut written: Option<Written> = None;
        let (mut writes, mut largest, mut scales) = (0, 0, 0);
        let mut seed = 11u64;
        for second in 0..3 * 3600 {
            let now = t(start + second * 1000);
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            // 20 replicas at a usage between 3 and 8.9 against a low watermark of 10 (9 with the
            // tolerance): below the band throughout, proposals from 6 to 17.
            let noise = ((seed >> 33) % 1_000) as f64 / 1_000.0;
            let usage = 3.0 + 5.9 * noise;
            let target = watermarkd_engine::Target {
                spec_replicas: spec,
                status_replicas: Some(spec),
                ready_replicas: Some(spec),
            };
            let readings = [watermarkd_engine::Reading::Value { value: usage, at: now }];
            let decision = watermarkd_engine::decide(&rule, target, &readings, &state, now);
            if decision.action != watermarkd_engine::Action::Hold {
                scales += 1;
                spec = decision.replicas;
            }
            state = decision.state;
            let write = needs_write(written.as_ref(), &state, &rule, now);
            // What would be written, had a scale or a clock made this evaluation write.
            if write || second % 10 == 0 {
                largest = largest.max(encode_annotation("billing", &state).len());
            }
            if write {
                writes += 1;
                written = Some(Written::of(&state));
            }
        }
        assert_eq!(scales, 0);
        assert!(largest < MAX_ANNOTATION_BYTES, "{largest} bytes");
        // Once the windows hold the range of the noise, new readings within it write nothing.
        assert!(writes < 60, "{writes} writes in {} evaluations", 3 * 3600);
        eprintln!("{writes} writes, the largest {largest} bytes");
    }

    #[test]
    fn the_largest_possible_annotation_stays_small() {
        let rule = behavior_rule("3600s", "3600s");
        let now = t(1_700_000_000_000 + 10 * 3_600_000);
        // Every bucket of both windows holds a new extreme: each value outdoes the previous one
        // in one window and not the other, so neither window can drop any.
        let mut recommendations = Vec::new();
        for minute in 0..61 {
            let at = now.unix_millis() - 3_599_999 + minute * 59_999;
            recommendations.push(Recommendation { replicas: 4_000_000_000 - minute as u32, at: t(at) });
            recommendations.push(Recommendation { replicas: 1 + minute as u32, at: t(at) });
        }
        let kept = watermarkd_engine::decide(
            &rule,
            watermarkd_engine::Target { spec_replicas: 50, status_replicas: None, ready_replicas: None },
            &[],
            &State { recommendations, ..State::default() },
            now,
        )
        .state
        .recommendations;
        assert!(kept.len() >= 120, "{} entries", kept.len());
        let mut events = Vec::new();
        for i in 0..watermarkd_engine::MAX_SCALE_EVENTS as i64 {
            let at = t(now.unix_millis() - i * 1000);
            events.push(ScaleEvent { since: Some(t(at.unix_millis() - 999)), ..ScaleEvent::new(4_000_000_000, 1, at) });
        }
        let far = Some(t(now.unix_millis()));
        let fullest = State {
            last_scale_time: far,
            above_since: far,
            below_since: far,
            recommendations: kept,
            scale_events: events,
            zero: Some(Box::new(ZeroState { idle_since: far, scaled_to_zero_at: far })),
        };
        let name = "a".repeat(253);
        let annotation = encode_annotation(&name, &fullest);
        assert!(annotation.len() < MAX_ANNOTATION_BYTES, "{} bytes", annotation.len());
    }

    #[test]
    fn writes_on_scales_clock_flips_and_what_a_restart_would_miss() {
        let rule = behavior_rule("0s", "300s");
        let now = t(1_700_000_026_000);
        let written = state();
        let digest = Written::of(&written);
        assert!(!needs_write(Some(&digest), &written, &rule, now), "nothing changed");
        let mut next = written.clone();
        next.recommendations.push(Recommendation { replicas: 4, at: now });
        assert!(!needs_write(Some(&digest), &next, &rule, now), "the same recommendation again is not written");
        let mut lower = next.clone();
        lower.recommendations.push(Recommendation { replicas: 3, at: t(1_700_000_027_000) });
        assert!(
            !needs_write(Some(&digest), &lower, &rule, t(1_700_000_027_000)),
            "nor a lower one: the 4 written counts as made at a restart"
        );
        let mut higher = next.clone();
        higher.recommendations.push(Recommendation { replicas: 5, at: t(1_700_000_041_000) });
        assert!(needs_write(Some(&digest), &higher, &rule, t(1_700_000_041_000)), "a new maximum is");
        let mut expired = written.clone();
        expired.recommendations = vec![Recommendation { replicas: 2, at: t(1_700_000_400_000) }];
        assert!(
            needs_write(Some(&digest), &expired, &rule, t(1_700_000_400_000)),
            "so is the written maximum leaving the live window: a restart would hold it"
        );
        let mut pruned = written.clone();
        pruned.scale_events.insert(0, ScaleEvent::new(2, 3, t(1_700_000_000_000)));
        assert!(!needs_write(Some(&Written::of(&pruned)), &written, &rule, now), "an old event aging out is not");
        next.below_since = Some(now);
        assert!(needs_write(Some(&digest), &next, &rule, now));
        let mut scaled = written.clone();
        scaled.last_scale_time = Some(t(1_700_000_030_000));
        assert!(needs_write(Some(&digest), &scaled, &rule, now));
        let mut idle = written.clone();
        idle.zero = None;
        assert!(needs_write(Some(&digest), &idle, &rule, now), "scale to zero's clock too");
        assert!(!needs_write(None, &State::default(), &rule, now));
        assert!(needs_write(None, &written, &rule, now));
    }

    #[test]
    fn the_newest_recommendation_counts_as_made_at_the_restart() {
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
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
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
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
            scale_events: vec![ScaleEvent::new(2, 3, t(1_700_000_050_000)), ScaleEvent::new(3, 5, decided)],
            ..State::default()
        };
        stamp_confirmed_scale(&mut next, decided, confirmed);
        assert_eq!(next.last_scale_time, Some(confirmed));
        assert_eq!(
            next.scale_events,
            vec![ScaleEvent::new(2, 3, t(1_700_000_050_000)), ScaleEvent::new(3, 5, confirmed)]
        );
        // A state that did not scale at this decision keeps its times.
        let mut held = State { last_scale_time: Some(t(1_700_000_050_000)), ..State::default() };
        stamp_confirmed_scale(&mut held, decided, confirmed);
        assert_eq!(held.last_scale_time, Some(t(1_700_000_050_000)));
    }

    #[test]
    fn times_from_the_future_are_taken_as_now() {
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
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
            scale_events: vec![ScaleEvent::new(3, 4, t(1_700_000_200_000))],
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
