//! `watermarkd simulate`: replay a recorded metric trace through an autoscaler's rule and show
//! what the engine would have done — every scale event with its reason, a summary, and
//! optionally an SVG chart for a design review.
//!
//! The core (`simulate`) takes a validated engine `Rule` and an interval, so it does not depend
//! on how the rule was configured; `run` is the command: load the rules file, read the trace,
//! simulate, report.

mod chart;
mod replay;
mod report;
mod trace;

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use watermarkd_engine::Rule;

pub(crate) use chart::{render_comparison_svg, render_svg, Against};
pub use replay::{replay, replay_ahead, Ahead, LoadModel, Replay};
pub(crate) use replay::{ReplayError, ReplayOptions};
pub use report::Summary;
pub(crate) use report::{summarize, write_ahead_comparison, write_text, JsonReport};
pub(crate) use trace::{parse_timestamp, parse_trace, Trace, TraceError, TraceRow};

use crate::domain::rules::{self, Autoscaler, RulesError};

/// Replay a metric trace through one autoscaler and report the scale events it would cause.
#[derive(Clone, Debug, clap::Args)]
#[command(after_long_help = TRACE_HELP)]
pub struct SimulateArgs {
    /// Rules file (TOML) that defines the autoscaler.
    #[arg(long, value_name = "FILE", visible_alias = "config")]
    pub rules: PathBuf,

    /// Name of the autoscaler to replay (its rule and its evaluation interval are used).
    #[arg(long, value_name = "NAME")]
    pub autoscaler: String,

    /// Metric trace (CSV): `timestamp`, one column per metric of the autoscaler, and an
    /// optional `replicas` column (the format is described in `--help`).
    #[arg(long, value_name = "TRACE.csv")]
    pub trace: PathBuf,

    /// Also write an SVG chart: each metric against its watermarks, proposed and effective
    /// replicas, and the spans where scaling was restricted. `-` writes it to standard output,
    /// and the report then goes to standard error.
    #[arg(long, value_name = "chart.svg")]
    pub out: Option<PathBuf>,

    /// Replicas at the start of the trace [default: the `replicas` cell of the first row, else
    /// the autoscaler's min_replicas].
    #[arg(long, value_name = "N")]
    pub initial_replicas: Option<u32>,

    /// How long a new replica takes to become ready (e.g. `45s`, `2m`). Until then it runs but
    /// does not count as ready, so an `average` rule divides the total by fewer replicas.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    pub readiness_lag: Duration,

    /// How the trace's values relate to the simulated replicas: `recorded` replays them as they
    /// are; `per-replica` reads them as total demand, which an `absolute` rule sees divided by
    /// the simulated ready replicas (a latency or CPU figure falls as replicas are added).
    #[arg(long, value_enum, value_name = "MODEL", default_value_t = LoadModel::Recorded)]
    pub load_model: LoadModel,

    /// Print the scale events and the summary as one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

const TRACE_HELP: &str = "\
Trace format (CSV, a header row, then one row per observation, in time order):

  timestamp,latency_seconds,replicas
  2024-05-01T00:00:00Z,0.21,3
  2024-05-01T00:00:15Z,0.19,
  2024-05-01T00:00:30Z,,

  timestamp  RFC 3339 (2024-05-01T00:00:00Z, +02:00 offsets allowed) or Unix seconds.
  <metric>   One column per metric of the autoscaler, named exactly like the metric. The value
             is what the backend query returned then (a total for `average` rules). An empty
             cell means the query returned no data: the metric is unavailable.
  replicas   Optional. A replica count a person set at that time; empty = no change. The first
             row's value is the starting count.

The engine is evaluated at the first timestamp and then every interval of the autoscaler up to
the last timestamp; each evaluation sees the newest row at or before it. The simulated workload
follows every scale decision at once; new replicas become ready after --readiness-lag.
With --load-model recorded (the default) values do not react to the simulated replicas, except
that `average` rules divide the total by the simulated ready replicas. With --load-model
per-replica each value is the total demand, and an `absolute` rule sees it divided by the
simulated ready replicas (no reading while none is ready).";

/// Why `simulate` failed. The messages leave the underlying error out: it is the `source`,
/// and the binary prints the whole chain (`context: cause`).
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("{}: no autoscaler named {name:?} (the file defines: {})", config.display(), defined.join(", "))]
    UnknownAutoscaler { config: PathBuf, name: String, defined: Vec<String> },
    #[error(
        "autoscaler {name:?} takes its replicas from a recommender, which a metric trace cannot stand for; \
         `watermarkd decide` takes recommendations with their bounds (docs/decide.md)"
    )]
    Recommender { name: String },
    #[error("reading the trace {}", path.display())]
    ReadTrace { path: PathBuf, source: io::Error },
    #[error("{}", path.display())]
    Trace { path: PathBuf, source: TraceError },
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("writing the chart {}", path.display())]
    WriteChart { path: PathBuf, source: io::Error },
    #[error("writing the report")]
    Output(#[from] io::Error),
    #[error("writing the JSON report")]
    Json(#[from] serde_json::Error),
}

/// A finished replay and its summary.
#[derive(Clone, Debug)]
pub struct Simulation {
    pub replay: Replay,
    pub summary: Summary,
}

/// Replays `trace` through `rule`, evaluated every `options.interval`.
pub fn simulate(
    autoscaler: &str,
    rule: &Rule,
    trace: &Trace,
    options: ReplayOptions,
) -> Result<Simulation, ReplayError> {
    let replay = replay(rule, trace, options)?;
    let summary = summarize(autoscaler, &replay);
    Ok(Simulation { replay, summary })
}

/// [`simulate`] with the autoscaler's own schedule, as the daemon would run it.
pub fn simulate_autoscaler(
    autoscaler: &Autoscaler,
    trace: &Trace,
    options: ReplayOptions,
) -> Result<Simulation, ReplayError> {
    let replay = replay_ahead(&autoscaler.rule, Ahead::of(autoscaler), trace, options)?;
    let summary = summarize(&autoscaler.name, &replay);
    Ok(Simulation { replay, summary })
}

/// Reads and parses a trace file for a rule.
pub fn load_trace(path: &Path, rule: &Rule) -> Result<Trace, SimulateError> {
    let text =
        fs::read_to_string(path).map_err(|source| SimulateError::ReadTrace { path: path.to_path_buf(), source })?;
    let metric_names: Vec<String> = rule.metrics().iter().map(|m| m.name.clone()).collect();
    parse_trace(&text, &metric_names).map_err(|source| SimulateError::Trace { path: path.to_path_buf(), source })
}

/// Where `--out` sends the chart: `-` is standard output.
pub(crate) fn chart_to_stdout(out: Option<&Path>) -> bool {
    out.is_some_and(|path| path.as_os_str() == "-")
}

/// The `simulate` command. The report goes to `out`, unless the chart does (`--out -`): then
/// the report goes to `err`, so that standard output is the SVG alone.
pub fn run(args: &SimulateArgs, out: &mut impl Write, err: &mut impl Write) -> Result<(), SimulateError> {
    if chart_to_stdout(args.out.as_deref()) {
        report(args, err, Some(out))
    } else {
        report(args, out, None::<&mut io::Sink>)
    }
}

fn report(args: &SimulateArgs, out: &mut impl Write, chart_out: Option<&mut impl Write>) -> Result<(), SimulateError> {
    let rules = rules::load_rules(&args.rules)?;
    let autoscaler = rules.autoscaler(&args.autoscaler).ok_or_else(|| SimulateError::UnknownAutoscaler {
        config: args.rules.clone(),
        name: args.autoscaler.clone(),
        defined: rules.autoscalers.iter().map(|a| a.name.to_string()).collect(),
    })?;
    if autoscaler.recommender.is_some() {
        // A trace holds metric values; a recommender's answers depend on the replicas it is
        // told about, which a recorded trace cannot replay.
        return Err(SimulateError::Recommender { name: autoscaler.name.to_string() });
    }
    let trace = load_trace(&args.trace, &autoscaler.rule)?;
    let options = ReplayOptions {
        interval: autoscaler.interval(crate::domain::rules::DEFAULT_INTERVAL),
        readiness_lag: args.readiness_lag,
        initial_replicas: args.initial_replicas,
        load_model: args.load_model,
    };
    let simulation = simulate_autoscaler(autoscaler, &trace, options)?;
    // What the schedule and the forecast change: the same rule without them, on the same trace.
    let looks_ahead = Ahead::of(autoscaler).is_some();
    let without = looks_ahead.then(|| simulate(&autoscaler.name, &autoscaler.rule, &trace, options)).transpose()?;

    if let Some(path) = &args.out {
        let svg = render_svg(&autoscaler.rule, &simulation.replay, &simulation.summary);
        match chart_out {
            Some(chart_out) => chart_out.write_all(svg.as_bytes()).and_then(|()| chart_out.flush()),
            None => write_atomically(path, svg.as_bytes()),
        }
        .map_err(|source| SimulateError::WriteChart { path: path.clone(), source })?;
    }
    if args.json {
        let report = JsonReport {
            events: &simulation.replay.changes,
            summary: &simulation.summary,
            without_ahead: without.as_ref().map(|w| &w.summary),
        };
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        write_text(out, &simulation.replay, &simulation.summary)?;
        if let Some(without) = &without {
            write_ahead_comparison(out, &simulation.summary, &without.summary)?;
        }
        if let Some(path) = args.out.as_ref().filter(|p| !chart_to_stdout(Some(p))) {
            writeln!(out, "\nChart written to {}", path.display())?;
        }
    }
    Ok(())
}

/// Writes next to the destination and renames, so that a viewer never shows half a chart.
pub(crate) fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, contents)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        // The rename failed; the temporary file is of no use to anyone.
        let _ = fs::remove_file(&tmp);
    })
}
