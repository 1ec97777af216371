//! Time arithmetic that cannot panic. `Instant + Duration` panics when the sum is beyond what
//! the clock can represent; the durations added to instants come from rules files, WPA objects
//! and settings, and although every one of them is bounded when it is read, a daemon must not
//! be one missed bound away from a crash. So instants are moved on by saturating instead.

use std::time::Duration;

use tokio::time::Instant;

/// `at + by`, or, when that is beyond what the clock can represent, an instant at least half as
/// far ahead as the clock can go: "never", for any schedule or deadline.
pub fn saturating_add(at: Instant, by: Duration) -> Instant {
    let mut step = by;
    loop {
        if let Some(later) = at.checked_add(step) {
            return later;
        }
        // Halving reaches a sum that fits within 64 steps at most: `at + 0` always does.
        step /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_that_fits_is_exact() {
        let now = Instant::now();
        assert_eq!(saturating_add(now, Duration::from_secs(15)), now + Duration::from_secs(15));
        assert_eq!(saturating_add(now, Duration::ZERO), now);
    }

    #[test]
    fn a_sum_beyond_the_clock_saturates_instead_of_panicking() {
        let now = Instant::now();
        let far = saturating_add(now, Duration::MAX);
        assert!(far > now + Duration::from_secs(100 * 365 * 86_400), "far in the future: {:?}", far - now);
        // Already as late as the clock goes: adding more moves it no further than fits.
        let further = saturating_add(far, Duration::from_secs(i64::MAX.unsigned_abs()));
        assert!(further >= far);
    }
}
