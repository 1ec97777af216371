//! `watermarkd decide`: one engine evaluation per JSON document on standard input, one JSON
//! decision per line on standard output. This is the engine's stable machine interface; its
//! format is documented in docs/decide.md.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Decision, Reading, State, Target, Timestamp};

use crate::domain::rules;

/// Why one input document could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("input {index}: not valid JSON: {source}")]
    Json { index: usize, source: serde_json::Error },
    #[error("input {index}: {message}")]
    Input { index: usize, message: String },
    #[error("input {index}: invalid rule:\n{problems}")]
    Rule { index: usize, problems: String },
}

/// One evaluation, explicit about everything the engine uses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    /// An `[[autoscaler]]` entry of the rules file, as JSON.
    rule: serde_json::Value,
    now: Timestamp,
    target: Target,
    /// One reading per metric, keyed by metric name.
    readings: BTreeMap<String, ReadingInput>,
    #[serde(default)]
    state: State,
}

/// A reading in one of three forms: `{"value", "at"}`, `{"unavailable"}` or `{"replicas"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadingInput {
    value: Option<f64>,
    at: Option<Timestamp>,
    unavailable: Option<String>,
    replicas: Option<u32>,
    /// With `replicas`, what a recommender's reply adds (docs/engine.md §1).
    lower_bound: Option<u32>,
    upper_bound: Option<u32>,
    observed: Option<f64>,
}

impl ReadingInput {
    fn into_reading(self, metric: &str) -> Result<Reading, String> {
        let recommender_extras = self.lower_bound.is_some() || self.upper_bound.is_some() || self.observed.is_some();
        if recommender_extras && self.replicas.is_none() {
            return Err(format!(
                "readings.{metric}: \"lower_bound\", \"upper_bound\" and \"observed\" go with \"replicas\" only"
            ));
        }
        match (self.value, self.at, self.unavailable, self.replicas) {
            (Some(value), Some(at), None, None) => Ok(Reading::Value { value, at }),
            (Some(_), None, None, None) => {
                Err(format!("readings.{metric}: a value needs \"at\", the time of its data point"))
            }
            (None, None, Some(reason), None) => Ok(Reading::Unavailable { reason }),
            (None, None, None, Some(replicas)) => Ok(Reading::Replicas {
                replicas,
                lower_bound: self.lower_bound,
                upper_bound: self.upper_bound,
                observed: self.observed,
            }),
            _ => Err(format!(
                "readings.{metric}: give exactly one of {{\"value\", \"at\"}}, {{\"unavailable\"}} or {{\"replicas\"}}"
            )),
        }
    }
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    error: &'a str,
}

/// Decides every document on `input` (one JSON document, or several, e.g. JSON Lines), writing
/// one line per document: the decision, or `{"error": ...}`. Returns false if any failed.
pub fn run(mut input: impl BufRead, out: &mut impl Write) -> std::io::Result<bool> {
    let mut text = String::new();
    input.read_to_string(&mut text)?;
    let mut all_ok = true;
    let documents = serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>();
    for (index, document) in documents.enumerate() {
        let line = match document {
            Ok(value) => decide_one(index, value).and_then(|d| to_json(index, &d)),
            Err(source) => {
                // The stream cannot be resynchronised after a syntax error.
                let err = DecideError::Json { index, source };
                writeln!(out, "{}", error_json(&err))?;
                return Ok(false);
            }
        };
        match line {
            Ok(json) => writeln!(out, "{json}")?,
            Err(err) => {
                all_ok = false;
                writeln!(out, "{}", error_json(&err))?;
            }
        }
    }
    Ok(all_ok)
}

/// Decides one input document.
pub fn decide_one(index: usize, value: serde_json::Value) -> Result<Decision, DecideError> {
    let input: Input =
        serde_json::from_value(value).map_err(|e| DecideError::Input { index, message: e.to_string() })?;
    let rule = rules::rule_from_json(&input.rule).map_err(|problems| DecideError::Rule {
        index,
        problems: problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"),
    })?;
    let mut readings_by_name = input.readings;
    let mut readings = Vec::with_capacity(rule.metrics().len());
    for metric in rule.metrics() {
        let reading = readings_by_name.remove(&metric.name).ok_or_else(|| DecideError::Input {
            index,
            message: format!("readings: no reading for metric {:?}", metric.name),
        })?;
        readings.push(reading.into_reading(&metric.name).map_err(|message| DecideError::Input { index, message })?);
    }
    if let Some(unknown) = readings_by_name.keys().next() {
        return Err(DecideError::Input {
            index,
            message: format!("readings: {unknown:?} is not a metric of this rule"),
        });
    }
    Ok(watermarkd_engine::decide(&rule, input.target, &readings, &input.state, input.now))
}

fn to_json(index: usize, decision: &Decision) -> Result<String, DecideError> {
    serde_json::to_string(decision).map_err(|e| DecideError::Input { index, message: e.to_string() })
}

fn error_json(err: &DecideError) -> String {
    let message = err.to_string();
    serde_json::to_string(&ErrorLine { error: &message }).unwrap_or_else(|_| r#"{"error":"unprintable error"}"#.into())
}
