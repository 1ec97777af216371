//! When each autoscaler falls due. Pure, so the rules are tested without a clock.
//!
//! Every autoscaler runs at a fixed rate on its own interval, offset by a phase taken from a
//! hash of its key: load spreads over the interval (jitter) and a restart keeps the phases. The
//! phase is a whole number of `GRID` steps, so autoscalers whose phases coincide fall due at the
//! same instant: with 15s intervals there are at most 15 due instants per interval.
//!
//! Autoscalers that query Datadog are the exception: they have no phase, so all of those with
//! the same interval fall due together, as one cycle. Their queries then share the fewest
//! batched requests, and when the organisation's rate budget cannot cover every cycle, the
//! pacing stretches that one cycle for all of them alike. With phases, the budget would be
//! spent on whichever groups happened to fall due when it allowed, and the groups in between
//! would never be served.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::instant::saturating_add;

/// The step phases are rounded to.
pub const GRID: Duration = Duration::from_secs(1);

/// The phase of `key` within `interval`: in `[0, interval)`, a multiple of `GRID`.
pub fn phase(key: &str, interval: Duration) -> Duration {
    let steps = (interval.as_millis() / GRID.as_millis()).max(1);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let step = u128::from(hasher.finish()) % steps;
    GRID.saturating_mul(u32::try_from(step).unwrap_or(0))
}

/// The first due instant of an autoscaler that starts at `now`: the next instant at
/// `epoch + phase + k * interval`, where `epoch` is the daemon's start, so autoscalers with the
/// same interval and phase line up however late they were added.
pub fn first_due(epoch: Instant, now: Instant, key: &str, interval: Duration, aligned: bool) -> Instant {
    let start = if aligned { epoch } else { saturating_add(epoch, phase(key, interval)) };
    if start >= now {
        return start;
    }
    let behind = now.duration_since(start);
    let periods = behind.as_nanos().div_ceil(interval.as_nanos().max(1));
    saturating_add(start, interval.saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX)))
}

/// The due instant after `due`, skipping any that already passed (an autoscaler that was
/// skipped or slow does not run several times to catch up). Saturates, as `first_due` does:
/// an interval beyond the clock's range is one that never falls due again, not a panic.
pub fn next_due(due: Instant, now: Instant, interval: Duration) -> Instant {
    let next = saturating_add(due, interval);
    if next > now {
        return next;
    }
    let behind = now.duration_since(next);
    let periods = behind.as_nanos() / interval.as_nanos().max(1) + 1;
    saturating_add(next, interval.saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_grid_steps_within_the_interval() {
        let interval = Duration::from_secs(15);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..1000 {
            let p = phase(&format!("autoscaler-{i}"), interval);
            assert!(p < interval);
            assert_eq!(p.as_millis() % GRID.as_millis(), 0);
            seen.insert(p);
        }
        assert_eq!(seen.len(), 15, "1,000 keys use every one of the 15 steps");
        assert_eq!(phase("x", Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(phase("x", interval), phase("x", interval), "stable");
    }

    #[test]
    fn first_due_lines_up_with_the_epoch() {
        let epoch = Instant::now();
        let interval = Duration::from_secs(10);
        let p = phase("a", interval);
        assert_eq!(first_due(epoch, epoch, "a", interval, false), epoch + p);
        let late = epoch + Duration::from_secs(95);
        let due = first_due(epoch, late, "a", interval, false);
        assert!(due >= late && due < late + interval);
        assert_eq!(due.duration_since(epoch + p).as_nanos() % interval.as_nanos(), 0);
        // Aligned: every key at the epoch's multiples.
        for key in ["a", "b", "c"] {
            assert_eq!(first_due(epoch, late, key, interval, true), epoch + Duration::from_secs(100));
        }
    }

    #[test]
    fn next_due_skips_missed_instants() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(5);
        assert_eq!(next_due(t0, t0 + Duration::from_secs(1), interval), t0 + interval);
        assert_eq!(next_due(t0, t0 + Duration::from_secs(12), interval), t0 + Duration::from_secs(15));
        assert_eq!(next_due(t0, t0 + Duration::from_secs(10), interval), t0 + Duration::from_secs(15));
    }

    #[test]
    fn an_interval_beyond_the_clock_saturates_instead_of_panicking() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(i64::MAX.unsigned_abs());
        let first = first_due(t0, t0 + Duration::from_secs(1), "a", interval, false);
        assert!(first > t0, "the phase alone is far in the future");
        let aligned = first_due(t0, t0 + Duration::from_secs(1), "a", interval, true);
        assert!(aligned > t0 + Duration::from_secs(86_400));
        let next = next_due(t0, t0, interval);
        assert!(next > t0 + Duration::from_secs(100 * 365 * 86_400));
        assert!(next_due(next, next, interval) >= next, "and again from there");
    }
}
