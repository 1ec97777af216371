//! From a parsed answer to what a metric query sees: one value (reduced when the query has a
//! reducer), dated by the data behind it and judged stale by the backend's `max_age`, or the
//! reason it has none; for a range query, that at each step.

use std::collections::BTreeMap;
use std::time::Duration;

use watermarkd_engine::Timestamp;

use super::{Answer, QueryResult, Sample, HISTOGRAM};
use crate::adapters::backend::{Observation, ObservationDetail, QueryError};
use crate::domain::rules::Reducer;

/// What one metric query sees in an answer at `now`: reduced with the metric's reducer if it
/// has one, dated by the data behind it where the answer tells (see `sample_time`), and stale
/// when that is older than the backend's `max_age`. A partial answer gives a partial reading.
pub fn observe(answer: &Answer, reducer: Option<Reducer>, now: Timestamp, max_age: Option<Duration>) -> Observation {
    let mut detail = ObservationDetail {
        warnings: answer.warnings.clone(),
        partial: answer.partial.clone(),
        ..ObservationDetail::default()
    };
    let result = match &answer.result {
        QueryResult::Scalar(sample) => number(sample),
        QueryResult::Vector(samples) => {
            detail.series = Some(samples.len());
            vector(samples, reducer)
        }
        QueryResult::Matrix(_) => Err(unusable("matrix")),
        QueryResult::Unusable(kind) => Err(unusable(kind)),
    };
    let result = result.and_then(|(value, at)| dated(value, at, answer.sample_times.iter(), now, max_age));
    match result {
        Ok((value, at)) => Observation::value(value, at, detail),
        Err(error) => Observation::unavailable_with(error, detail),
    }
}

/// `value` dated by the oldest of `sample_times` (the time of its data, when the answer carries
/// it), and stale at `now` when that is older than `max_age`.
fn dated<'a>(
    value: f64,
    at: Timestamp,
    sample_times: impl Iterator<Item = &'a Sample>,
    now: Timestamp,
    max_age: Option<Duration>,
) -> Result<(f64, Timestamp), QueryError> {
    let at = data_time(sample_times)?.map_or(at, |data| data.min(at));
    match max_age {
        Some(max_age) if now.since(at) > max_age => {
            Err(QueryError::Stale { age_seconds: now.since(at).as_secs(), max_age_seconds: max_age.as_secs() })
        }
        _ => Ok((value, at)),
    }
}

/// The oldest of the sample times the answer carries (their values are Unix seconds), if any.
fn data_time<'a>(sample_times: impl Iterator<Item = &'a Sample>) -> Result<Option<Timestamp>, QueryError> {
    let mut oldest: Option<Timestamp> = None;
    for sample in sample_times {
        let Sample::Float { value, .. } = sample else {
            return Err(QueryError::Protocol("a sample time that is a histogram".into()));
        };
        let seconds =
            parse_value(value).map_err(|_| QueryError::Protocol(format!("sample time {value:?} is not a time")))?;
        let at = timestamp(seconds)?;
        oldest = Some(oldest.map_or(at, |o| o.min(at)));
    }
    Ok(oldest)
}

fn unusable(kind: &str) -> QueryError {
    QueryError::BadQuery(format!(
        "the query returns a {kind}; an instant vector or a scalar is needed{}",
        if kind == "matrix" {
            " (drop the [range] selector, or wrap it in a function such as rate() or max_over_time())"
        } else {
            ""
        }
    ))
}

/// What a live query at each of `steps` would have seen, from a range query's answer: the
/// samples of every series at that step, judged as an instant query's vector is (no sample is
/// no data, several need the metric's reducer, NaN is no number, data older than `max_age` at
/// that step is stale). The answer of a range query that is not a matrix judges every step alike.
pub fn observe_steps(
    answer: &Answer,
    reducer: Option<Reducer>,
    steps: &[Timestamp],
    max_age: Option<Duration>,
) -> Vec<Observation> {
    let QueryResult::Matrix(series) = &answer.result else {
        return steps.iter().map(|step| observe(answer, reducer, *step, max_age)).collect();
    };
    let key = |at_seconds: f64| (at_seconds * 1000.0).round() as i64;
    let mut at_step: BTreeMap<i64, Vec<Sample>> = BTreeMap::new();
    for sample in series.iter().flatten() {
        let key = match sample {
            Sample::Float { at_seconds, .. } => key(*at_seconds),
            // Dated nowhere: it makes every step unusable.
            Sample::Histogram => i64::MIN,
        };
        at_step.entry(key).or_default().push(sample.clone());
    }
    let histogram = at_step.remove(&i64::MIN);
    steps
        .iter()
        .map(|step| {
            if histogram.is_some() {
                return Observation::unavailable(QueryError::BadQuery(HISTOGRAM.into()));
            }
            let samples = at_step.get(&step.unix_millis()).map_or(&[][..], Vec::as_slice);
            let detail = ObservationDetail {
                series: Some(samples.len()),
                partial: answer.partial.clone(),
                ..ObservationDetail::default()
            };
            let times = answer.sample_times.iter().filter(|t| match t {
                Sample::Float { at_seconds, .. } => key(*at_seconds) == step.unix_millis(),
                Sample::Histogram => true,
            });
            match vector(samples, reducer).and_then(|(value, at)| dated(value, at, times, *step, max_age)) {
                Ok((value, at)) => Observation::value(value, at, detail),
                Err(error) => Observation::unavailable_with(error, detail),
            }
        })
        .collect()
}

/// How many distinct series a range answer holds.
pub fn series_count(answer: &Answer) -> usize {
    match &answer.result {
        QueryResult::Matrix(series) => series.len(),
        QueryResult::Vector(samples) => samples.len(),
        QueryResult::Scalar(_) => 1,
        QueryResult::Unusable(_) => 0,
    }
}

fn vector(samples: &[Sample], reducer: Option<Reducer>) -> Result<(f64, Timestamp), QueryError> {
    match (samples, reducer) {
        // Never 0: an outage or a renamed metric must hold the replicas, not scale them down.
        ([], _) => Err(QueryError::NoData(
            "the query returned an empty vector: no series match at the evaluation time (absent or stale)".into(),
        )),
        ([one], _) => number(one),
        (_, None) => Err(QueryError::SeveralSeries { count: samples.len() }),
        (_, Some(reducer)) => reduce(samples, reducer),
    }
}

/// Several series into one value. One unusable sample makes the whole value unusable: dropping
/// it would quietly lower a sum or an average, which reads as "less load".
fn reduce(samples: &[Sample], reducer: Reducer) -> Result<(f64, Timestamp), QueryError> {
    let count = samples.len();
    let mut values = Vec::with_capacity(count);
    let mut oldest: Option<Timestamp> = None;
    let mut not_numbers = Vec::new();
    for sample in samples {
        let Sample::Float { at_seconds, value } = sample else {
            return Err(QueryError::BadQuery(HISTOGRAM.into()));
        };
        match parse_value(value) {
            Ok(v) => values.push(v),
            Err(QueryError::NotANumber(raw)) => not_numbers.push(raw),
            Err(other) => return Err(other),
        }
        let at = timestamp(*at_seconds)?;
        // The oldest sample dates the result: the value is no fresher than its stalest part.
        oldest = Some(oldest.map_or(at, |o| o.min(at)));
    }
    if let Some(first) = not_numbers.first() {
        return Err(QueryError::NotANumber(format!("{first} in {} of {count} series", not_numbers.len())));
    }
    let value = match reducer {
        Reducer::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Reducer::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        Reducer::Sum => values.iter().sum(),
        Reducer::Avg => values.iter().sum::<f64>() / count as f64,
    };
    // A sum of huge values can overflow to infinity.
    if !value.is_finite() {
        return Err(QueryError::NotANumber(format!("{value} (the {reducer:?} of {count} series)")));
    }
    let at = oldest.ok_or_else(|| QueryError::NoData("no samples to reduce".into()))?;
    Ok((value, at))
}

fn number(sample: &Sample) -> Result<(f64, Timestamp), QueryError> {
    match sample {
        Sample::Float { at_seconds, value } => Ok((parse_value(value)?, timestamp(*at_seconds)?)),
        Sample::Histogram => Err(QueryError::BadQuery(HISTOGRAM.into())),
    }
}

/// Sample values are strings; `NaN`, `+Inf` and `-Inf` are valid ones that mean "no usable value".
fn parse_value(raw: &str) -> Result<f64, QueryError> {
    match raw.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(QueryError::NotANumber(raw.to_string())),
        Err(_) => Err(QueryError::Protocol(format!("sample value {raw:?} is not a number"))),
    }
}

fn timestamp(seconds: f64) -> Result<Timestamp, QueryError> {
    Timestamp::from_unix_seconds_f64(seconds)
        .ok_or_else(|| QueryError::Protocol(format!("sample timestamp {seconds} is out of range")))
}
