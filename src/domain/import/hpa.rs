//! A `HorizontalPodAutoscaler` (`autoscaling/v2`, `v2beta2`, which have the same shape) as an
//! autoscaler: its target, bounds, `behavior` and each metric from where it is served.

use serde_json::Value;
use watermarkd_engine::Decimal;

use super::adapter::{requirements, GroupResource, Objects};
use super::metric::{self, Basis, Planned, Source, Target};
use super::node::{FieldProblem, Node};
use super::out::{BackendTable, Table, Value as Toml};
use super::{behavior, entry_head, finish_comments, workload, Context, Converted, Subject};

/// The HPA controller's defaults (kube-controller-manager flags).
const HPA_TOLERANCE: &str = "0.1";
const HPA_SYNC_PERIOD: &str = "15s";

pub fn convert(value: &Value, subject: &mut Subject, context: &Context<'_>) -> Option<Converted> {
    let root = Node::root(value);
    if let Some(owner) = keda_owner(value) {
        subject.finding_note_skip(owner);
        return None;
    }
    let mut problems = Vec::new();
    let spec = root.required("spec", &mut problems)?;
    let spec = spec.node();
    let target_ref = spec.required("scaleTargetRef", &mut problems);
    let target = target_ref.as_ref().and_then(|t| scale_target(&t.node(), subject, &mut problems));
    let min = spec.count("minReplicas", i64::from(i32::MAX), &mut problems);
    let max = spec.count("maxReplicas", i64::from(i32::MAX), &mut problems);
    if spec.get("maxReplicas").is_none() {
        problems.push(FieldProblem { field: spec.at("maxReplicas"), message: "is required".into() });
    }
    let mut planned = Vec::new();
    let metrics = spec.list("metrics", &mut problems);
    if metrics.is_empty() && spec.get("metrics").is_none() {
        // The API server defaults an HPA without metrics to 80% cpu utilization.
        subject.chose("spec.metrics is not set: the API server's default, cpu at 80% utilization, is imported");
    }
    let target_for_metrics = target.clone();
    let mut backends = Vec::new();
    if metrics.is_empty() {
        if let Some((_, kind, name)) = &target_for_metrics {
            if let Some(found) =
                resource_metric("cpu", "spec.metrics", ResourceTarget::Utilization(80), kind, name, subject, context)
            {
                planned.push(found);
            }
        }
    }
    for metric in &metrics {
        let Some((_, kind, name)) = &target_for_metrics else { break };
        if let Some((found, backend)) = plan_metric(&metric.node(), kind, name, subject, context, &mut problems) {
            planned.push(found);
            backends.extend(backend);
        }
    }
    let behavior_node = spec.get("behavior");
    let (up, down) = behavior::convert(behavior_node.as_ref(), "spec.behavior", subject);
    subject.field_problems(problems);
    if min == Some(0) {
        subject.not_carried(
            "spec.minReplicas",
            "is 0 (the HPAScaleToZero feature gate): the HPA then stops at 0 with no activation threshold, which \
             watermarkd's scale to zero needs per metric (min_replicas = 0 and an activation for each metric)",
        );
    }
    let (api_version, kind, name) = target?;
    let (algorithm, tables) = metric::finish(planned, subject)?;
    if subject.has_invalid() {
        return None;
    }
    let target_value = Toml::Inline(vec![
        ("api_version".into(), Toml::text(api_version.clone())),
        ("kind".into(), Toml::text(kind.clone())),
        ("namespace".into(), Toml::text(subject.namespace.clone())),
        ("name".into(), Toml::text(name.clone())),
    ]);
    let mut entry = entry_head(subject, &target_value, context);
    entry.main.set_with("interval", Toml::text(HPA_SYNC_PERIOD), "the HPA controller's sync period");
    entry.main.set_with("min_replicas", Toml::Integer(i64::from(min.unwrap_or(1))), "spec.minReplicas (default 1)");
    entry.main.set("max_replicas", Toml::Integer(i64::from(max?)));
    entry.main.set("algorithm", Toml::text(algorithm));
    entry.main.set_with(
        "tolerance",
        Toml::Number(HPA_TOLERANCE.into()),
        "the HPA's default (--horizontal-pod-autoscaler-tolerance); set it to your cluster's",
    );
    entry.behavior = Some((up, down));
    entry.metrics = tables;
    finish_comments(&mut entry, subject);
    Some(Converted { entry, backends, target: (group_of(&api_version), kind, subject.namespace.clone(), name) })
}

impl Subject {
    /// A KEDA-made HPA: skipped with a note, since its ScaledObject is what to import.
    fn finding_note_skip(&mut self, owner: String) {
        self.findings.push(super::Finding {
            severity: super::Severity::Note,
            place: self.place.clone(),
            object: Some(self.object.clone()),
            field: "metadata.ownerReferences".into(),
            message: format!(
                "skipped: it is the HPA KEDA made for the ScaledObject {owner}; import the ScaledObject (it goes when \
                 the ScaledObject is deleted)"
            ),
        });
    }
}

/// The ScaledObject that owns an HPA KEDA made.
fn keda_owner(value: &Value) -> Option<String> {
    let metadata = value.get("metadata")?;
    let owners = metadata.get("ownerReferences").and_then(Value::as_array);
    if let Some(owner) =
        owners.into_iter().flatten().find(|o| o.get("kind").and_then(Value::as_str) == Some("ScaledObject"))
    {
        return owner.get("name").and_then(Value::as_str).map(str::to_string);
    }
    metadata.get("labels")?.get("scaledobject.keda.sh/name").and_then(Value::as_str).map(str::to_string)
}

/// The API group of an apiVersion.
pub fn group_of(api_version: &str) -> String {
    api_version.rsplit_once('/').map_or("", |(group, _)| group).to_string()
}

/// `scaleTargetRef`: (apiVersion, kind, name).
pub fn scale_target(
    node: &Node<'_>,
    subject: &mut Subject,
    problems: &mut Vec<FieldProblem>,
) -> Option<(String, String, String)> {
    let kind = node.required_text("kind", problems)?.to_string();
    let name = node.required_text("name", problems)?.to_string();
    let api_version = match node.text("apiVersion", problems) {
        Some(version) => version.to_string(),
        None => {
            subject.chose(format!("{} is not set: apps/v1 assumed", node.at("apiVersion")));
            "apps/v1".to_string()
        }
    };
    Some((api_version, kind, name))
}

/// What an HPA Resource metric aims at.
#[derive(Clone, Debug)]
pub enum ResourceTarget {
    /// Percent of the pods' requests.
    Utilization(i64),
    /// Per pod.
    AverageValue(String, Decimal),
}

/// A Resource metric (cpu or memory of the target's pods).
pub fn resource_metric(
    resource: &str,
    field: &str,
    target: ResourceTarget,
    kind: &str,
    name: &str,
    subject: &mut Subject,
    context: &Context<'_>,
) -> Option<Planned> {
    if resource != "cpu" && resource != "memory" {
        subject.not_carried(field, format!("names the resource {resource:?}: watermarkd reads cpu and memory"));
        return None;
    }
    let key = (subject.namespace.clone(), kind.to_string(), name.to_string());
    let Some(workload) = context.workloads.get(&key) else {
        subject.not_carried(
            field,
            format!(
                "needs the pods of {kind} {}/{name} (their selector{}): give its manifest too, or import from the \
                 cluster",
                subject.namespace,
                if matches!(target, ResourceTarget::Utilization(_)) { " and requests" } else { "" }
            ),
        );
        return None;
    };
    let selector = match &workload.selector {
        Ok(selector) => selector.clone(),
        Err(err) => {
            subject
                .not_carried(field, format!("the pods of {kind} {}/{name} cannot be told: {err}", subject.namespace));
            return None;
        }
    };
    let mut comments =
        vec![format!("{field}: {resource} of the pods of {kind} {}/{name} ({selector})", subject.namespace)];
    let target = match target {
        ResourceTarget::AverageValue(text, value) => {
            comments.push(format!("averageValue {text} per pod"));
            Target::new(text, value)
        }
        ResourceTarget::Utilization(percent) => {
            let requests = match workload.requests.get(resource) {
                Some(Ok(requests)) => requests.clone(),
                Some(Err(err)) => {
                    subject
                        .not_carried(field, format!("is a utilization, and {err}: the HPA itself cannot compute it"));
                    return None;
                }
                None => {
                    subject
                        .not_carried(field, format!("is a utilization, and the requests of {kind} {name} are unknown"));
                    return None;
                }
            };
            let per_pod = Decimal::from_parts(i128::from(percent), -2).mul(&requests);
            comments.push(format!(
                "averageUtilization {percent}% of the {resource} each pod requests ({requests}{}, the sum of its \
                 containers' requests in {kind} {name}) = {per_pod} per pod; if the requests change, change this too",
                if resource == "cpu" { " cores" } else { " bytes" }
            ));
            Target::new(per_pod.to_string(), per_pod)
        }
    };
    Some(Planned {
        name: resource.to_string(),
        field: field.to_string(),
        source: Source::Resource { resource: resource.to_string(), selector },
        target,
        activation: None,
        max_age: None,
        comments,
    })
}

/// The target of a Pods, Object or External metric: its value and whether it is per replica.
fn metric_target(node: &Node<'_>, problems: &mut Vec<FieldProblem>) -> Option<(Target, Basis, &'static str)> {
    let target = node.required("target", problems)?;
    let t = target.node();
    let kind = t.required_text("type", problems)?;
    let (key, basis, word) = match kind {
        "Value" => ("value", Basis::PerReplica, "value"),
        "AverageValue" => ("averageValue", Basis::Total, "averageValue"),
        "Utilization" => {
            problems.push(FieldProblem {
                field: t.at("type"),
                message: "is Utilization, which only Resource metrics have".into(),
            });
            return None;
        }
        other => {
            problems.push(FieldProblem {
                field: t.at("type"),
                message: format!("must be Value, AverageValue or Utilization, not {other:?}"),
            });
            return None;
        }
    };
    let Some((text, value)) = t.quantity(key, problems) else {
        if t.get(key).is_none() {
            problems.push(FieldProblem { field: t.at(key), message: format!("is required with type {kind}") });
        }
        return None;
    };
    if value.is_zero() || value.is_negative() {
        problems.push(FieldProblem { field: t.at(key), message: "must be above 0".into() });
        return None;
    }
    Some((Target::new(text, value), basis, word))
}

fn plan_metric(
    node: &Node<'_>,
    kind: &str,
    name: &str,
    subject: &mut Subject,
    context: &Context<'_>,
    problems: &mut Vec<FieldProblem>,
) -> Option<(Planned, Option<BackendTable>)> {
    let field = node.path().to_string();
    let metric_type = node.required_text("type", problems)?;
    match metric_type {
        "Resource" => {
            let resource = node.required("resource", problems)?;
            let r = resource.node();
            let resource_name = r.required_text("name", problems)?;
            let target = r.required("target", problems)?;
            let t = target.node();
            let target = match t.required_text("type", problems)? {
                "Utilization" => {
                    ResourceTarget::Utilization(t.integer("averageUtilization", problems).or_else(|| {
                        problems.push(FieldProblem {
                            field: t.at("averageUtilization"),
                            message: "is required with type Utilization".into(),
                        });
                        None
                    })?)
                }
                "AverageValue" => {
                    let (text, value) = t.quantity("averageValue", problems)?;
                    ResourceTarget::AverageValue(text, value)
                }
                other => {
                    problems.push(FieldProblem {
                        field: t.at("type"),
                        message: format!("must be Utilization or AverageValue for a Resource metric, not {other:?}"),
                    });
                    return None;
                }
            };
            resource_metric(resource_name, &field, target, kind, name, subject, context).map(|p| (p, None))
        }
        "ContainerResource" => {
            subject.not_carried(
                &field,
                "is a ContainerResource metric (one container's usage): watermarkd's Resource metrics read whole pods",
            );
            None
        }
        "Pods" | "Object" | "External" => {
            let key = match metric_type {
                "Pods" => "pods",
                "Object" => "object",
                _ => "external",
            };
            let source = node.required(key, problems)?;
            let s = source.node();
            let metric = s.required("metric", problems)?;
            let m = metric.node();
            let metric_name = m.required_text("name", problems)?.to_string();
            let selector_node = m.get("selector");
            let selector = requirements(selector_node.as_ref(), problems);
            let (target, basis, word) = metric_target(&s, problems)?;
            let described = if metric_type == "Object" {
                let d = s.required("describedObject", problems)?;
                let d = d.node();
                let api_version = d.text("apiVersion", problems).unwrap_or("v1").to_string();
                let described_kind = d.required_text("kind", problems)?.to_string();
                let described_name = d.required_text("name", problems)?.to_string();
                Some((api_version, described_kind, described_name))
            } else {
                None
            };
            if metric_type == "Pods" && basis != Basis::Total {
                problems.push(FieldProblem {
                    field: format!("{field}.pods.target.type"),
                    message: "must be AverageValue for a Pods metric".into(),
                });
                return None;
            }
            let mut comments =
                vec![format!("{field}: {metric_type} metric {metric_name:?}, target {word} {}", target.text)];
            let from = match metric_type {
                "Pods" => {
                    let Some(pattern) = workload::pod_name_pattern(kind, name) else {
                        subject.not_carried(
                            &field,
                            format!("is a Pods metric of a {kind}, whose pods' names import cannot tell"),
                        );
                        return None;
                    };
                    adapter_custom(
                        context,
                        subject,
                        &field,
                        &metric_name,
                        &GroupResource::new("", "pods"),
                        &selector,
                        Objects::Pattern(pattern),
                        &mut comments,
                    )
                    .map(|(backend, query)| {
                        (Source::PerPodQuery { backend: backend.name.clone(), query }, Some(backend))
                    })
                }
                "Object" => {
                    let (api_version, described_kind, described_name) = described?;
                    adapter_custom(
                        context,
                        subject,
                        &field,
                        &metric_name,
                        &GroupResource::of_kind(&api_version, &described_kind),
                        &selector,
                        Objects::Named(described_name),
                        &mut comments,
                    )
                    .map(|(backend, query)| {
                        (Source::Query { backend: backend.name.clone(), query, reducer: None, basis }, Some(backend))
                    })
                }
                _ => external(context, subject, &field, &metric_name, &selector, basis, &mut comments),
            };
            let (source, backend) = from?;
            let max_age = match &source {
                Source::Query { backend, .. } if backend == DATADOG_BACKEND => {
                    datadog_max_age(context, subject, &metric_name)
                }
                _ => None,
            };
            let planned = Planned { name: metric_name, field, source, target, activation: None, max_age, comments };
            Some((planned, backend))
        }
        other => {
            problems.push(FieldProblem {
                field: node.at("type"),
                message: format!("must be Resource, Pods, Object, External or ContainerResource, not {other:?}"),
            });
            None
        }
    }
}

/// The backend the adapter's queries go to: the Prometheus it reads (`--prometheus-url`).
pub const ADAPTER_BACKEND: &str = "prometheus";
/// The backend of the Cluster Agent's Datadog queries.
pub const DATADOG_BACKEND: &str = "datadog";

fn adapter_backend(context: &Context<'_>, subject: &mut Subject, field: &str) -> Option<BackendTable> {
    let Some(url) = &context.options.prometheus_url else {
        subject.not_carried(
            field,
            "is served by prometheus-adapter, and the Prometheus it queries is not known: pass --prometheus-url (the \
             adapter's own --prometheus-url)",
        );
        return None;
    };
    let mut table = Table::default();
    table.comment("The Prometheus prometheus-adapter queried (--prometheus-url).");
    table.set("type", Toml::text("prometheus"));
    table.set("url", Toml::text(url.clone()));
    Some(BackendTable { name: ADAPTER_BACKEND.into(), table })
}

#[expect(clippy::too_many_arguments, reason = "one call site each for Pods and Object metrics")]
fn adapter_custom(
    context: &Context<'_>,
    subject: &mut Subject,
    field: &str,
    metric_name: &str,
    resource: &GroupResource,
    selector: &[super::adapter::Requirement],
    objects: Objects,
    comments: &mut Vec<String>,
) -> Option<(BackendTable, String)> {
    let Some(adapter) = &context.options.adapter else {
        subject.not_carried(
            field,
            format!(
                "reads {metric_name:?} from the custom metrics API, and import was given no adapter configuration: pass \
                 --adapter-config if prometheus-adapter serves it"
            ),
        );
        return None;
    };
    match adapter.custom_query(metric_name, resource, &subject.namespace, selector, &objects) {
        Ok(Some(expansion)) => {
            let backend = adapter_backend(context, subject, field)?;
            comments.push(format!("prometheus-adapter's query: {}", expansion.query));
            for assumption in &expansion.assumptions {
                subject.chose(format!("{field}: assumed: {assumption}"));
            }
            Some((backend, expansion.query))
        }
        Ok(None) => {
            subject.not_carried(
                field,
                format!(
                    "no rule of {} serves {metric_name:?} for {}: the metric comes from another adapter, or the \
                     configuration given is not the one that runs",
                    adapter.file, resource.resource
                ),
            );
            None
        }
        Err(err) => {
            subject.not_carried(field, format!("prometheus-adapter cannot build its query: {err}"));
            None
        }
    }
}

fn external(
    context: &Context<'_>,
    subject: &mut Subject,
    field: &str,
    metric_name: &str,
    selector: &[super::adapter::Requirement],
    basis: Basis,
    comments: &mut Vec<String>,
) -> Option<(Source, Option<BackendTable>)> {
    use crate::domain::crd::query::{
        datadog_query, metric_reference, MetricReference, DEFAULT_AGGREGATOR, DEFAULT_ROLLUP_SECONDS,
    };
    match metric_reference(metric_name) {
        MetricReference::DatadogMetric { namespace, name } => {
            let Some(found) = context.datadog_metrics.get(&(namespace.clone(), name.clone())) else {
                subject.not_carried(
                    field,
                    format!(
                        "names the DatadogMetric {namespace}/{name}, which is not among the objects read: give its \
                         manifest too (or import from the cluster)"
                    ),
                );
                return None;
            };
            comments.push(format!(
                "the query of DatadogMetric {namespace}/{name} ({}), on the Datadog backend",
                found.place
            ));
            let query =
                Source::Query { backend: DATADOG_BACKEND.into(), query: found.query.clone(), reducer: None, basis };
            return Some((query, Some(datadog_backend(context, subject))));
        }
        MetricReference::MalformedDatadogMetric => {
            subject.invalid(
                &format!("{field}.external.metric.name"),
                "starts with datadogmetric@ but is not datadogmetric@<namespace>:<name> (the Cluster Agent refuses it)",
            );
            return None;
        }
        MetricReference::Metric => {}
    }
    if let Some(adapter) = &context.options.adapter {
        match adapter.external_query(metric_name, &subject.namespace, selector) {
            Ok(Some(expansion)) => {
                let backend = adapter_backend(context, subject, field)?;
                comments.push(format!(
                    "prometheus-adapter's external query ({} of {}); the HPA adds up every series it returns, so \
                     reducer = \"sum\"",
                    expansion.rule, adapter.file
                ));
                for assumption in &expansion.assumptions {
                    subject.chose(format!("{field}: assumed: {assumption}"));
                }
                let source = Source::Query {
                    backend: backend.name.clone(),
                    query: expansion.query,
                    reducer: Some("sum"),
                    basis,
                };
                return Some((source, Some(backend)));
            }
            Ok(None) => {}
            Err(err) => {
                subject.not_carried(field, format!("prometheus-adapter cannot build its query: {err}"));
                return None;
            }
        }
    }
    if context.options.datadog_cluster_agent {
        let mut labels = std::collections::BTreeMap::new();
        for requirement in selector {
            match (requirement.operator.as_str(), requirement.values.as_slice()) {
                ("Equals", [value]) | ("In", [value]) => {
                    labels.insert(requirement.key.clone(), value.clone());
                }
                _ => {
                    subject.not_carried(
                        field,
                        format!(
                            "selects {:?} with {}: the Cluster Agent turns only matchLabels into Datadog tags",
                            requirement.key, requirement.operator
                        ),
                    );
                    return None;
                }
            }
        }
        let query = datadog_query(metric_name, &labels, DEFAULT_AGGREGATOR, DEFAULT_ROLLUP_SECONDS);
        comments.push(format!(
            "the Datadog Cluster Agent's query for an External metric: the selector's labels as tags, its default \
             aggregator ({DEFAULT_AGGREGATOR}) and rollup ({DEFAULT_ROLLUP_SECONDS}s); change them if its \
             external_metrics.aggregator or external_metrics_provider.rollup differ"
        ));
        let source = Source::Query { backend: DATADOG_BACKEND.into(), query, reducer: None, basis };
        return Some((source, Some(datadog_backend(context, subject))));
    }
    subject.not_carried(
        field,
        format!(
            "reads the External metric {metric_name:?}, and import does not know what serves it: pass --adapter-config \
             if prometheus-adapter does, or --datadog-cluster-agent if the Datadog Cluster Agent does"
        ),
    );
    None
}

fn datadog_max_age(context: &Context<'_>, subject: &Subject, metric_name: &str) -> Option<String> {
    use crate::domain::crd::query::{metric_reference, MetricReference};
    let MetricReference::DatadogMetric { namespace, name } = metric_reference(metric_name) else { return None };
    let _ = subject;
    context.datadog_metrics.get(&(namespace, name))?.max_age.clone()
}

/// The Datadog backend the Cluster Agent's account stands for: the keys named as the Cluster
/// Agent names them, never their values.
pub fn datadog_backend(context: &Context<'_>, subject: &mut Subject) -> BackendTable {
    let mut table = Table::default();
    table.comment("The Datadog account the Cluster Agent (or the WPA controller) queried: give the daemon its keys in");
    table.comment("these variables (the Cluster Agent's own DD_API_KEY and DD_APP_KEY), never in this file.");
    table.set("type", Toml::text("datadog"));
    match &context.options.datadog_site {
        Some(site) => table.set("site", Toml::text(site.clone())),
        None => {
            table.set_with("site", Toml::text("datadoghq.com"), "assumed: pass --datadog-site for another site");
            subject.chose("the Datadog site is assumed to be datadoghq.com (--datadog-site sets it)");
        }
    }
    table.set("api_key_env", Toml::text("DD_API_KEY"));
    table.set("app_key_env", Toml::text("DD_APP_KEY"));
    BackendTable { name: DATADOG_BACKEND.into(), table }
}
