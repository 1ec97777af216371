//! `watermarkd backtest`: what a rule would have done over the autoscaler's own history.
//!
//! The metrics' history is read from their backends as a live daemon would have read them at
//! each evaluation (Prometheus range queries evaluate the instant query at every step; Datadog
//! answers are read bucket by bucket, the newest complete one, within its staleness bound),
//! turned into a trace on the evaluation grid, and replayed through the same engine path as
//! `simulate`. A gap in the history is a metric without a value, which holds, as it would live.
//! With `--against`, the same history is replayed through a second rules file's autoscaler of
//! the same name, and the two are reported side by side.

mod compare;
mod progress;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use watermarkd_engine::{Reading, Timestamp};

use crate::adapters::backend::{HistoryError, HistorySpan, MetricBackend, MetricQuery, Observation};
use crate::adapters::telemetry::BackendMetrics;
use crate::commands::simulate::{self, LoadModel, ReplayError, ReplayOptions, Simulation, Trace, TraceRow};
use crate::domain::rules::{self, Autoscaler, RulesError, RulesFile};

pub use compare::{write_comparison, Comparison};
use progress::ProgressBar;

/// Replay an autoscaler's own metric history through its rule (and, with --against, through
/// another version of it) and report what each would have done.
#[derive(Clone, Debug, clap::Args)]
pub struct BacktestArgs {
    /// Rules file (TOML) that defines the autoscaler and its backends.
    #[arg(long, value_name = "FILE", visible_alias = "config")]
    pub rules: PathBuf,

    /// Name of the autoscaler to backtest.
    #[arg(long, value_name = "NAME")]
    pub autoscaler: String,

    /// How much history to replay, back from --until (e.g. `7d`, `36h`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub since: Duration,

    /// The end of the history [default: now]: RFC 3339 (2024-05-01T12:00:00Z) or Unix seconds.
    #[arg(long, value_name = "TIME", value_parser = simulate::parse_timestamp)]
    pub until: Option<Timestamp>,

    /// Another rules file (usually the rules before a change) whose autoscaler of the same name
    /// is replayed over the same history and compared.
    #[arg(long, value_name = "FILE")]
    pub against: Option<PathBuf>,

    /// The target's actual replica count over the history, as a PromQL or Datadog query on the
    /// autoscaler's first backend [default: the effective replicas the daemon exports,
    /// `wpa_controller_replicas_scaling_effective`, for this autoscaler].
    #[arg(long, value_name = "QUERY", conflicts_with = "replicas")]
    pub replicas_query: Option<String>,

    /// The target's actual replica count over the history from a CSV file (`timestamp,replicas`).
    #[arg(long, value_name = "FILE.csv")]
    pub replicas: Option<PathBuf>,

    /// How the recorded values relate to the replayed replicas (see `simulate --help`). With
    /// `per-replica`, the demand at each step is the recorded value times the actual replicas.
    #[arg(long, value_enum, value_name = "MODEL", default_value_t = LoadModel::Recorded)]
    pub load_model: LoadModel,

    /// How long a new replica takes to become ready in the replay (e.g. `45s`).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    pub readiness_lag: Duration,

    /// Also write an SVG chart of the replay; with --against, one chart of both rules beside
    /// the actual replicas. `-` writes it to standard output, and the report then goes to
    /// standard error.
    #[arg(long, value_name = "chart.svg")]
    pub out: Option<PathBuf>,

    /// Print the report as one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Why a backtest could not run. Every message names the autoscaler, the backend or the file.
#[derive(Debug, thiserror::Error)]
pub enum BacktestError {
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("{file}: no autoscaler named {name:?} (the file defines: {defined})")]
    UnknownAutoscaler { file: String, name: String, defined: String },
    #[error(
        "autoscaler {name:?}: metric {metric:?} is read from the pods' resource metrics, which keep no history; \
         a backtest needs a backend query"
    )]
    ResourceMetric { name: String, metric: String },
    #[error("autoscaler {name:?} takes its replicas from a recommender, whose answers cannot be replayed")]
    Recommender { name: String },
    #[error("autoscaler {name:?}: backend {backend:?} is not defined in {file}")]
    UnknownBackend { name: String, backend: String, file: String },
    #[error(transparent)]
    Backend(#[from] crate::adapters::backend::BackendError),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error(
        "the per-replica load model needs the target's actual replicas over the history, and none were found: \
         give --replicas-query or --replicas"
    )]
    NoReplicaHistory,
    #[error("reading the replica history {path}")]
    ReadReplicas { path: PathBuf, source: io::Error },
    #[error("{path}")]
    ReplicaTrace { path: PathBuf, source: simulate::TraceError },
    #[error("--since {0}: the history must span at least one interval of the autoscaler")]
    TooShort(String),
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("writing the chart {path}")]
    WriteChart { path: PathBuf, source: io::Error },
    #[error("writing the report")]
    Output(#[from] io::Error),
    #[error("writing the JSON report")]
    Json(#[from] serde_json::Error),
}

/// One autoscaler's history, read from its backends.
#[derive(Clone, Debug)]
pub struct History {
    pub span: HistorySpan,
    /// Per metric of the rule, what a live evaluation would have seen at each step.
    pub metrics: Vec<Vec<(Timestamp, Observation)>>,
    /// The target's actual spec replicas at each step, where known.
    pub replicas: Vec<(Timestamp, Option<u32>)>,
}

/// The `backtest` command.
/// `err` hears the progress; `err_is_terminal` says whether to redraw it in place.
pub async fn run(
    args: &BacktestArgs,
    out: &mut impl Write,
    err: &mut impl Write,
    err_is_terminal: bool,
) -> Result<(), BacktestError> {
    let rules = rules::load_rules(&args.rules)?;
    let autoscaler = find(&rules, &args.autoscaler, &args.rules)?;
    let interval = autoscaler.interval(rules::DEFAULT_INTERVAL);
    let end = args.until.unwrap_or_else(|| Timestamp::from_system_time(SystemTime::now()));
    let since_ms = i64::try_from(args.since.as_millis()).unwrap_or(i64::MAX);
    if args.since < interval {
        return Err(BacktestError::TooShort(humantime::format_duration(args.since).to_string()));
    }
    let span = HistorySpan {
        start: Timestamp::from_unix_millis(end.unix_millis() - since_ms),
        end,
        step: interval,
        for_forecast: false,
    };
    let metrics = Arc::new(BackendMetrics::detached());
    let bar = ProgressBar::new(err, err_is_terminal);

    let history = History {
        span,
        metrics: read_metrics(&rules, &args.rules, autoscaler, span, &metrics, &bar).await?,
        replicas: read_replicas(&rules, autoscaler, span, args, &metrics, &bar).await?,
    };
    let against = match &args.against {
        Some(path) => {
            let other_rules = rules::load_rules(path)?;
            let other = find(&other_rules, &args.autoscaler, path)?.clone();
            // The same target, so the same actual replicas; the same queries are read once.
            let other_metrics = if same_queries(autoscaler, &other) {
                history.metrics.clone()
            } else {
                read_metrics(&other_rules, path, &other, span, &metrics, &bar).await?
            };
            Some((other, History { span, metrics: other_metrics, replicas: history.replicas.clone() }))
        }
        None => None,
    };
    bar.finish();
    // With `--out -` standard output is the SVG alone, and the report goes beside the progress.
    let chart_to_stdout = simulate::chart_to_stdout(args.out.as_deref());
    let (mut report, mut chart_out): (&mut dyn Write, Option<&mut dyn Write>) =
        if chart_to_stdout { (err, Some(out)) } else { (out, None) };
    let out = &mut report;

    let primary = replay(autoscaler, &history, args)?;
    // What the schedule and the forecast change: the same rule without them, on the same history.
    let looks_ahead = simulate::Ahead::of(autoscaler).is_some();
    let without = looks_ahead.then(|| replay_plain(autoscaler, &history, args)).transpose()?;
    let secondary = match &against {
        Some((other, other_history)) => Some((other, replay(other, other_history, args)?)),
        None => None,
    };
    if let Some(path) = &args.out {
        let svg = match (&args.against, &secondary) {
            (Some(file), Some((other, simulation))) => simulate::render_comparison_svg(
                &autoscaler.rule,
                &primary.replay,
                &primary.summary,
                &simulate::Against {
                    label: format!("--against {}", file.display()),
                    rule: &other.rule,
                    replay: &simulation.replay,
                    summary: &simulation.summary,
                    actual: &history.replicas,
                },
            ),
            _ => simulate::render_svg(&autoscaler.rule, &primary.replay, &primary.summary),
        };
        match chart_out.as_mut() {
            Some(chart_out) => chart_out.write_all(svg.as_bytes()).and_then(|()| chart_out.flush()),
            None => simulate::write_atomically(path, svg.as_bytes()),
        }
        .map_err(|source| BacktestError::WriteChart { path: path.clone(), source })?;
    }
    let secondary = secondary.map(|(_, simulation)| simulation);
    let comparison = Comparison::new(&primary, secondary.as_ref(), &history);
    if args.json {
        let mut report = comparison.json(&primary, secondary.as_ref());
        if let (Some(without), Some(object)) = (&without, report.as_object_mut()) {
            object.insert("without_ahead".into(), serde_json::json!({ "summary": &without.summary }));
        }
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        simulate::write_text(out, &primary.replay, &primary.summary)?;
        if let Some(without) = &without {
            simulate::write_ahead_comparison(out, &primary.summary, &without.summary)?;
        }
        write_comparison(out, &comparison)?;
        if let Some(path) = args.out.as_ref().filter(|_| !chart_to_stdout) {
            writeln!(out, "\nChart written to {}", path.display())?;
        }
    }
    Ok(())
}

fn find<'a>(rules: &'a RulesFile, name: &str, file: &Path) -> Result<&'a Autoscaler, BacktestError> {
    let autoscaler = rules.autoscaler(name).ok_or_else(|| BacktestError::UnknownAutoscaler {
        file: file.display().to_string(),
        name: name.to_string(),
        defined: rules.autoscalers.iter().map(|a| a.name.to_string()).collect::<Vec<_>>().join(", "),
    })?;
    if autoscaler.recommender.is_some() {
        return Err(BacktestError::Recommender { name: name.to_string() });
    }
    if let Some(source) = autoscaler.metrics.iter().find(|m| m.resource.is_some()) {
        return Err(BacktestError::ResourceMetric { name: name.to_string(), metric: source.name.clone() });
    }
    Ok(autoscaler)
}

fn same_queries(a: &Autoscaler, b: &Autoscaler) -> bool {
    a.metrics.len() == b.metrics.len()
        && a.metrics
            .iter()
            .zip(&b.metrics)
            .all(|(x, y)| (&x.backend, &x.query, x.reducer) == (&y.backend, &y.query, y.reducer))
}

/// The backend a metric of `autoscaler` (defined in `file`) names.
fn backend(
    rules: &RulesFile,
    file: &Path,
    autoscaler: &Autoscaler,
    name: &str,
    metrics: &Arc<BackendMetrics>,
) -> Result<MetricBackend, BacktestError> {
    let config = rules.backends.get(name).ok_or_else(|| BacktestError::UnknownBackend {
        name: autoscaler.name.to_string(),
        backend: name.to_string(),
        file: file.display().to_string(),
    })?;
    Ok(MetricBackend::new(name, config, Arc::clone(metrics))?)
}

/// Each metric's history, in the rule's order.
async fn read_metrics(
    rules: &RulesFile,
    file: &Path,
    autoscaler: &Autoscaler,
    span: HistorySpan,
    metrics: &Arc<BackendMetrics>,
    bar: &ProgressBar<'_, impl Write>,
) -> Result<Vec<Vec<(Timestamp, Observation)>>, BacktestError> {
    let steps = span.steps().len();
    let mut metric_history = Vec::with_capacity(autoscaler.metrics.len());
    for source in &autoscaler.metrics {
        let client = backend(rules, file, autoscaler, &source.backend, metrics)?;
        let query = MetricQuery { query: source.query.clone(), reducer: source.reducer };
        let label = format!("{} / {}", autoscaler.name, source.name);
        metric_history.push(client.history(&query, span, &|done| bar.show(&label, done, steps)).await?);
    }
    Ok(metric_history)
}

/// The target's actual replicas at each step, where known: from `--replicas`, else from
/// `--replicas-query` or the daemon's exported series on the autoscaler's first backend.
async fn read_replicas(
    rules: &RulesFile,
    autoscaler: &Autoscaler,
    span: HistorySpan,
    args: &BacktestArgs,
    metrics: &Arc<BackendMetrics>,
    bar: &ProgressBar<'_, impl Write>,
) -> Result<Vec<(Timestamp, Option<u32>)>, BacktestError> {
    let replicas = match &args.replicas {
        Some(path) => replicas_from_file(path, span)?,
        None => {
            // A rule has at least one metric; without one the replicas would be asked of no backend.
            let first_backend = autoscaler.metrics.first().map_or("", |m| m.backend.as_str());
            let client = backend(rules, &args.rules, autoscaler, first_backend, metrics)?;
            let query = args.replicas_query.clone().or_else(|| default_replicas_query(&client, autoscaler));
            let label = format!("{} / actual replicas", autoscaler.name);
            let steps = span.steps().len();
            let read = match query {
                Some(query) => {
                    let query = MetricQuery { query, reducer: None };
                    client.history(&query, span, &|done| bar.show(&label, done, steps)).await
                }
                None => Err(HistoryError::NoReplicas { backend: first_backend.to_string() }),
            };
            match read {
                Ok(read) => read.into_iter().map(|(at, o)| (at, replicas_of(&o))).collect(),
                // The replicas only add to the report, unless the load model needs them.
                Err(error) if args.replicas_query.is_none() => {
                    tracing::info!(%error, "no replica history from the daemon's exported series");
                    span.steps().into_iter().map(|at| (at, None)).collect()
                }
                Err(error) => return Err(error.into()),
            }
        }
    };
    if args.load_model == LoadModel::PerReplica && replicas.iter().all(|(_, r)| r.is_none()) {
        return Err(BacktestError::NoReplicaHistory);
    }
    Ok(replicas)
}

/// The effective replicas the daemon exports for this autoscaler, as its backend spells it.
fn default_replicas_query(client: &MetricBackend, autoscaler: &Autoscaler) -> Option<String> {
    client.replicas_query(&autoscaler.name, &autoscaler.target.namespace)
}

fn replicas_of(observation: &Observation) -> Option<u32> {
    match observation.reading {
        Reading::Value { value, .. } if value >= 0.0 && value <= f64::from(u32::MAX) => Some(value.round() as u32),
        _ => None,
    }
}

fn replicas_from_file(
    path: &std::path::Path,
    span: HistorySpan,
) -> Result<Vec<(Timestamp, Option<u32>)>, BacktestError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| BacktestError::ReadReplicas { path: path.to_path_buf(), source })?;
    let trace = simulate::parse_trace(&text, &[])
        .map_err(|source| BacktestError::ReplicaTrace { path: path.to_path_buf(), source })?;
    let mut rows = trace.rows.iter().filter(|row| row.replicas.is_some()).peekable();
    let mut current = None;
    Ok(span
        .steps()
        .into_iter()
        .map(|at| {
            while let Some(row) = rows.next_if(|row| row.at <= at) {
                current = row.replicas;
            }
            (at, current)
        })
        .collect())
}

/// The history as a trace on the evaluation grid, replayed. Under the per-replica model each
/// value becomes the demand it stood for: the value times the actual replicas then.
fn history_trace(autoscaler: &Autoscaler, history: &History, args: &BacktestArgs) -> (Trace, ReplayOptions) {
    let per_replica = args.load_model == LoadModel::PerReplica
        && autoscaler.rule.algorithm() == watermarkd_engine::Algorithm::Absolute;
    let rows = history
        .replicas
        .iter()
        .enumerate()
        .map(|(step, (at, actual))| {
            let values = history
                .metrics
                .iter()
                .map(|metric| match metric.get(step).map(|(_, o)| &o.reading) {
                    Some(Reading::Value { value, .. }) if per_replica => actual.map(|r| value * f64::from(r)),
                    Some(Reading::Value { value, .. }) => Some(*value),
                    _ => None,
                })
                .collect();
            TraceRow { line: step + 1, at: *at, values, replicas: None }
        })
        .collect();
    let trace = Trace { metric_names: autoscaler.rule.metrics().iter().map(|m| m.name.clone()).collect(), rows };
    let initial = history.replicas.iter().find_map(|(_, r)| *r);
    let options = ReplayOptions {
        interval: history.span.step,
        readiness_lag: args.readiness_lag,
        initial_replicas: initial,
        load_model: args.load_model,
    };
    (trace, options)
}

/// The autoscaler replayed on its history, with its schedule and forecast.
fn replay(autoscaler: &Autoscaler, history: &History, args: &BacktestArgs) -> Result<Simulation, BacktestError> {
    let (trace, options) = history_trace(autoscaler, history, args);
    Ok(simulate::simulate_autoscaler(autoscaler, &trace, options)?)
}

/// Its rule alone on the same history: what the schedule and forecast are compared with.
fn replay_plain(autoscaler: &Autoscaler, history: &History, args: &BacktestArgs) -> Result<Simulation, BacktestError> {
    let (trace, options) = history_trace(autoscaler, history, args);
    Ok(simulate::simulate(&autoscaler.name, &autoscaler.rule, &trace, options)?)
}
