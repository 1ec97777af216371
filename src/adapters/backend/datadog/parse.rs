//! Reading Datadog's answers to `GET /api/v1/query`, the one endpoint the client asks.
//!
//! Everything here is pure (status, headers, body in; observations out), so the recorded
//! fixtures exercise exactly the code the client runs. Bodies are never assumed to be JSON on
//! a non-2xx status: a 429 from Datadog's edge is an HTML page, a 502 from a proxy is anything.

use std::time::Duration;

use serde::Deserialize;
use watermarkd_engine::Timestamp;

use super::series::{self, AllPoints, PointSummary, QueryIndex, Readout, Series};

#[cfg(test)]
use super::pacing::headers::FALLBACK_RATE_LIMIT_WAIT;
use super::pacing::RateLimitHeaders;
use crate::adapters::backend::{Observation, ObservationDetail, QueryError};

/// The floor of the default staleness bound, as the Cluster Agent.
const MIN_MAX_AGE: Duration = Duration::from_secs(120);
/// Default staleness bound, in rollup intervals.
const MAX_AGE_ROLLUPS: u32 = 3;
/// Longest server-provided text kept in an error message.
const MAX_ERROR_TEXT: usize = 300;

/// How one HTTP request ended, as the `outcome` label of `metrics.requests`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestOutcome {
    Ok,
    BadQuery,
    Forbidden,
    NoData,
    RateLimited,
    ServerError,
    Timeout,
    Transport,
    Protocol,
}

impl RequestOutcome {
    pub fn label(self) -> &'static str {
        match self {
            RequestOutcome::Ok => "ok",
            RequestOutcome::BadQuery => "bad_query",
            RequestOutcome::Forbidden => "forbidden",
            RequestOutcome::NoData => "no_data",
            RequestOutcome::RateLimited => "rate_limited",
            RequestOutcome::ServerError => "server_error",
            RequestOutcome::Timeout => "timeout",
            RequestOutcome::Transport => "transport",
            RequestOutcome::Protocol => "protocol",
        }
    }
}

/// What one v1 answer means for the sub-queries of its request.
#[derive(Clone, Debug, PartialEq)]
pub enum V1Answer {
    /// HTTP 200, `status: ok`: one observation per sub-query, in `query_index` order; a
    /// grouped sub-query has one per member instead, in the order of its members.
    Answered(Vec<Observation>),
    /// The whole request failed the same way for every sub-query.
    Failed {
        error: QueryError,
        outcome: RequestOutcome,
        /// Worth another attempt in this cycle (5xx); never for 4xx.
        retryable: bool,
    },
}

/// How the series of one sub-query map to what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubQuery {
    /// One query: exactly one series answers it.
    One,
    /// A grouped query (`fold`) standing for several members: each member is answered by the
    /// series whose tags hold its values of `keys`, never by position. A member without such a
    /// series has no data, alone.
    Groups { keys: Vec<String>, members: Vec<Vec<String>> },
}

/// What `read_v1_answer` needs besides the answer itself.
#[derive(Clone, Debug)]
pub struct V1Context<'a> {
    /// Sub-queries in the request (comma-joined).
    pub queries: usize,
    /// What each sub-query stands for; a sub-query beyond its end (all of them, when empty) is
    /// [`SubQuery::One`].
    pub layout: &'a [SubQuery],
    /// The cycle's time: staleness is judged against it.
    pub now: Timestamp,
    /// The configured bound; `None`: `max(120s, 3 x the series' interval)`.
    pub max_age: Option<Duration>,
    /// The site or URL the request went to, named in the 403 advice.
    pub site: &'a str,
}

/// Interprets one answer of `GET /api/v1/query`: HTTP status, rate-limit headers, raw body.
pub fn read_v1_answer(status: u16, rate: &RateLimitHeaders, body: &[u8], cx: &V1Context<'_>) -> V1Answer {
    let failed = |error, outcome, retryable| V1Answer::Failed { error, outcome, retryable };
    match status {
        200..=299 => read_v1_ok(body, cx),
        400 => failed(QueryError::BadQuery(error_text(status, body)), RequestOutcome::BadQuery, false),
        401 | 403 => {
            failed(QueryError::Configuration(forbidden_advice(status, body, cx.site)), RequestOutcome::Forbidden, false)
        }
        422 => failed(QueryError::NoData(error_text(status, body)), RequestOutcome::NoData, false),
        429 => {
            let wait = rate_limit_wait(rate);
            failed(QueryError::RateLimited { reset_in_seconds: wait.as_secs() }, RequestOutcome::RateLimited, false)
        }
        // 408: the server gave up waiting for us; like a 5xx, another attempt may work.
        408 | 500..=599 => failed(QueryError::Server(error_text(status, body)), RequestOutcome::ServerError, true),
        404 => failed(
            QueryError::Configuration(format!(
                "{} from {}: is the site or url right? The query API lives at /api/v1/query",
                error_text(status, body),
                cx.site
            )),
            RequestOutcome::Protocol,
            false,
        ),
        _ => failed(QueryError::Protocol(error_text(status, body)), RequestOutcome::Protocol, false),
    }
}

/// How long to send nothing after a 429: see `RateLimitHeaders::wait_after_429`.
pub fn rate_limit_wait(rate: &RateLimitHeaders) -> Duration {
    rate.wait_after_429()
}

fn forbidden_advice(status: u16, body: &[u8], site: &str) -> String {
    format!(
        "Datadog refused the credentials ({}): check that the API key is valid, that the application key \
         exists and has the `timeseries_query` scope, and that both keys belong to the organisation on {site} \
         (keys only work on their own site)",
        error_text(status, body)
    )
}

/// Per sub-query, what its series add up to for each thing it answers (itself, or each member
/// of a grouped query), gathered as the series are read: how many series, and the first one.
struct Tally<'a> {
    cx: &'a V1Context<'a>,
    /// Per sub-query: for a grouped one, each member's wanted `key:value` tags (lower case);
    /// `None` for one query.
    wanted: Vec<Option<Vec<Vec<String>>>>,
    /// Per sub-query, per member (one for a plain query).
    found: Vec<Vec<Found>>,
    /// The first thing that makes the whole answer a protocol error.
    protocol: Option<String>,
}

/// The series that answer one query (or one member): how many, and the first one (or why it
/// could not be read): an autoscaler's query needs exactly one.
#[derive(Default)]
struct Found {
    count: usize,
    first: Option<Result<Readout<PointSummary>, QueryError>>,
}

impl Found {
    fn add(&mut self, series: &Result<Readout<PointSummary>, QueryError>) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(series.clone());
        }
    }
}

impl<'a> Tally<'a> {
    fn new(cx: &'a V1Context<'a>) -> Self {
        let layout = |index: usize| match cx.layout.get(index) {
            Some(SubQuery::Groups { keys, members }) => Some(
                members
                    .iter()
                    .map(|values| {
                        keys.iter().zip(values).map(|(k, v)| format!("{k}:{v}").to_ascii_lowercase()).collect()
                    })
                    .collect::<Vec<Vec<String>>>(),
            ),
            Some(SubQuery::One) | None => None,
        };
        let wanted: Vec<Option<Vec<Vec<String>>>> = (0..cx.queries).map(layout).collect();
        let found = wanted
            .iter()
            .map(|members| (0..members.as_ref().map_or(1, Vec::len)).map(|_| Found::default()).collect())
            .collect();
        Tally { cx, wanted, found, protocol: None }
    }

    /// One series of the answer, mapped to its query by `query_index` (a series without one can
    /// only be a lone query's) and, in a grouped query, to each member whose tags it carries.
    fn add(&mut self, series: Series<PointSummary>) {
        if self.protocol.is_some() {
            return;
        }
        let queries = self.cx.queries;
        let index = match (&series.query_index, queries) {
            (QueryIndex::Index(i), _) => match usize::try_from(*i) {
                Ok(i) => i,
                Err(_) => return self.fail(format!("a series with query_index {i}")),
            },
            (QueryIndex::Invalid(index), _) => return self.fail(format!("a series with query_index {index}")),
            (QueryIndex::Absent, 1) => 0,
            (QueryIndex::Absent, _) => return self.fail("a series without `query_index` in a batched answer".into()),
        };
        let read =
            series.read.map_err(|why| QueryError::Protocol(format!("a series of the answer cannot be read ({why})")));
        let (Some(found), Some(wanted)) = (self.found.get_mut(index), self.wanted.get(index)) else {
            return self.fail(format!("a series with query_index {index} for a request of {queries} queries"));
        };
        match wanted {
            Some(members) => {
                for (member, wanted) in found.iter_mut().zip(members) {
                    if wanted.iter().all(|w| series.tags.iter().any(|t| t.eq_ignore_ascii_case(w))) {
                        member.add(&read);
                    }
                }
            }
            None => found.iter_mut().for_each(|one| one.add(&read)),
        }
    }

    fn fail(&mut self, message: String) {
        self.protocol.get_or_insert(message);
    }

    /// One observation per sub-query, or per member of a grouped one, in order.
    fn observations(self) -> Vec<Observation> {
        let cx = self.cx;
        self.found.iter().flatten().map(|found| observe_v1(found, cx)).collect()
    }
}

fn read_v1_ok(body: &[u8], cx: &V1Context<'_>) -> V1Answer {
    let protocol = |message: String| V1Answer::Failed {
        error: QueryError::Protocol(message),
        outcome: RequestOutcome::Protocol,
        retryable: false,
    };
    let mut tally = Tally::new(cx);
    let envelope = match series::read(body, |series| tally.add(series)) {
        Ok(envelope) => envelope,
        Err(err) => {
            return protocol(format!("HTTP 200 with a body that is not a v1 query answer ({err}){}", snippet(body)))
        }
    };
    if envelope.status.as_deref() == Some("error") {
        // A 200 that says "error" is Datadog failing to run a query it accepted (a malformed
        // query is a 400): a server-side error, not a bad query, so the query is not
        // suppressed. Not retried within the cycle: what made it fail (a query too heavy for
        // the window, an internal error) is not known to pass in a second, and each retry is
        // paid from the reserve; the next cycle asks again.
        let text = envelope.error.filter(|e| !e.trim().is_empty()).unwrap_or_else(|| "status \"error\"".to_string());
        return V1Answer::Failed {
            error: QueryError::Server(truncate(&format!("HTTP 200 with status \"error\": {text}"))),
            outcome: RequestOutcome::ServerError,
            retryable: false,
        };
    }
    if !envelope.has_series {
        return protocol("HTTP 200 without `series`".to_string());
    }
    if let Some(message) = tally.protocol.take() {
        return protocol(message);
    }
    V1Answer::Answered(tally.observations())
}

/// One series of a range read for a backtest: its rollup and every bucket, null or not.
#[derive(Clone, Debug, PartialEq)]
pub struct HistorySeries {
    pub interval_seconds: Option<f64>,
    /// `(ms, value)`; `None` for a null bucket and for one that is not a number.
    pub points: Vec<(f64, Option<f64>)>,
}

/// Interprets one answer of `GET /api/v1/query` for a single query over a long range: every
/// series with all its points. Failures are judged as for a live answer.
pub fn read_v1_history(
    status: u16,
    rate: &RateLimitHeaders,
    body: &[u8],
    site: &str,
) -> Result<Vec<HistorySeries>, (QueryError, RequestOutcome, bool)> {
    if !(200..=299).contains(&status) {
        let cx = V1Context { queries: 1, layout: &[], now: Timestamp::from_unix_millis(0), max_age: None, site };
        return match read_v1_answer(status, rate, body, &cx) {
            V1Answer::Failed { error, outcome, retryable } => Err((error, outcome, retryable)),
            V1Answer::Answered(_) => Ok(Vec::new()),
        };
    }
    let protocol = |message: String| (QueryError::Protocol(message), RequestOutcome::Protocol, false);
    let mut read: Vec<HistorySeries> = Vec::new();
    let mut unreadable: Option<String> = None;
    let envelope = series::read(body, |series: Series<AllPoints>| match series.read {
        Ok(readout) if unreadable.is_none() => read.push(HistorySeries {
            interval_seconds: readout.interval.filter(|i| i.is_finite() && *i > 0.0),
            points: readout.points,
        }),
        Ok(_) => {}
        Err(why) => {
            unreadable.get_or_insert(why);
        }
    })
    .map_err(|err| protocol(format!("HTTP 200 with a body that is not a v1 query answer ({err}){}", snippet(body))))?;
    if envelope.status.as_deref() == Some("error") {
        let text = envelope.error.filter(|e| !e.trim().is_empty()).unwrap_or_else(|| "status \"error\"".to_string());
        return Err((
            QueryError::Server(truncate(&format!("HTTP 200 with status \"error\": {text}"))),
            RequestOutcome::ServerError,
            false,
        ));
    }
    if !envelope.has_series {
        return Err(protocol("HTTP 200 without `series`".to_string()));
    }
    match unreadable {
        Some(why) => Err(protocol(format!("a series of the answer cannot be read ({why})"))),
        None => Ok(read),
    }
}

fn not_one_series((error, series): (QueryError, usize)) -> Observation {
    Observation::unavailable_with(error, ObservationDetail { series: Some(series), ..ObservationDetail::default() })
}

fn observe_v1(found: &Found, cx: &V1Context<'_>) -> Observation {
    let series = match (found.count, &found.first) {
        (1, Some(Ok(series))) => series,
        (1, Some(Err(error))) => {
            return Observation::unavailable_with(
                error.clone(),
                ObservationDetail { series: Some(1), ..ObservationDetail::default() },
            )
        }
        (0, _) | (_, None) => return not_one_series((QueryError::NoData("no series in the query window".into()), 0)),
        (several, _) => return not_one_series((QueryError::SeveralSeries { count: several }, several)),
    };
    let interval_seconds = series.interval.filter(|i| i.is_finite() && *i >= 0.0).map(|i| i.round() as u64);
    let max_age = cx.max_age.unwrap_or_else(|| default_max_age(interval_seconds));
    let detail = ObservationDetail { series: Some(1), interval_seconds, ..ObservationDetail::default() };
    let points = &series.points;
    // A NaN or an overflow anywhere in the window means the query's arithmetic breaks on this
    // data, and its neighbours are not to be trusted either.
    if let Some(token) = &points.not_a_number {
        return Observation::unavailable_with(QueryError::NotANumber(token.clone()), detail);
    }
    let buckets = Buckets {
        interval_ms: series.interval.filter(|i| i.is_finite()).map(|i| i * 1000.0),
        window_end_ms: cx.now.unix_millis() as f64,
        last_ms: points.last_ms,
    };
    choose(points, buckets, detail, cx.now, max_age)
}

/// `max(120s, 3 x rollup)`: a value older than three buckets means the metric stopped
/// reporting, whatever its resolution.
pub fn default_max_age(interval_seconds: Option<u64>) -> Duration {
    let rollups = Duration::from_secs(interval_seconds.unwrap_or(0)).saturating_mul(MAX_AGE_ROLLUPS);
    rollups.max(MIN_MAX_AGE)
}

/// Which non-null point an autoscaler uses: the penultimate one, because the newest bucket may
/// still be filling (a partial sum or average would scale on a fraction of the traffic); the
/// only one when there is one (`choose` then checks that it is not the newest bucket). Returns
/// its position among the non-null points.
pub fn penultimate(non_null: usize) -> Option<usize> {
    match non_null {
        0 => None,
        1 => Some(0),
        n => Some(n - 2),
    }
}

/// Where the series' buckets end, for telling whether a point is in the newest bucket.
#[derive(Clone, Copy, Debug)]
struct Buckets {
    /// The rollup interval in ms, when the answer gave one.
    interval_ms: Option<f64>,
    /// The query window's end (`to`), in ms.
    window_end_ms: f64,
    /// The time of the series' last bucket, null or not, in ms.
    last_ms: Option<f64>,
}

impl Buckets {
    /// Whether the bucket starting at `ms` is the newest one, the one that may still be
    /// filling: it does not end before the window does (with a known interval), or it is the
    /// series' last bucket (without one). A point in a complete bucket is not.
    fn is_newest(&self, ms: f64) -> bool {
        match self.interval_ms.filter(|i| *i > 0.0) {
            Some(interval) => ms + interval > self.window_end_ms,
            None => self.last_ms.is_none_or(|last| ms >= last),
        }
    }
}

/// From the non-null points of the one series (as summed up while it was read): the chosen
/// value, or why not. As the Cluster Agent, a lone point in the newest bucket is not used: it
/// may be a fraction of what the bucket will hold, and there is no complete bucket to fall back
/// on.
fn choose(
    points: &PointSummary,
    buckets: Buckets,
    mut detail: ObservationDetail,
    now: Timestamp,
    max_age: Duration,
) -> Observation {
    detail.points = Some(points.non_null);
    let point = if points.non_null >= 2 { points.previous } else { points.last };
    let Some((chosen, (ms, value))) = penultimate(points.non_null).zip(point) else {
        return Observation::unavailable_with(QueryError::NoData("every point in the window is null".into()), detail);
    };
    if points.non_null == 1 && buckets.is_newest(ms) {
        return Observation::unavailable_with(
            QueryError::NoData(
                "the only non-null point is in the newest bucket, which may still be filling; no complete \
                 bucket has a value"
                    .into(),
            ),
            detail,
        );
    }
    detail.chosen_point = Some(chosen);
    if !value.is_finite() {
        return Observation::unavailable_with(QueryError::NotANumber(value.to_string()), detail);
    }
    let Some(at) = Timestamp::from_unix_millis_f64(ms) else {
        return Observation::unavailable_with(
            QueryError::Protocol(format!("point time {ms} is not a time from 1970 to 9999")),
            detail,
        );
    };
    let age = now.since(at);
    if age > max_age {
        return Observation::unavailable_with(
            QueryError::Stale { age_seconds: age.as_secs(), max_age_seconds: max_age.as_secs() },
            detail,
        );
    }
    Observation::value(value, at, detail)
}

/// A short, human text for a failed answer: the JSON `errors`/`error` when there are some,
/// else the status and a plain-text body if it is short. HTML pages are not quoted.
pub fn error_text(status: u16, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        errors: Option<Vec<serde_json::Value>>,
        error: Option<String>,
    }
    let from_json = serde_json::from_slice::<ErrorBody>(body).ok().and_then(|b| {
        let mut texts: Vec<String> = b
            .errors
            .unwrap_or_default()
            .into_iter()
            .map(|e| match e {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            })
            .collect();
        texts.extend(b.error);
        texts.retain(|t| !t.trim().is_empty());
        (!texts.is_empty()).then(|| texts.join("; "))
    });
    match from_json {
        Some(text) => truncate(&format!("HTTP {status}: {text}")),
        None => format!("HTTP {status}{}", snippet(body)),
    }
}

/// `: <body>` for a short plain-text body, nothing for HTML, binary or long bodies.
fn snippet(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(text) => {
            let text = text.trim();
            if text.is_empty() || text.starts_with('<') || text.len() > MAX_ERROR_TEXT {
                String::new()
            } else {
                format!(": {text}")
            }
        }
        Err(_) => String::new(),
    }
}

fn truncate(text: &str) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_string();
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::Reading;

    fn cx(queries: usize, now_ms: i64) -> V1Context<'static> {
        V1Context {
            queries,
            layout: &[],
            now: Timestamp::from_unix_millis(now_ms),
            max_age: None,
            site: "datadoghq.com",
        }
    }

    fn read(status: u16, body: &str, cx: &V1Context<'_>) -> V1Answer {
        read_v1_answer(status, &RateLimitHeaders::default(), body.as_bytes(), cx)
    }

    #[test]
    fn the_penultimate_non_null_point_is_chosen_with_its_time() {
        let body = r#"{"status":"ok","series":[{"query_index":0,"interval":30,
            "pointlist":[[1000000,1.0],[1030000,null],[1060000,2.0],[1090000,3.0],[1120000,null]]}]}"#;
        let V1Answer::Answered(obs) = read(200, body, &cx(1, 1_150_000)) else { panic!() };
        assert_eq!(obs[0].reading, Reading::Value { value: 2.0, at: Timestamp::from_unix_millis(1_060_000) });
        assert_eq!(obs[0].detail.points, Some(3));
        assert_eq!(obs[0].detail.chosen_point, Some(1));
        assert_eq!(obs[0].detail.interval_seconds, Some(30));
    }

    #[test]
    fn batched_answers_map_by_query_index() {
        let body = r#"{"status":"ok","series":[
            {"query_index":2,"interval":1,"pointlist":[[1000,7.0]]},
            {"query_index":0,"interval":1,"pointlist":[[1000,null]]},
            {"query_index":2,"interval":1,"pointlist":[[1000,8.0]]}]}"#;
        let V1Answer::Answered(obs) = read(200, body, &cx(3, 2000)) else { panic!() };
        assert!(matches!(obs[0].detail.error, Some(QueryError::NoData(_))));
        assert!(matches!(obs[1].detail.error, Some(QueryError::NoData(_))));
        assert_eq!(obs[1].detail.series, Some(0));
        assert_eq!(obs[2].detail.error, Some(QueryError::SeveralSeries { count: 2 }));
        let out_of_range = r#"{"status":"ok","series":[{"query_index":5,"pointlist":[]}]}"#;
        assert!(matches!(
            read(200, out_of_range, &cx(3, 0)),
            V1Answer::Failed { outcome: RequestOutcome::Protocol, .. }
        ));
    }

    #[test]
    fn statuses_and_bodies_are_classified_without_assuming_json() {
        let c = cx(2, 0);
        let failed = |status, body: &str| match read(status, body, &c) {
            V1Answer::Failed { error, outcome, retryable } => (error, outcome, retryable),
            V1Answer::Answered(_) => panic!("answered"),
        };
        assert!(matches!(failed(200, "<html>oops</html>"), (QueryError::Protocol(_), RequestOutcome::Protocol, false)));
        assert_eq!(
            failed(200, r#"{"status":"error","error":"Internal error while running the query"}"#),
            (
                QueryError::Server("HTTP 200 with status \"error\": Internal error while running the query".into()),
                RequestOutcome::ServerError,
                false
            ),
            "a 200 with status error is the server failing, not the query being bad"
        );
        assert_eq!(
            failed(400, r#"{"errors":["Error parsing query: x"]}"#).0,
            QueryError::BadQuery("HTTP 400: Error parsing query: x".into())
        );
        assert!(matches!(failed(422, "nope"), (QueryError::NoData(_), RequestOutcome::NoData, false)));
        assert!(
            matches!(failed(502, "<html>bad gateway</html>"), (QueryError::Server(m), RequestOutcome::ServerError, true) if m == "HTTP 502")
        );
        let rate = RateLimitHeaders { reset: Some(42), ..RateLimitHeaders::default() };
        assert!(matches!(
            read_v1_answer(429, &rate, b"<html>Too many</html>", &c),
            V1Answer::Failed { error: QueryError::RateLimited { reset_in_seconds: 42 }, .. }
        ));
        assert_eq!(rate_limit_wait(&RateLimitHeaders::default()), FALLBACK_RATE_LIMIT_WAIT);
        assert_eq!(
            rate_limit_wait(&RateLimitHeaders { period: Some(10), ..RateLimitHeaders::default() }).as_secs(),
            10
        );
    }

    #[test]
    fn staleness_uses_the_rollup_or_the_configured_bound() {
        assert_eq!(default_max_age(Some(30)), Duration::from_secs(120));
        assert_eq!(default_max_age(Some(60)), Duration::from_secs(180));
        assert_eq!(default_max_age(None), Duration::from_secs(120));
        let body = r#"{"status":"ok","series":[{"query_index":0,"interval":60,"pointlist":[[0,1.0],[60000,2.0]]}]}"#;
        let V1Answer::Answered(obs) = read(200, body, &cx(1, 180_000)) else { panic!() };
        assert_eq!(obs[0].reading, Reading::Value { value: 1.0, at: Timestamp::from_unix_millis(0) });
        let V1Answer::Answered(obs) = read(200, body, &cx(1, 181_000)) else { panic!() };
        assert_eq!(obs[0].detail.error, Some(QueryError::Stale { age_seconds: 181, max_age_seconds: 180 }));
        let strict = V1Context { max_age: Some(Duration::from_secs(10)), ..cx(1, 11_000) };
        let V1Answer::Answered(obs) = read(200, body, &strict) else { panic!() };
        assert_eq!(obs[0].detail.error, Some(QueryError::Stale { age_seconds: 11, max_age_seconds: 10 }));
    }

    #[test]
    fn non_finite_values_are_not_numbers() {
        let detail = ObservationDetail::default();
        let buckets = Buckets { interval_ms: Some(1.0), window_end_ms: 10.0, last_ms: Some(2.0) };
        let at = Timestamp::from_unix_millis(10);
        let two = PointSummary {
            non_null: 2,
            previous: Some((0.0, f64::NAN)),
            last: Some((1.0, 1.0)),
            ..PointSummary::default()
        };
        let obs = choose(&two, buckets, detail.clone(), at, MIN_MAX_AGE);
        assert_eq!(obs.detail.error, Some(QueryError::NotANumber("NaN".into())));
        let one = PointSummary { non_null: 1, last: Some((0.0, f64::INFINITY)), ..PointSummary::default() };
        let obs = choose(&one, buckets, detail, at, MIN_MAX_AGE);
        assert_eq!(obs.detail.error, Some(QueryError::NotANumber("inf".into())));
    }

    #[test]
    fn a_lone_point_in_the_newest_bucket_is_not_used() {
        // Window end 1,150 s, 30 s buckets: the bucket at 1,140 s is still filling, the one at
        // 1,110 s ended at 1,140 s.
        let answer = |points: &str| {
            let body =
                format!(r#"{{"status":"ok","series":[{{"query_index":0,"interval":30,"pointlist":[{points}]}}]}}"#);
            let V1Answer::Answered(mut obs) = read(200, &body, &cx(1, 1_150_000)) else { panic!() };
            obs.remove(0)
        };
        let newest = answer("[1080000,null],[1110000,null],[1140000,5.0]");
        assert!(
            matches!(&newest.detail.error, Some(QueryError::NoData(m)) if m.contains("newest bucket")),
            "{newest:?}"
        );
        assert_eq!(newest.detail.points, Some(1));
        // The same lone point when its bucket is complete (the series' last bucket is null).
        let complete = answer("[1080000,null],[1110000,5.0],[1140000,null]");
        assert_eq!(complete.reading, Reading::Value { value: 5.0, at: Timestamp::from_unix_millis(1_110_000) });
        // A series that ends before the window does: its last bucket is complete too.
        let early = answer("[1050000,null],[1080000,7.0]");
        assert_eq!(early.reading, Reading::Value { value: 7.0, at: Timestamp::from_unix_millis(1_080_000) });
        // Two points: the penultimate one, as before, even when the newest bucket has a value.
        let two = answer("[1110000,4.0],[1140000,5.0]");
        assert_eq!(two.reading, Reading::Value { value: 4.0, at: Timestamp::from_unix_millis(1_110_000) });
        // Without an interval, the newest bucket is the series' last one.
        let body = r#"{"status":"ok","series":[{"query_index":0,"pointlist":[[1110000,null],[1140000,5.0]]}]}"#;
        let V1Answer::Answered(obs) = read(200, body, &cx(1, 1_150_000)) else { panic!() };
        assert!(matches!(&obs[0].detail.error, Some(QueryError::NoData(_))), "{obs:?}");
    }

    #[test]
    fn a_token_that_is_not_a_number_spoils_only_its_own_series() {
        for token in ["NaN", "Infinity", "-Infinity", "1e999", "-1E+400", "123456789e999"] {
            let body = format!(
                r#"{{"status":"ok","message":"NaN is fine in a string, \"Infinity\" too","series":[
                {{"query_index":0,"interval":30,"pointlist":[[1080000,1.0],[1110000,2.0],[1140000,null]]}},
                {{"query_index":1,"interval":30,"pointlist":[[1080000,{token}],[1110000,3.0],[1140000,null]]}},
                {{"query_index":2,"interval":30,"pointlist":[[1080000,4.5e2],[1110000,-0.25],[1140000,1e308]]}}]}}"#
            );
            let V1Answer::Answered(obs) = read(200, &body, &cx(3, 1_150_000)) else { panic!("{token}: not answered") };
            assert_eq!(obs[0].reading, Reading::Value { value: 1.0, at: Timestamp::from_unix_millis(1_080_000) });
            assert_eq!(obs[1].detail.error, Some(QueryError::NotANumber(token.to_string())), "{token}");
            assert!(matches!(obs[1].reading, Reading::Unavailable { .. }));
            assert_eq!(obs[2].reading, Reading::Value { value: -0.25, at: Timestamp::from_unix_millis(1_110_000) });
        }
    }

    #[test]
    fn marking_keeps_everything_else_byte_for_byte() {
        let clean = br#"{"a":[1,-2.5e3,null,true,false],"s":"NaN \" Infinity 1e999"}"#;
        assert_eq!(series::mark_non_numbers(clean), None, "nothing to replace: no copy");
        let marked = series::mark_non_numbers(br#"[NaN,-Infinity,1e999,"1e999",2]"#).unwrap();
        assert_eq!(
            String::from_utf8(marked).unwrap(),
            r#"["\u0000watermarkd-not-a-number:NaN","\u0000watermarkd-not-a-number:-Infinity","\u0000watermarkd-not-a-number:1e999","1e999",2]"#
        );
        // A series that cannot be read at all fails its own query only.
        let body = r#"{"status":"ok","series":[{"query_index":0,"pointlist":"oops"},
            {"query_index":1,"interval":30,"pointlist":[[1080000,1.0],[1110000,2.0]]}]}"#;
        let V1Answer::Answered(obs) = read(200, body, &cx(2, 1_150_000)) else { panic!() };
        assert!(matches!(obs[0].detail.error, Some(QueryError::Protocol(_))), "{obs:?}");
        assert_eq!(obs[1].reading, Reading::Value { value: 1.0, at: Timestamp::from_unix_millis(1_080_000) });
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let long = "é".repeat(400);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_ERROR_TEXT + 3);
        assert!(cut.ends_with("..."));
    }
}
