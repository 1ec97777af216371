//! The replay: a simulated workload driven by the engine, one evaluation per interval.
//!
//! The engine only sees what the daemon would see: the spec, status and ready replica counts
//! and one reading per metric. The workload follows every scale the engine decides, and the
//! manual changes recorded in the trace. New replicas count as ready only after the readiness
//! lag, which is what makes `average` rules overshoot in real clusters.

use std::time::Duration;

use watermarkd_engine::{decide, Action, Algorithm, Decision, Reading, Rule, State, Target, Timestamp, ZeroState};

use super::trace::{ReadingCursor, Trace};
use crate::domain::fallback::{FallbackMemory, FallbackRule};
use crate::domain::forecast::{ForecastRule, Forecaster};
pub use crate::domain::restriction::Restriction;
use crate::domain::schedule::{self, Schedule};

/// A replay longer than this many evaluations is almost certainly a wrong interval or a wrong
/// timestamp unit; refusing it beats filling memory.
pub const MAX_EVALUATIONS: u64 = 2_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Time between two evaluations (the autoscaler's interval).
    pub interval: Duration,
    /// How long a new replica takes to become ready.
    pub readiness_lag: Duration,
    /// Replicas at the start; `None`: the trace's first row's `replicas`, else `min_replicas`.
    pub initial_replicas: Option<u32>,
    /// How the recorded values relate to the simulated replicas.
    pub load_model: LoadModel,
}

/// How a recorded value would have changed had the replica count been the simulated one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LoadModel {
    /// The values are replayed as recorded: right for a signal the replicas do not change (a
    /// queue's depth, requests at the load balancer), and what an `average` rule divides by the
    /// simulated ready replicas itself.
    #[default]
    Recorded,
    /// The values are the total demand, and the metric an `absolute` rule sees is that demand
    /// shared by the simulated ready replicas: scaling 3 -> 30 brings a per-replica latency or
    /// CPU figure down tenfold. An `average` rule already divides a total, so it is unchanged.
    PerReplica,
}

impl LoadModel {
    /// How the chart and the report name it.
    pub fn describe(self) -> &'static str {
        match self {
            LoadModel::Recorded => "recorded values",
            LoadModel::PerReplica => "per-replica (values are total demand ÷ ready replicas)",
        }
    }
}

/// Why a metric is unavailable under the per-replica model while no replica is ready.
pub const NO_READY_REPLICA_REASON: &str = "no ready replica to share the demand (per-replica load model)";

/// The readings an evaluation sees under `model` with `ready` replicas ready.
fn modelled(readings: Vec<Reading>, rule: &Rule, model: LoadModel, ready: u32) -> Vec<Reading> {
    if model == LoadModel::Recorded || rule.algorithm() == Algorithm::Average {
        return readings;
    }
    readings
        .into_iter()
        .map(|reading| match reading {
            Reading::Value { .. } if ready == 0 => Reading::Unavailable { reason: NO_READY_REPLICA_REASON.into() },
            Reading::Value { value, at } => Reading::Value { value: value / f64::from(ready), at },
            unavailable => unavailable,
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("the autoscaler's interval is 0s: there would be no evaluations to replay")]
    ZeroInterval,
    #[error(
        "the trace spans {span} at an interval of {interval}: {evaluations} evaluations, more than the {MAX_EVALUATIONS} a \
         replay allows (are the timestamps in seconds?)"
    )]
    TooManyEvaluations { span: String, interval: String, evaluations: u64 },
}

/// Who changed the replica count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The engine decided it.
    Autoscaler,
    /// A person set it (the trace's `replicas` column).
    Manual,
}

/// One change of the spec replicas.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ScaleChange {
    pub at: Timestamp,
    pub from: u32,
    pub to: u32,
    pub cause: Cause,
    /// The engine's reason, or where the manual change came from.
    pub reason: String,
}

impl ScaleChange {
    pub fn is_up(&self) -> bool {
        self.to > self.from
    }
}

/// One evaluation and what it did to the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    /// The decision, without its state (the replay carries that forward itself).
    pub decision: Decision,
    /// Spec replicas after the decision was applied.
    pub spec_after: u32,
}

impl Tick {
    pub fn at(&self) -> Timestamp {
        self.decision.now
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    pub start: Timestamp,
    pub end: Timestamp,
    pub options: ReplayOptions,
    pub initial_replicas: u32,
    pub ticks: Vec<Tick>,
    /// Every spec change, in time order: the engine's scales and the manual ones.
    pub changes: Vec<ScaleChange>,
}

/// The replicas of the simulated workload, with when each group of them becomes ready.
#[derive(Clone, Debug)]
struct Workload {
    spec: u32,
    /// Replicas grouped by when they become ready, oldest first.
    cohorts: Vec<(u32, Timestamp)>,
}

impl Workload {
    fn new(replicas: u32, at: Timestamp) -> Self {
        // The starting replicas have been running for a while: ready from the start.
        Workload { spec: replicas, cohorts: vec![(replicas, at)] }
    }

    fn scale_to(&mut self, replicas: u32, at: Timestamp, readiness_lag: Duration) {
        if replicas > self.spec {
            self.cohorts.push((replicas - self.spec, at.plus(readiness_lag)));
        } else {
            // A ReplicaSet removes not-ready pods first, so the newest replicas go first.
            let mut to_remove = self.spec - replicas;
            while to_remove > 0 {
                let Some(newest) = self.cohorts.last_mut() else { break };
                let removed = newest.0.min(to_remove);
                newest.0 -= removed;
                to_remove -= removed;
                if newest.0 == 0 {
                    self.cohorts.pop();
                }
            }
        }
        self.spec = replicas;
    }

    fn ready_at(&self, now: Timestamp) -> u32 {
        self.cohorts.iter().filter(|(_, ready_at)| *ready_at <= now).map(|(count, _)| count).sum()
    }
}

/// Evaluates the rule at `start`, `start + interval`, ... up to the trace's last timestamp.
pub fn replay(rule: &Rule, trace: &Trace, options: ReplayOptions) -> Result<Replay, ReplayError> {
    replay_ahead(rule, Ahead::default(), trace, options)
}

/// What an autoscaler has besides its rule, replayed with it: a schedule, a forecast, a
/// fallback. (A pause only keeps it from writing, and a replay shows what it would do anyway.)
#[derive(Clone, Copy, Debug, Default)]
pub struct Ahead<'a> {
    pub schedules: &'a [Schedule],
    pub forecast: Option<&'a ForecastRule>,
    pub fallback: Option<&'a FallbackRule>,
}

impl<'a> Ahead<'a> {
    pub fn of(autoscaler: &'a crate::domain::rules::Autoscaler) -> Self {
        Ahead {
            schedules: &autoscaler.schedules,
            forecast: autoscaler.forecast.as_deref(),
            fallback: autoscaler.fallback.as_deref(),
        }
    }

    /// Whether there is anything besides the rule.
    pub fn is_some(&self) -> bool {
        !self.schedules.is_empty() || self.forecast.is_some() || self.fallback.is_some()
    }
}

/// [`replay`], with a schedule setting each decision's bounds at the trace's own times, a
/// forecast learning from the trace as it goes, and a fallback counting the trace's gaps, as
/// they would have in the daemon.
pub fn replay_ahead(
    rule: &Rule,
    with: Ahead<'_>,
    trace: &Trace,
    options: ReplayOptions,
) -> Result<Replay, ReplayError> {
    let mut ahead = with.forecast.map(|f| (Forecaster::default(), f));
    let mut fallback = with.fallback.map(|f| (FallbackMemory::default(), f));
    let schedules = with.schedules;
    let (Some(first), Some(last)) = (trace.rows.first(), trace.rows.last()) else {
        // `parse_trace` never returns an empty trace; an empty one has nothing to replay.
        return Ok(Replay {
            start: Timestamp::from_unix_millis(0),
            end: Timestamp::from_unix_millis(0),
            options,
            initial_replicas: options.initial_replicas.unwrap_or(rule.min_replicas()),
            ticks: Vec::new(),
            changes: Vec::new(),
        });
    };
    if options.interval.is_zero() {
        return Err(ReplayError::ZeroInterval);
    }
    let (start, end) = (first.at, last.at);
    let interval_ms = u64::try_from(options.interval.as_millis()).unwrap_or(u64::MAX).max(1);
    let evaluations = u64::try_from(end.unix_millis() - start.unix_millis()).unwrap_or(0) / interval_ms + 1;
    if evaluations > MAX_EVALUATIONS {
        return Err(ReplayError::TooManyEvaluations {
            span: humantime::format_duration(end.since(start)).to_string(),
            interval: humantime::format_duration(options.interval).to_string(),
            evaluations,
        });
    }

    let initial_replicas = options.initial_replicas.or(first.replicas).unwrap_or(rule.min_replicas());
    let mut workload = Workload::new(initial_replicas, start);
    // The first row's count is the starting point, not a change a person made during the trace.
    let mut manual_changes = trace.rows.iter().skip(1).filter_map(|row| row.replicas.map(|r| (row, r))).peekable();
    let mut cursor = ReadingCursor::new(trace);
    let mut state = State::default();
    if initial_replicas == 0 && rule.scale_to_zero().is_some() {
        // A rule that scales to zero, starting at zero: its own zero, which activity wakes
        // (a person's pause would keep the whole replay at zero and show nothing).
        state.zero = Some(Box::new(ZeroState { idle_since: None, scaled_to_zero_at: Some(start) }));
    }
    let mut ticks = Vec::with_capacity(usize::try_from(evaluations).unwrap_or(0));
    let mut changes = Vec::new();

    for index in 0..evaluations {
        let now = start.plus(options.interval.saturating_mul(u32::try_from(index).unwrap_or(u32::MAX)));
        while let Some((row, replicas)) = manual_changes.next_if(|(row, _)| row.at <= now) {
            if replicas != workload.spec {
                changes.push(ScaleChange {
                    at: row.at,
                    from: workload.spec,
                    to: replicas,
                    cause: Cause::Manual,
                    reason: format!("set by a person (trace line {})", row.line),
                });
                workload.scale_to(replicas, row.at, options.readiness_lag);
            }
        }

        let spec = workload.spec;
        let ready = workload.ready_at(now).min(spec);
        let readings = modelled(cursor.readings_at(now), rule, options.load_model, ready);
        let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(ready) };
        let mut bounded = schedule::rule_at(rule, schedules, now);
        if let Some((forecaster, forecast_rule)) = ahead.as_mut() {
            forecaster.observe(rule, &readings, ready, now);
            let said = forecaster.floor(&bounded, forecast_rule, spec, now);
            bounded = Forecaster::apply(bounded, forecast_rule, &said);
        }
        let decide_with = |rule: &Rule| decide(rule, target, &readings, &state, now);
        let mut decision = match fallback.as_mut() {
            Some((memory, declared)) => memory.decide(declared, &bounded, now, decide_with).0,
            None => decide_with(&bounded),
        };
        state = std::mem::take(&mut decision.state);
        decision.state_if_not_written = State::default();

        // A dry-run rule decides without writing; the replay shows what it would have done.
        let scales = decision.write || decision.action != Action::Hold;
        if scales && decision.replicas != spec {
            changes.push(ScaleChange {
                at: now,
                from: spec,
                to: decision.replicas,
                cause: Cause::Autoscaler,
                reason: decision.reason.clone(),
            });
            workload.scale_to(decision.replicas, now, options.readiness_lag);
        }
        ticks.push(Tick { decision, spec_after: workload.spec });
    }

    Ok(Replay { start, end, options, initial_replicas, ticks, changes })
}

/// Also the chart's tests build their replays with these helpers.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::commands::simulate::trace::parse_trace;
    use watermarkd_engine::{Algorithm, Decimal, Guard, MetricSpec, Position, RuleSpec};

    pub(crate) const T0: i64 = 1_714_521_600; // 2024-05-01T00:00:00Z

    pub(crate) fn rule(change: impl FnOnce(&mut RuleSpec)) -> Rule {
        let mut spec = RuleSpec {
            min_replicas: Some(1),
            max_replicas: Some(50),
            tolerance: Some(Decimal::zero()),
            metrics: vec![MetricSpec {
                name: "m".into(),
                low_watermark: Some(Decimal::from_int(50)),
                high_watermark: Some(Decimal::from_int(100)),
                max_age: None,
                activation: None,
            }],
            upscale_forbidden_window: Some(Duration::ZERO),
            downscale_forbidden_window: Some(Duration::ZERO),
            scale_up_limit_factor: Some(Decimal::from_int(1000)),
            scale_down_limit_factor: Some(Decimal::from_int(99)),
            ..Default::default()
        };
        change(&mut spec);
        match Rule::new(spec) {
            Ok(rule) => rule,
            Err(errors) => panic!("test rule is invalid: {errors:?}"),
        }
    }

    /// A trace with column `m` (and `replicas`) from `(seconds after T0, value, replicas)`.
    pub(crate) fn trace(rows: &[(i64, Option<f64>, Option<u32>)]) -> Trace {
        let mut text = String::from("timestamp,m,replicas\n");
        for (offset, value, replicas) in rows {
            let value = value.map(|v| v.to_string()).unwrap_or_default();
            let replicas = replicas.map(|r| r.to_string()).unwrap_or_default();
            text.push_str(&format!("{},{value},{replicas}\n", T0 + offset));
        }
        parse_trace(&text, &["m".to_string()]).unwrap()
    }

    pub(crate) fn options(interval: u64) -> ReplayOptions {
        ReplayOptions {
            interval: Duration::from_secs(interval),
            readiness_lag: Duration::ZERO,
            initial_replicas: None,
            load_model: LoadModel::Recorded,
        }
    }

    fn offsets(replay: &Replay) -> Vec<i64> {
        replay.ticks.iter().map(|t| t.at().unix_millis() / 1000 - T0).collect()
    }

    #[test]
    fn a_rule_that_scales_to_zero_starts_at_its_own_zero_wakes_and_sleeps_again() {
        let zero = rule(|s| {
            s.min_replicas = Some(0);
            s.metrics[0].activation = Some(Decimal::from_int(5));
            s.scale_to_zero_delay = Some(Duration::from_secs(60));
            s.tolerate_zero = Some(true);
        });
        // Quiet, a burst of 80 for two minutes, then quiet for five.
        let rows: Vec<_> =
            (0..20).map(|i| (i * 30, Some(if (2..6).contains(&i) { 80.0 } else { 0.0 }), None)).collect();
        let replay = replay(&zero, &trace(&rows), options(30)).unwrap();
        assert_eq!(replay.initial_replicas, 0);
        let moves: Vec<(i64, u32, u32)> =
            replay.changes.iter().map(|c| (c.at.unix_millis() / 1000 - T0, c.from, c.to)).collect();
        // Woken at the burst; back at one replica's count as it ends; to zero a minute after.
        assert_eq!(moves, [(60, 0, 1), (240, 1, 0)], "{:?}", replay.changes);
    }

    #[test]
    fn ticks_start_at_the_first_row_and_stop_at_or_before_the_last() {
        let trace = trace(&[(0, Some(70.0), None), (50, Some(70.0), None), (100, Some(70.0), None)]);
        let replay = replay(&rule(|_| {}), &trace, options(30)).unwrap();
        assert_eq!(offsets(&replay), vec![0, 30, 60, 90]);
        let replay_exact = super::replay(&rule(|_| {}), &trace, options(25)).unwrap();
        assert_eq!(offsets(&replay_exact), vec![0, 25, 50, 75, 100]);
    }

    #[test]
    fn per_replica_load_shares_the_demand_among_the_simulated_ready_replicas() {
        // A demand of 300 on 2 replicas: 150 each, above the high watermark of 100.
        let rows: Vec<_> = (0..6).map(|i| (i * 30, Some(300.0), if i == 0 { Some(2) } else { None })).collect();
        let trace = trace(&rows);
        let recorded = replay(&rule(|_| {}), &trace, options(30)).unwrap();
        // As recorded, 300 never falls, and the rule keeps adding replicas up to its maximum.
        assert_eq!(recorded.ticks.last().unwrap().spec_after, 50);
        let per_replica = ReplayOptions { load_model: LoadModel::PerReplica, ..options(30) };
        let modelled = replay(&rule(|_| {}), &trace, per_replica).unwrap();
        let seen: Vec<Option<f64>> = modelled.ticks.iter().map(|t| t.decision.metrics[0].value).collect();
        assert_eq!(seen, vec![Some(150.0), Some(100.0), Some(100.0), Some(100.0), Some(100.0), Some(100.0)]);
        assert_eq!(modelled.changes.len(), 1, "{:?}", modelled.changes);
        assert_eq!(modelled.ticks.last().unwrap().spec_after, 3);
        // An `average` rule divides the total itself: the model changes nothing for it.
        let average = rule(|s| s.algorithm = Some(Algorithm::Average));
        let as_recorded = replay(&average, &trace, options(30)).unwrap();
        assert_eq!(replay(&average, &trace, per_replica).unwrap().changes, as_recorded.changes);
    }

    #[test]
    fn per_replica_readings_wait_for_new_replicas_to_be_ready() {
        let rows: Vec<_> = (0..4).map(|i| (i * 30, Some(300.0), if i == 0 { Some(2) } else { None })).collect();
        let lagged =
            ReplayOptions { load_model: LoadModel::PerReplica, readiness_lag: Duration::from_secs(90), ..options(30) };
        let replay = replay(&rule(|_| {}), &trace(&rows), lagged).unwrap();
        // Until the third replica is ready (90 s after the scale), the two old ones still carry
        // 150 each; then the three share it.
        let seen: Vec<Option<f64>> = replay.ticks.iter().map(|t| t.decision.metrics[0].value).collect();
        assert_eq!(seen, [Some(150.0), Some(150.0), Some(150.0), Some(100.0)]);
        let ready: Vec<u32> = replay.ticks.iter().map(|t| t.decision.ready_replicas).collect();
        assert_eq!(ready, [2, 2, 2, 3]);
    }

    #[test]
    fn each_tick_reads_the_newest_row_at_or_before_it() {
        // Rows at 0 and 50: the tick at 30 still sees the row at 0, the one at 60 the row at 50.
        let trace = trace(&[(0, Some(70.0), None), (50, Some(250.0), None), (100, Some(70.0), None)]);
        let replay = replay(&rule(|_| {}), &trace, options(30)).unwrap();
        let seen: Vec<Option<f64>> = replay.ticks.iter().map(|t| t.decision.metrics[0].value).collect();
        assert_eq!(seen, vec![Some(70.0), Some(70.0), Some(250.0), Some(250.0)]);
        let data_times: Vec<i64> =
            replay.ticks.iter().map(|t| t.decision.metrics[0].data_time.unwrap().unix_millis() / 1000 - T0).collect();
        assert_eq!(data_times, vec![0, 0, 50, 50]);
    }

    #[test]
    fn an_empty_cell_makes_the_metric_unavailable_and_holds() {
        let trace = trace(&[(0, Some(70.0), Some(4)), (30, None, None), (60, Some(10.0), None)]);
        let replay = replay(&rule(|_| {}), &trace, options(30)).unwrap();
        let gap = &replay.ticks[1].decision;
        assert_eq!(gap.metrics[0].position, Position::Unavailable);
        assert_eq!(gap.metrics[0].note.as_deref(), Some("no data in trace"));
        assert_eq!(gap.guard, Some(Guard::NoData));
        assert_eq!(replay.ticks[1].spec_after, 4);
        assert_eq!(Restriction::dominant(gap), Some(Restriction::NoData));
        // Data comes back low: now it scales down.
        assert!(replay.ticks[2].spec_after < 4);
    }

    #[test]
    fn initial_replicas_come_from_the_option_then_the_first_row_then_min() {
        let with_first = trace(&[(0, Some(70.0), Some(7)), (30, Some(70.0), None)]);
        let without = trace(&[(0, Some(70.0), None), (30, Some(70.0), None)]);
        let r = rule(|s| s.min_replicas = Some(3));
        assert_eq!(replay(&r, &with_first, options(30)).unwrap().initial_replicas, 7);
        assert_eq!(replay(&r, &without, options(30)).unwrap().initial_replicas, 3);
        let forced = ReplayOptions { initial_replicas: Some(5), ..options(30) };
        let replay_forced = replay(&r, &with_first, forced).unwrap();
        assert_eq!(replay_forced.initial_replicas, 5);
        // The first row's count is not replayed as a manual change over the forced start.
        assert!(replay_forced.changes.is_empty());
    }

    #[test]
    fn manual_changes_apply_at_their_row_time_between_ticks() {
        let trace = trace(&[(0, Some(70.0), Some(4)), (45, Some(70.0), Some(9)), (90, Some(70.0), None)]);
        let replay = replay(&rule(|_| {}), &trace, options(30)).unwrap();
        assert_eq!(replay.changes.len(), 1);
        let change = &replay.changes[0];
        assert_eq!((change.from, change.to, change.cause), (4, 9, Cause::Manual));
        assert_eq!(change.at.unix_millis() / 1000 - T0, 45);
        assert!(change.reason.contains("line 3"), "{}", change.reason);
        // The tick at 60 sees spec 9 (usage 70 is inside 50..100, so it holds there).
        assert_eq!(replay.ticks[2].decision.spec_replicas, 9);
    }

    #[test]
    fn new_replicas_become_ready_after_the_readiness_lag() {
        // Total load 400 on 2 replicas (average, high 100): the engine asks for 4 at once.
        let r = rule(|s| s.algorithm = Some(Algorithm::Average));
        let rows: Vec<(i64, Option<f64>, Option<u32>)> =
            (0..=8).map(|i| (i * 30, Some(400.0), if i == 0 { Some(2) } else { None })).collect();
        let lagged = ReplayOptions { readiness_lag: Duration::from_secs(90), ..options(30) };
        let replay = replay(&r, &trace(&rows), lagged).unwrap();
        let ready: Vec<u32> = replay.ticks.iter().map(|t| t.decision.ready_replicas).collect();
        let spec: Vec<u32> = replay.ticks.iter().map(|t| t.decision.spec_replicas).collect();
        // Scaled 2 -> 4 at 0s; the two new replicas count from 90s on.
        assert_eq!(spec[..5], [2, 4, 4, 4, 4]);
        assert_eq!(ready[..5], [2, 2, 2, 4, 4]);
        // While they are not ready the usage is 400 / 2, not 400 / 4.
        assert_eq!(replay.ticks[1].decision.metrics[0].usage, Some(200.0));
        assert_eq!(replay.ticks[3].decision.metrics[0].usage, Some(100.0));
    }

    #[test]
    fn scale_downs_remove_the_newest_replicas_first() {
        let mut workload = Workload::new(3, Timestamp::from_unix_millis(0));
        workload.scale_to(6, Timestamp::from_unix_millis(0), Duration::from_secs(60));
        assert_eq!(workload.ready_at(Timestamp::from_unix_millis(1000)), 3);
        workload.scale_to(4, Timestamp::from_unix_millis(1000), Duration::from_secs(60));
        // One pending replica left, three ready ones untouched.
        assert_eq!(workload.ready_at(Timestamp::from_unix_millis(1000)), 3);
        assert_eq!(workload.ready_at(Timestamp::from_unix_millis(60_000)), 4);
        workload.scale_to(2, Timestamp::from_unix_millis(61_000), Duration::from_secs(60));
        assert_eq!(workload.ready_at(Timestamp::from_unix_millis(61_000)), 2);
    }

    #[test]
    fn a_forbidden_window_shows_as_the_restriction() {
        let r = rule(|s| s.upscale_forbidden_window = Some(Duration::from_secs(120)));
        let rows: Vec<(i64, Option<f64>, Option<u32>)> = (0..=4)
            .map(|i| (i * 30, Some(if i == 0 { 70.0 } else { 250.0 }), if i == 0 { Some(2) } else { None }))
            .collect();
        // 70 is inside for 2 replicas; at 30s 250 asks for more. No scale happened yet, so
        // the window is open and it scales; at 60s it asks again and the window holds it.
        let replay = replay(&r, &trace(&rows), options(30)).unwrap();
        assert_eq!(replay.ticks[1].decision.action, Action::ScaleUp);
        assert_eq!(Restriction::dominant(&replay.ticks[2].decision), Some(Restriction::UpscaleWindow));
    }

    #[test]
    fn a_zero_interval_is_an_error() {
        let trace = trace(&[(0, Some(70.0), None), (30, Some(70.0), None)]);
        assert_eq!(replay(&rule(|_| {}), &trace, options(0)), Err(ReplayError::ZeroInterval));
    }

    #[test]
    fn a_schedule_raises_the_floor_at_the_trace_times_and_its_end_drops_nothing_at_once() {
        use crate::domain::schedule::{parse_days, parse_time, Schedule, When, Zone};
        // 2024-05-01 was a Wednesday; the window opens at 02:00 UTC and closes at 03:00.
        let window = Schedule {
            name: "night-batch".into(),
            when: When::Weekly {
                days: parse_days(&["daily".into()]).unwrap(),
                start: parse_time("02:00").unwrap(),
                end: parse_time("03:00").unwrap(),
            },
            time_zone: Zone::named("UTC").unwrap(),
            min_replicas: 8,
            max_replicas: None,
            ramp_in: Duration::ZERO,
            ramp_out: Duration::ZERO,
        };
        // A load inside the band at one replica, then nothing asks for more or less... until
        // the floor goes, when the low load brings the replicas down by the rule's own limit.
        let r = rule(|s| s.scale_down_limit_factor = Some(Decimal::from_int(50)));
        let rows: Vec<_> =
            (0..=4 * 60).map(|minute| (minute * 60, Some(if minute < 180 { 75.0 } else { 10.0 }), None)).collect();
        let windows = [window];
        let with = Ahead { schedules: &windows, ..Ahead::default() };
        let scheduled = replay_ahead(&r, with, &trace(&rows), options(60)).unwrap();
        let changes: Vec<(i64, u32, u32)> =
            scheduled.changes.iter().map(|c| (c.at.unix_millis() / 1000 - T0, c.from, c.to)).collect();
        assert_eq!(changes.first(), Some(&(7200, 1, 8)), "{changes:?}");
        assert!(scheduled.changes[0].reason.contains("schedule \"night-batch\""), "{}", scheduled.changes[0].reason);
        // After 03:00 the floor is gone but the load is in its band: the replicas stay until
        // 03:00, when it falls, and then come down by halves, not at once.
        let after: Vec<_> = changes.iter().filter(|(at, _, _)| *at >= 10_800).collect();
        assert_eq!(after.first().map(|c| (c.1, c.2)), Some((8, 4)), "{changes:?}");
        // Without the schedule nothing happens at 02:00.
        let plain = replay(&r, &trace(&rows), options(60)).unwrap();
        assert!(plain.changes.iter().all(|c| c.at.unix_millis() / 1000 - T0 >= 10_800), "{:?}", plain.changes);
    }

    #[test]
    fn a_fallback_counts_the_gaps_of_the_trace() {
        use crate::domain::fallback::{FallbackAction, FallbackRule};
        let declared = FallbackRule {
            after: Duration::from_secs(300),
            recover_after: Duration::from_secs(120),
            action: FallbackAction::Replicas { replicas: 6, scale_down: false },
        };
        // In the band at one replica, then ten minutes without data, then in the band again.
        let rows: Vec<_> =
            (0..=30).map(|minute| (minute * 60, (!(10..20).contains(&minute)).then_some(75.0), None)).collect();
        let with = Ahead { fallback: Some(&declared), ..Ahead::default() };
        let replay = replay_ahead(&rule(|_| {}), with, &trace(&rows), options(60)).unwrap();
        let changes: Vec<(i64, u32, u32)> =
            replay.changes.iter().map(|c| (c.at.unix_millis() / 1000 - T0, c.from, c.to)).collect();
        assert_eq!(changes.first(), Some(&(900, 1, 6)), "five minutes into the gap: {changes:?}");
        assert!(replay.changes[0].reason.contains("falling back to 6 replicas"), "{}", replay.changes[0].reason);
        // Without the fallback the gap holds.
        assert!(super::replay(&rule(|_| {}), &trace(&rows), options(60)).unwrap().changes.is_empty());
    }
}
