//! Prometheus' HTTP API answers: from a status code and a body to a parsed answer or a failure;
//! from a parsed answer to one `Observation` per metric query is `observation.rs`.
//!
//! Pure functions over bytes, so that every quirk is covered by unit tests without a server.

mod observation;

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::sample_time;
use crate::adapters::backend::QueryError;
pub(super) use observation::{observe, observe_steps, series_count};

/// A `"status": "success"` answer, reduced to what an autoscaler can use.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Answer {
    pub result: QueryResult,
    /// `warnings`, then `infos` (prefixed `info: `), in the order the server sent them.
    pub warnings: Vec<String>,
    /// The server says the answer lacks data (see [`partial_reason`]), and why.
    pub partial: Option<String>,
    /// The samples of the series tagged `watermarkd_sample="time"` (see `sample_time`): their
    /// values are the times of the data behind the answer's value. Empty when not asked for.
    pub sample_times: Vec<Sample>,
    /// For a folded query's answer (see `fold`): the value of its fold label on each series.
    pub fold_values: FoldValues,
}

/// The value of a folded query's label on each series of its answer, in the answer's order:
/// what maps each series back to its member. Empty for any other answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct FoldValues {
    /// One per sample of the `Vector` result.
    samples: Vec<Option<String>>,
    /// One per sample time.
    times: Vec<Option<String>>,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum QueryResult {
    /// One sample per series.
    Vector(Vec<Sample>),
    Scalar(Sample),
    /// A range query's answer: each series' samples, in time order.
    Matrix(Vec<Vec<Sample>>),
    /// `string`: a valid answer, but not a value an autoscaler can use.
    Unusable(String),
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Sample {
    /// `[seconds, "value"]`. The value stays a string until it is used, so that `NaN` or `+Inf`
    /// can be named as the server spelled it.
    Float { at_seconds: f64, value: String },
    /// A native histogram sample (`"histogram"` instead of `"value"`): not one number.
    Histogram,
}

/// Why one HTTP attempt failed, with what the metrics and the retry loop need to know.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Failure {
    pub error: QueryError,
    /// The `outcome` label of `watermarkd_backend_requests_total`.
    pub outcome: &'static str,
    /// Worth another attempt within this cycle (5xx, timeouts, connection problems).
    pub retry: bool,
}

impl Failure {
    pub fn new(error: QueryError, outcome: &'static str, retry: bool) -> Self {
        Failure { error, outcome, retry }
    }

    /// Whether the members of a folded query that failed so might not fail alone: what depends
    /// on the query's form or weight (malformed, a series or sample limit met while running it,
    /// a server error or a timeout on a query N times heavier, an answer too large or not
    /// understood), as opposed to what any request meets (credentials, the URL, a refused
    /// connection, a rate limit).
    pub fn may_be_the_folds(&self) -> bool {
        match self.error {
            QueryError::BadQuery(_) | QueryError::Timeout(_) | QueryError::Protocol(_) => true,
            QueryError::Server(_) => self.outcome != "rate_limited",
            _ => false,
        }
    }

    fn bad_query(message: String) -> Self {
        Failure::new(QueryError::BadQuery(message), "bad_query", false)
    }

    fn server(message: String) -> Self {
        Failure::new(QueryError::Server(message), "server_error", true)
    }

    fn protocol(message: String) -> Self {
        Failure::new(QueryError::Protocol(message), "protocol", false)
    }
}

/// The body as Prometheus (and Thanos, Mimir, VictoriaMetrics) shape it. Every field is
/// optional: error answers carry only some of them, and proxies may send none.
#[derive(Deserialize)]
struct Body<'a> {
    status: Option<String>,
    #[serde(borrow)]
    data: Option<Data<'a>>,
    #[serde(rename = "errorType")]
    error_type: Option<String>,
    error: Option<String>,
    warnings: Option<Vec<String>>,
    infos: Option<Vec<String>>,
    /// VictoriaMetrics (cluster) sets it when a storage node did not answer.
    #[serde(rename = "isPartial")]
    is_partial: Option<bool>,
}

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(rename = "resultType")]
    result_type: String,
    /// Kept as written, in the body, until `result_type` says how to read it (it may come
    /// first): never as a JSON tree, which costs several times the body.
    #[serde(borrow)]
    result: &'a RawValue,
}

#[derive(Deserialize)]
struct MatrixEntry {
    metric: Option<Labels>,
    values: Option<Vec<(f64, String)>>,
    histograms: Option<IgnoredAny>,
}

/// The one label of a series this client reads.
#[derive(Deserialize)]
struct Labels {
    #[serde(rename = "watermarkd_sample")]
    sample: Option<String>,
}

/// A vector's samples, read one at a time into what an `Answer` keeps: the sample, whether it
/// is a data time (`sample_time`), and for a folded query its value of the fold label.
struct VectorSeed<'l> {
    fold_label: Option<&'l str>,
}

/// What a vector holds, as an `Answer` keeps it.
#[derive(Default)]
struct VectorRead {
    samples: Vec<Sample>,
    sample_times: Vec<Sample>,
    fold_values: FoldValues,
    /// A sample had neither a value nor a histogram.
    without_value: bool,
}

impl<'de> DeserializeSeed<'de> for VectorSeed<'_> {
    type Value = VectorRead;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<VectorRead, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for VectorSeed<'_> {
    type Value = VectorRead;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of samples")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<VectorRead, A::Error> {
        let mut read = VectorRead::default();
        while let Some(entry) = seq.next_element_seed(EntrySeed { fold_label: self.fold_label })? {
            let sample = match (entry.value, entry.histogram) {
                (Some((at_seconds, value)), _) => Sample::Float { at_seconds, value },
                (None, Some(_)) => Sample::Histogram,
                (None, None) => {
                    read.without_value = true;
                    continue;
                }
            };
            let is_time = entry.labels.sample.as_deref() == Some(sample_time::TIME);
            if self.fold_label.is_some() {
                let values = &mut read.fold_values;
                if is_time { &mut values.times } else { &mut values.samples }.push(entry.labels.fold);
            }
            if is_time { &mut read.sample_times } else { &mut read.samples }.push(sample);
        }
        Ok(read)
    }
}

/// One sample of a vector: `{"metric": {...}, "value": [t, "v"]}` or `"histogram"`.
struct EntrySeed<'l> {
    fold_label: Option<&'l str>,
}

struct Entry {
    labels: PickedLabels,
    value: Option<(f64, String)>,
    histogram: Option<IgnoredAny>,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_> {
    type Value = Entry;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Entry, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_> {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sample")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        let mut entry = Entry { labels: PickedLabels::default(), value: None, histogram: None };
        // A key written twice counts as the last one.
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "metric" => {
                    entry.labels = map.next_value_seed(LabelsSeed { fold_label: self.fold_label })?.unwrap_or_default();
                }
                "value" => entry.value = map.next_value()?,
                "histogram" => entry.histogram = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(entry)
    }
}

/// Of a series' labels, the two this client reads (when they are strings): `watermarkd_sample`
/// and a folded query's label.
#[derive(Default)]
struct PickedLabels {
    sample: Option<String>,
    fold: Option<String>,
}

struct LabelsSeed<'l> {
    fold_label: Option<&'l str>,
}

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = Option<PickedLabels>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = Option<PickedLabels>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a series' labels")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut labels = PickedLabels::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let slot = if key == sample_time::LABEL {
                &mut labels.sample
            } else if Some(key.as_ref()) == self.fold_label {
                &mut labels.fold
            } else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            *slot = map.next_value::<LabelValue>()?.0;
        }
        Ok(Some(labels))
    }
}

/// A label's value when it is a string; anything else reads as none.
struct LabelValue(Option<String>);

impl<'de> Deserialize<'de> for LabelValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LabelValueVisitor)
    }
}

struct LabelValueVisitor;

impl<'de> Visitor<'de> for LabelValueVisitor {
    type Value = LabelValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a label value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<LabelValue, E> {
        Ok(LabelValue(Some(v.to_string())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<LabelValue, E> {
        Ok(LabelValue(Some(v)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<LabelValue, E> {
        Ok(LabelValue(None))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<LabelValue, E> {
        Ok(LabelValue(None))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<LabelValue, E> {
        Ok(LabelValue(None))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<LabelValue, E> {
        Ok(LabelValue(None))
    }

    fn visit_unit<E: de::Error>(self) -> Result<LabelValue, E> {
        Ok(LabelValue(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LabelValue, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LabelValue(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LabelValue, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LabelValue(None))
    }
}

/// `result` read as `T` (`what` names it in the error).
fn read_result<'a, T>(
    result: &'a RawValue,
    what: &str,
    read: impl FnOnce(&mut serde_json::Deserializer<serde_json::de::StrRead<'a>>) -> Result<T, serde_json::Error>,
) -> Result<T, Failure> {
    let mut deserializer = serde_json::Deserializer::from_str(result.get());
    read(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|e| Failure::protocol(format!("malformed {what} result: {e}")))
}

const HISTOGRAM: &str = "the query returns native histogram samples, not numbers: wrap it in a function that \
    yields a float, such as histogram_quantile(), histogram_sum() or histogram_count()";

/// Turns one HTTP answer into an `Answer` or a `Failure`. Never assumes the body is JSON: a
/// proxy, or Prometheus itself while starting or stopping, answers in plain text. For a folded
/// query, each series' value of its `fold_label` is kept, to map it back to its member
/// (`Answer::split`).
pub(super) fn classify(status: u16, body: &[u8], endpoint: &str, fold_label: Option<&str>) -> Result<Answer, Failure> {
    let parsed: Option<Body<'_>> = serde_json::from_slice(body).ok();
    match status {
        200..=299 => match parsed {
            Some(b) if b.status.as_deref() == Some("success") => success(b, fold_label),
            Some(b) if b.status.as_deref() == Some("error") => Err(error_in_success(status, b)),
            _ => {
                Err(Failure::protocol(format!("HTTP {status} with a body that is not Prometheus' JSON{}", said(body))))
            }
        },
        401 => Err(Failure::new(
            QueryError::Configuration(format!(
                "HTTP 401 Unauthorized from {endpoint}: check the backend's credentials (basic_auth username and \
                 password, bearer_token){}",
                said(body)
            )),
            "forbidden",
            false,
        )),
        403 => Err(Failure::new(
            QueryError::Configuration(format!(
                "HTTP 403 Forbidden from {endpoint}: check that the credentials may query this server and the \
                 tenant (X-Scope-OrgID) they may read{}",
                said(body)
            )),
            "forbidden",
            false,
        )),
        404 => Err(Failure::new(
            QueryError::Configuration(format!(
                "HTTP 404 Not Found at {endpoint}: check the backend's url and its path prefix (e.g. /prometheus)"
            )),
            "protocol",
            false,
        )),
        // Mimir and Cortex limit queries per tenant. Hammering a limit within the same cycle only
        // digs the hole deeper, so this is not retried here: the next cycle asks again.
        429 => Err(Failure::new(
            QueryError::Server(format!("HTTP 429 Too Many Requests: the server is rate limiting{}", said(body))),
            "rate_limited",
            false,
        )),
        _ => match parsed {
            Some(b) if b.error_type.is_some() || b.error.is_some() => Err(api_error(status, b)),
            _ => Err(by_status(status, body)),
        },
    }
}

/// A 2xx that says `"status": "error"`. Prometheus answers a query it cannot parse with a 400,
/// so an error inside a success status comes from the server side (a proxy or a compatible
/// store answering 200 whatever happened), unless it says `bad_data`: then it is the query.
/// What would be retried with an error status is retried here too; the rest is not, as
/// nothing says another attempt would fare better.
fn error_in_success(status: u16, body: Body<'_>) -> Failure {
    if body.error_type.as_deref() == Some("bad_data") {
        return api_error(status, body);
    }
    let error_type = body.error_type.clone().unwrap_or_default();
    let failure = api_error(status, body);
    match failure.error {
        QueryError::Server(_) => failure,
        QueryError::BadQuery(message) | QueryError::Protocol(message) | QueryError::Configuration(message) => {
            let kind = if error_type.is_empty() { String::new() } else { format!("{error_type}: ") };
            Failure::new(
                QueryError::Server(format!("HTTP {status} with status \"error\": {kind}{message}")),
                "server_error",
                false,
            )
        }
        _ => failure,
    }
}

/// An error answer that says what went wrong in `errorType` and `error`.
fn api_error(status: u16, body: Body<'_>) -> Failure {
    let error_type = body.error_type.unwrap_or_default();
    let message = body.error.filter(|e| !e.trim().is_empty()).unwrap_or_else(|| format!("HTTP {status}"));
    match error_type.as_str() {
        // `execution` errors (many-to-many matching, duplicate label sets, too many samples) come
        // from the query meeting the data: no retry makes them go away, the query must change.
        "bad_data" => Failure::bad_query(message),
        "execution" => Failure::bad_query(message),
        "timeout" => Failure::new(QueryError::Server(format!("timeout: {message}")), "timeout", true),
        "canceled" | "internal" | "unavailable" => Failure::server(format!("{error_type}: {message}")),
        "not_found" => Failure::new(QueryError::Configuration(message), "protocol", false),
        _ => match status {
            400 => Failure::bad_query(message),
            422 => Failure::bad_query(message),
            500..=599 => Failure::server(message),
            _ => Failure::protocol(format!("HTTP {status}, error type {error_type:?}: {message}")),
        },
    }
}

/// An error answer without Prometheus' JSON: judged by its status code alone.
fn by_status(status: u16, body: &[u8]) -> Failure {
    match status {
        400 => Failure::bad_query(format!("HTTP {status}{}", said(body))),
        422 => Failure::bad_query(format!("HTTP {status}{}", said(body))),
        500..=599 => Failure::server(format!("HTTP {status}{}", said(body))),
        _ => Failure::protocol(format!("HTTP {status}{}", said(body))),
    }
}

fn success(body: Body<'_>, fold_label: Option<&str>) -> Result<Answer, Failure> {
    let warnings = body.warnings.unwrap_or_default();
    let infos = body.infos.unwrap_or_default();
    let partial = partial_reason(&warnings, &infos, body.is_partial.unwrap_or(false));
    let warnings = warnings.into_iter().chain(infos.into_iter().map(|i| format!("info: {i}"))).collect();
    let data = body.data.ok_or_else(|| Failure::protocol("a success answer without data".into()))?;
    let mut sample_times = Vec::new();
    let mut fold_values = FoldValues::default();
    let result = match data.result_type.as_str() {
        "vector" => {
            let read = read_result(data.result, "vector", |d| VectorSeed { fold_label }.deserialize(d))?;
            if read.without_value {
                return Err(Failure::protocol("a vector sample without a value".into()));
            }
            sample_times = read.sample_times;
            if fold_label.is_some() {
                fold_values = read.fold_values;
            }
            QueryResult::Vector(read.samples)
        }
        "scalar" => {
            let (at_seconds, value): (f64, String) =
                read_result(data.result, "scalar", |d| Deserialize::deserialize(d))?;
            QueryResult::Scalar(Sample::Float { at_seconds, value })
        }
        "matrix" => {
            let entries: Vec<MatrixEntry> = read_result(data.result, "matrix", |d| Deserialize::deserialize(d))?;
            let mut series = Vec::with_capacity(entries.len());
            for entry in entries {
                let mut samples: Vec<Sample> = entry
                    .values
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(at_seconds, value)| Sample::Float { at_seconds, value })
                    .collect();
                // Histogram samples are not numbers; one stands for all of them.
                if entry.histograms.is_some() {
                    samples.push(Sample::Histogram);
                }
                // The data time at each step, of a dated range query.
                if entry.metric.and_then(|m| m.sample).is_some_and(|s| s == sample_time::TIME) {
                    sample_times.extend(samples);
                } else {
                    series.push(samples);
                }
            }
            QueryResult::Matrix(series)
        }
        "string" => QueryResult::Unusable(data.result_type.clone()),
        other => return Err(Failure::protocol(format!("unknown result type {other:?}"))),
    };
    Ok(Answer { result, warnings, partial, sample_times, fold_values })
}

impl Answer {
    /// A folded query's answer split into what each member's own query would have answered:
    /// for each of `values` (of the fold label), the series and data times labelled with it,
    /// and the answer's warnings. A value without a series gets an empty vector, which is no
    /// data for that member only. Series of other values are not any member's.
    pub fn split<'v>(&self, values: impl IntoIterator<Item = &'v str>) -> Result<HashMap<&'v str, Answer>, QueryError> {
        let QueryResult::Vector(samples) = &self.result else {
            return Err(QueryError::Protocol("the answer to a folded query is not a vector".into()));
        };
        let mut parts: HashMap<&str, (Vec<Sample>, Vec<Sample>)> =
            values.into_iter().map(|value| (value, (Vec::new(), Vec::new()))).collect();
        for (sample, value) in samples.iter().zip(&self.fold_values.samples) {
            if let Some((series, _)) = value.as_deref().and_then(|v| parts.get_mut(v)) {
                series.push(sample.clone());
            }
        }
        for (time, value) in self.sample_times.iter().zip(&self.fold_values.times) {
            if let Some((_, times)) = value.as_deref().and_then(|v| parts.get_mut(v)) {
                times.push(time.clone());
            }
        }
        Ok(parts
            .into_iter()
            .map(|(value, (series, sample_times))| {
                let part = Answer {
                    result: QueryResult::Vector(series),
                    warnings: self.warnings.clone(),
                    partial: self.partial.clone(),
                    sample_times,
                    fold_values: FoldValues::default(),
                };
                (value, part)
            })
            .collect())
    }
}

/// Why the server's own words say the answer lacks data, if they do. A partial answer is a
/// `status: "success"` whose value may be too low (Thanos with partial responses on and a store
/// unreachable, Mimir/Cortex or Prometheus' remote read with a failing source, VictoriaMetrics'
/// `isPartial`), and a scale-down on it removes replicas that are still needed.
///
/// So every warning counts, except PromQL's own annotations ("PromQL warning: ...", "PromQL
/// info: ...", as Prometheus 2.50+ and the stores built on its engine word them): those are about
/// the query and the shape of the data (a counter without `_total`, a mix of histograms and
/// floats), are there on every evaluation, and say nothing about a source that did not answer.
/// Stores word their partial answers freely ("partial response", "store unavailable", an RPC
/// error with an address), so a list of known texts would miss the next one; an unknown warning
/// costs only scale-downs while it lasts, and is logged and counted. `infos` count only when they
/// say "partial": by Prometheus' definition they are hints, not faults.
pub(super) fn partial_reason(warnings: &[String], infos: &[String], is_partial: bool) -> Option<String> {
    let is_annotation = |w: &str| {
        let w = w.trim_start();
        w.starts_with("PromQL warning:") || w.starts_with("PromQL info:")
    };
    let mut reasons: Vec<&str> = warnings.iter().map(String::as_str).filter(|w| !is_annotation(w)).collect();
    reasons.extend(infos.iter().map(String::as_str).filter(|i| i.to_lowercase().contains("partial")));
    let first = match reasons.first() {
        Some(first) => format!("{:?}", one_line(first)),
        None if is_partial => return Some("the server marked its answer as partial (isPartial)".into()),
        None => return None,
    };
    let more = match reasons.len() {
        1 => String::new(),
        n => format!(" and {} more", n - 1),
    };
    Some(format!("the server says its answer is partial: {first}{more}"))
}

/// `text` on one line and cut short: server text goes into reasons and logs.
fn one_line(text: &str) -> String {
    const MAX_CHARS: usize = 200;
    let mut words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((cut, _)) = words.char_indices().nth(MAX_CHARS) {
        words.truncate(cut);
        words.push_str("...");
    }
    words
}

/// `: <what the server said>`, cut short and on one line; empty when it said nothing.
fn said(body: &[u8]) -> String {
    let words = one_line(&String::from_utf8_lossy(body));
    if words.is_empty() {
        return String::new();
    }
    format!(": {words}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use watermarkd_engine::{Reading, Timestamp};

    use super::*;
    use crate::adapters::backend::Observation;
    use crate::domain::rules::Reducer;

    const ENDPOINT: &str = "http://prom:9090/api/v1/query";

    fn ok(body: &str) -> Answer {
        classify(200, body.as_bytes(), ENDPOINT, None).unwrap()
    }

    fn fail(status: u16, body: &str) -> Failure {
        classify(status, body.as_bytes(), ENDPOINT, None).unwrap_err()
    }

    fn vector_body(values: &[(f64, &str)]) -> String {
        let result: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, (ts, v))| format!(r#"{{"metric":{{"pod":"p{i}"}},"value":[{ts},"{v}"]}}"#))
            .collect();
        format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#, result.join(","))
    }

    /// What a metric without a reducer-specific `max_age` sees (the time does not matter).
    fn seen(answer: &Answer, reducer: Option<Reducer>) -> Observation {
        observe(answer, reducer, Timestamp::from_unix_millis(0), None)
    }

    fn value_of(obs: &Observation) -> (f64, i64) {
        match &obs.reading {
            Reading::Value { value, at } => (*value, at.unix_millis()),
            other => panic!("expected a value, got {other:?}"),
        }
    }

    #[test]
    fn one_sample_is_the_value_with_its_timestamp() {
        let answer = ok(&vector_body(&[(1712345678.123, "1.5")]));
        let obs = seen(&answer, None);
        assert_eq!(value_of(&obs), (1.5, 1_712_345_678_123));
        assert_eq!(obs.detail.series, Some(1));
        assert_eq!(obs.detail.error, None);
    }

    #[test]
    fn an_empty_vector_is_no_data_never_zero() {
        let obs = seen(&ok(&vector_body(&[])), Some(Reducer::Sum));
        assert!(matches!(obs.detail.error, Some(QueryError::NoData(_))), "{obs:?}");
        assert!(matches!(obs.reading, Reading::Unavailable { .. }));
        assert_eq!(obs.detail.series, Some(0));
    }

    #[test]
    fn several_series_need_a_reducer() {
        let answer = ok(&vector_body(&[(100.0, "1"), (99.5, "4"), (100.0, "7")]));
        let obs = seen(&answer, None);
        assert_eq!(obs.detail.error, Some(QueryError::SeveralSeries { count: 3 }));
        assert_eq!(obs.detail.series, Some(3));
        // Reduced values are dated by the oldest sample.
        assert_eq!(value_of(&seen(&answer, Some(Reducer::Max))), (7.0, 99_500));
        assert_eq!(value_of(&seen(&answer, Some(Reducer::Min))), (1.0, 99_500));
        assert_eq!(value_of(&seen(&answer, Some(Reducer::Sum))), (12.0, 99_500));
        assert_eq!(value_of(&seen(&answer, Some(Reducer::Avg))), (4.0, 99_500));
    }

    #[test]
    fn nan_and_infinities_are_unavailable() {
        for raw in ["NaN", "+Inf", "-Inf"] {
            let obs = seen(&ok(&vector_body(&[(1.0, raw)])), None);
            assert_eq!(obs.detail.error, Some(QueryError::NotANumber(raw.into())), "{raw}");
            let scalar = format!(r#"{{"status":"success","data":{{"resultType":"scalar","result":[1,"{raw}"]}}}}"#);
            let obs = seen(&ok(&scalar), None);
            assert_eq!(obs.detail.error, Some(QueryError::NotANumber(raw.into())), "{raw}");
        }
        // One NaN series spoils a reduction rather than being dropped from it.
        let obs = seen(&ok(&vector_body(&[(1.0, "3"), (1.0, "NaN")])), Some(Reducer::Sum));
        assert_eq!(obs.detail.error, Some(QueryError::NotANumber("NaN in 1 of 2 series".into())));
        let obs = seen(&ok(&vector_body(&[(1.0, "1e308"), (1.0, "1e308")])), Some(Reducer::Sum));
        assert!(matches!(obs.detail.error, Some(QueryError::NotANumber(_))), "{obs:?}");
        let obs = seen(&ok(&vector_body(&[(1.0, "lots")])), None);
        assert!(matches!(obs.detail.error, Some(QueryError::Protocol(_))), "{obs:?}");
    }

    #[test]
    fn scalars_are_values() {
        let obs = seen(&ok(r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000.5,"2"]}}"#), None);
        assert_eq!(value_of(&obs), (2.0, 1_700_000_000_500));
        assert_eq!(obs.detail.series, None);
    }

    #[test]
    fn matrix_and_string_results_are_bad_queries() {
        let matrix =
            r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]}]}}"#;
        let obs = seen(&ok(matrix), None);
        let Some(QueryError::BadQuery(message)) = obs.detail.error else { panic!("{obs:?}") };
        assert!(message.contains("instant vector or a scalar"), "{message}");
        assert!(message.contains("range"), "{message}");
        let string = r#"{"status":"success","data":{"resultType":"string","result":[1,"hello"]}}"#;
        let obs = seen(&ok(string), None);
        assert!(matches!(obs.detail.error, Some(QueryError::BadQuery(_))), "{obs:?}");
    }

    #[test]
    fn native_histograms_are_bad_queries() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{},"histogram":[1,{"count":"3","sum":"4","buckets":[]}]}]}}"#;
        let obs = seen(&ok(body), None);
        assert!(matches!(obs.detail.error, Some(QueryError::BadQuery(ref m)) if m.contains("histogram")), "{obs:?}");
    }

    #[test]
    fn warnings_make_an_answer_partial_unless_they_are_promql_annotations() {
        let with = |extra: &str| {
            ok(&format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[1,"3"]}}]}}{extra}}}"#
            ))
        };
        // Thanos with partial responses on, a store unreachable; Mimir's and anyone's own words.
        let thanos = with(
            r#","warnings":["receive series from Addr: 10.0.3.4:10901 LabelSets: {cluster=\"b\"}: rpc error: code = Unavailable desc = connection refused"]"#,
        );
        let obs = seen(&thanos, None);
        assert_eq!(value_of(&obs), (3.0, 1_000), "still a value: it may scale up");
        let why = obs.detail.partial.expect("partial");
        assert!(why.starts_with("the server says its answer is partial: \"receive series from Addr"), "{why}");
        let two = with(r#","warnings":["store-gateway-2 unavailable","partial response"]"#);
        assert_eq!(
            two.partial.as_deref(),
            Some("the server says its answer is partial: \"store-gateway-2 unavailable\" and 1 more")
        );
        // VictoriaMetrics says it in a field of its own.
        let vm = with(r#","isPartial":true"#);
        assert_eq!(vm.partial.as_deref(), Some("the server marked its answer as partial (isPartial)"));
        assert_eq!(with(r#","isPartial":false"#).partial, None);

        // PromQL's annotations are about the query, not missing data; infos count only when
        // they say partial.
        let annotations = with(
            r#","warnings":["PromQL warning: encountered a mix of histograms and floats for metric name \"x\""],
               "infos":["PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: \"x\""]"#,
        );
        assert_eq!(annotations.partial, None);
        assert_eq!(annotations.warnings.len(), 2, "still kept and shown");
        let info = with(r#","infos":["Partial data: 1 of 3 ingesters did not answer"]"#);
        assert!(info.partial.is_some());
        assert_eq!(with("").partial, None);

        // Long server text is cut, on one line.
        let long = with(&format!(r#","warnings":["{}\n{}"]"#, "a".repeat(150), "b".repeat(150)));
        let why = long.partial.unwrap();
        assert!(why.len() < 260 && why.contains("a b") && why.ends_with("...\""), "{why}");
    }

    #[test]
    fn the_sample_times_date_the_value_and_max_age_makes_it_stale() {
        // The value at the evaluation time (100 s), the oldest sample behind it at 40.5 s.
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"pod":"a"},"value":[100,"2"]},{"metric":{"pod":"b"},"value":[100,"5"]},
            {"metric":{"watermarkd_sample":"time"},"value":[100,"40.5"]}]}}"#;
        let answer = ok(body);
        assert_eq!(answer.sample_times.len(), 1);
        let now = Timestamp::from_unix_millis(100_000);
        let obs = observe(&answer, Some(Reducer::Sum), now, None);
        assert_eq!(value_of(&obs), (7.0, 40_500));
        assert_eq!(obs.detail.series, Some(2), "the added series is not one of the query's");
        let obs = observe(&answer, Some(Reducer::Sum), now, Some(Duration::from_secs(60)));
        assert_eq!(value_of(&obs), (7.0, 40_500));
        let obs = observe(&answer, Some(Reducer::Sum), now, Some(Duration::from_secs(59)));
        assert_eq!(obs.detail.error, Some(QueryError::Stale { age_seconds: 59, max_age_seconds: 59 }));
        assert!(matches!(obs.reading, Reading::Unavailable { .. }));

        // Without sample times (a query that is not a selector), the evaluation time dates it.
        let obs = observe(&ok(&vector_body(&[(100.0, "3")])), None, now, Some(Duration::from_secs(1)));
        assert_eq!(value_of(&obs), (3.0, 100_000));
        // A sample time that is not one is the server's fault.
        let garbage = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{},"value":[100,"2"]},{"metric":{"watermarkd_sample":"time"},"value":[100,"NaN"]}]}}"#;
        let obs = observe(&ok(garbage), None, now, None);
        assert!(matches!(obs.detail.error, Some(QueryError::Protocol(_))), "{obs:?}");
    }

    #[test]
    fn a_dated_range_answer_dates_each_step() {
        // A series stopped after 95 s: at 110 s the lookback still answers its last sample.
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"q"},"values":[[100,"2"],[110,"2"]]},
            {"metric":{"watermarkd_sample":"time"},"values":[[100,"95"],[110,"95"]]}]}}"#;
        let answer = ok(body);
        assert_eq!(series_count(&answer), 1, "the added series is not one of the query's");
        let steps = [Timestamp::from_unix_millis(100_000), Timestamp::from_unix_millis(110_000)];
        let obs = observe_steps(&answer, None, &steps, Some(Duration::from_secs(10)));
        assert_eq!(value_of(&obs[0]), (2.0, 95_000));
        assert_eq!(obs[1].detail.error, Some(QueryError::Stale { age_seconds: 15, max_age_seconds: 10 }));
        let obs = observe_steps(&answer, None, &steps, None);
        assert_eq!(value_of(&obs[1]), (2.0, 95_000));
    }

    #[test]
    fn warnings_and_infos_are_kept_even_without_a_value() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[]},
            "warnings":["store gateway down: partial answer"],"infos":["metric might not be a counter"]}"#;
        let answer = ok(body);
        assert_eq!(answer.warnings, ["store gateway down: partial answer", "info: metric might not be a counter"]);
        let obs = seen(&answer, None);
        assert_eq!(obs.detail.warnings.len(), 2);
        assert!(matches!(obs.detail.error, Some(QueryError::NoData(_))));
    }

    #[test]
    fn a_folded_answer_maps_back_by_label_never_by_position() {
        let body = r#"{"status":"success","warnings":["store-gateway-2 unavailable"],"data":{"resultType":"vector","result":[
            {"metric":{"d":"b"},"value":[100,"2"]},
            {"metric":{"d":"zzz"},"value":[100,"9"]},
            {"metric":{},"value":[100,"8"]},
            {"metric":{"d":"a"},"value":[100,"1"]},
            {"metric":{"d":"a","watermarkd_sample":"time"},"value":[100,"40"]},
            {"metric":{"d":"b","watermarkd_sample":"time"},"value":[100,"60"]}]}}"#;
        let answer = classify(200, body.as_bytes(), ENDPOINT, Some("d")).unwrap();
        let parts = answer.split(["a", "b", "c"]).unwrap();
        let now = Timestamp::from_unix_millis(100_000);
        let seen = |value: &str, max_age: Option<Duration>| observe(&parts[value], None, now, max_age);
        // Each member its own series, dated by its own samples.
        assert_eq!(value_of(&seen("a", None)), (1.0, 40_000));
        assert_eq!(value_of(&seen("b", None)), (2.0, 60_000));
        assert_eq!(seen("a", None).detail.series, Some(1));
        // Staleness is each member's: only a's data is older than 50 s.
        assert!(matches!(seen("a", Some(Duration::from_secs(50))).detail.error, Some(QueryError::Stale { .. })));
        assert_eq!(value_of(&seen("b", Some(Duration::from_secs(50)))), (2.0, 60_000));
        // A member with no series has no data, never 0; series of no member are no one's.
        let c = seen("c", None);
        assert!(matches!(c.detail.error, Some(QueryError::NoData(_))), "{c:?}");
        assert_eq!(c.detail.series, Some(0));
        // A partial answer is partial for every member.
        for value in ["a", "b", "c"] {
            assert!(seen(value, None).detail.partial.is_some(), "{value}");
        }
        // Without a fold label, nothing is kept to split by.
        let plain = classify(200, body.as_bytes(), ENDPOINT, None).unwrap();
        assert_eq!(plain.fold_values, FoldValues::default());
        // A folded query answered with anything but a vector is the server's fault.
        let scalar = ok(r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#);
        assert!(matches!(scalar.split(["a"]), Err(QueryError::Protocol(_))));
    }

    #[test]
    fn what_a_folded_query_meets_for_its_weight_or_form_is_the_folds() {
        for (status, body) in [
            (400, r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#),
            (400, "bad request"),
            (200, r#"{"status":"error","errorType":"bad_data","error":"nope"}"#),
            (
                422,
                r#"{"status":"error","errorType":"execution","error":"the query exceeded the maximum number of series (limit: 1000) (err-mimir-max-series-per-query)"}"#,
            ),
            (422, "query too long"),
            (503, "down"),
            (503, r#"{"status":"error","errorType":"timeout","error":"query timed out"}"#),
            (200, r#"{"status":"error","errorType":"execution","error":"out of memory"}"#),
            (413, "payload too large"),
            (200, "<html>proxy error</html>"),
        ] {
            assert!(fail(status, body).may_be_the_folds(), "{status} {body}");
        }
        for (status, body) in [(401, "no"), (403, "no"), (404, "not found"), (429, "slow down")] {
            assert!(!fail(status, body).may_be_the_folds(), "{status} {body}");
        }
        assert!(Failure::new(QueryError::Timeout(10), "timeout", true).may_be_the_folds());
        assert!(!Failure::new(QueryError::Transport("refused".into()), "transport", true).may_be_the_folds());
    }

    #[test]
    fn error_answers() {
        let f = fail(
            400,
            r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}"#,
        );
        assert_eq!(f, Failure::bad_query("1:5: parse error: unexpected end of input".into()));
        let f = fail(
            422,
            r#"{"status":"error","errorType":"execution","error":"found duplicate series for the match group; many-to-many matching not allowed"}"#,
        );
        assert!(matches!(f.error, QueryError::BadQuery(ref m) if m.contains("many-to-many")), "{f:?}");
        assert!(!f.retry);
        let f =
            fail(503, r#"{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}"#);
        assert_eq!(f.error, QueryError::Server("timeout: query timed out in expression evaluation".into()));
        assert!(f.retry);
        assert_eq!(f.outcome, "timeout");
        let f = fail(500, r#"{"status":"error","errorType":"internal","error":"storage error"}"#);
        assert!(f.retry && matches!(f.error, QueryError::Server(_)), "{f:?}");
        // A 200 that says "error" is still an error: the query's when it says bad_data...
        let f = fail(200, r#"{"status":"error","errorType":"bad_data","error":"nope"}"#);
        assert_eq!(f.error, QueryError::BadQuery("nope".into()));
        // ...else the server's, never a bad query.
        let f = fail(200, r#"{"status":"error","errorType":"execution","error":"out of memory"}"#);
        assert_eq!(f.error, QueryError::Server("HTTP 200 with status \"error\": execution: out of memory".into()));
        assert_eq!(f.outcome, "server_error");
        let f = fail(200, r#"{"status":"error","error":"something broke"}"#);
        assert!(matches!(f.error, QueryError::Server(ref m) if m.contains("something broke")), "{f:?}");
        let f = fail(200, r#"{"status":"error","errorType":"unavailable","error":"ingester down"}"#);
        assert!(f.retry && matches!(f.error, QueryError::Server(_)), "{f:?}");
    }

    #[test]
    fn plain_text_answers_are_not_assumed_to_be_json() {
        let f = fail(503, "Service Unavailable\n");
        assert_eq!(f.error, QueryError::Server("HTTP 503: Service Unavailable".into()));
        assert!(f.retry);
        let f = fail(502, "<html><body>\n  <h1>502 Bad Gateway</h1>\n</body></html>");
        assert_eq!(
            f.error,
            QueryError::Server("HTTP 502: <html><body> <h1>502 Bad Gateway</h1> </body></html>".into())
        );
        let f = fail(503, "");
        assert_eq!(f.error, QueryError::Server("HTTP 503".into()));
        let f = fail(200, "<html>login page</html>");
        assert!(matches!(f.error, QueryError::Protocol(_)) && !f.retry, "{f:?}");
        let long = "x".repeat(1000);
        let QueryError::Server(m) = fail(500, &long).error else { panic!() };
        assert!(m.len() < 220 && m.ends_with("..."), "{m}");
    }

    #[test]
    fn refusals_say_what_to_check_and_are_not_retried() {
        let f = fail(401, "unauthorized");
        assert!(!f.retry);
        assert_eq!(f.outcome, "forbidden");
        let QueryError::Configuration(m) = f.error else { panic!("{f:?}") };
        assert!(m.contains("credentials") && m.contains(ENDPOINT), "{m}");
        let QueryError::Configuration(m) = fail(403, "no org id").error else { panic!() };
        assert!(m.contains("tenant") && m.contains("no org id"), "{m}");
        let QueryError::Configuration(m) = fail(404, "404 page not found").error else { panic!() };
        assert!(m.contains("path prefix"), "{m}");
        let f = fail(429, "slow down");
        assert_eq!(f.outcome, "rate_limited");
        assert!(!f.retry);
    }

    #[test]
    fn malformed_success_answers_are_protocol_errors() {
        for body in [
            r#"{"status":"success"}"#,
            r#"{"status":"success","data":{"resultType":"vector","result":{}}}"#,
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}"#,
            r#"{"status":"success","data":{"resultType":"weird","result":[]}}"#,
            r#"{"status":"success","data":{"resultType":"scalar","result":["x","1"]}}"#,
        ] {
            let f = fail(200, body);
            assert!(matches!(f.error, QueryError::Protocol(_)), "{body}: {f:?}");
        }
    }
}
