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
mod tests;
