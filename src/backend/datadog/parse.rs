//! Reading Datadog's answers: v1 `/api/v1/query` (what `evaluate` uses) and the v2
//! `/api/v2/query/timeseries` and `/api/v2/query/scalar` bodies.
//!
//! Everything here is pure (status, headers, body in; observations out), so the recorded
//! fixtures exercise exactly the code the client runs. Bodies are never assumed to be JSON on
//! a non-2xx status: a 429 from Datadog's edge is an HTML page, a 502 from a proxy is anything.

use std::time::Duration;

use serde::Deserialize;
use watermarkd_engine::Timestamp;

use super::pacing::RateLimitHeaders;
use crate::backend::{Observation, ObservationDetail, QueryError};

/// The floor of the default staleness bound, as the Cluster Agent.
const MIN_MAX_AGE: Duration = Duration::from_secs(120);
/// Default staleness bound, in rollup intervals.
const MAX_AGE_ROLLUPS: u32 = 3;
/// Longest server-provided text kept in an error message.
const MAX_ERROR_TEXT: usize = 300;
/// Used for the 429 wait when the answer says nothing about its reset or period.
pub(crate) const FALLBACK_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// How one HTTP request ended, as the `outcome` label of `metrics.requests`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
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

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::BadQuery => "bad_query",
            Outcome::Forbidden => "forbidden",
            Outcome::NoData => "no_data",
            Outcome::RateLimited => "rate_limited",
            Outcome::ServerError => "server_error",
            Outcome::Timeout => "timeout",
            Outcome::Transport => "transport",
            Outcome::Protocol => "protocol",
        }
    }
}

/// What one v1 answer means for the sub-queries of its request.
#[derive(Clone, Debug, PartialEq)]
pub enum V1Answer {
    /// HTTP 200, `status: ok`: one observation per sub-query, in `query_index` order.
    Answered(Vec<Observation>),
    /// The whole request failed the same way for every sub-query.
    Failed {
        error: QueryError,
        outcome: Outcome,
        /// Worth another attempt in this cycle (5xx); never for 4xx.
        retryable: bool,
    },
}

/// What `read_v1_answer` needs besides the answer itself.
#[derive(Clone, Debug)]
pub struct V1Context<'a> {
    /// Sub-queries in the request (comma-joined).
    pub queries: usize,
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
        400 => failed(QueryError::BadQuery(error_text(status, body)), Outcome::BadQuery, false),
        401 | 403 => {
            failed(QueryError::Configuration(forbidden_advice(status, body, cx.site)), Outcome::Forbidden, false)
        }
        422 => failed(QueryError::NoData(error_text(status, body)), Outcome::NoData, false),
        429 => {
            let wait = rate_limit_wait(rate);
            failed(QueryError::RateLimited { reset_in_seconds: wait.as_secs() }, Outcome::RateLimited, false)
        }
        // 408: the server gave up waiting for us; like a 5xx, another attempt may work.
        408 | 500..=599 => failed(QueryError::Server(error_text(status, body)), Outcome::ServerError, true),
        404 => failed(
            QueryError::Configuration(format!(
                "{} from {}: is the site or url right? The query API lives at /api/v1/query",
                error_text(status, body),
                cx.site
            )),
            Outcome::Protocol,
            false,
        ),
        _ => failed(QueryError::Protocol(error_text(status, body)), Outcome::Protocol, false),
    }
}

/// How long to send nothing after a 429: its `X-RateLimit-Reset`, else its period, else 60 s.
pub fn rate_limit_wait(rate: &RateLimitHeaders) -> Duration {
    rate.reset.or(rate.period).map(Duration::from_secs).unwrap_or(FALLBACK_RATE_LIMIT_WAIT)
}

fn forbidden_advice(status: u16, body: &[u8], site: &str) -> String {
    format!(
        "Datadog refused the credentials ({}): check that the API key is valid, that the application key \
         exists and has the `timeseries_query` scope, and that both keys belong to the organisation on {site} \
         (keys only work on their own site)",
        error_text(status, body)
    )
}

#[derive(Deserialize)]
struct V1Body {
    status: Option<String>,
    error: Option<String>,
    series: Option<Vec<V1Series>>,
}

/// One series of a v1 answer; fields we do not use are ignored.
#[derive(Deserialize)]
struct V1Series {
    query_index: Option<usize>,
    /// Seconds; observed as an integer, accepted as any number.
    interval: Option<f64>,
    /// `[ms, value|null]`; ms may be written as an integer or a float.
    pointlist: Vec<(f64, Option<f64>)>,
}

fn read_v1_ok(body: &[u8], cx: &V1Context<'_>) -> V1Answer {
    let protocol = |message: String| V1Answer::Failed {
        error: QueryError::Protocol(message),
        outcome: Outcome::Protocol,
        retryable: false,
    };
    let parsed: V1Body = match serde_json::from_slice(body) {
        Ok(parsed) => parsed,
        Err(err) => {
            return protocol(format!("HTTP 200 with a body that is not a v1 query answer ({err}){}", snippet(body)))
        }
    };
    if parsed.status.as_deref() == Some("error") {
        let text = parsed.error.filter(|e| !e.trim().is_empty()).unwrap_or_else(|| "status \"error\"".to_string());
        return V1Answer::Failed {
            error: QueryError::BadQuery(truncate(&text)),
            outcome: Outcome::BadQuery,
            retryable: false,
        };
    }
    let Some(series) = parsed.series else { return protocol("HTTP 200 without `series`".to_string()) };
    // Per sub-query, its series. A series without `query_index` can only belong to a lone query.
    let mut by_index: Vec<Vec<&V1Series>> = (0..cx.queries).map(|_| Vec::new()).collect();
    for s in &series {
        let index = match (s.query_index, cx.queries) {
            (Some(i), _) => i,
            (None, 1) => 0,
            (None, _) => return protocol("a series without `query_index` in a batched answer".to_string()),
        };
        match by_index.get_mut(index) {
            Some(slot) => slot.push(s),
            None => {
                return protocol(format!("a series with query_index {index} for a request of {} queries", cx.queries))
            }
        }
    }
    V1Answer::Answered(by_index.iter().map(|found| observe_v1(found, cx)).collect())
}

/// An autoscaler query must resolve to exactly one series; none is "no data", several an error.
/// The error keeps the series count for the observation's detail.
fn exactly_one<T>(found: &[T]) -> Result<&T, (QueryError, usize)> {
    match found {
        [one] => Ok(one),
        [] => Err((QueryError::NoData("no series in the query window".into()), 0)),
        several => Err((QueryError::SeveralSeries { count: several.len() }, several.len())),
    }
}

fn not_one_series((error, series): (QueryError, usize)) -> Observation {
    Observation::unavailable_with(error, ObservationDetail { series: Some(series), ..ObservationDetail::default() })
}

fn observe_v1(found: &[&V1Series], cx: &V1Context<'_>) -> Observation {
    let series = match exactly_one(found) {
        Ok(series) => series,
        Err(why) => return not_one_series(why),
    };
    let interval_seconds = series.interval.filter(|i| i.is_finite() && *i >= 0.0).map(|i| i.round() as u64);
    let max_age = cx.max_age.unwrap_or_else(|| default_max_age(interval_seconds));
    let points: Vec<(f64, f64)> = series.pointlist.iter().filter_map(|&(t, v)| v.map(|v| (t, v))).collect();
    let detail = ObservationDetail { series: Some(1), interval_seconds, ..ObservationDetail::default() };
    choose(&points, detail, cx.now, max_age)
}

/// `max(120s, 3 x rollup)`: a value older than three buckets means the metric stopped
/// reporting, whatever its resolution.
pub fn default_max_age(interval_seconds: Option<u64>) -> Duration {
    let rollups = Duration::from_secs(interval_seconds.unwrap_or(0)).saturating_mul(MAX_AGE_ROLLUPS);
    rollups.max(MIN_MAX_AGE)
}

/// Which non-null point an autoscaler uses: the penultimate one, because the newest bucket may
/// still be filling (a partial sum or average would scale on a fraction of the traffic); the
/// only one when there is one. Returns its position among the non-null points.
pub fn penultimate(non_null: usize) -> Option<usize> {
    match non_null {
        0 => None,
        1 => Some(0),
        n => Some(n - 2),
    }
}

/// From the non-null `(ms, value)` points of the one series: the chosen value, or why not.
fn choose(points: &[(f64, f64)], mut detail: ObservationDetail, now: Timestamp, max_age: Duration) -> Observation {
    detail.points = Some(points.len());
    let Some(chosen) = penultimate(points.len()) else {
        return Observation::unavailable_with(QueryError::NoData("every point in the window is null".into()), detail);
    };
    detail.chosen_point = Some(chosen);
    let (ms, value) = points[chosen];
    if !value.is_finite() {
        return Observation::unavailable_with(QueryError::NotANumber(value.to_string()), detail);
    }
    if !ms.is_finite() || ms.abs() >= 9.0e15 {
        return Observation::unavailable_with(QueryError::Protocol(format!("point time {ms} is not a time")), detail);
    }
    let at = Timestamp::from_unix_millis(ms.round() as i64);
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

// ---------------------------------------------------------------------------------------------
// v2: JSON:API bodies of /api/v2/query/timeseries and /api/v2/query/scalar.

/// A parsed `timeseries_response`.
#[derive(Clone, Debug, PartialEq)]
pub struct V2Timeseries {
    pub series: Vec<V2Series>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct V2Series {
    pub query_index: Option<usize>,
    pub group_tags: Vec<String>,
    /// The unit's name (`percent`), when Datadog knows it.
    pub unit: Option<String>,
    /// `(time, value)`, in answer order; `None` is a null bucket.
    pub points: Vec<(Timestamp, Option<f64>)>,
}

/// A parsed `scalar_response`.
#[derive(Clone, Debug, PartialEq)]
pub struct V2Scalar {
    pub columns: Vec<V2Column>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct V2Column {
    pub name: String,
    pub values: Vec<Option<f64>>,
    pub unit: Option<String>,
}

#[derive(Deserialize)]
struct V2Envelope<A> {
    data: V2Data<A>,
}

#[derive(Deserialize)]
struct V2Data<A> {
    attributes: A,
}

#[derive(Deserialize)]
struct V2TimeseriesAttributes {
    #[serde(default)]
    series: Vec<V2SeriesMeta>,
    #[serde(default)]
    times: Vec<f64>,
    #[serde(default)]
    values: Vec<Vec<Option<f64>>>,
}

#[derive(Deserialize)]
struct V2SeriesMeta {
    query_index: Option<usize>,
    #[serde(default)]
    group_tags: Vec<String>,
    unit: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct V2ScalarAttributes {
    #[serde(default)]
    columns: Vec<V2ColumnBody>,
}

#[derive(Deserialize)]
struct V2ColumnBody {
    #[serde(default)]
    name: String,
    #[serde(default)]
    values: Vec<Option<f64>>,
    meta: Option<V2ColumnMeta>,
}

#[derive(Deserialize)]
struct V2ColumnMeta {
    unit: Option<serde_json::Value>,
}

/// `unit` is `null` or `[unit, per_unit]`, each an object with a `name` or `null`.
fn unit_name(unit: Option<&serde_json::Value>) -> Option<String> {
    let first = match unit? {
        serde_json::Value::Array(parts) => parts.first()?,
        other => other,
    };
    first.get("name")?.as_str().map(str::to_string)
}

/// Parses a 200 body of `POST /api/v2/query/timeseries`.
pub fn parse_v2_timeseries(body: &[u8]) -> Result<V2Timeseries, QueryError> {
    let parsed: V2Envelope<V2TimeseriesAttributes> = serde_json::from_slice(body)
        .map_err(|err| QueryError::Protocol(format!("not a v2 timeseries answer ({err}){}", snippet(body))))?;
    let attributes = parsed.data.attributes;
    let mut times = Vec::with_capacity(attributes.times.len());
    for ms in &attributes.times {
        if !ms.is_finite() || ms.abs() >= 9.0e15 {
            return Err(QueryError::Protocol(format!("time {ms} is not a time")));
        }
        times.push(Timestamp::from_unix_millis(ms.round() as i64));
    }
    if attributes.values.len() != attributes.series.len() {
        return Err(QueryError::Protocol(format!(
            "{} value lists for {} series",
            attributes.values.len(),
            attributes.series.len()
        )));
    }
    let mut series = Vec::with_capacity(attributes.series.len());
    for (meta, values) in attributes.series.into_iter().zip(attributes.values) {
        if values.len() != times.len() {
            return Err(QueryError::Protocol(format!("{} values for {} times", values.len(), times.len())));
        }
        series.push(V2Series {
            query_index: meta.query_index,
            group_tags: meta.group_tags,
            unit: unit_name(meta.unit.as_ref()),
            points: times.iter().copied().zip(values).collect(),
        });
    }
    Ok(V2Timeseries { series })
}

/// Parses a 200 body of `POST /api/v2/query/scalar`.
pub fn parse_v2_scalar(body: &[u8]) -> Result<V2Scalar, QueryError> {
    let parsed: V2Envelope<V2ScalarAttributes> = serde_json::from_slice(body)
        .map_err(|err| QueryError::Protocol(format!("not a v2 scalar answer ({err}){}", snippet(body))))?;
    let columns = parsed
        .data
        .attributes
        .columns
        .into_iter()
        .map(|c| V2Column {
            name: c.name,
            values: c.values,
            unit: unit_name(c.meta.as_ref().and_then(|m| m.unit.as_ref())),
        })
        .collect();
    Ok(V2Scalar { columns })
}

/// A non-2xx v2 answer as a query error (`{"errors": [...]}` bodies, or anything else).
pub fn read_v2_error(status: u16, rate: &RateLimitHeaders, body: &[u8], site: &str) -> (QueryError, Outcome) {
    let cx = V1Context { queries: 1, now: Timestamp::from_unix_millis(0), max_age: None, site };
    match read_v1_answer(status, rate, body, &cx) {
        V1Answer::Failed { error, outcome, .. } => (error, outcome),
        // Only a 2xx is answered, and callers only come here for other statuses.
        V1Answer::Answered(_) => (QueryError::Protocol(format!("HTTP {status}")), Outcome::Protocol),
    }
}

impl V2Timeseries {
    /// The reading an autoscaler would get: exactly one series, its penultimate non-null point.
    pub fn observation(&self, now: Timestamp, max_age: Duration) -> Observation {
        let series = match exactly_one(&self.series) {
            Ok(series) => series,
            Err(why) => return not_one_series(why),
        };
        let points: Vec<(f64, f64)> =
            series.points.iter().filter_map(|&(t, v)| v.map(|v| (t.unix_millis() as f64, v))).collect();
        choose(&points, ObservationDetail { series: Some(1), ..ObservationDetail::default() }, now, max_age)
    }
}

impl V2Scalar {
    /// The reading of a one-value answer, dated `at` (the query's `to`: a scalar has no time).
    pub fn observation(&self, at: Timestamp) -> Observation {
        let values: Vec<f64> = self.columns.iter().flat_map(|c| c.values.iter().flatten().copied()).collect();
        let detail = ObservationDetail { series: Some(values.len()), ..ObservationDetail::default() };
        match values.as_slice() {
            [] => Observation::unavailable_with(QueryError::NoData("the scalar answer has no value".into()), detail),
            [value] if !value.is_finite() => {
                Observation::unavailable_with(QueryError::NotANumber(value.to_string()), detail)
            }
            [value] => Observation::value(*value, at, detail),
            several => Observation::unavailable_with(QueryError::SeveralSeries { count: several.len() }, detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::Reading;

    fn cx(queries: usize, now_ms: i64) -> V1Context<'static> {
        V1Context { queries, now: Timestamp::from_unix_millis(now_ms), max_age: None, site: "datadoghq.com" }
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
        assert!(matches!(read(200, out_of_range, &cx(3, 0)), V1Answer::Failed { outcome: Outcome::Protocol, .. }));
    }

    #[test]
    fn statuses_and_bodies_are_classified_without_assuming_json() {
        let c = cx(2, 0);
        let failed = |status, body: &str| match read(status, body, &c) {
            V1Answer::Failed { error, outcome, retryable } => (error, outcome, retryable),
            V1Answer::Answered(_) => panic!("answered"),
        };
        assert!(matches!(failed(200, "<html>oops</html>"), (QueryError::Protocol(_), Outcome::Protocol, false)));
        assert_eq!(
            failed(200, r#"{"status":"error","error":"Error parsing query"}"#),
            (QueryError::BadQuery("Error parsing query".into()), Outcome::BadQuery, false)
        );
        assert_eq!(
            failed(400, r#"{"errors":["Error parsing query: x"]}"#).0,
            QueryError::BadQuery("HTTP 400: Error parsing query: x".into())
        );
        assert!(matches!(failed(422, "nope"), (QueryError::NoData(_), Outcome::NoData, false)));
        assert!(
            matches!(failed(502, "<html>bad gateway</html>"), (QueryError::Server(m), Outcome::ServerError, true) if m == "HTTP 502")
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
        let obs = choose(&[(0.0, f64::NAN), (1.0, 1.0)], detail.clone(), Timestamp::from_unix_millis(1), MIN_MAX_AGE);
        assert_eq!(obs.detail.error, Some(QueryError::NotANumber("NaN".into())));
        let obs = choose(&[(0.0, f64::INFINITY)], detail, Timestamp::from_unix_millis(1), MIN_MAX_AGE);
        assert_eq!(obs.detail.error, Some(QueryError::NotANumber("inf".into())));
    }

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let long = "é".repeat(400);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_ERROR_TEXT + 3);
        assert!(cut.ends_with("..."));
    }
}
