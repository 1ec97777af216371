//! What an autoscaler needs of the workload it scales: which pods are its own (the selector,
//! and the shape of their names), and what each pod requests (for a utilization target).

use std::collections::BTreeMap;

use serde_json::Value;
use watermarkd_engine::Decimal;

use super::node::Node;
use crate::domain::rules::parse_quantity;
use crate::domain::rules::selector::{selector_text, Expression};

/// A Deployment, StatefulSet or ReplicaSet, as far as an import needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub kind: String,
    pub name: String,
    /// `spec.selector` as text (`app=web,tier in (a)`), or why it cannot be.
    pub selector: Result<String, String>,
    /// Per resource (`cpu`, `memory`): the sum over the pod template's containers of their
    /// requests, or the first container without one.
    pub requests: BTreeMap<String, Result<Decimal, String>>,
}

/// Reads a workload; `None` when it has no name.
pub fn read(value: &Value) -> Option<Workload> {
    let root = Node::root(value);
    let mut ignored = Vec::new();
    let kind = root.text("kind", &mut ignored)?.to_string();
    let name = root.get("metadata")?.node().text("name", &mut ignored)?.to_string();
    let spec = root.get("spec");
    let selector = match spec.as_ref().and_then(|s| s.node().get("selector")) {
        Some(selector) => label_selector(&selector.node()),
        None => Err("has no spec.selector".into()),
    };
    let containers = spec
        .as_ref()
        .and_then(|s| s.node().get("template"))
        .and_then(|t| t.node().get("spec"))
        .map(|s| s.node().list("containers", &mut ignored))
        .unwrap_or_default();
    let mut requests = BTreeMap::new();
    for resource in ["cpu", "memory"] {
        let mut total = Ok(Decimal::zero());
        if containers.is_empty() {
            total = Err("its pod template has no containers".to_string());
        }
        for container in &containers {
            let container = container.node();
            let name = container.value.get("name").and_then(Value::as_str).unwrap_or("?");
            let request =
                container.value.get("resources").and_then(|r| r.get("requests")).and_then(|r| r.get(resource)).map(
                    |q| match q {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    },
                );
            total = match (total, request) {
                (Err(err), _) => Err(err),
                (Ok(_), None) => Err(format!("container {name:?} requests no {resource}")),
                (Ok(sum), Some(text)) => match parse_quantity(&text) {
                    Ok(value) => Ok(sum.add(&value)),
                    Err(err) => Err(format!("container {name:?}: {resource} request {err}")),
                },
            };
        }
        requests.insert(resource.to_string(), total);
    }
    Some(Workload { kind, name, selector, requests })
}

/// A `LabelSelector` (`matchLabels`, `matchExpressions`) as text.
pub fn label_selector(node: &Node<'_>) -> Result<String, String> {
    let mut problems = Vec::new();
    let labels = node.text_map("matchLabels", &mut problems);
    let mut expressions = Vec::new();
    for expression in node.list("matchExpressions", &mut problems) {
        let e = expression.node();
        let key = e.text("key", &mut problems).unwrap_or_default().to_string();
        let operator = e.text("operator", &mut problems).unwrap_or_default().to_string();
        let values =
            e.list("values", &mut problems).iter().filter_map(|v| v.value.as_str().map(str::to_string)).collect();
        expressions.push(Expression { key, operator, values });
    }
    if let Some(problem) = problems.first() {
        return Err(format!("{}: {}", problem.field, problem.message));
    }
    selector_text(&labels, &expressions)
}

/// How the pods of a `kind` named `name` are named, as a regex (RE2, anchored by Prometheus):
/// a Deployment's `NAME-<template hash>-<random>`, a StatefulSet's `NAME-<ordinal>`, a
/// ReplicaSet's `NAME-<random>`. `None` for other kinds.
pub fn pod_name_pattern(kind: &str, name: &str) -> Option<String> {
    // Kubernetes names are lower-case letters, digits, `-` and `.`: only the dot means
    // something in a regex.
    let name = name.replace('.', "\\.");
    match kind {
        "Deployment" => Some(format!("{name}-[a-z0-9]+-[a-z0-9]+")),
        "StatefulSet" => Some(format!("{name}-[0-9]+")),
        "ReplicaSet" => Some(format!("{name}-[a-z0-9]+")),
        _ => None,
    }
}
