//! A query's history for a backtest or a forecast: `GET /api/v1/query` over consecutive
//! windows, paced with the daemon's own requests (the organisation's budget is shared with
//! them), and read back as what a live evaluation would have used at each step.

use std::time::Duration;

use tokio::time::Instant;
use watermarkd_engine::Timestamp;

use super::batch::form_encode;
use super::http::Failure;
use super::pacing::Admission;
use super::parse::{default_max_age, read_v1_history, HistorySeries};
use super::{lock, DatadogClient, Inner};
use crate::adapters::backend::{HistoryError, HistorySpan, MetricQuery, Observation, ObservationDetail, QueryError};

/// The time one request covers. Datadog rolls points up coarser as the window grows; an hour
/// keeps the resolution of a live query's five-minute window within a few steps.
const WINDOW: Duration = Duration::from_secs(3600);

/// The time one request covers when points a few minutes apart are enough: Datadog then rolls
/// a day up to about five minutes, and 22 days of a forecast's history take 22 requests, not
/// 528 from the budget the live queries share.
const COARSE_WINDOW: Duration = Duration::from_secs(86_400);

/// How long one request may take in all, its retries included.
const REQUEST_BUDGET: Duration = Duration::from_secs(120);

/// How often a deferred request asks the pacer again.
const ADMISSION_POLL: Duration = Duration::from_millis(500);

impl DatadogClient {
    /// What a live evaluation would have used at each step of `span`: the newest complete
    /// bucket with a value (a live query skips the newest bucket, which may still be filling),
    /// while it is fresh enough by the backend's `max_age` (default `max(120s, 3 x rollup)`).
    /// `progress` hears how many steps are covered so far.
    pub async fn history(
        &self,
        query: &MetricQuery,
        span: HistorySpan,
        progress: &(impl Fn(usize) + ?Sized),
    ) -> Result<Vec<(Timestamp, Observation)>, HistoryError> {
        let inner = &self.inner;
        let failed = |error: QueryError| HistoryError::Query {
            backend: inner.name.clone(),
            query: query.query.clone(),
            error: inner.scrub_error(error),
        };
        if let Some(error) = inner.precheck(&query.query, Instant::now()) {
            return Err(failed(error));
        }
        let steps = span.steps();
        let window = if span.for_forecast { COARSE_WINDOW } else { WINDOW };
        let window = i64::try_from(window.as_secs()).unwrap_or(3600);
        // From one live window before the first step, so that the first step has what a live
        // query would have had.
        let first = span.start.unix_millis().div_euclid(1000) - i64::try_from(inner.window.as_secs()).unwrap_or(0);
        let last = span.end.unix_millis().div_euclid(1000) + 1;
        let mut encoded = String::new();
        form_encode(&query.query, &mut encoded);

        let site = inner.place.as_str();
        let read = |status: u16, rate: &super::RateLimitHeaders, body: &[u8]| {
            read_v1_history(status, rate, body, site).map_err(|(error, outcome, retryable)| Failure {
                error,
                outcome,
                retryable,
                status: Some(status),
            })
        };
        let mut series: Option<HistorySeries> = None;
        let mut from = first;
        while from < last {
            let to = (from + window).min(last);
            if span.for_forecast {
                inner.admitted_in_background().await;
            } else {
                inner.admitted().await;
            }
            let url = format!("{}?from={from}&to={to}&query={encoded}", inner.v1_endpoint());
            let started = Instant::now();
            let answer = inner
                .exchange(inner.keyed_get(&url).await, started, started + REQUEST_BUDGET, &read)
                .await
                .map_err(|failure| failed(failure.error))?;
            match answer.as_slice() {
                [] => {}
                [one] => {
                    let merged =
                        series.get_or_insert_with(|| HistorySeries { interval_seconds: None, points: Vec::new() });
                    merged.interval_seconds = merged.interval_seconds.or(one.interval_seconds);
                    // Windows share their edge second: keep each bucket once.
                    let newest = merged.points.last().map(|(ms, _)| *ms);
                    merged.points.extend(one.points.iter().filter(|(ms, _)| newest.is_none_or(|n| *ms > n)));
                }
                several => {
                    return Err(HistoryError::SeveralSeries {
                        backend: inner.name.clone(),
                        query: query.query.clone(),
                        count: several.len(),
                    })
                }
            }
            let covered = Timestamp::from_unix_millis(to.saturating_mul(1000));
            progress(steps.iter().take_while(|step| **step <= covered).count());
            from = to;
        }
        let series = series.unwrap_or(HistorySeries { interval_seconds: None, points: Vec::new() });
        Ok(observe_steps(&series, &steps, inner.max_age))
    }
}

impl Inner {
    /// Waits until the pacer lets one more request go: a backtest takes its requests from the
    /// same budget as the daemons of the organisation, spread as theirs are.
    async fn admitted(&self) {
        loop {
            let wait = match lock(&self.pacer).admit(Instant::now(), 1) {
                Admission::Go | Admission::Learn | Admission::Part { .. } | Admission::Probe { .. } => return,
                Admission::Deferred { .. } => ADMISSION_POLL,
                Admission::RateLimited { reset_in_seconds } => Duration::from_secs(reset_in_seconds.max(1)),
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits until the pacer lets one background request go: a forecast's history in the
    /// daemon takes only what its live cycles leave (see `Pacer::admit_background`), so
    /// thousands of forecasts starting at once delay their own history, never a live query.
    async fn admitted_in_background(&self) {
        loop {
            let wait = match lock(&self.pacer).admit_background(Instant::now()) {
                Ok(()) => return,
                Err(wait) => wait.max(ADMISSION_POLL),
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// At each step: the newest non-null bucket that had ended by then, if it is not older than
/// `max_age` (configured, else `max(120s, 3 x rollup)`).
fn observe_steps(
    series: &HistorySeries,
    steps: &[Timestamp],
    max_age: Option<Duration>,
) -> Vec<(Timestamp, Observation)> {
    let interval_ms = series.interval_seconds.map_or(0.0, |i| i * 1000.0);
    let max_age = max_age.unwrap_or_else(|| default_max_age(series.interval_seconds.map(|i| i.round() as u64)));
    let detail = || ObservationDetail {
        series: Some(1),
        interval_seconds: series.interval_seconds.map(|i| i.round() as u64),
        ..ObservationDetail::default()
    };
    let mut next = 0;
    let mut newest: Option<(f64, f64)> = None;
    steps
        .iter()
        .map(|step| {
            let now_ms = step.unix_millis() as f64;
            while let Some((ms, value)) = series.points.get(next).filter(|(ms, _)| ms + interval_ms <= now_ms) {
                if let Some(value) = value {
                    newest = Some((*ms, *value));
                }
                next += 1;
            }
            let observation = match newest.and_then(|(ms, value)| Some((Timestamp::from_unix_millis_f64(ms)?, value))) {
                None => Observation::unavailable_with(
                    QueryError::NoData("no complete bucket with a value in the history up to this time".into()),
                    detail(),
                ),
                Some((at, _)) if step.since(at) > max_age => Observation::unavailable_with(
                    QueryError::Stale { age_seconds: step.since(at).as_secs(), max_age_seconds: max_age.as_secs() },
                    detail(),
                ),
                Some((at, value)) => Observation::value(value, at, detail()),
            };
            (*step, observation)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_unix_millis(seconds * 1000)
    }

    fn value(observation: &Observation) -> Option<f64> {
        match observation.reading {
            watermarkd_engine::Reading::Value { value, .. } => Some(value),
            _ => None,
        }
    }

    #[test]
    fn each_step_uses_the_newest_complete_bucket_while_it_is_fresh() {
        let series = HistorySeries {
            interval_seconds: Some(20.0),
            points: vec![(0.0, Some(1.0)), (20_000.0, None), (40_000.0, Some(3.0)), (60_000.0, Some(4.0))],
        };
        let steps: Vec<Timestamp> = [10, 20, 45, 60, 80, 400].into_iter().map(at).collect();
        let seen: Vec<Option<f64>> = observe_steps(&series, &steps, None).iter().map(|(_, o)| value(o)).collect();
        // At 10 s the first bucket is still filling; the null bucket is skipped; at 400 s the
        // newest value (60 s) is older than the 120 s default.
        assert_eq!(seen, vec![None, Some(1.0), Some(1.0), Some(3.0), Some(4.0), None]);
        let stale = &observe_steps(&series, &steps, None)[5].1;
        assert!(matches!(stale.detail.error, Some(QueryError::Stale { .. })), "{stale:?}");
    }
}
