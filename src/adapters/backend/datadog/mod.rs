//! Datadog: `GET /api/v1/query`, batched and paced to the organisation's rate budget.
//!
//! # One cycle
//! `evaluate` is one cycle: every autoscaler query due now, answered in order. Identical query
//! texts are asked once. The rest are joined with top-level commas into as few requests as the
//! Cluster Agent's bounds allow (35 queries, URL under 7,000 characters; `batch`), sent
//! concurrently (at most `max_in_flight` at once), and each returned series is mapped back to its
//! query by `query_index`. Per query, the value is the penultimate non-null point of exactly one
//! series (a lone one only if its bucket is complete), dated by that point, and refused when
//! older than `max_age` (`parse`). Each series is read on its own, so a value that is not a
//! number spoils only its own query.
//!
//! # Pacing (why a cycle may be deferred)
//! The query endpoint's budget (1,600 requests per hour by default) is per organisation and
//! shared with every dashboard, monitor and script there. Peers that send one request per
//! autoscaler per poll exhaust it, and then every autoscaler goes blind at once. So the budget is
//! planned, from the `X-RateLimit-*` headers of every answer (`pacing`):
//!
//! - The first cycle sends one request alone and reads the budget from its answer before the
//!   rest is planned, so a limit smaller than the default is never overrun before it is known.
//!   Until an answer carries the headers, the documented default is assumed, 1,600 per 3,600 s,
//!   with the whole hour still ahead (the slowest pace that default implies: never too fast).
//! - 5 % of the limit is a reserve never planned for: retries, batches split to isolate a bad
//!   query, `watermarkd query`, and what other users of the organisation spend between two of
//!   our answers.
//! - A cycle needing N requests may start only when `now >= next_cycle_not_before`; when it
//!   starts, its N requests are debited at once and `next_cycle_not_before = start + N x
//!   (reset_seconds / usable_remaining)`, usable being remaining minus the reserve. Each request
//!   thus "costs" an equal share of what is left of the window, so while we are the only spender
//!   the spending rate stays constant and the window's budget lasts exactly until its reset, with
//!   no burst at the start of the window and no starvation at its end.
//! - Others' spending is seen, not guessed: the server's count minus our own answered requests
//!   in the window. At their average rate so far they are expected to spend more before the
//!   reset, and that much is left to them (never more than half of what is left, so a burst is
//!   not extrapolated into an hour of blindness). Without this, we would spend the budget down
//!   to the reserve by the end of every window and the organisation's other tools (or a second
//!   watermarkd sharing the organisation) would meet the 429s instead.
//! - A cycle that does not fit in what is left of the window (N > usable) waits for the reset.
//! - A cycle that no window could hold (N > limit minus the reserve: 1,000 autoscalers are 29
//!   requests, a budget of 27 a minute holds 25) can never go whole, so it is spread over the
//!   windows instead: each ask sends what the budget accrued since the previous ask, one request
//!   per `reset_seconds / usable_remaining` (a quarter of a window's worth at the first ask;
//!   what an ask could not use carries over up to one request, so a silence is not saved up
//!   into a burst), and defers the rest. Which queries go is decided by age: the client records
//!   when each query text was last sent, and the oldest (never sent first) fill the requests.
//!   Every query is thus refreshed once per `N x reset_seconds / usable`, the stretched
//!   interval, whatever the period and however many windows one cycle spans, and every window
//!   is spent up to its reserve.
//! - In CRD mode each WPA's namespace may be held to a share of the budget
//!   (`namespace_budget_percent`): a namespace accrues its own credit at that share of the rate,
//!   its queries beyond it are deferred (oldest data first, as above) before the cycle is
//!   planned, and a query asked by several namespaces is charged to the first (not at all when
//!   the rules file asks it too). So one namespace with many WPAs stretches its own interval,
//!   not everyone's. Logged when a namespace starts and stops being held.
//! - A cycle asked for earlier is answered with `QueryError::Deferred` for every query without
//!   any request (a spread cycle: for the queries that did not go): the engine holds its replicas, the effective interval is stretched, the
//!   `stretched_interval_seconds` gauge says by how much, `deferred_queries` counts them, and a
//!   warning is logged when the stretch appears, changes by 10 % or more, or goes away. It goes
//!   away only after a whole stretched interval and several asks in a row were all admitted:
//!   a stretched schedule alternates admitted and deferred asks, which is not "fits again".
//! - Concurrent answers arrive in any order; within one window the lowest `remaining` seen (or our
//!   own debit, when lower) is kept. Windows are calendar aligned, and the estimated reset is
//!   taken one second later than announced, so a fresh budget is never assumed early.
//! - After a 429 nothing at all is sent until its reset (`X-RateLimit-Reset`, else its period
//!   when shorter than 60 s, else 60 s); queries meanwhile get `QueryError::RateLimited`,
//!   requests waiting for a slot in the same cycle are not sent.
//! - Numbers that cannot be right are not believed: a limit of 0, a period or reset beyond an
//!   hour, a reset beyond the period, counts beyond 10^15, a 429 whose reset is 0. Whatever the
//!   numbers, pacing cannot stop for good: a cycle refused again and again is let through as a
//!   probe of one request (its first batch; the rest are deferred) a minute after the last
//!   request, or at the end of the window that request fell in when an answer said when that
//!   is. The probe's answer then sets the numbers right, or the next probe follows.
//!
//! Pacing is per client (one per `[backend.NAME]`), on `tokio::time::Instant`, so tests drive it
//! with a paused clock. One `evaluate` at a time is the expected use; concurrent calls stay
//! within the budget (debits happen at admission) but share one spacing.
//!
//! # Failures
//! Never assumed JSON on a non-2xx answer. An answer larger than 16 MiB (`MAX_BODY_BYTES`) is
//! not read beyond that: every query of its request is `QueryError::Protocol` saying so, and it
//! is not retried (a grouped query over a whole fleet would otherwise be held in memory, and
//! re-sent after every restart). Answers over 1 MiB are read one at a time (`body`), and each
//! series is read as the body is parsed, keeping only the points the rule looks at (`series`),
//! so the client holds at most about one body cap of answers, whatever `max_in_flight`. 5xx, 408, timeouts and connection failures are
//! retried with jittered exponential backoff until the cycle's deadline, which the caller
//! gives (`backend::QueryBackend`): waiting for a request slot, every attempt (each given
//! `min(timeout, time left)`) and every backoff sleep fit before it, and what is not answered
//! by then is `QueryError::Timeout`, so a cycle never runs into the next. Retries and split
//! batches are requests
//! no admission paid for: they are debited from the reserve, and not made when only half of it
//! is left. 403 is a configuration error (no hot retry), 400 a bad query
//! (a batch of several is re-sent one query per request, once, so only the bad query fails, and
//! that query is then not asked at all for `bad_query_retry`, 10 minutes by default: its text is
//! fixed by the rules file, and re-splitting a batch every cycle would cost up to 35 requests).
//! Such a suppression is logged when it starts and when the query is asked again, and
//! `watermarkd_backend_suppressed_queries` counts the queries suppressed now, 422 no data, 429 rate limited.
//! Keys travel only in headers marked sensitive, and only to the configured origin (redirects
//! elsewhere are refused: `backend::trust`); every error text is scrubbed of them anyway. A key
//! file is read again when it changes (`adapters::secret::RotatingSecret`), so a rotated key is used
//! without a restart.

mod batch;
mod compile;
mod fold;
mod history;
mod http;
pub(crate) mod pacing;
pub(crate) mod parse;
mod recent;
mod series;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use watermarkd_engine::Timestamp;

use super::body::{self, BodyBudget, BodyError};
use super::{
    BackendError, HistoryError, HistorySpan, MetricQuery, Observation, ObservationDetail, PlanPart, PlannedFetch,
    QueryError, QueryPlan,
};
use crate::adapters::secret::{RotatingSecret, Secret};
use crate::adapters::telemetry::{BackendMetrics, PlanCounts};
use crate::domain::rules::DatadogBackend;

pub(crate) use batch::{MAX_QUERIES_PER_REQUEST, MAX_URL_CHARS};
pub(crate) use pacing::{RateLimitHeaders, RateLimitSnapshot};
pub(crate) use parse::{rate_limit_wait, read_v1_answer, RequestOutcome, SubQuery, V1Answer, V1Context};

use compile::{plan_counts, plan_of, Compiled, Distinct, Part};
use http::key_headers;
use pacing::{Admission, Pacer};
use recent::StillCurrent;

/// The largest answer read, as for Prometheus: a batch of 35 queries over the default five
/// minutes is a few hundred kilobytes; beyond this a query selects a whole fleet's series, and
/// holding it could take the pod past its memory limit (and again after every restart).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// An attempt with less time than this left before the deadline is not started.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);
const API_KEY_HEADER: &str = "dd-api-key";
const APP_KEY_HEADER: &str = "dd-application-key";

/// Retries: 250 ms, 500 ms, 1 s, ... up to 4 s, each plus up to 100 % jitter, so many clients
/// hit by the same outage do not come back in lockstep. No count: the cycle deadline ends them
/// (and each retry is paid from the reserve, which ends them too).
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_jitter()
    .with_min_delay(Duration::from_millis(250))
    .with_max_delay(Duration::from_secs(4))
    .without_max_times();

/// A Datadog backend: one connection pool, one rate budget.
pub struct DatadogClient {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    /// The site, or the URL when one replaces it: named in advice.
    place: String,
    base: String,
    http: reqwest::Client,
    /// Sent with every request as they are then: a rotated key file is read again.
    api_key: RotatingSecret,
    app_key: RotatingSecret,
    window: Duration,
    max_age: Option<Duration>,
    timeout: Duration,
    /// How long a query Datadog rejected alone is not asked again.
    bad_query_retry: Duration,
    permits: Semaphore,
    /// The bytes of answers held at once (`body`): one large answer at a time.
    bodies: BodyBudget,
    pacer: Mutex<Pacer>,
    /// Whether the last answer was a 403, so that it is logged once, not once per request.
    forbidden: AtomicBool,
    bad_queries: Mutex<HashMap<String, (QueryError, Instant)>>,
    /// The keys of `text_key`, random per process: a value is reused by its text's hash, so
    /// nobody writing a query may compute a text whose hash is another query's.
    text_keys: std::hash::RandomState,
    /// Values that cannot have changed yet, by `text_key`: see `note_current`.
    current: Mutex<HashMap<u64, StillCurrent>>,
    /// The time of the last cycle (`evaluate_for`): a value that can change before the next
    /// cycle, expected as long after as the last came, is not kept for it.
    last_cycle: Mutex<Option<Timestamp>>,
    /// The last cycle's texts (`texts_key`) when nothing of them folded: the same texts again
    /// fold nothing again, so the planner, which parses every text, does not run. At 10,000
    /// queries that share no shape that saved about 1 MiB of resident memory.
    unfoldable: Mutex<Option<u64>>,
    /// Shapes (`fold::FoldedQuery::shape`) whose grouped query Datadog rejected, and until when
    /// their members go unfolded.
    refused_shapes: Mutex<HashMap<u64, Instant>>,
    /// When each query text (by `text_key`) was last sent: what cannot all go now goes oldest
    /// first.
    served: Mutex<HashMap<u64, Instant>>,
    /// The largest share of the budget one namespace's queries may use (100: no bound).
    namespace_budget_percent: u32,
    /// Whether queries are folded into grouped ones (`fold`).
    fold_queries: bool,
    /// Namespaces whose queries were last held to their share, so that it is logged when it
    /// starts and when it ends, not every cycle.
    capped_namespaces: Mutex<HashSet<String>>,
    metrics: Arc<BackendMetrics>,
}

/// Locks a mutex; a panic while holding one of ours cannot leave its data half-updated in a way
/// that matters more than stopping to answer.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl DatadogClient {
    /// The `[backend.NAME]` it was built for.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Reads both keys now (key files are followed afterwards) and builds the connection pool,
    /// once.
    pub fn new(name: &str, config: &DatadogBackend, metrics: Arc<BackendMetrics>) -> Result<Self, BackendError> {
        let secret = |source: &crate::domain::rules::SecretSource| {
            RotatingSecret::load(source).map_err(|cause| BackendError::Secret { backend: name.to_string(), cause })
        };
        let invalid = |message: String| BackendError::Invalid { backend: name.to_string(), message };
        let api_key = secret(&config.api_key)?;
        let app_key = secret(&config.app_key)?;
        let base = config.url.clone().unwrap_or_else(|| format!("https://api.{}", config.site));
        let base = base.trim_end_matches('/').to_string();
        match reqwest::Url::parse(&base) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.query().is_none() => {}
            _ => return Err(invalid(format!("{base:?} is not an http(s) base URL"))),
        }
        if let Some(host) = crate::domain::rules::plain_http_host(&base).filter(|_| !config.allow_insecure_http) {
            return Err(invalid(format!(
                "{base:?} is plain http to {host}: set allow_insecure_http to send the keys unencrypted"
            )));
        }
        key_headers(&api_key.cached(), &app_key.cached())
            .map_err(|what| invalid(format!("the {what} holds characters that cannot be sent in a header")))?;
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        super::ensure_crypto_provider();
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("watermarkd/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(config.timeout)
            .timeout(config.timeout)
            .redirect(super::trust::redirect_policy())
            .build()
            .map_err(|err| invalid(format!("cannot build the HTTP client: {err}")))?;
        let place = config.url.clone().unwrap_or_else(|| config.site.clone());
        Ok(DatadogClient {
            inner: Arc::new(Inner {
                name: name.to_string(),
                place,
                base,
                http,
                api_key,
                app_key,
                window: config.window,
                max_age: config.max_age,
                timeout: config.timeout,
                bad_query_retry: config.bad_query_retry,
                permits: Semaphore::new(usize::try_from(config.max_in_flight.max(1)).unwrap_or(1)),
                bodies: BodyBudget::new(MAX_BODY_BYTES),
                pacer: Mutex::new(Pacer::new(Instant::now())),
                forbidden: AtomicBool::new(false),
                bad_queries: Mutex::new(HashMap::new()),
                text_keys: std::hash::RandomState::new(),
                refused_shapes: Mutex::new(HashMap::new()),
                current: Mutex::new(HashMap::new()),
                last_cycle: Mutex::new(None),
                unfoldable: Mutex::new(None),
                served: Mutex::new(HashMap::new()),
                namespace_budget_percent: config.namespace_budget_percent,
                fold_queries: config.fold_queries,
                capped_namespaces: Mutex::new(HashSet::new()),
                metrics,
            }),
        })
    }

    /// The rate budget as last reported (`None` before any answer carried the headers).
    pub fn rate_limit(&self) -> Option<RateLimitSnapshot> {
        lock(&self.inner.pacer).snapshot(Instant::now())
    }

    /// The configured timeout of one request.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// One cycle: every query, answered in order by `deadline` (see the module comment).
    pub async fn evaluate(&self, queries: &[MetricQuery], now: Timestamp, deadline: Instant) -> Vec<Observation> {
        self.evaluate_for(queries, &[], now, deadline).await
    }

    /// One cycle, knowing which namespace asks each query (`namespaces[i]` for `queries[i]`;
    /// `None`, or a missing entry, for an autoscaler of the rules file): a namespace beyond its
    /// share of the budget has its own queries deferred (see the module comment).
    pub async fn evaluate_for(
        &self,
        queries: &[MetricQuery],
        namespaces: &[Option<&str>],
        now: Timestamp,
        deadline: Instant,
    ) -> Vec<Observation> {
        let inner = &self.inner;
        let started = Instant::now();
        let gap = inner.cycle_gap(now);
        let Distinct { texts: distinct, slots, askers } = Distinct::of(queries);
        let owners = owners(&askers, namespaces);
        let mut answers = inner.known_answers(&distinct, started, now);
        // `known_answers` gives one answer per distinct text.
        let mut pending: Vec<usize> =
            answers.iter().enumerate().filter(|(_, answer)| answer.is_none()).map(|(d, _)| d).collect();
        // Oldest data first: what cannot all go now goes in the order it was last sent.
        {
            let served = lock(&inner.served);
            pending
                .sort_by_cached_key(|&d| distinct.get(d).and_then(|&text| served.get(&inner.text_key(text))).copied());
        }
        for (d, error) in inner.namespace_shares(&mut pending, &owners, started) {
            set_answer(&mut answers, Some(d), Observation::unavailable(error));
        }
        let texts: Vec<&str> = pending.iter().filter_map(|&d| distinct.get(d).copied()).collect();
        // Compiled text `q` (an index into `texts`, as the planner gives them) is distinct text `pending[q]`.
        let distinct_of = |q: usize| pending.get(q).copied();
        let (from, to) = inner.range(now);
        let compiled = inner.compile(&texts, from, to, started);
        let Compiled { units, mut planned, too_long } = compiled;
        let askers_of = |q: usize| distinct_of(q).map_or(&[][..], |d| askers.of_text(d));
        inner.metrics.observe_plan(&inner.name, &plan_counts(&planned, &units, |q| askers_of(q).len()));
        for t in too_long {
            for q in members_of(&units, t.query) {
                let error = QueryError::BadQuery(format!(
                    "the query is too long: its request URL alone would have {} characters, the limit is \
                     {MAX_URL_CHARS}",
                    t.url_chars
                ));
                set_answer(&mut answers, distinct_of(q), Observation::unavailable(error));
            }
        }
        // A cycle that has no time left spends no budget.
        if !planned.is_empty() && deadline.saturating_duration_since(started) < MIN_ATTEMPT {
            for request in planned.drain(..) {
                for q in request.queries.iter().flat_map(|&u| members_of(&units, u)) {
                    set_answer(&mut answers, distinct_of(q), Observation::unavailable(QueryError::Timeout(0)));
                }
            }
        }
        let cx = CycleContext { from, to, now, started, deadline };
        let mut sent: Vec<usize> = Vec::new();
        while !planned.is_empty() {
            let (send, refused) = inner.admit(planned.len());
            let rest = planned.split_off(send.min(planned.len()));
            let going = std::mem::replace(&mut planned, rest);
            if let Some(error) = refused {
                for request in planned.drain(..) {
                    for q in request.queries.iter().flat_map(|&u| members_of(&units, u)) {
                        set_answer(&mut answers, distinct_of(q), Observation::unavailable(error.clone()));
                    }
                }
            }
            if going.is_empty() {
                break;
            }
            sent.extend(going.iter().flat_map(|r| r.queries.iter().flat_map(|&u| members_of(&units, u))));
            for (q, observation) in self.run(going, &units, &texts, cx).await {
                set_answer(&mut answers, distinct_of(q), observation);
            }
        }
        inner.served_now(sent.iter().filter_map(|&q| texts.get(q).copied()), started);
        let next_cycle = now.plus(gap.unwrap_or_default());
        let answer_of = |q: usize| distinct_of(q).and_then(|d| answers.get(d)).and_then(Option::as_ref);
        inner.note_current(sent.iter().filter_map(|&q| Some((*texts.get(q)?, answer_of(q)))), next_cycle);
        inner.charge_namespaces(sent.iter().map(|&q| distinct_of(q).and_then(|d| owners.get(d).copied().flatten())));
        inner.observations(&slots, &answers)
    }

    /// Sends the planned requests concurrently; returns (index into `texts`, observation) for
    /// every member of every unit they carry.
    async fn run(
        &self,
        planned: Vec<batch::PlannedRequest>,
        units: &[fold::Unit],
        texts: &[&str],
        cx: CycleContext,
    ) -> Vec<(usize, Observation)> {
        let mut tasks = JoinSet::new();
        for request in planned {
            let inner = Arc::clone(&self.inner);
            let parts: Vec<Part> =
                request.queries.iter().filter_map(|&u| units.get(u)).map(|unit| Part::of(unit, texts)).collect();
            tasks.spawn(async move { inner.run_request(request.url, parts, cx).await });
        }
        let mut out = Vec::with_capacity(texts.len());
        while let Some(joined) = tasks.join_next().await {
            // A panicked task is reported by `evaluate` as a missing answer.
            if let Ok(answered) = joined {
                out.extend(answered);
            }
        }
        out
    }

    /// What this cycle would send for `queries`, without sending anything: which queries fold
    /// into which grouped query, and how the texts are batched into requests (`watermarkd
    /// query` shows it). Pacing is left out: it decides when, not what.
    pub fn plan(&self, queries: &[MetricQuery], now: Timestamp) -> QueryPlan {
        let inner = &self.inner;
        let Distinct { texts: distinct, askers, .. } = Distinct::of(queries);
        let started = Instant::now();
        let (pending, texts): (Vec<usize>, Vec<&str>) = distinct
            .iter()
            .enumerate()
            .filter(|(_, text)| inner.precheck(text, started).is_none())
            .map(|(d, &text)| (d, text))
            .unzip();
        let (from, to) = inner.range(now);
        let Compiled { units, planned, .. } = inner.compile(&texts, from, to, started);
        let unit_texts: Vec<&str> = units.iter().map(|u| u.text(&texts)).collect();
        plan_of(&planned, &units, &unit_texts, |q| {
            pending.get(q).map(|&d| askers.of_text(d).to_vec()).unwrap_or_default()
        })
    }
}

/// Answers distinct text `d` (`None`: a compiled text the plan does not have, which it never names).
fn set_answer(answers: &mut [Option<Observation>], d: Option<usize>, observation: Observation) {
    if let Some(slot) = d.and_then(|d| answers.get_mut(d)) {
        *slot = Some(observation);
    }
}

/// The compiled texts unit `u` answers (none for a unit the plan does not have).
fn members_of(units: &[fold::Unit], u: usize) -> impl Iterator<Item = usize> + '_ {
    units.get(u).into_iter().flat_map(fold::Unit::members)
}

/// The namespace each distinct query is charged to: the first that asked it, unless an
/// autoscaler of the rules file (never capped) asks it too. `namespaces[i]` is query `i`'s.
fn owners<'a>(askers: &compile::Askers, namespaces: &[Option<&'a str>]) -> Vec<Option<&'a str>> {
    let namespace_of = |i: usize| namespaces.get(i).copied().flatten();
    askers
        .iter()
        .map(|asking| {
            let rules_file = asking.iter().any(|&i| namespace_of(i).is_none());
            asking.first().and_then(|&i| namespace_of(i)).filter(|_| !rules_file)
        })
        .collect()
}

/// What a Datadog backend answers for itself; each method is the client's own.
impl super::QueryBackend for DatadogClient {
    fn name(&self) -> &str {
        DatadogClient::name(self)
    }

    fn timeout(&self) -> Duration {
        DatadogClient::timeout(self)
    }

    fn plan(&self, queries: &[MetricQuery], now: Timestamp) -> QueryPlan {
        DatadogClient::plan(self, queries, now)
    }

    async fn evaluate_for(
        &self,
        queries: &[MetricQuery],
        namespaces: &[Option<&str>],
        now: Timestamp,
        deadline: Instant,
    ) -> Vec<Observation> {
        DatadogClient::evaluate_for(self, queries, namespaces, now, deadline).await
    }

    async fn history<P: Fn(usize) + ?Sized>(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &P,
    ) -> Result<Vec<(Timestamp, Observation)>, HistoryError> {
        DatadogClient::history(self, query, span, progress).await
    }

    /// The series as the Datadog agent names it when it scrapes the daemon's metrics.
    fn replicas_query(&self, autoscaler: &str, namespace: &str) -> Option<String> {
        Some(format!(
            "max:watermarkpodautoscaler.wpa_controller_replicas_scaling_effective{{wpa_name:{autoscaler},wpa_namespace:{namespace}}}"
        ))
    }

    fn rate_limit(&self) -> Option<RateLimitSnapshot> {
        DatadogClient::rate_limit(self)
    }
}

/// What every request of one cycle shares.
#[derive(Clone, Copy)]
struct CycleContext {
    from: i64,
    to: i64,
    now: Timestamp,
    /// When the cycle started: a timeout says how long the cycle had.
    started: Instant,
    deadline: Instant,
}

impl Inner {
    fn v1_endpoint(&self) -> String {
        format!("{}/api/v1/query", self.base)
    }

    /// The query window ending at `now`: (from, to) in Unix seconds.
    fn range(&self, now: Timestamp) -> (i64, i64) {
        let to = now.unix_millis().div_euclid(1000);
        (to - i64::try_from(self.window.as_secs()).unwrap_or(i64::MAX / 2), to)
    }

    /// Keeps the members of a grouped query Datadog rejected unfolded for `bad_query_retry`.
    fn refuse_shape(&self, shape: u64, text: &str, error: &QueryError) {
        let until = crate::domain::instant::saturating_add(Instant::now(), self.bad_query_retry);
        if lock(&self.refused_shapes).insert(shape, until).is_none() {
            tracing::warn!(
                backend = %self.name,
                query = %self.scrub_text(text),
                error = %self.scrub_error(error.clone()),
                retry_in = %humantime::format_duration(self.bad_query_retry),
                "Datadog rejected a grouped query (HTTP 400): its members are asked unfolded until the retry time"
            );
        }
    }

    /// What a cycle knows without asking: queries refused before any request (`precheck`),
    /// and values that cannot have changed yet (`note_current`). `None` for the rest.
    fn known_answers(&self, distinct: &[&str], started: Instant, now: Timestamp) -> Vec<Option<Observation>> {
        let mut answers: Vec<Option<Observation>> =
            distinct.iter().map(|query| self.precheck(query, started).map(Observation::unavailable)).collect();
        let mut current = lock(&self.current);
        current.retain(|_, kept| kept.until > now);
        for (answer, text) in answers.iter_mut().zip(distinct) {
            if answer.is_none() {
                *answer = current.get(&self.text_key(text)).map(StillCurrent::observation);
            }
        }
        answers
    }

    /// How many of `planned` requests the pacer lets go now, and what the others are told.
    fn admit(&self, planned: usize) -> (usize, Option<QueryError>) {
        let admission = lock(&self.pacer).admit(Instant::now(), planned as u64);
        self.report_stretch();
        match admission {
            Admission::Go => (planned, None),
            // One request, whose answer says what the budget is; the rest is asked for again.
            Admission::Learn => (1, None),
            Admission::Part { requests, stretched_interval_seconds } => (
                usize::try_from(requests).unwrap_or(usize::MAX),
                Some(QueryError::Deferred { stretched_interval_seconds }),
            ),
            // One request only: its answer corrects the budget; the rest wait their turn.
            Admission::Probe { stretched_interval_seconds } => {
                tracing::info!(
                    backend = %self.name,
                    "Datadog rate budget: nothing was sent for a while, so one request goes out to read the \
                     budget afresh"
                );
                (1, Some(QueryError::Deferred { stretched_interval_seconds }))
            }
            Admission::Deferred { stretched_interval_seconds } => {
                (0, Some(QueryError::Deferred { stretched_interval_seconds }))
            }
            Admission::RateLimited { reset_in_seconds } => (0, Some(QueryError::RateLimited { reset_in_seconds })),
        }
    }

    /// Each query's observation (`slots[i]`: the distinct text of query `i`), scrubbed of the
    /// keys, with the deferred ones counted.
    fn observations(&self, slots: &[usize], answers: &[Option<Observation>]) -> Vec<Observation> {
        let out: Vec<Observation> = slots
            .iter()
            .map(|&slot| match answers.get(slot) {
                Some(Some(observation)) => self.scrub(observation.clone()),
                // Only a panicked request task leaves a gap.
                _ => Observation::unavailable(QueryError::Protocol("the request task failed".into())),
            })
            .collect();
        let deferred = out.iter().filter(|o| matches!(o.detail.error, Some(QueryError::Deferred { .. }))).count();
        if deferred > 0 {
            self.metrics.deferred_queries.with_label_values(&[self.name.as_str()]).inc_by(deferred as u64);
        }
        out
    }

    /// Holds each namespace to its share of the budget: of its queries in `pending` (oldest
    /// first), those beyond what its share has accrued are removed and returned, deferred.
    fn namespace_shares(
        &self,
        pending: &mut Vec<usize>,
        owners: &[Option<&str>],
        now: Instant,
    ) -> Vec<(usize, QueryError)> {
        let percent = self.namespace_budget_percent;
        if percent >= 100 || owners.iter().all(Option::is_none) {
            return Vec::new();
        }
        let mut count: HashMap<&str, usize> = HashMap::new();
        for &d in pending.iter() {
            if let Some(namespace) = owners.get(d).copied().flatten() {
                *count.entry(namespace).or_default() += 1;
            }
        }
        let mut pacer = lock(&self.pacer);
        pacer.forget_namespaces(now);
        // Queries each namespace may still send now, and the spacing its whole set gets.
        let mut allowed: HashMap<&str, (usize, u64)> = HashMap::new();
        for (&namespace, &queries) in &count {
            let share = pacer.namespace_share(now, namespace, percent);
            let per_request = MAX_QUERIES_PER_REQUEST as f64;
            let may = (share.requests * per_request).floor() as usize;
            let stretched = ceil_secs(share.request_cost.mul_f64(queries as f64 / per_request)).max(1);
            allowed.insert(namespace, (may, stretched));
        }
        drop(pacer);
        let mut deferred = Vec::new();
        let mut capped: HashMap<&str, u64> = HashMap::new();
        pending.retain(|&d| {
            let Some(namespace) = owners.get(d).copied().flatten() else { return true };
            let Some((may, stretched)) = allowed.get_mut(namespace) else { return true };
            if *may > 0 {
                *may -= 1;
                return true;
            }
            deferred.push((d, QueryError::Deferred { stretched_interval_seconds: *stretched }));
            capped.insert(namespace, *stretched);
            false
        });
        self.log_capped(&capped, percent);
        deferred
    }

    /// Logs the namespaces that start or stop being held to their share.
    fn log_capped(&self, capped: &HashMap<&str, u64>, percent: u32) {
        let mut logged = lock(&self.capped_namespaces);
        for (namespace, stretched) in capped {
            if !logged.contains(*namespace) {
                tracing::warn!(
                    backend = %self.name,
                    namespace,
                    stretched_interval_seconds = stretched,
                    "Datadog rate budget: the namespace's queries need more than its share \
                     (namespace_budget_percent = {percent}); some are deferred, oldest data first"
                );
                logged.insert((*namespace).to_string());
            }
        }
        logged.retain(|namespace| {
            let keep = capped.contains_key(namespace.as_str());
            if !keep {
                tracing::info!(
                    backend = %self.name,
                    namespace = %namespace,
                    "Datadog rate budget: the namespace's queries fit in its share again"
                );
            }
            keep
        });
    }

    /// Charges each namespace for the queries of its that were sent: a full request carries
    /// `MAX_QUERIES_PER_REQUEST` of them.
    fn charge_namespaces<'a>(&self, sent: impl Iterator<Item = Option<&'a str>>) {
        if self.namespace_budget_percent >= 100 {
            return;
        }
        let mut queries: HashMap<&str, usize> = HashMap::new();
        for namespace in sent.flatten() {
            *queries.entry(namespace).or_default() += 1;
        }
        let mut pacer = lock(&self.pacer);
        for (namespace, queries) in queries {
            pacer.charge_namespace(namespace, queries as f64 / MAX_QUERIES_PER_REQUEST as f64);
        }
    }

    /// Queries answered without a request: empty, unbalanced, several queries in one, or known bad.
    fn precheck(&self, query: &str, now: Instant) -> Option<QueryError> {
        if query.trim().is_empty() {
            return Some(QueryError::BadQuery("the query is empty".into()));
        }
        if !batch::is_balanced(query) {
            return Some(QueryError::BadQuery(
                "unbalanced brackets or quotes: every (, { and [ needs its closing ), } and ], every quote its end"
                    .into(),
            ));
        }
        if !batch::top_level_commas(query).is_empty() {
            return Some(QueryError::BadQuery(
                "a comma outside braces and parentheses makes this several queries; an autoscaler metric must be \
                 one expression"
                    .into(),
            ));
        }
        let mut bad = lock(&self.bad_queries);
        let before = bad.len();
        bad.retain(|text, (_, until)| {
            let keep = *until > now;
            if !keep {
                tracing::info!(
                    backend = %self.name,
                    query = %self.scrub_text(text),
                    "asking Datadog again for a query it rejected earlier"
                );
            }
            keep
        });
        if bad.len() != before {
            self.set_suppressed(bad.len());
        }
        bad.get(query).map(|(error, _)| error.clone())
    }

    fn set_suppressed(&self, count: usize) {
        self.metrics
            .suppressed_queries
            .with_label_values(&[self.name.as_str()])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// One planned request. Without grouped queries, see `run_plain_batch`. With them, a 400
    /// sends every member unfolded instead (batched, as `run_plain_batch`, so a bad member is
    /// then found alone) and keeps the grouped queries' shapes unfolded for a while: one bad
    /// member never blinds its siblings. Those requests come from the reserve; when it cannot
    /// cover them, the members fail this cycle and go unfolded the next.
    async fn run_request(
        self: Arc<Self>,
        url: String,
        parts: Vec<Part>,
        cx: CycleContext,
    ) -> Vec<(usize, Observation)> {
        if parts.iter().all(|p| matches!(p, Part::Alone(..))) {
            let members = parts.iter().flat_map(Part::singles).collect();
            return self.run_plain_batch(url, members, cx).await;
        }
        let layout: Vec<SubQuery> = parts.iter().map(Part::layout).collect();
        let members: Vec<(usize, String)> = parts.iter().flat_map(Part::singles).collect();
        let failure = match self.send_v1(&url, &layout, cx).await {
            Ok(observations) => return members.iter().map(|(q, _)| *q).zip(observations).collect(),
            Err(failure) => failure,
        };
        if failure.status == Some(400) {
            for part in &parts {
                if let Part::Folded { text, shape, .. } = part {
                    self.refuse_shape(*shape, text, &failure.error);
                }
            }
            let texts: Vec<&str> = members.iter().map(|(_, text)| text.as_str()).collect();
            let (planned, too_long) = batch::plan(&self.v1_endpoint(), cx.from, cx.to, &texts);
            if too_long.is_empty() && lock(&self.pacer).take_extra(Instant::now(), planned.len() as u64) {
                tracing::debug!(
                    backend = %self.name,
                    queries = members.len(),
                    requests = planned.len(),
                    "Datadog rejected a request with a grouped query (HTTP 400): asking its members unfolded"
                );
                let mut batches = JoinSet::new();
                for request in planned {
                    let inner = Arc::clone(&self);
                    let batch: Vec<(usize, String)> =
                        request.queries.iter().filter_map(|&i| members.get(i).cloned()).collect();
                    batches.spawn(async move { inner.run_plain_batch(request.url, batch, cx).await });
                }
                let mut out = Vec::with_capacity(members.len());
                while let Some(joined) = batches.join_next().await {
                    if let Ok(answered) = joined {
                        out.extend(answered);
                    }
                }
                return out;
            }
        }
        members.into_iter().map(|(q, _)| (q, Observation::unavailable(failure.error.clone()))).collect()
    }

    /// One request of queries as written; a 400 on several re-sends each alone, once.
    async fn run_plain_batch(
        self: Arc<Self>,
        url: String,
        members: Vec<(usize, String)>,
        cx: CycleContext,
    ) -> Vec<(usize, Observation)> {
        let layout = vec![SubQuery::One; members.len()];
        match self.send_v1(&url, &layout, cx).await {
            Ok(observations) => members.iter().map(|(q, _)| *q).zip(observations).collect(),
            // Splitting costs one request per query, taken from the reserve; when the reserve
            // cannot cover it, the whole batch fails this cycle and the split is tried again next.
            Err(failure)
                if failure.status == Some(400)
                    && members.len() > 1
                    && lock(&self.pacer).take_extra(Instant::now(), members.len() as u64) =>
            {
                tracing::debug!(
                    backend = %self.name,
                    queries = members.len(),
                    "Datadog rejected a batch (HTTP 400): asking each query alone to find the bad one"
                );
                let mut singles = JoinSet::new();
                for (q, text) in members {
                    let inner = Arc::clone(&self);
                    singles.spawn(async move { (q, inner.run_single(&text, cx).await) });
                }
                let mut out = Vec::new();
                while let Some(joined) = singles.join_next().await {
                    if let Ok(answer) = joined {
                        out.push(answer);
                    }
                }
                out
            }
            Err(failure) => {
                if failure.status == Some(400) {
                    if let [(_, text)] = members.as_slice() {
                        self.remember_bad(text, &failure.error);
                    }
                }
                members.into_iter().map(|(q, _)| (q, Observation::unavailable(failure.error.clone()))).collect()
            }
        }
    }

    async fn run_single(&self, text: &str, cx: CycleContext) -> Observation {
        let (planned, _) = batch::plan(&self.v1_endpoint(), cx.from, cx.to, &[text]);
        // It was part of a batch, so alone it fits.
        let Some(request) = planned.into_iter().next() else {
            return Observation::unavailable(QueryError::BadQuery("the query is too long".into()));
        };
        match self.send_v1(&request.url, &[SubQuery::One], cx).await {
            Ok(mut observations) => observations.pop().unwrap_or_else(|| {
                Observation::unavailable(QueryError::Protocol("an answer without the query".into()))
            }),
            Err(failure) => {
                if failure.status == Some(400) {
                    self.remember_bad(text, &failure.error);
                }
                Observation::unavailable(failure.error)
            }
        }
    }

    /// Keeps a query Datadog rejected from being asked again for `bad_query_retry`.
    fn remember_bad(&self, query: &str, error: &QueryError) {
        let mut bad = lock(&self.bad_queries);
        let until = crate::domain::instant::saturating_add(Instant::now(), self.bad_query_retry);
        if bad.insert(query.to_string(), (error.clone(), until)).is_none() {
            tracing::warn!(
                backend = %self.name,
                query = %self.scrub_text(query),
                error = %self.scrub_error(error.clone()),
                retry_in = %humantime::format_duration(self.bad_query_retry),
                "Datadog rejected the query (HTTP 400): it is not asked again until the retry time"
            );
        }
        self.set_suppressed(bad.len());
    }
}

#[cfg(test)]
mod tests;
