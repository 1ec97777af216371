//! The `watermarkd.io/queries` annotation: per External metric, a raw query and the backend
//! to send it to, instead of the query the Cluster Agent would have built. This is how a WPA
//! scales on PromQL (or on any Datadog query) without changing its spec, which the Datadog
//! CRD would not accept.
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     watermarkd.io/queries: |
//!       [{"metricName": "requests", "backend": "prom",
//!         "query": "sum(rate(http_requests_total{service=\"billing\"}[1m]))"}]
//! ```
//!
//! Each entry names its metric by `metric` (the index in `spec.metrics`) or `metricName` (the
//! External metric with that `metricName`), and gives `query` and optionally `backend`
//! (default: the daemon's Datadog backend), `reducer` and `maxAge`. An entry's values are read
//! with the rules file's own reader (the annotation is a small JSON document), so that a query,
//! backend, reducer or age means here what it means in a rules file.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use super::types::MetricSpec;
use crate::domain::rules::draft::Field;
use crate::domain::rules::reader::Table;
use crate::domain::rules::{parse_reducer, tree, Reducer, Sink, TableScope, REDUCERS};

pub const QUERIES_ANNOTATION: &str = "watermarkd.io/queries";

/// The keys an entry gives besides the metric it targets.
const PASSED_KEYS: [&str; 4] = ["query", "backend", "reducer", "maxAge"];
const KNOWN_KEYS: &str = "metric, metricName, query, backend, reducer, maxAge";

/// One entry of the annotation, resolved to the metric whose query it replaces.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QueryOverride {
    /// The entry's position in the annotation's list (to name its fields in problems).
    pub entry: usize,
    pub query: Field<String>,
    pub backend: Field<String>,
    pub reducer: Field<Reducer>,
    pub max_age: Field<Duration>,
}

/// What the annotation says, and what is wrong with it.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// By metric index in `spec.metrics`.
    pub by_metric: BTreeMap<usize, QueryOverride>,
    /// `(field, message)`, the field written as a path into the object.
    pub problems: Vec<(String, String)>,
}

/// How the annotation, or a part of it, is named in problems.
pub(crate) fn annotation_path(rest: &str) -> String {
    format!("metadata.annotations[{QUERIES_ANNOTATION:?}]{rest}")
}

pub(crate) fn read_overrides(annotations: Option<&BTreeMap<String, String>>, metrics: &[MetricSpec]) -> Overrides {
    let mut overrides = Overrides::default();
    let Some(text) = annotations.and_then(|a| a.get(QUERIES_ANNOTATION)) else { return overrides };
    let mut problem = |field: String, message: String| overrides.problems.push((field, message));
    let entries = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(entries)) => entries,
        Ok(other) => {
            problem(
                annotation_path(""),
                format!(
                    "must be a JSON list such as [{{\"metric\": 0, \"backend\": \"prom\", \"query\": \"...\"}}], not {}",
                    describe(&other)
                ),
            );
            return overrides;
        }
        Err(err) => {
            problem(annotation_path(""), format!("is not valid JSON: {err}"));
            return overrides;
        }
    };
    let mut first_entry_for: BTreeMap<usize, usize> = BTreeMap::new();
    for (entry, value) in entries.iter().enumerate() {
        let at = |key: &str| annotation_path(&format!("[{entry}]{key}"));
        let Value::Object(object) = value else {
            problem(
                at(""),
                format!("must be an object with \"metric\" or \"metricName\" and \"query\", not {}", describe(value)),
            );
            continue;
        };
        for key in object.keys() {
            let known = key == "metric" || key == "metricName" || PASSED_KEYS.contains(&key.as_str());
            if !known {
                problem(at(&format!(".{key}")), format!("is not a known key (known keys: {KNOWN_KEYS})"));
            }
        }
        let Some(index) = target_metric(object, metrics, &at, &mut problem) else { continue };
        if let Some(first) = first_entry_for.get(&index) {
            problem(at(""), format!("gives a query for spec.metrics[{index}] again (entry [{first}] already does)"));
            continue;
        }
        first_entry_for.insert(index, entry);
        let (query_override, said) = read_entry(entry, value);
        for said in said {
            problem(said.field, said.message);
        }
        if let Some(query_override) = query_override {
            overrides.by_metric.insert(index, query_override);
        }
    }
    overrides
}

/// The values of entry `entry` (an object), and what is wrong with them.
fn read_entry(entry: usize, value: &Value) -> (Option<QueryOverride>, Vec<crate::domain::rules::Problem>) {
    let node = tree::from_json(value);
    let scope = TableScope { autoscaler: None, label: annotation_path(&format!("[{entry}]")), separator: "." };
    let mut sink = Sink::default();
    let Some(mut table) = Table::new(&node, scope, &mut sink) else { return (None, sink.problems) };
    let query = table.text(&mut sink, "query");
    let backend = table.text(&mut sink, "backend");
    let reducer = table.choice(&mut sink, "reducer", parse_reducer, REDUCERS);
    let max_age = table.duration(&mut sink, "maxAge");
    let read = QueryOverride {
        entry,
        query: table.field("query", query),
        backend: table.field("backend", backend),
        reducer: table.field("reducer", reducer),
        max_age: table.field("maxAge", max_age),
    };
    (Some(read), sink.problems)
}

/// The index in `spec.metrics` an entry targets, or the problem that it targets none.
fn target_metric(
    object: &Map<String, Value>,
    metrics: &[MetricSpec],
    at: &dyn Fn(&str) -> String,
    problem: &mut dyn FnMut(String, String),
) -> Option<usize> {
    let index = match (object.get("metric"), object.get("metricName")) {
        (Some(_), Some(_)) | (None, None) => {
            problem(
                at(""),
                "needs exactly one of \"metric\" (the index in spec.metrics) and \"metricName\"".to_string(),
            );
            return None;
        }
        (Some(value), None) => {
            let index = value.as_u64().and_then(|i| usize::try_from(i).ok());
            match index {
                Some(index) if index < metrics.len() => index,
                Some(index) => {
                    problem(
                        at(".metric"),
                        format!("({index}) names no metric: spec.metrics has {} (counted from 0)", metrics.len()),
                    );
                    return None;
                }
                None => {
                    problem(
                        at(".metric"),
                        format!("must be the index of a metric in spec.metrics (0, 1, ...), not {}", describe(value)),
                    );
                    return None;
                }
            }
        }
        (None, Some(Value::String(name))) => {
            let matching: Vec<usize> = metrics
                .iter()
                .enumerate()
                .filter(|(_, m)| m.external.as_ref().is_some_and(|e| &e.metric_name == name))
                .map(|(i, _)| i)
                .collect();
            match matching.as_slice() {
                [index] => *index,
                [] => {
                    problem(
                        at(".metricName"),
                        format!("({name:?}) is the metricName of no External metric in spec.metrics"),
                    );
                    return None;
                }
                several => {
                    let list: Vec<String> = several.iter().map(|i| format!("spec.metrics[{i}]")).collect();
                    problem(
                        at(".metricName"),
                        format!("({name:?}) matches {}; use \"metric\" with the index instead", list.join(" and ")),
                    );
                    return None;
                }
            }
        }
        (None, Some(other)) => {
            problem(at(".metricName"), format!("must be a string, not {}", describe(other)));
            return None;
        }
    };
    let metric = metrics.get(index)?;
    if metric.type_ != "External" {
        problem(
            at(""),
            format!(
                "targets spec.metrics[{index}], a metric of type {:?}: only External metrics take a query from this \
                 annotation",
                metric.type_
            ),
        );
        return None;
    }
    Some(index)
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("a boolean ({b})"),
        Value::Number(n) => format!("a number ({n})"),
        Value::String(s) => format!("a string ({s:?})"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::types::{ExternalMetricSource, ResourceMetricSource};
    use super::*;

    fn external(name: &str) -> MetricSpec {
        MetricSpec {
            type_: "External".into(),
            external: Some(ExternalMetricSource { metric_name: name.into(), ..ExternalMetricSource::default() }),
            resource: None,
        }
    }

    fn resource(name: &str) -> MetricSpec {
        MetricSpec {
            type_: "Resource".into(),
            external: None,
            resource: Some(ResourceMetricSource { name: name.into(), ..ResourceMetricSource::default() }),
        }
    }

    fn read(text: &str, metrics: &[MetricSpec]) -> Overrides {
        let annotations = BTreeMap::from([(QUERIES_ANNOTATION.to_string(), text.to_string())]);
        read_overrides(Some(&annotations), metrics)
    }

    fn problems(text: &str, metrics: &[MetricSpec]) -> Vec<String> {
        read(text, metrics).problems.into_iter().map(|(f, m)| format!("{f} {m}")).collect()
    }

    #[test]
    fn entries_target_metrics_by_index_or_by_name() {
        let metrics = [external("requests"), external("latency")];
        let overrides = read(
            r#"[{"metric": 1, "backend": "prom", "query": "histogram_quantile(0.99, x)", "maxAge": "2m"},
                {"metricName": "requests", "query": "sum(rate(r[1m]))", "reducer": "sum"}]"#,
            &metrics,
        );
        assert!(overrides.problems.is_empty(), "{:?}", overrides.problems);
        let latency = &overrides.by_metric[&1];
        assert_eq!(latency.entry, 0);
        assert_eq!(latency.backend.value().map(String::as_str), Some("prom"));
        assert_eq!(latency.max_age.value(), Some(&Duration::from_secs(120)));
        assert_eq!(latency.max_age.origin.field(), "metadata.annotations[\"watermarkd.io/queries\"][0].maxAge");
        let requests = &overrides.by_metric[&0];
        assert_eq!(requests.entry, 1);
        assert_eq!(requests.query.value().map(String::as_str), Some("sum(rate(r[1m]))"));
        assert_eq!(requests.reducer.value(), Some(&Reducer::Sum));
    }

    #[test]
    fn no_annotation_means_no_override() {
        let overrides = read_overrides(None, &[external("a")]);
        assert!(overrides.by_metric.is_empty() && overrides.problems.is_empty());
    }

    #[test]
    fn every_mistake_is_named_with_its_path() {
        let metrics = [external("requests"), resource("cpu"), external("requests")];
        let a = "metadata.annotations[\"watermarkd.io/queries\"]";
        assert_eq!(
            problems("{", &metrics)[0],
            format!("{a} is not valid JSON: EOF while parsing an object at line 1 column 1")
        );
        assert_eq!(
            problems(r#"{"metric": 0}"#, &metrics),
            [format!(
                "{a} must be a JSON list such as [{{\"metric\": 0, \"backend\": \"prom\", \"query\": \"...\"}}], not an object"
            )]
        );
        assert_eq!(
            problems(r#"[1, {"query": "q"}, {"metric": 0, "metricName": "requests", "query": "q"}]"#, &metrics),
            [
                format!("{a}[0] must be an object with \"metric\" or \"metricName\" and \"query\", not a number (1)"),
                format!("{a}[1] needs exactly one of \"metric\" (the index in spec.metrics) and \"metricName\""),
                format!("{a}[2] needs exactly one of \"metric\" (the index in spec.metrics) and \"metricName\""),
            ]
        );
        assert_eq!(
            problems(
                r#"[{"metric": 3, "query": "q"}, {"metric": -1, "query": "q"}, {"metric": 1, "query": "q"}]"#,
                &metrics
            ),
            [
                format!("{a}[0].metric (3) names no metric: spec.metrics has 3 (counted from 0)"),
                format!("{a}[1].metric must be the index of a metric in spec.metrics (0, 1, ...), not a number (-1)"),
                format!(
                    "{a}[2] targets spec.metrics[1], a metric of type \"Resource\": only External metrics take a query \
                     from this annotation"
                ),
            ]
        );
        assert_eq!(
            problems(r#"[{"metricName": "requests", "query": "q"}, {"metricName": "nope", "query": "q"}]"#, &metrics),
            [
                format!("{a}[0].metricName (\"requests\") matches spec.metrics[0] and spec.metrics[2]; use \"metric\" with the index instead"),
                format!("{a}[1].metricName (\"nope\") is the metricName of no External metric in spec.metrics"),
            ]
        );
        assert_eq!(
            problems(r#"[{"metric": 0, "query": "q", "backnd": "prom"}, {"metric": 0, "query": "r"}]"#, &metrics),
            [
                format!("{a}[0].backnd is not a known key (known keys: metric, metricName, query, backend, reducer, maxAge)"),
                format!("{a}[1] gives a query for spec.metrics[0] again (entry [0] already does)"),
            ]
        );
    }
}
