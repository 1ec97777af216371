//! The rate budget of the query endpoint: whether a cycle may spend part of it now, from what
//! the `X-RateLimit-*` headers said (`headers.rs`); each namespace's share of it is
//! `namespaces.rs`. The design is described in the module comment of `backend::datadog`; this
//! is the arithmetic.

pub(super) mod headers;
mod namespaces;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

pub use headers::RateLimitHeaders;
use namespaces::NamespaceCredit;

/// Datadog's documented default for the query endpoint, assumed until the first answer says.
pub const DEFAULT_LIMIT: u64 = 1_600;
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(3_600);
/// Share of the limit never planned for: retries, split batches, `watermarkd query`, and the
/// other users of the organisation's budget between two of our answers.
pub const RESERVE_PERCENT: u64 = 5;
/// `X-RateLimit-Reset` is whole seconds; trusting the window to end a second later than it
/// says never makes us assume a fresh budget while the server still counts the old window.
const RESET_MARGIN: Duration = Duration::from_secs(1);
/// Two answers whose reset moments differ by less than this describe the same window.
const SAME_WINDOW: Duration = Duration::from_secs(3);
/// The longest rate-limit window believed. Datadog's windows are an hour at most; a reset or a
/// period beyond this is a broken header (or a proxy's invention), and trusting it would stop
/// every request for that long.
pub const MAX_WINDOW: Duration = Duration::from_secs(3_600);
/// A request is sent at least this often, whatever the budget seems to say: when the numbers
/// we hold are wrong (a limit of 0, a cycle larger than the whole budget), only an answer can
/// correct them, and without this nothing would ever be asked again.
pub const PROBE_AFTER: Duration = Duration::from_secs(60);
/// Admitted asks in a row (besides a whole stretched interval) before the stretch is reported
/// gone: a spacing that hovers around the requested interval admits two asks in a row now and
/// then, which is not "fits again".
const CALM_ASKS: u32 = 4;
/// How long the live asks are counted before their rate is taken as what the live cycles need.
const LIVE_RATE_WINDOW: Duration = Duration::from_secs(30);
/// How long a background request waits before asking again when it may not go and no better
/// moment is known.
pub const BACKGROUND_RETRY: Duration = Duration::from_secs(30);
/// The budget as the client sees it now (for `watermarkd query` and logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitSnapshot {
    pub limit: u64,
    pub period_seconds: u64,
    /// As last reported, minus what this client has started since.
    pub remaining: u64,
    pub reset_seconds: u64,
    /// `X-RateLimit-Name`, when sent.
    pub name: Option<String>,
    /// After a 429: seconds until requests resume.
    pub blocked_for_seconds: Option<u64>,
    /// The cycle spacing the budget currently imposes (0: every requested cycle runs).
    pub stretched_interval_seconds: u64,
}

/// May a cycle of `n` requests start now?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The whole cycle goes now.
    Go,
    /// Nothing is known of the budget yet: send one request, read the budget from its answer's
    /// headers, then ask again for the rest of the cycle (which the first answer now paces).
    Learn,
    /// The cycle needs more requests than a whole window allows: send `requests` of it now (the
    /// queries whose data is oldest), defer the rest. Asks keep spending what the budget allows,
    /// so every query is refreshed every `stretched_interval_seconds`.
    Part {
        requests: u64,
        stretched_interval_seconds: u64,
    },
    /// The budget as we know it does not allow the cycle, but nothing was sent for
    /// `PROBE_AFTER` or since the window it was planned in ended: send one request (the first
    /// of the cycle), so that its answer's headers set the numbers right; defer the rest.
    Probe {
        stretched_interval_seconds: u64,
    },
    Deferred {
        stretched_interval_seconds: u64,
    },
    RateLimited {
        reset_in_seconds: u64,
    },
}

/// The pacing state of one Datadog backend.
#[derive(Debug)]
pub struct Pacer {
    limit: u64,
    period: Duration,
    /// Estimated requests left in the current window.
    remaining: u64,
    /// When the current window ends (with `RESET_MARGIN`).
    reset_at: Instant,
    /// Whether any answer carried the headers; before that the numbers are assumptions.
    seen: bool,
    /// The lowest `remaining` the server reported in the current window (`None`: no answer in
    /// it yet), and how many of our requests it answered (429s aside) in that window. Together
    /// they tell what the organisation's other users spent.
    server_remaining: Option<u64>,
    ours_answered: u64,
    /// When `server_remaining` was last lowered.
    observed_at: Instant,
    name: Option<String>,
    /// After a 429: nothing is sent before this.
    blocked_until: Option<Instant>,
    next_cycle_not_before: Option<Instant>,
    /// Spacing imposed after the last admitted cycle.
    last_spacing: Duration,
    /// When the last cycle (or probe) was let through.
    last_sent: Instant,
    /// Whether `reset_at` comes from the last answer's headers (or from them and a period they
    /// gave) rather than from an assumption.
    reset_known: bool,
    period_known: bool,
    /// Whether the last cycle asked for needs more requests than a whole window allows: it
    /// would never be admitted, so probes go out every `PROBE_AFTER`, reset or not.
    oversized: bool,
    /// When a deferral is turned into a probe: `PROBE_AFTER` after the last request, or the end
    /// of the window it was sent in, whichever is later.
    probe_due: Instant,
    /// The last ask that was deferred, and the asks admitted since; the stretch is reported
    /// until both a whole stretched interval and `CALM_ASKS` admitted asks have passed.
    last_deferral: Option<Instant>,
    admitted_since_deferral: u32,
    /// Current value of the stretched-interval gauge, and the last one logged.
    stretched: u64,
    logged_stretch: u64,
    /// Whether the first request (`Admission::Learn`) has gone out.
    learn_sent: bool,
    /// For cycles larger than a window: spending time not yet spent (each request costs
    /// `until_reset / usable`), and when it was last brought up to date.
    credit: Duration,
    last_ask: Option<Instant>,
    /// Each namespace's own credit, for its share of the budget (`namespace_share`).
    namespaces: HashMap<String, NamespaceCredit>,
    /// What the live cycles ask for: requests per second, measured over `LIVE_RATE_WINDOW`
    /// (`None` until a whole window has passed since the pacer started), and the current
    /// window's count.
    live_rate: Option<f64>,
    live_asked: u64,
    live_since: Option<Instant>,
    /// When the next background request may go.
    background_not_before: Instant,
}

pub fn reserve(limit: u64) -> u64 {
    (limit * RESERVE_PERCENT).div_ceil(100).max(1)
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Pacer {
    /// Before any answer: the documented default, and the worst case that its whole window is
    /// still ahead (so the first cycles are paced for a full hour, never faster).
    pub fn new(now: Instant) -> Self {
        Pacer {
            limit: DEFAULT_LIMIT,
            period: DEFAULT_PERIOD,
            remaining: DEFAULT_LIMIT,
            reset_at: now + DEFAULT_PERIOD,
            seen: false,
            server_remaining: None,
            ours_answered: 0,
            observed_at: now,
            name: None,
            blocked_until: None,
            next_cycle_not_before: None,
            last_spacing: Duration::ZERO,
            last_sent: now,
            reset_known: false,
            period_known: false,
            oversized: false,
            probe_due: now,
            last_deferral: None,
            admitted_since_deferral: 0,
            stretched: 0,
            logged_stretch: 0,
            learn_sent: false,
            credit: Duration::ZERO,
            last_ask: None,
            namespaces: HashMap::new(),
            live_rate: None,
            live_asked: 0,
            live_since: Some(now),
            background_not_before: now,
        }
    }

    /// Once the estimated window has ended, the budget is assumed whole again (the next answer
    /// corrects it if other users already spent some).
    fn roll(&mut self, now: Instant) {
        if now < self.reset_at {
            return;
        }
        let behind = now - self.reset_at;
        let period = self.period.max(Duration::from_secs(1));
        let windows = u32::try_from(behind.as_nanos() / period.as_nanos() + 1).unwrap_or(u32::MAX);
        self.reset_at = self.reset_at.checked_add(period.saturating_mul(windows)).unwrap_or(now + period);
        self.remaining = self.limit;
        self.server_remaining = None;
        self.ours_answered = 0;
        // The next window's end is extrapolated: known only if the period is.
        self.reset_known &= self.period_known;
    }

    /// What the organisation's other users are expected to spend from our last answer until the
    /// reset (their spending since that answer is not in `remaining` yet): what they spent so
    /// far in this window (the server's count minus our answered requests), at the same average
    /// rate. The elapsed time is floored at a tenth of the period so that a burst right after
    /// the reset is not extrapolated as a flood.
    fn others_until_reset(&self) -> f64 {
        let Some(server_remaining) = self.server_remaining else { return 0.0 };
        let others = self.limit.saturating_sub(server_remaining).saturating_sub(self.ours_answered);
        if others == 0 {
            return 0.0;
        }
        let ahead = self.reset_at.saturating_duration_since(self.observed_at);
        let elapsed = self.period.saturating_sub(ahead).max(self.period / 10).max(Duration::from_secs(1));
        others as f64 * ahead.as_secs_f64() / elapsed.as_secs_f64()
    }

    /// Seconds until requests may be sent again after a 429, if still blocked.
    pub fn blocked(&mut self, now: Instant) -> Option<u64> {
        match self.blocked_until {
            Some(until) if now < until => Some(ceil_secs(until - now).max(1)),
            Some(_) => {
                self.blocked_until = None;
                None
            }
            None => None,
        }
    }

    /// Decides whether a cycle needing `n` requests may start at `now`; when it may, its
    /// requests are debited at once and the next cycle is pushed back by `n` request spacings.
    /// A cycle that keeps being refused past `probe_due` is let through as a probe of one
    /// request: the budget we hold may be wrong, and only an answer can say so.
    pub fn admit(&mut self, now: Instant, n: u64) -> Admission {
        if let Some(reset_in_seconds) = self.blocked(now) {
            return Admission::RateLimited { reset_in_seconds };
        }
        self.roll(now);
        if !self.seen && !self.learn_sent && n > 1 {
            // The limit is unknown: a cycle planned from the assumed default could overrun a
            // smaller one at once. One request first; its answer says what the budget is.
            self.learn_sent = true;
            self.remaining = self.remaining.saturating_sub(1);
            self.sent(now);
            return Admission::Learn;
        }
        let elapsed = self.last_ask.map(|at| now.saturating_duration_since(at));
        self.last_ask = Some(now);
        self.count_live(now, n);
        self.oversized = n > self.limit.saturating_sub(reserve(self.limit));
        let decision = if self.oversized { self.spread(now, n, elapsed) } else { self.plan(now, n).map(|()| n) };
        match decision {
            Ok(requests) if requests >= n => {
                self.sent(now);
                self.note(now, None);
                Admission::Go
            }
            Ok(requests) => {
                self.sent(now);
                let stretched_interval_seconds = ceil_secs(self.last_spacing).max(1);
                self.note(now, Some(stretched_interval_seconds));
                Admission::Part { requests, stretched_interval_seconds }
            }
            Err(stretched_interval_seconds) if now >= self.probe_due => {
                self.remaining = self.remaining.saturating_sub(1);
                self.sent(now);
                // The next ask is planned from what the probe's answer says.
                self.next_cycle_not_before = None;
                self.note(now, Some(stretched_interval_seconds));
                Admission::Probe { stretched_interval_seconds }
            }
            Err(stretched_interval_seconds) => {
                self.note(now, Some(stretched_interval_seconds));
                Admission::Deferred { stretched_interval_seconds }
            }
        }
    }

    /// A request left at `now`: the next probe is due `PROBE_AFTER` later, or when the window
    /// ends if the server told us when, whichever is later (a cycle waiting for a known reset is
    /// admitted then, no probe needed; an assumed one is no reason to wait).
    fn sent(&mut self, now: Instant) {
        self.last_sent = now;
        self.reschedule_probe();
    }

    fn reschedule_probe(&mut self) {
        let after = self.last_sent + PROBE_AFTER;
        self.probe_due = if self.reset_known && !self.oversized { after.max(self.reset_at) } else { after };
    }

    /// How long one request may take of what is left of the window (`until_reset / usable`),
    /// and what is left beyond the reserve.
    fn request_cost(&self, now: Instant) -> (Duration, u64) {
        let (usable, until_reset, spendable) = self.usable(now);
        (until_reset.div_f64(usable), spendable)
    }

    /// The requests usable until the reset (what is left beyond the reserve and the other
    /// users' expected share, at least 1), the time until the reset, and what is left beyond
    /// the reserve.
    fn usable(&self, now: Instant) -> (f64, Duration, u64) {
        let spendable = self.remaining.saturating_sub(reserve(self.limit));
        let until_reset = self.reset_at.saturating_duration_since(now).max(Duration::from_secs(1));
        // Leave the other users what they are expected to spend. Early in a window that is a
        // guess from little data (a burst right after the reset looks like a flood), and a wrong
        // guess must not blind us for the hour: they are left at most half of what is left at
        // the start of the window, growing to all of it at the end, when the guess is good.
        let spendable_f = spendable as f64;
        let period = self.period.as_secs_f64().max(1.0);
        let elapsed_share = (1.0 - until_reset.as_secs_f64() / period).clamp(0.0, 1.0);
        let usable = spendable_f - self.others_until_reset().min(spendable_f * (0.5 + 0.5 * elapsed_share));
        (usable.max(1.0), until_reset, spendable)
    }

    /// A cycle larger than a whole window: it can never go at once, so each ask sends what the
    /// budget has accrued since the previous ask (one request per `request_cost`, never more
    /// than is left beyond the reserve). What an ask could not use carries over to the next,
    /// up to one request, so the rate holds whatever the spacing of the asks; a long silence
    /// is not saved up into a burst. The first ask gets a quarter of a window's worth.
    /// Ok(requests to send now, at least 1), or Err(the stretched interval) when none may go.
    fn spread(&mut self, now: Instant, n: u64, elapsed: Option<Duration>) -> Result<u64, u64> {
        // Whole cycles no longer go, so their spacing no longer applies.
        self.next_cycle_not_before = None;
        let (cost, spendable) = self.request_cost(now);
        self.credit = match elapsed {
            Some(elapsed) => elapsed.saturating_add(self.credit.min(cost)),
            None => self.period / 4,
        }
        .min(self.period);
        let affordable = (self.credit.as_secs_f64() / cost.as_secs_f64().max(1e-9)).floor() as u64;
        let requests = affordable.min(spendable).min(n);
        // The interval each query gets: n requests at the window's whole rate, or at the rate
        // left now when that is slower (others spent part of it). Not the cost alone, which
        // is short on a window's boundary, where nothing is spendable anyway.
        let window_rate = self.period.div_f64(self.limit.saturating_sub(reserve(self.limit)).max(1) as f64);
        self.last_spacing = cost.max(window_rate).saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        if requests == 0 {
            return Err(ceil_secs(self.last_spacing).max(1));
        }
        self.credit = self.credit.saturating_sub(cost.saturating_mul(u32::try_from(requests).unwrap_or(u32::MAX)));
        self.remaining -= requests;
        Ok(requests)
    }

    /// Whether a cycle of `n` requests fits now (debiting it when it does), else the spacing it
    /// would need, in whole seconds.
    fn plan(&mut self, now: Instant, n: u64) -> Result<(), u64> {
        if let Some(not_before) = self.next_cycle_not_before {
            if now < not_before {
                return Err(ceil_secs(self.last_spacing).max(1));
            }
        }
        let (cost, spendable) = self.request_cost(now);
        let until_reset = self.reset_at.saturating_duration_since(now).max(Duration::from_secs(1));
        if n > spendable {
            // Not enough left in this window: the next cycle runs when it ends.
            self.next_cycle_not_before = Some(self.reset_at);
            self.last_spacing = until_reset;
            return Err(ceil_secs(until_reset).max(1));
        }
        // Spread what is usable evenly over what is left of the window: each request "costs"
        // reset / usable seconds. The rate usable / reset then stays constant while spending
        // goes as planned, so the window's budget lasts exactly until its reset.
        let spacing = cost.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        if spacing > until_reset {
            // The cycle would eat into the others' expected share: skip this ask only, the
            // projection is revised at the next one.
            return Err(ceil_secs(spacing).max(1));
        }
        self.next_cycle_not_before = Some(now + spacing);
        self.last_spacing = spacing;
        self.remaining -= n;
        Ok(())
    }

    /// Counts what the live cycles ask for (admitted or not: it is what they need), and turns
    /// each whole `LIVE_RATE_WINDOW` into a rate. A higher rate is taken at once, a lower one
    /// halfway, so a quiet minute does not open the budget to background reads.
    fn count_live(&mut self, now: Instant, n: u64) {
        let since = *self.live_since.get_or_insert(now);
        self.live_asked = self.live_asked.saturating_add(n);
        let elapsed = now.saturating_duration_since(since);
        if elapsed >= LIVE_RATE_WINDOW {
            let measured = self.live_asked as f64 / elapsed.as_secs_f64();
            self.live_rate = Some(match self.live_rate {
                Some(old) if old > measured => (old + measured) / 2.0,
                _ => measured,
            });
            self.live_asked = 0;
            self.live_since = Some(now);
        }
    }

    /// May one background request (a forecast's history, which nothing waits for) go now?
    /// Only from what the live cycles will not need: the usable budget left in the window
    /// (beyond the reserve and the other users' expected share), minus the live rate until the
    /// reset, of which a background request takes half at a time, spread evenly over what is
    /// left of the window, so the live cycles keep room to grow. Nothing goes before the live
    /// rate is known (a whole `LIVE_RATE_WINDOW` after the start), while the live cycles are
    /// stretched, or after a 429.
    /// Ok: debited, send it; Err: ask again after that long.
    pub fn admit_background(&mut self, now: Instant) -> Result<(), Duration> {
        if let Some(seconds) = self.blocked(now) {
            return Err(Duration::from_secs(seconds));
        }
        self.roll(now);
        if self.live_rate.is_none() {
            // A first window without a single live ask: there is no live traffic to leave room
            // for (a backtest, or a daemon whose queries all go elsewhere).
            self.count_live(now, 0);
        }
        let Some(live_rate) = self.live_rate else { return Err(BACKGROUND_RETRY) };
        if self.oversized || self.stretched > 0 {
            return Err(BACKGROUND_RETRY);
        }
        if now < self.background_not_before {
            return Err(self.background_not_before - now);
        }
        let (usable, until_reset, _) = self.usable(now);
        let spare = (usable - live_rate * until_reset.as_secs_f64()) / 2.0;
        if spare < 1.0 {
            return Err(until_reset.min(BACKGROUND_RETRY));
        }
        self.remaining = self.remaining.saturating_sub(1);
        self.background_not_before = now + until_reset.div_f64(spare);
        Ok(())
    }

    /// Requests beyond an admitted cycle (retries, a batch split to find a bad query) come out
    /// of the reserve, as long as half of it stays untouched; false: do without them.
    pub fn take_extra(&mut self, now: Instant, n: u64) -> bool {
        self.roll(now);
        if self.remaining >= n + reserve(self.limit) / 2 {
            self.remaining -= n;
            true
        } else {
            false
        }
    }

    /// Updates the stretched-interval gauge value after an ask. A deferral sets it; it goes
    /// back to 0 only once a whole stretched interval and `CALM_ASKS` asks have passed with
    /// every ask admitted, so that the alternation of admitted and deferred asks of a
    /// stretched schedule (or the admissions right after a window's reset) does not read as
    /// "fits again".
    fn note(&mut self, now: Instant, deferred: Option<u64>) {
        match deferred {
            Some(seconds) => {
                self.stretched = seconds;
                self.last_deferral = Some(now);
                self.admitted_since_deferral = 0;
            }
            None => {
                self.admitted_since_deferral = self.admitted_since_deferral.saturating_add(1);
                let calm = self.last_deferral.is_none_or(|at| {
                    now.saturating_duration_since(at) >= Duration::from_secs(self.stretched)
                        && self.admitted_since_deferral >= CALM_ASKS
                });
                if calm {
                    self.stretched = 0;
                    self.last_deferral = None;
                }
            }
        }
    }

    /// The gauge value, and whether it changed enough since the last log line to log again:
    /// to or from zero, or by 10 % or more.
    pub fn stretch_to_log(&mut self) -> (u64, Option<u64>) {
        let (old, new) = (self.logged_stretch, self.stretched);
        let significant = (old == 0) != (new == 0) || new.abs_diff(old) * 10 >= old.max(1);
        if new != old && significant {
            self.logged_stretch = new;
            (new, Some(new))
        } else {
            (new, None)
        }
    }

    /// Takes in the headers of any answer (ok or not). `counted`: the server counted the
    /// request against the budget (every answer but a 429).
    /// Numbers that cannot be right are ignored, never trusted: a limit of 0 (nothing could
    /// ever be sent again), a period or reset beyond `MAX_WINDOW` or a reset beyond the period.
    pub fn observe(&mut self, now: Instant, headers: &RateLimitHeaders, counted: bool) {
        if let Some(limit) = headers.limit.filter(|l| *l > 0) {
            self.limit = limit;
        }
        if let Some(period) = headers.sane_period() {
            self.period = period;
            self.period_known = true;
        }
        if headers.name.is_some() {
            self.name.clone_from(&headers.name);
        }
        let (Some(remaining), Some(reset)) = (headers.remaining, headers.sane_reset()) else {
            self.reset_known = false;
            self.reschedule_probe();
            return;
        };
        if !self.seen {
            // The spacing after the first cycle was set from the assumed default budget; the
            // next ask is paced from what the server just said instead (a large organisation
            // budget would otherwise stall the first minute or more).
            self.next_cycle_not_before = None;
        }
        let reset_at = now + reset + RESET_MARGIN;
        let same_window = self.seen
            && now < self.reset_at
            && reset_at.max(self.reset_at) - reset_at.min(self.reset_at) <= SAME_WINDOW;
        if same_window {
            // Concurrent answers arrive in any order, and our own debits are ahead of the
            // server's count: the lowest figure is the truest.
            self.remaining = self.remaining.min(remaining);
            self.reset_at = self.reset_at.max(reset_at);
            if self.server_remaining.is_none_or(|r| remaining < r) {
                self.server_remaining = Some(remaining);
                self.observed_at = now;
            }
            self.ours_answered += u64::from(counted);
        } else if self.seen && reset_at + SAME_WINDOW < self.reset_at && now < self.reset_at {
            // A late answer from a window we already left behind: nothing to learn.
            return;
        } else {
            self.remaining = remaining;
            self.reset_at = reset_at;
            self.server_remaining = Some(remaining);
            self.observed_at = now;
            self.ours_answered = u64::from(counted);
        }
        self.seen = true;
        // The answer tells which window our last request fell in: a cycle waiting for its end
        // is admitted then, so no probe is due before it (nor, were it sooner, later).
        self.reset_known = true;
        self.reschedule_probe();
    }

    /// After a 429: block every request for `wait` (at most `MAX_WINDOW`), and treat the
    /// window as spent.
    pub fn rate_limited(&mut self, now: Instant, wait: Duration) {
        let wait = wait.min(MAX_WINDOW);
        let until = self.blocked_until.map_or(now + wait, |b| b.max(now + wait));
        self.blocked_until = Some(until);
        self.probe_due = self.probe_due.max(until);
        // The 429's reset is when the server's window ends: a whole budget is expected then.
        self.remaining = 0;
        self.reset_at = until;
        self.seen = true;
    }

    pub fn snapshot(&mut self, now: Instant) -> Option<RateLimitSnapshot> {
        if !self.seen {
            return None;
        }
        let blocked_for_seconds = self.blocked(now);
        self.roll(now);
        Some(RateLimitSnapshot {
            limit: self.limit,
            period_seconds: self.period.as_secs(),
            remaining: self.remaining,
            reset_seconds: ceil_secs(self.reset_at.saturating_duration_since(now)),
            name: self.name.clone(),
            blocked_for_seconds,
            stretched_interval_seconds: self.stretched,
        })
    }
}

#[cfg(test)]
mod tests {
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
        assert!(matches!(
            p.admit(t0 + Duration::from_secs(60), 29),
            Admission::Probe { stretched_interval_seconds: 69 }
        ));
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
}
