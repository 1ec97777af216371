//! Forecasts: the demand an autoscaler will see `lead_time` from now, read from its own
//! history, so that replicas are ready before a peak they would otherwise meet late.
//!
//! The model is one a reviewer can follow on paper: **seasonal naive with a trend
//! correction**. The forecast for `t + lead` is what the demand was one season earlier at that
//! time of day (or week), the median over the last seasons the history holds (so one holiday
//! does not decide), scaled by how the last hour compares with the same hour a season earlier
//! (so growth carries over). A weekly season is used once the history holds a week and a day;
//! before, a daily one from two days, from past days of the same kind (weekday or weekend), so
//! that a Monday is not forecast from a Sunday; with less it says so and forecasts nothing.
//!
//! Before its forecast is used, the model forecasts the last day from what it knew then, and
//! its error there (the mean absolute error over the mean demand) must be at most
//! `max_error`: a forecast that has been wrong lately says so and does nothing.
//!
//! The demand is what the metric measures for the whole workload: the value itself under
//! `algorithm = "average"` (the engine divides it by the replicas), the value times the ready
//! replicas under `absolute` (a per-replica load). The replicas it needs are that demand over
//! the high watermark. A forecast only ever raises the floor, and never past `max_replicas`
//! nor past `max_factor` times the current count.
//!
//! Pure: the history is given, time is an argument.

use std::borrow::Cow;
use std::time::Duration;

use watermarkd_engine::{Algorithm, Bounds, Reading, Rule, Timestamp};

const DAY: Duration = Duration::from_secs(86_400);
const WEEK: Duration = Duration::from_secs(7 * 86_400);
/// How far back the trend correction compares: the last hour with the same hour a season ago.
const TREND_SPAN: Duration = Duration::from_secs(3_600);
/// At most this many past seasons are looked at, for the median.
const SEASONS: u32 = 3;
/// The trend correction's bounds: a ratio outside them is more likely an outage or a spike
/// than a trend.
const TREND_BOUNDS: (f64, f64) = (0.5, 2.0);
/// The self-check's span, and its step.
const CHECK_SPAN: Duration = Duration::from_secs(86_400);
const CHECK_STEP: Duration = Duration::from_secs(900);

/// The largest error by default: 30% of the demand.
pub const DEFAULT_MAX_ERROR: f64 = 0.3;
/// By default a forecast at most doubles the replicas at once.
pub const DEFAULT_MAX_FACTOR: f64 = 2.0;

/// An autoscaler's forecast settings (`[autoscaler.forecast]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ForecastRule {
    /// How far ahead: at least how long new replicas take to be ready.
    pub lead_time: Duration,
    pub mode: ForecastMode,
    /// The largest error the last day's forecasts may have had, as a fraction of the demand.
    pub max_error: f64,
    /// The floor is at most this many times the current replicas.
    pub max_factor: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForecastMode {
    /// Computed and reported, never used.
    Observe,
    /// Used as a floor.
    Scale,
}

/// Demand over time: samples in time order, at roughly even steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    samples: Vec<(Timestamp, f64)>,
}

impl History {
    /// From samples in any order; non-finite and negative values are dropped (no data is no
    /// data, never 0).
    pub fn new(mut samples: Vec<(Timestamp, f64)>) -> History {
        samples.retain(|(_, v)| v.is_finite() && *v >= 0.0);
        samples.sort_by_key(|(at, _)| *at);
        History { samples }
    }

    pub fn push(&mut self, at: Timestamp, demand: f64) {
        if demand.is_finite() && demand >= 0.0 && self.samples.last().is_none_or(|(last, _)| *last < at) {
            self.samples.push((at, demand));
        }
    }

    /// Drops what is older than `keep` before `now`: the memory a forecast holds is bounded.
    pub fn trim(&mut self, now: Timestamp, keep: Duration) {
        let from = self.samples.partition_point(|(at, _)| now.since(*at) > keep);
        self.samples.drain(..from);
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    fn span(&self) -> Duration {
        match (self.samples.first(), self.samples.last()) {
            (Some((first, _)), Some((last, _))) => last.since(*first),
            _ => Duration::ZERO,
        }
    }

    /// The mean of the samples in `[from, to)`, if any.
    fn mean(&self, from: Timestamp, to: Timestamp) -> Option<f64> {
        let start = self.samples.partition_point(|(at, _)| *at < from);
        let end = self.samples.partition_point(|(at, _)| *at < to);
        let window = self.samples.get(start..end)?;
        (!window.is_empty()).then(|| window.iter().map(|(_, v)| v).sum::<f64>() / window.len() as f64)
    }

    /// The value around `at` (the mean within 5 minutes either side).
    fn around(&self, at: Timestamp) -> Option<f64> {
        let half = Duration::from_secs(300);
        self.mean(minus(at, half), at.plus(half))
    }
}

fn minus(at: Timestamp, by: Duration) -> Timestamp {
    let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    Timestamp::from_unix_millis(at.unix_millis().saturating_sub(ms))
}

/// What a forecast said at one instant.
#[derive(Clone, Debug, PartialEq)]
pub enum Forecast {
    /// The demand expected at `at`, and the error of the last day's forecasts.
    Ready { at: Timestamp, demand: f64, error: f64, season: Duration },
    /// Nothing to say, and why (too little history, too large an error).
    Unable(String),
}

/// The demand at `now + lead`, from `history` up to `now`, checked against the last day.
pub fn forecast(history: &History, now: Timestamp, lead: Duration, max_error: f64) -> Forecast {
    let Some(season) = season_of(history) else {
        return Forecast::Unable(format!(
            "too little history: {} of the 2 days a daily season needs",
            humantime::format_duration(Duration::from_secs(history.span().as_secs()))
        ));
    };
    let Some(demand) = predict(history, now, lead, season) else {
        return Forecast::Unable("no history around this time in the past seasons".into());
    };
    let Some(error) = recent_error(history, now, lead, season) else {
        return Forecast::Unable("too little history to check the last day's forecasts".into());
    };
    if error > max_error {
        return Forecast::Unable(format!(
            "the last day's forecasts were off by {:.0}% of the demand, more than max_error {:.0}%",
            error * 100.0,
            max_error * 100.0
        ));
    }
    Forecast::Ready { at: now.plus(lead), demand, error, season }
}

/// Weekly once the history holds a week and a day, daily from two days.
fn season_of(history: &History) -> Option<Duration> {
    let span = history.span();
    if span >= WEEK + DAY {
        Some(WEEK)
    } else if span >= DAY * 2 {
        Some(DAY)
    } else {
        None
    }
}

/// How far back each of the past seasons of `target` lies: whole weeks for a weekly season;
/// for a daily one, the last days of the same kind (a weekday for a weekday, a weekend day
/// for a weekend day, in UTC), so that a Monday is not forecast from a Sunday.
fn seasons_back(season: Duration, target: Timestamp) -> Vec<Duration> {
    if season >= WEEK {
        return (1..=SEASONS).filter_map(|k| season.checked_mul(k)).collect();
    }
    let weekend = |at: Timestamp| {
        // 1970-01-01 was a Thursday: day 0 is Thursday, so Saturday and Sunday are 2 and 3.
        let day = at.unix_millis().div_euclid(86_400_000).rem_euclid(7);
        matches!(day, 2 | 3)
    };
    (1..=7u32)
        .map(|k| DAY * k)
        .filter(|back| weekend(minus(target, *back)) == weekend(target))
        .take(SEASONS as usize)
        .collect()
}

/// Seasonal naive with a trend correction, from what was known at `now`.
fn predict(history: &History, now: Timestamp, lead: Duration, season: Duration) -> Option<f64> {
    let target = now.plus(lead);
    let mut past: Vec<f64> = seasons_back(season, target)
        .into_iter()
        // Only what was already known at `now`.
        .filter(|back| *back > lead)
        .filter_map(|back| history.around(minus(target, back)))
        .collect();
    if past.is_empty() {
        return None;
    }
    past.sort_by(f64::total_cmp);
    let seasonal = past.get(past.len() / 2).copied()?;
    Some(seasonal * trend(history, now, season))
}

/// How the last hour compares with the same hour one season earlier (of the same kind of
/// day), within bounds; 1 when either is unknown or zero.
fn trend(history: &History, now: Timestamp, season: Duration) -> f64 {
    let Some(back) = seasons_back(season, now).first().copied() else { return 1.0 };
    let recent = history.mean(minus(now, TREND_SPAN), now.plus(Duration::from_millis(1)));
    let before = history.mean(minus(minus(now, back), TREND_SPAN), minus(now, back).plus(Duration::from_millis(1)));
    match (recent, before) {
        (Some(recent), Some(before)) if before > 0.0 => (recent / before).clamp(TREND_BOUNDS.0, TREND_BOUNDS.1),
        _ => 1.0,
    }
}

/// The error of the forecasts the model would have made over the last day, each from what it
/// knew `lead` before: the mean absolute error over the mean demand.
fn recent_error(history: &History, now: Timestamp, lead: Duration, season: Duration) -> Option<f64> {
    let mut absolute = 0.0;
    let mut actual = 0.0;
    let mut count = 0u32;
    let steps = CHECK_SPAN.as_secs() / CHECK_STEP.as_secs();
    for step in 1..=steps {
        let at = minus(now, CHECK_STEP * u32::try_from(step).unwrap_or(u32::MAX));
        let made = minus(at, lead);
        let (Some(said), Some(was)) = (predict(history, made, lead, season), history.around(at)) else { continue };
        absolute += (said - was).abs();
        actual += was;
        count += 1;
    }
    // At least half the day must have been checkable.
    if u64::from(count) * 2 < steps || actual <= 0.0 {
        return None;
    }
    Some(absolute / actual)
}

/// How long a forecast keeps its history: three weekly seasons and a day.
pub const KEEP: Duration = Duration::from_secs(22 * 86_400);
/// One sample per this long is kept: 6,336 over `KEEP`, about 100 kB a metric, whatever the
/// evaluation interval. The model reads 10-minute windows, so nothing finer is needed.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(120);

/// How often the history is read again from the backend, from where the last read ended: a
/// daemon that did not lead, or did not run, evaluated nothing meanwhile, and the backend has
/// what it missed.
pub const REFRESH_EVERY: Duration = Duration::from_secs(86_400);

/// One autoscaler's forecast: a history per metric, read from the backend when it starts and
/// again each `REFRESH_EVERY` for what came since, and fed one evaluation at a time.
#[derive(Clone, Debug, Default)]
pub struct Forecaster {
    histories: Vec<History>,
    backfill: Backfill,
}

/// What has been asked of the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Backfill {
    #[default]
    Wanted,
    /// The history up to this time.
    Asked { until: Timestamp },
}

impl Forecaster {
    /// The span of history to read from the backend now, if any: `KEEP` at the first asking,
    /// then, once `REFRESH_EVERY` has passed, what came since the last read.
    pub fn wants_backfill(&mut self, now: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let from = match self.backfill {
            Backfill::Wanted => minus(now, KEEP),
            Backfill::Asked { until } if now.since(until) >= REFRESH_EVERY => until,
            Backfill::Asked { .. } => return None,
        };
        self.backfill = Backfill::Asked { until: now };
        Some((from, now))
    }

    /// The whole span a forecast keeps: `KEEP` back from `now`.
    pub fn backfill_span(now: Timestamp) -> (Timestamp, Timestamp) {
        (minus(now, KEEP), now)
    }

    /// Takes metric `index`'s past demand, read from its backend, into the holes of what the
    /// evaluations saw: a value is taken where no evaluation's sample lies within half a
    /// `SAMPLE_EVERY` of it (what the daemon saw itself wins).
    pub fn backfill(&mut self, index: usize, values: Vec<(Timestamp, f64)>) {
        if self.histories.len() <= index {
            self.histories.resize_with(index + 1, History::default);
        }
        let Some(history) = self.histories.get_mut(index) else { return };
        let mut seen = std::mem::take(history).samples;
        let near = SAMPLE_EVERY / 2;
        let missing: Vec<(Timestamp, f64)> = values
            .into_iter()
            .filter(|(at, _)| {
                let next = seen.partition_point(|(s, _)| s < at);
                let close = |i: usize| seen.get(i).is_some_and(|(s, _)| s.since(*at).max(at.since(*s)) < near);
                !(close(next) || next > 0 && close(next - 1))
            })
            .collect();
        seen.extend(missing);
        *history = History::new(seen);
    }

    /// Notes the demand each metric's reading stands for at `now`.
    pub fn observe(&mut self, rule: &Rule, readings: &[Reading], ready: u32, now: Timestamp) {
        self.histories.resize_with(readings.len(), History::default);
        for (history, reading) in self.histories.iter_mut().zip(readings) {
            let due = history.samples.last().is_none_or(|(last, _)| now.since(*last) >= SAMPLE_EVERY);
            if let (Reading::Value { value, at }, true) = (reading, due) {
                history.push(*at, demand(rule, *value, ready));
            }
            history.trim(now, KEEP);
        }
    }

    /// Each metric's forecast at `now`, and the highest floor they set.
    pub fn floor(&self, rule: &Rule, forecast_rule: &ForecastRule, current: u32, now: Timestamp) -> Ahead {
        let forecasts: Vec<Forecast> = self
            .histories
            .iter()
            .map(|history| forecast(history, now, forecast_rule.lead_time, forecast_rule.max_error))
            .collect();
        // A floor per metric, each at its own high watermark, then the highest.
        let floor = forecasts
            .iter()
            .enumerate()
            .filter_map(|(metric, f)| match f {
                Forecast::Ready { demand, .. } => floor(rule, metric, forecast_rule, *demand, current),
                Forecast::Unable(_) => None,
            })
            .max();
        Ahead { forecasts, floor }
    }

    /// `rule` with the floor `ahead` says, when the forecast scales and the floor raises the
    /// rule's.
    pub fn apply<'r>(rule: Cow<'r, Rule>, forecast_rule: &ForecastRule, ahead: &Ahead) -> Cow<'r, Rule> {
        if forecast_rule.mode != ForecastMode::Scale {
            return rule;
        }
        // `floor` only sets one that raises the rule's.
        let Some(floor) = ahead.floor else { return rule };
        let lead = humantime::format_duration(forecast_rule.lead_time);
        let max = rule.max_replicas();
        let min_by = Some(format!("the forecast {lead} ahead"));
        Cow::Owned(rule.within(Bounds { min: floor, max, min_by, max_by: None }))
    }
}

/// The demand of past moments from a metric's history and, under `absolute`, the replicas at
/// the same steps (the metric is per replica then; a step without its replicas is left out).
pub fn past_demand(
    rule: &Rule,
    values: &[(Timestamp, Option<f64>)],
    replicas: &[Option<u32>],
) -> Vec<(Timestamp, f64)> {
    values
        .iter()
        .enumerate()
        .filter_map(|(step, (at, value))| {
            let value = (*value)?;
            match rule.algorithm() {
                Algorithm::Average => Some((*at, value)),
                Algorithm::Absolute => Some((*at, demand(rule, value, (*replicas.get(step)?)?))),
            }
        })
        .collect()
}

/// What the forecasts said at one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Ahead {
    /// One per metric.
    pub forecasts: Vec<Forecast>,
    /// The highest floor they set, when one raises the rule's.
    pub floor: Option<u32>,
}

/// The demand a reading stands for: the value itself under `average` (a total the engine
/// divides), the value times the ready replicas under `absolute` (a per-replica load).
pub fn demand(rule: &Rule, value: f64, ready: u32) -> f64 {
    match rule.algorithm() {
        Algorithm::Average => value,
        Algorithm::Absolute => value * f64::from(ready),
    }
}

/// The floor the forecast `demand` of the rule's metric number `metric` sets: the replicas it
/// needs at that metric's own high watermark (the metrics of one rule measure different
/// things: 0.8 cores and 100 requests/s), at most `max_replicas` and `max_factor` times
/// `current`; `None` when it would not raise the rule's own floor.
pub fn floor(rule: &Rule, metric: usize, forecast_rule: &ForecastRule, demand: f64, current: u32) -> Option<u32> {
    let high = rule.metrics().get(metric)?.high_watermark.to_f64();
    if high <= 0.0 || !demand.is_finite() {
        return None;
    }
    let needed = (demand / high).ceil();
    let cap = (f64::from(current.max(1)) * forecast_rule.max_factor).floor();
    let floor = needed.min(cap).min(f64::from(rule.max_replicas()));
    // Within u32: at most max_replicas.
    let floor = floor.max(0.0) as u32;
    (floor > rule.min_running_replicas()).then_some(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: u64 = 300;

    fn t(seconds: u64) -> Timestamp {
        // A Monday at 00:00 UTC.
        Timestamp::from_unix_millis(1_795_392_000_000).plus(Duration::from_secs(seconds))
    }

    /// A day-shaped demand: 100 at night, 1,000 from 09:00 to 17:00, with a ramp, times
    /// `scale`; weekends at half.
    fn shape(seconds: u64, scale: f64) -> f64 {
        let hour = (seconds % 86_400) as f64 / 3_600.0;
        let day = (seconds / 86_400) % 7;
        let base = if (9.0..17.0).contains(&hour) {
            1_000.0
        } else if (7.0..9.0).contains(&hour) {
            100.0 + 450.0 * (hour - 7.0)
        } else {
            100.0
        };
        let weekday = if day >= 5 { 0.5 } else { 1.0 };
        base * weekday * scale
    }

    fn history(days: u64, scale: impl Fn(u64) -> f64) -> History {
        History::new((0..days * 86_400 / STEP).map(|i| (t(i * STEP), shape(i * STEP, scale(i * STEP)))).collect())
    }

    #[test]
    fn a_weekly_season_forecasts_the_monday_morning_ramp_before_it_comes() {
        let h = history(21, |_| 1.0);
        // Monday of the fourth week, 07:00: the ramp starts; in 2h it is the 1,000 plateau.
        let now = t(21 * 86_400 + 7 * 3_600);
        let mut h = h;
        h.push(now, shape(7 * 3_600, 1.0));
        match forecast(&h, now, Duration::from_secs(7_200), 0.3) {
            Forecast::Ready { demand, season, .. } => {
                assert_eq!(season, WEEK);
                assert!((demand - 1_000.0).abs() < 60.0, "{demand}");
            }
            other @ Forecast::Unable(_) => panic!("{other:?}"),
        }
    }

    #[test]
    fn growth_carries_over_through_the_trend_correction() {
        // 2% more every day: three weeks later the demand is well above three weeks ago.
        let growth = |seconds: u64| 1.02f64.powf(seconds as f64 / 86_400.0);
        let h = history(21, growth);
        let now = t(20 * 86_400 + 12 * 3_600);
        let Forecast::Ready { demand, .. } = forecast(&h, now, Duration::from_secs(1_800), 0.3) else {
            panic!("a forecast")
        };
        let truth = shape(20 * 86_400 + 12 * 3_600 + 1_800, growth(20 * 86_400 + 12 * 3_600 + 1_800));
        assert!((demand - truth).abs() / truth < 0.05, "{demand} vs {truth}");
    }

    #[test]
    fn too_little_history_or_too_large_an_error_says_so_and_forecasts_nothing() {
        let short = history(1, |_| 1.0);
        let Forecast::Unable(why) = forecast(&short, t(86_000), Duration::from_secs(600), 0.3) else { panic!() };
        assert!(why.starts_with("too little history"), "{why}");
        // Noise that follows no season: the self-check refuses it.
        let mut noisy = History::default();
        for i in 0..(3 * 86_400 / STEP) {
            let value = if (i * 7_919) % 13 < 6 { 50.0 } else { 1_500.0 };
            noisy.push(t(i * STEP), value);
        }
        let Forecast::Unable(why) = forecast(&noisy, t(3 * 86_400 - STEP), Duration::from_secs(600), 0.3) else {
            panic!("noise is not forecast")
        };
        assert!(why.contains("more than max_error 30%"), "{why}");
    }

    #[test]
    fn history_keeps_only_usable_samples_and_trims_to_its_bound() {
        let mut h = History::new(vec![(t(600), 2.0), (t(0), 1.0), (t(300), f64::NAN), (t(900), -1.0)]);
        assert_eq!(h.len(), 2);
        h.push(t(300), 5.0);
        assert_eq!(h.len(), 2, "not after the last sample");
        h.push(t(1_200), 3.0);
        h.trim(t(1_200), Duration::from_secs(700));
        assert_eq!(h.samples, [(t(600), 2.0), (t(1_200), 3.0)]);
    }

    #[test]
    fn the_floor_is_the_demand_over_the_high_watermark_within_its_caps() {
        let rule = |algorithm: &str| {
            crate::domain::rules::rule_from_json(&serde_json::json!({
                "min_replicas": 2, "max_replicas": 30, "algorithm": algorithm,
                "metric": [{ "name": "rps", "high_watermark": 100, "low_watermark": 50 }]
            }))
            .unwrap()
        };
        let scale = ForecastRule {
            lead_time: Duration::from_secs(600),
            mode: ForecastMode::Scale,
            max_error: 0.3,
            max_factor: 2.0,
        };
        let average = rule("average");
        // 1,250 requests a second over 100 each: 13 replicas; from 10, at most twice as many.
        assert_eq!(floor(&average, 0, &scale, 1_250.0, 10), Some(13));
        assert_eq!(floor(&average, 0, &scale, 1_250.0, 5), Some(10), "max_factor 2 of 5");
        assert_eq!(floor(&average, 0, &scale, 9_000.0, 20), Some(30), "max_replicas");
        assert_eq!(floor(&average, 0, &scale, 150.0, 10), None, "2 is the rule's own floor");
        // Under absolute, a per-replica 80 at 5 ready replicas is a demand of 400.
        let absolute = rule("absolute");
        assert_eq!(demand(&absolute, 80.0, 5), 400.0);
        assert_eq!(demand(&average, 80.0, 5), 80.0);
        // A metric past the rule's is none of its.
        assert_eq!(floor(&average, 1, &scale, 1_250.0, 10), None);
    }

    #[test]
    fn each_metric_forecast_is_divided_by_its_own_high_watermark() {
        let rule = crate::domain::rules::rule_from_json(&serde_json::json!({
            "min_replicas": 2, "max_replicas": 40, "algorithm": "absolute",
            "metric": [
                { "name": "cpu", "high_watermark": 0.8, "low_watermark": 0.5 },
                { "name": "rps", "high_watermark": 100, "low_watermark": 50 }
            ]
        }))
        .unwrap();
        let scale = ForecastRule {
            lead_time: Duration::from_secs(600),
            mode: ForecastMode::Scale,
            max_error: 0.3,
            max_factor: 2.0,
        };
        // 16 cores at 0.8 a replica: 20 (not 16 / 100, under the rule's own floor).
        assert_eq!(floor(&rule, 0, &scale, 16.0, 10), Some(20));
        // 1,000 requests a second at 100 a replica: 10 (not 1,000 / 0.8).
        assert_eq!(floor(&rule, 1, &scale, 1_000.0, 10), Some(10));
        assert_eq!(floor(&rule, 1, &scale, 100.0, 10), None);
    }

    #[test]
    fn a_backfill_comes_once_and_goes_under_what_was_seen() {
        let rule = |algorithm: &str| {
            crate::domain::rules::rule_from_json(&serde_json::json!({
                "max_replicas": 30, "algorithm": algorithm, "metric": [{ "name": "rps", "high_watermark": 100 }]
            }))
            .unwrap()
        };
        let mut forecaster = Forecaster::default();
        assert_eq!(forecaster.wants_backfill(t(86_400 * 30)), Some((t(86_400 * 8), t(86_400 * 30))), "KEEP back");
        assert_eq!(forecaster.wants_backfill(t(86_400 * 30 + 60)), None, "once");
        assert_eq!(forecaster.wants_backfill(t(86_400 * 31)), Some((t(86_400 * 30), t(86_400 * 31))), "a day on");
        let mut forecaster = Forecaster::default();
        // Under absolute the past demand is the value times the replicas of its step.
        let absolute = rule("absolute");
        let values = [(t(0), Some(10.0)), (t(120), None), (t(240), Some(30.0)), (t(360), Some(5.0))];
        assert_eq!(past_demand(&absolute, &values, &[Some(2), Some(2), Some(3), None]), [(t(0), 20.0), (t(240), 90.0)]);
        assert_eq!(past_demand(&rule("average"), &values, &[]), [(t(0), 10.0), (t(240), 30.0), (t(360), 5.0)]);
        let average = rule("average");
        forecaster.observe(&average, &[Reading::Value { value: 50.0, at: t(1_000) }], 1, t(1_000));
        forecaster.observe(&average, &[Reading::Value { value: 60.0, at: t(1_600) }], 1, t(1_600));
        // The backend fills what the evaluations missed: before them, and the hole between.
        let read = [(0, 10.0), (600, 20.0), (1_030, 99.0), (1_200, 40.0), (1_400, 45.0), (1_580, 99.0)];
        forecaster.backfill(0, read.iter().map(|(at, v)| (t(*at), *v)).collect());
        let history = &forecaster.histories[0];
        assert_eq!(
            history.samples,
            [(t(0), 10.0), (t(600), 20.0), (t(1_000), 50.0), (t(1_200), 40.0), (t(1_400), 45.0), (t(1_600), 60.0)]
        );
    }
}
