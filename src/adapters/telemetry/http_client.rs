//! The Datadog controller's series about its recommender HTTP client, kept under the same names,
//! types, labels and buckets so that dashboards and monitors built on them carry over. Like
//! the client instrumentation it uses (Prometheus' Go `promhttp` round-tripper wrappers), a
//! request counts when its response headers arrive: the duration up to then, and the count by
//! lower-case method and status code; a request that ends without a response (refused, TLS
//! failure, timeout) counts as an error instead. `client` is the recommender's URL, without any
//! credentials or query string (see `Recommender::display_url`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The buckets of `http_client_request_duration_seconds`, as the Datadog controller declares them.
pub const REQUEST_DURATION_BUCKETS: [f64; 8] = [0.1, 0.3, 0.6, 1.0, 3.0, 6.0, 9.0, 20.0];

#[derive(Clone)]
pub struct HttpClientMetrics {
    /// `http_client_request_duration_seconds{client,method,code}`: time to the response headers.
    pub request_duration: HistogramVec,
    /// `http_client_requests_total{client,method,code}`: requests that got a response.
    pub requests: IntCounterVec,
    /// `http_client_requests_errors_total{client}`: requests that got no response.
    pub errors: IntCounterVec,
    /// `http_client_requests_inflight{client}`: requests waiting for their response.
    pub inflight: IntGaugeVec,
    /// Every `client` with series, and the `method`, `code` pairs it has them for: what to
    /// remove when the client goes.
    series: Arc<Mutex<SeriesByClient>>,
}

/// Per `client`, its `(method, code)` pairs.
type SeriesByClient = BTreeMap<String, BTreeSet<(String, String)>>;

impl HttpClientMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = HttpClientMetrics {
            request_duration: HistogramVec::new(
                HistogramOpts::new("http_client_request_duration_seconds", "Tracks the latencies for HTTP requests.")
                    .buckets(REQUEST_DURATION_BUCKETS.to_vec()),
                &["client", "method", "code"],
            )?,
            requests: IntCounterVec::new(
                Opts::new("http_client_requests_total", "Tracks the number of HTTP requests."),
                &["client", "method", "code"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "http_client_requests_errors_total",
                    "Tracks the number of HTTP requests that resulted in an error.",
                ),
                &["client"],
            )?,
            inflight: IntGaugeVec::new(
                Opts::new(
                    "http_client_requests_inflight",
                    "Tracks the number of client requests currently in progress.",
                ),
                &["client"],
            )?,
            series: Arc::default(),
        };
        registry.register(Box::new(metrics.request_duration.clone()))?;
        registry.register(Box::new(metrics.requests.clone()))?;
        registry.register(Box::new(metrics.errors.clone()))?;
        registry.register(Box::new(metrics.inflight.clone()))?;
        Ok(metrics)
    }

    /// Metrics on a private registry, for tests and one-shot commands.
    pub fn detached() -> Self {
        #[expect(clippy::expect_used, reason = "fresh collectors on a fresh registry cannot collide")]
        Self::new(&Registry::new()).expect("fresh registry accepts every collector")
    }

    /// Marks one request of `client` as in flight until the returned guard is dropped, so that a
    /// request abandoned at its deadline (its future dropped) leaves the gauge too.
    pub fn in_flight(&self, client: &str) -> InFlight {
        self.seen(client, None);
        let gauge = self.inflight.with_label_values(&[client]);
        gauge.inc();
        InFlight { gauge }
    }

    /// A response arrived `seconds` after the request was sent.
    pub fn response(&self, client: &str, method: &str, code: u16, seconds: f64) {
        let method = method.to_ascii_lowercase();
        let code = code.to_string();
        self.seen(client, Some((&method, &code)));
        self.request_duration.with_label_values(&[client, &method, &code]).observe(seconds);
        self.requests.with_label_values(&[client, &method, &code]).inc();
    }

    /// A request ended without a response.
    pub fn error(&self, client: &str) {
        self.seen(client, None);
        self.errors.with_label_values(&[client]).inc();
    }

    /// Removes the series of every client but `keep`: a client nothing uses any more leaves
    /// no series behind.
    pub fn retain_clients(&self, keep: &BTreeSet<String>) {
        // A poisoned lock only means a request panicked mid-update; the map is still whole.
        let mut series = self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        series.retain(|client, pairs| {
            if keep.contains(client) {
                return true;
            }
            for (method, code) in pairs.iter() {
                // Absent series are not an error worth reporting: the goal is their absence.
                let _ = self.request_duration.remove_label_values(&[client, method, code]);
                let _ = self.requests.remove_label_values(&[client, method, code]);
            }
            let _ = self.errors.remove_label_values(&[client]);
            let _ = self.inflight.remove_label_values(&[client]);
            false
        });
    }

    fn seen(&self, client: &str, pair: Option<(&str, &str)>) {
        let mut series = self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !series.contains_key(client) {
            series.insert(client.to_string(), BTreeSet::new());
        }
        if let (Some(pairs), Some((method, code))) = (series.get_mut(client), pair) {
            if !pairs.iter().any(|(m, c)| m == method && c == code) {
                pairs.insert((method.to_string(), code.to_string()));
            }
        }
    }
}

/// Holds one request in `http_client_requests_inflight`.
pub struct InFlight {
    gauge: prometheus::IntGauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
