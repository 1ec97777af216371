//! What the `behavior` rules keep of the past (docs/engine.md §3b, "What the state keeps"): a
//! bounded summary of the recommendations and scale events, never less strict than the full
//! history would be.
//!
//! A stabilization window only ever asks for the highest (scale-down) or lowest (scale-up)
//! recommendation younger than its length. So of the recommendations, the state keeps, per
//! window, the ones no younger one outdoes, and of those at most one per bucket, a sixtieth of
//! the window: an entry that outdoes the later recommendations of its bucket takes the time of
//! the newest of them, so it counts until the whole bucket has left the window. That holds a
//! value at most one bucket longer than the full history would, never shorter, and bounds each
//! window to 61 entries whatever the interval.
//!
//! A policy only asks how many replicas the scales within its period added and removed. Scale
//! events are kept as they are up to [`MAX_SCALE_EVENTS`]; beyond that, the two closest scales
//! in one direction become one, spanning both times: it counts for its own direction until its
//! newest scale leaves the period, and for the other direction (where counting it makes the
//! limit looser) until its oldest does.

use std::time::Duration;

use crate::input::{Recommendation, ScaleEvent};
use crate::time::Timestamp;

/// Buckets a stabilization window is divided into.
pub const BUCKETS_PER_WINDOW: i64 = 60;

/// Scale events kept before the closest ones are merged.
pub const MAX_SCALE_EVENTS: usize = 32;

/// Which recommendation of a window decides it.
#[derive(Clone, Copy)]
enum Extreme {
    /// The scale-down window's: the highest.
    Highest,
    /// The scale-up window's: the lowest.
    Lowest,
}

impl Extreme {
    /// Whether `kept` still decides the window over the younger `newer`.
    fn outdoes(self, kept: u32, newer: u32) -> bool {
        match self {
            Extreme::Highest => kept > newer,
            Extreme::Lowest => kept < newer,
        }
    }
}

/// `recommendations` (any history: a raw one, or one this module kept) reduced to what the
/// scale-up window (`up`) and the scale-down window (`down`) can still use at `now` and later,
/// oldest first. The windows' answers over the result are those over the input, or stricter by
/// at most one bucket of time.
pub fn keep_recommendations(
    recommendations: &[Recommendation],
    up: Duration,
    down: Duration,
    now: Timestamp,
) -> Vec<Recommendation> {
    let mut history: Vec<Recommendation> = recommendations.to_vec();
    history.sort_by_key(|r| r.at);
    let mut kept = window_profile(&history, down, now, Extreme::Highest);
    kept.extend(window_profile(&history, up, now, Extreme::Lowest));
    kept.sort_by_key(|r| (r.at, r.replicas));
    kept.dedup();
    kept
}

/// The entries of one window, oldest first: each younger than `window` at `now`, none outdone
/// by a younger one, at most one per bucket.
fn window_profile(
    history: &[Recommendation],
    window: Duration,
    now: Timestamp,
    extreme: Extreme,
) -> Vec<Recommendation> {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let bucket_ms = (window_ms / BUCKETS_PER_WINDOW).max(1);
    let bucket = |r: &Recommendation| r.at.unix_millis().div_euclid(bucket_ms);
    let mut profile: Vec<Recommendation> = Vec::new();
    for r in history.iter().filter(|r| now.since(r.at) < window) {
        while profile.last().is_some_and(|kept| !extreme.outdoes(kept.replicas, r.replicas)) {
            profile.pop();
        }
        match profile.last_mut() {
            // It stands for `r` as well, until `r` leaves the window.
            Some(kept) if bucket(kept) == bucket(r) => kept.at = kept.at.max(r.at),
            _ => profile.push(*r),
        }
    }
    profile
}

/// Adds `event` to `events` (oldest first), merging the closest scales of one direction while
/// there are more than [`MAX_SCALE_EVENTS`].
pub fn record_scale_event(events: &mut Vec<ScaleEvent>, event: ScaleEvent) {
    events.push(event);
    events.retain(|e| e.from != e.to);
    while events.len() > MAX_SCALE_EVENTS {
        let Some((older, newer)) = closest_pair(events) else { break };
        let (first, second) = (events.remove(older), newer - 1);
        if let Some(merged) = events.get_mut(second) {
            *merged = merge(first, *merged);
        }
    }
}

/// The indexes of the two scales of one direction, with no scale of that direction between
/// them, that lie closest in time.
fn closest_pair(events: &[ScaleEvent]) -> Option<(usize, usize)> {
    let mut best: Option<(Duration, usize, usize)> = None;
    for up in [true, false] {
        let same: Vec<usize> = (0..events.len()).filter(|&i| events.get(i).is_some_and(|e| e.is_up() == up)).collect();
        for pair in same.windows(2) {
            let &[older, newer] = pair else { continue };
            let (Some(a), Some(b)) = (events.get(older), events.get(newer)) else { continue };
            let gap = b.at.since(a.oldest());
            if best.is_none_or(|(g, _, _)| gap < g) {
                best = Some((gap, older, newer));
            }
        }
    }
    best.map(|(_, older, newer)| (older, newer))
}

/// Two scales of one direction as one: their total change, from the older one's oldest scale to
/// the newer one's newest.
fn merge(older: ScaleEvent, newer: ScaleEvent) -> ScaleEvent {
    let change = older.added().saturating_add(newer.added()).max(older.removed().saturating_add(newer.removed()));
    let to = if older.is_up() { older.from.saturating_add(change) } else { older.from.saturating_sub(change) };
    ScaleEvent { from: older.from, to, at: newer.at, since: Some(older.oldest()) }
}

/// Whether `event` still counts towards a policy of `period` at `now`, in the limit towards
/// more replicas (`up`) or fewer.
pub fn counts_within(event: &ScaleEvent, period: Duration, now: Timestamp, up: bool) -> bool {
    // Counting a scale longer is stricter in its own direction and looser in the other.
    let time = if event.is_up() == up { event.at } else { event.oldest() };
    now.since(time) < period
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_unix_millis(1_700_000_000_000 + seconds * 1000)
    }

    fn r(replicas: u32, seconds: i64) -> Recommendation {
        Recommendation { replicas, at: t(seconds) }
    }

    fn highest(history: &[Recommendation], window: Duration, now: Timestamp) -> u32 {
        history.iter().filter(|r| now.since(r.at) < window).map(|r| r.replicas).max().unwrap_or(0)
    }

    fn lowest(history: &[Recommendation], window: Duration, now: Timestamp) -> u32 {
        history.iter().filter(|r| now.since(r.at) < window).map(|r| r.replicas).min().unwrap_or(u32::MAX)
    }

    #[test]
    fn a_noisy_hour_at_one_second_keeps_at_most_one_entry_per_bucket_and_never_opens_a_window_early() {
        let (up, down) = (Duration::from_secs(60), Duration::from_secs(3600));
        let mut full: Vec<Recommendation> = Vec::new();
        let mut kept: Vec<Recommendation> = Vec::new();
        let mut seed = 7u64;
        for second in 0..6_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let replicas = 3 + u32::try_from((seed >> 33) % 40).unwrap_or(0);
            let now = t(second);
            full.push(r(replicas, second));
            kept.push(r(replicas, second));
            kept = keep_recommendations(&kept, up, down, now);
            assert!(kept.len() <= 2 * 61, "{} entries at {second}s", kept.len());
            full.retain(|r| now.since(r.at) < down + down / 60);
            if second % 13 != 0 {
                continue;
            }
            // Asked at any time from now on, the kept entries are at least as strict.
            for later in [0, 1, 30, 59, 60, 61, 600, 3599, 3600] {
                let at = t(second + later);
                assert!(highest(&kept, down, at) >= highest(&full, down, at), "down window at {second}+{later}s");
                assert!(lowest(&kept, up, at) <= lowest(&full, up, at), "up window at {second}+{later}s");
                // And stricter by at most one bucket: one minute down, one second up.
                let bucket = |window: Duration| window + window / 60;
                assert!(highest(&kept, down, at) <= highest(&full, bucket(down), at), "{second}+{later}s");
                assert!(lowest(&kept, up, at) >= lowest(&full, bucket(up), at), "{second}+{later}s");
            }
        }
    }

    #[test]
    fn a_raw_history_is_reduced_to_what_can_still_decide() {
        let (up, down) = (Duration::ZERO, Duration::from_secs(300));
        let raw = [r(9, 0), r(12, 1), r(8, 100), r(10, 200), r(7, 290)];
        // 12 outdoes 9; 10 outdoes 8; nothing younger outdoes 10 or 7. No scale-up window.
        assert_eq!(keep_recommendations(&raw, up, down, t(295)), vec![r(12, 1), r(10, 200), r(7, 290)]);
        // 12 has left the window at 301 s.
        assert_eq!(keep_recommendations(&raw, up, down, t(301)), vec![r(10, 200), r(7, 290)]);
        // Within one bucket (5 s), a higher value stands for the lower ones after it.
        let bucket = [r(10, 300), r(6, 301), r(8, 302)];
        assert_eq!(keep_recommendations(&bucket, up, down, t(302)), vec![r(10, 302)]);
    }

    #[test]
    fn scale_events_beyond_the_bound_merge_the_closest_of_one_direction() {
        let mut events = Vec::new();
        for i in 0..100u32 {
            let at = t(i64::from(i) * 10 + i64::from(i % 3));
            let event = if i % 2 == 0 {
                ScaleEvent { from: 5, to: 7, at, since: None }
            } else {
                ScaleEvent { from: 7, to: 6, at, since: None }
            };
            record_scale_event(&mut events, event);
            assert!(events.len() <= MAX_SCALE_EVENTS);
        }
        let added: u32 = events.iter().map(ScaleEvent::added).sum();
        let removed: u32 = events.iter().map(ScaleEvent::removed).sum();
        assert_eq!((added, removed), (100, 50), "the totals are kept");
        assert!(events.windows(2).all(|w| w[0].at <= w[1].at), "oldest first");
    }

    #[test]
    fn a_merged_scale_counts_longer_where_that_is_stricter() {
        let up = ScaleEvent { from: 4, to: 10, at: t(100), since: Some(t(40)) };
        let period = Duration::from_secs(60);
        // Towards more replicas, added replicas count until the newest scale leaves the period...
        assert!(counts_within(&up, period, t(159), true));
        // ...towards fewer, only until the oldest does.
        assert!(!counts_within(&up, period, t(100), false));
        assert!(counts_within(&up, period, t(99), false));
    }
}
