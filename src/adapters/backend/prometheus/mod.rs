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
//!
//! Before anything is sent, the cycle's queries are planned (`fold`): queries of one shape that
//! differ only in the value of one label (`sum(rate(x{deployment="web-17"}[1m]))` for many
//! deployments) go as one grouped query (`sum by (deployment) (...)`), always as a form POST,
//! and each gets the series labelled with its own value, judged as its own answer would be.
//! A grouped query that fails in a way its members alone may not (the server rejects it as
//! malformed, hits a per-query series or sample limit, fails or times out running it) is asked
//! again as its members, in the same cycle, and its shape is not folded for
//! [`REFUSED_SHAPE_FOR`]. A folded query's regex stays under the backend's
//! `fold_max_regex_bytes` (Mimir shards no query past 4 KiB of regex), and `fold_queries =
//! false` turns folding off.

pub(crate) mod connection;
mod fold;
mod response;
mod sample_time;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::Url;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use watermarkd_engine::Timestamp;

use self::connection::{chain, Connection};
use self::fold::{Fetch, FoldLimits, FoldedQuery};
use self::response::{Answer, Failure};
use super::body::{self, BodyBudget, BodyError};
use super::{
    BackendError, HistoryError, HistorySpan, MetricQuery, Observation, PlanPart, PlannedFetch, QueryError, QueryPlan,
};
use crate::adapters::telemetry::{BackendMetrics, PlanCounts};
use crate::domain::rules::{PrometheusBackend, Reducer};

/// Steps per range request: Prometheus refuses more than 11,000 points per series.
pub const MAX_RANGE_POINTS: usize = 10_000;

/// Attempts after the first for one range request of a backtest.
const HISTORY_RETRIES: usize = 4;

/// Longer GET URLs go as a form POST instead: proxies and load balancers commonly cut request
/// lines somewhere past 2 KiB, and Prometheus takes both.
const MAX_GET_URL_CHARS: usize = 2_000;

/// An instant query yields one sample per series; an answer this large means the query selects
/// far more than an autoscaler can use, and is not worth holding in memory. Answers over 1 MiB
/// are read one at a time (`body`), and each is judged and dropped as soon as it is parsed, so
/// a client holds about one of these at a time, whatever `max_in_flight`.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// An attempt with less time than this left before the deadline is not started. Not a share of
/// the timeout: a 10 s timeout with a 1 s interval must still query every cycle.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// The first retry waits about this long (jittered up to twice as long), doubling each time.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);

/// A shape whose folded query failed (see `fetch_folded`) is sent unfolded for this long: long
/// enough not to ask a server that cannot take it every cycle, short enough that a server
/// upgraded or a limit raised is used again soon.
pub const REFUSED_SHAPE_FOR: Duration = Duration::from_secs(600);

/// Refused shapes remembered at once, at most: each is forgotten after [`REFUSED_SHAPE_FOR`]
/// anyway, and there are rarely more than the rules have shapes.
const MAX_REFUSED_SHAPES: usize = 10_000;

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
    /// The bytes of answers held at once (`body`): one large answer at a time.
    bodies: BodyBudget,
    metrics: Arc<BackendMetrics>,
    /// Seeds each query's retry jitter differently, so that retries spread out.
    jitter: RandomState,
    /// Shapes whose folded query failed, and until when they are not folded.
    refused_shapes: Mutex<HashMap<String, Instant>>,
    /// Whether queries of one shape are folded at all (`fold_queries`).
    fold_queries: bool,
    /// How large one folded query may grow.
    fold_limits: FoldLimits,
}

/// How one query goes over HTTP.
struct Prepared {
    /// The whole request as a GET URL, or `None` when it is too long and goes as a form POST.
    get_url: Option<Url>,
    /// A range query (`query_range`), not an instant one.
    range: bool,
    /// `query`, `time`, then the configured `params`.
    form: Vec<(String, String)>,
    /// A folded query's label: its answer's series are kept with their value of it.
    fold_label: Option<String>,
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
                bodies: BodyBudget::new(MAX_BODY_BYTES),
                metrics,
                jitter: RandomState::new(),
                refused_shapes: Mutex::new(HashMap::new()),
                fold_queries: config.fold_queries,
                fold_limits: FoldLimits {
                    max_regex_bytes: usize::try_from(config.fold_max_regex_bytes).unwrap_or(usize::MAX),
                    max_members: config
                        .fold_max_members
                        .map_or(usize::MAX, |members| usize::try_from(members).unwrap_or(usize::MAX)),
                },
            }),
        })
    }

    /// The configured timeout of one request.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Evaluates every query as of `now`: one observation per query, in order, by `deadline`.
    pub async fn evaluate(&self, queries: &[MetricQuery], now: Timestamp, deadline: Instant) -> Vec<Observation> {
        let (texts, slots) = super::distinct_texts(queries);
        let fetches = self.inner.fold_plan(&texts);
        self.inner.metrics.observe_plan(&self.inner.name, &plan_counts(&fetches, texts.len(), &slots));

        // Each text's reducers (queries of one text may reduce its series differently): an
        // answer is judged for each as soon as it is read, and dropped, so no answer outlives
        // its own task while the others are read.
        let mut reducers: Vec<Vec<Option<Reducer>>> = vec![Vec::new(); texts.len()];
        let mut judged_as = Vec::with_capacity(queries.len());
        for (query, slot) in queries.iter().zip(&slots) {
            let at = reducers.get_mut(*slot).map(|known| match known.iter().position(|r| *r == query.reducer) {
                Some(at) => at,
                None => {
                    known.push(query.reducer);
                    known.len() - 1
                }
            });
            judged_as.push(at.unwrap_or(0));
        }
        let reducers = Arc::new(reducers);

        let mut tasks = JoinSet::new();
        for fetch in fetches {
            let (inner, reducers) = (Arc::clone(&self.inner), Arc::clone(&reducers));
            match fetch {
                Fetch::Alone(i) => {
                    let text = texts.get(i).map(|t| t.to_string()).unwrap_or_default();
                    tasks.spawn(async move {
                        let answer = inner.fetch(&text, now, deadline).await;
                        vec![(i, inner.judge(answer, reducers.get(i), now))]
                    });
                }
                Fetch::Folded(folded) => {
                    let alone = folded.members.iter().map(|(_, i)| texts.get(*i).map(|t| t.to_string())).collect();
                    tasks.spawn(async move {
                        let answers = fetch_folded(Arc::clone(&inner), folded, alone, now, deadline).await;
                        answers.into_iter().map(|(i, answer)| (i, inner.judge(answer, reducers.get(i), now))).collect()
                    });
                }
            }
        }
        let mut judged: Vec<Option<Vec<Observation>>> = vec![None; texts.len()];
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(results) => {
                    for (i, observations) in results {
                        if let Some(slot) = judged.get_mut(i) {
                            *slot = Some(observations);
                        }
                    }
                }
                Err(error) => tracing::error!(backend = %self.inner.name, %error, "a query task failed"),
            }
        }

        slots
            .iter()
            .zip(judged_as)
            .map(|(slot, at)| match judged.get(*slot).and_then(Option::as_ref).and_then(|judged| judged.get(at)) {
                Some(observation) => observation.clone(),
                None => Observation::unavailable(QueryError::Protocol("the query task ended without an answer".into())),
            })
            .collect()
    }

    /// What `evaluate` would send for `queries` now: the requests, the text each carries, and
    /// which queries each answers. Pure, but for the shapes the server recently refused to take
    /// folded.
    pub fn plan(&self, queries: &[MetricQuery]) -> QueryPlan {
        let (texts, slots) = super::distinct_texts(queries);
        query_plan(&self.inner.fold_plan(&texts), &texts, &slots)
    }
}

/// The plan of `query_plan`, counted: what the daemon exports every cycle, without copying
/// every text.
fn plan_counts(fetches: &[Fetch], text_count: usize, slots: &[usize]) -> PlanCounts {
    let mut asking = vec![0usize; text_count];
    for slot in slots {
        if let Some(count) = asking.get_mut(*slot) {
            *count += 1;
        }
    }
    let asking = |text: usize| asking.get(text).copied().unwrap_or(0);
    let mut counts = PlanCounts::default();
    for fetch in fetches {
        let (members, folded) = match fetch {
            Fetch::Alone(i) => (asking(*i), false),
            Fetch::Folded(folded) => (folded.members.iter().map(|(_, i)| asking(*i)).sum(), true),
        };
        counts.add(members, folded);
        counts.members_per_request.push(members);
    }
    counts
}

/// The shared shape of a plan: one request per fetch, its text as sent, and the queries (by
/// index in the cycle's queries, not its texts) it answers.
fn query_plan(fetches: &[Fetch], texts: &[&str], slots: &[usize]) -> QueryPlan {
    let mut asked_by: Vec<Vec<usize>> = vec![Vec::new(); texts.len()];
    for (query, slot) in slots.iter().enumerate() {
        if let Some(asking) = asked_by.get_mut(*slot) {
            asking.push(query);
        }
    }
    let asking = |text: usize| asked_by.get(text).map_or(&[][..], Vec::as_slice);
    let requests = fetches
        .iter()
        .map(|fetch| {
            let part = match fetch {
                Fetch::Alone(i) => {
                    let text = texts.get(*i).copied().unwrap_or_default();
                    PlanPart {
                        text: sample_time::dated(text).unwrap_or_else(|| text.to_string()),
                        members: asking(*i).to_vec(),
                        folded: false,
                    }
                }
                Fetch::Folded(folded) => {
                    let mut members: Vec<usize> =
                        folded.members.iter().flat_map(|(_, i)| asking(*i)).copied().collect();
                    members.sort_unstable();
                    PlanPart { text: folded.sent.clone(), members, folded: true }
                }
            };
            PlannedFetch { parts: vec![part] }
        })
        .collect();
    QueryPlan { requests }
}

/// A folded query, and what each of its members gets: the series labelled with its value.
///
/// A folded query can fail where its members alone would not: the server cannot take its form
/// (HTTP 400, `bad_data`), it selects N times the series and samples of one member and meets a
/// per-query limit (a 422 `execution` error from Mimir, Thanos or Cortex), or it runs N times as
/// long (a 5xx, a timeout). Then each member is asked alone (its text in `alone`, in the order
/// of `folded.members`) in this same cycle, and the shape is not folded for
/// [`REFUSED_SHAPE_FOR`]: a member whose own query fails then fails alone, and its siblings keep
/// their values. That is why the folded query gets one attempt and at most half the time left
/// (`Asking::Folded`): the other half is its members'. What each member would meet alone too
/// (credentials, a refused connection, a rate limit, a cycle already over) is every member's.
async fn fetch_folded(
    inner: Arc<Inner>,
    folded: FoldedQuery,
    alone: Vec<Option<String>>,
    now: Timestamp,
    deadline: Instant,
) -> Vec<(usize, Result<Answer, QueryError>)> {
    let prepared = inner.prepare_sent(folded.sent.clone(), now, Some(&folded.label));
    // Logs name it by one member: the folded text can be 16 KiB long.
    let first = alone.iter().flatten().next().map_or("", String::as_str);
    let name = format!("{first} and {} more folded by {}", folded.members.len().saturating_sub(1), folded.label);
    let failure = match inner.fetch_prepared(&name, &prepared, now, deadline, Asking::Folded).await {
        Ok(answer) => {
            let parts = answer.split(folded.members.iter().map(|(value, _)| value.as_str()));
            return folded
                .members
                .iter()
                .map(|(value, i)| {
                    let part = parts.as_ref().map_err(Clone::clone).and_then(|parts| {
                        parts.get(value.as_str()).cloned().ok_or_else(|| {
                            QueryError::Protocol("a folded query's member is missing from its split answer".into())
                        })
                    });
                    (*i, part)
                })
                .collect();
        }
        Err(failure) => failure,
    };
    let time_left = deadline.saturating_duration_since(Instant::now()) >= MIN_ATTEMPT;
    if !failure.may_be_the_folds() || !time_left {
        return folded.members.iter().map(|(_, i)| (*i, Err(failure.error.clone()))).collect();
    }
    inner.refuse_shape(&folded.shape);
    tracing::warn!(
        backend = %inner.name,
        query = %name,
        error = %failure.error,
        "a folded query failed: its members are asked one by one, and queries of its shape are not folded for \
         the next {} minutes",
        REFUSED_SHAPE_FOR.as_secs() / 60
    );
    let mut tasks = JoinSet::new();
    for ((_, i), text) in folded.members.iter().zip(alone) {
        let (inner, i) = (Arc::clone(&inner), *i);
        let Some(text) = text else { continue };
        tasks.spawn(async move { (i, inner.fetch(&text, now, deadline).await) });
    }
    let mut out = Vec::with_capacity(folded.members.len());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(answer) => out.push(answer),
            Err(error) => tracing::error!(backend = %inner.name, %error, "a query task failed"),
        }
    }
    out
}

/// How one request is asked within its cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asking {
    /// A query as written: retried on what another attempt may fix, until the deadline.
    Alone,
    /// A folded query: given at most half the time left, and not retried on a failure its
    /// members alone may not meet (`Failure::may_be_the_folds`): they are asked instead.
    Folded,
}

impl PrometheusClient {
    /// What a live query would have seen at each step of `span`, from range queries of at most
    /// [`MAX_RANGE_POINTS`] steps each, one after the other. `progress` hears how many steps
    /// have been read so far.
    pub async fn history(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &(impl Fn(usize) + ?Sized),
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

/// What a Prometheus backend answers for itself; each method is the client's own.
impl super::QueryBackend for PrometheusClient {
    fn name(&self) -> &str {
        PrometheusClient::name(self)
    }

    fn timeout(&self) -> Duration {
        PrometheusClient::timeout(self)
    }

    /// The plan does not depend on the time: an instant query is asked as of `now` whenever.
    fn plan(&self, queries: &[MetricQuery], _now: Timestamp) -> QueryPlan {
        PrometheusClient::plan(self, queries)
    }

    /// No budget is shared among namespaces here, so who asks does not matter.
    async fn evaluate_for(
        &self,
        queries: &[MetricQuery],
        _namespaces: &[Option<&str>],
        now: Timestamp,
        deadline: Instant,
    ) -> Vec<Observation> {
        PrometheusClient::evaluate(self, queries, now, deadline).await
    }

    async fn history<P: Fn(usize) + ?Sized>(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &P,
    ) -> Result<Vec<(Timestamp, Observation)>, HistoryError> {
        PrometheusClient::history(self, query, span, progress).await
    }

    /// The series as Prometheus scrapes it from the daemon's `/metrics`.
    fn replicas_query(&self, autoscaler: &str, namespace: &str) -> Option<String> {
        Some(format!(
            "max(wpa_controller_replicas_scaling_effective{{wpa_name=\"{autoscaler}\",wpa_namespace=\"{namespace}\"}})"
        ))
    }

    /// Prometheus paces nothing: no budget to report.
    fn rate_limit(&self) -> Option<super::RateLimitSnapshot> {
        None
    }
}

impl Inner {
    /// What each of `reducers` sees in `answer` (see `evaluate`): a folded member's answer
    /// holds only its own series, at most one (every shape that folds aggregates to one series
    /// without `by`), so a reducer sees what the member's own answer would have shown it.
    fn judge(
        &self,
        answer: Result<Answer, QueryError>,
        reducers: Option<&Vec<Option<Reducer>>>,
        now: Timestamp,
    ) -> Vec<Observation> {
        let reducers = reducers.map_or(&[][..], Vec::as_slice);
        match answer {
            Ok(answer) => reducers.iter().map(|r| response::observe(&answer, *r, now, self.max_age)).collect(),
            Err(error) => reducers.iter().map(|_| Observation::unavailable(error.clone())).collect(),
        }
    }

    /// One query as written, with retries, by the cycle's deadline.
    async fn fetch(&self, query: &str, now: Timestamp, deadline: Instant) -> Result<Answer, QueryError> {
        let prepared = self.prepare(query, now);
        self.fetch_prepared(query, &prepared, now, deadline, Asking::Alone).await.map_err(|failure| failure.error)
    }

    /// One prepared request (`query`: what logs name it by), with retries, by the deadline.
    async fn fetch_prepared(
        &self,
        query: &str,
        prepared: &Prepared,
        now: Timestamp,
        deadline: Instant,
        asking: Asking,
    ) -> Result<Answer, Failure> {
        let started = Instant::now();
        let timed_out = || {
            let seconds = deadline.saturating_duration_since(started).as_secs_f64().ceil() as u64;
            Failure::new(QueryError::Timeout(seconds), "timeout", false)
        };
        // Waiting behind other queries counts against the cycle: a query that cannot start
        // before the deadline is not sent.
        let _permit = match tokio::time::timeout_at(deadline, self.limiter.acquire()).await {
            Ok(Ok(permit)) => permit,
            // Only a closed semaphore fails, and this one is never closed.
            Ok(Err(_)) => {
                return Err(Failure::new(
                    QueryError::Server("the backend is shutting down".into()),
                    "server_error",
                    false,
                ))
            }
            Err(_) => return Err(timed_out()),
        };
        let deadline = match asking {
            Asking::Alone => deadline,
            Asking::Folded => Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2,
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

        let result = (|| self.attempt(prepared, deadline))
            .retry(backoff)
            .when(|failure: &Failure| failure.retry && !(asking == Asking::Folded && failure.may_be_the_folds()))
            .adjust(|_, delay| delay.filter(|d| Instant::now() + *d + MIN_ATTEMPT <= deadline))
            .notify(|failure, delay| {
                tracing::debug!(backend = %self.name, query, error = %failure.error, ?delay, "retrying");
            })
            .await;

        if let Ok(answer) = &result {
            self.report_warnings(query, answer);
        }
        result
    }

    /// A query as written: with its data time asked for when its shape allows.
    fn prepare(&self, query: &str, now: Timestamp) -> Prepared {
        let sent = sample_time::dated(query).unwrap_or_else(|| query.to_string());
        self.prepare_sent(sent, now, None)
    }

    /// `sent` as an instant query at `now`. A folded query (with its `fold_label`) is always a
    /// form POST: its length grows with its members.
    fn prepare_sent(&self, sent: String, now: Timestamp, fold_label: Option<&str>) -> Prepared {
        let mut form = vec![("query".to_string(), sent), ("time".to_string(), format_time(now))];
        form.extend(self.connection.params.iter().cloned());
        let get_url = if fold_label.is_some() {
            None
        } else {
            let mut url = self.connection.endpoint.clone();
            url.query_pairs_mut().extend_pairs(form.iter());
            (url.as_str().len() <= MAX_GET_URL_CHARS).then_some(url)
        };
        Prepared { get_url, range: false, form, fold_label: fold_label.map(str::to_string) }
    }

    /// The fetches for `texts` (distinct query texts), without the shapes refused lately; each
    /// alone when folding is off.
    fn fold_plan(&self, texts: &[&str]) -> Vec<Fetch> {
        if !self.fold_queries {
            return (0..texts.len()).map(Fetch::Alone).collect();
        }
        let now = Instant::now();
        let mut refused = self.refused_shapes.lock().unwrap_or_else(PoisonError::into_inner);
        refused.retain(|_, until| *until > now);
        fold::plan(texts, |shape| refused.contains_key(shape), self.fold_limits)
    }

    /// Remembers that the server rejected the folded query of `shape`.
    fn refuse_shape(&self, shape: &str) {
        let now = Instant::now();
        let mut refused = self.refused_shapes.lock().unwrap_or_else(PoisonError::into_inner);
        refused.retain(|_, until| *until > now);
        if refused.len() >= MAX_REFUSED_SHAPES {
            let oldest = refused.iter().min_by_key(|(_, until)| **until).map(|(shape, _)| shape.clone());
            if let Some(oldest) = oldest {
                refused.remove(&oldest);
            }
        }
        refused.insert(shape.to_string(), now + REFUSED_SHAPE_FOR);
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
        Prepared { get_url, range: true, form, fold_label: None }
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
            self.metrics.request_ended(&self.name, outcome);
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
        self.metrics.request_ended(&self.name, outcome);
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
        let until = body::until(timeout);
        let mut response = request.send().await.map_err(|e| self.transport(e, timeout))?;
        let status = response.status().as_u16();
        let body = match self.bodies.read(&mut response, until).await {
            Ok(body) => body,
            Err(BodyError::Transport(error)) => return Err(self.transport(error, timeout)),
            Err(BodyError::TimedOut) => return Err(timed_out(timeout)),
            Err(BodyError::TooLarge) => {
                return Err(Failure::new(
                    QueryError::Protocol(format!(
                        "the answer is larger than {} MiB: the query selects far more series than one value needs",
                        MAX_BODY_BYTES / (1024 * 1024)
                    )),
                    "protocol",
                    false,
                ))
            }
        };
        // Parsed while the body holds its share of the budget.
        response::classify(status, &body.bytes, &self.connection.display_endpoint, prepared.fold_label.as_deref())
    }

    /// A request that got no complete answer: timed out, refused, reset, or a TLS failure.
    fn transport(&self, error: reqwest::Error, timeout: Duration) -> Failure {
        if error.is_timeout() {
            return timed_out(timeout);
        }
        // Without the URL: it holds the whole query, and the endpoint says enough.
        let refused_redirect = crate::adapters::backend::trust::is_refused_redirect(&error);
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

/// An attempt given `timeout` that got no answer in time.
fn timed_out(timeout: Duration) -> Failure {
    let seconds = timeout.as_secs_f64().ceil().max(1.0) as u64;
    Failure::new(QueryError::Timeout(seconds), "timeout", true)
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
    use crate::domain::rules::TlsSettings;

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
            fold_queries: true,
            fold_max_regex_bytes: 4096,
            fold_max_members: None,
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

        // A folded query is a form POST however short, its answer kept with the label.
        let folded = client.inner.prepare_sent("sum by (d) (x{d=~\"a|b\"})".into(), at, Some("d"));
        assert!(folded.get_url.is_none());
        assert_eq!(folded.fold_label.as_deref(), Some("d"));
        assert_eq!(folded.form.first().map(|(_, v)| v.as_str()), Some("sum by (d) (x{d=~\"a|b\"})"));
    }

    fn query(text: &str, reducer: Option<crate::domain::rules::Reducer>) -> MetricQuery {
        MetricQuery { query: text.into(), reducer }
    }

    #[test]
    fn the_plan_folds_alike_queries_and_names_every_query_each_request_answers() {
        let client = client(&[]);
        let queries = [
            query("sum(x{d=\"a\"})", None),
            query("sum(x{d=\"b\"})", Some(crate::domain::rules::Reducer::Max)),
            query("sum(x{d=\"a\"})", None),
            query("up", None),
            query("sum(x{d=\"c\"})", None),
        ];
        let plan = client.plan(&queries);
        assert_eq!(plan.request_count(), 2);
        let (folded, alone) = (&plan.requests[0].parts, &plan.requests[1].parts);
        assert_eq!(folded.len(), 1);
        assert!(folded[0].folded);
        assert_eq!(folded[0].members, [0, 1, 2, 4]);
        assert!(
            folded[0].text.starts_with("(sum by (d)(x{d=~\"a|b|c\"})) or label_replace(min by (d) ("),
            "{}",
            folded[0].text
        );
        assert_eq!(alone.len(), 1);
        assert!(!alone[0].folded);
        assert_eq!(alone[0].members, [3]);
        assert_eq!(alone[0].text, sample_time::dated("up").unwrap());
        assert_eq!((plan.folded_members(), plan.unfolded_members()), (4, 1));
        let (texts, slots) = crate::adapters::backend::distinct_texts(&queries);
        assert_eq!(plan_counts(&client.inner.fold_plan(&texts), texts.len(), &slots), plan.counts());
        assert_eq!(client.plan(&[]), QueryPlan::default());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_shape_is_sent_unfolded_for_ten_minutes_then_forgotten() {
        let client = client(&[]);
        let texts = [
            "sum(rate(x{d=\"a\"}[1m]))",
            "sum(rate(x{d=\"b\"}[1m]))",
            "sum(rate(y{d=\"a\"}[1m]))",
            "sum(rate(y{d=\"b\"}[1m]))",
        ];
        let queries: Vec<MetricQuery> = texts.iter().map(|t| query(t, None)).collect();
        let fetches = client.inner.fold_plan(&texts);
        let [Fetch::Folded(x), Fetch::Folded(_)] = &fetches[..] else { panic!("{fetches:?}") };
        client.inner.refuse_shape(&x.shape);
        let folded = |plan: &QueryPlan| plan.requests.iter().map(|r| r.parts[0].folded).collect::<Vec<_>>();
        assert_eq!(folded(&client.plan(&queries)), [false, false, true]);
        tokio::time::advance(REFUSED_SHAPE_FOR - Duration::from_secs(1)).await;
        assert_eq!(folded(&client.plan(&queries)), [false, false, true]);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(folded(&client.plan(&queries)), [true, true]);
        assert!(client.inner.refused_shapes.lock().unwrap().is_empty(), "forgotten, not only ignored");
    }
}
