//! Each namespace's share of the budget: a credit of its own that accrues at its share of the
//! rate the pacer allows, so that the queries of one namespace cannot spend everyone's budget.

use std::time::Duration;

use tokio::time::Instant;

use super::{Pacer, MAX_WINDOW};

/// A namespace's spending time not yet spent, at its share of the budget's rate.
#[derive(Debug)]
pub(super) struct NamespaceCredit {
    credit: Duration,
    last_ask: Instant,
    /// What one request cost it at its last ask.
    request_cost: Duration,
}

/// What a namespace may send now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NamespaceShare {
    /// Requests it may fill now (fractional: its queries share requests with others').
    pub requests: f64,
    /// How long one request takes of its share: the budget's request cost / its share.
    pub request_cost: Duration,
}

impl Pacer {
    /// What `namespace` may send now when each namespace may use at most `percent` of the
    /// budget: its credit accrues at that share of the rate the budget allows (one request per
    /// `request_cost / share`), from a quarter of a window's worth at its first ask, and
    /// carries over between asks up to that quarter window or one ask's worth, whichever is
    /// more. `charge_namespace` takes off what it used.
    pub fn namespace_share(&mut self, now: Instant, namespace: &str, percent: u32) -> NamespaceShare {
        self.roll(now);
        let (cost, _) = self.request_cost(now);
        let request_cost = cost.mul_f64(100.0 / f64::from(percent.clamp(1, 100)));
        let start = self.period / 4;
        let entry = self.namespaces.entry(namespace.to_string()).or_insert(NamespaceCredit {
            credit: start,
            last_ask: now,
            request_cost,
        });
        let elapsed = now.saturating_duration_since(entry.last_ask);
        let cap = start.max(elapsed.saturating_add(request_cost)).min(self.period.max(request_cost));
        entry.credit = entry.credit.saturating_add(elapsed).min(cap);
        entry.last_ask = now;
        entry.request_cost = request_cost;
        NamespaceShare { requests: entry.credit.as_secs_f64() / request_cost.as_secs_f64().max(1e-9), request_cost }
    }

    /// `namespace` used `requests` (fractional) of its share.
    pub fn charge_namespace(&mut self, namespace: &str, requests: f64) {
        if let Some(entry) = self.namespaces.get_mut(namespace) {
            entry.credit = entry.credit.saturating_sub(entry.request_cost.mul_f64(requests.max(0.0)));
        }
    }

    /// Namespaces that asked nothing for the longest window are forgotten.
    pub fn forget_namespaces(&mut self, now: Instant) {
        self.namespaces.retain(|_, entry| now.saturating_duration_since(entry.last_ask) < MAX_WINDOW);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers_with_period;
    use super::*;

    #[test]
    fn a_namespace_gets_its_share_of_the_rate() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = Pacer::new(t0);
        p.observe(t0, &headers_with_period(27, 27, 60, 60), true);
        // 25 usable over 61 s: 2.44 s a request; at 50 %, 4.88 s a request of its own, and a
        // quarter window's credit (15 s) at first: 3 requests.
        let share = p.namespace_share(at(0), "team-a", 50);
        assert!((share.requests - 15.0 / 4.88).abs() < 0.05, "{share:?}");
        p.charge_namespace("team-a", share.requests);
        // 15 s later: 15 s more of credit at its rate (a request costs what is left of the
        // window over what is left of the budget, shorter now that nothing was spent).
        let share = p.namespace_share(at(15), "team-a", 50);
        assert!((share.requests - 15.0 / share.request_cost.as_secs_f64()).abs() < 0.05, "{share:?}");
        let (cost, _) = p.request_cost(at(15));
        assert!((share.request_cost.as_secs_f64() - 2.0 * cost.as_secs_f64()).abs() < 0.01);
        // Another namespace has its own credit.
        let other = p.namespace_share(at(15), "team-b", 50);
        assert!((other.requests - 15.0 / other.request_cost.as_secs_f64()).abs() < 0.05, "{other:?}");
        // A long silence is not saved up beyond a window's worth of its share.
        let share = p.namespace_share(at(600), "team-a", 50);
        assert!(share.requests <= 61.0 / share.request_cost.as_secs_f64(), "{share:?}");
        p.forget_namespaces(at(600 + 3_600));
        assert!(p.namespaces.is_empty());
    }
}
