//! Metric backends: Datadog's query API and any Prometheus-compatible endpoint, queried
//! directly over HTTP.
//!
//! A backend answers "evaluate these queries now" with one `Observation` per query: a value and
//! the time of its data point, or "unavailable" with a reason. Batching, pacing, retries and
//! every protocol quirk stay in here; the engine never sees HTTP, and nothing that went wrong
//! ever reaches it as a number.
//!
//! # The cycle deadline
//! Each `evaluate` gets the moment its cycle must be over, and everything in it (waiting for a
//! request slot, every attempt, every backoff sleep) fits before it: an attempt is given
//! `min(timeout, time left)`, a retry whose backoff would end too close to the deadline is not
//! made, and what could not be answered in time is `QueryError::Timeout` for this cycle. The
//! bound is a moment, not a number of retries, so a slow or failing backend costs the same
//! whatever the interval: the daemon sets it just before the next cycle of the most frequent
//! autoscaler in the batch, so one cycle never runs into the next.

pub(crate) mod body;
pub mod datadog;
pub mod plan;
pub mod prometheus;
pub mod recommender;
pub mod trust;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use watermarkd_engine::{Algorithm, Reading, Timestamp};

pub(crate) use datadog::RateLimitSnapshot;
pub use plan::{PlanPart, PlannedFetch, QueryPlan};

use crate::adapters::secret::SecretError;
use crate::adapters::telemetry::BackendMetrics;
use crate::domain::forecast::past_demand;
use crate::domain::rules::{self, Autoscaler, Reducer};

/// One metric query, as an autoscaler's metric names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MetricQuery {
    pub query: String,
    /// How several Prometheus series become one value; `None`: several series are an error.
    pub reducer: Option<Reducer>,
}

/// What a backend answered for one query.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// What the engine sees.
    pub reading: Reading,
    /// What a person checking a rule wants to know (`watermarkd query`, logs).
    pub detail: ObservationDetail,
}

/// How a value was chosen, or why there is none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservationDetail {
    /// Series in the answer for this query.
    pub series: Option<usize>,
    /// Non-null points in the chosen series (Datadog).
    pub points: Option<usize>,
    /// Which of those points was used, 0-based (Datadog: the penultimate non-null one).
    pub chosen_point: Option<usize>,
    /// The series' rollup interval in seconds, as the backend reported it (Datadog).
    pub interval_seconds: Option<u64>,
    /// Warnings the backend attached to a partial answer (Prometheus).
    pub warnings: Vec<String>,
    /// The value is a lower bound (a resource metric with pods that lack samples), and why: it
    /// may show that usage is above the band, never that it is inside or below.
    pub partial: Option<String>,
    pub error: Option<QueryError>,
}

impl Observation {
    pub fn value(value: f64, at: Timestamp, detail: ObservationDetail) -> Self {
        Observation { reading: Reading::Value { value, at }, detail }
    }

    pub fn unavailable(error: QueryError) -> Self {
        Self::unavailable_with(error, ObservationDetail::default())
    }

    pub fn unavailable_with(error: QueryError, mut detail: ObservationDetail) -> Self {
        let reading = Reading::Unavailable { reason: error.to_string() };
        detail.error = Some(error);
        Observation { reading, detail }
    }
}

/// Why one query has no value. The text is what the engine's reason and the logs show, so it
/// says what to check; it never contains a secret.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// The backend refused our credentials or scope (Datadog 403), or a secret is missing.
    #[error("configuration error: {0}")]
    Configuration(String),
    /// The backend rejected this query (HTTP 400, Prometheus `bad_data`).
    #[error("bad query: {0}")]
    BadQuery(String),
    /// No data in the window: empty result, all-null points, Datadog 422.
    #[error("no data: {0}")]
    NoData(String),
    #[error("stale: the newest usable point is {age_seconds}s old, max age {max_age_seconds}s")]
    Stale { age_seconds: u64, max_age_seconds: u64 },
    #[error("the value is {0}, not a number")]
    NotANumber(String),
    #[error("{count} series answered where one was expected: aggregate them in the query, or set a reducer")]
    SeveralSeries { count: usize },
    /// The backend's rate limit is exhausted: wait for its reset.
    #[error("rate limited: the budget resets in {reset_in_seconds}s")]
    RateLimited { reset_in_seconds: u64 },
    /// Skipped this cycle to keep within the rate limit (or within the namespace's share of
    /// it): the effective interval is stretched.
    #[error(
        "deferred: the Datadog rate budget (or the namespace's share of it) allows this query every \
         {stretched_interval_seconds}s"
    )]
    Deferred { stretched_interval_seconds: u64 },
    /// HTTP 5xx, a `status: "error"` in a 200 answer, or a Prometheus server-side error, after
    /// retries.
    #[error("server error: {0}")]
    Server(String),
    /// No answer before the request's timeout or the cycle's deadline (seconds: the time the
    /// request or the cycle had).
    #[error("timed out after {0}s")]
    Timeout(u64),
    /// Connection refused, reset, DNS or TLS failure.
    #[error("cannot reach the backend: {0}")]
    Transport(String),
    /// An answer that does not follow the protocol (not JSON, missing fields).
    #[error("unexpected answer: {0}")]
    Protocol(String),
}

/// A stretch of history, read as a live daemon would have read it at `start`, `start + step`,
/// ... up to `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistorySpan {
    pub start: Timestamp,
    pub end: Timestamp,
    pub step: Duration,
    /// Read for a forecast: points a few minutes apart are enough, so the history is asked in
    /// as few requests as the backend allows (from the same Datadog budget as the live
    /// queries: a day per request instead of an hour), and whatever part of the span the
    /// backend holds is taken. A backtest wants the live resolution, and the whole span.
    pub for_forecast: bool,
}

impl HistorySpan {
    /// The evaluation times: `start`, then every `step` up to `end`.
    pub fn steps(&self) -> Vec<Timestamp> {
        let step_ms = i64::try_from(self.step.as_millis()).unwrap_or(i64::MAX).max(1);
        let count = (self.end.unix_millis() - self.start.unix_millis()).max(0) / step_ms + 1;
        (0..count).map(|k| Timestamp::from_unix_millis(self.start.unix_millis() + k * step_ms)).collect()
    }
}

/// Why a metric's history could not be read. Each names the backend and the query, since a
/// backtest reads several.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("backend {backend:?}: query {query:?}: {error}")]
    Query { backend: String, query: String, error: QueryError },
    #[error(
        "backend {backend:?}: query {query:?} returns {count} series over the history, where an autoscaler metric \
         needs one: aggregate them in the query (sum, max, avg by nothing) or give the metric a reducer"
    )]
    SeveralSeries { backend: String, query: String, count: usize },
    #[error(
        "backend {backend:?}: query {query:?} has a value at only {points} of the evaluations between {start} and \
         {end}; a backtest needs at least {needed}, a tenth (is the history kept that long, and is the query right?)"
    )]
    TooShort { backend: String, query: String, points: usize, needed: usize, start: Timestamp, end: Timestamp },
    #[error(
        "backend {backend:?} cannot read back the replicas watermarkd set (its own series do not reach this kind \
         of backend), which a per-replica metric's history needs"
    )]
    NoReplicas { backend: String },
}

/// Why a backend could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    // `cause`, not `source`: the message already says it, and a chained source would say it twice.
    #[error("backend {backend:?}: {cause}")]
    Secret { backend: String, cause: SecretError },
    #[error("backend {backend:?}: {message}")]
    Invalid { backend: String, message: String },
}

/// What each kind of backend client answers for itself. [`MetricBackend`] holds one client and
/// hands every call to it through this trait (`with_client!`); nothing outside this module asks
/// which kind it holds. The methods have no defaults, so a new client does not compile until
/// it has answered each.
pub trait QueryBackend {
    /// The `[backend.NAME]` it was built for.
    fn name(&self) -> &str;

    /// The configured timeout of one request.
    fn timeout(&self) -> Duration;

    /// What a cycle of `queries` at `now` would send, without sending anything (`watermarkd
    /// query` shows it).
    fn plan(&self, queries: &[MetricQuery], now: Timestamp) -> QueryPlan;

    /// "Evaluate these queries now": one call per cycle, answers in the order of `queries`, all
    /// of them by `deadline` (see "The cycle deadline" above). `namespaces[i]` asks `queries[i]`
    /// (`None`, or a missing entry: an autoscaler of the rules file); a backend paced by a
    /// shared budget holds each namespace to its share of it, the others need not look.
    fn evaluate_for(
        &self,
        queries: &[MetricQuery],
        namespaces: &[Option<&str>],
        now: Timestamp,
        deadline: Instant,
    ) -> impl std::future::Future<Output = Vec<Observation>> + Send;

    /// What a live evaluation would have read at each step of `span` (for a backtest, and for
    /// a forecast's history); `progress` hears how many steps have been read so far.
    fn history<P: Fn(usize) + ?Sized>(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &P,
    ) -> impl std::future::Future<Output = Result<Vec<(Timestamp, Observation)>, HistoryError>>;

    /// The query that reads, on this backend, the replicas watermarkd set for an autoscaler
    /// (its own exported `wpa_controller_replicas_scaling_effective`, as the backend gathered
    /// it): the past replicas a per-replica metric was measured at. `None`: the daemon's series
    /// do not reach this kind of backend.
    fn replicas_query(&self, autoscaler: &str, namespace: &str) -> Option<String>;

    /// The request budget as last reported, for a backend paced by one (`None`: it is not, or
    /// no answer has said yet).
    fn rate_limit(&self) -> Option<RateLimitSnapshot>;
}

/// The backends a rules file may name: an enum, not a plugin system. A kind is one variant
/// here, one arm in `new`, `with_client!` and `dates`, its client module, and its settings in
/// `domain::rules::backend` (docs/architecture.md, "How to add a backend").
pub enum MetricBackend {
    Datadog(datadog::DatadogClient),
    Prometheus(prometheus::PrometheusClient),
}

/// `$call`, with `$client` the client `$backend` holds, whatever its kind.
macro_rules! with_client {
    ($backend:expr, $client:ident => $call:expr) => {
        match $backend {
            MetricBackend::Datadog($client) => $call,
            MetricBackend::Prometheus($client) => $call,
        }
    };
}

impl MetricBackend {
    /// Builds the client for `[backend.NAME]`: reads its secrets and sets up its connection pool.
    pub fn new(name: &str, config: &rules::Backend, metrics: Arc<BackendMetrics>) -> Result<Self, BackendError> {
        ensure_crypto_provider();
        Ok(match config {
            rules::Backend::Datadog(c) => MetricBackend::Datadog(datadog::DatadogClient::new(name, c, metrics)?),
            rules::Backend::Prometheus(c) => {
                MetricBackend::Prometheus(prometheus::PrometheusClient::new(name, c, metrics)?)
            }
        })
    }

    /// Whether the value of `query`, on a backend set up as `config`, is dated by its data, so
    /// that a `max_age` can find it stale (`check` warns of one that cannot). Known from the
    /// settings alone: `check` runs where the secrets may not be.
    pub fn dates(config: &rules::Backend, query: &str) -> bool {
        match config {
            // Every point of a Datadog series carries its own time.
            rules::Backend::Datadog(_) => true,
            rules::Backend::Prometheus(_) => prometheus::dates(query),
        }
    }

    /// Whether the backends of `next` that differ from `running` can be built now (secrets
    /// read, certificates loaded), without keeping them. A reload checks this first, so that a
    /// new secret that cannot be read fails the reload and the working client stays.
    pub fn check_changed(running: &rules::RulesFile, next: &rules::RulesFile) -> Result<(), BackendError> {
        for (name, config) in &next.backends {
            if running.backends.get(name) != Some(config) {
                Self::new(name, config, Arc::new(BackendMetrics::detached()))?;
            }
        }
        Ok(())
    }

    /// The `[backend.NAME]` it was built for.
    pub fn name(&self) -> &str {
        with_client!(self, c => QueryBackend::name(c))
    }

    /// The configured timeout of one request.
    pub fn timeout(&self) -> Duration {
        with_client!(self, c => QueryBackend::timeout(c))
    }

    /// What a cycle of `queries` at `now` would send (`plan`), without sending anything.
    pub fn plan(&self, queries: &[MetricQuery], now: Timestamp) -> QueryPlan {
        with_client!(self, c => QueryBackend::plan(c, queries, now))
    }

    /// The rate budget as last reported, for a backend paced by one.
    pub fn rate_limit(&self) -> Option<RateLimitSnapshot> {
        with_client!(self, c => QueryBackend::rate_limit(c))
    }

    /// The query that reads back the replicas watermarkd set for an autoscaler, when its
    /// series reach this backend (see [`QueryBackend::replicas_query`]).
    pub fn replicas_query(&self, autoscaler: &str, namespace: &str) -> Option<String> {
        with_client!(self, c => QueryBackend::replicas_query(c, autoscaler, namespace))
    }

    /// What a live evaluation would have read at each step of `span` (see each client's
    /// `history`).
    pub async fn history(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &(impl Fn(usize) + ?Sized),
    ) -> Result<Vec<(Timestamp, Observation)>, HistoryError> {
        let read = with_client!(self, c => QueryBackend::history(c, query, span, progress).await)?;
        // A replay where almost every evaluation has no data says only that the data is not
        // there: a retention shorter than the span, or a query that matches nothing.
        let points = read.iter().filter(|(_, o)| matches!(o.reading, Reading::Value { .. })).count();
        let needed = if span.for_forecast { 1 } else { read.len().div_ceil(10).max(2) };
        if points < needed {
            return Err(HistoryError::TooShort {
                backend: self.name().to_string(),
                query: query.query.clone(),
                points,
                needed,
                start: span.start,
                end: span.end,
            });
        }
        Ok(read)
    }

    /// One cycle of `queries`, with no namespace asking (`watermarkd query`).
    pub async fn evaluate(&self, queries: &[MetricQuery], now: Timestamp, deadline: Instant) -> Vec<Observation> {
        self.evaluate_for(queries, &[], now, deadline).await
    }

    /// One cycle, knowing which namespace asks each query (`None`: the rules file). Datadog
    /// holds each namespace to its share of the rate budget; Prometheus has no shared budget.
    pub async fn evaluate_for(
        &self,
        queries: &[MetricQuery],
        namespaces: &[Option<&str>],
        now: Timestamp,
        deadline: Instant,
    ) -> Vec<Observation> {
        with_client!(self, c => QueryBackend::evaluate_for(c, queries, namespaces, now, deadline).await)
    }
}

/// rustls needs one process-wide crypto provider; ring is the one compiled in.
pub fn ensure_crypto_provider() {
    // Err only means one is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The distinct query texts, in order of first use, and for each query the index of its text:
/// the same text is sent once, however many metrics (with whatever reducers) use it.
pub(crate) fn distinct_texts(queries: &[MetricQuery]) -> (Vec<&str>, Vec<usize>) {
    let mut texts: Vec<&str> = Vec::new();
    let mut index_of: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let slots = queries
        .iter()
        .map(|q| {
            *index_of.entry(q.query.as_str()).or_insert_with(|| {
                texts.push(q.query.as_str());
                texts.len() - 1
            })
        })
        .collect();
    (texts, slots)
}

/// The past demand of each of an autoscaler's metrics over `[start, end]`, as its forecast
/// learns from it (the span `Forecaster::wants_backfill` asks for, or the whole of
/// `Forecaster::backfill_span`): each metric's history on its backend, a sample per
/// `forecast::SAMPLE_EVERY`, and, under `absolute` (a per-replica metric), the replicas
/// watermarkd set then, from the first metric's backend. `backend` finds a backend by name.
/// One result per metric, in order.
pub async fn demand_history(
    autoscaler: &Autoscaler,
    backend: impl Fn(&str) -> Option<Arc<MetricBackend>>,
    (start, end): (Timestamp, Timestamp),
) -> Vec<Result<Vec<(Timestamp, f64)>, HistoryError>> {
    let step = crate::domain::forecast::SAMPLE_EVERY;
    let span = HistorySpan { start, end, step, for_forecast: true };
    let value_of = |o: &Observation| match o.reading {
        Reading::Value { value, .. } => Some(value),
        Reading::Unavailable { .. } | Reading::Replicas { .. } => None,
    };
    let mut past_replicas: Result<Vec<Option<u32>>, HistoryError> = Ok(Vec::new());
    let first = autoscaler.metrics.first().and_then(|m| backend(&m.backend));
    if let (Algorithm::Absolute, Some(first)) = (autoscaler.rule.algorithm(), first) {
        past_replicas = match first.replicas_query(&autoscaler.name, &autoscaler.target.namespace) {
            Some(query) => first
                .history(&MetricQuery { query, reducer: None }, span, &|_: usize| {})
                .await
                .map(|read| read.iter().map(|(_, o)| value_of(o).map(|v| v.round().max(0.0) as u32)).collect()),
            None => Err(HistoryError::NoReplicas { backend: first.name().to_string() }),
        };
    }
    let mut out = Vec::with_capacity(autoscaler.metrics.len());
    for source in &autoscaler.metrics {
        let Some(client) = backend(&source.backend) else {
            out.push(Err(HistoryError::Query {
                backend: source.backend.clone(),
                query: source.query.clone(),
                error: QueryError::Configuration("the backend is not set up".into()),
            }));
            continue;
        };
        let query = MetricQuery { query: source.query.clone(), reducer: source.reducer };
        let read = match (&past_replicas, client.history(&query, span, &|_: usize| {}).await) {
            (Err(err), _) => Err(HistoryError::Query {
                backend: source.backend.clone(),
                query: source.query.clone(),
                error: QueryError::Configuration(format!("the past replicas could not be read: {err}")),
            }),
            (Ok(_), Err(err)) => Err(err),
            (Ok(replicas), Ok(read)) => {
                let values: Vec<_> = read.iter().map(|(at, o)| (*at, value_of(o))).collect();
                Ok(past_demand(&autoscaler.rule, &values, replicas))
            }
        };
        out.push(read);
    }
    out
}
