//! `tracing` output for the daemon: text for people, JSON for log pipelines, on stderr (the
//! journal or the container log collects it).

use serde::Deserialize;
use tracing_subscriber::EnvFilter;

/// How log lines are written (`log_format`, `--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `tracing`'s text lines, for people.
    Text,
    /// One JSON object per line, the event's fields flattened, for log pipelines.
    Json,
}

/// Installs the global subscriber. Fails on a filter that does not parse.
pub fn init(format: LogFormat, filter: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("log_level {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}
