//! `watermarkd check`: every problem of every file, or one line per autoscaler saying what the
//! daemon understood, so that a person can compare it with what they meant.

use std::io::Write;
use std::path::PathBuf;

use std::time::SystemTime;

use watermarkd_engine::Timestamp;

use crate::adapters::backend::MetricBackend;
use crate::adapters::telemetry::BackendMetrics;
use crate::domain::rules::{load_rules, plural, summary, warnings_at, Autoscaler, RulesFile};

/// Checks each file, writing its problems or its summary to `out`. Returns false if any file
/// has a problem.
pub fn run_check(files: &[PathBuf], out: &mut impl Write) -> std::io::Result<bool> {
    let mut all_ok = true;
    let now = Timestamp::from_system_time(SystemTime::now());
    for file in files {
        match load_rules(file) {
            Ok(rules) => {
                let count = plural(rules.autoscalers.len(), "autoscaler");
                writeln!(out, "{}: ok, {count}", file.display())?;
                for warning in unbuildable_backends(&rules) {
                    writeln!(out, "  warning: {warning}")?;
                }
                for autoscaler in &rules.autoscalers {
                    writeln!(out, "  {}", summary(autoscaler, now))?;
                    for warning in warnings_at(autoscaler, now).into_iter().chain(undated_max_age(&rules, autoscaler)) {
                        writeln!(out, "    warning: {warning}")?;
                    }
                }
            }
            Err(err) => {
                all_ok = false;
                writeln!(out, "{err}")?;
                writeln!(out, "{}: {}", file.display(), plural(err.problems.len(), "problem"))?;
            }
        }
    }
    Ok(all_ok)
}

/// The backends that cannot be set up here, most often for a credential whose variable is not
/// set. A warning, not a problem: `check` often runs where the secrets are not (a laptop, CI),
/// but the daemon refuses to start without them, so whoever runs `check` beside it learns now.
fn unbuildable_backends(rules: &RulesFile) -> Vec<String> {
    let metrics = std::sync::Arc::new(BackendMetrics::detached());
    rules
        .backends
        .iter()
        .filter_map(|(name, config)| MetricBackend::new(name, config, std::sync::Arc::clone(&metrics)).err())
        .map(|err| format!("{err}; `watermarkd run` does not start without it"))
        .collect()
}

/// A `max_age` (the metric's or its Prometheus backend's) that can never find the data stale:
/// the query is not one whose data time the backend can ask for, so its value is dated at the
/// evaluation time.
fn undated_max_age(rules: &RulesFile, autoscaler: &Autoscaler) -> Vec<String> {
    let metrics = autoscaler.rule.metrics().iter().zip(&autoscaler.metrics);
    metrics
        .filter(|(metric, source)| {
            rules.backends.get(&source.backend).is_some_and(|backend| {
                (metric.max_age.is_some() || backend.max_age().is_some())
                    && !MetricBackend::dates(backend, &source.query)
            })
        })
        .map(|(_, source)| {
            format!(
                "metric {:?}: max_age cannot find its data stale: the query is not a series selector with a metric name or one \
                 aggregation (sum, min, max, avg, count) of one, so Prometheus dates its value at the evaluation \
                 time, however old the samples behind it",
                source.name
            )
        })
        .collect()
}
