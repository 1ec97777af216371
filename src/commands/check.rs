//! `watermarkd check`: every problem of every file, or one line per autoscaler saying what the
//! daemon understood, so that a person can compare it with what they meant.

use std::io::Write;
use std::path::PathBuf;

use std::time::SystemTime;

use watermarkd_engine::Timestamp;

use crate::adapters::backend::prometheus;
use crate::domain::rules::{load_rules, plural, summary, warnings_at, Autoscaler, Backend, RulesFile};

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

/// A `max_age` (the metric's or its Prometheus backend's) that can never find the data stale:
/// the query is not one whose data time the backend can ask for, so its value is dated at the
/// evaluation time.
fn undated_max_age(rules: &RulesFile, autoscaler: &Autoscaler) -> Vec<String> {
    let metrics = autoscaler.rule.metrics().iter().zip(&autoscaler.metrics);
    metrics
        .filter(|(metric, source)| match rules.backends.get(&source.backend) {
            Some(Backend::Prometheus(backend)) => {
                (metric.max_age.is_some() || backend.max_age.is_some())
                    && !prometheus::dates(&source.query)
            }
            _ => false,
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
