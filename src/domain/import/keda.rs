//! A KEDA `ScaledObject` (`keda.sh/v1alpha1`) as an autoscaler, by the KEDA documentation's
//! rules: `minReplicaCount` (default 0) and `maxReplicaCount` (default 100), scale to zero after
//! `cooldownPeriod` (default 300 s) once no trigger is active (a value above its
//! `activationThreshold`), `idleReplicaCount`, `fallback` after `failureThreshold` failed
//! polls, `advanced.horizontalPodAutoscalerConfig.behavior` for the HPA KEDA makes, the pause
//! annotations, and the `prometheus`, `datadog`, `cpu`, `memory` and `cron` triggers, each an
//! External metric of that HPA whose `metricType` (default `AverageValue`) says whether its
//! threshold is per replica (`Value`) or a total to share.
//!
//! `TriggerAuthentication`s become backend settings naming where each secret must come from (a
//! variable or a file the daemon is given), never its value.

use std::collections::BTreeMap;

use serde_json::Value;

use super::hpa::{group_of, resource_metric, ResourceTarget};
use super::manifest::Document;
use super::metric::{self, Basis, Planned, Source, Target};
use super::node::{FieldProblem, Node};
use super::out::{BackendTable, Table, Value as Toml};
use super::{behavior, entry_head, finish_comments, Context, Converted, Finding, Severity, Subject};
use crate::domain::rules::parse_quantity;

const PAUSED: &str = "autoscaling.keda.sh/paused";
const PAUSED_REPLICAS: &str = "autoscaling.keda.sh/paused-replicas";
/// The HPA's sync period: KEDA's HPA asks the metrics this often; `pollingInterval` only
/// paces the activation checks (0 <-> 1).
const HPA_SYNC_PERIOD: i64 = 15;

/// Where a secret of a trigger comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretFrom {
    /// A key of a Secret.
    Secret { name: String, key: String },
    /// A variable of the scaled workload's container.
    Env { name: String },
}

/// A `TriggerAuthentication` (or its cluster-wide twin): each parameter's source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerAuth {
    pub namespace: Option<String>,
    pub parameters: BTreeMap<String, SecretFrom>,
    /// Providers import cannot name a source for (Vault, cloud secret managers, pod identity).
    pub unsupported: Vec<String>,
}

pub fn read_trigger_auth(document: &Document, cluster: bool) -> Result<(String, TriggerAuth), Vec<Finding>> {
    let root = Node::root(&document.value);
    let mut problems = Vec::new();
    let name = root.get("metadata").and_then(|m| m.node().required_text("name", &mut problems).map(str::to_string));
    let namespace =
        root.get("metadata").and_then(|m| m.value.get("namespace").and_then(Value::as_str).map(str::to_string));
    let mut parameters = BTreeMap::new();
    let mut unsupported = Vec::new();
    if let Some(spec) = root.required("spec", &mut problems) {
        let spec = spec.node();
        for entry in spec.list("secretTargetRef", &mut problems) {
            let e = entry.node();
            let (Some(parameter), Some(secret), Some(key)) = (
                e.required_text("parameter", &mut problems),
                e.required_text("name", &mut problems),
                e.required_text("key", &mut problems),
            ) else {
                continue;
            };
            parameters
                .insert(parameter.to_string(), SecretFrom::Secret { name: secret.to_string(), key: key.to_string() });
        }
        for entry in spec.list("env", &mut problems) {
            let e = entry.node();
            let (Some(parameter), Some(variable)) =
                (e.required_text("parameter", &mut problems), e.required_text("name", &mut problems))
            else {
                continue;
            };
            parameters.insert(parameter.to_string(), SecretFrom::Env { name: variable.to_string() });
        }
        for key in spec.keys() {
            if !matches!(key, "secretTargetRef" | "env") {
                unsupported.push(format!("spec.{key}"));
            }
        }
    }
    let kind = if cluster { "ClusterTriggerAuthentication" } else { "TriggerAuthentication" };
    match name {
        Some(name) if problems.is_empty() => Ok((name, TriggerAuth { namespace, parameters, unsupported })),
        _ => Err(problems
            .into_iter()
            .map(|p| Finding {
                severity: Severity::Invalid,
                place: document.place.clone(),
                object: Some(kind.into()),
                field: p.field,
                message: p.message,
            })
            .collect()),
    }
}

pub fn convert(value: &Value, subject: &mut Subject, context: &Context<'_>) -> Option<Converted> {
    let root = Node::root(value);
    let mut problems = Vec::new();
    let annotations = root.get("metadata").map(|m| m.node().text_map("annotations", &mut problems)).unwrap_or_default();
    let spec = root.required("spec", &mut problems)?;
    let spec = spec.node();
    let target_ref = spec.required("scaleTargetRef", &mut problems);
    let target = target_ref.as_ref().and_then(|t| {
        let t = t.node();
        let name = t.required_text("name", &mut problems)?.to_string();
        let kind = t.text("kind", &mut problems).unwrap_or("Deployment").to_string();
        let api_version = t.text("apiVersion", &mut problems).unwrap_or("apps/v1").to_string();
        Some((api_version, kind, name))
    });
    let polling = spec.integer("pollingInterval", &mut problems).unwrap_or(30);
    let cooldown = spec.integer("cooldownPeriod", &mut problems).unwrap_or(300);
    let min = spec.count("minReplicaCount", i64::from(i32::MAX), &mut problems).unwrap_or(0);
    let max = spec.count("maxReplicaCount", i64::from(i32::MAX), &mut problems).unwrap_or(100);
    let idle = spec.count("idleReplicaCount", i64::from(i32::MAX), &mut problems);
    if spec.get("minReplicaCount").is_none() {
        subject.chose("spec.minReplicaCount is not set: KEDA's default 0 (scale to zero)");
    }
    if spec.get("maxReplicaCount").is_none() {
        subject.chose("spec.maxReplicaCount is not set: KEDA's default 100");
    }
    let advanced = spec.map("advanced", &mut problems);
    let hpa_config = advanced.as_ref().and_then(|a| a.node().map("horizontalPodAutoscalerConfig", &mut problems));
    let behavior_node = hpa_config.as_ref().and_then(|h| h.node().get("behavior"));
    if let Some(advanced) = &advanced {
        if advanced.node().get("scalingModifiers").is_some() {
            subject.not_carried(
                "spec.advanced.scalingModifiers",
                "combines the triggers with a formula: watermarkd scales on each metric and takes the largest proposal",
            );
        }
        if advanced.node().flag("restoreToOriginalReplicaCount", &mut problems) == Some(true) {
            subject.chose(
                "spec.advanced.restoreToOriginalReplicaCount is true: KEDA would put the replicas back when the \
                 ScaledObject is deleted; with watermarkd taking over, deleting it leaves them as they are",
            );
        }
    }
    let scale_to_zero = min == 0 || idle == Some(0);
    match idle {
        Some(0) if min > 1 => subject.not_carried(
            "spec.idleReplicaCount",
            format!(
                "is 0 with minReplicaCount {min}: watermarkd's scale to zero wakes to 1 replica and then follows its \
                 metrics, with no separate floor while active"
            ),
        ),
        Some(n) if n > 0 => subject.not_carried("spec.idleReplicaCount", format!("is {n}: KEDA supports only 0")),
        _ => {}
    }

    let mut planned = Vec::new();
    let mut schedules = Vec::new();
    let mut backends = Vec::new();
    let triggers = spec.list("triggers", &mut problems);
    if triggers.is_empty() {
        problems.push(FieldProblem { field: spec.at("triggers"), message: "must list at least one trigger".into() });
    }
    let mut resource_triggers = Vec::new();
    for trigger in &triggers {
        let Some((_, kind, name)) = &target else { break };
        let t = trigger.node();
        let Some(trigger_type) = t.required_text("type", &mut problems) else { continue };
        let metadata = t.text_map("metadata", &mut problems);
        let field = t.path().to_string();
        match trigger_type {
            "prometheus" | "datadog" => {
                let found = if trigger_type == "prometheus" {
                    prometheus_trigger(&t, &metadata, subject, context, &mut problems)
                } else {
                    datadog_trigger(&t, &metadata, subject, context, &mut problems)
                };
                if let Some((p, backend)) = found {
                    planned.push(p);
                    backends.extend(backend);
                }
            }
            "cpu" | "memory" => {
                resource_triggers.push(field.clone());
                if metadata.contains_key("containerName") {
                    subject.not_carried(
                        &format!("{field}.metadata.containerName"),
                        "scales on one container's usage: watermarkd's Resource metrics read whole pods",
                    );
                    continue;
                }
                let metric_type = t
                    .text("metricType", &mut problems)
                    .or(metadata.get("type").map(String::as_str))
                    .unwrap_or("")
                    .to_string();
                let Some(value_text) = metadata.get("value") else {
                    problems.push(FieldProblem { field: format!("{field}.metadata.value"), message: "is required".into() });
                    continue;
                };
                let target = match metric_type.as_str() {
                    "Utilization" => match value_text.trim().parse::<i64>() {
                        Ok(percent) => ResourceTarget::Utilization(percent),
                        Err(_) => {
                            problems.push(FieldProblem {
                                field: format!("{field}.metadata.value"),
                                message: format!("must be a whole percentage, not {value_text:?}"),
                            });
                            continue;
                        }
                    },
                    "AverageValue" => match parse_quantity(value_text.trim()) {
                        Ok(value) => ResourceTarget::AverageValue(value_text.trim().to_string(), value),
                        Err(err) => {
                            problems.push(FieldProblem { field: format!("{field}.metadata.value"), message: format!("{err}") });
                            continue;
                        }
                    },
                    other => {
                        problems.push(FieldProblem {
                            field: format!("{field}.metricType"),
                            message: format!("must be Utilization or AverageValue for a {trigger_type} trigger, not {other:?}"),
                        });
                        continue;
                    }
                };
                if let Some(p) = resource_metric(trigger_type, &field, target, kind, name, subject, context) {
                    planned.push(p);
                }
            }
            "cron" => {
                if let Some(schedule) = cron_trigger(&field, &metadata, subject, &mut problems) {
                    schedules.push(schedule);
                }
            }
            other => subject.not_carried(
                &format!("{field}.type"),
                format!(
                    "is the {other:?} trigger, which import does not carry over (prometheus, datadog, cpu, memory and cron \
                     are): write its metric by hand, or leave this ScaledObject to KEDA"
                ),
            ),
        }
    }
    if scale_to_zero && !resource_triggers.is_empty() {
        subject.not_carried(
            resource_triggers.first().map_or("spec.triggers", String::as_str),
            "is a cpu or memory trigger on a ScaledObject that scales to zero: KEDA never counts them as active, and \
             watermarkd's scale to zero needs an activation for every metric",
        );
    }
    let behavior_path = "spec.advanced.horizontalPodAutoscalerConfig.behavior";
    let (up, down) = behavior::convert(behavior_node.as_ref(), behavior_path, subject);
    let fallback = spec
        .map("fallback", &mut problems)
        .and_then(|f| fallback(&f.node(), polling, planned.len(), subject, &mut problems));
    subject.field_problems(problems);
    if planned.is_empty() && subject.carried() && target.is_some() {
        subject.not_carried(
            "spec.triggers",
            "has only cron triggers: each becomes a schedule, and a watermarkd autoscaler needs at least one metric \
             (add one by hand)",
        );
    }
    let (api_version, kind, name) = target?;
    if !scale_to_zero {
        for p in &mut planned {
            p.activation = None;
        }
    }
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
    entry.main.set_with(
        "interval",
        Toml::text(format!("{HPA_SYNC_PERIOD}s")),
        format!(
            "the HPA KEDA makes asks the triggers' metrics every 15s; pollingInterval ({polling}s) paces only KEDA's \
             activation checks"
        ),
    );
    if scale_to_zero {
        entry.main.set_with("min_replicas", Toml::Integer(0), "KEDA scales this one to zero");
        entry.main.set_with(
            "scale_to_zero_delay",
            Toml::text(format!("{cooldown}s")),
            "spec.cooldownPeriod: how long every trigger must be inactive",
        );
        entry.main.set_with("tolerate_zero", Toml::Flag(true), "KEDA reads a value of 0 as 0");
    } else {
        entry.main.set("min_replicas", Toml::Integer(i64::from(min)));
    }
    entry.main.set("max_replicas", Toml::Integer(i64::from(max)));
    entry.main.set("algorithm", Toml::text(algorithm));
    entry.main.set_with(
        "tolerance",
        Toml::Number("0.1".into()),
        "the HPA's default (--horizontal-pod-autoscaler-tolerance); set it to your cluster's",
    );
    match (annotations.get(PAUSED).map(String::as_str), annotations.get(PAUSED_REPLICAS)) {
        (_, Some(replicas)) => {
            entry.main.set_with("dry_run", Toml::Flag(true), format!("{PAUSED_REPLICAS}: {replicas}"));
            subject.differs(
                &format!("metadata.annotations.{PAUSED_REPLICAS}"),
                format!(
                    "KEDA holds the target at {replicas} replicas; dry_run = true writes nothing, so the target stays where \
                     KEDA left it. Remove dry_run to let the autoscaler scale"
                ),
            );
        }
        (Some("true"), None) => {
            entry.main.set_with("dry_run", Toml::Flag(true), format!("{PAUSED}: \"true\""));
            subject.chose(format!(
                "{PAUSED} is \"true\": dry_run = true, which decides and writes nothing, until removed"
            ));
        }
        _ => {}
    }
    entry.behavior = Some((up, down));
    entry.metrics = tables;
    entry.schedules = schedules;
    entry.fallback = fallback;
    finish_comments(&mut entry, subject);
    Some(Converted { entry, backends, target: (group_of(&api_version), kind, subject.namespace.clone(), name) })
}

/// The metric type of a trigger (default `AverageValue`) as a basis.
fn basis(trigger: &Node<'_>, problems: &mut Vec<FieldProblem>) -> Option<(Basis, &'static str)> {
    match trigger.text("metricType", problems).unwrap_or("AverageValue") {
        "AverageValue" => Some((Basis::Total, "AverageValue")),
        "Value" => Some((Basis::PerReplica, "Value")),
        other => {
            problems.push(FieldProblem {
                field: trigger.at("metricType"),
                message: format!("must be AverageValue or Value for this trigger, not {other:?}"),
            });
            None
        }
    }
}

fn threshold(
    field: &str,
    metadata: &BTreeMap<String, String>,
    key: &str,
    problems: &mut Vec<FieldProblem>,
) -> Option<Target> {
    let text = metadata.get(key)?;
    match parse_quantity(text.trim()) {
        Ok(value) => Some(Target::new(text.trim(), value)),
        Err(err) => {
            problems.push(FieldProblem { field: format!("{field}.metadata.{key}"), message: format!("{err}") });
            None
        }
    }
}

/// The TriggerAuthentication a trigger names, looked up.
fn trigger_auth<'c>(
    trigger: &Node<'_>,
    subject: &mut Subject,
    context: &'c Context<'_>,
    problems: &mut Vec<FieldProblem>,
) -> Result<Option<(String, &'c TriggerAuth)>, ()> {
    let Some(reference) = trigger.map("authenticationRef", problems) else { return Ok(None) };
    let r = reference.node();
    let Some(name) = r.required_text("name", problems) else { return Err(()) };
    let cluster = r.text("kind", problems) == Some("ClusterTriggerAuthentication");
    let scope = if cluster { None } else { Some(subject.namespace.clone()) };
    match context.trigger_auths.get(&(scope, name.to_string())) {
        Some(auth) => {
            if let Some(provider) = auth.unsupported.first() {
                subject.not_carried(
                    &r.at("name"),
                    format!(
                        "names {name}, whose {provider} import cannot name a source for (secretTargetRef and env can \
                         be; give the daemon the secret in a variable or file and write it in the backend by hand)"
                    ),
                );
                return Err(());
            }
            Ok(Some((name.to_string(), auth)))
        }
        None => {
            subject.not_carried(
                &r.at("name"),
                format!(
                    "names the {} {name}, which is not among the objects read: give its manifest too",
                    if cluster { "ClusterTriggerAuthentication" } else { "TriggerAuthentication" }
                ),
            );
            Err(())
        }
    }
}

/// A variable name for a secret: `SECRET_KEY` in capitals, what the daemon's environment must
/// hold.
fn variable_for(from: &SecretFrom) -> String {
    let raw = match from {
        SecretFrom::Secret { name, key } => format!("{name}_{key}"),
        SecretFrom::Env { name } => return name.clone(),
    };
    let mut name: String =
        raw.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Where the secret comes from, in words for a comment.
fn secret_words(from: &SecretFrom, namespace: &str) -> String {
    match from {
        SecretFrom::Secret { name, key } => format!("key {key:?} of Secret {namespace}/{name}"),
        SecretFrom::Env { name } => format!("the variable {name} of the scaled workload's container"),
    }
}

/// A file path under which a Secret's key is expected to be mounted.
fn file_for(from: &SecretFrom) -> Option<String> {
    match from {
        SecretFrom::Secret { name, key } => Some(format!("/etc/watermarkd/secrets/{name}/{key}")),
        SecretFrom::Env { .. } => None,
    }
}

fn sanitized(text: &str) -> String {
    let mut out: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_string()
}

fn prometheus_trigger(
    trigger: &Node<'_>,
    metadata: &BTreeMap<String, String>,
    subject: &mut Subject,
    context: &Context<'_>,
    problems: &mut Vec<FieldProblem>,
) -> Option<(Planned, Option<BackendTable>)> {
    let field = trigger.path().to_string();
    let at = |key: &str| format!("{field}.metadata.{key}");
    let Some(server) = metadata.get("serverAddress") else {
        problems.push(FieldProblem { field: at("serverAddress"), message: "is required".into() });
        return None;
    };
    let Some(query) = metadata.get("query") else {
        problems.push(FieldProblem { field: at("query"), message: "is required".into() });
        return None;
    };
    let Some(target) = threshold(&field, metadata, "threshold", problems) else {
        if !metadata.contains_key("threshold") {
            problems.push(FieldProblem { field: at("threshold"), message: "is required".into() });
        }
        return None;
    };
    let activation = threshold(&field, metadata, "activationThreshold", problems)
        .unwrap_or(Target::new("0", watermarkd_engine::Decimal::zero()));
    let (basis, word) = basis(trigger, problems)?;
    let auth = trigger_auth(trigger, subject, context, problems).ok()?;
    let host = server.split("://").nth(1).unwrap_or(server).split('/').next().unwrap_or(server);
    let mut backend_name = format!("keda-{}", sanitized(host));
    let mut table = Table::default();
    table.comment(format!("The Prometheus of KEDA's prometheus triggers at {server}."));
    table.set("type", Toml::text("prometheus"));
    table.set("url", Toml::text(server.clone()));
    if let Some(namespace) = metadata.get("namespace") {
        table.set_with(
            "params",
            Toml::Inline(vec![("namespace".into(), Toml::text(namespace.clone()))]),
            "metadata.namespace, which KEDA sends as a query parameter",
        );
    }
    if let Some(headers) = metadata.get("customHeaders") {
        let mut entries = Vec::new();
        for pair in headers.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((name, value)) = pair.split_once('=') else {
                problems
                    .push(FieldProblem { field: at("customHeaders"), message: format!("{pair:?} is not NAME=VALUE") });
                return None;
            };
            entries.push((name.trim().to_string(), Toml::text(value.trim())));
        }
        table.set("headers", Toml::Inline(entries));
    }
    if metadata.get("unsafeSsl").is_some_and(|v| v == "true") {
        table.set_with("insecure_skip_verify", Toml::Flag(true), "metadata.unsafeSsl");
    }
    if let Some((auth_name, auth)) = auth {
        backend_name = format!("{backend_name}-{}", sanitized(&auth_name));
        let modes = metadata.get("authModes").cloned().unwrap_or_default();
        let ns = auth.namespace.clone().unwrap_or_else(|| "(the cluster)".into());
        for mode in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            match mode {
                "bearer" => {
                    let Some(from) = auth.parameters.get("bearerToken") else {
                        subject.not_carried(&at("authModes"), format!("is bearer, and {auth_name} has no bearerToken"));
                        return None;
                    };
                    table.set_with(
                        "bearer_token_env",
                        Toml::text(variable_for(from)),
                        format!("give the daemon {} in this variable", secret_words(from, &ns)),
                    );
                }
                "tls" => {
                    for (parameter, key) in
                        [("ca", "ca_file"), ("cert", "client_cert_file"), ("key", "client_key_file")]
                    {
                        let Some(from) = auth.parameters.get(parameter) else { continue };
                        let Some(path) = file_for(from) else {
                            subject.not_carried(
                                &at("authModes"),
                                format!("tls: {parameter} comes from a variable; the daemon reads TLS files"),
                            );
                            return None;
                        };
                        table.set_with(key, Toml::text(path), format!("mount {} here", secret_words(from, &ns)));
                    }
                }
                other => {
                    subject.not_carried(
                        &at("authModes"),
                        format!(
                            "is {other}: the daemon takes basic auth's username written in the rules (KEDA reads it from \
                             {auth_name}) and custom headers only for what is not secret; write the backend's auth by hand"
                        ),
                    );
                    return None;
                }
            }
        }
    }
    let mut comments = vec![format!(
        "{field}: prometheus trigger, threshold {} ({word}{}), activationThreshold {}",
        target.text,
        if basis == Basis::Total { ": a total the replicas share" } else { ": per replica" },
        activation.text
    )];
    if metadata.get("ignoreNullValues").is_none_or(|v| v != "false") {
        comments.push("KEDA reads an empty answer as 0 (ignoreNullValues); watermarkd holds on it".into());
    }
    let planned = Planned {
        name: trigger.text("name", problems).map_or_else(|| "prometheus".to_string(), str::to_string),
        field,
        source: Source::Query { backend: backend_name.clone(), query: query.clone(), reducer: None, basis },
        target,
        activation: Some(activation),
        max_age: None,
        comments,
    };
    Some((planned, Some(BackendTable { name: backend_name, table })))
}

fn datadog_trigger(
    trigger: &Node<'_>,
    metadata: &BTreeMap<String, String>,
    subject: &mut Subject,
    context: &Context<'_>,
    problems: &mut Vec<FieldProblem>,
) -> Option<(Planned, Option<BackendTable>)> {
    let field = trigger.path().to_string();
    let at = |key: &str| format!("{field}.metadata.{key}");
    let (basis, word) = basis(trigger, problems)?;
    let cluster_agent = metadata.get("useClusterAgentProxy").is_some_and(|v| v == "true");
    let query = if cluster_agent {
        let (Some(name), Some(namespace)) = (metadata.get("datadogMetricName"), metadata.get("datadogMetricNamespace"))
        else {
            problems.push(FieldProblem {
                field: at("datadogMetricName"),
                message: "and datadogMetricNamespace are required with useClusterAgentProxy".into(),
            });
            return None;
        };
        match context.datadog_metrics.get(&(namespace.clone(), name.clone())) {
            Some(found) => found.query.clone(),
            None => {
                subject.not_carried(
                    &at("datadogMetricName"),
                    format!("names the DatadogMetric {namespace}/{name}, which is not among the objects read: give its manifest too"),
                );
                return None;
            }
        }
    } else {
        let Some(query) = metadata.get("query") else {
            problems.push(FieldProblem { field: at("query"), message: "is required".into() });
            return None;
        };
        query.clone()
    };
    if has_top_level_comma(&query) {
        subject.not_carried(
            &at("query"),
            "holds several queries combined by queryAggregator: a watermarkd metric is one query (write one metric per \
             query: the largest proposal wins, as queryAggregator max would)",
        );
        return None;
    }
    let Some(target) = threshold(&field, metadata, "queryValue", problems) else {
        if !metadata.contains_key("queryValue") {
            problems.push(FieldProblem { field: at("queryValue"), message: "is required".into() });
        }
        return None;
    };
    let activation = threshold(&field, metadata, "activationQueryValue", problems)
        .unwrap_or(Target::new("0", watermarkd_engine::Decimal::zero()));
    if metadata.contains_key("metricUnavailableValue") {
        subject.not_carried(
            &at("metricUnavailableValue"),
            "stands in a value for missing data: watermarkd never reads missing data as a value (a fallback in \
             [autoscaler.fallback] says what to do instead)",
        );
        return None;
    }
    let auth = trigger_auth(trigger, subject, context, problems).ok()?;
    let mut table = Table::default();
    table.set("type", Toml::text("datadog"));
    let backend_name = match &auth {
        Some((auth_name, auth)) => {
            let ns = auth.namespace.clone().unwrap_or_else(|| "(the cluster)".into());
            table.comment(format!("The Datadog account of KEDA's TriggerAuthentication {auth_name}."));
            match auth.parameters.get("datadogSite") {
                Some(SecretFrom::Secret { .. } | SecretFrom::Env { .. }) => {
                    subject.not_carried(
                        &format!("{field}.authenticationRef"),
                        format!("{auth_name} reads datadogSite from a secret; write the backend's site by hand"),
                    );
                    return None;
                }
                None => match metadata.get("datadogSite").or(context.options.datadog_site.as_ref()) {
                    Some(site) => table.set("site", Toml::text(site.clone())),
                    None => table.set_with("site", Toml::text("datadoghq.com"), "KEDA's default site"),
                },
            }
            for (parameter, key) in [("apiKey", "api_key_env"), ("appKey", "app_key_env")] {
                let Some(from) = auth.parameters.get(parameter) else {
                    subject
                        .not_carried(&format!("{field}.authenticationRef"), format!("{auth_name} has no {parameter}"));
                    return None;
                };
                table.set_with(
                    key,
                    Toml::text(variable_for(from)),
                    format!("give the daemon {} in this variable", secret_words(from, &ns)),
                );
            }
            format!("keda-datadog-{}", sanitized(auth_name))
        }
        None => {
            subject.not_carried(
                &field,
                "is a datadog trigger without authenticationRef: KEDA needs its apiKey and appKey from a \
                 TriggerAuthentication",
            );
            return None;
        }
    };
    let age = metadata.get("age").map_or(Ok(90), |a| a.trim().parse::<u64>());
    match age {
        Ok(age) => table.set_with("window", Toml::text(format!("{age}s")), "the trigger's age (KEDA's default 90)"),
        Err(_) => {
            problems.push(FieldProblem { field: at("age"), message: "must be whole seconds".into() });
            return None;
        }
    }
    subject.differs(
        &at("query"),
        "KEDA takes the newest point of the answer (lastAvailablePointOffset 0); watermarkd takes the \
         penultimate non-null point, as the Cluster Agent does, since the newest bucket may still be filling",
    );
    let comments = vec![format!(
        "{field}: datadog trigger, queryValue {} ({word}), activationQueryValue {}",
        target.text, activation.text
    )];
    let planned = Planned {
        name: trigger.text("name", problems).map_or_else(|| "datadog".to_string(), str::to_string),
        field,
        source: Source::Query { backend: backend_name.clone(), query, reducer: None, basis },
        target,
        activation: Some(activation),
        max_age: None,
        comments,
    };
    Some((planned, Some(BackendTable { name: backend_name, table })))
}

/// Whether a Datadog query is several queries (`a{x},b{y}`): a comma outside braces and
/// parentheses.
fn has_top_level_comma(query: &str) -> bool {
    let mut depth = 0i32;
    for c in query.chars() {
        match c {
            '{' | '(' => depth += 1,
            '}' | ')' => depth -= 1,
            ',' if depth == 0 => return true,
            _ => {}
        }
    }
    false
}

/// A cron trigger as a schedule: its start cron, and the time to its end cron as the
/// duration, which must be the same every time (the same days, a fixed minute and hour).
fn cron_trigger(
    field: &str,
    metadata: &BTreeMap<String, String>,
    subject: &mut Subject,
    problems: &mut Vec<FieldProblem>,
) -> Option<Table> {
    let at = |key: &str| format!("{field}.metadata.{key}");
    let mut missing = false;
    for key in ["timezone", "start", "end", "desiredReplicas"] {
        if !metadata.contains_key(key) {
            problems.push(FieldProblem { field: at(key), message: "is required".into() });
            missing = true;
        }
    }
    if missing {
        return None;
    }
    let (timezone, start, end, desired) =
        (metadata.get("timezone")?, metadata.get("start")?, metadata.get("end")?, metadata.get("desiredReplicas")?);
    let Ok(desired) = desired.trim().parse::<u32>() else {
        problems.push(FieldProblem {
            field: at("desiredReplicas"),
            message: format!("must be a whole number, not {desired:?}"),
        });
        return None;
    };
    let start_fields: Vec<&str> = start.split_whitespace().collect();
    let end_fields: Vec<&str> = end.split_whitespace().collect();
    let duration = match (start_fields.as_slice(), end_fields.as_slice()) {
        ([m1, h1, rest1 @ ..], [m2, h2, rest2 @ ..]) if rest1 == rest2 && rest1.len() == 3 => {
            match (m1.parse::<i64>(), h1.parse::<i64>(), m2.parse::<i64>(), h2.parse::<i64>()) {
                (Ok(m1), Ok(h1), Ok(m2), Ok(h2)) => {
                    let minutes = (h2 * 60 + m2 - (h1 * 60 + m1)).rem_euclid(24 * 60);
                    if minutes == 0 {
                        None
                    } else {
                        Some(minutes)
                    }
                }
                _ => None,
            }
        }
        _ => None,
    };
    let Some(minutes) = duration else {
        subject.not_carried(
            &at("end"),
            format!(
                "{end:?} cannot be told as a fixed time after {start:?}: a schedule is a cron and a duration (write the \
                 window by hand)"
            ),
        );
        return None;
    };
    let mut table = Table::default();
    table.comment(format!("{field}: cron trigger {start:?} to {end:?} in {timezone}, desiredReplicas {desired}"));
    table.set("name", Toml::text(field.strip_prefix("spec.").unwrap_or(field)));
    table.set("cron", Toml::text(start.clone()));
    table.set("duration", Toml::text(format!("{minutes}m")));
    table.set("time_zone", Toml::text(timezone.clone()));
    table.set_with("min_replicas", Toml::Integer(i64::from(desired)), "the floor while it is open");
    subject.chose(format!(
        "{field}: the cron trigger is a schedule whose floor is desiredReplicas, as KEDA's HPA takes the largest of its \
         metrics"
    ));
    Some(table)
}

/// KEDA's `fallback`: after `failureThreshold` failed polls, `replicas`.
fn fallback(
    node: &Node<'_>,
    polling: i64,
    metrics: usize,
    subject: &mut Subject,
    problems: &mut Vec<FieldProblem>,
) -> Option<Table> {
    let threshold = node.integer("failureThreshold", problems)?;
    let replicas = node.count("replicas", i64::from(i32::MAX), problems)?;
    let behavior = node.text("behavior", problems).unwrap_or("static");
    let mut table = Table::default();
    let after = threshold.saturating_mul(polling).max(1);
    table.comment(format!(
        "spec.fallback: after {threshold} failed polls ({threshold} x pollingInterval {polling}s) KEDA reports a \
         value that makes the HPA go to {replicas} replicas"
    ));
    table.set("after", Toml::text(format!("{after}s")));
    match behavior {
        "static" => {
            table.set("action", Toml::text("replicas"));
            table.set("replicas", Toml::Integer(i64::from(replicas)));
            table.set_with("scale_down", Toml::Flag(true), "KEDA goes to the count, down too");
        }
        "currentReplicasIfHigher" => {
            table.set("action", Toml::text("replicas"));
            table.set("replicas", Toml::Integer(i64::from(replicas)));
            table.set_with("scale_down", Toml::Flag(false), "behavior currentReplicasIfHigher");
        }
        "currentReplicas" => table.set_with("action", Toml::text("hold"), "behavior currentReplicas"),
        other => {
            subject.not_carried(
                &node.at("behavior"),
                format!("is {other:?}, which watermarkd's fallback has no action for"),
            );
            return None;
        }
    }
    table.set_with("recover_after", Toml::text(format!("{polling}s")), "KEDA leaves fallback at its first good poll");
    if metrics > 1 {
        subject.differs(
            "spec.fallback",
            "KEDA falls back for each failing trigger; watermarkd once every metric has had no usable value for `after`",
        );
    }
    Some(table)
}
