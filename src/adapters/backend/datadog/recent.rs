//! What the backend remembers of recent cycles: when each query text was last sent (what
//! cannot all go now goes oldest first), and the values that cannot have changed yet, kept
//! until they can (budget-aware refresh), by a keyed hash of their text.

use super::*;

/// A value `Inner::current` keeps while it cannot have changed: what the answer gave, without
/// the parts only a failed or partial answer has (those are never kept), so that 10,000 of them
/// cost 64 bytes each rather than a whole `Observation`.
#[derive(Clone, Copy, Debug)]
pub(super) struct StillCurrent {
    pub(super) value: f64,
    pub(super) at: Timestamp,
    pub(super) until: Timestamp,
    pub(super) series: Option<u32>,
    pub(super) points: Option<u32>,
    pub(super) chosen_point: Option<u32>,
    pub(super) interval_seconds: Option<u32>,
}

impl StillCurrent {
    /// What to keep of `observation`, current until `until`: `None` for anything but a plain
    /// value (an error, a warning, a lower bound) or a count too large to keep exactly.
    pub(super) fn of(observation: &Observation, until: Timestamp) -> Option<StillCurrent> {
        let watermarkd_engine::Reading::Value { value, at } = observation.reading else { return None };
        let detail = &observation.detail;
        if detail.error.is_some() || detail.partial.is_some() || !detail.warnings.is_empty() {
            return None;
        }
        pub(super) fn narrow<T: TryInto<u32>>(n: Option<T>) -> Option<Option<u32>> {
            n.map_or(Some(None), |n| n.try_into().ok().map(Some))
        }
        Some(StillCurrent {
            value,
            at,
            until,
            series: narrow(detail.series)?,
            points: narrow(detail.points)?,
            chosen_point: narrow(detail.chosen_point)?,
            interval_seconds: narrow(detail.interval_seconds)?,
        })
    }

    pub(super) fn observation(&self) -> Observation {
        let widen = |n: Option<u32>| n.map(|n| n as usize);
        Observation::value(
            self.value,
            self.at,
            ObservationDetail {
                series: widen(self.series),
                points: widen(self.points),
                chosen_point: widen(self.chosen_point),
                interval_seconds: self.interval_seconds.map(u64::from),
                ..ObservationDetail::default()
            },
        )
    }
}

impl Inner {
    /// Notes that these queries were sent at `at`. Queries not sent for two of the longest
    /// windows are forgotten (a removed autoscaler's, or one so starved that it is the oldest
    /// anyway), so the record cannot grow without bound.
    pub(super) fn served_now<'a>(&self, sent: impl Iterator<Item = &'a str>, at: Instant) {
        let mut served = lock(&self.served);
        for text in sent {
            served.insert(self.text_key(text), at);
        }
        served.retain(|_, when| at.saturating_duration_since(*when) < pacing::MAX_WINDOW * 2);
    }

    /// Notes a cycle at `now`, and returns how long after the previous one it came: the gap
    /// the next cycle is expected after (none for the first, or when the clock went back).
    pub(super) fn cycle_gap(&self, now: Timestamp) -> Option<Duration> {
        let mut last = lock(&self.last_cycle);
        let gap = last.filter(|last| now > *last).map(|last| now.since(last));
        *last = Some(now);
        gap
    }

    /// Keeps each value just read until it can change: the penultimate point of a series with
    /// a rollup of I seconds, at time p, stays the penultimate point until a point exists for
    /// the bucket after next, at p + 2I. Asking again before then costs a request for the
    /// same value (with 15 s cycles and a 30 s rollup, every other request), so until then a
    /// cycle answers from here: the decision still runs every cycle, with the value's own
    /// time, so its age shows. Anything but a value is forgotten, and asked again next cycle,
    /// and so is a value that can change before `next_cycle` (when the next cycle is expected,
    /// by the last gap between cycles): keeping it would cost memory (64 bytes per query) and
    /// save no request.
    pub(super) fn note_current<'a>(
        &self,
        read: impl Iterator<Item = (&'a str, Option<&'a Observation>)>,
        next_cycle: Timestamp,
    ) {
        let mut current = lock(&self.current);
        for (text, observation) in read {
            let key = self.text_key(text);
            let until = observation.and_then(|o| match (&o.reading, o.detail.interval_seconds) {
                (watermarkd_engine::Reading::Value { at, .. }, Some(interval)) if interval > 0 => {
                    Some(at.plus(Duration::from_secs(interval.saturating_mul(2))))
                }
                _ => None,
            });
            let kept = until
                .filter(|until| *until > next_cycle)
                .zip(observation)
                .and_then(|(until, o)| StillCurrent::of(o, until));
            match kept {
                Some(kept) => {
                    current.insert(key, kept);
                }
                None => {
                    current.remove(&key);
                }
            }
        }
    }

    /// A query text's key in `served` and `current`: a hash, not the text, so that 10,000
    /// autoscalers' queries cost a few hundred kilobytes there rather than a copy of every
    /// text. The hash is keyed per process (`text_keys`), so a collision is chance alone
    /// (about one in 10^11 at 10,000 texts), never something a query's author can arrange.
    pub(super) fn text_key(&self, text: &str) -> u64 {
        use std::hash::BuildHasher;
        self.text_keys.hash_one(text)
    }
}
