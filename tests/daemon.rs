//! `watermarkd run` end to end: the daemon as a separate process against a real kube-apiserver
//! (and a real Prometheus, or the local Datadog stand-in), driven by a rules file and by
//! WatermarkPodAutoscaler objects, checked through the `/scale` it writes, the status, events and
//! annotations it leaves, and its `/metrics`.
//!
//! Needs kube-apiserver, etcd and prometheus: scripts/install-test-deps installs them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[macro_use]
#[path = "support/eventually.rs"]
mod eventually;
#[path = "support/daemon_process.rs"]
mod daemon_process;
#[path = "support/fake_datadog.rs"]
mod fake_datadog;
#[path = "support/fake_recommender.rs"]
mod fake_recommender;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;
#[path = "support/wpa_status_shape.rs"]
mod wpa_status_shape;

use std::path::Path;
use std::time::Duration;

use daemon_process::{write, DaemonProcess};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube_cluster::{apps_v1, KubeCluster, ADMIN_TOKEN};
use prometheus_server::{Exporter, PrometheusServer};
use serde_json::{json, Value};
use watermarkd::domain::crd::{custom_resource_definition, WatermarkPodAutoscaler};

const STARTUP: Duration = Duration::from_secs(30);

async fn spec_replicas(cluster: &KubeCluster, kind: &str, namespace: &str, name: &str) -> i64 {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &apps_v1(kind));
    let object = api.get(name).await.unwrap_or_else(|e| panic!("get {kind} {namespace}/{name}: {e}"));
    object.data["spec"]["replicas"].as_i64().unwrap_or(-1)
}

async fn annotation(cluster: &KubeCluster, kind: &str, namespace: &str, name: &str, key: &str) -> Option<String> {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &apps_v1(kind));
    let object = api.get(name).await.ok()?;
    object.metadata.annotations.and_then(|a| a.get(key).cloned())
}

/// The persisted state of the rules-file autoscaler on `target` (`Deployment.apps ns/web`), as
/// JSON: from the state ConfigMaps in `daemon_namespace`, found by their label and the target
/// they name (not by the name the daemon gives them).
async fn persisted_state(cluster: &KubeCluster, daemon_namespace: &str, target: &str) -> Option<Value> {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), daemon_namespace);
    let listed = api.list(&ListParams::default().labels("watermarkd.io/role=state")).await.expect("list ConfigMaps");
    let data = listed
        .items
        .into_iter()
        .filter_map(|c| c.data)
        .find(|d| d.get("target").map(String::as_str) == Some(target))?;
    Some(serde_json::from_str(data.get("state")?).expect("JSON state"))
}

async fn events_about(cluster: &KubeCluster, namespace: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(cluster.client(), namespace);
    let list = api.list(&ListParams::default()).await.expect("list events");
    list.items.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)).collect()
}

/// Ok when `name` has a Warning event with `reason`; else the events it has.
async fn warned(cluster: &KubeCluster, namespace: &str, name: &str, reason: &str) -> Result<(), String> {
    let events = events_about(cluster, namespace, name).await;
    if events.iter().any(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason)) {
        Ok(())
    } else {
        Err(format!("{events:?}"))
    }
}

fn kubeconfig(cluster: &KubeCluster, dir: &Path, token: &str) -> String {
    let path = dir.join("kubeconfig");
    cluster.write_kubeconfig(&path, token);
    path.display().to_string()
}

/// A rules file with one Prometheus backend and one autoscaler per `(name, kind, query)`.
fn rules(prometheus: &str, namespace: &str, autoscalers: &[(&str, &str, &str)], extra: &str) -> String {
    let mut text = format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"{prometheus}\"\n");
    for (name, kind, query) in autoscalers {
        text.push_str(&format!(
            "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"{kind}\", namespace = \"{namespace}\", name = \"{name}\" }}\n\
             interval = \"1s\"\nmin_replicas = 1\nmax_replicas = 10\nalgorithm = \"absolute\"\n\
             upscale_forbidden_window = \"1s\"\ndownscale_forbidden_window = \"1s\"\n{extra}\n\
             [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = '{query}'\nhigh_watermark = 10\nlow_watermark = 5\n"
        ));
    }
    text
}

/// Grants `user` what deploy/rbac.yaml grants the daemon's ServiceAccount (the ClusterRole
/// cluster-wide, the Role in `namespace`), under names of this test's own.
async fn grant_deploy_rbac(cluster: &KubeCluster, namespace: &str, user: &str) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml"))
        .expect("deploy/rbac.yaml");
    let subject = json!([{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }]);
    let mut documents = 0;
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document).expect("a YAML document");
        let name = format!("e2e-{namespace}");
        match value["kind"].as_str() {
            Some("ClusterRole") => {
                let mut role: ClusterRole = serde_json::from_value(value).expect("ClusterRole");
                role.metadata = kube::api::ObjectMeta { name: Some(name.clone()), ..Default::default() };
                let api: Api<ClusterRole> = Api::all(cluster.client());
                api.create(&PostParams::default(), &role).await.expect("create ClusterRole");
                let binding: ClusterRoleBinding = serde_json::from_value(json!({
                    "metadata": { "name": name },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
                    "subjects": subject,
                }))
                .expect("binding");
                let api: Api<ClusterRoleBinding> = Api::all(cluster.client());
                api.create(&PostParams::default(), &binding).await.expect("create ClusterRoleBinding");
                documents += 1;
            }
            Some("Role") => {
                let mut role: Role = serde_json::from_value(value).expect("Role");
                role.metadata = kube::api::ObjectMeta { name: Some(name.clone()), ..Default::default() };
                let api: Api<Role> = Api::namespaced(cluster.client(), namespace);
                api.create(&PostParams::default(), &role).await.expect("create Role");
                let binding: RoleBinding = serde_json::from_value(json!({
                    "metadata": { "name": name },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
                    "subjects": subject,
                }))
                .expect("binding");
                let api: Api<RoleBinding> = Api::namespaced(cluster.client(), namespace);
                api.create(&PostParams::default(), &binding).await.expect("create RoleBinding");
                documents += 1;
            }
            _ => {}
        }
    }
    assert_eq!(documents, 2, "deploy/rbac.yaml has one ClusterRole and one Role");
}

/// The rules file drives a Deployment up and a StatefulSet down from a real Prometheus, with no
/// more rights than deploy/rbac.yaml grants; the state it needs after a restart is on the
/// targets, events say what happened, and /metrics has the wpa_controller series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_file_scales_a_deployment_and_a_statefulset_from_prometheus() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("e2e-file").await;
    cluster.create_deployment(&ns, "web", 2).await;
    cluster.set_workload_status("Deployment", &ns, "web", 2, 2).await;
    cluster.create_statefulset(&ns, "db", 4).await;
    cluster.set_workload_status("StatefulSet", &ns, "db", 4, 4).await;
    let exporter = Exporter::start("load{app=\"web\"} 30\nload{app=\"db\"} 1\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    let web = ("web", "Deployment", "load{app=\"web\"}");
    let db = ("db", "StatefulSet", "load{app=\"db\"}");
    write(&config, &rules(&prometheus.url(), &ns, &[web, db], ""));
    grant_deploy_rbac(cluster, &ns, "writer").await;
    let kubeconfig = kubeconfig(cluster, dir.path(), "writer-token");
    let mut daemon = DaemonProcess::start(
        &["--config", config.to_str().expect("utf-8"), "--kubeconfig", &kubeconfig, "--lease-namespace", &ns],
        &[],
    );
    daemon.wait_ready(STARTUP).await;

    // 30 against a high watermark of 10: up, by at most the default 50% per scale.
    eventually!(Duration::from_secs(20), "web scaled up", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas > 2 {
            Ok(replicas)
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    // 1 against a low watermark of 5: down.
    eventually!(Duration::from_secs(20), "db scaled down", {
        let replicas = spec_replicas(cluster, "StatefulSet", &ns, "db").await;
        if replicas < 4 {
            Ok(replicas)
        } else {
            Err(format!("{replicas} replicas"))
        }
    });

    let state = persisted_state(cluster, &ns, &format!("Deployment.apps {ns}/web")).await.expect("a state ConfigMap");
    assert_eq!(state["autoscaler"], "web");
    assert_eq!(state["v"], 2, "the current, compact format: {state}");
    assert!(state["state"]["last_scale"].is_i64(), "in Unix milliseconds: {state}");

    let events = eventually!(Duration::from_secs(10), "a scaling event", {
        let events = events_about(cluster, &ns, "web").await;
        if events.iter().any(|e| e.reason.as_deref() == Some("ScaledUp")) {
            Ok(events)
        } else {
            Err(format!("{events:?}"))
        }
    });
    let scaled = events.iter().find(|e| e.reason.as_deref() == Some("ScaledUp")).expect("ScaledUp");
    assert!(scaled.note.as_deref().unwrap_or_default().starts_with("New size: "), "{scaled:?}");

    let labels = [("wpa_name", "web"), ("resource_kind", "Deployment"), ("metric_name", "load")];
    assert_eq!(daemon.sample("wpa_controller_value", &labels).await, Some(30.0));
    assert_eq!(daemon.sample("wpa_controller_high_watermark", &labels).await, Some(10.0));
    assert_eq!(daemon.sample("wpa_controller_low_watermark", &labels).await, Some(5.0));
    assert_eq!(daemon.sample("wpa_controller_max_replicas", &[("wpa_name", "db")]).await, Some(10.0));
    assert!(daemon.sample("wpa_controller_upscale_replicas_total", &[("wpa_name", "web")]).await.unwrap_or(0.0) >= 1.0);
    assert!(
        daemon.sample("wpa_controller_downscale_replicas_total", &[("wpa_name", "db")]).await.unwrap_or(0.0) >= 1.0
    );
    assert_eq!(daemon.sample("watermarkd_leader", &[]).await, Some(1.0));
    assert!(daemon
        .sample("watermarkd_kubernetes_writes_total", &[("kind", "scale"), ("outcome", "ok")])
        .await
        .is_some());

    // Everything the daemon asked of the API server was allowed by deploy/rbac.yaml.
    let refused: Vec<_> = cluster.requests_by("writer").into_iter().filter(|r| r.code == 403).collect();
    assert!(refused.is_empty(), "requests refused under deploy/rbac.yaml: {refused:#?}");
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM; log:\n{}", daemon.log());
}

/// The common scenario: namespace `PREFIX-...` with one Deployment (`replicas`, all ready), an
/// exporter serving `load`, a real Prometheus scraping it, and a rules file with one autoscaler
/// for the Deployment on `load` (watermarks 5..10, interval 1s), as `edit` leaves it.
struct Setup {
    ns: String,
    exporter: Exporter,
    prometheus: PrometheusServer,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    kubeconfig: String,
    valid_rules: String,
}

impl Setup {
    async fn start(prefix: &str, name: &str, replicas: i32, load: &str, edit: impl FnOnce(String) -> String) -> Setup {
        let cluster = KubeCluster::shared();
        let ns = cluster.unique_namespace(prefix).await;
        cluster.create_deployment(&ns, name, replicas).await;
        cluster.set_workload_status("Deployment", &ns, name, replicas, replicas).await;
        let exporter = Exporter::start(load).await;
        let prometheus = PrometheusServer::start(&exporter.target()).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("rules.toml");
        let valid_rules = edit(rules(&prometheus.url(), &ns, &[(name, "Deployment", "load")], ""));
        write(&config, &valid_rules);
        let kubeconfig = kubeconfig(cluster, dir.path(), ADMIN_TOKEN);
        Setup { ns, exporter, prometheus, dir, config, kubeconfig, valid_rules }
    }

    /// `--config RULES --kubeconfig KUBECONFIG --lease-namespace NS` (the state ConfigMaps go
    /// to the test's own namespace, with or without election), then `extra`.
    fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "--config",
            self.config.to_str().expect("utf-8"),
            "--kubeconfig",
            &self.kubeconfig,
            "--lease-namespace",
            &self.ns,
        ];
        args.extend_from_slice(extra);
        args
    }
}

/// What someone does by hand: `kubectl scale`.
async fn manual_scale(cluster: &KubeCluster, kind: &str, namespace: &str, name: &str, replicas: i64) {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &apps_v1(kind));
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": replicas } })))
        .await
        .expect("manual scale");
}

/// The workload controller's part, which no controller-manager plays here: status follows spec.
async fn follow_spec(cluster: &KubeCluster, kind: &str, namespace: &str, name: &str) {
    let replicas = spec_replicas(cluster, kind, namespace, name).await;
    let replicas = i32::try_from(replicas).expect("replicas");
    cluster.set_workload_status(kind, namespace, name, replicas, replicas).await;
}

/// A person scales by hand while the daemon runs: the daemon works from the new count (its
/// write carries the resourceVersion it decided on, so it can never overwrite a newer count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_scale_is_kept_and_later_decisions_start_from_it() {
    let cluster = KubeCluster::shared();
    // 8: inside the band [5, 10], so the daemon holds whatever the count is.
    let setup = Setup::start("e2e-manual", "api", 2, "load 8\n", |r| r).await;
    let (ns, exporter) = (setup.ns.clone(), &setup.exporter);
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[]);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(10), "a decision on 8", {
        match daemon.sample("wpa_controller_value", &[("wpa_name", "api")]).await {
            Some(8.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    manual_scale(cluster, "Deployment", &ns, "api", 6).await;
    cluster.set_workload_status("Deployment", &ns, "api", 6, 6).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "api").await, 6, "the manual count stays");

    // Now over the high watermark: up from 6, by the default 50%, to 9, within one interval
    // (1s) of Prometheus having the value (it scrapes every 1s; 2s more for a loaded machine).
    exporter.set("load 30\n");
    let crossed = std::time::Instant::now();
    let replicas = eventually!(Duration::from_secs(15), "scaled up from the manual count", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "api").await;
        if replicas > 6 {
            Ok(replicas)
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    let reaction = crossed.elapsed();
    assert_eq!(replicas, 9, "6 + 50%, not 2 + 50%");
    assert!(reaction < Duration::from_secs(4), "scaled {reaction:?} after the value crossed");

    // Once the workload runs 9, the next scale goes to the maximum: each scale is its own event
    // with its own sizes, not a series that keeps the first note.
    follow_spec(cluster, "Deployment", &ns, "api").await;
    let notes = eventually!(Duration::from_secs(15), "one ScaledUp event per scale", {
        let mut notes: Vec<String> = events_about(cluster, &ns, "api")
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ScaledUp"))
            .map(|e| e.note.unwrap_or_default())
            .collect();
        notes.sort();
        if notes.len() >= 2 {
            Ok(notes)
        } else {
            Err(format!("{notes:?}"))
        }
    });
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].starts_with("New size: 10; old size: 9; reason: "), "{notes:?}");
    assert!(notes[1].starts_with("New size: 9; old size: 6; reason: "), "{notes:?}");
}

/// A shadow rule beside the active one: decided at every evaluation on the same readings, its
/// would-be replicas and divergences exported, and never written: the target follows the active
/// rule alone, and the state on it is the active rule's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_reports_what_it_would_do_and_never_writes() {
    let cluster = KubeCluster::shared();
    // 7: inside the active rule's band [5, 10]; above the shadow's [2, 4].
    let setup = Setup::start("e2e-shadow", "web", 2, "load 7\n", |text| {
        let active = &text[text.find("\n[[autoscaler]]").expect("an autoscaler")..];
        let shadow = active
            .replacen("name = \"web\"\n", "name = \"web-next\"\nshadow = true\n", 1)
            .replace("high_watermark = 10\nlow_watermark = 5", "high_watermark = 4\nlow_watermark = 2");
        assert!(shadow.contains("shadow = true") && shadow.contains("high_watermark = 4"), "{shadow}");
        format!("{text}{shadow}")
    })
    .await;
    let ns = setup.ns.clone();
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[]);
    daemon.wait_ready(STARTUP).await;
    let shadow = [("wpa_name", "web"), ("shadow", "web-next")];
    let divergences = eventually!(Duration::from_secs(20), "the shadow diverging on several evaluations", {
        match daemon.sample("watermarkd_shadow_divergence_total", &shadow).await {
            Some(n) if n >= 3.0 => Ok(n),
            other => Err(format!("{other:?}")),
        }
    });
    // 2 + the default 50%: what the shadow would do, while the active rule holds at 2.
    assert_eq!(daemon.sample("watermarkd_shadow_replicas", &shadow).await, Some(3.0));
    assert_eq!(daemon.sample("wpa_controller_replicas_scaling_effective", &[("wpa_name", "web")]).await, Some(2.0));
    let evaluations = daemon.sample("watermarkd_shadow_evaluations_total", &shadow).await.expect("evaluations");
    assert!(evaluations >= divergences, "{evaluations} evaluations, {divergences} divergences");
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 2, "the shadow never writes");
    assert!(
        daemon.sample("wpa_controller_value", &[("wpa_name", "web-next")]).await.is_none(),
        "a shadow has no autoscaler series of its own"
    );
    assert!(daemon.log().contains("the shadow rule diverges from the active rule"), "{}", daemon.log());

    // Both rules agree below the shadow's band too (1 < 2 and < 5): the active scales down, the
    // shadow would have done the same, and the divergences stop counting.
    setup.exporter.set("load 1\n");
    eventually!(Duration::from_secs(20), "the active rule scaling down", {
        match spec_replicas(cluster, "Deployment", &ns, "web").await {
            1 => Ok(()),
            n => Err(format!("{n} replicas")),
        }
    });
    follow_spec(cluster, "Deployment", &ns, "web").await;
    let settled = eventually!(Duration::from_secs(20), "agreement", {
        let before = daemon.sample("watermarkd_shadow_divergence_total", &shadow).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = daemon.sample("watermarkd_shadow_divergence_total", &shadow).await;
        if before == after {
            Ok(after)
        } else {
            Err(format!("{before:?} -> {after:?}"))
        }
    });
    assert!(settled >= Some(divergences), "a counter never goes back: {settled:?}");
    assert!(daemon.log().contains("the shadow rule agrees again"), "{}", daemon.log());
    let state = persisted_state(cluster, &ns, &format!("Deployment.apps {ns}/web")).await.expect("state");
    assert_eq!(state["autoscaler"], "web", "the active rule's state: {state}");
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM; log:\n{}", daemon.log());
}

/// A schedule's window raises the floor on the real API server: a workload whose load sits in
/// its band is scaled up to the window's floor, and the Event says which window did it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_schedule_window_raises_the_floor_and_says_so() {
    let cluster = KubeCluster::shared();
    // 7 is inside [5, 10] at 2 replicas: the metric alone holds.
    let setup = Setup::start("e2e-schedule", "web", 2, "load 7\n", |text| {
        format!(
            "{text}\n[[autoscaler.schedule]]\nname = \"all-day\"\ntime_zone = \"Europe/Paris\"\ndays = [\"daily\"]\n\
             start = \"00:00\"\nend = \"00:00\"\nmin_replicas = 4\n"
        )
    })
    .await;
    let ns = setup.ns.clone();
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[]);
    daemon.wait_ready(STARTUP).await;
    reaches(cluster, &ns, "web", 4, Duration::from_secs(20)).await;
    let said = eventually!(Duration::from_secs(20), "an Event naming the window", {
        let events = events_about(cluster, &ns, "web").await;
        let messages: Vec<String> = events.iter().filter_map(|e| e.note.clone()).collect();
        match messages.iter().find(|m| m.contains("schedule \"all-day\"")) {
            Some(message) => Ok(message.clone()),
            None => Err(format!("{messages:?}")),
        }
    });
    assert!(said.contains("raised by schedule \"all-day\" (open)"), "{said}");
    // The floor holds: the load in its band neither raises nor lowers it.
    stays_at(cluster, &ns, "web", 4, 3).await;
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM; log:\n{}", daemon.log());
}

/// A declared fallback on the real API server: a query that returns nothing is no data, and
/// once it has been so for the fallback's `after`, the workload goes to the fallback's count and
/// an Event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_fallback_goes_to_its_count_once_the_data_has_been_missing_long_enough() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-fallback", "web", 2, "load 7\n", |text| {
        // A metric nobody exports: Prometheus answers with no series, which is no data.
        let text = text.replace("query = 'load'", "query = 'absent_metric_of_this_test'");
        format!("{text}\n[autoscaler.fallback]\nafter = \"3s\"\naction = \"replicas\"\nreplicas = 5\n")
    })
    .await;
    assert!(setup.valid_rules.contains("absent_metric_of_this_test"), "{}", setup.valid_rules);
    let ns = setup.ns.clone();
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[]);
    daemon.wait_ready(STARTUP).await;
    reaches(cluster, &ns, "web", 5, Duration::from_secs(30)).await;
    let said = eventually!(Duration::from_secs(20), "a FallbackEntered Event", {
        let events = events_about(cluster, &ns, "web").await;
        match events.iter().find(|e| e.reason.as_deref() == Some("FallbackEntered")) {
            Some(event) => Ok(event.note.clone().unwrap_or_default()),
            None => Err(format!("{:?}", events.iter().map(|e| &e.reason).collect::<Vec<_>>())),
        }
    });
    assert_eq!(said, "no usable metric value for 3s: falling back to 5 replicas");
    assert_eq!(daemon.sample("watermarkd_fallback_active", &[("wpa_name", "web")]).await, Some(1.0));
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM; log:\n{}", daemon.log());
}

/// A forecast asks its backend for its history once when it starts; a Prometheus with only
/// minutes of data cannot give two days, so it says so and the autoscaler scales on as always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forecast_reads_its_history_from_the_backend_and_without_one_scales_as_always() {
    let cluster = KubeCluster::shared();
    // 30 at 2 replicas, average: 15 each, above [5, 10]: the rule scales up.
    let setup = Setup::start("e2e-forecast", "web", 2, "load 30\n", |text| {
        let text = text.replace("algorithm = \"absolute\"", "algorithm = \"average\"");
        format!("{text}\n[autoscaler.forecast]\nlead_time = \"5m\"\nmode = \"scale\"\n")
    })
    .await;
    let ns = setup.ns.clone();
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[]);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(30), "the history asked of Prometheus", {
        let log = daemon.log();
        if log.contains("the forecast could not read its history") || log.contains("the forecast read its history") {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    });
    eventually!(Duration::from_secs(30), "a scale up on the metric alone", {
        match spec_replicas(cluster, "Deployment", &ns, "web").await {
            n if n > 2 => Ok(n),
            n => Err(format!("{n} replicas")),
        }
    });
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM; log:\n{}", daemon.log());
}

/// Holds `replicas` on the Deployment for `seconds`, failing at the first other count.
async fn stays_at(cluster: &KubeCluster, ns: &str, name: &str, replicas: i64, seconds: u64) {
    for _ in 0..seconds * 2 {
        let now = spec_replicas(cluster, "Deployment", ns, name).await;
        assert_eq!(now, replicas, "the count moved from {replicas}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn reaches(cluster: &KubeCluster, ns: &str, name: &str, replicas: i64, within: Duration) {
    eventually!(within, &format!("{name} at {replicas}"), {
        match spec_replicas(cluster, "Deployment", ns, name).await {
            n if n == replicas => Ok(()),
            n => Err(format!("{n} replicas")),
        }
    });
}

/// Scale to zero on the real API server: an idle worker goes 1 -> 0 after the delay, a value at
/// the activation does not wake it, a restart at zero keeps it there and still knows the zero
/// is its own (activity wakes it 0 -> 1), activity above the activation keeps it at one for
/// many delays, and a zero a person sets is a pause that activity does not undo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_to_zero_wakes_on_activation_and_sleeps_after_the_delay() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-zero", "worker", 1, "load 0\n", |text| {
        text.replace("min_replicas = 1\n", "min_replicas = 0\nscale_to_zero_delay = \"3s\"\ntolerate_zero = true\n")
            .replace("low_watermark = 5\n", "low_watermark = 5\nactivation = 5\n")
    })
    .await;
    assert!(setup.valid_rules.contains("activation = 5"), "{}", setup.valid_rules);
    let (ns, exporter) = (setup.ns.clone(), &setup.exporter);
    let args = setup.args(&["--no-leader-election"]);
    let mut daemon = DaemonProcess::start(&args, &[]);
    daemon.wait_ready(STARTUP).await;

    // Idle: to zero once the 3 s delay has run.
    let idle = std::time::Instant::now();
    reaches(cluster, &ns, "worker", 0, Duration::from_secs(20)).await;
    assert!(idle.elapsed() >= Duration::from_secs(3), "to zero after {:?}, before the delay", idle.elapsed());
    cluster.set_workload_status("Deployment", &ns, "worker", 0, 0).await;
    let state = persisted_state(cluster, &ns, &format!("Deployment.apps {ns}/worker")).await.expect("state");
    assert!(state["state"]["scaled_to_zero_at"].is_i64(), "recorded as this rule's zero: {state}");

    // Exactly at the activation is not above it: it sleeps on.
    exporter.set("load 5\n");
    stays_at(cluster, &ns, "worker", 0, 4).await;

    // A restart while at zero: still at zero, and still its own zero.
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
    let mut daemon = DaemonProcess::start(&args, &[]);
    daemon.wait_ready(STARTUP).await;
    stays_at(cluster, &ns, "worker", 0, 4).await;
    assert_eq!(daemon.sample("wpa_controller_replicas_scaling_effective", &[("wpa_name", "worker")]).await, Some(0.0));
    exporter.set("load 8\n");
    reaches(cluster, &ns, "worker", 1, Duration::from_secs(10)).await;
    cluster.set_workload_status("Deployment", &ns, "worker", 1, 1).await;

    // Active (8 > 5) and inside the band: one replica, for three times the delay.
    stays_at(cluster, &ns, "worker", 1, 9).await;

    // A person scales it to zero: a pause, which activity does not undo.
    manual_scale(cluster, "Deployment", &ns, "worker", 0).await;
    cluster.set_workload_status("Deployment", &ns, "worker", 0, 0).await;
    stays_at(cluster, &ns, "worker", 0, 4).await;
    assert!(daemon.log().contains("the workload is paused by a person"), "{}", daemon.log());
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}

/// A custom resource with a scale subresource is scaled like a Deployment, and an autoscaler
/// whose target does not exist fails alone: the others keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_scales_and_a_missing_target_fails_alone() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("e2e-custom").await;
    let group = "e2e.test.watermarkd.io";
    cluster.create_crd(&kube_cluster::widget_crd(group)).await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &resource);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": { "name": "gadget" }, "spec": { "size": 2 },
    }))
    .expect("widget");
    widgets.create(&PostParams::default(), &widget).await.expect("create widget");
    cluster.patch_status(&resource, &ns, "gadget", json!({ "count": 2, "readyReplicas": 2 })).await;

    let exporter = Exporter::start("load 30\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    let mut text = rules(&prometheus.url(), &ns, &[("ghost", "Deployment", "load")], "");
    text.push_str(&format!(
        "\n[[autoscaler]]\nname = \"gadget\"\n\
         target = {{ api_version = \"{group}/v1\", kind = \"Widget\", namespace = \"{ns}\", name = \"gadget\" }}\n\
         interval = \"1s\"\nmin_replicas = 1\nmax_replicas = 10\nalgorithm = \"absolute\"\n\
         [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = \"load\"\nhigh_watermark = 10\nlow_watermark = 5\n"
    ));
    write(&config, &text);
    let kubeconfig = kubeconfig(cluster, dir.path(), ADMIN_TOKEN);
    let mut daemon = DaemonProcess::start(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "--kubeconfig",
            &kubeconfig,
            "--no-leader-election",
            "--lease-namespace",
            &ns,
        ],
        &[],
    );
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(20), "the widget scaled", {
        let object = widgets.get("gadget").await.expect("get widget");
        let size = object.data["spec"]["size"].as_i64().unwrap_or(0);
        if size > 2 {
            Ok(size)
        } else {
            Err(format!("size {size}"))
        }
    });
    assert_eq!(daemon.sample("wpa_controller_scaling_active", &[("wpa_name", "ghost")]).await, Some(0.0));
    assert_eq!(daemon.sample("wpa_controller_scaling_active", &[("wpa_name", "gadget")]).await, Some(1.0));
    let log = daemon.log();
    assert!(
        log.lines()
            .any(|l| l.contains("cannot read the target") && l.contains("ghost") && l.contains("does not exist")),
        "the missing target is reported; log:\n{log}"
    );
}

/// After `kill -9` and a restart inside a forbidden window, the window is honoured as if the
/// daemon had never stopped: no scale before it ends, a scale right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_kill_9_keeps_the_forbidden_window() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-restart", "web", 2, "load 30\n", |r| {
        r.replace("upscale_forbidden_window = \"1s\"", "upscale_forbidden_window = \"12s\"")
    })
    .await;
    let ns = setup.ns.clone();
    let args = setup.args(&[]);
    let mut daemon = DaemonProcess::start(&args, &[("WATERMARKD__LEASE__IDENTITY", "restarting")]);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(15), "the first scale", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas == 3 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    let scaled_at = std::time::Instant::now();
    follow_spec(cluster, "Deployment", &ns, "web").await;
    daemon.kill9();

    let mut daemon = DaemonProcess::start(&args, &[("WATERMARKD__LEASE__IDENTITY", "restarting")]);
    daemon.wait_ready(STARTUP).await;
    // Until 12 s after the scale (less a margin for the time the test took to see it), the
    // restarted daemon evaluates (load 30, over the watermark) and must hold.
    while scaled_at.elapsed() < Duration::from_secs(10) {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        assert_eq!(replicas, 3, "scaled again {:?} after the first scale, inside the 12s window", scaled_at.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        daemon.log().contains("upscale forbidden") || daemon.log().contains("forbidden window"),
        "the restarted daemon held because of the window; log:\n{}",
        daemon.log()
    );
    eventually!(Duration::from_secs(8), "the scale after the window", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas > 3 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
}

/// An upgrade from a version that kept the state in an annotation on the target: the daemon
/// restores from it (the forbidden window of a scale just before holds), writes the state to
/// its ConfigMap at once, and leaves the target itself alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_annotation_of_an_earlier_version_is_restored_and_moved_to_a_configmap() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-upgrade", "web", 2, "load 30\n", |r| {
        r.replace("upscale_forbidden_window = \"1s\"", "upscale_forbidden_window = \"12s\"")
    })
    .await;
    let ns = setup.ns.clone();
    let scaled_at = std::time::Instant::now();
    let now_ms = i64::try_from(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis(),
    )
    .expect("milliseconds fit");
    let old = json!({ "v": 2, "autoscaler": "web", "state": { "last_scale": now_ms } }).to_string();
    let deployments: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &apps_v1("Deployment"));
    let patch = json!({ "metadata": { "annotations": { "watermarkd.io/state": old } } });
    deployments.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotate");

    let mut daemon = DaemonProcess::start(&setup.args(&[]), &[]);
    daemon.wait_ready(STARTUP).await;
    let target = format!("Deployment.apps {ns}/web");
    let state = eventually!(Duration::from_secs(10), "the state in a ConfigMap", {
        persisted_state(cluster, &ns, &target).await.ok_or("no state ConfigMap yet")
    });
    assert_eq!(state["autoscaler"], "web");
    assert_eq!(state["state"]["last_scale"], now_ms, "the annotation's scale time, carried over: {state}");
    // Load 30 is over the watermark, but the window of the scale recorded in the annotation holds.
    while scaled_at.elapsed() < Duration::from_secs(10) {
        assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 2, "scaled inside the 12s window");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reaches(cluster, &ns, "web", 3, Duration::from_secs(8)).await;
    assert_eq!(
        annotation(cluster, "Deployment", &ns, "web", "watermarkd.io/state").await.as_deref(),
        Some(old.as_str()),
        "the annotation is left as it was: the daemon does not write to the target"
    );
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}

/// Two daemons, one Lease: only the leader writes; when it dies the other takes over within
/// the lease duration and scaling goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follower_takes_over_when_the_leader_dies() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-failover", "web", 1, "load 8\n", |r| r).await;
    let (ns, exporter) = (setup.ns.clone(), &setup.exporter);
    let args = setup.args(&["--lease-duration", "4s"]);
    let lease_env = [("WATERMARKD__LEASE__RENEW_DEADLINE", "3s"), ("WATERMARKD__LEASE__RETRY_PERIOD", "500ms")];
    let mut first =
        DaemonProcess::start(&args, &[lease_env[0], lease_env[1], ("WATERMARKD__LEASE__IDENTITY", "first")]);
    first.wait_ready(STARTUP).await;
    let mut second =
        DaemonProcess::start(&args, &[lease_env[0], lease_env[1], ("WATERMARKD__LEASE__IDENTITY", "second")]);
    second.wait_ready(STARTUP).await;
    assert_eq!(first.sample("watermarkd_leader", &[]).await, Some(1.0), "the first daemon leads");
    assert_eq!(second.sample("watermarkd_leader", &[]).await, Some(0.0), "the second follows");

    exporter.set("load 30\n");
    eventually!(Duration::from_secs(15), "the leader scales", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas > 1 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    assert!(second.log().lines().all(|l| !l.contains("scaled workload")), "the follower never scaled");

    first.kill9();
    let killed = std::time::Instant::now();
    exporter.set("load 8\n");
    follow_spec(cluster, "Deployment", &ns, "web").await;
    let before = spec_replicas(cluster, "Deployment", &ns, "web").await;
    eventually!(Duration::from_secs(8), "the second daemon leads", {
        match second.sample("watermarkd_leader", &[]).await {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let took = killed.elapsed();
    assert!(took <= Duration::from_secs(6), "took over {took:?} after the leader died (lease 4s)");
    exporter.set("load 30\n");
    eventually!(Duration::from_secs(15), "the new leader scales", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas > before {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    assert!(second.log().contains("scaled"), "the second daemon wrote the scale");
}

/// Rules reloads: an invalid file keeps the old rules running (and is counted), a valid change
/// applies on SIGHUP, and an unchanged autoscaler keeps its state across it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_reload_keeps_the_old_rules_and_sighup_applies_a_valid_one() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-reload", "web", 2, "load 8\n", |r| r).await;
    let ns = setup.ns.clone();
    let (exporter, dir, config, valid) = (&setup.exporter, &setup.dir, setup.config.clone(), &setup.valid_rules);
    // systemd's side of Type=notify: a datagram socket the daemon reports to.
    let notify_path = dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("notify socket");
    notify.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let next_notification = || {
        let mut buffer = [0u8; 512];
        let n = notify.recv(&mut buffer).expect("a notification within 10s");
        String::from_utf8_lossy(&buffer[..n]).to_string()
    };
    let mut daemon = DaemonProcess::start(
        &setup.args(&["--no-leader-election"]),
        &[("WATERMARKD__RELOAD_POLL", "1h"), ("NOTIFY_SOCKET", notify_path.to_str().expect("utf-8"))],
    );
    daemon.wait_ready(STARTUP).await;
    assert!(next_notification().starts_with("READY=1"), "READY=1 once ready");
    eventually!(Duration::from_secs(10), "web evaluated", {
        match daemon.sample("wpa_controller_max_replicas", &[("wpa_name", "web")]).await {
            Some(10.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // Invalid (low above high), written by rename as editors do.
    let staged = dir.path().join("rules.toml.new");
    write(&staged, &valid.replace("low_watermark = 5", "low_watermark = 50"));
    std::fs::rename(&staged, &config).expect("rename");
    daemon.hangup();
    assert!(next_notification().starts_with("RELOADING=1\nMONOTONIC_USEC="), "RELOADING=1 on SIGHUP");
    assert!(next_notification().starts_with("READY=1"), "READY=1 after the reload, even a failed one");
    eventually!(Duration::from_secs(10), "the failed reload counted", {
        match daemon.sample("watermarkd_config_reloads_total", &[("result", "failure")]).await {
            Some(v) if v >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(daemon.sample("watermarkd_config_last_reload_successful", &[]).await, Some(0.0));
    assert!(daemon.log().contains("low_watermark"), "the problem is logged; log:\n{}", daemon.log());
    // The old rules still run: over the watermark, web scales.
    exporter.set("load 30\n");
    eventually!(Duration::from_secs(15), "old rules still scale", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas > 2 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });

    // A valid change (max 4, and a second autoscaler) applies on SIGHUP.
    cluster.create_deployment(&ns, "worker", 1).await;
    cluster.set_workload_status("Deployment", &ns, "worker", 1, 1).await;
    let changed =
        rules(&setup.prometheus.url(), &ns, &[("web", "Deployment", "load"), ("worker", "Deployment", "load")], "")
            .replace("max_replicas = 10", "max_replicas = 4");
    write(&config, &changed);
    daemon.hangup();
    eventually!(Duration::from_secs(10), "the new rules run", {
        let web = daemon.sample("wpa_controller_max_replicas", &[("wpa_name", "web")]).await;
        let worker = daemon.sample("wpa_controller_max_replicas", &[("wpa_name", "worker")]).await;
        match (web, worker) {
            (Some(a), Some(b)) if a == 4.0 && b == 4.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(daemon.sample("watermarkd_config_reloads_total", &[("result", "success")]).await.unwrap_or(0.0) >= 1.0);
    assert_eq!(daemon.sample("watermarkd_config_last_reload_successful", &[]).await, Some(1.0));
    eventually!(Duration::from_secs(15), "web capped at the new maximum", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas == 4 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });

    while let Ok(text) = {
        notify.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let mut buffer = [0u8; 512];
        notify.recv(&mut buffer).map(|n| String::from_utf8_lossy(&buffer[..n]).to_string())
    } {
        assert!(text.starts_with("RELOADING=1") || text.starts_with("READY=1"), "{text}");
    }
    notify.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");

    // Turning worker's dry_run on flips the `dry_run` label of all its series: they start over
    // under dry_run="true", and none stays behind under "false".
    let before = worker_series(&daemon.metrics().await);
    assert!(!before.is_empty() && before.iter().all(|(_, dry)| dry == "false"), "{before:?}");
    let parts: Vec<&str> = changed.split("\n[[autoscaler]]").collect();
    assert_eq!(parts.len(), 3, "backend, web, worker");
    let worker_dry = parts[2].replacen("interval = \"1s\"", "interval = \"1s\"\ndry_run = true", 1);
    write(&config, &[parts[0], parts[1], &worker_dry].join("\n[[autoscaler]]"));
    daemon.hangup();
    let families = |series: &[(String, String)]| series.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>();
    eventually!(Duration::from_secs(10), "worker's series under dry_run=\"true\" only", {
        let after = worker_series(&daemon.metrics().await);
        if after.iter().all(|(_, dry)| dry == "true") && families(&after) == families(&before) {
            Ok(())
        } else {
            Err(format!("{after:?}, before {before:?}"))
        }
    });
    assert_eq!(
        daemon.sample("wpa_controller_dry_run", &[("wpa_name", "worker"), ("dry_run", "true")]).await,
        Some(1.0)
    );
    assert_eq!(
        daemon.sample("wpa_controller_dry_run", &[("wpa_name", "web"), ("dry_run", "false")]).await,
        Some(0.0),
        "web is not touched"
    );

    // Removing an autoscaler removes its series.
    write(&config, &changed.split("\n[[autoscaler]]").take(2).collect::<Vec<_>>().join("\n[[autoscaler]]"));
    daemon.hangup();
    eventually!(Duration::from_secs(10), "worker's series gone", {
        match daemon.sample("wpa_controller_max_replicas", &[("wpa_name", "worker")]).await {
            None => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM");
    let mut stopping = String::new();
    while !stopping.starts_with("STOPPING=1") {
        stopping = next_notification();
    }
}

/// A reload whose new backend secret cannot be read fails as a whole: the running backend (and
/// the rules) carry on, the failure is counted and logged by file name, never by value, and
/// once the file is in place a SIGHUP applies the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_new_secret_cannot_be_read_keeps_the_running_backend() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-secret", "web", 2, "load 8\n", |r| r).await;
    let ns = setup.ns.clone();
    // Prometheus ignores the password; what matters is the file the backend reads it from.
    let with_password_file = |file: &Path| {
        setup.valid_rules.replacen(
            "type = \"prometheus\"\n",
            &format!(
                "type = \"prometheus\"\nbasic_auth = {{ username = \"watermarkd\", password_file = \"{}\" }}\n",
                file.display()
            ),
            1,
        )
    };
    let first = setup.dir.path().join("password");
    write(&first, "first-password-value\n");
    write(&setup.config, &with_password_file(&first));
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[("WATERMARKD__RELOAD_POLL", "1h")]);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(10), "web evaluated", {
        match daemon.sample("wpa_controller_value", &[("wpa_name", "web")]).await {
            Some(8.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    let rotated = setup.dir.path().join("rotated-password");
    write(&setup.config, &with_password_file(&rotated));
    daemon.hangup();
    eventually!(Duration::from_secs(10), "the failed reload counted", {
        match daemon.sample("watermarkd_config_reloads_total", &[("result", "failure")]).await {
            Some(v) if v >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(daemon.sample("watermarkd_config_last_reload_successful", &[]).await, Some(0.0));
    assert!(daemon.log().contains(&rotated.display().to_string()), "the file is named; log:\n{}", daemon.log());
    // The running backend still answers: over the watermark, web scales.
    setup.exporter.set("load 30\n");
    eventually!(Duration::from_secs(15), "the running backend still scales web", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas > 2 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });

    write(&rotated, "second-password-value\n");
    daemon.hangup();
    eventually!(Duration::from_secs(10), "the reload applies once the file is there", {
        match daemon.sample("watermarkd_config_last_reload_successful", &[]).await {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let log = daemon.log();
    assert!(!log.contains("first-password-value") && !log.contains("second-password-value"), "a secret in the log");
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM");
}

/// A reload with an interval no clock can add (it once passed validation and then overflowed the
/// scheduler's time addition, killing the daemon): refused with its position, counted as a failed
/// reload, and the previous rules keep scaling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_an_unbounded_interval_fails_and_the_old_rules_keep_running() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-bounds", "web", 2, "load 8\n", |r| r).await;
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election"]), &[("WATERMARKD__RELOAD_POLL", "1h")]);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(10), "web evaluated", {
        match daemon.sample("wpa_controller_max_replicas", &[("wpa_name", "web")]).await {
            Some(10.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    let unbounded = setup.valid_rules.replace("interval = \"1s\"", "interval = 9223372036854775807");
    assert_ne!(unbounded, setup.valid_rules);
    write(&setup.config, &unbounded);
    daemon.hangup();
    eventually!(Duration::from_secs(10), "the failed reload counted", {
        let failures = daemon.sample("watermarkd_config_reloads_total", &[("result", "failure")]).await;
        match failures {
            Some(v) if v >= 1.0 => Ok(()),
            other => Err(format!("{other:?}; exited: {:?}; log:\n{}", daemon.exited(), daemon.log())),
        }
    });
    assert_eq!(daemon.sample("watermarkd_config_last_reload_successful", &[]).await, Some(0.0));
    let line = unbounded.lines().position(|l| l.starts_with("interval")).expect("the interval") + 1;
    let problem =
        format!("line {line}: autoscaler \"web\": interval (9223372036854775807) must be at most 1day (86400s)");
    let log = daemon.log();
    assert!(log.contains(&problem), "the problem with its position; log:\n{log}");
    assert!(log.contains(&setup.config.display().to_string()), "and its file; log:\n{log}");

    // The old rules still run: over the watermark, web scales.
    setup.exporter.set("load 30\n");
    eventually!(Duration::from_secs(15), "old rules still scale", {
        let replicas = spec_replicas(cluster, "Deployment", &setup.ns, "web").await;
        if replicas > 2 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    assert_eq!(daemon.exited(), None, "the daemon runs on");
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM");
}

/// The series of the autoscaler `worker` in a /metrics text, but its labels-as-tags info
/// series (which has no `dry_run`): (family, value of the `dry_run` label), sorted.
fn worker_series(text: &str) -> Vec<(String, String)> {
    let mut series: Vec<(String, String)> = text
        .lines()
        .filter(|l| l.starts_with("wpa_controller_") && !l.starts_with("wpa_controller_labels_info"))
        .filter(|l| l.contains("wpa_name=\"worker\""))
        .map(|l| {
            let family = l.split('{').next().unwrap_or_default().to_string();
            let dry_run = l.split("dry_run=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or("none");
            (family, dry_run.to_string())
        })
        .collect();
    series.sort();
    series
}

/// A global dry run decides, logs and exports everything and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_reports_the_decision_and_writes_nothing() {
    let cluster = KubeCluster::shared();
    let setup = Setup::start("e2e-dry", "web", 2, "load 30\n", |r| r).await;
    let ns = setup.ns.clone();
    let mut daemon = DaemonProcess::start(&setup.args(&["--no-leader-election", "--dry-run"]), &[]);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(15), "the dry-run decision exported", {
        let effective = daemon.sample("wpa_controller_replicas_scaling_effective", &[("wpa_name", "web")]).await;
        let dry = daemon.sample("wpa_controller_dry_run", &[("wpa_name", "web"), ("dry_run", "true")]).await;
        match (effective, dry) {
            (Some(3.0), Some(1.0)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 2, "nothing written");
    assert_eq!(persisted_state(cluster, &ns, &format!("Deployment.apps {ns}/web")).await, None);
    assert_eq!(annotation(cluster, "Deployment", &ns, "web", "watermarkd.io/state").await, None);
    assert!(daemon.log().contains("dry-run: nothing written"), "the log says so");
}

/// The WatermarkPodAutoscaler CRD, created once for all the tests of this binary (they share
/// one cluster and may start together).
async fn install_wpa_crd(cluster: &KubeCluster) {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            cluster.create_crd(&custom_resource_definition()).await;
        })
        .await;
}

/// What the daemon needs in CRD mode: a rules file with only the `datadog` backend (the local
/// stand-in) and a kubeconfig; it runs the WPAs of one namespace every second.
struct CrdMode {
    _dir: tempfile::TempDir,
    config: String,
    kubeconfig: String,
    namespace: String,
}

impl CrdMode {
    const ENV: [(&'static str, &'static str); 2] =
        [("DD_API_KEY", fake_datadog::API_KEY), ("DD_APP_KEY", fake_datadog::APP_KEY)];

    fn new(cluster: &KubeCluster, datadog: &fake_datadog::FakeDatadog, namespace: &str) -> CrdMode {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("rules.toml");
        write(
            &config,
            &format!(
                "[backend.datadog]\ntype = \"datadog\"\nurl = \"{}\"\napi_key_env = \"DD_API_KEY\"\napp_key_env = \"DD_APP_KEY\"\n",
                datadog.url
            ),
        );
        let kubeconfig = kubeconfig(cluster, dir.path(), ADMIN_TOKEN);
        CrdMode { config: config.display().to_string(), kubeconfig, namespace: namespace.to_string(), _dir: dir }
    }

    fn args(&self) -> Vec<&str> {
        vec![
            "--config",
            &self.config,
            "--crd",
            "--namespace",
            &self.namespace,
            "--kubeconfig",
            &self.kubeconfig,
            "--no-leader-election",
            "--lease-namespace",
            &self.namespace,
            "--default-interval",
            "1s",
        ]
    }
}

fn wpa_resource() -> ApiResource {
    ApiResource::erase::<WatermarkPodAutoscaler>(&())
}

async fn apply_wpa(cluster: &KubeCluster, namespace: &str, yaml: &str) {
    let mut value: Value = serde_yaml_ng::from_str(yaml).expect("WPA YAML");
    value["metadata"]["namespace"] = json!(namespace);
    let object: DynamicObject = serde_json::from_value(value).expect("WPA object");
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &wpa_resource());
    api.create(&PostParams::default(), &object).await.expect("create WPA");
}

async fn wpa_status(cluster: &KubeCluster, namespace: &str, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &wpa_resource());
    let object = api.get(name).await.expect("get WPA");
    object.data["status"].clone()
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// CRD mode: the Datadog sample WPA applied as it is scales its Deployment from (a local
/// stand-in for) Datadog and gets the Datadog controller's status; an invalid WPA and one with
/// a missing target get conditions and Warning events, and do not stop the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpa_objects_scale_their_targets_and_report_in_their_status() {
    let cluster = KubeCluster::shared();
    install_wpa_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-wpa").await;
    cluster.create_deployment(&ns, "alpine", 1).await;
    cluster.set_workload_status("Deployment", &ns, "alpine", 1, 1).await;
    let datadog = fake_datadog::FakeDatadog::start().await;
    // The query the Cluster Agent builds for the sample's metric: 2M against 900k..500k.
    datadog.set(
        "avg:container.memory.usage{cluster_name:mycluster,kube_deployment:alpine}.rollup(30)",
        fake_datadog::Behavior::Series(fake_datadog::SeriesSpec::constant(2_000_000.0)),
    );
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wpa");
    let sample = std::fs::read_to_string(fixtures.join("datadoghq_v1alpha1_watermarkpodautoscaler.yaml"))
        .expect("the Datadog sample WPA");
    apply_wpa(cluster, &ns, &sample).await;
    apply_wpa(
        cluster,
        &ns,
        r#"{"apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
            "metadata": {"name": "upside-down"},
            "spec": {"maxReplicas": 5, "minReplicas": 1,
                "scaleTargetRef": {"kind": "Deployment", "apiVersion": "apps/v1", "name": "alpine"},
                "metrics": [{"type": "External",
                    "external": {"highWatermark": "1", "lowWatermark": "2", "metricName": "m",
                        "metricSelector": {"matchLabels": {"app": "alpine"}}}}]}}"#,
    )
    .await;
    apply_wpa(
        cluster,
        &ns,
        r#"{"apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
            "metadata": {"name": "nowhere"},
            "spec": {"maxReplicas": 5, "minReplicas": 1,
                "scaleTargetRef": {"kind": "Deployment", "apiVersion": "apps/v1", "name": "missing"},
                "metrics": [{"type": "External",
                    "external": {"highWatermark": "2", "lowWatermark": "1", "metricName": "m",
                        "metricSelector": {"matchLabels": {"app": "missing"}}}}]}}"#,
    )
    .await;

    let crd_mode = CrdMode::new(cluster, &datadog, &ns);
    let mut daemon = DaemonProcess::start(&crd_mode.args(), &CrdMode::ENV);
    daemon.wait_ready(STARTUP).await;

    eventually!(Duration::from_secs(20), "the sample WPA scaled alpine", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "alpine").await;
        if replicas > 1 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    let status = eventually!(Duration::from_secs(10), "the sample's status", {
        let status = wpa_status(cluster, &ns, "example-watermarkpodautoscaler").await;
        if status["lastScaleTime"].is_string() {
            Ok(status)
        } else {
            Err(status.to_string())
        }
    });
    assert!(status["desiredReplicas"].as_i64().unwrap_or(0) > 1, "{status}");
    let above = condition(&status, "AboveHighWatermark").expect("AboveHighWatermark");
    assert_eq!(above["status"], "True", "{status}");
    let able = condition(&status, "AbleToScale").expect("AbleToScale");
    assert_eq!(able["reason"], "SuccessfulScale", "{status}");
    assert_eq!(status["currentMetrics"][0]["external"]["metricName"], "container.memory.usage", "{status}");
    wpa_status_shape::self_test();
    wpa_status_shape::assert_datadog_status_shape(&status);

    let status = eventually!(Duration::from_secs(10), "the invalid WPA's status", {
        let status = wpa_status(cluster, &ns, "upside-down").await;
        match condition(&status, "AbleToScale") {
            Some(c) if c["reason"] == "FailedSpecCheck" => Ok(status.clone()),
            _ => Err(status.to_string()),
        }
    });
    let message = condition(&status, "AbleToScale").and_then(|c| c["message"].as_str()).unwrap_or_default();
    assert!(message.contains("lowWatermark"), "names the field: {message}");
    eventually!(Duration::from_secs(10), "a Warning event on the invalid WPA", {
        warned(cluster, &ns, "upside-down", "FailedSpecCheck").await
    });
    eventually!(Duration::from_secs(10), "the missing target on the WPA", {
        let status = wpa_status(cluster, &ns, "nowhere").await;
        match condition(&status, "AbleToScale") {
            Some(c) if c["status"] == "False" && c["reason"] == "FailedGetScale" => Ok(()),
            _ => Err(status.to_string()),
        }
    });
    assert!(!daemon.log().contains(fake_datadog::API_KEY), "the key never reaches the log");
    assert!(!daemon.metrics().await.contains(fake_datadog::API_KEY), "nor the metrics");
    assert_eq!(daemon.exited(), None, "the daemon runs on");
}

/// A WPA on `target` with the watermarks 1..2 on `load{app:TARGET}`, `max` replicas, and
/// forbidden windows of a second.
fn wpa_on(name: &str, target: &str, max: u32) -> String {
    format!(
        r#"{{"apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
            "metadata": {{"name": "{name}"}},
            "spec": {{"maxReplicas": {max}, "minReplicas": 1,
                "upscaleForbiddenWindowSeconds": 1, "downscaleForbiddenWindowSeconds": 1,
                "scaleTargetRef": {{"kind": "Deployment", "apiVersion": "apps/v1", "name": "{target}"}},
                "metrics": [{{"type": "External",
                    "external": {{"highWatermark": "2", "lowWatermark": "1", "metricName": "load",
                        "metricSelector": {{"matchLabels": {{"app": "{target}"}}}}}}}}]}}}}"#
    )
}

/// Two active WPAs on one Deployment: the older runs and scales it, the newer one says in its
/// status and a Warning event that it waits for it (and why), and runs once the older is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_wpas_on_one_target_the_older_runs_and_the_other_waits_for_it() {
    let cluster = KubeCluster::shared();
    install_wpa_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-conflict").await;
    cluster.create_deployment(&ns, "web", 1).await;
    cluster.set_workload_status("Deployment", &ns, "web", 1, 1).await;
    let datadog = fake_datadog::FakeDatadog::start().await;
    datadog
        .set("avg:load{app:web}.rollup(30)", fake_datadog::Behavior::Series(fake_datadog::SeriesSpec::constant(10.0)));
    // The older is named last, so that its age, not its name, makes it the one that runs.
    apply_wpa(cluster, &ns, &wpa_on("zz-older", "web", 4)).await;
    // creationTimestamp counts whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    apply_wpa(cluster, &ns, &wpa_on("aa-newer", "web", 3)).await;

    let crd_mode = CrdMode::new(cluster, &datadog, &ns);
    let mut daemon = DaemonProcess::start(&crd_mode.args(), &CrdMode::ENV);
    daemon.wait_ready(STARTUP).await;

    let status = eventually!(Duration::from_secs(15), "the newer WPA's TargetConflict condition", {
        let status = wpa_status(cluster, &ns, "aa-newer").await;
        match condition(&status, "ScalingActive") {
            Some(c) if c["reason"] == "TargetConflict" => Ok(status.clone()),
            _ => Err(status.to_string()),
        }
    });
    let active = condition(&status, "ScalingActive").expect("ScalingActive");
    assert_eq!(active["status"], "False", "{status}");
    let message = active["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("Deployment {ns}/web is already scaled by WatermarkPodAutoscaler {ns}/zz-older")),
        "names the target and the one that runs: {message}"
    );
    eventually!(Duration::from_secs(10), "a TargetConflict Warning event on the newer WPA", {
        warned(cluster, &ns, "aa-newer", "TargetConflict").await
    });
    eventually!(Duration::from_secs(15), "the older WPA scaled web up to its own maximum", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        let older = wpa_status(cluster, &ns, "zz-older").await;
        if replicas == 4 && older["lastScaleTime"].is_string() {
            Ok(())
        } else {
            Err(format!("{replicas} replicas; {older}"))
        }
    });

    // The older one goes: the newer one runs, with nothing changed on it.
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &wpa_resource());
    api.delete("zz-older", &kube::api::DeleteParams::default()).await.expect("delete the older WPA");
    eventually!(Duration::from_secs(15), "the newer WPA runs", {
        let status = wpa_status(cluster, &ns, "aa-newer").await;
        match condition(&status, "ScalingActive") {
            Some(c) if c["status"] == "True" => Ok(()),
            _ => Err(status.to_string()),
        }
    });
    // It runs on its own rule: its maximum (3) is below the replicas, so it brings them down.
    eventually!(Duration::from_secs(15), "web within the newer WPA's maximum", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "web").await;
        if replicas == 3 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    assert_eq!(daemon.exited(), None, "the daemon runs on");
}

/// CRD mode keeps its state in the WPA status: after `kill -9` and a restart inside the upscale
/// forbidden window, the restarted daemon holds until the window ends, then scales.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wpa_keeps_its_forbidden_window_across_kill_9() {
    let cluster = KubeCluster::shared();
    install_wpa_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-wpa-restart").await;
    cluster.create_deployment(&ns, "api", 2).await;
    cluster.set_workload_status("Deployment", &ns, "api", 2, 2).await;
    let datadog = fake_datadog::FakeDatadog::start().await;
    datadog.set_default(fake_datadog::Behavior::Series(fake_datadog::SeriesSpec::constant(50.0)));
    apply_wpa(
        cluster,
        &ns,
        r#"{"apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
            "metadata": {"name": "api"},
            "spec": {"maxReplicas": 20, "minReplicas": 1, "upscaleForbiddenWindowSeconds": 12,
                "scaleTargetRef": {"kind": "Deployment", "apiVersion": "apps/v1", "name": "api"},
                "metrics": [{"type": "External",
                    "external": {"highWatermark": "10", "lowWatermark": "5", "metricName": "load",
                        "metricSelector": {"matchLabels": {"app": "api"}}}}]}}"#,
    )
    .await;
    let crd_mode = CrdMode::new(cluster, &datadog, &ns);
    let (args, env) = (crd_mode.args(), CrdMode::ENV);
    let mut daemon = DaemonProcess::start(&args, &env);
    daemon.wait_ready(STARTUP).await;
    eventually!(Duration::from_secs(20), "the first scale", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "api").await;
        if replicas > 2 {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
    let scaled_at = std::time::Instant::now();
    let first = spec_replicas(cluster, "Deployment", &ns, "api").await;
    follow_spec(cluster, "Deployment", &ns, "api").await;
    // Let the status with the scale's time be written, as it is right after the scale.
    eventually!(Duration::from_secs(5), "lastScaleTime in the status", {
        let status = wpa_status(cluster, &ns, "api").await;
        if status["lastScaleTime"].is_string() {
            Ok(())
        } else {
            Err(status.to_string())
        }
    });
    daemon.kill9();

    let mut daemon = DaemonProcess::start(&args, &env);
    daemon.wait_ready(STARTUP).await;
    while scaled_at.elapsed() < Duration::from_secs(10) {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "api").await;
        assert_eq!(
            replicas,
            first,
            "scaled again {:?} after the first scale, inside the 12s window",
            scaled_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually!(Duration::from_secs(12), "the scale after the window", {
        let replicas = spec_replicas(cluster, "Deployment", &ns, "api").await;
        if replicas > first {
            Ok(())
        } else {
            Err(format!("{replicas} replicas"))
        }
    });
}

/// CRD mode with `spec.recommender`: the daemon asks a recommender (a test server) with the
/// Datadog controller's request, scales to its answer, reports it in the WPA status and the
/// series (its HTTP client series too), and holds with a Warning event on the WPA when the
/// recommender fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wpa_with_a_recommender_scales_to_its_answer_and_holds_when_it_fails() {
    let cluster = KubeCluster::shared();
    install_wpa_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-wpa-reco").await;
    cluster.create_deployment(&ns, "web", 4).await;
    cluster.set_workload_status("Deployment", &ns, "web", 4, 4).await;
    let recommender = fake_recommender::FakeRecommender::start().await;
    // 4 replicas, under the lower bound 5: above the band, and 6 is recommended.
    recommender.answer(200, fake_recommender::reply(6, Some((5, 8))), Duration::ZERO);
    apply_wpa(
        cluster,
        &ns,
        &format!(
            r#"{{"apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
                "metadata": {{"name": "recommended"}},
                "spec": {{"maxReplicas": 9, "minReplicas": 2,
                    "scaleTargetRef": {{"kind": "Deployment", "apiVersion": "apps/v1", "name": "web"}},
                    "recommender": {{"url": "{}", "targetType": "load", "settings": {{"window": "5m"}},
                        "lowWatermark": "150m", "highWatermark": "400m"}}}}}}"#,
            recommender.url
        ),
    )
    .await;
    // Datadog's own recommender sample, pointed at the test recommender. Its float `tolerance`
    // is refused by the Datadog CRD as by ours (an int-or-string field): the same value as a
    // quantity.
    cluster.create_deployment(&ns, "my-app", 4).await;
    cluster.set_workload_status("Deployment", &ns, "my-app", 4, 4).await;
    let sample =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wpa/recommender.yaml"))
            .expect("the Datadog recommender sample");
    let sample =
        sample.replace("http://recommender:8080", &recommender.url).replace("tolerance: 0.01", "tolerance: \"10m\"");
    apply_wpa(cluster, &ns, &sample).await;
    let datadog = fake_datadog::FakeDatadog::start().await;
    let crd_mode = CrdMode::new(cluster, &datadog, &ns);
    // The operator allows this recommender (by default WPAs may use none).
    let env = [
        CrdMode::ENV[0],
        CrdMode::ENV[1],
        ("K8S_CLUSTER_NAME", "e2e-cluster"),
        ("WATERMARKD__RECOMMENDER_ALLOWED_URLS", recommender.url.as_str()),
    ];
    let mut daemon = DaemonProcess::start(&crd_mode.args(), &env);
    daemon.wait_ready(STARTUP).await;

    eventually!(Duration::from_secs(20), "the recommended 6 replicas", {
        match spec_replicas(cluster, "Deployment", &ns, "web").await {
            6 => Ok(()),
            other => Err(format!("{other} replicas")),
        }
    });
    let requests = recommender.requests();
    let for_target = |name: &str| {
        requests.iter().find(|(_, _, body)| body["targetRef"]["name"] == name).cloned().expect("a request for it")
    };
    let (_, _, sample_request) = for_target("my-app");
    assert_eq!(sample_request["settings"], json!({"foo": "bar"}), "{sample_request}");
    assert_eq!(sample_request["constraints"], json!({"minReplicas": 4, "maxReplicas": 9}), "{sample_request}");
    let (method, content_type, request) = for_target("web");
    assert_eq!((method.as_str(), content_type.as_str()), ("POST", "application/json"));
    assert_eq!(
        request,
        json!({
            "targetRef": {"cluster": "e2e-cluster", "namespace": ns, "kind": "Deployment", "name": "web",
                          "apiVersion": "apps/v1"},
            "constraints": {"minReplicas": 2, "maxReplicas": 9},
            "state": {"desiredReplicas": 4, "currentReplicas": 4, "readyReplicas": 4},
            "targets": [{"type": "load", "lowerBound": 0.15, "upperBound": 0.4}],
            "settings": {"window": "5m"}
        })
    );
    let metric_name = "recommender{targetType:load,window:5m}";
    let status = eventually!(Duration::from_secs(10), "the status of the scale", {
        let status = wpa_status(cluster, &ns, "recommended").await;
        if status["lastScaleTime"].is_string() {
            Ok(status)
        } else {
            Err(status.to_string())
        }
    });
    assert_eq!(status["desiredReplicas"], 6, "{status}");
    assert_eq!(condition(&status, "AboveHighWatermark").map(|c| c["status"].clone()), Some(json!("True")), "{status}");
    // As the Datadog controller reports a recommender: type Resource with an external body.
    assert_eq!(status["currentMetrics"][0]["type"], "Resource", "{status}");
    assert_eq!(status["currentMetrics"][0]["external"]["metricName"], metric_name, "{status}");
    assert_eq!(status["currentMetrics"][0]["external"]["currentValue"], "730m", "{status}");
    wpa_status_shape::assert_datadog_status_shape(&status);
    eventually!(Duration::from_secs(10), "the Datadog sample scaled my-app to the recommendation", {
        let status = wpa_status(cluster, &ns, "example-external-recommender").await;
        match spec_replicas(cluster, "Deployment", &ns, "my-app").await {
            6 if status["lastScaleTime"].is_string() => {
                wpa_status_shape::assert_datadog_status_shape(&status);
                Ok(())
            }
            other => Err(format!("{other} replicas, status {status}")),
        }
    });

    let labels = [("wpa_name", "recommended"), ("metric_name", metric_name)];
    assert_eq!(daemon.sample("wpa_controller_value", &labels).await, Some(0.73));
    assert_eq!(daemon.sample("wpa_controller_high_watermark", &labels).await, Some(0.4));
    let client = [("client", recommender.url.as_str()), ("method", "post"), ("code", "200")];
    assert!(daemon.sample("http_client_requests_total", &client).await >= Some(1.0), "{}", daemon.metrics().await);

    recommender.answer(500, "recommender overloaded", Duration::ZERO);
    eventually!(Duration::from_secs(15), "a FailedGetMetrics event on the WPA", {
        let events = events_about(cluster, &ns, "recommended").await;
        let failed = events.iter().find(|e| e.reason.as_deref() == Some("FailedGetMetrics"));
        match failed.and_then(|e| e.note.clone()) {
            // The status code, never what the server said.
            Some(note) if note.contains("HTTP 500 (Internal Server Error)") && !note.contains("overloaded") => Ok(()),
            _ => Err(format!("{events:?}")),
        }
    });
    let client = [("client", recommender.url.as_str()), ("method", "post"), ("code", "500")];
    assert!(daemon.sample("http_client_requests_total", &client).await >= Some(1.0), "{}", daemon.metrics().await);
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 6, "a failed recommender holds");
    assert_eq!(daemon.exited(), None, "the daemon runs on");
}

/// CRD mode: a WPA may only send recommender requests where the operator allows
/// (`recommender_allowed_urls`): another url is refused with a condition and an Event that name
/// the field and the setting, and nothing is sent there. Recommenders that come and go with
/// their WPAs leave no `http_client_*` series behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpa_recommenders_are_refused_unless_allowed_and_leave_no_series_when_deleted() {
    let cluster = KubeCluster::shared();
    install_wpa_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-wpa-reco-churn").await;
    let recommender = fake_recommender::FakeRecommender::start().await;
    let elsewhere = fake_recommender::FakeRecommender::start().await;
    let wpa = |name: &str, target: &str, url: &str| {
        format!(
            r#"{{"apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
                "metadata": {{"name": "{name}"}},
                "spec": {{"maxReplicas": 9, "minReplicas": 2,
                    "scaleTargetRef": {{"kind": "Deployment", "apiVersion": "apps/v1", "name": "{target}"}},
                    "recommender": {{"url": "{url}", "targetType": "load", "highWatermark": "400m"}}}}}}"#
        )
    };
    cluster.create_deployment(&ns, "refused", 4).await;
    cluster.set_workload_status("Deployment", &ns, "refused", 4, 4).await;
    apply_wpa(cluster, &ns, &wpa("refused", "refused", &elsewhere.url)).await;
    let churned: Vec<String> = (0..4).map(|i| format!("{}/{i}", recommender.url)).collect();
    for (i, url) in churned.iter().enumerate() {
        let name = format!("churn-{i}");
        cluster.create_deployment(&ns, &name, 4).await;
        cluster.set_workload_status("Deployment", &ns, &name, 4, 4).await;
        apply_wpa(cluster, &ns, &wpa(&name, &name, url)).await;
    }
    let datadog = fake_datadog::FakeDatadog::start().await;
    let crd_mode = CrdMode::new(cluster, &datadog, &ns);
    let env = [CrdMode::ENV[0], CrdMode::ENV[1], ("WATERMARKD__RECOMMENDER_ALLOWED_URLS", recommender.url.as_str())];
    let mut daemon = DaemonProcess::start(&crd_mode.args(), &env);
    daemon.wait_ready(STARTUP).await;

    let status = eventually!(Duration::from_secs(15), "the refused WPA's status", {
        let status = wpa_status(cluster, &ns, "refused").await;
        match condition(&status, "AbleToScale") {
            Some(c) if c["reason"] == "FailedSpecCheck" => Ok(status.clone()),
            _ => Err(status.to_string()),
        }
    });
    let message = condition(&status, "AbleToScale").and_then(|c| c["message"].as_str()).unwrap_or_default();
    assert!(
        message.contains("spec.recommender.url") && message.contains("recommender_allowed_urls"),
        "names the field and the setting: {message}"
    );
    eventually!(Duration::from_secs(10), "a Warning event on the refused WPA", {
        let events = events_about(cluster, &ns, "refused").await;
        let refused = events.iter().find(|e| e.type_.as_deref() == Some("Warning"));
        match refused.and_then(|e| e.note.clone()) {
            Some(note) if note.contains("refused") && note.contains("recommender_allowed_urls") => Ok(()),
            _ => Err(format!("{events:?}")),
        }
    });

    let client_series = |text: &str, url: &str| {
        let label = format!("client=\"{url}\"");
        text.lines().filter(|l| l.starts_with("http_client_") && l.contains(&label)).count()
    };
    eventually!(Duration::from_secs(20), "every churned recommender asked", {
        let text = daemon.metrics().await;
        let missing: Vec<&String> = churned.iter().filter(|url| client_series(&text, url) == 0).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("no series for {missing:?}"))
        }
    });
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &wpa_resource());
    for i in 0..churned.len() {
        api.delete(&format!("churn-{i}"), &Default::default()).await.expect("delete WPA");
    }
    eventually!(Duration::from_secs(15), "no series left for the deleted WPAs' recommenders", {
        let text = daemon.metrics().await;
        let left: Vec<&String> = churned.iter().filter(|url| client_series(&text, url) > 0).collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("series left for {left:?}"))
        }
    });
    assert!(elsewhere.requests().is_empty(), "nothing was sent where the operator did not allow");
    assert_eq!(daemon.exited(), None, "the daemon runs on");
}
