//! `watermarkd import`: the autoscalers people already run, as a rules file.
//!
//! Pure, in steps: manifests (YAML or JSON text, or objects listed from a cluster) become
//! [`Document`]s with their place (`file#document`); each is sorted by its kind; each autoscaler
//! (`HorizontalPodAutoscaler`, KEDA `ScaledObject`, `WatermarkPodAutoscaler`) is converted with
//! what the other objects say (the target's pods and requests, `TriggerAuthentication`s,
//! `DatadogMetric`s, prometheus-adapter's rules) into an [`out::Entry`] with comments naming
//! every choice, and the entries become the rules file's text. Whatever cannot be carried over
//! exactly is a [`Finding`] naming the place, object and field; the command decides what to
//! print and how to exit.

pub mod adapter;
mod behavior;
mod hpa;
mod keda;
pub mod manifest;
mod metric;
pub(crate) mod node;
pub mod out;
mod workload;
mod wpa;

use std::collections::BTreeMap;
use std::fmt;

pub use adapter::AdapterConfig;
pub use manifest::{read_documents, Document};

use node::{FieldProblem, Node};
use out::{BackendTable, Entry, RulesText, Value};

/// Where an object was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Document `document` (counted from 1) of `file` (`-`: standard input), and the item of a
    /// `List` when it was in one.
    File { file: String, document: usize, item: Option<usize> },
    /// Listed from the cluster.
    Cluster,
}

impl Place {
    pub fn file(file: &str, document: usize) -> Place {
        Place::File { file: file.to_string(), document, item: None }
    }

    fn item(&self, index: usize) -> Place {
        match self {
            Place::File { file, document, .. } => {
                Place::File { file: file.clone(), document: *document, item: Some(index) }
            }
            Place::Cluster => Place::Cluster,
        }
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::File { file, document, item: None } => write!(f, "{file}#{document}"),
            Place::File { file, document, item: Some(item) } => write!(f, "{file}#{document} items[{item}]"),
            Place::Cluster => f.write_str("the cluster"),
        }
    }
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The input is wrong (not YAML, an unknown kind, a missing field, a template the adapter
    /// itself rejects): nothing is written.
    Invalid,
    /// Valid, but not carried over exactly: the object is left out of the rules (written with
    /// `--partial`, the rest still is).
    NotCarried,
    /// Carried over with a difference the comment above the autoscaler names too.
    Note,
}

/// One thing the import has to say, naming where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub place: Place,
    /// `HorizontalPodAutoscaler shop/web`, when the finding is about one object.
    pub object: Option<String>,
    /// The field by its path in the object (`spec.metrics[1].external.metric.name`).
    pub field: String,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.place)?;
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What the import is told besides the objects.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Write the autoscalers without `observe = true` (they take over at once).
    pub active: bool,
    /// prometheus-adapter's configuration (`--adapter-config`).
    pub adapter: Option<AdapterConfig>,
    /// The Prometheus the adapter queries (`--prometheus-url`, the adapter's own flag).
    pub prometheus_url: Option<String>,
    /// External metrics that are neither `datadogmetric@` nor the adapter's are the Datadog
    /// Cluster Agent's (`--datadog-cluster-agent`).
    pub datadog_cluster_agent: bool,
    /// The Datadog site the Cluster Agent or the WPA controller queries.
    pub datadog_site: Option<String>,
    /// The namespace of objects read without one (`-n`; else `default`, as kubectl).
    pub default_namespace: Option<String>,
    /// Where the objects came from, for the header (`hpa.yaml`, `the cluster`).
    pub sources: Vec<String>,
}

/// The result: the rules file's text (when anything was carried over) and every finding.
#[derive(Clone, Debug, Default)]
pub struct Imported {
    pub text: String,
    pub findings: Vec<Finding>,
    /// How many autoscalers the text has.
    pub autoscalers: usize,
}

impl Imported {
    pub fn has(&self, severity: Severity) -> bool {
        self.findings.iter().any(|f| f.severity == severity)
    }
}

/// The kinds an import reads, and what it makes of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Hpa,
    ScaledObject,
    TriggerAuthentication {
        cluster: bool,
    },
    DatadogMetric,
    Wpa,
    /// A workload whose pods and requests an autoscaler may need.
    Workload,
    /// A Kubernetes object that is not an autoscaler (a Service, a ConfigMap): skipped.
    Other,
}

fn role(api_version: &str, kind: &str) -> Result<Role, String> {
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    let version = api_version.rsplit_once('/').map_or(api_version, |(_, version)| version);
    match (group, kind) {
        ("autoscaling", "HorizontalPodAutoscaler") => match version {
            "v2" | "v2beta2" => Ok(Role::Hpa),
            other => Err(format!(
                "is autoscaling/{other}, which import does not read: autoscaling/v2 and v2beta2 only (kubectl get hpa -o \
                 yaml gives v2 from any cluster of Kubernetes 1.23 or newer)"
            )),
        },
        ("keda.sh", "ScaledObject") => Ok(Role::ScaledObject),
        ("keda.sh", "TriggerAuthentication") => Ok(Role::TriggerAuthentication { cluster: false }),
        ("keda.sh", "ClusterTriggerAuthentication") => Ok(Role::TriggerAuthentication { cluster: true }),
        ("keda.sh", other) => Err(format!(
            "is a KEDA {other}, which import does not carry over (ScaledObject, TriggerAuthentication and \
             ClusterTriggerAuthentication are read)"
        )),
        ("datadoghq.com", "DatadogMetric") => Ok(Role::DatadogMetric),
        ("datadoghq.com", "WatermarkPodAutoscaler") => Ok(Role::Wpa),
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") => Ok(Role::Workload),
        // Kubernetes' own groups: what `helm template` and `kubectl get -o yaml` put beside an
        // autoscaler. None of them scales anything.
        ("" | "apps" | "batch" | "policy" | "networking.k8s.io" | "rbac.authorization.k8s.io" | "storage.k8s.io"
        | "scheduling.k8s.io" | "coordination.k8s.io" | "discovery.k8s.io" | "node.k8s.io"
        | "admissionregistration.k8s.io" | "apiextensions.k8s.io" | "apiregistration.k8s.io"
        | "certificates.k8s.io" | "events.k8s.io" | "flowcontrol.apiserver.k8s.io" | "monitoring.coreos.com", _) => {
            Ok(Role::Other)
        }
        _ => Err(format!(
            "{kind} ({api_version}) is a kind import does not know: it reads HorizontalPodAutoscaler \
             (autoscaling/v2, v2beta2), ScaledObject, TriggerAuthentication, ClusterTriggerAuthentication (keda.sh), \
             WatermarkPodAutoscaler and DatadogMetric (datadoghq.com), the workloads they scale, and skips \
             Kubernetes' own kinds"
        )),
    }
}

/// An object being converted: its place and name, and what it has to say so far.
pub(crate) struct Subject {
    pub place: Place,
    /// `HorizontalPodAutoscaler shop/web`.
    pub object: String,
    pub namespace: String,
    pub name: String,
    pub findings: Vec<Finding>,
    /// The comment lines above its `[[autoscaler]]`: every choice made.
    pub choices: Vec<String>,
}

impl Subject {
    fn finding(&mut self, severity: Severity, field: &str, message: impl Into<String>) {
        self.findings.push(Finding {
            severity,
            place: self.place.clone(),
            object: Some(self.object.clone()),
            field: field.to_string(),
            message: message.into(),
        });
    }

    /// The input is wrong.
    pub fn invalid(&mut self, field: &str, message: impl Into<String>) {
        self.finding(Severity::Invalid, field, message);
    }

    /// Cannot be carried over exactly.
    pub fn not_carried(&mut self, field: &str, message: impl Into<String>) {
        self.finding(Severity::NotCarried, field, message);
    }

    /// Carried over with a difference: said in the comment and on standard error.
    pub fn differs(&mut self, field: &str, message: impl Into<String>) {
        let message = message.into();
        self.choices.push(format!("differs: {field}: {message}"));
        self.finding(Severity::Note, field, message);
    }

    /// A choice made, said in the comment only.
    pub fn chose(&mut self, text: impl Into<String>) {
        self.choices.push(text.into());
    }

    pub fn field_problems(&mut self, problems: Vec<FieldProblem>) {
        for problem in problems {
            self.invalid(&problem.field, problem.message);
        }
    }

    pub fn has_invalid(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Invalid)
    }

    pub fn carried(&self) -> bool {
        !self.findings.iter().any(|f| matches!(f.severity, Severity::Invalid | Severity::NotCarried))
    }
}

/// What the other objects tell a conversion.
pub(crate) struct Context<'a> {
    pub options: &'a ImportOptions,
    pub workloads: BTreeMap<(String, String, String), workload::Workload>,
    pub trigger_auths: BTreeMap<(Option<String>, String), keda::TriggerAuth>,
    pub datadog_metrics: BTreeMap<(String, String), DatadogMetricInfo>,
}

/// What a `DatadogMetric` says: its query and how old its value may be.
#[derive(Clone, Debug)]
pub(crate) struct DatadogMetricInfo {
    pub query: String,
    pub max_age: Option<String>,
    pub place: Place,
}

/// One converted autoscaler.
pub(crate) struct Converted {
    pub entry: Entry,
    pub backends: Vec<BackendTable>,
    /// The target it scales, to find two on one target.
    pub target: (String, String, String, String),
}

/// Imports every document.
pub fn import(documents: &[Document], options: &ImportOptions) -> Imported {
    let mut findings = Vec::new();
    let namespace_default = options.default_namespace.clone().unwrap_or_else(|| "default".into());
    let mut roles = Vec::new();
    for document in documents {
        let root = Node::root(&document.value);
        let mut problems = Vec::new();
        let api_version = root.required_text("apiVersion", &mut problems);
        let kind = root.required_text("kind", &mut problems);
        let (Some(api_version), Some(kind)) = (api_version, kind) else {
            findings.extend(problems.into_iter().map(|p| Finding {
                severity: Severity::Invalid,
                place: document.place.clone(),
                object: None,
                field: p.field,
                message: p.message,
            }));
            continue;
        };
        match role(api_version, kind) {
            Ok(role) => roles.push((role, document)),
            Err(message) => findings.push(Finding {
                severity: Severity::Invalid,
                place: document.place.clone(),
                object: Some(object_name(kind, &document.value, &namespace_default)),
                field: "kind".into(),
                message,
            }),
        }
    }
    let mut context = Context {
        options,
        workloads: BTreeMap::new(),
        trigger_auths: BTreeMap::new(),
        datadog_metrics: BTreeMap::new(),
    };
    for (role, document) in &roles {
        let namespace = namespace_of(&document.value, &namespace_default);
        match role {
            Role::Workload => {
                if let Some(found) = workload::read(&document.value) {
                    context.workloads.insert((namespace, found.kind.clone(), found.name.clone()), found);
                }
            }
            Role::TriggerAuthentication { cluster } => match keda::read_trigger_auth(document, *cluster) {
                Ok((name, auth)) => {
                    let scope = if *cluster { None } else { Some(namespace) };
                    context.trigger_auths.insert((scope, name), auth);
                }
                Err(found) => findings.extend(found),
            },
            Role::DatadogMetric => {
                let root = Node::root(&document.value);
                let mut problems = Vec::new();
                let name = root
                    .get("metadata")
                    .and_then(|m| m.node().required_text("name", &mut problems).map(str::to_string));
                let spec = root.required("spec", &mut problems);
                let query =
                    spec.as_ref().and_then(|s| s.node().required_text("query", &mut problems).map(str::to_string));
                let max_age = spec.as_ref().and_then(|s| s.node().text("maxAge", &mut problems).map(str::to_string));
                if let (Some(name), Some(query)) = (name, query) {
                    context
                        .datadog_metrics
                        .insert((namespace, name), DatadogMetricInfo { query, max_age, place: document.place.clone() });
                }
                findings.extend(problems.into_iter().map(|p| Finding {
                    severity: Severity::Invalid,
                    place: document.place.clone(),
                    object: Some(object_name("DatadogMetric", &document.value, &namespace_default)),
                    field: p.field,
                    message: p.message,
                }));
            }
            Role::Hpa | Role::ScaledObject | Role::Wpa | Role::Other => {}
        }
    }

    let mut converted = Vec::new();
    for (role, document) in &roles {
        let kind = match role {
            Role::Hpa => "HorizontalPodAutoscaler",
            Role::ScaledObject => "ScaledObject",
            Role::Wpa => "WatermarkPodAutoscaler",
            _ => continue,
        };
        let namespace = namespace_of(&document.value, &namespace_default);
        let name = Node::root(&document.value)
            .get("metadata")
            .and_then(|m| m.value.get("name").and_then(serde_json::Value::as_str).map(str::to_string))
            .unwrap_or_default();
        let mut subject = Subject {
            place: document.place.clone(),
            object: format!("{kind} {namespace}/{name}"),
            namespace: namespace.clone(),
            name: name.clone(),
            findings: Vec::new(),
            choices: Vec::new(),
        };
        if name.is_empty() {
            subject.invalid("metadata.name", "is required");
        }
        if document.value.get("metadata").and_then(|m| m.get("namespace")).is_none() {
            subject.chose(format!(
                "metadata.namespace is not set: {namespace} assumed (the namespace kubectl apply would use{})",
                if options.default_namespace.is_some() { ", from -n" } else { " without -n" }
            ));
        }
        let result = match role {
            Role::Hpa => hpa::convert(&document.value, &mut subject, &context),
            Role::ScaledObject => keda::convert(&document.value, &mut subject, &context),
            _ => wpa::convert(&document.value, &mut subject, &context),
        };
        let carried = subject.carried();
        findings.append(&mut subject.findings);
        if let (Some(result), true) = (result, carried) {
            converted.push((subject.place.clone(), subject.object.clone(), result));
        }
    }
    let general_note = general_notes(&converted);
    let (text, count) = assemble(converted, options, &mut findings, &general_note);
    findings.sort_by_key(|f| f.severity);
    Imported { text, findings, autoscalers: count }
}

/// What differs for every imported HPA and ScaledObject alike: said once in the file's header.
fn general_notes(converted: &[(Place, String, Converted)]) -> Vec<String> {
    let hpa_like = converted.iter().filter(|(_, object, _)| !object.starts_with("WatermarkPodAutoscaler")).count();
    if hpa_like == 0 {
        return Vec::new();
    }
    vec![
        "How every imported HorizontalPodAutoscaler and ScaledObject differs from the HPA controller".into(),
        "(docs/import.md, docs/engine.md section 7):".into(),
        "- its target becomes low_watermark = high_watermark with the HPA's tolerance, and the same".into(),
        "  arithmetic upwards: ceil(ready x value / target). Downwards the engine takes".into(),
        "  floor(ready x value / target) where the HPA takes the ceiling: a scale-down may go one".into(),
        "  replica lower than the HPA's would.".into(),
        "- missing, stale or partial metric data holds (never scales down, never counts as 0), where".into(),
        "  the HPA assumes values for pods without metrics and KEDA reads an empty answer as 0.".into(),
        "- behavior's stabilization windows are kept as buckets of 1/60 of the window (docs/engine.md".into(),
        "  section 3b): a recommendation may count up to one bucket longer than in the HPA.".into(),
    ]
}

fn assemble(
    converted: Vec<(Place, String, Converted)>,
    options: &ImportOptions,
    findings: &mut Vec<Finding>,
    general: &[String],
) -> (String, usize) {
    let mut rules = RulesText::default();
    rules.header.push(format!(
        "Written by watermarkd import from {}.",
        if options.sources.is_empty() { "standard input".to_string() } else { options.sources.join(", ") }
    ));
    rules
        .header
        .push("Check it with `watermarkd check FILE` and `watermarkd query --rules FILE` before running it.".into());
    if !options.active {
        rules.header.push(String::new());
        rules
            .header
            .push("Every autoscaler is written with observe = true: it evaluates and writes nothing while".into());
        rules.header.push("the controller it came from still runs. See docs/import.md for the cut-over.".into());
    }
    if !general.is_empty() {
        rules.header.push(String::new());
        rules.header.extend(general.iter().cloned());
    }
    let mut claimed: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for (place, object, mut result) in converted {
        if let Some(first) = claimed.get(&result.target) {
            let (_, kind, namespace, name) = &result.target;
            findings.push(Finding {
                severity: Severity::NotCarried,
                place,
                object: Some(object.clone()),
                field: "target".into(),
                message: format!(
                    "{kind} {namespace}/{name} is already scaled by {first}: two active autoscalers on one target \
                     would fight over its replicas (delete one of the two)"
                ),
            });
            continue;
        }
        if let Err(problems) = check_alone(&result) {
            for problem in problems {
                findings.push(Finding {
                    severity: Severity::NotCarried,
                    place: place.clone(),
                    object: Some(object.clone()),
                    field: String::new(),
                    message: format!("the rules it makes are refused by the daemon: {problem}"),
                });
            }
            continue;
        }
        claimed.insert(result.target.clone(), object);
        // A name used twice (two kinds with one name in a namespace) gets a suffix.
        if let Some(Value::Text(name)) = result.entry.main.get("name").cloned() {
            let seen = names.entry(name.clone()).or_insert(0);
            *seen += 1;
            if *seen > 1 {
                let renamed = format!("{name}-{seen}");
                if let Some(line) = result.entry.main.lines.iter_mut().find(|l| l.key == "name") {
                    line.value = Value::Text(renamed);
                }
            }
        }
        for backend in result.backends {
            match rules.backends.iter().find(|b| b.name == backend.name) {
                Some(existing) if existing.table.lines == backend.table.lines => {}
                Some(_) => findings.push(Finding {
                    severity: Severity::NotCarried,
                    place: Place::Cluster,
                    object: None,
                    field: format!("backend {}", backend.name),
                    message: "two sources need a backend of this name with different settings".into(),
                }),
                None => rules.backends.push(backend),
            }
        }
        rules.entries.push(result.entry);
    }
    let count = rules.entries.len();
    (rules.render(), count)
}

/// Reads the rules one converted autoscaler makes, with its backends, as the daemon reads a
/// rules file (`check`, a load): what import writes is what the daemon accepts, or it is said
/// here.
fn check_alone(converted: &Converted) -> Result<(), Vec<String>> {
    let mut alone = RulesText::default();
    for backend in &converted.backends {
        if alone.backends.iter().all(|b| b.name != backend.name) {
            alone.backends.push(backend.clone());
        }
    }
    alone.entries.push(converted.entry.clone());
    match crate::domain::rules::parse_rules(&alone.render(), "import") {
        Ok(_) => Ok(()),
        Err(err) => Err(err
            .problems
            .iter()
            .map(|p| crate::domain::rules::Problem { line: None, ..p.clone() }.to_string())
            .collect()),
    }
}

/// `metadata.namespace`, or the default.
fn namespace_of(value: &serde_json::Value, default: &str) -> String {
    value
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(serde_json::Value::as_str)
        .filter(|ns| !ns.is_empty())
        .unwrap_or(default)
        .to_string()
}

/// `Kind namespace/name` of a document, for findings.
fn object_name(kind: &str, value: &serde_json::Value, default_namespace: &str) -> String {
    let name = value.get("metadata").and_then(|m| m.get("name")).and_then(serde_json::Value::as_str).unwrap_or("");
    format!("{kind} {}/{name}", namespace_of(value, default_namespace))
}

/// The lines every imported autoscaler starts with: its name, where it came from, its target
/// and whether it observes.
pub(crate) fn entry_head(subject: &Subject, target: &out::Value, context: &Context<'_>) -> Entry {
    let mut entry = Entry::default();
    entry.main.set("name", Value::text(format!("{}/{}", subject.namespace, subject.name)));
    entry.main.set("target", target.clone());
    if !context.options.active {
        entry.main.set_with(
            "observe",
            Value::Flag(true),
            "evaluates and writes nothing while the old controller still runs; remove this line, or set take_over = \
             true, to cut over (docs/import.md)",
        );
    }
    entry
}

/// The comment above an autoscaler: where it came from and every choice made.
pub(crate) fn finish_comments(entry: &mut Entry, subject: &Subject) {
    let mut comments = vec![format!("From {} ({}).", subject.object, subject.place)];
    for choice in &subject.choices {
        if !comments.contains(choice) {
            comments.push(choice.clone());
        }
    }
    comments.append(&mut entry.main.comments);
    entry.main.comments = comments;
}
