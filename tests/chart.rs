//! The Helm chart in charts/watermarkd, through a real helm (scripts/install-helm caches the
//! upstream 3.17.3 binary; the tests fail, never skip, when it is missing) and a real
//! kube-apiserver (tests/support/kube_cluster.rs).
//!
//! `helm lint --strict` passes with the default values and every ci/ values file; the rendered
//! objects parse as their Kubernetes types with nothing lost and carry the recommended labels;
//! the values reach the Deployment, the settings (read back with the daemon's own settings
//! loader) and the RBAC, which is exactly `watermarkd::commands::rbac::PERMISSIONS` (without the CRD-mode
//! entries when CRD mode is off; with status.tokenReview, plus the creation of TokenReviews and
//! SubjectAccessReviews in a ClusterRole of its own, and a reader's ClusterRole for users to
//! bind); the daemon listens on every interface, on the port the probes and scrapes use; the
//! status token Secret is mounted where the settings say; the chart
//! never renders a Secret; the schema refuses bad values naming the field; deploy/ is the chart
//! rendered with its defaults. On the API server, `helm install` succeeds and the ServiceAccount
//! may make exactly the table's calls, and `helm uninstall` removes everything but the CRD. The ServiceMonitor is only rendered, not
//! installed: the test API server has no Prometheus Operator CRDs.

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
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, PodSpec, Service, ServiceAccount, VolumeMount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use manifest_checks::{assert_same_grants, grants_of_rules, grants_of_table, kind_of, sorted_unique, typed, Grant};
use watermarkd::commands::rbac::{PERMISSIONS, STATUS_READER, STATUS_TOKEN_REVIEW};
use watermarkd::domain::rules::SecretSource;
use watermarkd::runtime::settings::{Environment, RunArgs, Settings, StatusSettings};

const CHART: &str = "charts/watermarkd";
const RELEASE: &str = "watermarkd";
const NAMESPACE: &str = "watermarkd";
/// Where the chart mounts the status API's token (status.token.existingSecret), and the file
/// token_file names.
const STATUS_TOKEN_DIR: &str = "/etc/watermarkd-status";
const STATUS_TOKEN_FILE: &str = "/etc/watermarkd-status/token";
/// The values files of ci/, each linted and rendered.
const CI_VALUES: [&str; 2] = ["ci/everything-values.yaml", "ci/crd-namespaces-values.yaml"];
const EVERYTHING: &str = "ci/everything-values.yaml";
const RECOMMENDED_LABELS: [&str; 7] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

// ---------------------------------------------------------------------------------------------
// Helpers

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart_file(relative: &str) -> PathBuf {
    repo().join(CHART).join(relative)
}

/// The helm scripts/install-helm caches, as kube_cluster.rs finds kube-apiserver.
fn helm_binary() -> PathBuf {
    let path = kube_cluster::cache_dir().join("bin/helm");
    assert!(path.is_file(), "helm is not at {}: run scripts/install-test-deps to install it", path.display());
    path
}

/// Runs helm with its cache, configuration and data in a temporary directory, never $HOME.
fn helm(args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("temp dir");
    Command::new(helm_binary())
        .args(args)
        .current_dir(repo())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap_or_else(|e| panic!("run helm: {e}"))
}

/// The container's volume mount at `path`.
fn mount_at(c: &Container, path: &str) -> VolumeMount {
    c.volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.mount_path == path)
        .unwrap_or_else(|| panic!("no volume mount at {path}"))
}

fn printed(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn helm_ok(args: &[&str]) -> String {
    let output = helm(args);
    assert!(output.status.success(), "helm {}: {}\n{}", args.join(" "), output.status, printed(&output));
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// Every object `helm template` renders with `extra` arguments (values files are relative to
/// the chart).
fn render(extra: &[&str]) -> Vec<serde_yaml_ng::Value> {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    let files: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    let mut resolved = Vec::new();
    let mut iter = files.iter();
    while let Some(arg) = iter.next() {
        resolved.push(arg.clone());
        if arg == "-f" {
            let file = iter.next().expect("a file after -f");
            resolved.push(chart_file(file).display().to_string());
        }
    }
    args.extend(resolved.iter().map(String::as_str));
    let text = helm_ok(&args);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("helm template {extra:?}: {e}")))
        .filter(|value: &serde_yaml_ng::Value| !value.is_null())
        .collect()
}

fn of_kind(objects: &[serde_yaml_ng::Value], kind: &str) -> Vec<serde_yaml_ng::Value> {
    objects.iter().filter(|o| kind_of(o) == kind).cloned().collect()
}

fn one<T: serde::de::DeserializeOwned + serde::Serialize>(objects: &[serde_yaml_ng::Value], kind: &str) -> T {
    let found = of_kind(objects, kind);
    assert_eq!(found.len(), 1, "exactly one {kind}");
    typed(kind, &found[0])
}

/// The object of `kind` named `name`, if rendered.
fn named<T: serde::de::DeserializeOwned + serde::Serialize>(
    objects: &[serde_yaml_ng::Value],
    kind: &str,
    name: &str,
) -> Option<T> {
    of_kind(objects, kind)
        .iter()
        .find(|o| o["metadata"]["name"].as_str() == Some(name))
        .map(|o| typed(&format!("{kind} {name}"), o))
}

/// The grants status.tokenReview adds: checking readers' tokens (TokenReviews) and their users'
/// right to read (SubjectAccessReviews) with the API server.
fn token_review_grants() -> BTreeSet<Grant> {
    sorted_unique(grants_of_table(STATUS_TOKEN_REVIEW), "STATUS_TOKEN_REVIEW")
}

/// The name of the ClusterRole for readers (status.tokenReview), which the daemon is not given.
fn is_reader_role(name: &str) -> bool {
    name.ends_with("-status-reader")
}

fn crd_of(object: &serde_yaml_ng::Value) -> CustomResourceDefinition {
    serde_yaml_ng::from_value(object.clone()).unwrap_or_else(|e| panic!("CustomResourceDefinition: {e}"))
}

fn pod_spec(deployment: &Deployment) -> PodSpec {
    deployment.spec.as_ref().and_then(|s| s.template.spec.clone()).expect("a pod spec")
}

fn container(deployment: &Deployment) -> Container {
    let spec = pod_spec(deployment);
    assert_eq!(spec.containers.len(), 1, "one container");
    spec.containers[0].clone()
}

fn env_of(container: &Container) -> BTreeMap<String, EnvVar> {
    container.env.clone().unwrap_or_default().into_iter().map(|e| (e.name.clone(), e)).collect()
}

/// The settings the daemon would run with, loaded by its own loader from the settings file
/// and the WATERMARKD__ variables the Deployment sets, as in the pod.
fn daemon_settings(objects: &[serde_yaml_ng::Value]) -> Settings {
    let deployment: Deployment = one(objects, "Deployment");
    let c = container(&deployment);
    let variables: Vec<(String, String)> = env_of(&c)
        .into_values()
        .filter(|e| e.name.starts_with("WATERMARKD__"))
        .map(|e| (e.name.clone(), e.value.clone().expect("a literal value")))
        .collect();
    let environment = Environment {
        variables,
        pod_name: Some("watermarkd-0".into()),
        pod_namespace: Some(NAMESPACE.into()),
        ..Environment::default()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = c.args.clone().unwrap_or_default();
    let settings = match args.iter().position(|a| a == "--settings") {
        Some(i) => {
            assert_eq!(args[i + 1], "/etc/watermarkd/watermarkd.toml");
            let configmap: ConfigMap = one(objects, "ConfigMap");
            let text = configmap.data.unwrap_or_default().get("watermarkd.toml").cloned().expect("watermarkd.toml");
            let path = dir.path().join("watermarkd.toml");
            std::fs::write(&path, text).expect("write settings");
            Some(path)
        }
        None => {
            assert_eq!(args, ["run"], "without a settings file the daemon runs on the environment");
            None
        }
    };
    Settings::load(&RunArgs { settings, ..RunArgs::default() }, &environment)
        .unwrap_or_else(|e| panic!("the daemon refuses the rendered settings: {e}"))
}

/// The grants of the rendered ClusterRoles and Roles.
fn rendered_grants(objects: &[serde_yaml_ng::Value], what: &str) -> BTreeSet<Grant> {
    let mut granted = Vec::new();
    for role in of_kind(objects, "ClusterRole") {
        let role: ClusterRole = typed(what, &role);
        if role.metadata.name.as_deref().is_some_and(is_reader_role) {
            continue;
        }
        granted.extend(grants_of_rules(&role.rules.unwrap_or_default(), false, what));
    }
    for role in of_kind(objects, "Role") {
        let role: Role = typed(what, &role);
        assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE), "{what}: a Role outside the release namespace");
        granted.extend(grants_of_rules(&role.rules.unwrap_or_default(), true, what));
    }
    sorted_unique(granted, what)
}

fn table(crd_mode: bool) -> BTreeSet<Grant> {
    sorted_unique(grants_of_table(PERMISSIONS.iter().filter(|p| crd_mode || !p.crd_mode_only)), "PERMISSIONS")
}

fn selector_labels() -> BTreeMap<String, String> {
    [("app.kubernetes.io/name", "watermarkd"), ("app.kubernetes.io/instance", RELEASE)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The chart's files

#[test]
fn the_app_version_is_the_crate_version() {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Chart {
        api_version: String,
        name: String,
        #[serde(rename = "type")]
        type_: String,
        version: String,
        app_version: String,
    }
    let text = std::fs::read_to_string(chart_file("Chart.yaml")).expect("Chart.yaml");
    let chart: Chart = serde_yaml_ng::from_str(&text).expect("Chart.yaml");
    assert_eq!(
        (chart.api_version.as_str(), chart.name.as_str(), chart.type_.as_str()),
        ("v2", "watermarkd", "application")
    );
    assert_eq!(chart.version, "0.1.0");
    assert_eq!(chart.app_version, env!("CARGO_PKG_VERSION"), "Chart.yaml appVersion vs Cargo.toml version");
}

#[test]
fn the_chart_crd_is_what_watermarkd_crd_prints_and_is_kept_on_uninstall() {
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd")).arg("crd").output().expect("run watermarkd crd");
    assert!(output.status.success(), "{}", printed(&output));
    let file = std::fs::read(chart_file("files/crd.yaml")).expect("files/crd.yaml");
    assert!(file == output.stdout, "charts/watermarkd/files/crd.yaml is stale: `watermarkd crd > charts/watermarkd/files/crd.yaml`, then scripts/render-deploy");

    let objects = render(&[]);
    let crds = of_kind(&objects, "CustomResourceDefinition");
    assert_eq!(crds.len(), 1);
    let rendered = crd_of(&crds[0]);
    let annotations = rendered.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("helm.sh/resource-policy").map(String::as_str), Some("keep"));
    let printed_crd: CustomResourceDefinition = serde_yaml_ng::from_slice(&output.stdout).expect("the printed CRD");
    let mut stripped = rendered.clone();
    stripped.metadata.annotations = None;
    stripped.metadata.labels = None;
    assert_eq!(stripped, printed_crd, "the chart changes the CRD beyond its labels and annotation");

    assert!(of_kind(&render(&["--set", "crd.install=false"]), "CustomResourceDefinition").is_empty());
}

#[test]
fn helm_lint_strict_passes_with_the_defaults_and_every_ci_values_file() {
    let mut runs: Vec<Vec<String>> = vec![vec![]];
    runs.extend(CI_VALUES.iter().map(|f| vec!["-f".to_string(), chart_file(f).display().to_string()]));
    for extra in runs {
        let mut args = vec!["lint", "--strict", CHART];
        args.extend(extra.iter().map(String::as_str));
        let out = helm_ok(&args);
        assert!(out.contains("0 chart(s) failed"), "helm {}:\n{out}", args.join(" "));
    }
    // Every ci/ file is linted: none is forgotten in CI_VALUES.
    let on_disk: BTreeSet<String> = std::fs::read_dir(chart_file("ci"))
        .expect("ci/")
        .map(|e| format!("ci/{}", e.expect("entry").file_name().to_string_lossy()))
        .collect();
    assert_eq!(on_disk, CI_VALUES.iter().map(|f| f.to_string()).collect(), "charts/watermarkd/ci/");
}

#[test]
fn deploy_is_the_chart_rendered_with_its_defaults() {
    helm_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let output =
        Command::new(repo().join("scripts/render-deploy")).arg(dir.path()).output().expect("run scripts/render-deploy");
    assert!(output.status.success(), "scripts/render-deploy: {}", printed(&output));
    let rendered: BTreeSet<String> = std::fs::read_dir(dir.path())
        .expect("rendered")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let by_hand = ["namespace.yaml", "kustomization.yaml", "grafana"];
    let committed: BTreeSet<String> = std::fs::read_dir(repo().join("deploy"))
        .expect("deploy/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| !by_hand.contains(&name.as_str()))
        .collect();
    assert_eq!(committed, rendered, "deploy/ vs the chart's templates: run scripts/render-deploy");
    for name in &rendered {
        let fresh = std::fs::read(dir.path().join(name)).expect("rendered file");
        let kept = std::fs::read(repo().join("deploy").join(name)).expect("deploy file");
        assert!(
            fresh == kept,
            "deploy/{name} differs from the chart rendered with its defaults: run scripts/render-deploy"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// The variants every rendering test looks at: the defaults, and each ci/ values file.
fn variants() -> Vec<(String, Vec<serde_yaml_ng::Value>)> {
    let mut all = vec![("defaults".to_string(), render(&[]))];
    for file in CI_VALUES {
        all.push((file.to_string(), render(&["-f", file])));
    }
    all
}

#[test]
fn every_object_parses_as_its_type_with_the_recommended_labels_and_no_secret() {
    for (what, objects) in variants() {
        assert!(!objects.is_empty(), "{what}: nothing rendered");
        for object in &objects {
            let kind = kind_of(object);
            let meta = match kind.as_str() {
                // Only parsed: the schema's integer `minimum`s come back as floats. Its content is
                // compared with `watermarkd crd` in the_chart_crd_is_what_watermarkd_crd_prints.
                "CustomResourceDefinition" => crd_of(object).metadata,
                "ClusterRole" => typed::<ClusterRole>(&what, object).metadata,
                "ClusterRoleBinding" => typed::<ClusterRoleBinding>(&what, object).metadata,
                "Role" => typed::<Role>(&what, object).metadata,
                "RoleBinding" => typed::<RoleBinding>(&what, object).metadata,
                "ServiceAccount" => typed::<ServiceAccount>(&what, object).metadata,
                "ConfigMap" => typed::<ConfigMap>(&what, object).metadata,
                "Deployment" => typed::<Deployment>(&what, object).metadata,
                "Service" => typed::<Service>(&what, object).metadata,
                // policy/v1beta1's PodDisruptionBudget has the same fields as v1's.
                "PodDisruptionBudget" => typed::<PodDisruptionBudget>(&what, object).metadata,
                "ServiceMonitor" => {
                    serde_yaml_ng::from_value::<kube::api::DynamicObject>(object.clone())
                        .expect("ServiceMonitor")
                        .metadata
                }
                "Secret" => panic!("{what}: the chart renders a Secret; it must only refer to existing ones"),
                other => panic!("{what}: unexpected kind {other}"),
            };
            let labels = meta.labels.clone().unwrap_or_default();
            for label in RECOMMENDED_LABELS {
                assert!(labels.contains_key(label), "{what}: {kind} {:?} lacks the label {label}", meta.name);
            }
            assert_eq!(labels.get("app.kubernetes.io/version").map(String::as_str), Some(env!("CARGO_PKG_VERSION")));
            assert_eq!(labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("Helm"));
            let cluster_scoped =
                matches!(kind.as_str(), "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding");
            let wanted = if cluster_scoped { None } else { Some(NAMESPACE) };
            assert_eq!(meta.namespace.as_deref(), wanted, "{what}: namespace of {kind} {:?}", meta.name);
        }
    }
}

#[test]
fn the_selector_is_name_and_instance_only_whatever_labels_are_added() {
    for (what, objects) in variants() {
        let deployment: Deployment = one(&objects, "Deployment");
        let spec = deployment.spec.clone().expect("spec");
        assert_eq!(spec.selector.match_labels.clone().unwrap_or_default(), selector_labels(), "{what}: selector");
        let pod_labels = spec.template.metadata.and_then(|m| m.labels).unwrap_or_default();
        assert!(selector_labels().iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "{what}: the pods match");
        if let Some(service) = of_kind(&objects, "Service").first() {
            let service: Service = typed(&what, service);
            assert_eq!(service.spec.and_then(|s| s.selector).unwrap_or_default(), selector_labels(), "{what}: Service");
        }
        for pdb in of_kind(&objects, "PodDisruptionBudget") {
            let pdb: PodDisruptionBudget = typed(&what, &pdb);
            let selector = pdb.spec.and_then(|s| s.selector).and_then(|s| s.match_labels).unwrap_or_default();
            assert_eq!(selector, selector_labels(), "{what}: PodDisruptionBudget");
        }
    }
    // Labels added by values land on the pods, never in the selector.
    let objects = render(&["-f", EVERYTHING]);
    let deployment: Deployment = one(&objects, "Deployment");
    let pod_labels = deployment.spec.and_then(|s| s.template.metadata).and_then(|m| m.labels).unwrap_or_default();
    assert_eq!(pod_labels.get("tier").map(String::as_str), Some("control"));
    assert_eq!(pod_labels.get("team").map(String::as_str), Some("platform"));
}

#[test]
fn the_image_is_the_app_version_or_the_tag_and_digest_given() {
    let image = |extra: &[&str]| container(&one(&render(extra), "Deployment")).image.expect("image");
    assert_eq!(image(&[]), format!("watermarkd:{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(image(&["--set", "image.repository=r.example/wm", "--set", "image.tag=1.2.3"]), "r.example/wm:1.2.3");
    let digest = format!("sha256:{}", "ab".repeat(32));
    assert_eq!(
        image(&["--set", "image.tag=1.2.3", "--set", &format!("image.digest={digest}")]),
        format!("watermarkd:1.2.3@{digest}")
    );
    let deployment: Deployment = one(&render(&["-f", EVERYTHING]), "Deployment");
    assert_eq!(container(&deployment).image_pull_policy.as_deref(), Some("Always"));
    let secrets: Vec<String> =
        pod_spec(&deployment).image_pull_secrets.unwrap_or_default().into_iter().map(|s| s.name).collect();
    assert_eq!(secrets, ["regcred"]);
}

#[test]
fn the_deployment_takes_replicas_scheduling_and_pod_metadata_from_the_values() {
    let deployment: Deployment = one(&render(&["-f", EVERYTHING]), "Deployment");
    assert_eq!(deployment.spec.as_ref().and_then(|s| s.replicas), Some(3));
    let pod = pod_spec(&deployment);
    assert_eq!(pod.service_account_name.as_deref(), Some("wmd-sa"));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
    assert_eq!(
        pod.node_selector.clone().unwrap_or_default().get("kubernetes.io/os").map(String::as_str),
        Some("linux")
    );
    assert_eq!(pod.tolerations.clone().unwrap_or_default().len(), 1);
    let affinity = pod.affinity.clone().expect("affinity");
    assert!(
        affinity.node_affinity.is_some() && affinity.pod_anti_affinity.is_none(),
        "the given affinity replaces the default"
    );
    let spread = pod.topology_spread_constraints.clone().unwrap_or_default();
    assert_eq!(spread.len(), 1);
    let selector = spread[0].label_selector.clone().and_then(|s| s.match_labels).unwrap_or_default();
    assert_eq!(
        selector.get("app.kubernetes.io/instance").map(String::as_str),
        Some(RELEASE),
        "spread over this release's pods"
    );
    let annotations = deployment.spec.and_then(|s| s.template.metadata).and_then(|m| m.annotations).unwrap_or_default();
    assert_eq!(annotations.get("example.com/owner").map(String::as_str), Some("platform"));
    assert!(
        !annotations.keys().any(|k| k.starts_with("prometheus.io/") || k.starts_with("ad.datadoghq.com/")),
        "both toggled off: {annotations:?}"
    );

    // The defaults: the Datadog and Prometheus annotations, the soft anti-affinity.
    let deployment: Deployment = one(&render(&[]), "Deployment");
    let annotations = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert!(
        annotations.contains_key("ad.datadoghq.com/watermarkd.checks")
            && annotations.contains_key("prometheus.io/scrape")
    );
    let anti = pod_spec(&deployment).affinity.and_then(|a| a.pod_anti_affinity).expect("default anti-affinity");
    assert_eq!(anti.preferred_during_scheduling_ignored_during_execution.unwrap_or_default().len(), 1);
}

#[test]
fn the_settings_carry_crd_mode_namespaces_and_the_lease_and_the_rules_pass_check() {
    let settings = daemon_settings(&render(&[]));
    assert!(settings.crd);
    assert!(settings.namespaces.is_empty(), "all namespaces by default");
    assert_eq!(settings.lease.name, RELEASE, "the Lease is named after the release");
    assert!(settings.lease.enabled);
    assert_eq!(settings.lease.namespace, NAMESPACE);
    assert_eq!(settings.rules, Path::new("/etc/watermarkd/rules.toml"));

    let objects = render(&["-f", "ci/crd-namespaces-values.yaml", "--set", "settings.defaultInterval=20s"]);
    let settings = daemon_settings(&objects);
    assert!(settings.crd);
    assert_eq!(settings.namespaces, ["prod"]);
    assert_eq!(settings.default_interval, std::time::Duration::from_secs(20));
    let deployment: Deployment = one(&objects, "Deployment");
    assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(1));
    assert!(daemon_settings(&objects).lease.enabled, "one replica still takes the Lease");
    assert!(!daemon_settings(&render(&["--set", "crd.enabled=false"])).crd);

    // The inline rules, as mounted, pass the daemon's check.
    let configmap: ConfigMap = one(&render(&[]), "ConfigMap");
    let rules = configmap.data.unwrap_or_default().get("rules.toml").cloned().expect("rules.toml");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, rules).expect("write rules");
    let output =
        Command::new(env!("CARGO_BIN_EXE_watermarkd")).arg("check").arg("--rules").arg(&path).output().expect("check");
    assert!(output.status.success(), "the chart's default rules fail `watermarkd check`:\n{}", printed(&output));

    // A settings change rolls the pods; a rules change does not (the daemon reloads them).
    let checksum = |extra: &[&str]| {
        let d: Deployment = one(&render(extra), "Deployment");
        d.spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .unwrap_or_default()
            .get("checksum/settings")
            .cloned()
    };
    let base = checksum(&[]);
    assert!(base.is_some());
    assert_ne!(checksum(&["--set", "settings.logLevel=debug"]), base);
    assert_eq!(checksum(&["--set", "rules.inline=# none"]), base);
}

#[test]
fn an_existing_configmap_replaces_ours_and_the_settings_move_to_the_environment() {
    let objects = render(&["-f", EVERYTHING]);
    assert!(of_kind(&objects, "ConfigMap").is_empty(), "no ConfigMap with rules.existingConfigMap");
    let deployment: Deployment = one(&objects, "Deployment");
    let c = container(&deployment);
    let mount = mount_at(&c, "/etc/watermarkd");
    assert_eq!(mount.sub_path, None, "a directory mount, so that ConfigMap updates reach the pod");
    let volume =
        pod_spec(&deployment).volumes.unwrap_or_default().into_iter().find(|v| v.name == mount.name).expect("volume");
    let source = volume.config_map.expect("a ConfigMap volume");
    assert_eq!(source.name, "my-rules");
    let items: Vec<(String, String)> = source.items.unwrap_or_default().into_iter().map(|i| (i.key, i.path)).collect();
    assert_eq!(items, [("autoscalers.toml".to_string(), "rules.toml".to_string())]);

    let settings = daemon_settings(&objects);
    assert!(!settings.crd);
    assert_eq!(settings.namespaces, ["prod", "staging"]);
    assert_eq!(settings.lease.name, "wmd-leader");
    assert_eq!(settings.lease.lease_duration, std::time::Duration::from_secs(20));
    assert_eq!(settings.lease.renew_deadline, std::time::Duration::from_secs(15));
    assert_eq!(settings.lease.retry_period, std::time::Duration::from_secs(3));
    assert_eq!(settings.default_backend, "prom");
    assert_eq!(settings.log_level, "watermarkd=debug,kube=warn");
    assert!(settings.dry_run);
    assert_eq!(settings.max_concurrency, 16);
    assert_eq!(settings.cluster_name.as_deref(), Some("eu-1"));
    let policy = &settings.recommender_policy;
    assert_eq!(
        (policy.url_problem("https://reco.svc:8443/r"), policy.url_problem("http://reco.team-a/api/r")),
        (None, None)
    );
    assert!(policy.url_problem("http://reco.team-a/admin").is_some());
    assert_eq!(policy.tls_dir(), Some(std::path::Path::new("/etc/watermarkd-tls")));
    // [status] through WATERMARKD__STATUS__* variables.
    assert_eq!(
        settings.status,
        StatusSettings {
            enabled: true,
            history: std::time::Duration::from_secs(30 * 60),
            token: Some(SecretSource::File(STATUS_TOKEN_FILE.into())),
            token_review: true,
            token_audiences: vec!["watermarkd".into(), "dashboards".into()],
            open_on_loopback: true,
            allowed_hosts: [
                "wmd-metrics",
                &format!("wmd-metrics.{NAMESPACE}"),
                &format!("wmd-metrics.{NAMESPACE}.svc")
            ]
            .into_iter()
            .chain(["watermarkd.example.com"])
            .map(String::from)
            .collect(),
        }
    );
}

#[test]
fn secrets_come_only_from_existing_secrets() {
    let objects = render(&["-f", EVERYTHING]);
    let deployment: Deployment = one(&objects, "Deployment");
    let c = container(&deployment);
    let env = env_of(&c);
    let from_secret = |name: &str| {
        let source = env.get(name).and_then(|e| e.value_from.clone()).and_then(|v| v.secret_key_ref);
        source.map(|s| (s.name, s.key, s.optional)).unwrap_or_else(|| panic!("env {name} from a Secret"))
    };
    assert_eq!(from_secret("DD_API_KEY"), ("dd-keys".into(), "api".into(), Some(false)));
    assert_eq!(from_secret("DD_APP_KEY"), ("dd-keys".into(), "app".into(), Some(false)));
    assert_eq!(from_secret("PROM_TOKEN"), ("prom-auth".into(), "token".into(), Some(false)));
    assert_eq!(from_secret("PROM_PASSWORD"), ("prom-auth".into(), "password".into(), Some(true)));
    // Literal values are the settings only; nothing secret is ever written into the pod spec.
    for var in env.values().filter(|e| e.value.is_some()) {
        assert!(var.name.starts_with("WATERMARKD__"), "env {} has a literal value", var.name);
    }
    let mount = mount_at(&c, "/etc/watermarkd-tls");
    assert_eq!(mount.read_only, Some(true));
    let volume =
        pod_spec(&deployment).volumes.unwrap_or_default().into_iter().find(|v| v.name == mount.name).expect("volume");
    assert_eq!(volume.secret.and_then(|s| s.secret_name).as_deref(), Some("prom-tls"));
    let mount = mount_at(&c, STATUS_TOKEN_DIR);
    let volume =
        pod_spec(&deployment).volumes.unwrap_or_default().into_iter().find(|v| v.name == mount.name).expect("volume");
    let secret = volume.secret.expect("a Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("wmd-status"));
    let items: Vec<(String, String)> = secret.items.unwrap_or_default().into_iter().map(|i| (i.key, i.path)).collect();
    assert_eq!(items, [("bearer".to_string(), "token".to_string())], "status.token.key, as the file token");

    let defaults = env_of(&container(&one(&render(&[]), "Deployment")));
    let source = defaults
        .get("DD_API_KEY")
        .and_then(|e| e.value_from.clone())
        .and_then(|v| v.secret_key_ref)
        .expect("DD_API_KEY");
    assert_eq!(
        (source.name.as_str(), source.key.as_str(), source.optional),
        ("watermarkd-datadog", "api-key", Some(true))
    );
    let none = env_of(&container(&one(&render(&["--set", "datadog.existingSecret="]), "Deployment")));
    assert!(!none.contains_key("DD_API_KEY") && !none.contains_key("DD_APP_KEY"), "no Secret named, no variables");
    // every_object_parses_as_its_type_with_the_recommended_labels_and_no_secret checks that no
    // rendering holds a Secret object.
}

#[test]
fn the_pod_disruption_budget_follows_the_api_versions_and_the_replica_count() {
    let api_version = |extra: &[&str]| -> Option<String> {
        let pdbs = of_kind(&render(extra), "PodDisruptionBudget");
        assert!(pdbs.len() <= 1);
        pdbs.first().map(|p| p.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default().to_string())
    };
    assert_eq!(api_version(&["--kube-version", "1.30.0"]).as_deref(), Some("policy/v1"));
    assert_eq!(api_version(&["--kube-version", "1.20.0"]).as_deref(), Some("policy/v1beta1"));
    assert_eq!(
        api_version(&["--kube-version", "1.20.0", "--api-versions", "policy/v1/PodDisruptionBudget"]).as_deref(),
        Some("policy/v1")
    );
    assert_eq!(api_version(&["--set", "replicaCount=1"]), None, "with one replica a PDB would block every drain");
    assert_eq!(api_version(&["--set", "podDisruptionBudget.enabled=false"]), None);
    let pdb: PodDisruptionBudget = one(&render(&["-f", EVERYTHING]), "PodDisruptionBudget");
    assert_eq!(
        pdb.spec.and_then(|s| s.min_available),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2))
    );
}

#[test]
fn the_service_monitor_is_rendered_only_when_enabled() {
    assert!(of_kind(&render(&[]), "ServiceMonitor").is_empty());
    let objects = render(&["-f", EVERYTHING]);
    let monitors = of_kind(&objects, "ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    let monitor = &monitors[0];
    assert_eq!(monitor.get("apiVersion").and_then(|v| v.as_str()), Some("monitoring.coreos.com/v1"));
    let labels = monitor["metadata"]["labels"].clone();
    assert_eq!(labels.get("release").and_then(|v| v.as_str()), Some("prometheus"));
    let selector: BTreeMap<String, String> =
        serde_yaml_ng::from_value(monitor["spec"]["selector"]["matchLabels"].clone()).expect("matchLabels");
    let service: Service = one(&objects, "Service");
    let service_labels = service.metadata.labels.clone().unwrap_or_default();
    assert!(selector.iter().all(|(k, v)| service_labels.get(k) == Some(v)), "selects the metrics Service");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint.get("port").and_then(|v| v.as_str()), Some("http-metrics"));
    assert_eq!(endpoint.get("interval").and_then(|v| v.as_str()), Some("15s"));
    let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
    assert!(ports.iter().any(|p| p.name.as_deref() == Some("http-metrics")));

    let output =
        helm(&["template", RELEASE, CHART, "--set", "serviceMonitor.enabled=true", "--set", "service.enabled=false"]);
    assert!(!output.status.success() && printed(&output).contains("service.enabled"), "{}", printed(&output));
}

#[test]
fn rbac_is_exactly_the_table_and_crd_mode_alone_brings_the_datadoghq_writes() {
    assert_same_grants(&rendered_grants(&render(&[]), "defaults"), &table(true), "the chart with its defaults");
    let without = rendered_grants(&render(&["--set", "crd.enabled=false"]), "crd.enabled=false");
    assert_same_grants(&without, &table(false), "the chart with crd.enabled=false");
    // Without CRD mode only the WPAs are read (the guard's), nothing of datadoghq.com written.
    let datadoghq: Vec<_> = without.iter().filter(|(_, group, _, _)| group == "datadoghq.com").collect();
    assert!(
        datadoghq.iter().all(|(_, _, resource, verb)| resource == "watermarkpodautoscalers" && verb != "patch"),
        "{datadoghq:?}"
    );
    assert!(rendered_grants(&render(&["--set", "rbac.create=false"]), "rbac.create=false").is_empty());

    // Custom scale targets: the verbs the README asks for, for that kind only (and the
    // TokenReviews of status.tokenReview, also on in that file).
    let granted = rendered_grants(&render(&["-f", EVERYTHING]), EVERYTHING);
    let mut wanted = table(false);
    for (resource, verb) in
        [("rollouts", "list"), ("rollouts", "watch"), ("rollouts/scale", "get"), ("rollouts/scale", "patch")]
    {
        wanted.insert((false, "argoproj.io".into(), resource.into(), verb.into()));
    }
    wanted.extend(token_review_grants());
    assert_same_grants(&granted, &wanted, "the chart with customScaleTargets and status.tokenReview");

    // The bindings give the roles, named after the release, to the chart's ServiceAccount.
    let objects = render(&["-f", EVERYTHING]);
    let binding: ClusterRoleBinding = named(&objects, "ClusterRoleBinding", "wmd").expect("ClusterRoleBinding wmd");
    assert_eq!(binding.role_ref.name, "wmd");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!((subjects[0].name.as_str(), subjects[0].namespace.as_deref()), ("wmd-sa", Some(NAMESPACE)));
    let binding: RoleBinding = one(&objects, "RoleBinding");
    assert_eq!(binding.role_ref.name, "wmd-namespaced");
    assert_eq!(binding.subjects.unwrap_or_default()[0].name, "wmd-sa");
}

#[test]
fn the_status_token_is_a_mounted_secret_and_token_review_a_cluster_role_of_its_own() {
    let objects = render(&["--set", "status.tokenReview=true", "--set", "status.token.existingSecret=wmd-status"]);

    // (a) One ClusterRole more, granting exactly create on TokenReviews and
    // SubjectAccessReviews, bound to the chart's ServiceAccount; the other roles stay exactly
    // the table.
    let role: ClusterRole = named(&objects, "ClusterRole", "watermarkd-tokenreview").expect("the tokenreview role");
    let granted = sorted_unique(grants_of_rules(&role.rules.unwrap_or_default(), false, "tokenreview"), "tokenreview");
    assert_eq!(granted, token_review_grants(), "the tokenreview role grants exactly that");
    let mut wanted = table(true);
    wanted.extend(token_review_grants());
    assert_same_grants(&rendered_grants(&objects, "tokenReview"), &wanted, "the chart with status.tokenReview");
    let baseline: ClusterRole = named(&objects, "ClusterRole", RELEASE).expect("the baseline role");
    let baseline = sorted_unique(grants_of_rules(&baseline.rules.unwrap_or_default(), false, "baseline"), "baseline");
    assert!(baseline.is_disjoint(&token_review_grants()), "the reviews stay out of the baseline ClusterRole");
    // The readers' role: exactly STATUS_READER, bound to nobody (the users bind it).
    let reader: ClusterRole =
        named(&objects, "ClusterRole", "watermarkd-status-reader").expect("the status-reader role");
    let granted = sorted_unique(grants_of_rules(&reader.rules.unwrap_or_default(), false, "status-reader"), "reader");
    assert_eq!(granted, sorted_unique(grants_of_table([&STATUS_READER]), "STATUS_READER"));
    let bindings: Vec<ClusterRoleBinding> =
        of_kind(&objects, "ClusterRoleBinding").iter().map(|b| typed("ClusterRoleBinding", b)).collect();
    assert!(bindings.iter().all(|b| !is_reader_role(&b.role_ref.name)), "the chart binds the reader role to no one");
    let binding: ClusterRoleBinding =
        named(&objects, "ClusterRoleBinding", "watermarkd-tokenreview").expect("the tokenreview binding");
    assert_eq!(
        (binding.role_ref.api_group.as_str(), binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()),
        ("rbac.authorization.k8s.io", "ClusterRole", "watermarkd-tokenreview")
    );
    let account: ServiceAccount = one(&objects, "ServiceAccount");
    let subjects: Vec<(String, String, Option<String>)> =
        binding.subjects.unwrap_or_default().into_iter().map(|s| (s.kind, s.name, s.namespace)).collect();
    assert_eq!(
        subjects,
        [("ServiceAccount".to_string(), account.metadata.name.clone().expect("a name"), Some(NAMESPACE.to_string()))]
    );

    // (b) watermarkd.toml has a [status] table with only what was set, and the daemon reads it.
    let configmap: ConfigMap = one(&objects, "ConfigMap");
    let text = configmap.data.unwrap_or_default().get("watermarkd.toml").cloned().expect("watermarkd.toml");
    let file: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("watermarkd.toml: {e}\n{text}"));
    let status = file.get("status").and_then(|s| s.as_table()).cloned().expect("a [status] table");
    let expected: toml::Table = toml::from_str(&format!(
        "token_review = true\ntoken_file = {STATUS_TOKEN_FILE:?}\nallowed_hosts = {SERVICE_HOSTS:?}"
    ))
    .expect("expected table");
    assert_eq!(status, expected, "[status] in\n{text}");
    let settings = daemon_settings(&objects);
    assert_eq!(
        settings.status,
        StatusSettings {
            token: Some(SecretSource::File(STATUS_TOKEN_FILE.into())),
            token_review: true,
            allowed_hosts: service_hosts(),
            ..StatusSettings::default()
        }
    );
    // The Secret is mounted read-only, as a directory (a new token reaches the pod), with its
    // key as the file token_file names.
    let deployment: Deployment = one(&objects, "Deployment");
    let c = container(&deployment);
    let mount = mount_at(&c, STATUS_TOKEN_DIR);
    assert_eq!(mount.read_only, Some(true));
    assert_eq!(mount.sub_path, None, "a directory mount, so that a new token reaches the pod");
    let volume =
        pod_spec(&deployment).volumes.unwrap_or_default().into_iter().find(|v| v.name == mount.name).expect("volume");
    let secret = volume.secret.expect("a Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("wmd-status"));
    assert_eq!(secret.optional, Some(false), "no Secret, no start: never an API left open");
    let items: Vec<(String, String)> = secret.items.unwrap_or_default().into_iter().map(|i| (i.key, i.path)).collect();
    assert_eq!(items, [("token".to_string(), "token".to_string())]);
    assert_eq!(Path::new(STATUS_TOKEN_DIR).join(&items[0].1), Path::new(STATUS_TOKEN_FILE));
    let env = env_of(&c);
    assert!(!env.keys().any(|k| k.starts_with("WATERMARKD__STATUS")), "the settings file carries [status]");

    // (c) The defaults: no tokenreview or reader role, no token mount; a [status] table with
    // only the Service's names as allowed hosts; the daemon's own defaults for the rest.
    let defaults = render(&[]);
    let review_objects = |objects: &[serde_yaml_ng::Value]| -> usize {
        let ours = |n: &str| n.ends_with("-tokenreview") || is_reader_role(n);
        objects.iter().filter(|o| o["metadata"]["name"].as_str().is_some_and(ours)).count()
    };
    assert_eq!(review_objects(&defaults), 0, "no tokenreview role or binding by default");
    let configmap: ConfigMap = one(&defaults, "ConfigMap");
    let text = configmap.data.unwrap_or_default().get("watermarkd.toml").cloned().expect("watermarkd.toml");
    let file: toml::Table = toml::from_str(&text).expect("watermarkd.toml");
    let status = file.get("status").and_then(|s| s.as_table()).cloned().expect("a [status] table");
    let expected: toml::Table = toml::from_str(&format!("allowed_hosts = {SERVICE_HOSTS:?}")).expect("expected");
    assert_eq!(status, expected, "[status] by default in\n{text}");
    assert_eq!(
        daemon_settings(&defaults).status,
        StatusSettings { allowed_hosts: service_hosts(), ..StatusSettings::default() }
    );
    // Without a Service there are no names to allow, and no [status] table.
    let no_service = render(&["--set", "service.enabled=false"]);
    assert_eq!(daemon_settings(&no_service).status, StatusSettings::default());
    let c = container(&one(&defaults, "Deployment"));
    assert!(c.volume_mounts.unwrap_or_default().iter().all(|m| m.mount_path != STATUS_TOKEN_DIR));

    // Without rbac.create there is no role at all; with the API off, no role and no mount, and
    // the daemon is told it is off.
    let no_rbac = render(&["--set", "status.tokenReview=true", "--set", "rbac.create=false"]);
    assert_eq!(review_objects(&no_rbac), 0);
    let off = render(&[
        "--set",
        "status.enabled=false",
        "--set",
        "status.tokenReview=true",
        "--set",
        "status.token.existingSecret=wmd-status",
    ]);
    assert_eq!(review_objects(&off), 0, "no TokenReviews while the status API is off");
    let c = container(&one(&off, "Deployment"));
    assert!(c.volume_mounts.unwrap_or_default().iter().all(|m| m.mount_path != STATUS_TOKEN_DIR));
    assert_eq!(daemon_settings(&off).status, StatusSettings { enabled: false, ..StatusSettings::default() });

    // The other keys: history, openOnLoopback, tokenAudiences and allowedHosts, through the file
    // and the environment; an empty tokenAudiences is the API server's own.
    let set = [
        "--set",
        "status.history=6h",
        "--set",
        "status.openOnLoopback=true",
        "--set",
        "status.tokenReview=true",
        "--set-json",
        "status.tokenAudiences=[\"dashboards\"]",
        "--set-json",
        "status.allowedHosts=[\"Status.Example.\"]",
    ];
    let mut existing = set.to_vec();
    existing.extend(["--set", "rules.existingConfigMap=my-rules"]);
    let mut hosts = service_hosts();
    hosts.push("status.example".into());
    for objects in [render(&set), render(&existing)] {
        let status = daemon_settings(&objects).status;
        assert_eq!(
            status,
            StatusSettings {
                history: std::time::Duration::from_secs(6 * 3_600),
                token_review: true,
                token_audiences: vec!["dashboards".into()],
                open_on_loopback: true,
                allowed_hosts: hosts.clone(),
                ..StatusSettings::default()
            }
        );
    }
    let mut existing = vec!["--set", "status.tokenReview=true", "--set-json", "status.tokenAudiences=[]"];
    for objects in [render(&existing), {
        existing.extend(["--set", "rules.existingConfigMap=my-rules"]);
        render(&existing)
    }] {
        assert_eq!(daemon_settings(&objects).status.token_audiences, Vec::<String>::new());
    }
}

/// The Service's names, which the chart allows as Host headers (release watermarkd in namespace
/// watermarkd).
const SERVICE_HOSTS: [&str; 3] =
    ["watermarkd-metrics", "watermarkd-metrics.watermarkd", "watermarkd-metrics.watermarkd.svc"];

fn service_hosts() -> Vec<String> {
    SERVICE_HOSTS.iter().map(|h| h.to_string()).collect()
}

/// The binary listens on 127.0.0.1 by default; the chart must bind every interface, on the port
/// the probes, the Service and the scrape annotations use, with the settings file and with the
/// environment alike.
#[test]
fn the_daemon_listens_on_every_interface_at_the_probed_port() {
    for objects in [render(&[]), render(&["--set", "rules.existingConfigMap=my-rules"])] {
        let listen = daemon_settings(&objects).listen;
        assert!(listen.ip().is_unspecified(), "the pod listens on every interface: {listen}");
        let deployment: Deployment = one(&objects, "Deployment");
        let c = container(&deployment);
        let port = c
            .ports
            .clone()
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.name.as_deref() == Some("http"))
            .expect("the http port");
        assert_eq!(i32::from(listen.port()), port.container_port, "the container port is the listener's");
        for (what, probe) in [("liveness", c.liveness_probe.clone()), ("readiness", c.readiness_probe.clone())] {
            let get = probe.and_then(|p| p.http_get).unwrap_or_else(|| panic!("an HTTP {what} probe"));
            let port = match get.port {
                IntOrString::String(name) => name,
                IntOrString::Int(number) => panic!("{what} probe on port {number}, not the named port"),
            };
            assert_eq!(port, "http", "the {what} probe uses the listener's port");
            assert!(get.host.is_none(), "the {what} probe goes to the pod's address");
        }
        let annotations =
            deployment.spec.and_then(|s| s.template.metadata).and_then(|m| m.annotations).unwrap_or_default();
        assert_eq!(annotations.get("prometheus.io/port"), Some(&listen.port().to_string()));
    }
}

#[test]
fn bad_values_are_refused_naming_the_field() {
    for (set, named) in [
        ("replicaCount=two", "replicaCount"),
        ("replicaCoun=2", "replicaCoun"),
        ("crd.instal=false", "instal"),
        ("settings.logFormat=xml", "settings.logFormat"),
        ("image.digest=latest", "image.digest"),
        ("settings.defaultInterval=soon", "settings.defaultInterval"),
        ("envFromSecrets[0].name=X", "secretName"),
        ("status.history=soon", "status.history"),
        ("status.tokenReveiw=true", "tokenReveiw"),
        ("status.token.existingSecret=Not_A_Name", "status.token.existingSecret"),
        ("status.allowedHosts[0]=http://x.example", "status.allowedHosts.0"),
        ("status.allowedHosts[0]=x.example:8080", "status.allowedHosts.0"),
        ("status.tokenAudiences[0]=", "status.tokenAudiences.0"),
    ] {
        let output = helm(&["template", RELEASE, CHART, "--set", set]);
        let text = printed(&output);
        assert!(!output.status.success(), "--set {set} was accepted");
        assert!(
            text.contains("schema") && text.contains(named),
            "--set {set}: the error does not name {named}:\n{text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A real API server

struct Installed {
    release: String,
    namespace: String,
}

fn install(kubeconfig: &Path, release: &str, namespace: &str, set: &[&str]) -> Installed {
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = vec!["install", release, CHART, "--namespace", namespace, "--kubeconfig", kubeconfig.as_str()];
    for value in set {
        args.extend(["--set", value]);
    }
    helm_ok(&args);
    Installed { release: release.into(), namespace: namespace.into() }
}

#[tokio::test]
async fn helm_install_grants_exactly_the_table_and_uninstall_keeps_only_the_crd() {
    let cluster = kube_cluster::KubeCluster::shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, kube_cluster::ADMIN_TOKEN);
    let watched = cluster.unique_namespace("watched").await;

    // CRD mode, limited to one namespace; the PodDisruptionBudget comes as policy/v1beta1 (1.20).
    let namespace = cluster.unique_namespace("chart-crd").await;
    let crd_mode = install(&kubeconfig, "wmd-crd", &namespace, &[&format!("watchNamespaces={{{watched}}}")]);
    let account = cluster.client_as(&format!("system:serviceaccount:{namespace}:wmd-crd-watermarkd"));
    // The reviews are not part of the defaults (status.tokenReview is off); the daemon is never
    // a reader of its own status.
    let token_reviews = [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        (STATUS_READER.api_group, STATUS_READER.resources[0]),
    ];
    let wrong = manifest_checks::access_problems(
        &account,
        &table(true),
        &namespace,
        &[&watched, "prod"],
        "default",
        &token_reviews,
    )
    .await;
    assert!(wrong.is_empty(), "the chart (CRD mode) on a real API server:\n{}", wrong.join("\n"));
    let pdbs: Api<kube::api::DynamicObject> = Api::namespaced_with(
        cluster.client(),
        &namespace,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget"),
            "poddisruptionbudgets",
        ),
    );
    pdbs.get("wmd-crd-watermarkd").await.expect("the PodDisruptionBudget");

    // Rules file only, next to it: a second release, no CRD of its own, no datadoghq.com access;
    // status.tokenReview on, which adds exactly the creation of TokenReviews and
    // SubjectAccessReviews.
    let other = cluster.unique_namespace("chart-rules").await;
    let rules_only = install(
        &kubeconfig,
        "wmd-rules",
        &other,
        &["crd.enabled=false", "crd.install=false", "status.tokenReview=true"],
    );
    let account = cluster.client_as(&format!("system:serviceaccount:{other}:wmd-rules-watermarkd"));
    let mut datadoghq: Vec<(&str, &str)> = PERMISSIONS
        .iter()
        .filter(|p| p.crd_mode_only)
        .flat_map(|p| p.resources.iter().map(|r| (p.api_group, *r)))
        .collect();
    datadoghq.push((STATUS_READER.api_group, STATUS_READER.resources[0]));
    let mut wanted = table(false);
    wanted.extend(token_review_grants());
    let wrong = manifest_checks::access_problems(&account, &wanted, &other, &["prod"], &namespace, &datadoghq).await;
    assert!(wrong.is_empty(), "the chart (rules file only) on a real API server:\n{}", wrong.join("\n"));

    // Uninstall: every object goes but the CRD, and with it any WPA objects.
    let kubeconfig_arg = kubeconfig.display().to_string();
    for installed in [&crd_mode, &rules_only] {
        helm_ok(&[
            "uninstall",
            &installed.release,
            "--namespace",
            &installed.namespace,
            "--kubeconfig",
            &kubeconfig_arg,
        ]);
    }
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    crds.get("watermarkpodautoscalers.datadoghq.com").await.expect("the CRD survives helm uninstall");
    let roles: Api<ClusterRole> = Api::all(cluster.client());
    for installed in [&crd_mode, &rules_only] {
        let name = format!("{}-watermarkd", installed.release);
        for role in [name.clone(), format!("{name}-tokenreview"), format!("{name}-status-reader")] {
            assert!(roles.get_opt(&role).await.expect("get ClusterRole").is_none(), "ClusterRole {role} left behind");
        }
        let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &installed.namespace);
        assert!(
            deployments.list(&Default::default()).await.expect("list").items.is_empty(),
            "a Deployment left behind"
        );
        let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client(), &installed.namespace);
        assert!(
            accounts.get_opt(&name).await.expect("get ServiceAccount").is_none(),
            "ServiceAccount {name} left behind"
        );
        let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), &installed.namespace);
        assert!(configmaps.get_opt(&name).await.expect("get ConfigMap").is_none(), "ConfigMap {name} left behind");
    }
}

/// The in-cluster URL the NOTES print names the Service the chart renders (`FULLNAME-metrics`)
/// on its port, and the note on an open status page names that Service too. `helm install
/// --dry-run` prints the NOTES with the manifest, on a real API server, creating nothing.
#[tokio::test]
async fn the_notes_name_the_service_the_chart_renders() {
    let cluster = kube_cluster::KubeCluster::shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, kube_cluster::ADMIN_TOKEN);
    let kubeconfig = kubeconfig.display().to_string();
    let dry_run = |set: &[&str]| {
        let mut args = vec!["install", "wd", CHART, "--namespace", "wd-test", "--kubeconfig", &kubeconfig, "--dry-run"];
        // The CRD may belong to another test's release on the shared API server: not this one's.
        args.extend(["--set", "crd.install=false"]);
        for value in set {
            args.extend(["--set", value]);
        }
        let printed = helm_ok(&args);
        let (manifest, notes) = printed.split_once("\nNOTES:\n").unwrap_or_else(|| panic!("no NOTES:\n{printed}"));
        let manifest = manifest.split_once("\nMANIFEST:\n").map_or(manifest, |(_, m)| m);
        let objects: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(manifest)
            .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
            .filter(|value: &serde_yaml_ng::Value| !value.is_null())
            .collect();
        let service: Service = one(&objects, "Service");
        let name = service.metadata.name.expect("the Service's name");
        let port = service.spec.and_then(|s| s.ports).and_then(|p| p.first().map(|p| p.port)).expect("its port");
        (name, port, notes.to_string())
    };

    let (service, port, notes) = dry_run(&["status.token.existingSecret=status-token"]);
    assert_eq!(service, "wd-watermarkd-metrics");
    let url = format!("watermarkd status --url http://{service}.wd-test.svc:{port} --token-file status-token");
    assert!(notes.contains(&url), "the NOTES do not give {url:?}:\n{notes}");
    assert!(!notes.contains("http://wd-watermarkd.wd-test.svc"), "a Service that does not exist:\n{notes}");

    let (service, _, notes) = dry_run(&[]);
    assert!(notes.contains(&format!("(or the Service {service})")), "{notes}");
}

/// Beside the Datadog controller: its chart's CRD exists without this release's ownership
/// annotations. `helm install` leaves it alone instead of failing on its ownership (or taking it
/// over), and `crd.selector` reaches the daemon's settings as `wpa_selector`.
#[tokio::test]
async fn a_crd_this_release_did_not_create_is_left_alone_and_the_selector_reaches_the_settings() {
    let cluster = kube_cluster::KubeCluster::shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, kube_cluster::ADMIN_TOKEN);
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    let name = "watermarkpodautoscalers.datadoghq.com";
    // As another chart (or kubectl) would have left it; another test of this file may have
    // installed it first through its own release, which is not this one either.
    if crds.get_opt(name).await.expect("get CRD").is_none() {
        let crd = watermarkd::domain::crd::custom_resource_definition();
        match crds.create(&kube::api::PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => panic!("create CRD: {err}"),
        }
    }
    let namespace = cluster.unique_namespace("chart-beside").await;
    let installed =
        install(&kubeconfig, "wmd-beside", &namespace, &["crd.selector=watermarkd.io/controller=watermarkd"]);
    let crd = crds.get(name).await.expect("the CRD");
    let owner = crd.metadata.annotations.as_ref().and_then(|a| a.get("meta.helm.sh/release-name")).cloned();
    assert_ne!(owner.as_deref(), Some("wmd-beside"), "not taken over: {:?}", crd.metadata.annotations);
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), &namespace);
    let settings = configmaps.get("wmd-beside-watermarkd").await.expect("the settings ConfigMap");
    let toml = settings.data.and_then(|d| d.get("watermarkd.toml").cloned()).unwrap_or_default();
    assert!(toml.contains("wpa_selector = \"watermarkd.io/controller=watermarkd\""), "{toml}");
    let kubeconfig_arg = kubeconfig.display().to_string();
    helm_ok(&["uninstall", &installed.release, "--namespace", &installed.namespace, "--kubeconfig", &kubeconfig_arg]);
    crds.get(name).await.expect("the CRD is still there");
}
