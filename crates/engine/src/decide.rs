//! One decision, in the order docs/engine.md gives: per-metric proposals, the several-metrics rule,
//! the guards, velocity (WPA knobs or `behavior`), windows and delays, then the new state.

use std::time::Duration;

use crate::decision::{Action, Decision, Guard, Limit, MetricOutcome, Position, Stabilization, Timing};
use crate::history;
use crate::input::{Reading, Recommendation, ScaleEvent, State, Target};
use crate::number::{human, Decimal};
use crate::rule::{
    Algorithm, Behavior, ConvergeTowards, MetricRule, PolicyKind, Rule, ScalingRules, SelectPolicy, Velocity,
    WatermarkVelocity,
};
use crate::time::Timestamp;

/// A metric after §1: its outcome plus what the combination step needs to know.
struct Evaluated {
    outcome: MetricOutcome,
    /// The reading was usable (a finite, fresh, non-negative value or a replica count).
    usable: bool,
    /// The proposal is a convergence step, not a watermark crossing.
    converging: bool,
}

/// What §2 made of the metrics' proposals.
struct Combined {
    /// The largest proposal, on the modulo's grid and held at `spec` on partial data.
    proposal: Option<u32>,
    /// The metric that gave it.
    proposal_metric: Option<String>,
    /// Why partial data held a smaller proposal at `spec`.
    held_note: Option<String>,
    /// The move is a convergence step (§4): some metric steps and none crossed its band.
    converging: bool,
}

/// What the velocity stage made of the proposal.
struct Normalized {
    replicas: u32,
    limit: Limit,
    stabilization: Option<Stabilization>,
    upscale_limit: u32,
    downscale_limit: u32,
}

/// §1 to §5: the decision of a rule that does not scale to zero, and of one that does while
/// the workload runs (its floor is then one replica).
pub(crate) fn decide_running(
    rule: &Rule,
    target: Target,
    readings: &[Reading],
    state: &State,
    now: Timestamp,
) -> Decision {
    let spec = target.spec_replicas;
    let ready = target.effective_ready();
    let evaluated: Vec<Evaluated> = rule
        .metrics()
        .iter()
        .enumerate()
        .map(|(i, metric)| evaluate_metric(rule, metric, readings.get(i), spec, ready, now))
        .collect();
    let mut decision = holding(rule, spec, ready, &evaluated, state, now);

    // §5: a person paused the workload; nothing here is ours to change, not even the state. A
    // workload this rule's earlier version scaled to zero is not paused: a rule that no longer
    // scales to zero brings it back to its minimum (the guard below).
    if spec == 0 && !state.scaled_to_zero_here() {
        decision.metrics = evaluated.into_iter().map(|e| e.outcome).collect();
        decision.guard = Some(Guard::Paused);
        decision.limit = Limit::Paused;
        decision.reason = "spec.replicas is 0: the workload is paused by a person; doing nothing".into();
        return decision;
    }

    let usable = evaluated.iter().filter(|e| e.usable).count();
    let all_usable = usable == evaluated.len();
    let mut next = carried_state(rule, state, &evaluated, usable, all_usable, now);

    // §1 and §2: the combined proposal.
    let combined = combine(rule, &evaluated, spec, all_usable);
    decision.proposal = combined.proposal;
    decision.proposal_metric = combined.proposal_metric;
    decision.converging = combined.converging;
    decision.timing = timing(rule, state, &next, now, decision.converging);
    let metric_summary = describe_metrics(rule, &evaluated);
    decision.metrics = evaluated.into_iter().map(|e| e.outcome).collect();

    // §5 guards, in order; without one, §3 or §3b and the windows and delays.
    let (replicas, action, verdict) = match first_guard(rule, spec, ready, usable, all_usable) {
        Some((guard, replicas)) => guarded(&mut decision, rule, guard, replicas),
        None => velocity(&mut decision, rule, state, &mut next, now),
    };

    // §6: the output and the next state, which records the scale unless the write fails.
    decision.replicas = replicas;
    decision.action = action;
    decision.write = action != Action::Hold && !rule.dry_run();
    decision.reason = reason(rule, metric_summary, combined.held_note, verdict, action);
    decision.state_if_not_written = next.clone();
    if action != Action::Hold {
        record_scale(rule, &mut next, spec, replicas, now);
    }
    decision.state = next;
    decision
}

/// The decision before any step has spoken: hold `spec`, with the state as it came. The steps
/// of [`decide_running`] fill in what they find.
fn holding(rule: &Rule, spec: u32, ready: u32, evaluated: &[Evaluated], state: &State, now: Timestamp) -> Decision {
    Decision {
        now,
        spec_replicas: spec,
        ready_replicas: ready,
        metrics: Vec::new(),
        proposal: None,
        proposal_metric: None,
        above_high_watermark: evaluated.iter().any(|e| e.outcome.position == Position::Above),
        below_low_watermark: evaluated.iter().any(|e| e.outcome.position == Position::Below),
        converging: false,
        stabilization: None,
        upscale_limit: None,
        downscale_limit: None,
        normalized: None,
        limit: Limit::WithinRange,
        timing: Timing {
            upscale_allowed: false,
            downscale_allowed: false,
            upscale_window_seconds_left: 0.0,
            downscale_window_seconds_left: 0.0,
            upscale_delay_seconds_left: 0.0,
            downscale_delay_seconds_left: 0.0,
        },
        guard: None,
        replicas: spec,
        action: Action::Hold,
        write: false,
        dry_run: rule.dry_run(),
        reason: String::new(),
        bounds_by: rule.bounds_by().cloned(),
        fallback: None,
        state: state.clone(),
        state_if_not_written: state.clone(),
    }
}

/// §2: the largest proposal, held at `spec` when partial data would scale down, and put on the
/// modulo's grid.
fn combine(rule: &Rule, evaluated: &[Evaluated], spec: u32, all_usable: bool) -> Combined {
    // The largest proposal wins and names the reason; among equals prefer a metric that crossed
    // a watermark (and, as `max_by_key` does, the last of those).
    let winner = evaluated
        .iter()
        .filter_map(|e| e.outcome.proposal.map(|p| (e, p)))
        .max_by_key(|&(e, p)| (p, e.outcome.position == Position::Above));
    let converging = evaluated.iter().any(|e| e.converging)
        && !evaluated.iter().any(|e| matches!(e.outcome.position, Position::Above | Position::Below));
    let Some((winner, mut proposal)) = winner else {
        return Combined { proposal: None, proposal_metric: None, held_note: None, converging };
    };
    let mut held_note = None;
    if !all_usable && proposal < spec {
        held_note = Some(format!(
            "{} would allow {proposal} but {} unavailable, and partial data never scales down",
            metric_list(evaluated, |e| e.usable),
            metric_list(evaluated, |e| !e.usable)
        ));
        proposal = spec;
    }
    // A metric above the band has already rounded its own formula (§1), so a proposal
    // equal to `spec` means nothing on the grid above `spec` is asked for: hold.
    if proposal != spec {
        proposal = round_up_to_modulo(proposal, rule.replica_modulo(), spec);
    }
    Combined { proposal: Some(proposal), proposal_metric: Some(winner.outcome.name.clone()), held_note, converging }
}

/// §5, cases 1 to 6: the first guard that applies, and the count it goes to.
fn first_guard(rule: &Rule, spec: u32, ready: u32, usable: usize, all_usable: bool) -> Option<(Guard, u32)> {
    if spec > rule.max_replicas() && all_usable {
        Some((Guard::AboveMax, rule.max_replicas()))
    } else if spec < rule.min_running_replicas() && usable > 0 {
        Some((Guard::BelowMin, rule.min_running_replicas()))
    } else if usable == 0 {
        Some((Guard::NoData, fallback_target(rule, spec).unwrap_or(spec)))
    } else if u64::from(ready) * 100 < u64::from(rule.min_available_replica_percentage()) * u64::from(spec) {
        Some((Guard::MinAvailable, spec))
    } else if ready == 0 {
        Some((Guard::NoReadyReplicas, spec))
    } else if spec > rule.max_replicas() || spec < rule.min_running_replicas() {
        // Out of bounds but the data needed to act on it is missing: hold.
        Some((Guard::NoData, spec))
    } else {
        None
    }
}

/// §5: a guard sets the count, without forbidden windows, delays or rate limits. Returns the
/// count, the action and the verdict for the reason.
fn guarded(decision: &mut Decision, rule: &Rule, guard: Guard, replicas: u32) -> (u32, Action, String) {
    let (spec, ready) = (decision.spec_replicas, decision.ready_replicas);
    decision.guard = Some(guard);
    decision.limit = Limit::of_guard(guard);
    let verdict = guard_verdict(guard, rule, spec, ready, &decision.metrics);
    if guard == Guard::NoData && decision.metrics.iter().all(|m| m.position == Position::Unavailable) {
        decision.fallback = rule.fallback().map(|f| f.because.clone());
    }
    (replicas, action_for(spec, replicas), verdict)
}

/// §3 or §3b, then the forbidden windows and delays: how far the proposal may move now.
/// Returns the count, the action and the verdict for the reason.
fn velocity(
    decision: &mut Decision,
    rule: &Rule,
    old: &State,
    next: &mut State,
    now: Timestamp,
) -> (u32, Action, String) {
    let spec = decision.spec_replicas;
    let proposal = decision.proposal.unwrap_or(spec);
    let normalized = normalize(rule, spec, decision.ready_replicas, proposal, old, next, now);
    decision.normalized = Some(normalized.replicas);
    decision.limit = normalized.limit;
    decision.stabilization = normalized.stabilization;
    decision.upscale_limit = Some(normalized.upscale_limit);
    decision.downscale_limit = Some(normalized.downscale_limit);
    let wanted = action_for(spec, normalized.replicas);
    let blocked = match wanted {
        Action::ScaleUp => window_or_delay(rule, &decision.timing, decision.converging, true),
        Action::ScaleDown => window_or_delay(rule, &decision.timing, decision.converging, false),
        Action::Hold => None,
    };
    let (replicas, action) = if blocked.is_some() { (spec, Action::Hold) } else { (normalized.replicas, wanted) };
    let verdict = velocity_verdict(rule, decision, proposal, &normalized, blocked);
    (replicas, action, verdict)
}

/// §3: what holds a move the rate limits allowed, up or down: the forbidden window since the
/// last scale, or the delay on the watermark condition, which never holds a convergence step.
fn window_or_delay(rule: &Rule, timing: &Timing, converging: bool, up: bool) -> Option<String> {
    let (window_left, delay_left) = if up {
        (timing.upscale_window_seconds_left, timing.upscale_delay_seconds_left)
    } else {
        (timing.downscale_window_seconds_left, timing.downscale_delay_seconds_left)
    };
    if window_left > 0.0 {
        Some(window_note(rule, window_left, up))
    } else if delay_left > 0.0 && !converging {
        Some(delay_note(rule, delay_left, up))
    } else {
        None
    }
}

/// §6: a scale's mark on the next state: its time, and with `behavior` the scale event the
/// policies count.
pub(crate) fn record_scale(rule: &Rule, state: &mut State, from: u32, to: u32, now: Timestamp) {
    state.last_scale_time = Some(now);
    if rule.scale_event_horizon() > Duration::ZERO {
        history::record_scale_event(&mut state.scale_events, ScaleEvent::new(from, to, now));
    }
}

/// One usable value in exact decimals, as §1's formulas and §4's steps read it. Usage is
/// `value / per` and the load is `ready x usage`; comparisons multiply the other side by `per`
/// rather than divide by it, so that the arithmetic stays exact.
struct Load {
    value: Decimal,
    /// 1 with `absolute`, the ready count with `average`.
    per: Decimal,
    /// `ready x value`: the load times `per`.
    scaled: Decimal,
}

impl Load {
    /// What one replica at `watermark` adds to `scaled`.
    fn per_replica_at(&self, watermark: &Decimal) -> Decimal {
        self.per.mul(watermark)
    }
}

/// §1 for one metric.
fn evaluate_metric(
    rule: &Rule,
    metric: &MetricRule,
    reading: Option<&Reading>,
    spec: u32,
    ready: u32,
    now: Timestamp,
) -> Evaluated {
    let band = rule.band(metric);
    let mut outcome = unread_outcome(metric, &band);
    let unavailable = |mut outcome: MetricOutcome, why: String| {
        outcome.note = Some(why);
        Evaluated { outcome, usable: false, converging: false }
    };

    let (value, at) = match reading {
        None => return unavailable(outcome, "no reading".into()),
        Some(Reading::Unavailable { reason }) => return unavailable(outcome, reason.clone()),
        Some(Reading::Replicas { replicas, lower_bound, upper_bound, observed }) => {
            return evaluate_replicas(rule, outcome, *replicas, (*lower_bound, *upper_bound), *observed, spec, ready);
        }
        Some(Reading::Value { value, at }) => (*value, *at),
    };
    outcome.value = Some(value);
    outcome.data_time = Some(at);
    let age = now.since(at);
    outcome.age_seconds = Some(age.as_secs_f64());
    let exact = match metric.judge(value, at, now) {
        Ok(exact) => exact,
        Err(why) => return unavailable(outcome, why),
    };

    // usage = value / per; load = ready * usage = ready * value / per.
    let per = match rule.algorithm() {
        Algorithm::Absolute => 1,
        Algorithm::Average => ready,
    };
    if per == 0 {
        outcome.note = Some("no ready replica to divide the total by".into());
        return Evaluated { outcome, usable: true, converging: false };
    }
    outcome.usage = Some(value / f64::from(per));
    if exact.is_zero() && !rule.tolerate_zero() {
        outcome.position = Position::Inside;
        outcome.proposal = (ready > 0).then_some(spec);
        outcome.note = Some("a reading of exactly 0 is held: tolerate_zero is off".into());
        return Evaluated { outcome, usable: true, converging: false };
    }

    let load = Load { per: Decimal::from_int(i64::from(per)), scaled: exact.mul_int(u64::from(ready)), value: exact };
    let convergence = convergence_step(rule, metric, &load, spec);
    let (position, proposal) = position_and_proposal(rule, metric, &band, &load, convergence, spec);
    outcome.position = position;
    outcome.proposal = (ready > 0).then_some(proposal);
    let converging = position == Position::Inside && convergence.is_some();
    Evaluated { outcome, usable: true, converging }
}

/// A metric's outcome before its reading is looked at: its watermarks and band, unavailable.
fn unread_outcome(metric: &MetricRule, band: &(Decimal, Decimal)) -> MetricOutcome {
    MetricOutcome {
        name: metric.name.clone(),
        value: None,
        usage: None,
        low_watermark: metric.low_watermark.to_f64(),
        high_watermark: metric.high_watermark.to_f64(),
        band_low: band.0.to_f64(),
        band_high: band.1.to_f64(),
        position: Position::Unavailable,
        proposal: None,
        data_time: None,
        age_seconds: None,
        note: None,
    }
}

/// §4: the step towards the chosen watermark while inside the band, if the load stays within
/// that watermark afterwards. It lands on the neighbouring multiple of the modulo, so that
/// every proposal other than `spec` is a multiple of it.
fn convergence_step(rule: &Rule, metric: &MetricRule, load: &Load, spec: u32) -> Option<u32> {
    let step = rule.replica_modulo();
    match rule.converge_towards_watermark() {
        Some(ConvergeTowards::High) => {
            let candidate = grid_below(spec, step);
            let fits = load.scaled <= load.per_replica_at(&metric.high_watermark).mul_int(u64::from(candidate));
            (candidate >= 1 && fits).then_some(candidate)
        }
        Some(ConvergeTowards::Low) => {
            let candidate = grid_above(spec, step);
            let fits = load.scaled >= load.per_replica_at(&metric.low_watermark).mul_int(u64::from(candidate));
            fits.then_some(candidate)
        }
        None => None,
    }
}

/// §1: where a usable value stands against the band, and the count it asks for there.
fn position_and_proposal(
    rule: &Rule,
    metric: &MetricRule,
    band: &(Decimal, Decimal),
    load: &Load,
    convergence: Option<u32>,
    spec: u32,
) -> (Position, u32) {
    let (band_low, band_high) = band;
    if load.value > band_high.mul(&load.per) {
        let wanted = load.scaled.div_ceil(&load.per_replica_at(&metric.high_watermark)).unwrap_or(i64::MAX);
        // The formula's result is put on the modulo's grid before `spec` floors it, as the WPA
        // does: an off-grid `spec` above what the formula asks for holds rather than rounding
        // up past it (docs/engine.md §1).
        let wanted = round_up_to_modulo(to_replicas(wanted), rule.replica_modulo(), 0);
        // A crossing never asks for less than the convergence step a lower reading would take,
        // or a higher reading could end with fewer replicas (unready pods, modulo > 1).
        let step_up = convergence.filter(|&c| c > spec).unwrap_or(spec);
        (Position::Above, wanted.max(spec).max(step_up))
    } else if load.value < band_low.mul(&load.per) {
        let wanted = load.scaled.div_floor(&load.per_replica_at(&metric.low_watermark)).unwrap_or(0);
        let step_down = convergence.filter(|&c| c < spec).unwrap_or(spec);
        (Position::Below, to_replicas(wanted).max(1).min(spec).min(step_down))
    } else {
        (Position::Inside, convergence.unwrap_or(spec))
    }
}

/// §4: the multiple of `modulo` just below `spec` (`spec - modulo` when `spec` is one).
fn grid_below(spec: u32, modulo: u32) -> u32 {
    if spec.is_multiple_of(modulo) {
        spec.saturating_sub(modulo)
    } else {
        spec - spec % modulo
    }
}

/// §4: the multiple of `modulo` just above `spec`.
fn grid_above(spec: u32, modulo: u32) -> u32 {
    (spec / modulo).saturating_add(1).saturating_mul(modulo)
}

/// §1 for a replica count from the source (a recommender), judged as the WPA judges its
/// recommender's reply: with bounds, `spec` under the lower bound is above the band, over the
/// upper bound below it; a recommendation equal to `spec` is always inside, where it may
/// converge within the bounds. A recommendation that differs from `spec` while `spec` is
/// inside the bounds is a convergence step: it moves without the delays, as there.
fn evaluate_replicas(
    rule: &Rule,
    mut outcome: MetricOutcome,
    replicas: u32,
    bounds: (Option<u32>, Option<u32>),
    observed: Option<f64>,
    spec: u32,
    ready: u32,
) -> Evaluated {
    let (lower, upper) = bounds;
    outcome.value = observed.filter(|v| v.is_finite());
    let unavailable = |mut outcome: MetricOutcome, why: String| {
        outcome.value = None;
        outcome.note = Some(why);
        Evaluated { outcome, usable: false, converging: false }
    };
    if replicas == 0 && !rule.tolerate_zero() {
        return unavailable(
            outcome,
            "the source recommends 0 replicas, which is read as no data: tolerate_zero is off".into(),
        );
    }
    if let (Some(low), Some(high)) = (lower, upper) {
        if low > high {
            return unavailable(outcome, format!("the source's bounds are inverted: lower {low} > upper {high}"));
        }
    }
    let bounded = lower.is_some() || upper.is_some();
    outcome.position = recommendation_position(replicas, spec, bounds);
    let mut proposal = replicas;
    let mut converging = bounded && outcome.position == Position::Inside && replicas != spec;
    if replicas == spec && bounded {
        if let Some(step) = recommendation_convergence_step(rule, spec, bounds) {
            proposal = step;
            converging = true;
        }
    }
    let shown = |b: Option<u32>| b.map_or_else(|| "-".to_string(), |b| b.to_string());
    let mut note = format!("the source recommends {replicas} replicas");
    if bounded {
        note.push_str(&format!(" (bounds {}..{}, spec {spec})", shown(lower), shown(upper)));
    }
    outcome.note = Some(note);
    outcome.proposal = (ready > 0).then_some(proposal);
    Evaluated { outcome, usable: true, converging }
}

/// §1: where a recommendation stands. Without bounds, as it compares with `spec`; with them,
/// as `spec` compares with the bounds.
fn recommendation_position(replicas: u32, spec: u32, bounds: (Option<u32>, Option<u32>)) -> Position {
    let (lower, upper) = bounds;
    if replicas == spec {
        Position::Inside
    } else if lower.is_none() && upper.is_none() {
        if replicas > spec {
            Position::Above
        } else {
            Position::Below
        }
    } else if lower.is_some_and(|low| spec < low) {
        Position::Above
    } else if upper.is_some_and(|high| spec > high) {
        Position::Below
    } else {
        Position::Inside
    }
}

/// §4 for a recommendation equal to `spec`: one modulo towards the lower bound (`high`) or the
/// upper bound (`low`), when the step stays within it.
fn recommendation_convergence_step(rule: &Rule, spec: u32, bounds: (Option<u32>, Option<u32>)) -> Option<u32> {
    let (lower, upper) = bounds;
    let step = rule.replica_modulo();
    match rule.converge_towards_watermark() {
        Some(ConvergeTowards::High) => {
            let candidate = grid_below(spec, step);
            (candidate >= 1 && lower.is_some_and(|low| candidate >= low)).then_some(candidate)
        }
        Some(ConvergeTowards::Low) => {
            let candidate = grid_above(spec, step);
            upper.is_some_and(|high| candidate <= high).then_some(candidate)
        }
        None => None,
    }
}

fn to_replicas(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

/// Rounds up to a multiple of `modulo`; a downward proposal never rounds past `spec`.
fn round_up_to_modulo(proposal: u32, modulo: u32, spec: u32) -> u32 {
    if modulo <= 1 {
        return proposal;
    }
    let rounded = proposal.div_ceil(modulo).saturating_mul(modulo);
    if proposal < spec {
        rounded.min(spec)
    } else {
        rounded
    }
}

/// The state carried into the next evaluation before any scale: condition since-times and the
/// pruned histories.
fn carried_state(
    rule: &Rule,
    state: &State,
    evaluated: &[Evaluated],
    usable: usize,
    all_usable: bool,
    now: Timestamp,
) -> State {
    let above = evaluated.iter().any(|e| e.outcome.position == Position::Above);
    let below = evaluated.iter().any(|e| e.outcome.position == Position::Below);
    // With no data at all we learn nothing about "above", so its clock keeps running; "below"
    // only counts on complete data, so that a gap can never complete a downscale delay.
    let above_since = if usable == 0 {
        state.above_since
    } else if above {
        state.above_since.or(Some(now))
    } else {
        None
    };
    let below_since = if below && all_usable { state.below_since.or(Some(now)) } else { None };
    let event_horizon = rule.scale_event_horizon();
    State {
        last_scale_time: state.last_scale_time,
        above_since,
        below_since,
        recommendations: match rule.velocity() {
            Velocity::Behavior(b) => history::keep_recommendations(
                &state.recommendations,
                b.scale_up.stabilization_window,
                b.scale_down.stabilization_window,
                now,
            ),
            Velocity::Watermark(_) => Vec::new(),
        },
        scale_events: state.scale_events.iter().filter(|e| now.since(e.at) < event_horizon).copied().collect(),
        zero: state.zero.clone(),
    }
}

/// Forbidden windows (WPA knobs only) and delays, measured against `now`. Delays do not apply
/// to convergence steps.
fn timing(rule: &Rule, old: &State, next: &State, now: Timestamp, converging: bool) -> Timing {
    let (up_window, down_window) = match rule.velocity() {
        Velocity::Watermark(w) => (w.upscale_forbidden_window, w.downscale_forbidden_window),
        Velocity::Behavior(_) => (Duration::ZERO, Duration::ZERO),
    };
    let window_left = |window: Duration| match old.last_scale_time {
        Some(last) => last.plus(window).since(now).as_secs_f64(),
        None => 0.0,
    };
    let delay_left = |delay: Duration, since: Option<Timestamp>| {
        if delay.is_zero() {
            return 0.0;
        }
        match since {
            Some(since) => delay.saturating_sub(now.since(since)).as_secs_f64(),
            None => delay.as_secs_f64(),
        }
    };
    let up_window_left = window_left(up_window);
    let down_window_left = window_left(down_window);
    let up_delay_left = delay_left(rule.upscale_delay_above_watermark(), next.above_since);
    let down_delay_left = delay_left(rule.downscale_delay_below_watermark(), next.below_since);
    Timing {
        upscale_allowed: up_window_left <= 0.0 && (up_delay_left <= 0.0 || converging),
        downscale_allowed: down_window_left <= 0.0 && (down_delay_left <= 0.0 || converging),
        upscale_window_seconds_left: up_window_left,
        downscale_window_seconds_left: down_window_left,
        upscale_delay_seconds_left: up_delay_left,
        downscale_delay_seconds_left: down_delay_left,
    }
}

/// §3 or §3b: from the proposal to the replica count the rate limits and bounds allow.
fn normalize(
    rule: &Rule,
    spec: u32,
    ready: u32,
    proposal: u32,
    old: &State,
    next: &mut State,
    now: Timestamp,
) -> Normalized {
    match rule.velocity() {
        Velocity::Watermark(knobs) => normalize_watermark(rule, knobs, spec, ready, proposal),
        Velocity::Behavior(behavior) => normalize_behavior(rule, behavior, spec, proposal, old, next, now),
    }
}

fn limit_step(spec: u32, factor: &Decimal) -> u32 {
    // floor(factor% x spec), at least one replica.
    let step = factor.mul_int(u64::from(spec)).div_floor(&Decimal::from_int(100)).unwrap_or(0);
    to_replicas(step).max(1)
}

fn normalize_watermark(rule: &Rule, knobs: &WatermarkVelocity, spec: u32, ready: u32, proposal: u32) -> Normalized {
    let (min, max) = (rule.min_running_replicas(), rule.max_replicas());
    let upscale_limit = if knobs.scale_up_limit_factor.is_zero() {
        spec
    } else {
        spec.saturating_add(limit_step(spec, &knobs.scale_up_limit_factor))
    };
    let downscale_limit = if knobs.scale_down_limit_factor.is_zero() {
        spec
    } else {
        spec.saturating_sub(limit_step(spec, &knobs.scale_down_limit_factor))
    };
    let (replicas, limit) = if proposal < downscale_limit {
        let floor = downscale_limit.max(min);
        if min > downscale_limit {
            (floor, Limit::TooFew)
        } else {
            (floor, Limit::DownscaleCapping)
        }
    } else if proposal > upscale_limit {
        if max < upscale_limit {
            (max, Limit::TooMany)
        } else {
            (upscale_limit, Limit::UpscaleCapping)
        }
    } else if proposal < min {
        (min, Limit::TooFew)
    } else if proposal > max {
        (max, Limit::TooMany)
    } else {
        (proposal, Limit::WithinRange)
    };
    // The reference controller aborts a *capped* scale-down whose floor is above the ready
    // count. Applied only there, a deep drop in load holds while a shallow one scales down, so a
    // lower reading could leave more replicas. **fix**: with replicas not ready, no scale-down
    // may stop above the ready count, whatever capped it.
    if replicas < spec && ready < spec && replicas > ready {
        return Normalized {
            replicas: spec,
            limit: Limit::NotReady,
            stabilization: None,
            upscale_limit,
            downscale_limit,
        };
    }
    Normalized { replicas, limit, stabilization: None, upscale_limit, downscale_limit }
}

fn normalize_behavior(
    rule: &Rule,
    behavior: &Behavior,
    spec: u32,
    proposal: u32,
    old: &State,
    next: &mut State,
    now: Timestamp,
) -> Normalized {
    let (min, max) = (rule.min_running_replicas(), rule.max_replicas());
    let young = |window: Duration| old.recommendations.iter().filter(move |r| now.since(r.at) < window);
    let lower = young(behavior.scale_up.stabilization_window).map(|r| r.replicas).fold(proposal, u32::min);
    let upper = young(behavior.scale_down.stabilization_window).map(|r| r.replicas).fold(proposal, u32::max);
    let stabilized = spec.max(lower).min(upper);
    if rule.recommendation_horizon() > Duration::ZERO {
        next.recommendations.push(Recommendation { replicas: proposal, at: now });
        next.recommendations = history::keep_recommendations(
            &next.recommendations,
            behavior.scale_up.stabilization_window,
            behavior.scale_down.stabilization_window,
            now,
        );
    }

    let upscale_limit = policy_limit(&behavior.scale_up, spec, &old.scale_events, now, true).max(spec);
    let downscale_limit = policy_limit(&behavior.scale_down, spec, &old.scale_events, now, false).min(spec);
    let (replicas, limit) = if stabilized > spec {
        let (ceiling, why) =
            if max > upscale_limit { (upscale_limit, Limit::UpscaleCapping) } else { (max, Limit::TooMany) };
        if stabilized > ceiling {
            (ceiling, why)
        } else {
            (stabilized, Limit::WithinRange)
        }
    } else if stabilized < spec {
        let (floor, why) =
            if min < downscale_limit { (downscale_limit, Limit::DownscaleCapping) } else { (min, Limit::TooFew) };
        if stabilized < floor {
            (floor, why)
        } else {
            (stabilized, Limit::WithinRange)
        }
    } else {
        (stabilized, Limit::WithinRange)
    };
    Normalized {
        replicas: replicas.clamp(min, max),
        limit,
        stabilization: Some(Stabilization { lower, upper, stabilized }),
        upscale_limit,
        downscale_limit,
    }
}

/// The furthest count the policies of one direction allow from `spec` now (KEP-853), in exact
/// integer arithmetic.
fn policy_limit(rules: &ScalingRules, spec: u32, events: &[ScaleEvent], now: Timestamp, up: bool) -> u32 {
    if rules.select_policy == SelectPolicy::Disabled {
        return spec;
    }
    let limits = rules.policies.iter().map(|policy| {
        let recent = events.iter().filter(|e| history::counts_within(e, policy.period, now, up));
        let (added, removed) =
            recent.fold((0i64, 0i64), |(a, r), e| (a + i64::from(e.added()), r + i64::from(e.removed())));
        let start = (i64::from(spec) - added + removed).max(0);
        let value = i64::from(policy.value);
        let limit = match (policy.kind, up) {
            (PolicyKind::Pods, true) => start + value,
            (PolicyKind::Pods, false) => start - value,
            (PolicyKind::Percent, true) => (start * (100 + value) + 99) / 100,
            (PolicyKind::Percent, false) => (start * (100 - value)).max(0) / 100,
        };
        to_replicas(limit)
    });
    // `max` allows the largest change: the highest limit up, the lowest down.
    let largest_change = (rules.select_policy == SelectPolicy::Max) == up;
    let chosen = if largest_change { limits.max() } else { limits.min() };
    chosen.unwrap_or(spec)
}

/// Where a declared fallback goes from `spec` when no metric is usable: its count, up only
/// unless it may scale down, within the bounds.
fn fallback_target(rule: &Rule, spec: u32) -> Option<u32> {
    let fallback = rule.fallback()?;
    let to = if fallback.scale_down { fallback.replicas } else { fallback.replicas.max(spec) };
    Some(to.clamp(rule.min_running_replicas(), rule.max_replicas()))
}

fn action_for(spec: u32, replicas: u32) -> Action {
    match replicas.cmp(&spec) {
        std::cmp::Ordering::Greater => Action::ScaleUp,
        std::cmp::Ordering::Less => Action::ScaleDown,
        std::cmp::Ordering::Equal => Action::Hold,
    }
}

fn metric_list(evaluated: &[Evaluated], keep: impl Fn(&Evaluated) -> bool) -> String {
    let names: Vec<&str> = evaluated.iter().filter(|e| keep(e)).map(|e| e.outcome.name.as_str()).collect();
    names.join(", ")
}

/// What the metrics say, in one clause: the crossings (or the band when nothing crossed) and
/// the unavailable ones.
fn describe_metrics(rule: &Rule, evaluated: &[Evaluated]) -> Option<String> {
    let (up, down) = (rule.tolerance_words(true), rule.tolerance_words(false));
    let mut clauses = Vec::new();
    for e in evaluated {
        let m = &e.outcome;
        let usage = m.usage.map(human).unwrap_or_else(|| "?".into());
        match m.position {
            Position::Above if m.usage.is_some() => {
                clauses.push(format!("{} above high watermark: {usage} > {} ({up})", m.name, human(m.high_watermark)))
            }
            Position::Below if m.usage.is_some() => {
                clauses.push(format!("{} below low watermark: {usage} < {} ({down})", m.name, human(m.low_watermark)))
            }
            Position::Above | Position::Below => {
                clauses.push(format!("{}: {}", m.name, m.note.clone().unwrap_or_default()))
            }
            Position::Inside => {
                if let Some(note) = &m.note {
                    clauses.push(format!("{}: {note}", m.name));
                } else {
                    clauses.push(format!(
                        "{} inside its band: {} <= {usage} <= {}",
                        m.name,
                        human(m.band_low),
                        human(m.band_high)
                    ));
                }
            }
            Position::Unavailable => clauses.push(format!(
                "{} unavailable ({})",
                m.name,
                m.note.clone().unwrap_or_else(|| "no reading".into())
            )),
        }
    }
    (!clauses.is_empty()).then(|| clauses.join(", "))
}

fn guard_verdict(guard: Guard, rule: &Rule, spec: u32, ready: u32, metrics: &[MetricOutcome]) -> String {
    match guard {
        Guard::Paused => "the workload is paused".into(),
        Guard::AtZero => "the workload is at zero".into(),
        Guard::NoData => {
            let all_missing = metrics.iter().all(|m| m.position == Position::Unavailable);
            if let (Some(fallback), Some(to), true) = (rule.fallback(), fallback_target(rule, spec), all_missing) {
                if to == spec {
                    return format!("no metric data ({}): holding {spec} replicas", fallback.because);
                }
                return format!("no metric data ({}): falling back to {to} replicas", fallback.because);
            }
            if metrics.iter().all(|m| m.position == Position::Unavailable) {
                format!("no metric data: holding {spec} (missing data is never read as 0)")
            } else {
                format!(
                    "spec {spec} is outside {}..{} but not every metric is available: holding {spec}",
                    rule.min_running_replicas(),
                    rule.max_replicas()
                )
            }
        }
        Guard::AboveMax => {
            let max = rule.max_replicas();
            format!("spec {spec} is above {} {max}: scaling to {max}", rule.max_words())
        }
        Guard::BelowMin => {
            let min = rule.min_running_replicas();
            format!("spec {spec} is below {} {min}: scaling to {min}", rule.min_words())
        }
        Guard::MinAvailable => format!(
            "only {ready} of {spec} replicas are ready, under min_available_replica_percentage {}%: holding {spec}",
            rule.min_available_replica_percentage()
        ),
        Guard::NoReadyReplicas => {
            format!("no replica is ready: holding {spec} (a formula on zero ready replicas would scale to 1)")
        }
    }
}

fn window_note(rule: &Rule, left: f64, up: bool) -> String {
    let direction = if up { "upscale" } else { "downscale" };
    let window = match rule.velocity() {
        Velocity::Watermark(w) if up => w.upscale_forbidden_window,
        Velocity::Watermark(w) => w.downscale_forbidden_window,
        Velocity::Behavior(_) => Duration::ZERO,
    };
    format!("{direction} forbidden for {}s more ({}s window after the last scale)", human(left), window.as_secs())
}

fn delay_note(rule: &Rule, left: f64, up: bool) -> String {
    let (condition, delay) = if up {
        ("above the high", rule.upscale_delay_above_watermark())
    } else {
        ("below the low", rule.downscale_delay_below_watermark())
    };
    format!("the metric must stay {condition} watermark {}s more (delay {}s)", human(left), delay.as_secs())
}

fn velocity_verdict(
    rule: &Rule,
    decision: &Decision,
    proposal: u32,
    normalized: &Normalized,
    blocked: Option<String>,
) -> String {
    let spec = decision.spec_replicas;
    let mut text = if decision.converging {
        format!("converging one step to {proposal}")
    } else {
        format!("proposing {proposal}")
    };
    if let Some(s) = normalized.stabilization {
        if s.stabilized != proposal {
            text.push_str(&format!(
                ", stabilized to {} by recent recommendations ({}..{})",
                s.stabilized, s.lower, s.upper
            ));
        }
    }
    let after_stabilization = normalized.stabilization.map_or(proposal, |s| s.stabilized);
    if normalized.replicas != after_stabilization {
        let by = rule.limited_by(normalized.limit);
        text.push_str(&format!(", limited to {} by {by}", normalized.replicas));
    }
    match blocked {
        Some(why) => format!("{text}, but {why}: holding {spec}"),
        None if normalized.replicas == spec => format!("{text}: holding {spec}"),
        None => format!("{text}: scaling {spec} -> {}", normalized.replicas),
    }
}

/// §6: the reason a person reads: what the metrics say, what partial data held, the verdict,
/// and whether dry-run kept the scale from the target.
fn reason(
    rule: &Rule,
    metric_summary: Option<String>,
    held_note: Option<String>,
    verdict: String,
    action: Action,
) -> String {
    let mut parts: Vec<String> = metric_summary.into_iter().chain(held_note).collect();
    parts.push(verdict);
    if rule.dry_run() && action != Action::Hold {
        parts.push("dry-run: nothing written".into());
    }
    parts.join("; ")
}
