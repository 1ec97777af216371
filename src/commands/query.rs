//! `watermarkd query`: what each metric of each autoscaler reads right now, and how that value
//! was chosen. How a person checks a rule against the real backend before trusting it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use watermarkd_engine::{Decimal, Reading, Timestamp};

use crate::adapters::backend::{
    demand_history, BackendError, MetricBackend, MetricQuery, Observation, QueryPlan, RateLimitSnapshot,
};
use crate::adapters::telemetry::BackendMetrics;
use crate::domain::forecast::{floor as forecast_floor, forecast, Forecast, ForecastMode, Forecaster, History};
use crate::domain::rules::{self, Autoscaler, RulesError, RulesFile};

#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    /// The rules file whose metrics to query.
    #[arg(long, value_name = "FILE", visible_alias = "config")]
    pub rules: PathBuf,
    /// Only this autoscaler (default: all of them).
    #[arg(long, value_name = "NAME")]
    pub autoscaler: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum QueryCommandError {
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("no autoscaler named {name:?} in {config} (it has: {known})")]
    UnknownAutoscaler { name: String, config: String, known: String },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Output(#[from] std::io::Error),
}

/// One metric of one autoscaler and what its backend answered.
pub struct MetricAnswer<'a> {
    pub autoscaler: &'a Autoscaler,
    pub metric_index: usize,
    pub observation: Observation,
}

/// Queries every metric of the selected autoscalers once, each backend in one cycle, and prints
/// the answers. Returns false when any metric has no value.
pub async fn run(args: &QueryArgs, out: &mut impl Write) -> Result<bool, QueryCommandError> {
    let rules = rules::load_rules(&args.rules)?;
    let selected = select(&rules, args)?;
    let now = Timestamp::from_system_time(SystemTime::now());
    let Answers { metrics: answers, rate_limits, plans } = query_all(&rules, &selected, now).await?;
    let mut all_ok = true;
    // In file order: each autoscaler with its answers (they are sorted so).
    let mut answers_left = answers.iter().peekable();
    for autoscaler in &selected {
        if let Some(recommender) = &autoscaler.recommender {
            // The request carries the target's replica counts, which this command does not read.
            writeln!(out, "{}", autoscaler.name)?;
            writeln!(out, "  {}", recommender.metric_name())?;
            writeln!(
                out,
                "    not asked: recommender {} (only the daemon asks recommenders)",
                recommender.display_url()
            )?;
            continue;
        }
        let mut named = false;
        while let Some(answer) = answers_left.next_if(|a| a.autoscaler.name == autoscaler.name) {
            if !named {
                writeln!(out, "{}", autoscaler.name)?;
                named = true;
            }
            all_ok &= matches!(answer.observation.reading, Reading::Value { .. });
            write_answer(out, answer, now)?;
        }
        write_forecast(out, &rules, autoscaler, now).await?;
    }
    if selected.is_empty() {
        writeln!(out, "{}: no autoscalers", args.rules.display())?;
    }
    for plan in &plans {
        write_plan(out, plan)?;
    }
    for (backend, budget) in rate_limits {
        write!(
            out,
            "backend {backend}: Datadog rate limit {}/{}s, {} remaining, resets in {}s",
            budget.limit, budget.period_seconds, budget.remaining, budget.reset_seconds
        )?;
        if let Some(blocked) = budget.blocked_for_seconds {
            write!(out, ", rate limited for {blocked}s more")?;
        }
        writeln!(out)?;
    }
    Ok(all_ok)
}

/// What the autoscaler's forecast says now, from the history its backends hold (as the daemon
/// reads it when the autoscaler starts).
async fn write_forecast(
    out: &mut impl Write,
    rules: &RulesFile,
    autoscaler: &Autoscaler,
    now: Timestamp,
) -> Result<(), QueryCommandError> {
    let Some(ahead) = autoscaler.forecast.as_deref() else { return Ok(()) };
    let lead = humantime::format_duration(ahead.lead_time);
    let mode = match ahead.mode {
        ForecastMode::Observe => "observed only",
        ForecastMode::Scale => "a floor",
    };
    let metrics = Arc::new(BackendMetrics::detached());
    let mut backends = BTreeMap::new();
    for source in &autoscaler.metrics {
        if let (Some(config), false) = (rules.backends.get(&source.backend), backends.contains_key(&source.backend)) {
            let backend = MetricBackend::new(&source.backend, config, Arc::clone(&metrics))?;
            backends.insert(source.backend.clone(), Arc::new(backend));
        }
    }
    let read = demand_history(autoscaler, |name| backends.get(name).cloned(), Forecaster::backfill_span(now)).await;
    for (metric, (source, demand)) in autoscaler.metrics.iter().zip(read).enumerate() {
        let said = match demand {
            Err(err) => format!("no history: {err}"),
            Ok(demand) => match forecast(&History::new(demand), now, ahead.lead_time, ahead.max_error) {
                Forecast::Ready { demand, error, .. } => {
                    let needs = match forecast_floor(&autoscaler.rule, metric, ahead, demand, u32::MAX) {
                        Some(replicas) => format!("a floor of {replicas} replicas"),
                        None => "no more than the rule's own floor".into(),
                    };
                    format!(
                        "{demand:.1} expected, {needs} (the last day's forecasts were off by {:.0}%)",
                        error * 100.0
                    )
                }
                Forecast::Unable(why) => why,
            },
        };
        writeln!(out, "  forecast {lead} ahead for {} ({mode}): {said}", source.name)?;
    }
    Ok(())
}

fn select<'a>(rules: &'a RulesFile, args: &QueryArgs) -> Result<Vec<&'a Autoscaler>, QueryCommandError> {
    match &args.autoscaler {
        None => Ok(rules.autoscalers.iter().collect()),
        Some(name) => match rules.autoscaler(name) {
            Some(a) => Ok(vec![a]),
            None => Err(QueryCommandError::UnknownAutoscaler {
                name: name.clone(),
                config: args.rules.display().to_string(),
                known: rules.autoscalers.iter().map(|a| &*a.name).collect::<Vec<_>>().join(", "),
            }),
        },
    }
}

/// Builds the backends the selected autoscalers use and evaluates all their queries at `now`,
/// one batch per backend, as a daemon cycle would.
pub async fn query_all<'a>(
    rules: &RulesFile,
    selected: &[&'a Autoscaler],
    now: Timestamp,
) -> Result<Answers<'a>, QueryCommandError> {
    let metrics = Arc::new(BackendMetrics::detached());
    // Per backend: its client and the (autoscaler, metric) pairs it answers, in order.
    let mut per_backend: BTreeMap<&str, Vec<(&'a Autoscaler, usize)>> = BTreeMap::new();
    let mut answers = Vec::new();
    for autoscaler in selected {
        for (i, source) in autoscaler.metrics.iter().enumerate() {
            if source.resource.is_some() {
                // Read through the API server by the daemon; this command connects to no cluster.
                let why = "a resource metric is read from the cluster's metrics API by `watermarkd run`; this \
                           command does not connect to a cluster (try `kubectl top pods -l SELECTOR`)";
                let observation =
                    Observation::unavailable(crate::adapters::backend::QueryError::Configuration(why.into()));
                answers.push(MetricAnswer { autoscaler, metric_index: i, observation });
                continue;
            }
            per_backend.entry(source.backend.as_str()).or_default().push((autoscaler, i));
        }
    }
    let mut rate_limits = Vec::new();
    let mut plans = Vec::new();
    for (name, users) in per_backend {
        let Some(config) = rules.backends.get(name) else { continue };
        let backend = MetricBackend::new(name, config, metrics.clone())?;
        // `i` was taken from `a.metrics` above.
        let sources = || users.iter().filter_map(|(a, i)| Some((a, a.metrics.get(*i)?)));
        let queries: Vec<MetricQuery> =
            sources().map(|(_, source)| MetricQuery { query: source.query.clone(), reducer: source.reducer }).collect();
        let labels = sources().map(|(a, source)| format!("{} ({})", a.name, source.name)).collect();
        plans.push(BackendPlan { backend: name.to_string(), plan: backend.plan(&queries, now), labels });
        // No cycle to fit in: as long as a cycle of the daemon with retries used to take.
        let deadline = tokio::time::Instant::now() + backend.timeout().saturating_mul(2);
        let observations = backend.evaluate(&queries, now, deadline).await;
        if let Some(budget) = backend.rate_limit() {
            rate_limits.push((name.to_string(), budget));
        }
        for ((autoscaler, metric_index), mut observation) in users.into_iter().zip(observations) {
            // The daemon's own judgement (the metric's `max_age`, not-a-number), so that a value
            // shown here as usable is one a decision would use.
            if let Reading::Value { value, at } = observation.reading {
                if let Some(Err(reason)) = autoscaler.rule.metrics().get(metric_index).map(|m| m.judge(value, at, now))
                {
                    let age = now.since(at).as_secs();
                    observation.reading =
                        Reading::Unavailable { reason: format!("{reason} (value {value} at {at}, {age}s old)") };
                }
            }
            answers.push(MetricAnswer { autoscaler, metric_index, observation });
        }
    }
    // Back to file order: autoscaler, then metric.
    let order: BTreeMap<&str, usize> = selected.iter().enumerate().map(|(i, a)| (&*a.name, i)).collect();
    answers.sort_by_key(|a| (order.get(&*a.autoscaler.name).copied(), a.metric_index));
    Ok(Answers { metrics: answers, rate_limits, plans })
}

/// Everything one `query` run learned.
pub struct Answers<'a> {
    pub metrics: Vec<MetricAnswer<'a>>,
    /// The Datadog rate budget after the queries, per backend.
    pub rate_limits: Vec<(String, RateLimitSnapshot)>,
    /// What each backend planned to send, before it sent it.
    pub plans: Vec<BackendPlan>,
}

/// One backend's plan for the queries of `query`, with who asks each.
pub struct BackendPlan {
    pub backend: String,
    pub plan: QueryPlan,
    /// `autoscaler (metric)` for each query planned, in the plan's member numbering.
    pub labels: Vec<String>,
}

/// Which autoscalers share which request, and which of them are folded into a grouped query.
fn write_plan(out: &mut impl Write, backend_plan: &BackendPlan) -> std::io::Result<()> {
    let BackendPlan { backend, plan, labels } = backend_plan;
    let grouped = plan.requests.iter().flat_map(|r| r.parts.iter()).filter(|p| p.folded).count();
    writeln!(
        out,
        "backend {backend}: {} request(s) for {} queries ({} folded into {grouped} grouped queries, {} sent as they are)",
        plan.request_count(),
        plan.folded_members() + plan.unfolded_members(),
        plan.folded_members(),
        plan.unfolded_members(),
    )?;
    for (r, request) in plan.requests.iter().enumerate() {
        writeln!(out, "  request {}:", r + 1)?;
        for part in &request.parts {
            let how = if part.folded { "grouped" } else { "as is" };
            writeln!(out, "    {how}: {}", part.text)?;
            let who: Vec<&str> = part.members.iter().filter_map(|&m| labels.get(m).map(String::as_str)).collect();
            writeln!(out, "      for {}", who.join(", "))?;
        }
    }
    Ok(())
}

fn write_answer(out: &mut impl Write, answer: &MetricAnswer<'_>, now: Timestamp) -> std::io::Result<()> {
    // `query_all` answers metrics of the autoscaler, which its rule has in the same order.
    let (Some(source), Some(rule_metric)) =
        (answer.autoscaler.metrics.get(answer.metric_index), answer.autoscaler.rule.metrics().get(answer.metric_index))
    else {
        return Ok(());
    };
    writeln!(out, "  {} via {}: {}", source.name, source.backend, source.query)?;
    let detail = &answer.observation.detail;
    match &answer.observation.reading {
        Reading::Value { value, at } => {
            let age = now.since(*at).as_secs();
            writeln!(out, "    value {value} at {at} ({age}s old)")?;
            let (low, high) = (rule_metric.low_watermark.to_f64(), rule_metric.high_watermark.to_f64());
            match answer.autoscaler.rule.algorithm() {
                // Only the engine knows the ready replicas, so a total cannot be placed in the band here.
                watermarkd_engine::Algorithm::Average => writeln!(
                    out,
                    "    watermarks {low}..{high} per replica: the value is a total, divided by ready replicas"
                )?,
                watermarkd_engine::Algorithm::Absolute => {
                    // The engine's own band, compared exactly as a decision compares it.
                    let (band_low, band_high) = answer.autoscaler.rule.band(rule_metric);
                    let position = match Decimal::from_f64(*value) {
                        Some(v) if v > band_high => "above the band",
                        Some(v) if v < band_low => "below the band",
                        Some(_) => "inside the band",
                        None => "not a number",
                    };
                    writeln!(out, "    watermarks {low}..{high}: {position}")?
                }
            }
        }
        Reading::Replicas { replicas, .. } => writeln!(out, "    recommends {replicas} replicas")?,
        Reading::Unavailable { reason } => writeln!(out, "    unavailable: {reason}")?,
    }
    let mut how = Vec::new();
    if let Some(series) = detail.series {
        how.push(format!("{series} series"));
    }
    if let (Some(chosen), Some(points)) = (detail.chosen_point, detail.points) {
        how.push(format!("point {} of {points} non-null", chosen + 1));
    }
    if let Some(interval) = detail.interval_seconds {
        how.push(format!("rollup {interval}s"));
    }
    if !how.is_empty() {
        writeln!(out, "    {}", how.join(", "))?;
    }
    for warning in &detail.warnings {
        writeln!(out, "    warning: {warning}")?;
    }
    if let Some(why) = &detail.partial {
        writeln!(out, "    partial (may scale up, never down): {why}")?;
    }
    Ok(())
}
