//! Unit tests of the pacing arithmetic, on a paused clock of their own.

use super::*;

fn headers(limit: u64, remaining: u64, reset: u64) -> RateLimitHeaders {
    RateLimitHeaders {
        limit: Some(limit),
        period: Some(3_600),
        remaining: Some(remaining),
        reset: Some(reset),
        name: Some("query".into()),
    }
}

#[test]
fn the_first_answer_replaces_the_assumed_budget_for_the_next_cycle() {
    let t0 = Instant::now();
    let mut pacer = Pacer::new(t0);
    // 29 requests against the assumed 1,600/hour would space the next cycle by a minute.
    assert_eq!(pacer.admit(t0, 29), Admission::Learn);
    assert_eq!(pacer.admit(t0, 28), Admission::Go, "the learning request's answer had no headers");
    assert!(matches!(pacer.admit(t0 + Duration::from_secs(15), 29), Admission::Deferred { .. }));
    let mut pacer = Pacer::new(t0);
    assert_eq!(pacer.admit(t0, 29), Admission::Learn);
    assert_eq!(pacer.admit(t0, 28), Admission::Go);
    pacer.observe(t0 + Duration::from_millis(200), &headers(1_000_000, 999_971, 3_000), true);
    assert_eq!(pacer.admit(t0 + Duration::from_secs(15), 29), Admission::Go, "paced from the real budget");
}

/// Two hours, second by second: live cycles of `live` requests every 30 s, and a
/// background reader that asks whenever it was told to. Returns, per hour, the live asks
/// not admitted at once and the background requests sent.
fn live_and_background(live: u64) -> Vec<(u64, u64)> {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    let mut hours = vec![(0, 0); 2];
    let mut background_at = t0;
    for second in 0..7_200u64 {
        let now = t0 + Duration::from_secs(second);
        let hour = usize::try_from(second / 3_600).unwrap();
        if second % 3_600 == 0 {
            // Each window's first answer: the whole budget, an hour to go.
            p.observe(now, &headers(1_600, 1_600, 3_600), true);
        }
        if second % 30 == 0 && p.admit(now, live) != Admission::Go {
            hours[hour].0 += 1;
        }
        if now >= background_at {
            match p.admit_background(now) {
                Ok(()) => hours[hour].1 += 1,
                Err(wait) => background_at = now + wait,
            }
        }
    }
    hours
}

#[test]
fn background_requests_take_only_what_the_live_cycles_leave() {
    // 10 requests every 30 s is 1,200 of the 1,520 usable an hour.
    let hours = live_and_background(10);
    assert_eq!(hours[0].0 + hours[1].0, 0, "every live cycle went at once: {hours:?}");
    let (_, background) = hours[1];
    assert!(background >= 100, "the spare budget went to the background: {hours:?}");
    assert!(1_200 + background <= 1_520, "nothing beyond the reserve: {hours:?}");
    // A live load that takes the whole budget leaves nothing to the background.
    let hours = live_and_background(13);
    assert_eq!(hours[1].1, 0, "{hours:?}");
}

#[test]
fn background_requests_wait_for_the_live_rate_and_after_a_429() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers(1_600, 1_600, 3_600), true);
    assert!(p.admit_background(t0).is_err(), "the live rate is not known yet");
    assert_eq!(p.admit(t0, 1), Admission::Go);
    assert_eq!(p.admit(t0 + Duration::from_secs(30), 1), Admission::Go);
    let later = t0 + Duration::from_secs(31);
    assert_eq!(p.admit_background(later), Ok(()));
    p.rate_limited(later, Duration::from_secs(40));
    let blocked = p.admit_background(later + Duration::from_secs(30)).unwrap_err();
    assert_eq!(blocked, Duration::from_secs(10), "until the 429's reset");

    // Without any live ask, the first window's end says there is no live traffic.
    let mut p = Pacer::new(t0);
    assert!(p.admit_background(t0 + Duration::from_secs(29)).is_err());
    assert_eq!(p.admit_background(t0 + Duration::from_secs(30)), Ok(()));
}

#[test]
fn before_any_answer_the_default_hour_is_assumed() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    assert_eq!(p.admit(t0, 29), Admission::Learn);
    assert_eq!(p.admit(t0, 29), Admission::Go, "only the first ask learns");
    // 29 requests x 3600 s / (1600 - 1 - 80) = 68.7 s.
    assert!(matches!(
        p.admit(t0 + Duration::from_secs(59), 29),
        Admission::Deferred { stretched_interval_seconds: 69 }
    ));
    // An answer without headers leaves the budget a guess: a probe goes out after a minute.
    assert!(matches!(p.admit(t0 + Duration::from_secs(60), 29), Admission::Probe { stretched_interval_seconds: 69 }));
    assert_eq!(p.admit(t0 + Duration::from_secs(69), 29), Admission::Go);
    assert!(p.snapshot(t0).is_none(), "no snapshot before the first answer");
}

#[test]
fn a_window_is_spent_evenly_and_never_beyond_the_reserve() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers(100, 100, 600), true);
    let mut spent = 0;
    let mut t = t0;
    while t < t0 + Duration::from_secs(600) {
        if p.admit(t, 10) == Admission::Go {
            for _ in 0..10 {
                spent += 1;
                p.observe(t, &headers(100, 100 - spent, ceil_secs(t0 + Duration::from_secs(600) - t)), true);
            }
        }
        t += Duration::from_secs(5);
    }
    assert!(spent <= 100 - reserve(100), "spent {spent}");
    assert!(spent >= 80, "the budget is used, not hoarded: spent {spent}");
}

#[test]
fn a_cycle_larger_than_what_is_left_waits_for_the_reset() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers(1600, 100, 300), true);
    assert_eq!(p.admit(t0, 29), Admission::Deferred { stretched_interval_seconds: 301 });
    assert!(matches!(p.admit(t0 + Duration::from_secs(300), 29), Admission::Deferred { .. }));
    assert_eq!(p.admit(t0 + Duration::from_secs(302), 29), Admission::Go);
}

#[test]
fn a_429_blocks_until_its_reset() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.rate_limited(t0, Duration::from_secs(30));
    assert_eq!(p.admit(t0 + Duration::from_millis(500), 1), Admission::RateLimited { reset_in_seconds: 30 });
    assert_eq!(p.admit(t0 + Duration::from_secs(29), 1), Admission::RateLimited { reset_in_seconds: 1 });
    assert_eq!(p.admit(t0 + Duration::from_secs(30), 1), Admission::Go);
    assert_eq!(p.blocked(t0 + Duration::from_secs(31)), None);
}

#[test]
fn answers_within_a_window_keep_the_lowest_remaining() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers(1600, 1500, 1000), true);
    p.observe(t0, &headers(1600, 1502, 1000), true);
    assert_eq!(p.snapshot(t0).map(|s| s.remaining), Some(1500));
    // The next window: its numbers replace the old ones.
    let later = t0 + Duration::from_secs(1002);
    p.observe(later, &headers(1600, 1599, 3600), true);
    assert_eq!(p.snapshot(later).map(|s| s.remaining), Some(1599));
    // A straggler from the old window changes nothing.
    p.observe(later, &headers(1600, 3, 0), true);
    assert_eq!(p.snapshot(later).map(|s| s.remaining), Some(1599));
}

#[test]
fn what_other_users_spend_is_left_to_them() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    // Half-way through the window, others spent 400 (the server says 1,200 left after our
    // one answered request): they are expected to spend ~400 more, so 720 are ours.
    p.observe(t0, &headers(1600, 1199, 1799), true);
    assert_eq!(p.admit(t0, 10), Admission::Go);
    let spacing = p.last_spacing.as_secs_f64();
    let expected = 1800.0 * 10.0 / (1199.0 - 80.0 - 400.0);
    assert!((spacing - expected).abs() < 1.0, "{spacing} vs {expected}");
    // A burst right after the reset is not extrapolated beyond half of what is left.
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers(1600, 799, 3590), true);
    assert_eq!(p.admit(t0, 10), Admission::Go);
    let expected = 3591.0 * 10.0 / ((799.0 - 80.0) / 2.0);
    assert!((p.last_spacing.as_secs_f64() - expected).abs() < 1.0);
    // Our own requests are not mistaken for someone else's.
    let mut p = Pacer::new(t0);
    for remaining in (1500..1600).rev() {
        p.observe(t0, &headers(1600, remaining, 1800), true);
    }
    assert_eq!(p.others_until_reset(), 0.0);
}

#[test]
fn extra_requests_never_take_the_last_half_of_the_reserve() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers(1600, 100, 1000), true);
    assert!(p.take_extra(t0, 60));
    assert!(!p.take_extra(t0, 1), "40 left = half the reserve of 80");
    assert_eq!(p.admit(t0, 1), Admission::Deferred { stretched_interval_seconds: 1001 });
}

#[test]
fn the_stretch_is_logged_only_when_it_changes_enough() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut p = Pacer::new(t0);
    p.note(at(0), Some(60));
    assert_eq!(p.stretch_to_log(), (60, Some(60)));
    p.note(at(15), Some(62));
    assert_eq!(p.stretch_to_log(), (62, None));
    for s in [30, 45, 60, 75] {
        p.note(at(s), None);
        assert_eq!(p.stretch_to_log(), (62, None), "admitted at {s}s, 62s not yet over: still stretched");
    }
    p.note(at(90), None);
    assert_eq!(p.stretch_to_log(), (0, Some(0)));
}

#[test]
fn a_spacing_hovering_around_the_interval_stays_stretched_without_flapping() {
    // Asks every 15 s against a spacing of about 16 s: two admitted asks in a row now and
    // then, but cycles keep being deferred. The gauge must not drop to 0 in between, and
    // the appearance is logged once.
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    let mut logs = Vec::new();
    let mut gauge = Vec::new();
    for k in 0..40u64 {
        let deferred = (k % 3 == 2).then_some(16);
        p.note(t0 + Duration::from_secs(15 * k), deferred);
        let (value, logged) = p.stretch_to_log();
        gauge.push(value);
        logs.extend(logged);
    }
    assert!(gauge[2..].iter().all(|v| *v == 16), "{gauge:?}");
    assert_eq!(logs, [16]);
    // Then everything fits: "fits again" once, after CALM_ASKS admitted asks.
    for k in 40..50u64 {
        p.note(t0 + Duration::from_secs(15 * k), None);
        logs.extend(p.stretch_to_log().1);
    }
    assert_eq!(logs, [16, 0]);
}

#[test]
fn the_stretch_does_not_flap_across_window_resets_while_cycles_are_deferred() {
    // A budget that runs out before each reset: at every reset a few cycles are admitted
    // back to back, then the spacing returns. Over several windows the gauge never reads 0
    // and "fits again" is never logged.
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    let period = 300;
    p.observe(t0, &headers_with_period(100, 100, period, period), true);
    let mut spent_in_window = 0;
    let mut window = 0;
    let mut logs = Vec::new();
    let mut zero_after_stretch = false;
    let mut t = t0;
    while t < t0 + Duration::from_secs(period * 4) {
        let elapsed = (t - t0).as_secs();
        if elapsed / period != window {
            window = elapsed / period;
            spent_in_window = 0;
        }
        // Another user spends steadily.
        let others = (elapsed % period) / 4;
        if p.admit(t, 10) == Admission::Go {
            spent_in_window += 10;
            let remaining = 100u64.saturating_sub(spent_in_window + others);
            p.observe(t, &headers_with_period(100, remaining, period - elapsed % period, period), true);
        }
        let (value, logged) = p.stretch_to_log();
        if logs.contains(&value) && value == 0 {
            zero_after_stretch = true;
        }
        logs.extend(logged);
        t += Duration::from_secs(15);
    }
    assert!(!logs.is_empty() && logs[0] > 0, "the budget is tight enough to stretch: {logs:?}");
    assert!(!logs.contains(&0), "never logged as fitting again: {logs:?}");
    assert!(!zero_after_stretch);
}

pub(super) fn headers_with_period(limit: u64, remaining: u64, reset: u64, period: u64) -> RateLimitHeaders {
    RateLimitHeaders {
        limit: Some(limit),
        period: Some(period),
        remaining: Some(remaining),
        reset: Some(reset),
        name: None,
    }
}

/// The longest a pacer may go without letting a request through after answers with these
/// headers: their reset (when it is a number, clamped to the period, or to an hour), or a
/// minute, whichever is longer; plus the reset margin and one ask step.
fn allowed_silence(limit: &str, remaining: &str, reset: &str, period: &str) -> Duration {
    let _ = (limit, remaining);
    let period = period.parse::<u64>().ok().filter(|p| (1..=3_600).contains(p)).unwrap_or(3_600);
    let reset = reset.parse::<u64>().ok().map_or(0, |r| r.min(period));
    Duration::from_secs(reset).max(PROBE_AFTER) + RESET_MARGIN + ASK_STEP
}

/// How often the walk asks (coarser than a real schedule's asks, to keep the walk short).
const ASK_STEP: Duration = Duration::from_secs(5);

#[test]
fn pacing_never_stops_for_good_whatever_the_headers() {
    // Every combination of missing, zero, negative, garbage, normal and huge headers, after
    // ok answers and after 429s, for a one-request cycle, a usual one and one larger than
    // the whole default budget. Each answer that follows says the same again (the server
    // stays broken): a request must still be let through within the allowed silence, every
    // time.
    let limits = ["", "0", "-1", "abc", "1", "1600", "1000000000000"];
    let remainings = ["", "0", "-5", "x", "1", "1500", "1000000000000"];
    let resets = ["", "0", "-3", "soon", "42", "3000", "1000000000000"];
    let periods = ["", "0", "-60", "1h", "60", "3600", "1000000000000"];
    let mut checked = 0;
    for limit in limits {
        for remaining in remainings {
            for reset in resets {
                for period in periods {
                    let pairs = [
                        ("x-ratelimit-limit", limit),
                        ("x-ratelimit-remaining", remaining),
                        ("x-ratelimit-reset", reset),
                        ("x-ratelimit-period", period),
                    ];
                    let headers = RateLimitHeaders::from_pairs(pairs.into_iter().filter(|(_, v)| !v.is_empty()));
                    let allowed = allowed_silence(limit, remaining, reset, period);
                    for status in [200u16, 429] {
                        for n in [1u64, 29, 5_000] {
                            let case = format!(
                                "limit {limit:?} remaining {remaining:?} reset {reset:?} period {period:?}, \
                                 HTTP {status}, cycle of {n}"
                            );
                            walk(&headers, status, n, allowed, &case);
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(checked, 7 * 7 * 7 * 7 * 2 * 3);
}

/// Three rounds of: a request is let through, the answer carries `headers` (with `status`),
/// then asks every `ASK_STEP` until the next request is let through.
fn walk(headers: &RateLimitHeaders, status: u16, n: u64, allowed: Duration, case: &str) {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    let mut t = t0;
    let first = p.admit(t, n);
    assert!(
        matches!(first, Admission::Go | Admission::Learn | Admission::Part { .. } | Admission::Probe { .. }),
        "{case}: first ask {first:?}"
    );
    for round in 0..3 {
        let answered = t + Duration::from_millis(200);
        p.observe(answered, headers, status != 429);
        if status == 429 {
            p.rate_limited(answered, headers.wait_after_429());
        }
        let sent_at = t;
        loop {
            t += ASK_STEP;
            match p.admit(t, n) {
                Admission::Go | Admission::Learn | Admission::Part { .. } | Admission::Probe { .. } => break,
                Admission::Deferred { .. } | Admission::RateLimited { .. } => {}
            }
            assert!(t - sent_at <= allowed, "{case}: round {round}, nothing sent for {:?}", t - sent_at);
        }
    }
}

/// A server with calendar windows of `period` seconds and `limit` requests each, seen by a
/// pacer asked every `ask` seconds for a cycle of `n` requests for `duration` seconds; the
/// asks' answers carry its headers. Returns the requests of each window and the sends of
/// each ask.
fn spend(limit: u64, period: u64, n: u64, ask: u64, duration: u64) -> (Vec<u64>, Vec<u64>) {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    let mut used = vec![0u64; usize::try_from(duration / period + 1).unwrap()];
    let mut sends = Vec::new();
    let mut t = 0;
    while t < duration {
        let now = t0 + Duration::from_secs(t);
        let window = usize::try_from(t / period).unwrap();
        let mut answer = |p: &mut Pacer, count: u64| {
            for _ in 0..count {
                assert!(used[window] < limit, "a 429 at {t}s: {used:?}");
                used[window] += 1;
                let reset = period - t % period;
                p.observe(now, &headers_with_period(limit, limit - used[window], reset, period), true);
            }
        };
        let mut sent = 0;
        let mut left = n;
        loop {
            match p.admit(now, left) {
                Admission::Learn => {
                    answer(&mut p, 1);
                    sent += 1;
                    left -= 1;
                    continue;
                }
                Admission::Go => {
                    answer(&mut p, left);
                    sent += left;
                }
                Admission::Part { requests, .. } => {
                    answer(&mut p, requests);
                    sent += requests;
                }
                Admission::Probe { .. } => {
                    answer(&mut p, 1);
                    sent += 1;
                }
                Admission::Deferred { .. } | Admission::RateLimited { .. } => {}
            }
            break;
        }
        sends.push(sent);
        t += ask;
    }
    (used, sends)
}

#[test]
fn a_cycle_larger_than_a_window_is_spread_over_the_windows() {
    // 1,000 autoscalers (29 requests a cycle) on 27 requests a minute, asked every 15 s.
    let (used, sends) = spend(27, 60, 29, 15, 600);
    let full = &used[..used.len() - 1];
    // Every whole window spends what it allows beyond the reserve (27 - 2), give or take
    // one request of rounding, never more.
    assert!(full.iter().all(|u| (23..=25).contains(u)), "per window {used:?}");
    // Spread: no ask sends more than about a third of a window. The ask on a window's
    // boundary still sees the old window (its reset is trusted a second late) and sends
    // nothing; the next one makes up for it.
    assert!(sends.iter().all(|s| *s <= 10), "per ask {sends:?}");
    assert!(sends.iter().filter(|s| **s == 0).count() <= used.len(), "per ask {sends:?}");
    // The first ask learns the budget with one request, then sends a quarter window's worth.
    assert!((5..=8).contains(&sends[0]), "first ask {}", sends[0]);

    // The same rate in windows of 18 s: 8 requests, reserve 1, asks every 15 s.
    let (used, sends) = spend(8, 18, 29, 15, 600);
    let spent: u64 = used.iter().sum();
    // 7 usable per 18 s is 233 in 600 s; asks every 15 s cannot follow 18 s windows exactly.
    assert!(spent >= 180, "{spent} of about 233: per window {used:?}");
    assert!(sends.iter().all(|s| *s <= 7), "per ask {sends:?}");
}

#[test]
fn a_spread_cycle_reports_its_stretched_interval() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    p.observe(t0, &headers_with_period(27, 27, 60, 60), true);
    // 25 usable over 61 s: 2.44 s a request, 29 requests take 71 s.
    match p.admit(t0, 29) {
        Admission::Part { requests, stretched_interval_seconds } => {
            assert_eq!(requests, 6, "a quarter window's worth");
            assert_eq!(stretched_interval_seconds, 71);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.stretch_to_log(), (71, Some(71)));
    // Asked again at once: nothing accrued yet.
    assert!(matches!(p.admit(t0, 29), Admission::Deferred { .. }));
}

#[test]
fn before_any_answer_one_request_learns_the_budget() {
    let t0 = Instant::now();
    let mut p = Pacer::new(t0);
    assert_eq!(p.admit(t0, 29), Admission::Learn);
    // Its answer: 27 a minute, 26 left.
    p.observe(t0, &headers_with_period(27, 26, 60, 60), true);
    assert!(matches!(p.admit(t0, 28), Admission::Part { requests: 5, .. }), "not 28 at once");
    // A cycle of one request needs no learning.
    let mut p = Pacer::new(t0);
    assert_eq!(p.admit(t0, 1), Admission::Go);
}
