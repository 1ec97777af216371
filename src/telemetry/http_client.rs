//! The Datadog controller's series about its recommender HTTP client, kept under the same names,
//! types, labels and buckets so that dashboards and monitors built on them carry over. Like
//! the client instrumentation it uses (Prometheus' Go `promhttp` round-tripper wrappers), a
//! request counts when its response headers arrive: the duration up to then, and the count by
//! lower-case method and status code; a request that ends without a response (refused, TLS
//! failure, timeout) counts as an error instead. `client` is the recommender's URL, without any
//! credentials or query string (see `Recommender::display_url`).

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
}

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
        let gauge = self.inflight.with_label_values(&[client]);
        gauge.inc();
        InFlight { gauge }
    }

    /// A response arrived `seconds` after the request was sent.
    pub fn response(&self, client: &str, method: &str, code: u16, seconds: f64) {
        let method = method.to_ascii_lowercase();
        let code = code.to_string();
        self.request_duration.with_label_values(&[client, &method, &code]).observe(seconds);
        self.requests.with_label_values(&[client, &method, &code]).inc();
    }

    /// A request ended without a response.
    pub fn error(&self, client: &str) {
        self.errors.with_label_values(&[client]).inc();
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
