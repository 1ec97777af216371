//! Prometheus metrics of the daemon itself, and the listener's `/metrics` that serves them
//! (`routes`). Series keep the Datadog controller's names where one exists, so dashboards carry
//! over; the rest are prefixed `watermarkd_`.

mod autoscaler;
mod daemon;
mod http_client;
pub mod logging;
mod scrape;

pub use autoscaler::{AutoscalerMetrics, LabelsAsTags, SeriesLabels};
pub use daemon::DaemonMetrics;
pub use http_client::HttpClientMetrics;
pub use scrape::routes;

use std::sync::Arc;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::domain::status::backends::{BackendFacts, RateLimitSeen};

/// What the metric backends report about themselves: their series, and the same facts typed
/// for the status API (`facts`). A request's outcome, the rate-limit headers and the stretched
/// interval are written through `request_ended`, `rate_limit_seen` and `stretched_interval`,
/// which keep both in step; their series are read (by tests, say), never written, directly.
pub struct BackendMetrics {
    /// Requests by backend and outcome (`ok`, `bad_query`, `forbidden`, `no_data`, `rate_limited`,
    /// `server_error`, `timeout`, `transport`, `protocol`).
    pub requests: IntCounterVec,
    /// Request latency by backend, in seconds.
    pub request_seconds: HistogramVec,
    /// Datadog rate-limit headers, as last seen: `limit`, `remaining`, `reset_seconds`.
    pub rate_limit: IntGaugeVec,
    /// The shortest interval between cycles that the remaining Datadog budget allows, in seconds
    /// (0 when the configured intervals fit).
    pub stretched_interval_seconds: IntGaugeVec,
    /// Queries skipped because the budget could not cover the cycle.
    pub deferred_queries: IntCounterVec,
    /// Warnings attached to Prometheus answers.
    pub warnings: IntCounterVec,
    /// Queries a backend rejected that are not asked again for a while (Datadog's
    /// `bad_query_retry`).
    pub suppressed_queries: IntGaugeVec,
    /// The last cycle's query plan: requests it sent (`crate::adapters::backend::plan`).
    pub plan_requests: IntGaugeVec,
    /// The last cycle's queries by `folded` (`true`: answered by a group of a grouped query;
    /// `false`: sent as they are).
    pub plan_queries: IntGaugeVec,
    /// Queries answered per request, each request of each cycle's plan.
    pub plan_members_per_request: HistogramVec,
    /// Requests by outcome, rate-limit headers and stretched interval, typed, for the status API.
    facts: Arc<BackendFacts>,
}

/// A cycle's query plan counted, for the `watermarkd_query_plan_*` series: what a backend
/// counts while it compiles its requests, without building the plan's texts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanCounts {
    /// For each request, the autoscaler queries it answers.
    pub members_per_request: Vec<usize>,
    /// Autoscaler queries answered through a folded (grouped) text.
    pub folded: usize,
    /// Autoscaler queries answered by a text of their own.
    pub unfolded: usize,
}

impl PlanCounts {
    /// Counts a part of a request: `members` autoscaler queries, through a folded text or not.
    pub fn add(&mut self, members: usize, folded: bool) {
        if folded {
            self.folded += members;
        } else {
            self.unfolded += members;
        }
    }
}

impl BackendMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let requests = IntCounterVec::new(
            Opts::new("watermarkd_backend_requests_total", "HTTP requests to metric backends by outcome"),
            &["backend", "outcome"],
        )?;
        let request_seconds = HistogramVec::new(
            HistogramOpts::new("watermarkd_backend_request_duration_seconds", "Latency of metric backend requests")
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &["backend"],
        )?;
        let rate_limit = IntGaugeVec::new(
            Opts::new("watermarkd_datadog_rate_limit", "Datadog X-RateLimit-* headers as last seen"),
            &["backend", "field"],
        )?;
        let stretched_interval_seconds = IntGaugeVec::new(
            Opts::new(
                "watermarkd_datadog_stretched_interval_seconds",
                "Shortest cycle spacing the remaining Datadog budget allows (0: intervals fit)",
            ),
            &["backend"],
        )?;
        let deferred_queries = IntCounterVec::new(
            Opts::new("watermarkd_datadog_deferred_queries_total", "Queries skipped to stay within the rate limit"),
            &["backend"],
        )?;
        let warnings = IntCounterVec::new(
            Opts::new(
                "watermarkd_prometheus_warnings_total",
                "Warnings and infos attached to Prometheus answers (a warning other than a PromQL annotation: partial)",
            ),
            &["backend"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_seconds.clone()))?;
        registry.register(Box::new(rate_limit.clone()))?;
        registry.register(Box::new(stretched_interval_seconds.clone()))?;
        registry.register(Box::new(deferred_queries.clone()))?;
        let suppressed_queries = IntGaugeVec::new(
            Opts::new(
                "watermarkd_backend_suppressed_queries",
                "Queries the backend rejected (HTTP 400) that are not asked again until their retry time",
            ),
            &["backend"],
        )?;
        registry.register(Box::new(warnings.clone()))?;
        registry.register(Box::new(suppressed_queries.clone()))?;
        let plan_requests = IntGaugeVec::new(
            Opts::new("watermarkd_query_plan_requests", "Requests in the last cycle's query plan"),
            &["backend"],
        )?;
        let plan_queries = IntGaugeVec::new(
            Opts::new(
                "watermarkd_query_plan_queries",
                "Autoscaler queries of the last cycle's plan, folded into grouped queries or sent as they are",
            ),
            &["backend", "folded"],
        )?;
        let plan_members_per_request = HistogramVec::new(
            HistogramOpts::new(
                "watermarkd_query_plan_queries_per_request",
                "Autoscaler queries answered by one request of a cycle's plan",
            )
            .buckets(vec![1.0, 2.0, 5.0, 10.0, 35.0, 100.0, 250.0, 500.0, 1000.0, 2500.0]),
            &["backend"],
        )?;
        registry.register(Box::new(plan_requests.clone()))?;
        registry.register(Box::new(plan_queries.clone()))?;
        registry.register(Box::new(plan_members_per_request.clone()))?;
        Ok(BackendMetrics {
            requests,
            request_seconds,
            rate_limit,
            stretched_interval_seconds,
            deferred_queries,
            warnings,
            suppressed_queries,
            plan_requests,
            plan_queries,
            plan_members_per_request,
            facts: Arc::new(BackendFacts::new()),
        })
    }

    /// The facts the status API shows, as the backends write them here.
    pub fn facts(&self) -> Arc<BackendFacts> {
        Arc::clone(&self.facts)
    }

    /// One request to `backend` ended as `outcome`.
    pub fn request_ended(&self, backend: &str, outcome: &'static str) {
        self.requests.with_label_values(&[backend, outcome]).inc();
        self.facts.request(backend, outcome);
    }

    /// Datadog's rate-limit headers on an answer of `backend`: each one present is kept.
    pub fn rate_limit_seen(&self, backend: &str, seen: RateLimitSeen) {
        let fields = [("limit", seen.limit), ("remaining", seen.remaining), ("reset_seconds", seen.reset_seconds)];
        for (field, value) in fields {
            if let Some(value) = value {
                self.rate_limit.with_label_values(&[backend, field]).set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        self.facts.rate_limit(backend, seen);
    }

    /// The cycle spacing `backend`'s budget imposes now, in seconds (0: none).
    pub fn stretched_interval(&self, backend: &str, seconds: u64) {
        self.stretched_interval_seconds.with_label_values(&[backend]).set(i64::try_from(seconds).unwrap_or(i64::MAX));
        self.facts.stretched_interval(backend, seconds);
    }

    /// Exports a cycle's plan for `backend`.
    pub fn observe_plan(&self, backend: &str, plan: &PlanCounts) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.plan_requests.with_label_values(&[backend]).set(count(plan.members_per_request.len()));
        self.plan_queries.with_label_values(&[backend, "true"]).set(count(plan.folded));
        self.plan_queries.with_label_values(&[backend, "false"]).set(count(plan.unfolded));
        let histogram = self.plan_members_per_request.with_label_values(&[backend]);
        for members in &plan.members_per_request {
            histogram.observe(*members as f64);
        }
    }

    /// Metrics on a private registry, for tests and one-shot commands.
    pub fn detached() -> Self {
        #[expect(clippy::expect_used, reason = "fresh collectors on a fresh registry cannot collide")]
        Self::new(&Registry::new()).expect("fresh registry accepts every collector")
    }
}
