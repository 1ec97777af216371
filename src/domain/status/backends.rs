//! What each metric backend has said about itself since the start, for the status API: its
//! requests by outcome, Datadog's rate-limit headers as last seen, and the cycle spacing its
//! budget imposes. Written where the backend's series are written (`telemetry::BackendMetrics`
//! writes both), read by the status service, so that the status API is handed these facts
//! typed instead of reading them back out of the series by label name. A synchronous store: a
//! write is a map lookup under a lock, and a read copies a few numbers per backend.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// Datadog's `X-RateLimit-*` headers, each as last seen (`None`: never seen).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitSeen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_seconds: Option<u64>,
}

impl RateLimitSeen {
    pub fn is_empty(&self) -> bool {
        *self == RateLimitSeen::default()
    }
}

/// What one backend has said about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// Requests since the start, by outcome (`ok`, `timeout`, `rate_limited`, ...).
    pub requests: BTreeMap<&'static str, u64>,
    pub rate_limit: RateLimitSeen,
    /// The cycle spacing the budget imposes, once it was worked out (0: every cycle runs).
    pub stretched_interval_seconds: Option<u64>,
}

/// Every backend's facts, by backend name.
#[derive(Debug, Default)]
pub struct BackendFacts {
    backends: Mutex<BTreeMap<String, Facts>>,
}

impl BackendFacts {
    pub fn new() -> BackendFacts {
        BackendFacts::default()
    }

    fn with(&self, backend: &str, change: impl FnOnce(&mut Facts)) {
        let mut backends = self.backends.lock().unwrap_or_else(PoisonError::into_inner);
        // The name is copied once per backend, not per request.
        match backends.get_mut(backend) {
            Some(facts) => change(facts),
            None => change(backends.entry(backend.to_string()).or_default()),
        }
    }

    /// One request to `backend` ended as `outcome`.
    pub fn request(&self, backend: &str, outcome: &'static str) {
        self.with(backend, |facts| *facts.requests.entry(outcome).or_default() += 1);
    }

    /// Rate-limit headers seen on an answer of `backend`: the ones present replace what was
    /// seen before; a header absent this time keeps its last value.
    pub fn rate_limit(&self, backend: &str, seen: RateLimitSeen) {
        if seen.is_empty() {
            return;
        }
        self.with(backend, |facts| {
            let last = &mut facts.rate_limit;
            last.limit = seen.limit.or(last.limit);
            last.remaining = seen.remaining.or(last.remaining);
            last.reset_seconds = seen.reset_seconds.or(last.reset_seconds);
        });
    }

    /// The cycle spacing `backend`'s budget imposes now (0: none).
    pub fn stretched_interval(&self, backend: &str, seconds: u64) {
        self.with(backend, |facts| facts.stretched_interval_seconds = Some(seconds));
    }

    /// Every backend's facts now, by name.
    pub fn snapshot(&self) -> BTreeMap<String, Facts> {
        self.backends.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_count_by_outcome_and_headers_keep_their_last_value() {
        let facts = BackendFacts::new();
        facts.request("dd", "ok");
        facts.request("dd", "ok");
        facts.request("dd", "rate_limited");
        facts.request("prom", "timeout");
        facts.rate_limit("dd", RateLimitSeen { limit: Some(1600), remaining: Some(40), reset_seconds: Some(12) });
        facts.rate_limit("dd", RateLimitSeen { remaining: Some(39), ..RateLimitSeen::default() });
        facts.stretched_interval("dd", 30);
        facts.stretched_interval("dd", 0);
        let now = facts.snapshot();
        let dd = &now["dd"];
        assert_eq!(dd.requests, BTreeMap::from([("ok", 2), ("rate_limited", 1)]));
        assert_eq!(dd.rate_limit, RateLimitSeen { limit: Some(1600), remaining: Some(39), reset_seconds: Some(12) });
        assert_eq!(dd.stretched_interval_seconds, Some(0), "0 is a fact too: the intervals fit again");
        let prom = &now["prom"];
        assert_eq!(prom.requests, BTreeMap::from([("timeout", 1)]));
        assert!(prom.rate_limit.is_empty() && prom.stretched_interval_seconds.is_none(), "{prom:?}");
    }
}
