//! The packaging around the daemon: the Kubernetes manifests in deploy/, the systemd unit and
//! its sysusers/tmpfiles snippets in systemd/, the sample configuration in
//! packaging/etc/watermarkd/ and the installation guide. (The container image and the Debian
//! package are built and checked by tests/image.rs and tests/deb.rs.)
//!
//! Every manifest parses as its Kubernetes type with no unknown field, the RBAC rules are
//! exactly `watermarkd::commands::rbac::PERMISSIONS` (and so is the table in README.md), every
//! sample rules file passes `watermarkd check`, the settings use only keys the daemon knows,
//! and the unit passes `systemd-analyze verify` (Debian's `systemd` package; the test fails
//! when it is missing rather than skip the check). A real kube-apiserver (started by the test,
//! see tests/support/kube_cluster.rs) accepts every manifest, and then lets the ServiceAccount
//! do each thing in the table and nothing else that was tried.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/kube_cluster.rs"]
mod kube_cluster;
#[path = "support/manifest_checks.rs"]
mod manifest_checks;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, EnvVarSource, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use manifest_checks::{assert_same_grants, grants_of_rules, grants_of_table, kind_of, sorted_unique, typed};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use watermarkd::commands::rbac::{Permission, PERMISSIONS, STATUS_TOKEN_REVIEW};
use watermarkd::runtime::settings::{Environment, RunArgs, Settings};

const NAMESPACE: &str = "watermarkd";
const SERVICE_ACCOUNT: &str = "watermarkd";
const CONFIG_DIR: &str = "/etc/watermarkd";
const SETTINGS_PATH: &str = "/etc/watermarkd/watermarkd.toml";
const RULES_PATH: &str = "/etc/watermarkd/rules.toml";
const SYSTEM_USER: &str = "watermarkd";

/// The manifests deploy/kustomization.yaml must list: exactly the deploy/*.yaml files.
const MANIFESTS: [&str; 8] = [
    "namespace.yaml",
    "crd.yaml",
    "serviceaccount.yaml",
    "rbac.yaml",
    "configmap.yaml",
    "deployment.yaml",
    "service.yaml",
    "poddisruptionbudget.yaml",
];

/// The top-level keys of the settings file (`watermarkd run --settings`); it rejects others.
const SETTINGS_KEYS: [&str; 20] = [
    "rules",
    "labels_as_tags",
    "crd",
    "namespaces",
    "listen",
    "listen_max_connections",
    "listen_max_connections_per_peer",
    "listen_header_timeout",
    "listen_connection_timeout",
    "log_format",
    "log_level",
    "kubeconfig",
    "context",
    "default_interval",
    "dry_run",
    "max_concurrency",
    "reload_poll",
    "default_backend",
    "lease",
    "status",
];
/// The keys of its `[status]` table (`token_file` and `token_env` exclude each other).
const STATUS_KEYS: [&str; 8] = [
    "enabled",
    "history",
    "token_file",
    "token_env",
    "token_review",
    "token_audiences",
    "open_on_loopback",
    "allowed_hosts",
];
/// The keys of its `[lease]` table.
const LEASE_KEYS: [&str; 7] =
    ["enabled", "name", "namespace", "identity", "duration", "renew_deadline", "retry_period"];

// ---------------------------------------------------------------------------------------------
// Helpers

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every non-empty document of a (multi-document) YAML file.
fn documents(relative: &str) -> Vec<serde_yaml_ng::Value> {
    let text = read(relative);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap_or_else(|e| panic!("{relative}: {e}")))
        .filter(|value| !value.is_null())
        .collect()
}

/// The single object of `kind` in a manifest.
fn only<T: DeserializeOwned + Serialize>(file: &str, kind: &str) -> T {
    let docs: Vec<_> = documents(file).into_iter().filter(|d| kind_of(d) == kind).collect();
    assert_eq!(docs.len(), 1, "{file}: expected exactly one {kind}");
    typed(file, &docs[0])
}

fn all<T: DeserializeOwned + Serialize>(file: &str, kind: &str) -> Vec<T> {
    documents(file).iter().filter(|d| kind_of(d) == kind).map(|d| typed(file, d)).collect()
}

/// The unit's ExecStartPre check, spelled `--config`: the older name of `--rules`, which scripts
/// written before the rename still use.
fn assert_check_passes(path: &Path, what: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["check", "--config"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("run watermarkd check: {e}"));
    assert!(
        output.status.success(),
        "{what} does not pass `watermarkd check --config`:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn configmap() -> ConfigMap {
    only("deploy/configmap.yaml", "ConfigMap")
}

fn configmap_key(key: &str) -> String {
    let data = configmap().data.unwrap_or_default();
    data.get(key).cloned().unwrap_or_else(|| panic!("deploy/configmap.yaml has no key {key}"))
}

fn deployment() -> Deployment {
    only("deploy/deployment.yaml", "Deployment")
}

fn container(deployment: &Deployment) -> Container {
    let spec = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("a pod spec");
    assert_eq!(spec.containers.len(), 1, "one container");
    spec.containers[0].clone()
}

fn pod_labels(deployment: &Deployment) -> BTreeMap<String, String> {
    let spec = deployment.spec.as_ref().expect("spec");
    spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).expect("pod labels")
}

fn parse_toml(text: &str, what: &str) -> toml::Table {
    toml::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Names of the environment variables the backends of a rules file read secrets from.
fn secret_env_names(rules: &toml::Table) -> BTreeSet<String> {
    let backends = rules.get("backend").and_then(|b| b.as_table()).cloned().unwrap_or_default();
    backends
        .values()
        .filter_map(|b| b.as_table())
        .flat_map(|b| b.iter().filter(|(k, _)| k.ends_with("_env")).filter_map(|(_, v)| v.as_str().map(String::from)))
        .collect()
}

/// Checks a settings file against what the daemon accepts: only known keys, each of its type.
fn check_settings(text: &str, what: &str) -> toml::Table {
    let settings = parse_toml(text, what);
    let duration = |key: &str, value: &toml::Value| {
        let text = value.as_str().unwrap_or_else(|| panic!("{what}: {key} must be a string like \"15s\""));
        humantime::parse_duration(text).unwrap_or_else(|e| panic!("{what}: {key} = {text:?}: {e}"));
    };
    for (key, value) in &settings {
        assert!(SETTINGS_KEYS.contains(&key.as_str()), "{what}: unknown settings key {key}");
        match key.as_str() {
            "rules" | "kubeconfig" | "context" | "log_level" | "default_backend" => {
                assert!(value.as_str().is_some_and(|s| !s.is_empty()), "{what}: {key} must be a non-empty string")
            }
            "crd" | "dry_run" => assert!(value.is_bool(), "{what}: {key} must be true or false"),
            "namespaces" | "labels_as_tags" => assert!(
                value.as_array().is_some_and(|a| a.iter().all(|n| n.is_str())),
                "{what}: {key} must be a list of strings"
            ),
            "listen" => {
                let text = value.as_str().unwrap_or_default();
                assert!(text.parse::<std::net::SocketAddr>().is_ok(), "{what}: listen = {text:?} is not an address")
            }
            "log_format" => assert!(
                matches!(value.as_str(), Some("text" | "json")),
                "{what}: log_format must be \"text\" or \"json\""
            ),
            "max_concurrency" | "listen_max_connections" | "listen_max_connections_per_peer" => {
                assert!(value.as_integer().is_some_and(|n| n >= 1), "{what}: {key} must be at least 1")
            }
            "default_interval" | "reload_poll" | "listen_header_timeout" | "listen_connection_timeout" => {
                duration(key, value)
            }
            "lease" => {
                let lease = value.as_table().unwrap_or_else(|| panic!("{what}: lease must be a table"));
                for (key, value) in lease {
                    assert!(LEASE_KEYS.contains(&key.as_str()), "{what}: unknown key lease.{key}");
                    match key.as_str() {
                        "enabled" => assert!(value.is_bool(), "{what}: lease.enabled must be true or false"),
                        "duration" | "renew_deadline" | "retry_period" => duration(&format!("lease.{key}"), value),
                        _ => assert!(value.as_str().is_some_and(|s| !s.is_empty()), "{what}: lease.{key}"),
                    }
                }
            }
            "status" => {
                let status = value.as_table().unwrap_or_else(|| panic!("{what}: status must be a table"));
                for (key, value) in status {
                    assert!(STATUS_KEYS.contains(&key.as_str()), "{what}: unknown key status.{key}");
                    match key.as_str() {
                        "enabled" | "token_review" | "open_on_loopback" => {
                            assert!(value.is_bool(), "{what}: status.{key} must be true or false")
                        }
                        "history" => duration("status.history", value),
                        "token_audiences" | "allowed_hosts" => assert!(
                            value
                                .as_array()
                                .is_some_and(|a| a.iter().all(|n| n.as_str().is_some_and(|s| !s.is_empty()))),
                            "{what}: status.{key} must be a list of non-empty strings"
                        ),
                        _ => assert!(value.as_str().is_some_and(|s| !s.is_empty()), "{what}: status.{key}"),
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(
        settings.get("rules").and_then(|r| r.as_str()),
        Some(RULES_PATH),
        "{what}: `rules` must name the rules file the packaging installs"
    );
    settings
}

/// The default backend named by the settings (the daemon's default is "datadog") must be a
/// backend of the rules: CRD mode sends WPA metrics there.
fn assert_default_backend_exists(settings: &toml::Table, rules: &toml::Table, what: &str) {
    let name = settings.get("default_backend").and_then(|b| b.as_str()).unwrap_or("datadog");
    let backends = rules.get("backend").and_then(|b| b.as_table()).cloned().unwrap_or_default();
    let crd = settings.get("crd").and_then(|c| c.as_bool()).unwrap_or(false);
    assert!(!crd || backends.contains_key(name), "{what}: crd = true but the rules have no [backend.{name}]");
}

// ---------------------------------------------------------------------------------------------
// Kubernetes manifests

fn manifest_files() -> BTreeSet<String> {
    std::fs::read_dir(repo().join("deploy"))
        .expect("deploy/")
        .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect()
}

#[test]
fn every_manifest_parses_as_its_kubernetes_type_in_the_daemon_namespace() {
    let files = manifest_files();
    assert_eq!(files, MANIFESTS.iter().map(|f| f.to_string()).collect(), "deploy/*.yaml");
    let mut kinds = BTreeSet::new();
    for file in &files {
        let relative = format!("deploy/{file}");
        let docs = documents(&relative);
        assert!(!docs.is_empty(), "{relative} is empty");
        for doc in &docs {
            let kind = kind_of(doc);
            let namespace = match kind.as_str() {
                "Namespace" => typed::<Namespace>(&relative, doc).metadata.namespace,
                "CustomResourceDefinition" => {
                    // Generated by `watermarkd crd` (tests/crd.rs compares it); only parsed here.
                    let crd: CustomResourceDefinition =
                        serde_yaml_ng::from_value(doc.clone()).unwrap_or_else(|e| panic!("{relative}: {e}"));
                    crd.metadata.namespace
                }
                "ClusterRole" => typed::<ClusterRole>(&relative, doc).metadata.namespace,
                "ClusterRoleBinding" => typed::<ClusterRoleBinding>(&relative, doc).metadata.namespace,
                "ServiceAccount" => {
                    Some(typed::<ServiceAccount>(&relative, doc).metadata.namespace.unwrap_or_default())
                }
                "ConfigMap" => Some(typed::<ConfigMap>(&relative, doc).metadata.namespace.unwrap_or_default()),
                "Service" => Some(typed::<Service>(&relative, doc).metadata.namespace.unwrap_or_default()),
                "Deployment" => Some(typed::<Deployment>(&relative, doc).metadata.namespace.unwrap_or_default()),
                "Role" => Some(typed::<Role>(&relative, doc).metadata.namespace.unwrap_or_default()),
                "PodDisruptionBudget" => {
                    Some(typed::<PodDisruptionBudget>(&relative, doc).metadata.namespace.unwrap_or_default())
                }
                "RoleBinding" => Some(typed::<RoleBinding>(&relative, doc).metadata.namespace.unwrap_or_default()),
                other => panic!("{relative}: unexpected kind {other:?}"),
            };
            let cluster_scoped = matches!(
                kind.as_str(),
                "Namespace" | "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding"
            );
            if cluster_scoped {
                assert_eq!(namespace, None, "{relative}: a {kind} has no namespace");
            } else {
                assert_eq!(namespace.as_deref(), Some(NAMESPACE), "{relative}: the {kind} belongs in {NAMESPACE}");
            }
            kinds.insert(kind);
        }
    }
    let namespace: Namespace = only("deploy/namespace.yaml", "Namespace");
    assert_eq!(namespace.metadata.name.as_deref(), Some(NAMESPACE));
    for kind in ["Namespace", "CustomResourceDefinition", "ServiceAccount", "ConfigMap", "Deployment", "Service"] {
        assert!(kinds.contains(kind), "no {kind} in deploy/");
    }
}

#[test]
fn the_kustomization_lists_exactly_the_manifests() {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Kustomization {
        api_version: String,
        kind: String,
        resources: Vec<String>,
    }
    let kustomization: Kustomization =
        serde_yaml_ng::from_str(&read("deploy/kustomization.yaml")).expect("deploy/kustomization.yaml");
    assert_eq!(kustomization.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(kustomization.kind, "Kustomization");
    let listed: BTreeSet<String> = kustomization.resources.iter().cloned().collect();
    assert_eq!(listed.len(), kustomization.resources.len(), "a manifest is listed twice");
    assert_eq!(listed, manifest_files(), "deploy/kustomization.yaml resources vs deploy/*.yaml");
    assert_eq!(kustomization.resources.first().map(String::as_str), Some("namespace.yaml"));
}

#[test]
fn rbac_grants_exactly_the_permissions_in_src_rbac() {
    let file = "deploy/rbac.yaml";
    let mut granted = Vec::new();
    for role in all::<ClusterRole>(file, "ClusterRole") {
        assert!(role.aggregation_rule.is_none(), "{file}: no aggregation");
        granted.extend(grants_of_rules(&role.rules.unwrap_or_default(), false, file));
    }
    for role in all::<Role>(file, "Role") {
        assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE), "{file}: a Role outside {NAMESPACE}");
        granted.extend(grants_of_rules(&role.rules.unwrap_or_default(), true, file));
    }
    let granted = sorted_unique(granted, file);
    // deploy/ is the chart with its defaults, CRD mode on: every entry of the table.
    let table = sorted_unique(grants_of_table(PERMISSIONS), "watermarkd::commands::rbac::PERMISSIONS");
    assert_same_grants(&granted, &table, file);
}

#[test]
fn the_permission_table_is_consistent() {
    for p in PERMISSIONS {
        assert!(!p.resources.is_empty() && !p.verbs.is_empty(), "{p:?}");
        for verb in p.verbs {
            assert!(
                ["get", "list", "watch", "create", "update", "patch", "delete"].contains(verb),
                "{p:?}: unexpected verb {verb}"
            );
        }
    }
    // Every scale subresource comes with the verbs on its resource that reading a target needs,
    // which is also what README.md asks for custom kinds.
    let grants = grants_of_table(PERMISSIONS);
    for (namespaced, group, resource, _) in grants.iter().filter(|g| g.2.ends_with("/scale")) {
        let base = resource.trim_end_matches("/scale");
        for verb in ["list", "watch"] {
            let wanted = (*namespaced, group.clone(), base.to_string(), verb.to_string());
            assert!(grants.contains(&wanted), "{resource} without {verb} on {base}");
        }
    }
    // The workloads are never written but through /scale: no verb that changes an object on
    // a resource that is not a subresource, cluster-wide.
    for (namespaced, group, resource, verb) in &grants {
        let writes = ["create", "update", "patch", "delete"].contains(&verb.as_str());
        assert!(
            !writes || *namespaced || resource.contains('/') || group == "events.k8s.io",
            "{verb} {group}/{resource} cluster-wide: write access beyond /scale, status and events"
        );
    }
    // Confined to the daemon's namespace: the Lease and the state ConfigMaps.
    let namespaced: Vec<_> = PERMISSIONS.iter().filter(|p| p.namespaced_to_daemon).flat_map(|p| p.resources).collect();
    assert_eq!(namespaced, [&"leases", &"configmaps"]);
    // CRD mode alone writes the datadoghq.com kinds and reads the DatadogMetrics, and needs
    // nothing else of its own: the chart drops exactly these entries with crd.enabled false.
    // The WPAs themselves are read in every mode (the guard's claimants).
    for p in PERMISSIONS {
        let guard_reads = p.resources == ["watermarkpodautoscalers"] && p.verbs == ["list", "watch"];
        assert_eq!(p.crd_mode_only, p.api_group == "datadoghq.com" && !guard_reads, "{p:?}: crd_mode_only");
        assert!(!(p.crd_mode_only && p.namespaced_to_daemon), "{p:?}: CRD mode is cluster-wide");
    }
}

fn assert_binds_the_service_account(subjects: &Option<Vec<Subject>>, what: &str) {
    let subjects = subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{what}: one subject");
    let subject = &subjects[0];
    assert_eq!(subject.kind, "ServiceAccount", "{what}");
    assert_eq!(subject.name, SERVICE_ACCOUNT, "{what}");
    assert_eq!(subject.namespace.as_deref(), Some(NAMESPACE), "{what}");
}

#[test]
fn the_bindings_give_the_roles_to_the_service_account() {
    let file = "deploy/rbac.yaml";
    let account: ServiceAccount = only("deploy/serviceaccount.yaml", "ServiceAccount");
    assert_eq!(account.metadata.name.as_deref(), Some(SERVICE_ACCOUNT));
    assert_eq!(account.metadata.namespace.as_deref(), Some(NAMESPACE));

    let cluster_roles: BTreeSet<String> =
        all::<ClusterRole>(file, "ClusterRole").into_iter().filter_map(|r| r.metadata.name).collect();
    let roles: BTreeSet<(String, String)> = all::<Role>(file, "Role")
        .into_iter()
        .map(|r| (r.metadata.namespace.unwrap_or_default(), r.metadata.name.unwrap_or_default()))
        .collect();
    let cluster_bindings = all::<ClusterRoleBinding>(file, "ClusterRoleBinding");
    let bindings = all::<RoleBinding>(file, "RoleBinding");
    assert!(!cluster_roles.is_empty() && !roles.is_empty(), "{file}: a ClusterRole and a Role");

    let mut bound_cluster_roles = BTreeSet::new();
    for binding in &cluster_bindings {
        let what = format!("{file}: ClusterRoleBinding {:?}", binding.metadata.name);
        assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io", "{what}");
        assert_eq!(binding.role_ref.kind, "ClusterRole", "{what}");
        assert!(cluster_roles.contains(&binding.role_ref.name), "{what}: no ClusterRole {}", binding.role_ref.name);
        assert_binds_the_service_account(&binding.subjects, &what);
        bound_cluster_roles.insert(binding.role_ref.name.clone());
    }
    let mut bound_roles = BTreeSet::new();
    for binding in &bindings {
        let what = format!("{file}: RoleBinding {:?}", binding.metadata.name);
        let namespace = binding.metadata.namespace.clone().unwrap_or_default();
        assert_eq!(binding.role_ref.api_group, "rbac.authorization.k8s.io", "{what}");
        // A RoleBinding to a ClusterRole would grant its rules in that namespace; not used here.
        assert_eq!(binding.role_ref.kind, "Role", "{what}");
        let role = (namespace, binding.role_ref.name.clone());
        assert!(roles.contains(&role), "{what}: no Role {role:?}");
        assert_binds_the_service_account(&binding.subjects, &what);
        bound_roles.insert(role);
    }
    assert_eq!(bound_cluster_roles, cluster_roles, "{file}: every ClusterRole is bound");
    assert_eq!(bound_roles, roles, "{file}: every Role is bound");

    let pod = deployment().spec.and_then(|s| s.template.spec).expect("a pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
}

/// The scope cell of README.md's permission table for the entries of `[status] token_review`.
const TOKEN_REVIEW_SCOPE: &str = "cluster, with `[status] token_review`";

/// The table row of README.md for one permission.
fn install_guide_row(p: &Permission) -> String {
    install_guide_row_in(p, if p.namespaced_to_daemon { format!("namespace `{NAMESPACE}`") } else { "cluster".into() })
}

fn install_guide_row_in(p: &Permission, scope: String) -> String {
    let group = if p.api_group.is_empty() { "core (`\"\"`)".to_string() } else { format!("`{}`", p.api_group) };
    let resources: Vec<String> = p.resources.iter().map(|r| format!("`{r}`")).collect();
    format!("| {scope} | {group} | {} | {} |", resources.join(", "), p.verbs.join(", "))
}

#[test]
fn the_install_guide_lists_the_permissions() {
    let guide = read("README.md");
    let expected: Vec<String> = PERMISSIONS.iter().map(install_guide_row).collect();
    for row in &expected {
        assert!(guide.lines().any(|line| line.trim() == row), "README.md lacks the permission row\n{row}");
    }
    let rows: Vec<&str> = guide
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("| cluster |") || line.starts_with(&format!("| namespace `{NAMESPACE}` |")))
        .collect();
    assert_eq!(rows, expected, "README.md: the permission table, in the order of PERMISSIONS");
    // Then the reviews of `[status] token_review`, which deploy/rbac.yaml does not grant.
    let expected: Vec<String> =
        STATUS_TOKEN_REVIEW.iter().map(|p| install_guide_row_in(p, TOKEN_REVIEW_SCOPE.into())).collect();
    let rows: Vec<&str> =
        guide.lines().map(str::trim).filter(|line| line.starts_with(&format!("| {TOKEN_REVIEW_SCOPE} |"))).collect();
    assert_eq!(rows, expected, "README.md: the rows of [status] token_review, in the order of STATUS_TOKEN_REVIEW");
}

/// The plural resource name and scope of each kind the manifests hold.
fn plural_of(kind: &str) -> (&'static str, bool) {
    match kind {
        "Namespace" => ("namespaces", false),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "ConfigMap" => ("configmaps", true),
        "Deployment" => ("deployments", true),
        "Service" => ("services", true),
        "PodDisruptionBudget" => ("poddisruptionbudgets", true),
        other => panic!("no plural known for {other}"),
    }
}

#[tokio::test]
async fn a_real_api_server_accepts_the_manifests_and_the_service_account_gets_exactly_the_table() {
    let cluster = kube_cluster::KubeCluster::shared();
    let client = cluster.client();
    // In the kustomization's order, as `kubectl apply -k` would (namespace first).
    for file in MANIFESTS {
        let relative = format!("deploy/{file}");
        for doc in documents(&relative) {
            let kind = kind_of(&doc);
            if kind == "CustomResourceDefinition" {
                let crd: CustomResourceDefinition =
                    serde_yaml_ng::from_value(doc).unwrap_or_else(|e| panic!("{relative}: {e}"));
                cluster.create_crd(&crd).await;
                continue;
            }
            let mut object: DynamicObject =
                serde_yaml_ng::from_value(doc).unwrap_or_else(|e| panic!("{relative}: {e}"));
            if kind == "PodDisruptionBudget" {
                // The test API server (1.20) predates policy/v1, whose PodDisruptionBudget has
                // the same fields as this one; the chart's switch is tested in tests/chart.rs.
                if let Some(types) = object.types.as_mut() {
                    types.api_version = "policy/v1beta1".into();
                }
            }
            let api_version = object.types.as_ref().map(|t| t.api_version.clone()).unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
            let (plural, namespaced) = plural_of(&kind);
            let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, &kind), plural);
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(
                    client.clone(),
                    object.metadata.namespace.as_deref().unwrap_or_default(),
                    &resource,
                )
            } else {
                Api::all_with(client.clone(), &resource)
            };
            api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| {
                panic!("{relative}: the API server rejects {kind} {:?}: {e}", object.metadata.name)
            });
        }
    }

    let account = cluster.client_as(&format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"));
    let table = sorted_unique(grants_of_table(PERMISSIONS), "watermarkd::commands::rbac::PERMISSIONS");
    // Cluster-wide grants hold in any namespace and across all of them (CRD mode watches every
    // namespace); the Lease only in the daemon's own.
    let wrong = manifest_checks::access_problems(&account, &table, NAMESPACE, &["prod"], "default", &[]).await;
    assert!(wrong.is_empty(), "deploy/rbac.yaml on a real API server:\n{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Deployment, Service, ConfigMap

#[test]
fn the_deployment_runs_two_replicas_of_the_image_with_the_settings() {
    let deployment = deployment();
    assert_eq!(deployment.metadata.name.as_deref(), Some("watermarkd"));
    let spec = deployment.spec.clone().expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let labels = pod_labels(&deployment);
    let selector = spec.selector.match_labels.clone().expect("selector.matchLabels");
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "the selector matches the pod labels");
    let pod = spec.template.spec.clone().expect("pod spec");
    assert_eq!(pod.termination_grace_period_seconds, Some(30));

    let c = container(&deployment);
    // The chart's default tag is its appVersion, the crate's version (tests/chart.rs).
    assert_eq!(c.image, Some(format!("watermarkd:{}", env!("CARGO_PKG_VERSION"))));
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(c.command, None, "the image's entrypoint runs");
    assert_eq!(c.args.clone().unwrap_or_default(), ["run", "--settings", SETTINGS_PATH]);

    // The settings file and the rules file it names both come from the ConfigMap.
    let mount = c
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.mount_path == CONFIG_DIR)
        .expect("a volume mounted at /etc/watermarkd");
    assert_eq!(mount.read_only, Some(true));
    assert_eq!(mount.sub_path, None, "a subPath mount would never see ConfigMap updates");
    let volume = pod.volumes.clone().unwrap_or_default().into_iter().find(|v| v.name == mount.name).expect("volume");
    let source = volume.config_map.expect("a ConfigMap volume");
    assert_eq!(source.name, "watermarkd");
    assert_eq!(configmap().metadata.name.as_deref(), Some("watermarkd"));
    assert!(source.items.is_none(), "every key of the ConfigMap is mounted");
    configmap_key("watermarkd.toml");
    configmap_key("rules.toml");

    // Lease identity and namespace from the downward API; Datadog keys from an optional Secret.
    let env: BTreeMap<String, EnvVar> =
        c.env.clone().unwrap_or_default().into_iter().map(|e| (e.name.clone(), e)).collect();
    let source = |name: &str| -> EnvVarSource {
        let var = env.get(name).unwrap_or_else(|| panic!("no env {name}"));
        assert_eq!(var.value, None, "env {name} has no literal value");
        var.value_from.clone().unwrap_or_else(|| panic!("env {name}: valueFrom"))
    };
    for (name, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        assert_eq!(source(name).field_ref.map(|f| f.field_path).as_deref(), Some(field), "env {name}");
    }
    let rules = parse_toml(&configmap_key("rules.toml"), "deploy/configmap.yaml rules.toml");
    let secret_names = secret_env_names(&rules);
    assert!(secret_names.contains("DD_API_KEY") && secret_names.contains("DD_APP_KEY"), "{secret_names:?}");
    for name in &secret_names {
        let secret = source(name).secret_key_ref.unwrap_or_else(|| panic!("env {name} from a Secret"));
        assert_eq!(secret.name, "watermarkd-datadog", "env {name}");
        assert_eq!(secret.optional, Some(true), "env {name}: the Secret is created by hand");
    }

    let resources = c.resources.clone().expect("resources");
    let quantity = |map: &Option<BTreeMap<String, Quantity>>, key: &str| map.as_ref()?.get(key).map(|q| q.0.clone());
    assert_eq!(quantity(&resources.requests, "cpu").as_deref(), Some("50m"));
    assert_eq!(quantity(&resources.requests, "memory").as_deref(), Some("64Mi"));
    assert_eq!(quantity(&resources.limits, "memory").as_deref(), Some("256Mi"));
}

#[test]
fn the_probes_hit_healthz_and_readyz_on_the_named_port() {
    let c = container(&deployment());
    let ports = c.ports.clone().unwrap_or_default();
    let http = ports.iter().find(|p| p.name.as_deref() == Some("http")).expect("a port named http");
    assert_eq!(http.container_port, 8080);
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
        let get = probe.as_ref().and_then(|p| p.http_get.clone()).unwrap_or_else(|| panic!("{path} probe"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("http".into()), "{path} on the named port");
    }
    assert!(c.startup_probe.is_none());
}

#[test]
fn the_pod_runs_unprivileged() {
    let deployment = deployment();
    let c = container(&deployment);
    let sc = c.security_context.clone().expect("container securityContext");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(65532));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, None);
    let capabilities = sc.capabilities.clone().expect("capabilities");
    assert_eq!(capabilities.drop.unwrap_or_default(), ["ALL"]);
    assert_eq!(capabilities.add, None);
    assert_eq!(sc.seccomp_profile.map(|p| p.type_).as_deref(), Some("RuntimeDefault"));

    let pod = deployment.spec.clone().and_then(|s| s.template.spec).expect("pod spec");
    let psc = pod.security_context.clone().expect("pod securityContext");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.run_as_user, Some(65532));
    assert_eq!(psc.seccomp_profile.map(|p| p.type_).as_deref(), Some("RuntimeDefault"));
    assert_ne!(pod.host_network, Some(true));

    // Spread over nodes when possible.
    let preferred = pod
        .affinity
        .and_then(|a| a.pod_anti_affinity)
        .and_then(|a| a.preferred_during_scheduling_ignored_during_execution)
        .unwrap_or_default();
    let labels = pod_labels(&deployment);
    assert!(
        preferred.iter().any(|term| {
            let selector = term.pod_affinity_term.label_selector.clone().and_then(|s| s.match_labels);
            term.pod_affinity_term.topology_key == "kubernetes.io/hostname"
                && selector.is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
        }),
        "a preferred podAntiAffinity on kubernetes.io/hostname selecting the pods"
    );
}

#[test]
fn the_metrics_service_selects_the_pods() {
    let service: Service = only("deploy/service.yaml", "Service");
    assert_eq!(service.metadata.name.as_deref(), Some("watermarkd-metrics"));
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("prometheus.io/scrape").map(String::as_str), Some("true"));
    assert_eq!(annotations.get("prometheus.io/port").map(String::as_str), Some("8080"));
    assert_eq!(annotations.get("prometheus.io/path").map(String::as_str), Some("/metrics"));
    let spec = service.spec.expect("spec");
    let labels = pod_labels(&deployment());
    let selector = spec.selector.clone().expect("selector");
    assert!(!selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "selects the pods");
    let ports = spec.ports.clone().unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name.as_deref(), Some("http-metrics"));
    assert_eq!(ports[0].port, 8080);
    let named = container(&deployment()).ports.unwrap_or_default();
    match ports[0].target_port.clone() {
        Some(IntOrString::String(name)) => {
            assert!(named.iter().any(|p| p.name.as_deref() == Some(name.as_str())), "targetPort {name}")
        }
        Some(IntOrString::Int(port)) => assert_eq!(port, 8080),
        None => {}
    }
}

/// The port the daemon serves /metrics on in the pod: the configmap settings' `listen`, or the
/// daemon's default.
fn daemon_metrics_port() -> u16 {
    let settings = parse_toml(&configmap_key("watermarkd.toml"), "deploy/configmap.yaml watermarkd.toml");
    let listen = settings.get("listen").and_then(|l| l.as_str()).unwrap_or("127.0.0.1:8080");
    listen.parse::<std::net::SocketAddr>().unwrap_or_else(|e| panic!("listen = {listen:?}: {e}")).port()
}

#[test]
fn the_pod_template_carries_prometheus_and_datadog_autodiscovery_annotations_for_metrics() {
    let deployment = deployment();
    let port = daemon_metrics_port();
    let c = container(&deployment);
    let http = c.ports.clone().unwrap_or_default().into_iter().find(|p| p.name.as_deref() == Some("http"));
    assert_eq!(http.map(|p| p.container_port), Some(i32::from(port)), "the container exposes the daemon's port");
    let annotations = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .expect("pod template annotations");
    let port_text = port.to_string();
    assert_eq!(annotations.get("prometheus.io/scrape").map(String::as_str), Some("true"));
    assert_eq!(annotations.get("prometheus.io/port").map(String::as_str), Some(port_text.as_str()));
    assert_eq!(annotations.get("prometheus.io/path").map(String::as_str), Some("/metrics"));

    // Autodiscovery annotations v2: `ad.datadoghq.com/<container>.checks`, a JSON object of
    // check name to `{init_config, instances}`; v1 keys must not be mixed in.
    let prefix = "ad.datadoghq.com/";
    let ad: Vec<(&String, &String)> = annotations.iter().filter(|(k, _)| k.starts_with(prefix)).collect();
    assert_eq!(ad.len(), 1, "exactly one Datadog annotation, the v2 .checks one: {ad:?}");
    let (key, text) = ad[0];
    assert_eq!(key.as_str(), format!("{prefix}{}.checks", c.name), "named after the container");
    let checks: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{key} is not JSON: {e}\n{text}"));
    let openmetrics = checks.get("openmetrics").unwrap_or_else(|| panic!("{key}: no openmetrics check"));
    assert!(openmetrics.get("init_config").is_some_and(|i| i.is_object()), "{key}: init_config is an object");
    let instances = openmetrics.get("instances").and_then(|i| i.as_array()).expect("instances");
    assert_eq!(instances.len(), 1, "{key}: one instance");
    let instance = &instances[0];
    assert_eq!(
        instance.get("openmetrics_endpoint").and_then(|e| e.as_str()),
        Some(format!("http://%%host%%:{port}/metrics").as_str()),
        "{key}: the endpoint is the daemon's /metrics"
    );
    assert_eq!(
        instance.get("namespace").and_then(|n| n.as_str()),
        Some("watermarkpodautoscaler"),
        "{key}: the Datadog controller chart's namespace, so its dashboards find the series"
    );
    let patterns: Vec<&str> = instance
        .get("metrics")
        .and_then(|m| m.as_array())
        .expect("metrics")
        .iter()
        .map(|p| p.as_str().expect("metric patterns are strings"))
        .collect();
    // Each pattern is `prefix.*`; every series family the daemon exports must be matched.
    let matched =
        |name: &str| patterns.iter().any(|p| p.strip_suffix(".*").is_some_and(|prefix| name.starts_with(prefix)));
    for name in
        ["wpa_controller_value", "wpa_controller_high_watermak", "wpa_controller_labels_info", "watermarkd_leader"]
    {
        assert!(matched(name), "{key}: {name} is not collected by {patterns:?}");
    }
}

#[test]
fn the_configmap_rules_pass_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, configmap_key("rules.toml")).expect("write rules.toml");
    assert_check_passes(&path, "the rules.toml key of deploy/configmap.yaml");
}

#[test]
fn the_configmap_settings_use_only_known_keys() {
    let what = "the watermarkd.toml key of deploy/configmap.yaml";
    let settings = check_settings(&configmap_key("watermarkd.toml"), what);
    assert_eq!(settings.get("crd").and_then(|v| v.as_bool()), Some(true), "{what}: crd");
    assert_eq!(settings.get("log_format").and_then(|v| v.as_str()), Some("json"), "{what}: log_format");
    // In the pod the Lease namespace and identity come from POD_NAMESPACE and POD_NAME.
    let lease = settings.get("lease").and_then(|l| l.as_table()).cloned().unwrap_or_default();
    assert!(!lease.contains_key("identity") && !lease.contains_key("namespace"), "{what}: [lease]");
    assert!(!settings.contains_key("kubeconfig"), "{what}: in-cluster configuration");
    let rules = parse_toml(&configmap_key("rules.toml"), "deploy/configmap.yaml rules.toml");
    assert_default_backend_exists(&settings, &rules, what);
}

// ---------------------------------------------------------------------------------------------
// Sample configuration for hosts

#[test]
fn the_sample_rules_pass_check() {
    assert_check_passes(&repo().join("packaging/etc/watermarkd/rules.toml"), "packaging/etc/watermarkd/rules.toml");
}

#[test]
fn the_sample_settings_use_only_known_keys() {
    let what = "packaging/etc/watermarkd/watermarkd.toml";
    let settings = check_settings(&read(what), what);
    // On a host nothing needs more than loopback until the operator opens it; in the pod the
    // daemon binds every interface (daemon_metrics_port), or it could not be scraped.
    assert_eq!(settings.get("listen").and_then(|v| v.as_str()), Some("127.0.0.1:8080"), "{what}");
    let pod = parse_toml(&configmap_key("watermarkd.toml"), "deploy/configmap.yaml watermarkd.toml");
    // The daemon's own default is loopback: the pod must say where it listens.
    let pod_listen = pod.get("listen").and_then(|l| l.as_str()).expect("deploy/configmap.yaml sets listen");
    let pod_listen: std::net::SocketAddr = pod_listen.parse().expect("an address");
    assert!(pod_listen.ip().is_unspecified(), "the pod listens on every interface: {pod_listen}");
    assert_eq!(settings.get("kubeconfig").and_then(|v| v.as_str()), Some("/etc/watermarkd/kubeconfig"), "{what}");
    let rules = parse_toml(&read("packaging/etc/watermarkd/rules.toml"), "packaging/etc/watermarkd/rules.toml");
    assert_default_backend_exists(&settings, &rules, what);
}

/// A valid value of each settings key, as TOML.
fn sample_value(key: &str) -> &'static str {
    match key {
        "rules" => "\"/etc/watermarkd/rules.toml\"",
        "labels_as_tags" => "[\"team\", \"app.kubernetes.io/name\"]",
        "crd" | "dry_run" => "false",
        "namespaces" => "[\"prod\"]",
        "listen" => "\"127.0.0.1:9000\"",
        "listen_max_connections" => "64",
        "listen_max_connections_per_peer" => "8",
        "listen_header_timeout" => "\"5s\"",
        "listen_connection_timeout" => "\"30s\"",
        "log_format" => "\"json\"",
        "log_level" => "\"info\"",
        "kubeconfig" => "\"/etc/watermarkd/kubeconfig\"",
        "context" => "\"production\"",
        "default_interval" => "\"15s\"",
        "max_concurrency" => "4",
        "reload_poll" => "\"1s\"",
        "default_backend" => "\"datadog\"",
        "enabled" => "true",
        "name" | "namespace" | "identity" => "\"watermarkd\"",
        "duration" => "\"15s\"",
        "renew_deadline" => "\"10s\"",
        "retry_period" => "\"2s\"",
        "history" => "\"1h\"",
        "token_file" => "\"/etc/watermarkd/status-token\"",
        "token_env" => "\"WATERMARKD_STATUS_TOKEN\"",
        "token_review" => "false",
        "open_on_loopback" => "false",
        "token_audiences" => "[\"watermarkd\"]",
        "allowed_hosts" => "[\"watermarkd.example.com\"]",
        other => panic!("no sample value for the settings key {other}: add one"),
    }
}

/// SETTINGS_KEYS and LEASE_KEYS are what the daemon accepts (so the checks above are checks of
/// what it would do), and README.md's settings table and the sample settings file name each.
#[test]
fn every_settings_key_is_accepted_and_documented() {
    let mut text = String::new();
    for key in SETTINGS_KEYS.iter().filter(|k| !["lease", "status"].contains(k)) {
        text.push_str(&format!("{key} = {}\n", sample_value(key)));
    }
    text.push_str("[lease]\n");
    for key in LEASE_KEYS {
        text.push_str(&format!("{key} = {}\n", sample_value(key)));
    }
    // The token comes from a file or a variable, not both: each in a file of its own.
    let status = |skip: &str| {
        let keys = STATUS_KEYS.iter().filter(|k| **k != skip);
        keys.map(|key| format!("{key} = {}\n", sample_value(key))).collect::<String>()
    };
    let with_variable = format!("{text}[status]\n{}", status("token_file"));
    text.push_str(&format!("[status]\n{}", status("token_env")));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("watermarkd.toml");
    let load = |text: &str| {
        std::fs::write(&path, text).expect("write settings");
        let args = RunArgs { settings: Some(path.clone()), ..RunArgs::default() };
        Settings::load(&args, &Environment::default())
    };
    for text in [&text, &with_variable] {
        if let Err(err) = load(text) {
            panic!("the daemon refuses a settings file with every key of SETTINGS_KEYS: {err}\n{text}");
        }
    }
    let err = load(&format!("{text}unknown_key = 1\n")).expect_err("an unknown key in [lease] is refused");
    assert!(err.to_string().contains("unknown_key"), "the error names the key: {err}");
    let err = load(&format!("unknown_key = 1\n{text}")).expect_err("an unknown top-level key is refused");
    assert!(err.to_string().contains("unknown_key"), "the error names the key: {err}");

    // README.md: the first cell of a settings row names the key, `[lease] key` for the lease's.
    let readme = read("README.md");
    let first_cells: Vec<&str> =
        readme.lines().filter(|l| l.starts_with("| `")).filter_map(|l| l.split('|').nth(1)).map(str::trim).collect();
    for key in SETTINGS_KEYS.iter().filter(|k| !["lease", "status"].contains(k)) {
        let named = format!("`{key}`");
        assert!(first_cells.iter().any(|c| c.split(", ").any(|k| k == named)), "README.md: no settings row for {key}");
    }
    for key in LEASE_KEYS {
        let in_lease_row = |c: &&str| {
            c.starts_with("`[lease] ")
                && c.split(", ").any(|k| k.trim_matches('`').trim_start_matches("[lease] ") == key)
        };
        assert!(first_cells.iter().any(in_lease_row), "README.md: no settings row for [lease] {key}");
    }
    for key in STATUS_KEYS {
        let in_status_row = |c: &&str| {
            c.starts_with("`[status] ")
                && c.split(", ").any(|k| k.trim_matches('`').trim_start_matches("[status] ") == key)
        };
        assert!(first_cells.iter().any(in_status_row), "README.md: no settings row for [status] {key}");
    }

    // The sample settings file: each key set or shown commented out, in its table.
    let what = "packaging/etc/watermarkd/watermarkd.toml";
    let sample = read(what);
    let (top, rest) = sample.split_once("\n[lease]\n").unwrap_or_else(|| panic!("{what}: no [lease] table"));
    let (lease, status) = rest.split_once("\n[status]\n").unwrap_or_else(|| panic!("{what}: no [status] table"));
    let shown = |part: &str, key: &str| {
        part.lines().any(|l| {
            let l = l.trim_start_matches('#').trim_start();
            l.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
        })
    };
    for key in SETTINGS_KEYS.iter().filter(|k| !["lease", "status"].contains(k)) {
        assert!(shown(top, key), "{what} does not document {key}");
    }
    for key in STATUS_KEYS {
        assert!(shown(status, key), "{what} does not document status.{key}");
    }
    for key in LEASE_KEYS {
        assert!(shown(lease, key), "{what} does not document lease.{key}");
    }
}

#[test]
fn the_sample_environment_file_sets_the_secrets_with_placeholders() {
    let what = "packaging/etc/watermarkd/watermarkd.env";
    let text = read(what);
    let mut names = BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (name, value) = line.split_once('=').unwrap_or_else(|| panic!("{what}: not NAME=value: {line}"));
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
            "{what}: variable name {name:?}"
        );
        // Datadog keys are 32 (API) and 40 (application) hexadecimal digits: nothing like that
        // may ever be committed here.
        let looks_like_a_key = value.len() >= 32 && value.chars().all(|c| c.is_ascii_hexdigit());
        assert!(!looks_like_a_key && value.contains("replace"), "{what}: {name} must hold a placeholder");
        names.insert(name.to_string());
    }
    let rules = parse_toml(&read("packaging/etc/watermarkd/rules.toml"), "packaging/etc/watermarkd/rules.toml");
    let wanted = secret_env_names(&rules);
    assert!(!wanted.is_empty());
    assert!(wanted.is_subset(&names), "{what} sets {names:?}; the sample rules read {wanted:?}");
}

#[test]
fn the_sample_readme_is_one_paragraph() {
    let text = read("packaging/etc/watermarkd/README");
    assert!(!text.trim().is_empty());
    assert!(!text.trim().contains("\n\n"), "packaging/etc/watermarkd/README: one paragraph");
    for mode in ["0750 root:watermarkd", "0640 root:watermarkd", "0600 root:root"] {
        assert!(text.contains(mode), "packaging/etc/watermarkd/README describes {mode}");
    }
}

// ---------------------------------------------------------------------------------------------
// systemd

/// `key=value` lines of a unit file, by section; a key may repeat.
fn unit_entries(text: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("not key=value: {line}"));
        sections.entry(section.clone()).or_default().push((key.trim().to_string(), value.trim().to_string()));
    }
    sections
}

fn values<'a>(entries: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    entries.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
}

/// Finds a systemd tool; missing means the test environment lacks Debian's `systemd` package.
fn systemd_tool(name: &str) -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|dir| dir.join(name)).collect::<Vec<_>>())
        .unwrap_or_default();
    candidates
        .into_iter()
        .chain([Path::new("/usr/bin").join(name), Path::new("/bin").join(name)])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found: these tests need Debian's `systemd` package (apt-get install systemd) to \
                 check systemd/ for real"
            )
        })
}

#[test]
fn the_unit_has_the_notify_protocol_commands_and_hardening() {
    let text = read("systemd/watermarkd.service");
    let sections = unit_entries(&text);
    let service = sections.get("Service").expect("[Service]");
    let one = |key: &str| -> String {
        let found = values(service, key);
        assert_eq!(found.len(), 1, "systemd/watermarkd.service: exactly one {key}= ({found:?})");
        found[0].to_string()
    };
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("NotifyAccess"), "main");
    let watchdog = one("WatchdogSec");
    assert!(humantime::parse_duration(&watchdog).is_ok_and(|d| d.as_secs() >= 10), "WatchdogSec={watchdog}");
    assert_eq!(one("ExecStartPre"), format!("/usr/bin/watermarkd check --rules {RULES_PATH}"));
    assert_eq!(one("ExecStart"), format!("/usr/bin/watermarkd run --settings {SETTINGS_PATH}"));
    assert_eq!(one("ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(one("User"), SYSTEM_USER);
    assert_eq!(one("Group"), SYSTEM_USER);
    assert_eq!(one("EnvironmentFile"), "-/etc/watermarkd/watermarkd.env");
    assert_eq!(one("Restart"), "on-failure");
    for (key, wanted) in [
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("SystemCallArchitectures", "native"),
        ("UMask", "0077"),
    ] {
        assert_eq!(one(key), wanted, "systemd/watermarkd.service: {key}");
    }
    assert_eq!(values(service, "SystemCallFilter").first().copied(), Some("@system-service"), "SystemCallFilter");
    assert!(
        values(service, "ReadOnlyPaths").iter().any(|v| v.split_whitespace().any(|p| p == CONFIG_DIR)),
        "ReadOnlyPaths={CONFIG_DIR}"
    );
    // Room for the outgoing connections beside a full /metrics listener: systemd's default soft
    // limit (1024) is not.
    let open_files: u64 = one("LimitNOFILE").parse().expect("LimitNOFILE= a number");
    let sample = parse_toml(&read("packaging/etc/watermarkd/watermarkd.toml"), "the sample settings");
    let listener_cap = sample.get("listen_max_connections").and_then(toml::Value::as_integer).expect("set");
    assert!(
        open_files >= 65536 && open_files >= 100 * u64::try_from(listener_cap).expect("positive"),
        "LimitNOFILE={open_files} next to listen_max_connections = {listener_cap}"
    );
    // The Lease identity defaults to the host name, read from /proc/sys/kernel/hostname.
    assert!(values(service, "ProcSubset").is_empty(), "ProcSubset=pid would hide the host name");
    // The daemon needs the network to be up before it can reach the API server.
    let unit = sections.get("Unit").expect("[Unit]");
    assert!(values(unit, "After").iter().any(|v| v.contains("network-online.target")));
    assert!(values(unit, "Wants").iter().any(|v| v.contains("network-online.target")));
    let install = sections.get("Install").expect("[Install]");
    assert_eq!(values(install, "WantedBy"), ["multi-user.target"]);
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let analyze = systemd_tool("systemd-analyze");
    let binary = env!("CARGO_BIN_EXE_watermarkd");
    let text = read("systemd/watermarkd.service");
    assert!(text.contains("/usr/bin/watermarkd "), "the unit runs /usr/bin/watermarkd");
    // verify insists that every Exec binary exists: run the one cargo built instead.
    let dir = tempfile::tempdir().expect("temp dir");
    let unit = dir.path().join("watermarkd.service");
    std::fs::write(&unit, text.replace("/usr/bin/watermarkd ", &format!("{binary} "))).expect("write the unit");
    let output = Command::new(&analyze)
        .args(["verify", "--man=no"])
        .arg(&unit)
        .env("SYSTEMD_LOG_COLOR", "0")
        .env("SYSTEMD_PAGER", "")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", analyze.display()));
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let about_us: Vec<&str> = printed.lines().filter(|l| l.contains("watermarkd")).collect();
    assert!(
        output.status.success() && about_us.is_empty(),
        "systemd-analyze verify systemd/watermarkd.service ({}):\n{printed}",
        output.status
    );
    if !printed.trim().is_empty() {
        // Complaints about other units of this machine are not ours to fix.
        eprintln!("systemd-analyze verify printed, about other units:\n{printed}");
    }
}

/// The sysusers.d snippet creates the user and group the unit runs as; the tmpfiles.d snippet
/// then gives /etc/watermarkd and the files in it their owners and modes. Both run for real in
/// a scratch root directory (`--root`); the tmpfiles part needs root to change owners.
#[test]
fn sysusers_and_tmpfiles_set_up_the_user_and_the_config_directory() {
    let sysusers = systemd_tool("systemd-sysusers");
    let tmpfiles = systemd_tool("systemd-tmpfiles");
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(root.path().join("etc/watermarkd")).expect("mkdir");

    let run = |tool: &Path, args: &[&str], config: &str| {
        let mut child = Command::new(tool)
            .arg(format!("--root={}", root.path().display()))
            .args(args)
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", tool.display()));
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), read(config).as_bytes()).expect("write");
        let output = child.wait_with_output().expect("wait");
        let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.success(), printed)
    };

    let (ok, printed) = run(&sysusers, &[], "systemd/watermarkd.sysusers");
    let complaints: Vec<&str> = printed.lines().filter(|l| !l.starts_with("Creating ")).collect();
    assert!(ok && complaints.is_empty(), "systemd-sysusers systemd/watermarkd.sysusers:\n{printed}");
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).expect("etc/passwd");
    let user: Vec<&str> =
        passwd.lines().find(|l| l.starts_with(&format!("{SYSTEM_USER}:"))).expect("the user").split(':').collect();
    assert!(user[6].ends_with("nologin"), "no login shell: {user:?}");
    let gid: u32 = user[3].parse().expect("gid");
    let group = std::fs::read_to_string(root.path().join("etc/group")).expect("etc/group");
    assert!(group.lines().any(|l| l.starts_with(&format!("{SYSTEM_USER}:x:{gid}:"))), "the group:\n{group}");

    let files = ["watermarkd.toml", "rules.toml", "watermarkd.env"];
    for file in files {
        let target = root.path().join("etc/watermarkd").join(file);
        std::fs::write(&target, read(&format!("packaging/etc/watermarkd/{file}"))).expect("stage a sample");
    }
    std::fs::write(root.path().join("etc/watermarkd/kubeconfig"), "apiVersion: v1\nkind: Config\n").expect("write");

    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let we_are_root = std::fs::metadata(root.path().join("etc/passwd")).expect("metadata").uid() == 0;
    if !we_are_root {
        eprintln!("not root: systemd/watermarkd.tmpfiles is not applied (it changes owners)");
        return;
    }
    let (ok, printed) = run(&tmpfiles, &["--create"], "systemd/watermarkd.tmpfiles");
    assert!(ok && printed.trim().is_empty(), "systemd-tmpfiles systemd/watermarkd.tmpfiles:\n{printed}");
    for (name, mode, owner_gid) in [
        ("", 0o750, gid),
        ("watermarkd.toml", 0o640, gid),
        ("rules.toml", 0o640, gid),
        ("kubeconfig", 0o640, gid),
        ("watermarkd.env", 0o600, 0),
    ] {
        let path = root.path().join("etc/watermarkd").join(name);
        let meta = std::fs::metadata(&path).expect("metadata");
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "mode of /etc/watermarkd/{name}");
        assert_eq!((meta.uid(), meta.gid()), (0, owner_gid), "owner of /etc/watermarkd/{name}");
    }
}
