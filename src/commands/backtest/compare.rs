//! The backtest's verdict: the rule's replay beside the target's actual replicas and, with
//! `--against`, beside the other rule's replay, as a table of the numbers a reviewer weighs.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::{json, Value};

use super::History;
use crate::commands::simulate::{Simulation, Summary};

/// One row of the table: a number for each column that has it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub measure: &'static str,
    pub rule: f64,
    pub against: Option<f64>,
    pub actual: Option<f64>,
}

/// The table, and what the actual replicas were where the history had them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Steps of the history at which the actual replica count was known.
    pub actual_known_steps: usize,
    pub steps: usize,
}

/// Numbers of one replay, in the table's row order.
fn measures(summary: &Summary) -> [(&'static str, f64); 8] {
    let hours = |seconds: f64| seconds / 3600.0;
    let restricted = summary.restricted.upscale_window
        + summary.restricted.upscale_delay
        + summary.restricted.downscale_window
        + summary.restricted.downscale_delay
        + summary.restricted.upscale_capping
        + summary.restricted.downscale_capping;
    [
        ("scale events", (summary.scale_ups + summary.scale_downs) as f64),
        ("scale-ups", summary.scale_ups as f64),
        ("scale-downs", summary.scale_downs as f64),
        ("replica-hours", summary.replica_hours),
        ("peak replicas", f64::from(summary.peak_replicas)),
        ("hours above the high watermark", hours(summary.seconds_above_high_watermark)),
        ("hours restricted (windows, delays, rate limits)", hours(restricted as f64 * summary.interval_seconds)),
        ("hours without data", hours(summary.restricted.missing_data as f64 * summary.interval_seconds)),
    ]
}

impl Comparison {
    pub fn new(rule: &Simulation, against: Option<&Simulation>, history: &History) -> Self {
        let steps = history.replicas.len();
        let known: Vec<(f64, u32)> =
            history.replicas.iter().filter_map(|(at, r)| r.map(|r| (at.unix_millis() as f64 / 1000.0, r))).collect();
        let actual = actual_measures(&known, history.span.step.as_secs_f64());
        let against = against.map(|s| measures(&s.summary));
        let rows = measures(&rule.summary)
            .into_iter()
            .enumerate()
            .map(|(i, (measure, value))| Row {
                measure,
                rule: value,
                // The same measures in the same order, so row `i` of both.
                against: against.as_ref().and_then(|a| a.get(i)).map(|&(_, value)| value),
                actual: actual.as_ref().and_then(|a| a.get(measure)),
            })
            .collect();
        Comparison { rows, actual_known_steps: known.len(), steps }
    }

    /// The `--json` document: each replay's events and summary, and the table.
    pub fn json(&self, rule: &Simulation, against: Option<&Simulation>) -> Value {
        let replay = |s: &Simulation| json!({ "events": &s.replay.changes, "summary": &s.summary });
        json!({
            "rule": replay(rule),
            "against": against.map(replay),
            "comparison": self,
        })
    }
}

/// What the actual replica history amounts to, for the rows it can fill.
struct Actual {
    events: f64,
    ups: f64,
    downs: f64,
    replica_hours: f64,
    peak: f64,
}

impl Actual {
    fn get(&self, measure: &str) -> Option<f64> {
        match measure {
            "scale events" => Some(self.events),
            "scale-ups" => Some(self.ups),
            "scale-downs" => Some(self.downs),
            "replica-hours" => Some(self.replica_hours),
            "peak replicas" => Some(self.peak),
            _ => None,
        }
    }
}

/// From `(unix seconds, replicas)` samples one step apart where known.
fn actual_measures(known: &[(f64, u32)], step_seconds: f64) -> Option<Actual> {
    let first = known.first()?;
    let mut actual = Actual { events: 0.0, ups: 0.0, downs: 0.0, replica_hours: 0.0, peak: f64::from(first.1) };
    for (&(t0, r0), &(t1, r1)) in known.iter().zip(known.iter().skip(1)) {
        // A gap in the history counts for one step, not for its whole length.
        actual.replica_hours += f64::from(r0) * (t1 - t0).min(step_seconds) / 3600.0;
        if r1 != r0 {
            actual.events += 1.0;
            if r1 > r0 {
                actual.ups += 1.0;
            } else {
                actual.downs += 1.0;
            }
        }
        actual.peak = actual.peak.max(f64::from(r1));
    }
    Some(actual)
}

fn cell(value: Option<f64>) -> String {
    match value {
        None => "-".to_string(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e9 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

fn difference(rule: f64, other: Option<f64>) -> String {
    match other {
        None => String::new(),
        Some(other) if (rule - other).abs() < 0.05 => "same".to_string(),
        Some(other) => {
            let delta = rule - other;
            let percent =
                if other.abs() > f64::EPSILON { format!(" ({:+.0}%)", 100.0 * delta / other) } else { String::new() };
            if delta.fract() == 0.0 {
                format!("{delta:+.0}{percent}")
            } else {
                format!("{delta:+.1}{percent}")
            }
        }
    }
}

/// The table as text, after the rule's own report.
pub fn write_comparison(out: &mut impl Write, comparison: &Comparison) -> io::Result<()> {
    let has_against = comparison.rows.iter().any(|r| r.against.is_some());
    let has_actual = comparison.rows.iter().any(|r| r.actual.is_some());
    if !has_against && !has_actual {
        writeln!(out, "\nThe target's actual replicas were not found in the history: nothing to compare with.")?;
        return Ok(());
    }
    writeln!(out)?;
    let mut header = vec!["".to_string(), "this rule".to_string()];
    if has_against {
        header.extend(["--against".to_string(), "change".to_string()]);
    }
    if has_actual {
        header.extend(["actual".to_string(), "vs actual".to_string()]);
    }
    let mut lines = vec![header];
    for row in &comparison.rows {
        let mut line = vec![row.measure.to_string(), cell(Some(row.rule))];
        if has_against {
            line.extend([cell(row.against), difference(row.rule, row.against)]);
        }
        if has_actual {
            line.extend([cell(row.actual), difference(row.rule, row.actual)]);
        }
        lines.push(line);
    }
    // Every line has the header's columns; each column as wide as its widest cell.
    let mut widths: Vec<usize> = Vec::new();
    for line in &lines {
        for (c, value) in line.iter().enumerate() {
            let chars = value.chars().count();
            match widths.get_mut(c) {
                Some(width) => *width = (*width).max(chars),
                None => widths.push(chars),
            }
        }
    }
    for line in &lines {
        let mut cells = line.iter().zip(&widths);
        let mut text = cells.next().map(|(first, &width)| format!("{first:<width$}")).unwrap_or_default();
        for (value, &width) in cells {
            text.push_str(&format!("  {value:>width$}"));
        }
        writeln!(out, "{}", text.trim_end())?;
    }
    if has_actual && comparison.actual_known_steps < comparison.steps {
        writeln!(out, "(actual replicas known at {} of {} steps)", comparison.actual_known_steps, comparison.steps)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actual_replicas_count_changes_and_replica_hours() {
        let known = [(0.0, 2), (60.0, 2), (120.0, 4), (180.0, 3)];
        let actual = actual_measures(&known, 60.0).unwrap();
        assert_eq!((actual.events, actual.ups, actual.downs, actual.peak), (2.0, 1.0, 1.0, 4.0));
        assert!((actual.replica_hours - (2.0 + 2.0 + 4.0) * 60.0 / 3600.0).abs() < 1e-9);
        assert!(actual_measures(&[], 60.0).is_none());
    }

    #[test]
    fn differences_read_as_a_reviewer_would_say_them() {
        assert_eq!(difference(12.0, Some(8.0)), "+4 (+50%)");
        assert_eq!(difference(8.0, Some(8.02)), "same");
        assert_eq!(difference(3.5, Some(0.0)), "+3.5");
        assert_eq!(difference(1.0, None), "");
    }
}
