//! What the `X-RateLimit-*` headers of one answer say: read leniently (any case, `3600.0`),
//! and believed only within bounds, since a broken header must not stop the client for good.
//! The pacer takes them in; a 429 waits by them.

use std::time::Duration;

use reqwest::header::HeaderMap;

use super::MAX_WINDOW;

/// Counts above this are not believed, as windows beyond `MAX_WINDOW` are not (and could
/// overflow the arithmetic).
const MAX_COUNT: u64 = 1_000_000_000_000_000;

/// The `X-RateLimit-*` headers of one answer (each may be missing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitHeaders {
    pub limit: Option<u64>,
    /// Seconds; windows are calendar aligned.
    pub period: Option<u64>,
    pub remaining: Option<u64>,
    /// Seconds until the window ends.
    pub reset: Option<u64>,
    pub name: Option<String>,
}

impl RateLimitHeaders {
    /// From header names and values; names are matched without regard to case.
    pub(crate) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut headers = RateLimitHeaders::default();
        for (name, value) in pairs {
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "x-ratelimit-limit" => headers.limit = number(value),
                "x-ratelimit-period" => headers.period = number(value),
                "x-ratelimit-remaining" => headers.remaining = number(value),
                "x-ratelimit-reset" => headers.reset = number(value),
                "x-ratelimit-name" if !value.is_empty() => headers.name = Some(value.to_string()),
                _ => {}
            }
        }
        headers
    }

    pub fn from_header_map(map: &HeaderMap) -> Self {
        Self::from_pairs(map.iter().filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?))))
    }

    pub fn is_empty(&self) -> bool {
        *self == RateLimitHeaders::default()
    }
}

/// Whole numbers, also when written as `3600.0`; anything else (negative, garbage, beyond
/// `MAX_COUNT`) is absent.
fn number(text: &str) -> Option<u64> {
    let parsed = text.parse::<u64>().ok().or_else(|| {
        let f: f64 = text.parse().ok()?;
        (0.0..1.0e15).contains(&f).then(|| f.round() as u64)
    });
    parsed.filter(|n| *n <= MAX_COUNT)
}

/// Used for the 429 wait when the answer gives no believable reset.
pub const FALLBACK_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

impl RateLimitHeaders {
    /// How long to send nothing after a 429 with these headers: its reset when believable and
    /// not 0 (a 429 whose window "ends now" would be asked again at once, every cycle), else
    /// its period if shorter than `FALLBACK_RATE_LIMIT_WAIT`, else that fallback. Never more
    /// than `MAX_WINDOW`, so that one broken header cannot stop the client for good.
    pub fn wait_after_429(&self) -> Duration {
        self.sane_reset()
            .filter(|r| !r.is_zero())
            .unwrap_or_else(|| self.sane_period().map_or(FALLBACK_RATE_LIMIT_WAIT, |p| p.min(FALLBACK_RATE_LIMIT_WAIT)))
    }

    /// The window length when it is believable: 1 s to `MAX_WINDOW`.
    pub fn sane_period(&self) -> Option<Duration> {
        self.period.filter(|p| (1..=MAX_WINDOW.as_secs()).contains(p)).map(Duration::from_secs)
    }

    /// Seconds until the window ends, when believable: never beyond the period (or
    /// `MAX_WINDOW` when the period is unknown or absurd). A reset beyond that is a broken
    /// header, not a long wait.
    pub fn sane_reset(&self) -> Option<Duration> {
        let bound = self.sane_period().unwrap_or(MAX_WINDOW);
        self.reset.map(Duration::from_secs).filter(|r| *r <= bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_case_insensitively_and_leniently() {
        let h = RateLimitHeaders::from_pairs([
            ("X-RateLimit-Limit", "1600"),
            ("x-ratelimit-period", "3600.0"),
            ("X-RATELIMIT-REMAINING", " 1597 "),
            ("x-ratelimit-reset", "garbage"),
            ("x-ratelimit-name", "query"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(
            h,
            RateLimitHeaders {
                limit: Some(1600),
                period: Some(3600),
                remaining: Some(1597),
                reset: None,
                name: Some("query".into())
            }
        );
        assert!(RateLimitHeaders::from_pairs([("content-type", "x")]).is_empty());
    }

    #[test]
    fn absurd_numbers_are_not_believed() {
        let h = RateLimitHeaders::from_pairs([
            ("x-ratelimit-limit", "18446744073709551615"),
            ("x-ratelimit-remaining", "-3"),
            ("x-ratelimit-reset", "1e300"),
            ("x-ratelimit-period", "1e16"),
        ]);
        assert_eq!(h, RateLimitHeaders::default(), "beyond MAX_COUNT, negative or absurd: absent");
        let h = RateLimitHeaders { reset: Some(7_200), period: Some(3_600), ..RateLimitHeaders::default() };
        assert_eq!(h.sane_reset(), None, "a reset beyond the period");
        assert_eq!(h.wait_after_429(), FALLBACK_RATE_LIMIT_WAIT);
        let h = RateLimitHeaders { reset: Some(0), period: Some(10), ..RateLimitHeaders::default() };
        assert_eq!(h.wait_after_429(), Duration::from_secs(10), "a 429 that resets 'now' waits its short period");
        let h = RateLimitHeaders { reset: Some(42), ..RateLimitHeaders::default() };
        assert_eq!(h.wait_after_429(), Duration::from_secs(42));
    }
}
