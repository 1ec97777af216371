//! Any Prometheus-compatible endpoint (Prometheus, Thanos, Mimir/Cortex, VictoriaMetrics),
//! queried with instant queries over its HTTP API.
//!
//! One call to `evaluate` is one cycle: identical queries are sent once, at most `max_in_flight`
//! at a time, each retried on server and connection errors until the cycle's deadline (see
//! `backend::QueryBackend`): the wait for a slot, every attempt (each given `min(timeout, time
//! left)`) and every backoff sleep fit before it, and a query not answered by then is
//! `QueryError::Timeout` for this cycle.
//! What cannot be a number (no data, several series, NaN, errors) comes back as "unavailable"
//! with a reason, never as 0. An answer the server says is partial (`response::partial_reason`)
//! comes back as a partial reading: it may scale up, never down. A query whose shape allows it
//! also asks for the time of the data behind its value (`sample_time`), and a value older than
//! the backend's `max_age` is stale.

pub(crate) mod connection;
mod response;
mod sample_time;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::Url;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use watermarkd_engine::Timestamp;

use self::connection::{chain, Connection};
use self::response::{Answer, Failure};
use super::{BackendError, HistoryError, HistorySpan, MetricQuery, Observation, QueryError};
use crate::rules::PrometheusBackend;
use crate::telemetry::BackendMetrics;

/// Steps per range request: Prometheus refuses more than 11,000 points per series.
pub const MAX_RANGE_POINTS: usize = 10_000;

/// Attempts after the first for one range request of a backtest.
const HISTORY_RETRIES: usize = 4;

/// Longer GET URLs go as a form POST instead: proxies and load balancers commonly cut request
/// lines somewhere past 2 KiB, and Prometheus takes both.
const MAX_GET_URL_CHARS: usize = 2_000;

/// An instant query yields one sample per series; an answer this large means the query selects
/// far more than an autoscaler can use, and is not worth holding in memory.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// An attempt with less time than this left before the deadline is not started. Not a share of
/// the timeout: a 10 s timeout with a 1 s interval must still query every cycle.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// The first retry waits about this long (jittered up to twice as long), doubling each time.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);

/// A client for one `[backend.NAME]` of type `prometheus`. Cheap to share: one connection pool,
/// built once, kept across errors.
pub struct PrometheusClient {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    connection: Connection,
    timeout: Duration,
    /// Older data is stale (`max_age`); `None`: the data's age is not checked here (a metric's
    /// own `max_age` still is, by the engine).
    max_age: Option<Duration>,
    /// Bounds the queries in flight, each with its retries: during an outage that keeps us from
    /// piling more concurrent work on a struggling server.
    limiter: Semaphore,
    metrics: Arc<BackendMetrics>,
    /// Seeds each query's retry jitter differently, so that retries spread out.
    jitter: RandomState,
}

/// How one query goes over HTTP.
struct Prepared {
    /// The whole request as a GET URL, or `None` when it is too long and goes as a form POST.
    get_url: Option<Url>,
    /// A range query (`query_range`), not an instant one.
    range: bool,
    /// `query`, `time`, then the configured `params`.
    form: Vec<(String, String)>,
}

impl PrometheusClient {
    /// The `[backend.NAME]` it was built for.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Reads the backend's secrets and certificates and builds its HTTP client.
    pub fn new(name: &str, config: &PrometheusBackend, metrics: Arc<BackendMetrics>) -> Result<Self, BackendError> {
        super::ensure_crypto_provider();
        let connection = Connection::new(name, config)?;
        let permits = usize::try_from(config.max_in_flight).unwrap_or(usize::MAX).clamp(1, Semaphore::MAX_PERMITS);
        Ok(PrometheusClient {
            inner: Arc::new(Inner {
                name: name.to_string(),
                connection,
                timeout: config.timeout,
                max_age: config.max_age,
                limiter: Semaphore::new(permits),
                metrics,
                jitter: RandomState::new(),
            }),
        })
    }

    /// The configured timeout of one request.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Evaluates every query as of `now`: one observation per query, in order, by `deadline`.
    pub async fn evaluate(&self, queries: &[MetricQuery], now: Timestamp, deadline: Instant) -> Vec<Observation> {
        // The same query text is sent once, however many metrics (with whatever reducers) use it.
        let mut unique: Vec<&str> = Vec::new();
        let mut index_of: HashMap<&str, usize> = HashMap::new();
        let slots: Vec<usize> = queries
            .iter()
            .map(|q| {
                *index_of.entry(q.query.as_str()).or_insert_with(|| {
                    unique.push(q.query.as_str());
                    unique.len() - 1
                })
            })
            .collect();

        let mut tasks = JoinSet::new();
        for (i, query) in unique.iter().enumerate() {
            let inner = Arc::clone(&self.inner);
            let query = query.to_string();
            tasks.spawn(async move { (i, inner.fetch(&query, now, deadline).await) });
        }
        let mut answers: Vec<Option<Result<Answer, QueryError>>> = vec![None; unique.len()];
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((i, answer)) => {
                    if let Some(slot) = answers.get_mut(i) {
                        *slot = Some(answer);
                    }
                }
                Err(error) => tracing::error!(backend = %self.inner.name, %error, "a query task failed"),
            }
        }

        queries
            .iter()
            .zip(slots)
            .map(|(query, slot)| match answers.get(slot) {
                Some(Some(Ok(answer))) => response::observe(answer, query.reducer, now, self.inner.max_age),
                Some(Some(Err(error))) => Observation::unavailable(error.clone()),
                _ => Observation::unavailable(QueryError::Protocol("the query task ended without an answer".into())),
            })
            .collect()
    }
}

impl PrometheusClient {
    /// What a live query would have seen at each step of `span`, from range queries of at most
    /// [`MAX_RANGE_POINTS`] steps each, one after the other. `progress` hears how many steps
    /// have been read so far.
    pub async fn history(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &dyn Fn(usize),
    ) -> Result<Vec<(Timestamp, Observation)>, HistoryError> {
        let inner = &self.inner;
        let steps = span.steps();
        let mut out = Vec::with_capacity(steps.len());
        let mut series = 0;
        for chunk in steps.chunks(MAX_RANGE_POINTS) {
            let (Some(first), Some(last)) = (chunk.first(), chunk.last()) else { continue };
            let prepared = inner.prepare_range(&query.query, *first, *last, span.step);
            let answer = inner.fetch_range(&prepared).await.map_err(|error| HistoryError::Query {
                backend: inner.name.clone(),
                query: query.query.clone(),
                error,
            })?;
            inner.report_warnings(&query.query, &answer);
            series = series.max(response::series_count(&answer));
            if series > 1 && query.reducer.is_none() {
                return Err(HistoryError::SeveralSeries {
                    backend: inner.name.clone(),
                    query: query.query.clone(),
                    count: series,
                });
            }
            let observed = response::observe_steps(&answer, query.reducer, chunk, inner.max_age);
            out.extend(chunk.iter().copied().zip(observed));
            progress(out.len());
        }
        Ok(out)
    }
}

impl Inner {
    /// One query, with retries, by the cycle's deadline.
    async fn fetch(&self, query: &str, now: Timestamp, deadline: Instant) -> Result<Answer, QueryError> {
        let started = Instant::now();
        let timed_out = || QueryError::Timeout(deadline.saturating_duration_since(started).as_secs_f64().ceil() as u64);
        let prepared = self.prepare(query, now);
        // Waiting behind other queries counts against the cycle: a query that cannot start
        // before the deadline is not sent.
        let _permit = match tokio::time::timeout_at(deadline, self.limiter.acquire()).await {
            Ok(Ok(permit)) => permit,
            // Only a closed semaphore fails, and this one is never closed.
            Ok(Err(_)) => return Err(QueryError::Server("the backend is shutting down".into())),
            Err(_) => return Err(timed_out()),
        };
        if deadline.saturating_duration_since(Instant::now()) < MIN_ATTEMPT {
            return Err(timed_out());
        }
        let backoff = ExponentialBuilder::new()
            .with_min_delay(FIRST_RETRY_DELAY)
            .with_max_delay((self.timeout / 2).max(FIRST_RETRY_DELAY))
            .with_factor(2.0)
            // No count: the deadline ends the retries.
            .without_max_times()
            .with_jitter()
            .with_jitter_seed(self.jitter.hash_one((query, now.unix_millis())));

        let result = (|| self.attempt(&prepared, deadline))
            .retry(backoff)
            .when(|failure: &Failure| failure.retry)
            .adjust(|_, delay| delay.filter(|d| Instant::now() + *d + MIN_ATTEMPT <= deadline))
            .notify(|failure, delay| {
                tracing::debug!(backend = %self.name, query, error = %failure.error, ?delay, "retrying");
            })
            .await;

        match result {
            Ok(answer) => {
                self.report_warnings(query, &answer);
                Ok(answer)
            }
            Err(failure) => Err(failure.error),
        }
    }

    fn prepare(&self, query: &str, now: Timestamp) -> Prepared {
        let sent = sample_time::dated(query).unwrap_or_else(|| query.to_string());
        let mut form = vec![("query".to_string(), sent), ("time".to_string(), format_time(now))];
        form.extend(self.connection.params.iter().cloned());
        let mut url = self.connection.endpoint.clone();
        url.query_pairs_mut().extend_pairs(form.iter());
        let get_url = (url.as_str().len() <= MAX_GET_URL_CHARS).then_some(url);
        Prepared { get_url, range: false, form }
    }

    fn prepare_range(&self, query: &str, start: Timestamp, end: Timestamp, step: Duration) -> Prepared {
        let step_ms = i64::try_from(step.as_millis()).unwrap_or(i64::MAX);
        let sent = sample_time::dated(query).unwrap_or_else(|| query.to_string());
        let mut form = vec![
            ("query".to_string(), sent),
            ("start".to_string(), format_time(start)),
            ("end".to_string(), format_time(end)),
            ("step".to_string(), format_time(Timestamp::from_unix_millis(step_ms))),
        ];
        form.extend(self.connection.params.iter().cloned());
        let mut url = self.connection.range_endpoint.clone();
        url.query_pairs_mut().extend_pairs(form.iter());
        let get_url = (url.as_str().len() <= MAX_GET_URL_CHARS).then_some(url);
        Prepared { get_url, range: true, form }
    }

    /// One range request, retried a few times on what another attempt may fix.
    async fn fetch_range(&self, prepared: &Prepared) -> Result<Answer, QueryError> {
        let backoff = ExponentialBuilder::new()
            .with_min_delay(Duration::from_millis(500))
            .with_max_delay(Duration::from_secs(8))
            .with_max_times(HISTORY_RETRIES)
            .with_jitter();
        let send = || async {
            let result = self.send(prepared, self.timeout).await;
            let outcome = result.as_ref().map_or_else(|f| f.outcome, |_| "ok");
            self.metrics.requests.with_label_values(&[self.name.as_str(), outcome]).inc();
            result
        };
        send.retry(backoff)
            .when(|failure: &Failure| failure.retry)
            .notify(|failure, delay| {
                tracing::debug!(backend = %self.name, error = %failure.error, ?delay, "retrying a range query");
            })
            .await
            .map_err(|failure| failure.error)
    }

    /// One HTTP request, counted in the metrics whatever its outcome.
    async fn attempt(&self, prepared: &Prepared, deadline: Instant) -> Result<Answer, Failure> {
        let timeout = self.timeout.min(deadline.saturating_duration_since(Instant::now()));
        let started = Instant::now();
        let result = self.send(prepared, timeout).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(failure) => failure.outcome,
        };
        self.metrics.requests.with_label_values(&[self.name.as_str(), outcome]).inc();
        self.metrics.request_seconds.with_label_values(&[self.name.as_str()]).observe(started.elapsed().as_secs_f64());
        result
    }

    async fn send(&self, prepared: &Prepared, timeout: Duration) -> Result<Answer, Failure> {
        let client = &self.connection.client;
        let request = match &prepared.get_url {
            Some(url) => client.get(url.clone()),
            None => {
                let endpoint = if prepared.range { &self.connection.range_endpoint } else { &self.connection.endpoint };
                client.post(endpoint.clone()).form(&prepared.form)
            }
        };
        let request = self.connection.auth.apply(request.timeout(timeout)).await;
        let mut response = request.send().await.map_err(|e| self.transport(e, timeout))?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.transport(e, timeout))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(Failure::new(
                    QueryError::Protocol(format!(
                        "the answer is larger than {} MiB: the query selects far more series than one value needs",
                        MAX_BODY_BYTES / (1024 * 1024)
                    )),
                    "protocol",
                    false,
                ));
            }
            body.extend_from_slice(&chunk);
        }
        response::classify(status, &body, &self.connection.display_endpoint)
    }

    /// A request that got no complete answer: timed out, refused, reset, or a TLS failure.
    fn transport(&self, error: reqwest::Error, timeout: Duration) -> Failure {
        if error.is_timeout() {
            let seconds = timeout.as_secs_f64().ceil().max(1.0) as u64;
            return Failure::new(QueryError::Timeout(seconds), "timeout", true);
        }
        // Without the URL: it holds the whole query, and the endpoint says enough.
        let refused_redirect = crate::backend::trust::is_refused_redirect(&error);
        let error = chain(&error.without_url());
        if refused_redirect {
            // The configured url's problem: asking again gets the same answer.
            let message = format!("{}: {error}", self.connection.display_endpoint);
            return Failure::new(QueryError::Configuration(message), "transport", false);
        }
        Failure::new(QueryError::Transport(format!("{}: {error}", self.connection.display_endpoint)), "transport", true)
    }

    fn report_warnings(&self, query: &str, answer: &Answer) {
        if answer.warnings.is_empty() {
            return;
        }
        self.metrics.warnings.with_label_values(&[self.name.as_str()]).inc_by(answer.warnings.len() as u64);
        for warning in &answer.warnings {
            tracing::warn!(backend = %self.name, query, warning = %warning, "Prometheus attached a warning to its answer");
        }
    }
}

/// Whether `query` goes with the time of its data asked for, so that a `max_age` can find it
/// stale (see `sample_time`).
pub fn dates(query: &str) -> bool {
    sample_time::dated(query).is_some()
}

/// `now` as Unix seconds with millisecond precision, as Prometheus' `time` parameter takes it.
fn format_time(now: Timestamp) -> String {
    let ms = now.unix_millis();
    let sign = if ms < 0 { "-" } else { "" };
    let abs = ms.unsigned_abs();
    format!("{sign}{}.{:03}", abs / 1000, abs % 1000)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rules::TlsSettings;

    fn client(params: &[(&str, &str)]) -> PrometheusClient {
        let config = PrometheusBackend {
            url: "http://prom:9090/prefix".into(),
            timeout: Duration::from_secs(10),
            max_in_flight: 0,
            max_age: None,
            tenant: None,
            headers: BTreeMap::new(),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            basic_auth: None,
            bearer_token: None,
            tls: TlsSettings::default(),
        };
        match PrometheusClient::new("prom", &config, Arc::new(BackendMetrics::detached())) {
            Ok(client) => client,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn time_is_unix_seconds_with_milliseconds() {
        assert_eq!(format_time(Timestamp::from_unix_millis(1_700_000_000_123)), "1700000000.123");
        assert_eq!(format_time(Timestamp::from_unix_millis(5_000)), "5.000");
        assert_eq!(format_time(Timestamp::from_unix_millis(7)), "0.007");
        assert_eq!(format_time(Timestamp::from_unix_millis(-1_500)), "-1.500");
    }

    #[test]
    fn short_queries_are_gets_and_long_ones_form_posts() {
        let client = client(&[("dedup", "true")]);
        // Zero in flight would deadlock every query: at least one goes.
        assert_eq!(client.inner.limiter.available_permits(), 1);
        let at = Timestamp::from_unix_millis(1_000);
        let short = client.inner.prepare("sum(rate(x[1m])) > 0", at);
        let url = short.get_url.as_ref().map(Url::as_str);
        assert_eq!(
            url,
            Some("http://prom:9090/prefix/api/v1/query?query=sum%28rate%28x%5B1m%5D%29%29+%3E+0&time=1.000&dedup=true")
        );

        // The limit is on the whole URL, encoding included (a number: a selector would be sent
        // with its data time asked for, which is longer).
        let fits = |query: &str| client.inner.prepare(query, at).get_url.is_some();
        let overhead = "http://prom:9090/prefix/api/v1/query?query=&time=1.000&dedup=true".len();
        assert!(fits(&"1".repeat(MAX_GET_URL_CHARS - overhead)));
        assert!(!fits(&"1".repeat(MAX_GET_URL_CHARS - overhead + 1)));
        assert!(!fits(&"(".repeat(MAX_GET_URL_CHARS / 3)), "each ( is encoded as 3 characters");

        let long = client.inner.prepare(&"a".repeat(3_000), at);
        assert!(long.get_url.is_none());
        let names: Vec<&str> = long.form.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["query", "time", "dedup"]);
    }
}
