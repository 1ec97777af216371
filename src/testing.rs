//! The internals the integration tests and the benchmarks reach into, and only they: parsers
//! fed arbitrary bytes, periods a test waits out, counts a test asserts. Not the library's
//! API, and nothing in the daemon or the commands uses it; it keeps those internals
//! crate-private everywhere else.

use std::time::Duration;

use crate::adapters::backend::datadog::pacing::RateLimitHeaders;
use crate::adapters::backend::recommender::RecommenderClients;
use crate::adapters::telemetry::AutoscalerMetrics;
use crate::adapters::workload::Workloads;

/// Datadog's answer reader and what it reads with: fed arbitrary bytes and recorded answers.
pub mod datadog {
    pub use crate::adapters::backend::datadog::pacing::RateLimitHeaders;
    pub use crate::adapters::backend::datadog::parse::{
        error_text, rate_limit_wait, read_v1_answer, RequestOutcome, V1Answer, V1Context,
    };
}

/// How often a secret's file is checked for a change: a test waits this long after rotating one.
pub const SECRET_CHECK_EVERY: Duration = crate::adapters::secret::CHECK_EVERY;

/// The next event of a watch stream, as the workload stores take it (retrying on errors).
pub use crate::adapters::workload::watch::next as next_event;

/// Datadog's rate-limit headers from name and value pairs (names in any case).
pub fn rate_limit_headers<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> RateLimitHeaders {
    RateLimitHeaders::from_pairs(pairs)
}

/// The whole exposition of the autoscalers' series at once.
pub fn render_all(metrics: &AutoscalerMetrics) -> String {
    metrics.snapshot().render_all()
}

/// How many workload stores (watches) run: one per kind and namespace in use.
pub fn workload_watches(workloads: &Workloads) -> usize {
    workloads.workload_watches()
}

/// Recommender clients with their series on a registry of their own; `files_recheck` checks
/// the TLS files for a change that often instead of every 10 s.
pub fn recommender_clients(cluster_name: Option<String>, files_recheck: Option<Duration>) -> RecommenderClients {
    let clients = RecommenderClients::with_cluster_name(cluster_name);
    match files_recheck {
        Some(period) => clients.files_recheck(period),
        None => clients,
    }
}
