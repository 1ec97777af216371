//! `watermarkd run`: the composition root. `daemon` builds the parts and wires them together
//! (`Daemon::start`), runs the loop (`serve`) and stops them in order (`stop`); each part lives
//! in its own file:
//!
//! - `rules_file` and `wpa` (mapping through the synchronous `wpa_index`) are the sources: each
//!   sends the complete set of autoscalers it wants. `source` says what an autoscaler's source
//!   implies (its key, where its state persists, where its status goes).
//! - `scheduler` starts, stops and replaces autoscalers by key and hands out the ones due
//!   (timing rules in `schedule`).
//! - `cycle` queries the autoscalers due together (one `evaluate` call per backend, so Datadog
//!   batches are shared) and decides each in its own task (`evaluate`), at most
//!   `max_concurrency` at once. One still running when it falls due again skips that turn.
//! - `fanout` is where an autoscaler's admission and removal and each evaluation's outcome go,
//!   once: persisted, published as Events, and recorded in the ledger the series and the
//!   status board read.
//! - `report` writes WPA statuses and events (the loop reports the WPAs that cannot run);
//!   `health` keeps `/readyz` and systemd's watchdog, and is the one place that trims the
//!   allocator (`allocator::Trim` asks it to).

pub mod allocator;
mod claims;
mod cycle;
mod daemon;
mod evaluate;
mod evaluation;
mod fanout;
mod health;
mod memory;
mod report;
mod rules_file;
mod schedule;
mod scheduler;
pub mod settings;
mod shared;
mod source;
mod systemd;
mod wpa;
mod wpa_index;

pub use daemon::Daemon;

use crate::adapters::backend::BackendError;
use crate::adapters::workload::WorkloadError;
use crate::domain::rules::RulesError;
use crate::runtime::settings::Settings;
use shared::Shared;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    // Transparent: a wrapper that also printed its source would say everything twice in the
    // `{:#}` chain `main` prints.
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Kubernetes(#[from] WorkloadError),
    #[error(transparent)]
    Registry(#[from] prometheus::Error),
    #[error("cannot listen on {address}: {error}")]
    Listen { address: String, error: crate::adapters::listener::ListenerError },
    #[error("cannot start {what}: {error}")]
    Thread { what: &'static str, error: std::io::Error },
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
    #[error("status token: {0}")]
    StatusToken(crate::adapters::secret::SecretError),
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(settings: Settings) -> Result<(), RunError> {
    let mut daemon = Daemon::start(settings).await?;
    let served = daemon.serve().await;
    daemon.stop().await;
    served
}
