//! The Kubernetes workload layer (`watermarkd::adapters::workload`) against a real kube-apiserver and etcd (started by the tests,
//! shared by this file's tests, each test in a namespace of its own).
//!
//! Needs kube-apiserver and etcd: scripts/install-test-deps installs them. Missing binaries fail
//! the tests rather than skip them.

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
#[path = "support/kube_cluster.rs"]
mod kube_cluster;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube_cluster::{KubeCluster, SCALER_TOKEN, SCALER_USER};
use serde_json::json;
use watermarkd::adapters::workload::{connect, ScaleReading, WorkloadError, Workloads};
use watermarkd::domain::rules::TargetRef;

fn target(api_version: &str, kind: &str, namespace: &str, name: &str) -> TargetRef {
    TargetRef { api_version: api_version.into(), kind: kind.into(), namespace: namespace.into(), name: name.into() }
}

const WAIT: Duration = Duration::from_secs(10);

/// Reads until `accept` holds for the result, and returns that result.
async fn read_until(
    targets: &Workloads,
    target: &TargetRef,
    what: &str,
    accept: impl Fn(&Result<ScaleReading, WorkloadError>) -> bool,
) -> Result<ScaleReading, WorkloadError> {
    eventually!(WAIT, what, {
        let result = targets.read(target).await;
        if accept(&result) {
            Ok(result)
        } else {
            Err(format!("{result:?}"))
        }
    })
}

/// Reads until a reading satisfies `accept`, and returns it.
async fn reading_where(
    targets: &Workloads,
    target: &TargetRef,
    what: &str,
    accept: impl Fn(&ScaleReading) -> bool,
) -> ScaleReading {
    eventually!(WAIT, what, {
        match targets.read(target).await {
            Ok(reading) if accept(&reading) => Ok(reading),
            other => Err(format!("{other:?}")),
        }
    })
}

async fn spec_replicas(cluster: &KubeCluster, kind: &str, namespace: &str, name: &str) -> i64 {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &kube_cluster::apps_v1(kind));
    let object = api.get(name).await.expect("get the workload");
    object.data["spec"]["replicas"].as_i64().expect("spec.replicas")
}

/// What someone else does by hand: `kubectl scale`.
async fn manual_scale(cluster: &KubeCluster, kind: &str, namespace: &str, name: &str, replicas: i32) {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &kube_cluster::apps_v1(kind));
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": replicas } })))
        .await
        .expect("manual scale");
}

/// Read, scale through /scale, see spec.replicas change: the same for every built-in kind.
async fn read_and_scale(kind: &str, prefix: &str) {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace(prefix).await;
    match kind {
        "Deployment" => drop(cluster.create_deployment(&ns, "web", 2).await),
        "StatefulSet" => drop(cluster.create_statefulset(&ns, "web", 2).await),
        _ => drop(cluster.create_replicaset(&ns, "web", 2).await),
    }
    cluster.set_workload_status(kind, &ns, "web", 2, 1).await;

    let targets = Workloads::new(cluster.client());
    let web = target("apps/v1", kind, &ns, "web");
    targets.watch(&web);
    let reading = reading_where(&targets, &web, "status set", |r| r.status_replicas == 2).await;
    assert_eq!(reading.spec_replicas, 2, "{reading:?}");
    assert_eq!(reading.ready_replicas, Some(1), "{reading:?}");
    assert_eq!(reading.selector.as_deref(), Some("app=web"), "{reading:?}");
    assert!(!reading.resource_version.is_empty());

    targets.scale(&web, &reading, 4).await.expect("scale to 4");
    assert_eq!(spec_replicas(cluster, kind, &ns, "web").await, 4);
    // The cache serves the write at once, and the watch event agrees with it.
    assert_eq!(targets.read(&web).await.expect("read after the write").spec_replicas, 4);
    let after = reading_where(&targets, &web, "watch event of the write", |r| {
        r.spec_replicas == 4 && r.resource_version != reading.resource_version
    })
    .await;
    assert_eq!((after.status_replicas, after.ready_replicas), (2, Some(1)), "status untouched: {after:?}");
}

#[tokio::test]
async fn deployment_reads_spec_status_ready_and_scales_through_scale() {
    read_and_scale("Deployment", "deploy").await;
}

#[tokio::test]
async fn statefulset_reads_spec_status_ready_and_scales_through_scale() {
    read_and_scale("StatefulSet", "sts").await;
}

#[tokio::test]
async fn replicaset_reads_and_scales() {
    read_and_scale("ReplicaSet", "rs").await;
}

#[tokio::test]
async fn a_deployment_without_ready_pods_reads_zero_ready() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("zero").await;
    cluster.create_deployment(&ns, "web", 3).await;
    // The API omits readyReplicas when it is 0; that is 0 ready, not unknown.
    cluster.set_workload_status("Deployment", &ns, "web", 3, 0).await;
    let targets = Workloads::new(cluster.client());
    let web = target("apps/v1", "Deployment", &ns, "web");
    targets.watch(&web);
    let reading = reading_where(&targets, &web, "status", |r| r.status_replicas == 3).await;
    assert_eq!(reading.ready_replicas, Some(0));
}

#[tokio::test]
async fn a_change_between_read_and_write_is_a_conflict_and_the_other_change_stays() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("conflict").await;
    cluster.create_deployment(&ns, "web", 2).await;
    let targets = Workloads::new(cluster.client());
    let web = target("apps/v1", "Deployment", &ns, "web");
    targets.watch(&web);
    let before = targets.read(&web).await.expect("first read");
    assert_eq!(before.spec_replicas, 2);

    manual_scale(cluster, "Deployment", &ns, "web", 7).await;
    let err = targets.scale(&web, &before, 5).await.expect_err("the object changed since the reading");
    assert!(
        matches!(&err, WorkloadError::Conflict { resource_version, .. } if *resource_version == before.resource_version),
        "{err:?}"
    );
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 7, "the manual scale stays");

    // Re-read and decide again: the new reading writes.
    let fresh = reading_where(&targets, &web, "manual scale seen", |r| r.spec_replicas == 7).await;
    targets.scale(&web, &fresh, 5).await.expect("scale from the fresh reading");
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 5);

    // A status change also moves the resourceVersion: the decision was based on other data.
    let current = reading_where(&targets, &web, "own write seen", |r| r.spec_replicas == 5).await;
    cluster.set_workload_status("Deployment", &ns, "web", 5, 5).await;
    let err = targets.scale(&web, &current, 6).await.expect_err("status changed");
    assert!(matches!(err, WorkloadError::Conflict { .. }), "{err:?}");
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 5);
}

#[tokio::test]
async fn a_missing_target_is_not_found_until_it_appears_and_after_it_is_deleted() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("missing").await;
    let targets = Workloads::new(cluster.client());
    let web = target("apps/v1", "Deployment", &ns, "web");
    targets.watch(&web);
    let err = targets.read(&web).await.expect_err("nothing there");
    assert_eq!(err, WorkloadError::NotFound { kind: "Deployment".into(), namespace: ns.clone(), name: "web".into() });
    assert!(err.to_string().contains(&format!("Deployment {ns}/web does not exist")), "{err}");

    // A newly created target is picked up by the watch.
    cluster.create_deployment(&ns, "web", 3).await;
    let reading = reading_where(&targets, &web, "created", |_| true).await;
    assert_eq!(reading.spec_replicas, 3);

    let api: Api<Deployment> = Api::namespaced(cluster.client(), &ns);
    api.delete("web", &DeleteParams::default()).await.expect("delete");
    let gone = read_until(&targets, &web, "deleted", |r| matches!(r, Err(WorkloadError::NotFound { .. }))).await;
    assert!(gone.is_err());
}

#[tokio::test]
async fn a_forbidden_user_gets_an_error_naming_the_verb_and_resource() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("rbac").await;
    cluster.create_deployment(&ns, "web", 2).await;
    let targets = Workloads::new(cluster.client_for(SCALER_TOKEN));
    let web = target("apps/v1", "Deployment", &ns, "web");
    targets.watch(&web);
    let err = targets.read(&web).await.expect_err("scaler may not list deployments");
    match &err {
        WorkloadError::Forbidden { verb, resource, api_group, namespace, .. } => {
            assert_eq!((verb.as_str(), resource.as_str(), api_group.as_str()), ("list", "deployments", "apps"));
            assert_eq!(namespace, &ns);
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    assert!(err.to_string().contains("cannot list deployments"), "{err}");

    // Granting list and watch fixes reading without a restart; patching /scale is still
    // forbidden and says so.
    cluster.grant(&ns, "read-deployments", SCALER_USER, &[(&["apps"], &["deployments"], &["list", "watch"])]).await;
    let reading = eventually!(Duration::from_secs(20), "read after the grant", {
        targets.read(&web).await.map_err(|e| e.to_string())
    });
    let err = targets.scale(&web, &reading, 3).await.expect_err("scaler may not patch deployments/scale");
    assert!(
        matches!(&err, WorkloadError::Forbidden { verb, resource, .. } if verb == "patch" && resource == "deployments/scale"),
        "{err:?}"
    );
    assert!(err.to_string().contains("cannot patch deployments/scale"), "{err}");
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 2);

    cluster.grant(&ns, "scale-deployments", SCALER_USER, &[(&["apps"], &["deployments/scale"], &["patch"])]).await;
    eventually!(WAIT, "scale after the grant", { targets.scale(&web, &reading, 3).await.map_err(|e| e.to_string()) });
    assert_eq!(spec_replicas(cluster, "Deployment", &ns, "web").await, 3);
}

#[tokio::test]
async fn kinds_without_scale_and_unknown_kinds_are_clear_errors() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("kinds").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let config: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "settings" } })).expect("configmap");
    configmaps.create(&PostParams::default(), &config).await.expect("create configmap");

    let targets = Workloads::new(cluster.client());
    let configmap = target("v1", "ConfigMap", &ns, "settings");
    let typo = target("apps/v1", "Deployent", &ns, "web");
    let no_group = target("nothing.example.com/v1", "Thing", &ns, "x");
    let good = target("apps/v1", "Deployment", &ns, "web");
    cluster.create_deployment(&ns, "web", 1).await;
    for t in [&configmap, &typo, &no_group, &good] {
        targets.watch(t);
    }
    let err = targets.read(&configmap).await.expect_err("ConfigMaps have no /scale");
    assert_eq!(err, WorkloadError::NoScaleSubresource { api_version: "v1".into(), kind: "ConfigMap".into() });
    assert!(err.to_string().contains("no /scale subresource"), "{err}");
    let err = targets.read(&typo).await.expect_err("no such kind");
    assert!(matches!(&err, WorkloadError::UnknownKind { kind, .. } if kind == "Deployent"), "{err:?}");
    let err = targets.read(&no_group).await.expect_err("no such group");
    assert!(
        matches!(&err, WorkloadError::UnknownKind { api_version, .. } if api_version == "nothing.example.com/v1"),
        "{err:?}"
    );
    // The others' errors are theirs only.
    assert_eq!(targets.read(&good).await.expect("the good target reads").spec_replicas, 1);

    let unwatched = target("apps/v1", "Deployment", &ns, "other");
    assert!(matches!(targets.read(&unwatched).await, Err(WorkloadError::NotWatched(_))));
}

/// A CRD whose /scale lives at unusual paths, so reading them proves /scale is what is read.
#[tokio::test]
async fn a_custom_resource_with_scale_reads_through_scale_counts_pods_and_scales() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("custom").await;
    let group = "scale.test.watermarkd.io";
    cluster.create_crd(&kube_cluster::widget_crd(group)).await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &resource);
    for name in ["counted", "reporting"] {
        let widget: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"),
            "kind": "Widget",
            "metadata": { "name": name },
            "spec": { "size": 3 },
        }))
        .expect("widget");
        widgets.create(&PostParams::default(), &widget).await.expect("create widget");
    }
    // `counted` has no readyReplicas: readiness comes from its pods.
    cluster.patch_status(&resource, &ns, "counted", json!({ "count": 3, "podSelector": "app=counted" })).await;
    // `reporting` reports readyReplicas itself.
    cluster
        .patch_status(
            &resource,
            &ns,
            "reporting",
            json!({ "count": 3, "podSelector": "app=reporting", "readyReplicas": 1 }),
        )
        .await;
    let labels = |app: &str| BTreeMap::from([("app".to_string(), app.to_string())]);
    cluster.create_pod(&ns, "counted-a", &labels("counted"), true).await;
    cluster.create_pod(&ns, "counted-b", &labels("counted"), true).await;
    cluster.create_pod(&ns, "counted-c", &labels("counted"), false).await;
    cluster.create_pod(&ns, "unrelated", &labels("other"), true).await;

    let targets = Workloads::new(cluster.client());
    let counted = target(&format!("{group}/v1"), "Widget", &ns, "counted");
    let reporting = target(&format!("{group}/v1"), "Widget", &ns, "reporting");
    targets.watch(&counted);
    targets.watch(&reporting);

    let reading = reading_where(&targets, &counted, "custom read", |r| r.status_replicas == 3).await;
    assert_eq!(reading.spec_replicas, 3);
    assert_eq!(reading.selector.as_deref(), Some("app=counted"));
    assert_eq!(reading.ready_replicas, Some(2), "two of the three matching pods are ready: {reading:?}");
    let other = targets.read(&reporting).await.expect("a reading");
    assert_eq!(other.ready_replicas, Some(1), "status.readyReplicas wins over pods: {other:?}");

    // The pod watch follows readiness changes.
    cluster.set_pod_ready(&ns, "counted-c", true).await;
    reading_where(&targets, &counted, "third pod ready", |r| r.ready_replicas == Some(3)).await;
    let api_pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(cluster.client(), &ns);
    api_pods.delete("counted-a", &DeleteParams::default()).await.expect("delete a pod");
    reading_where(&targets, &counted, "pod deleted", |r| r.ready_replicas == Some(2)).await;

    // Scaling writes the CRD's spec path through /scale.
    let reading = targets.read(&counted).await.expect("a reading");
    targets.scale(&counted, &reading, 5).await.expect("scale the widget");
    let widget = widgets.get("counted").await.expect("get widget");
    assert_eq!(widget.data["spec"]["size"], json!(5));
    let after = reading_where(&targets, &counted, "scaled widget", |r| r.spec_replicas == 5).await;
    assert_eq!(after.resource_version, widget.metadata.resource_version.unwrap_or_default());

    // And a conflict on a custom resource is a conflict too.
    let stale = targets.read(&counted).await.expect("a reading");
    widgets
        .patch_scale("counted", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": 8 } })))
        .await
        .expect("manual scale");
    let err = targets.scale(&counted, &stale, 6).await.expect_err("changed meanwhile");
    assert!(matches!(err, WorkloadError::Conflict { .. }), "{err:?}");
    assert_eq!(widgets.get("counted").await.expect("get widget").data["spec"]["size"], json!(8));
}

#[tokio::test]
async fn a_custom_resource_names_the_missing_scale_and_pod_rights_and_recovers_when_granted() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("custom-rbac").await;
    let group = "rbac.test.watermarkd.io";
    cluster.create_crd(&kube_cluster::widget_crd(group)).await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &resource);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{group}/v1"),
        "kind": "Widget",
        "metadata": { "name": "w" },
        "spec": { "size": 2 },
    }))
    .expect("widget");
    widgets.create(&PostParams::default(), &widget).await.expect("create widget");
    cluster.patch_status(&resource, &ns, "w", json!({ "count": 2, "podSelector": "app=w" })).await;
    let labels = BTreeMap::from([("app".to_string(), "w".to_string())]);
    cluster.create_pod(&ns, "w-1", &labels, true).await;

    let user = format!("widget-scaler-{ns}");
    cluster.grant(&ns, "list-widgets", &user, &[(&[group], &["widgets"], &["list", "watch"])]).await;
    let targets = Workloads::new(cluster.client_as(&user));
    let w = target(&format!("{group}/v1"), "Widget", &ns, "w");
    targets.watch(&w);

    let err = read_until(&targets, &w, "scale forbidden", |r| r.is_err()).await.expect_err("an error");
    assert!(
        matches!(&err, WorkloadError::Forbidden { verb, resource, .. } if verb == "get" && resource == "widgets/scale"),
        "{err:?}"
    );
    // Granting /scale: the target retries by itself (the object does not change).
    cluster.grant(&ns, "get-widget-scale", &user, &[(&[group], &["widgets/scale"], &["get"])]).await;
    let err = read_until(
        &targets,
        &w,
        "pods forbidden",
        |r| matches!(r, Err(WorkloadError::Forbidden { resource, .. }) if resource == "pods"),
    )
    .await
    .expect_err("an error");
    assert!(err.to_string().contains("cannot list pods (core API group)"), "{err}");
    cluster.grant(&ns, "watch-pods", &user, &[(&[""], &["pods"], &["list", "watch"])]).await;
    let reading = eventually!(Duration::from_secs(40), "read after the grants", {
        targets.read(&w).await.map_err(|e| e.to_string())
    });
    assert_eq!((reading.spec_replicas, reading.status_replicas, reading.ready_replicas), (2, 2, Some(1)));
}

#[tokio::test]
async fn reads_come_from_the_watch_cache_and_follow_external_changes() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("cache").await;
    let user = format!("cache-reader-{ns}");
    cluster
        .grant(
            &ns,
            "autoscaler",
            &user,
            &[(&["apps"], &["deployments"], &["list", "watch"]), (&["apps"], &["deployments/scale"], &["patch"])],
        )
        .await;
    cluster.create_deployment(&ns, "web", 2).await;
    cluster.create_deployment(&ns, "api", 2).await;
    cluster.set_workload_status("Deployment", &ns, "web", 2, 2).await;

    let targets = Workloads::new(cluster.client_as(&user));
    let web = target("apps/v1", "Deployment", &ns, "web");
    let api = target("apps/v1", "Deployment", &ns, "api");
    targets.watch(&web);
    targets.watch(&api);
    targets.watch(&web); // counted: a second autoscaler on the same target
    assert_eq!(targets.len(), 2);

    let first = reading_where(&targets, &web, "first read", |r| r.ready_replicas == Some(2)).await;
    assert_eq!(first.spec_replicas, 2);
    for _ in 0..50 {
        targets.read(&web).await.expect("cached read");
        targets.read(&api).await.expect("cached read");
    }
    // Someone else changes the object: the cache sees it without being asked.
    cluster.set_workload_status("Deployment", &ns, "web", 2, 1).await;
    manual_scale(cluster, "Deployment", &ns, "api", 4).await;
    reading_where(&targets, &web, "external status change", |r| r.ready_replicas == Some(1)).await;
    reading_where(&targets, &api, "external scale", |r| r.spec_replicas == 4).await;
    // A target added while the namespace's watch runs is served too (the store holds every
    // deployment of the namespace).
    cluster.create_deployment(&ns, "late", 3).await;
    let late = target("apps/v1", "Deployment", &ns, "late");
    targets.watch(&late);
    assert_eq!(targets.read(&late).await.expect("late target").spec_replicas, 3);
    assert_eq!(
        watermarkd::testing::workload_watches(&targets),
        1,
        "one watch serves every deployment of the namespace"
    );

    let requests = cluster.requests_by(&user);
    let on_deployments: Vec<_> = requests.iter().filter(|r| r.resource == "deployments").collect();
    assert!(
        on_deployments.iter().all(|r| r.verb == "list" || r.verb == "watch"),
        "only list and watch, never a GET per read: {on_deployments:#?}"
    );
    // One list at the start; a late target needs no re-list (at most a check of its one name
    // if its creation had not reached the watch yet); never one per read.
    let lists = on_deployments.iter().filter(|r| r.verb == "list").count();
    assert!((1..=2).contains(&lists), "{on_deployments:#?}");
    assert!(on_deployments.iter().all(|r| r.namespace == ns), "namespace-scoped watches only: {on_deployments:#?}");
    assert!(requests.iter().all(|r| r.resource != "pods"), "no pod requests for deployments: {requests:#?}");

    // One write per scale.
    let reading = targets.read(&api).await.expect("a reading");
    targets.scale(&api, &reading, 6).await.expect("scale");
    targets.scale(&api, &ScaleReading { spec_replicas: 6, ..reading.clone() }, 6).await.expect("no-op scale");
    let patches: Vec<_> = cluster.requests_by(&user).into_iter().filter(|r| r.verb == "patch").collect();
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!((patches[0].subresource.as_str(), patches[0].name.as_str()), ("scale", "api"));

    // Unwatching the last reference stops the namespace's watch.
    targets.unwatch(&web);
    assert_eq!(targets.len(), 3, "web is still watched once");
    targets.unwatch(&web);
    targets.unwatch(&api);
    targets.unwatch(&late);
    assert!(targets.is_empty());
    eventually!(WAIT, "watch stopped", {
        match watermarkd::testing::workload_watches(&targets) {
            0 => Ok(()),
            n => Err(format!("{n} watches")),
        }
    });
}

#[tokio::test]
async fn connect_uses_the_kubeconfig_and_its_contexts() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("connect").await;
    cluster.create_statefulset(&ns, "db", 1).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&path, kube_cluster::ADMIN_TOKEN);

    for context in [None, Some("test")] {
        let client = connect(Some(&path), context).await.expect("connect with the kubeconfig");
        let sets: Api<StatefulSet> = Api::namespaced(client, &ns);
        assert!(sets.get("db").await.is_ok(), "context {context:?}");
    }
    let Err(err) = connect(Some(&path), Some("nonexistent")).await else { panic!("connected to no such context") };
    assert!(matches!(err, WorkloadError::Config(_)), "{err:?}");
    let Err(err) = connect(Some(&dir.path().join("missing")), None).await else { panic!("connected with no file") };
    assert!(matches!(&err, WorkloadError::Config(m) if m.contains("missing")), "{err:?}");
}
