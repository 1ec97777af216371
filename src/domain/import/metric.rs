//! The metrics of an imported autoscaler, planned before the autoscaler's one `algorithm` is
//! chosen: an HPA chooses per metric whether its target is per replica (a Resource or Pods
//! average, an Object or External `Value`) or a total to share (`AverageValue` of an Object or
//! External metric), while the engine has one algorithm per autoscaler. Resource metrics and
//! per-pod queries can be written either way; the rest fix the algorithm.

use watermarkd_engine::Decimal;

use super::out::{Table, Value};
use super::Subject;

/// Whether a target is per replica (`absolute`) or a total the replicas share (`average`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    PerReplica,
    Total,
}

/// A target value: as written, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub text: String,
    pub value: Decimal,
}

impl Target {
    pub fn new(text: impl Into<String>, value: Decimal) -> Target {
        Target { text: text.into(), value }
    }

    /// A plain number as a TOML number, a quantity with a suffix (`500m`) as text, which the
    /// rules read alike.
    fn toml(&self) -> Value {
        if self.text.chars().all(|c| c.is_ascii_digit() || c == '.') && !self.text.is_empty() {
            Value::Number(self.text.clone())
        } else {
            Value::text(self.text.clone())
        }
    }
}

/// What a metric reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// cpu or memory of the target's pods, from the metrics API.
    Resource { resource: String, selector: String },
    /// A query giving one value per pod (prometheus-adapter's Pods metrics): the HPA averages
    /// them, so it is `avg(...)` per replica or `sum(...)` to share.
    PerPodQuery { backend: String, query: String },
    /// A query whose value is compared with the target as it is.
    Query { backend: String, query: String, reducer: Option<&'static str>, basis: Basis },
}

/// One metric before the algorithm is known.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub name: String,
    /// The field it came from (`spec.metrics[0]`), for findings.
    pub field: String,
    pub source: Source,
    /// The target per replica (or in total, for a total).
    pub target: Target,
    pub activation: Option<Target>,
    pub max_age: Option<String>,
    pub comments: Vec<String>,
}

/// The metrics as tables and the algorithm they need, or `None` (said on `subject`) when they
/// cannot share one.
pub fn finish(planned: Vec<Planned>, subject: &mut Subject) -> Option<(&'static str, Vec<Table>)> {
    let totals: Vec<&Planned> =
        planned.iter().filter(|p| matches!(p.source, Source::Query { basis: Basis::Total, .. })).collect();
    let per_replica: Vec<&Planned> =
        planned.iter().filter(|p| matches!(p.source, Source::Query { basis: Basis::PerReplica, .. })).collect();
    let algorithm = if totals.is_empty() { "absolute" } else { "average" };
    if let (Some(total), Some(fixed)) = (totals.first(), per_replica.first()) {
        subject.not_carried(
            &fixed.field,
            format!(
                "its target is per replica (Value), while {}'s is a total to share (AverageValue): the HPA computes each \
                 metric its own way, and watermarkd has one algorithm per autoscaler",
                total.field
            ),
        );
        return None;
    }
    let mut names: Vec<String> = Vec::new();
    let mut tables = Vec::new();
    for metric in planned {
        let mut table = Table { comments: metric.comments.clone(), lines: Vec::new() };
        let mut name = metric.name.clone();
        let mut n = 1;
        while names.contains(&name) {
            n += 1;
            name = format!("{}-{n}", metric.name);
        }
        names.push(name.clone());
        table.set("name", Value::text(name));
        match &metric.source {
            Source::Resource { resource, selector } => {
                table.set("resource", Value::text(resource.clone()));
                table.set("selector", Value::text(selector.clone()));
                if algorithm == "absolute" {
                    table.set_with(
                        "pod_aggregation",
                        Value::text("average"),
                        "the usage per pod, as the HPA averages it",
                    );
                } else {
                    table.set_with(
                        "pod_aggregation",
                        Value::text("sum"),
                        "summed, then divided by the ready replicas (algorithm = \"average\")",
                    );
                }
            }
            Source::PerPodQuery { backend, query } => {
                table.set("backend", Value::text(backend.clone()));
                if algorithm == "absolute" {
                    table.set_with(
                        "query",
                        Value::text(format!("avg({query})")),
                        "the average over the pods, as the HPA takes it",
                    );
                } else {
                    table.set_with(
                        "query",
                        Value::text(format!("sum({query})")),
                        "summed over the pods, then divided by the ready replicas (algorithm = \"average\")",
                    );
                }
            }
            Source::Query { backend, query, reducer, .. } => {
                table.set("backend", Value::text(backend.clone()));
                table.set("query", Value::text(query.clone()));
                if let Some(reducer) = reducer {
                    table.set("reducer", Value::text(*reducer));
                }
            }
        }
        table.set("high_watermark", metric.target.toml());
        table.set("low_watermark", metric.target.toml());
        if let Some(activation) = &metric.activation {
            table.set("activation", activation.toml());
        }
        if let Some(max_age) = &metric.max_age {
            table.set("max_age", Value::text(max_age.clone()));
        }
        tables.push(table);
    }
    Some((algorithm, tables))
}
