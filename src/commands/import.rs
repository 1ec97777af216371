//! `watermarkd import`: reads manifests (files, `-` for standard input) or a cluster's live
//! objects and writes the rules file they stand for to standard output; what cannot be
//! carried over exactly goes to standard error. The conversion is `domain::import`'s; this is
//! the reading and the listing.

use std::io::{Read, Write};
use std::path::PathBuf;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::Client;

use crate::adapters::workload::{connect, WorkloadError};
use crate::domain::import::{self, AdapterConfig, Document, Finding, ImportOptions, Place, Severity};

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// Manifests to read (YAML with several documents, or JSON; `List` objects are read item
    /// by item); `-` reads standard input. Without any, the cluster's objects are listed.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// prometheus-adapter's configuration (its --config file, or the ConfigMap holding it as
    /// config.yaml): the HPA metrics it serves become the queries it would run.
    #[arg(long, value_name = "FILE")]
    pub adapter_config: Option<PathBuf>,
    /// The Prometheus prometheus-adapter queries (its own --prometheus-url), for the backend of
    /// the metrics it serves.
    #[arg(long, value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// External metrics that are neither datadogmetric@ references nor prometheus-adapter's are
    /// served by the Datadog Cluster Agent (its metric{tags} form).
    #[arg(long)]
    pub datadog_cluster_agent: bool,
    /// The Datadog site the Cluster Agent or the WPA controller queries (default datadoghq.com).
    #[arg(long, value_name = "SITE")]
    pub datadog_site: Option<String>,
    /// List the objects of the cluster this kubeconfig reaches (default: KUBECONFIG, ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to list from (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace to list from; for files, the namespace of objects without one.
    #[arg(short = 'n', long, value_name = "NAMESPACE", conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// List from every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Write the autoscalers without `observe = true`: they scale as soon as the daemon runs them.
    #[arg(long)]
    pub active: bool,
    /// Write what can be carried over and exit 0, leaving out (and listing on standard error)
    /// the autoscalers that cannot.
    #[arg(long)]
    pub partial: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("give FILE arguments to read manifests, or -n NAMESPACE or -A to list a cluster's objects")]
    NothingToRead,
    #[error("connecting to the cluster: {0}")]
    Connect(#[from] WorkloadError),
    #[error("listing {what} from the cluster: {source}")]
    List { what: String, source: kube::Error },
    #[error(transparent)]
    Output(#[from] std::io::Error),
}

/// Runs the import: the rules on `out`, the findings on `err`. Returns whether it succeeded
/// (exit 0): no invalid input, and everything carried over unless `--partial`.
pub async fn run(args: &ImportArgs, out: &mut impl Write, err: &mut impl Write) -> Result<bool, ImportError> {
    let from_cluster =
        args.files.is_empty() || args.kubeconfig.is_some() || args.context.is_some() || args.all_namespaces;
    let mut documents = Vec::new();
    let mut findings = Vec::new();
    let mut sources = Vec::new();
    for path in &args.files {
        let (name, text) = if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| ImportError::Read { path: "standard input".into(), source })?;
            ("-".to_string(), text)
        } else {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ImportError::Read { path: path.display().to_string(), source })?;
            (path.display().to_string(), text)
        };
        match import::read_documents(&name, &text) {
            Ok(mut read) => documents.append(&mut read),
            Err(finding) => findings.push(*finding),
        }
        sources.push(name);
    }
    if from_cluster {
        if args.namespace.is_none() && !args.all_namespaces {
            return Err(ImportError::NothingToRead);
        }
        let client = connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
        documents.extend(list_cluster(&client, args.namespace.as_deref()).await?);
        sources.push(match &args.namespace {
            Some(ns) => format!("the cluster's namespace {ns}"),
            None => "every namespace of the cluster".into(),
        });
    }
    let adapter = match &args.adapter_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ImportError::Read { path: path.display().to_string(), source })?;
            match AdapterConfig::parse(&path.display().to_string(), &text) {
                Ok(config) => Some(config),
                Err(mut found) => {
                    findings.append(&mut found);
                    None
                }
            }
        }
        None => None,
    };
    let options = ImportOptions {
        active: args.active,
        adapter,
        prometheus_url: args.prometheus_url.clone(),
        datadog_cluster_agent: args.datadog_cluster_agent,
        datadog_site: args.datadog_site.clone(),
        default_namespace: args.namespace.clone(),
        sources,
    };
    let imported = if findings.iter().any(|f| f.severity == Severity::Invalid) {
        import::Imported::default()
    } else {
        import::import(&documents, &options)
    };
    findings.extend(imported.findings.iter().cloned());
    report(&findings, err)?;
    let invalid = findings.iter().any(|f| f.severity == Severity::Invalid);
    let left_out = findings.iter().filter(|f| f.severity == Severity::NotCarried).count();
    if invalid {
        writeln!(err, "watermarkd import: nothing written: the input above has errors")?;
        return Ok(false);
    }
    if left_out > 0 && !args.partial {
        writeln!(
            err,
            "watermarkd import: nothing written: {left_out} thing(s) above cannot be carried over exactly; --partial \
             writes the autoscalers that can"
        )?;
        return Ok(false);
    }
    out.write_all(imported.text.as_bytes())?;
    writeln!(err, "watermarkd import: {} autoscaler(s) written", imported.autoscalers)?;
    Ok(true)
}

fn report(findings: &[Finding], err: &mut impl Write) -> std::io::Result<()> {
    for finding in findings {
        let word = match finding.severity {
            Severity::Invalid => "error",
            Severity::NotCarried => "not carried over",
            Severity::Note => "note",
        };
        writeln!(err, "{word}: {finding}")?;
    }
    Ok(())
}

/// What is listed from a cluster: (group, versions to try in order, kind, plural, namespaced).
const LISTED: &[(&str, &[&str], &str, &str, bool)] = &[
    ("autoscaling", &["v2", "v2beta2"], "HorizontalPodAutoscaler", "horizontalpodautoscalers", true),
    ("keda.sh", &["v1alpha1"], "ScaledObject", "scaledobjects", true),
    ("keda.sh", &["v1alpha1"], "TriggerAuthentication", "triggerauthentications", true),
    ("keda.sh", &["v1alpha1"], "ClusterTriggerAuthentication", "clustertriggerauthentications", false),
    ("datadoghq.com", &["v1alpha1"], "WatermarkPodAutoscaler", "watermarkpodautoscalers", true),
    ("datadoghq.com", &["v1alpha1"], "DatadogMetric", "datadogmetrics", true),
    ("apps", &["v1"], "Deployment", "deployments", true),
    ("apps", &["v1"], "StatefulSet", "statefulsets", true),
];

/// Lists the objects an import reads. A kind the cluster does not serve (no KEDA, no Datadog
/// CRDs, an API server without autoscaling/v2) is skipped.
async fn list_cluster(client: &Client, namespace: Option<&str>) -> Result<Vec<Document>, ImportError> {
    let mut documents = Vec::new();
    for (group, versions, kind, plural, namespaced) in LISTED {
        for version in *versions {
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
            let api: Api<DynamicObject> = match (namespaced, namespace) {
                (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
                _ => Api::all_with(client.clone(), &resource),
            };
            let list = match api.list(&ListParams::default()).await {
                Ok(list) => list,
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(source) => return Err(ImportError::List { what: format!("{plural}.{group}"), source }),
            };
            for object in list.items {
                let Ok(mut value) = serde_json::to_value(&object) else { continue };
                if let Some(map) = value.as_object_mut() {
                    map.insert("apiVersion".into(), resource.api_version.clone().into());
                    map.insert("kind".into(), (*kind).into());
                }
                documents.push(Document { place: Place::Cluster, value });
            }
            break;
        }
    }
    Ok(documents)
}
