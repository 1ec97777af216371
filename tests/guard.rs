//! The guard on a real kube-apiserver: a target another controller scales (an HPA, another
//! controller's WPA) is not written, and the daemon says so in the status API, an Event, a WPA
//! condition and its series; deleting the HPA lets the writes resume; `take_over` writes beside an
//! HPA from the current replicas, by the rule's limited step; `wpa_selector` leaves the WPAs it
//! does not match alone. The daemon runs as a separate process against a real Prometheus or the
//! local Datadog stand-in.
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
#[path = "support/kube_cluster.rs"]
mod kube_cluster;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;

use std::time::Duration;

use daemon_process::{write, DaemonProcess};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use prometheus_server::{Exporter, PrometheusServer};
use serde_json::{json, Value};
use watermarkd::domain::crd::{custom_resource_definition, WatermarkPodAutoscaler};

const STARTUP: Duration = Duration::from_secs(30);

/// HPAs through autoscaling/v1, which every API server serves (the test server, 1.20, has no v2);
/// each version shows the same objects.
fn hpa_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("autoscaling", "v1", "HorizontalPodAutoscaler"),
        "horizontalpodautoscalers",
    )
}

async fn create_hpa(cluster: &KubeCluster, namespace: &str, name: &str, target: &str) {
    let hpa: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": target },
            "minReplicas": 1, "maxReplicas": 10, "targetCPUUtilizationPercentage": 60
        }
    }))
    .expect("an HPA");
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &hpa_resource());
    api.create(&PostParams::default(), &hpa).await.expect("create HPA");
}

async fn events_about(cluster: &KubeCluster, namespace: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(cluster.client(), namespace);
    let list = api.list(&ListParams::default()).await.expect("list events");
    list.items.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)).collect()
}

/// The event of `reason` about `name`, once there is one.
async fn event(cluster: &KubeCluster, namespace: &str, name: &str, reason: &str) -> Event {
    eventually!(Duration::from_secs(15), &format!("a {reason} event on {name}"), {
        let events = events_about(cluster, namespace, name).await;
        match events.iter().find(|e| e.reason.as_deref() == Some(reason)) {
            Some(event) => Ok(event.clone()),
            None => Err(format!("{events:?}")),
        }
    })
}

/// Holds `replicas` on the Deployment for `seconds`, failing at the first other count.
async fn stays_at(cluster: &KubeCluster, ns: &str, name: &str, replicas: i64, seconds: u64) {
    for _ in 0..seconds * 2 {
        assert_eq!(cluster.spec_replicas("Deployment", ns, name).await, replicas, "the count moved from {replicas}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One autoscaler `web` on the Deployment `web` of `namespace`, on `load` from Prometheus
/// (absolute, watermarks 5..10, every second), with `extra` rule lines.
fn rules(prometheus: &str, namespace: &str, extra: &str) -> String {
    format!(
        "[backend.prom]\ntype = \"prometheus\"\nurl = \"{prometheus}\"\n\n[[autoscaler]]\nname = \"web\"\n\
         target = {{ kind = \"Deployment\", namespace = \"{namespace}\", name = \"web\" }}\ninterval = \"1s\"\n\
         min_replicas = 1\nalgorithm = \"absolute\"\n{extra}\n\
         [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = 'load'\nhigh_watermark = 10\nlow_watermark = 5\n"
    )
}

/// The daemon on `dir`'s `rules.toml`, in `ns`, as the only one (no leader election), once ready.
async fn start_daemon(cluster: &KubeCluster, dir: &std::path::Path, ns: &str) -> DaemonProcess {
    let kubeconfig = dir.join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let config = dir.join("rules.toml");
    let args = [
        "--config",
        config.to_str().expect("utf-8"),
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8"),
        "--lease-namespace",
        ns,
        "--no-leader-election",
    ];
    let mut daemon = DaemonProcess::start(&args, &[]);
    daemon.wait_ready(STARTUP).await;
    daemon
}

/// The status API's detail of `id`, once its last decision satisfies `ready`.
async fn detail(daemon: &DaemonProcess, id: &str, ready: impl Fn(&Value) -> bool) -> Value {
    eventually!(Duration::from_secs(15), &format!("the status of {id}"), {
        match daemon.get(&format!("/api/v1/autoscalers/{id}")).await {
            Ok((200, body)) => {
                let value: Value = serde_json::from_str(&body).expect("JSON");
                if ready(&value) {
                    Ok(value)
                } else {
                    Err(body)
                }
            }
            other => Err(format!("{other:?}")),
        }
    })
}

/// An HPA on the target: the rules-file autoscaler decides, writes nothing, and says so (status
/// API, Warning Event on the target, series, log); once the HPA is deleted it scales, and says that
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_on_the_target_holds_the_writes_until_it_is_deleted() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("e2e-guard").await;
    cluster.create_deployment(&ns, "web", 2).await;
    cluster.set_workload_status("Deployment", &ns, "web", 2, 2).await;
    create_hpa(cluster, &ns, "web", "web").await;
    let exporter = Exporter::start("load 30\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    write(
        &config,
        &rules(
            &prometheus.url(),
            &ns,
            "max_replicas = 10\nupscale_forbidden_window = \"1s\"\ndownscale_forbidden_window = \"1s\"\n",
        ),
    );
    let mut daemon = start_daemon(cluster, dir.path(), &ns).await;

    let claimed_by = format!("HorizontalPodAutoscaler/{ns}/web");
    // Once Prometheus has scraped the load: held with a decision to scale.
    let held = detail(&daemon, "file/web", |d| {
        d["last"]["claimed_by"].as_array().is_some_and(|c| !c.is_empty()) && d["last"]["proposal"].is_u64()
    })
    .await;
    assert_eq!(held["last"]["claimed_by"], json!([claimed_by]), "{held}");
    assert_eq!(held["state"], "paused", "{held}");
    let headline = held["last"]["explanation"][0].as_str().unwrap_or_default();
    assert!(
        headline
            .starts_with(&format!("would scale up from 2 to 3, but HorizontalPodAutoscaler {ns}/web already scales")),
        "{headline}"
    );
    stays_at(cluster, &ns, "web", 2, 3).await;
    let warning = event(cluster, &ns, "web", "TargetClaimed").await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning.note.as_deref().unwrap_or_default().contains(&format!("HorizontalPodAutoscaler {ns}/web")),
        "{warning:?}"
    );
    let claimed =
        events_about(cluster, &ns, "web").await.into_iter().filter(|e| e.reason.as_deref() == Some("TargetClaimed"));
    assert_eq!(claimed.count(), 1, "said once, not every evaluation");
    assert_eq!(
        daemon.sample("watermarkd_target_claimed", &[("wpa_name", "web"), ("claimed_by", &claimed_by)]).await,
        Some(1.0)
    );
    assert!(daemon.log().contains("already scales this target"), "the log says it");

    let hpas: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &hpa_resource());
    hpas.delete("web", &DeleteParams::default()).await.expect("delete HPA");
    eventually!(Duration::from_secs(20), "web scaled once the HPA is gone", {
        match cluster.spec_replicas("Deployment", &ns, "web").await {
            n if n > 2 => Ok(()),
            n => Err(format!("{n} replicas")),
        }
    });
    event(cluster, &ns, "web", "TargetReleased").await;
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}

/// `take_over = true` beside an HPA: the first write is the rule's limited step from the replicas
/// the HPA left (5 -> 6 with a 20% limit, where the metric asks for 20), and an Event says it
/// takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_from_an_hpa_starts_from_the_current_replicas_without_a_jump() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("e2e-takeover").await;
    cluster.create_deployment(&ns, "web", 5).await;
    cluster.set_workload_status("Deployment", &ns, "web", 5, 5).await;
    create_hpa(cluster, &ns, "web", "web").await;
    // 40 against a high watermark of 10 at 5 replicas: 20 asked for.
    let exporter = Exporter::start("load 40\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    // One write at most in this test: the window after it outlasts it.
    let extra = "max_replicas = 30\ntake_over = true\nscale_up_limit_factor = 20\nupscale_forbidden_window = \"1h\"\n";
    write(&config, &rules(&prometheus.url(), &ns, extra));
    let mut daemon = start_daemon(cluster, dir.path(), &ns).await;

    eventually!(Duration::from_secs(20), "web scaled beside the HPA", {
        match cluster.spec_replicas("Deployment", &ns, "web").await {
            5 => Err("5 replicas".to_string()),
            n => Ok(n),
        }
    });
    stays_at(cluster, &ns, "web", 6, 2).await;
    let taking = event(cluster, &ns, "web", "TakingOver").await;
    assert!(
        taking
            .note
            .as_deref()
            .unwrap_or_default()
            .starts_with(&format!("taking over Deployment {ns}/web from HorizontalPodAutoscaler {ns}/web")),
        "{taking:?}"
    );
    let detail = detail(&daemon, "file/web", |d| d["last_scale"].is_object()).await;
    assert_eq!(detail["last_scale"]["from"], 5, "{detail}");
    assert_eq!(detail["last_scale"]["to"], 6, "{detail}");
    assert_eq!(detail["last"]["proposal"], 20, "what the metric asked for: {detail}");
    assert_eq!(
        daemon
            .sample(
                "watermarkd_target_claimed",
                &[("wpa_name", "web"), ("claimed_by", &format!("HorizontalPodAutoscaler/{ns}/web"))]
            )
            .await,
        Some(0.0),
        "claimed, and taken over"
    );
    assert!(daemon.log().contains(&format!("taking over Deployment {ns}/web")), "the log says it");
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}

fn wpa_resource() -> ApiResource {
    ApiResource::erase::<WatermarkPodAutoscaler>(&())
}

/// A WPA on `target` with the watermarks 1..2 on `load{app:TARGET}`, with `labels`.
async fn apply_wpa(cluster: &KubeCluster, namespace: &str, name: &str, target: &str, labels: Value) {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
        "metadata": { "name": name, "namespace": namespace, "labels": labels },
        "spec": { "maxReplicas": 5, "minReplicas": 1,
            "upscaleForbiddenWindowSeconds": 1, "downscaleForbiddenWindowSeconds": 1,
            "scaleTargetRef": { "kind": "Deployment", "apiVersion": "apps/v1", "name": target },
            "metrics": [{ "type": "External",
                "external": { "highWatermark": "2", "lowWatermark": "1", "metricName": "load",
                    "metricSelector": { "matchLabels": { "app": target } } } }] }
    }))
    .expect("WPA object");
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &wpa_resource());
    api.create(&PostParams::default(), &object).await.expect("create WPA");
}

/// The WPA CRD, once for the tests of this file.
async fn install_crd(cluster: &KubeCluster) {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            cluster.create_crd(&custom_resource_definition()).await;
        })
        .await;
}

async fn wpa_status(cluster: &KubeCluster, namespace: &str, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &wpa_resource());
    api.get(name).await.expect("get WPA").data["status"].clone()
}

/// `--wpa-selector`: the daemon runs only the labelled WPAs. An unlabelled one gets no status and
/// its target is not scaled; one that shares a labelled WPA's target claims it, so the labelled one
/// writes nothing and says so in its `AbleToScale` condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wpa_selector_leaves_the_other_wpas_to_their_controller_and_counts_them_as_claimants() {
    let cluster = KubeCluster::shared();
    install_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-selector").await;
    for name in ["web", "api"] {
        cluster.create_deployment(&ns, name, 1).await;
        cluster.set_workload_status("Deployment", &ns, name, 1, 1).await;
    }
    let datadog = fake_datadog::FakeDatadog::start().await;
    for target in ["web", "api"] {
        let query = format!("avg:load{{app:{target}}}.rollup(30)");
        datadog.set(&query, fake_datadog::Behavior::Series(fake_datadog::SeriesSpec::constant(10.0)));
    }
    let ours = json!({ "watermarkd.io/controller": "watermarkd" });
    apply_wpa(cluster, &ns, "web-ours", "web", ours).await;
    apply_wpa(cluster, &ns, "web-theirs", "web", json!({ "watermarkd.io/controller": "datadog" })).await;
    apply_wpa(cluster, &ns, "api-theirs", "api", json!({})).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    write(
        &config,
        &format!(
            "[backend.datadog]\ntype = \"datadog\"\nurl = \"{}\"\napi_key_env = \"DD_API_KEY\"\napp_key_env = \"DD_APP_KEY\"\n",
            datadog.url
        ),
    );
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let args = [
        "--config",
        config.to_str().expect("utf-8"),
        "--crd",
        "--namespace",
        &ns,
        "--wpa-selector",
        "watermarkd.io/controller=watermarkd",
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8"),
        "--no-leader-election",
        "--lease-namespace",
        &ns,
        "--default-interval",
        "1s",
    ];
    let env = [("DD_API_KEY", fake_datadog::API_KEY), ("DD_APP_KEY", fake_datadog::APP_KEY)];
    let mut daemon = DaemonProcess::start(&args, &env);
    daemon.wait_ready(STARTUP).await;

    let status = eventually!(Duration::from_secs(20), "web-ours held by web-theirs", {
        let status = wpa_status(cluster, &ns, "web-ours").await;
        let able = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "AbleToScale")).cloned();
        match able {
            Some(c) if c["reason"] == "TargetClaimed" => Ok(status),
            _ => Err(status.to_string()),
        }
    });
    let able = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "AbleToScale"))
        .expect("AbleToScale");
    assert_eq!(able["status"], "False", "{status}");
    assert!(
        able["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("WatermarkPodAutoscaler {ns}/web-theirs already scales")),
        "{status}"
    );
    assert_eq!(status["lastConditionType"], "AbleToScale", "kubectl get wpa shows it: {status}");
    stays_at(cluster, &ns, "web", 1, 2).await;
    stays_at(cluster, &ns, "api", 1, 1).await;
    for theirs in ["web-theirs", "api-theirs"] {
        assert_eq!(wpa_status(cluster, &ns, theirs).await, Value::Null, "no status written to {theirs}");
    }
    let listed = daemon.get("/api/v1/autoscalers").await.expect("the list").1;
    let listed: Value = serde_json::from_str(&listed).expect("JSON");
    let ids: Vec<&str> =
        listed["autoscalers"].as_array().into_iter().flatten().filter_map(|a| a["id"].as_str()).collect();
    assert_eq!(ids, [format!("crd/{ns}/web-ours")], "only the selected WPA runs: {listed}");
    event(cluster, &ns, "web-ours", "TargetClaimed").await;
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}

/// `observe = true` beside an HPA: the autoscaler never writes, and records beside each decision
/// what the HPA ran (the target's replicas, the HPA's own status), with the running comparison, in
/// the status API, the series and `watermarkd status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observing_beside_an_hpa_records_what_it_ran() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("e2e-observe").await;
    cluster.create_deployment(&ns, "web", 3).await;
    cluster.set_workload_status("Deployment", &ns, "web", 3, 3).await;
    create_hpa(cluster, &ns, "web", "web").await;
    // What the HPA controller would have written: it saw 3 and asks for 4.
    let hpas: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &ns, &hpa_resource());
    let status = json!({ "status": { "currentReplicas": 3, "desiredReplicas": 4 } });
    hpas.patch_status("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status))
        .await
        .expect("the HPA's status");
    // 30 against a high watermark of 10 at 3 replicas: above the band at the HPA's count.
    let exporter = Exporter::start("load 30\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    write(&config, &rules(&prometheus.url(), &ns, "max_replicas = 20\nobserve = true\n"));
    let mut daemon = start_daemon(cluster, dir.path(), &ns).await;

    let controller = format!("HorizontalPodAutoscaler/{ns}/web");
    // Once both sides have run a while on the load: watermarkd's larger count has added up.
    let observed = detail(&daemon, "file/web", |d| {
        let sides = &d["observed"]["comparison"];
        d["last"]["proposal"].is_u64()
            && sides["live"]["above_band_seconds"].as_f64() > Some(1.0)
            && sides["watermarkd"]["replica_seconds"].as_f64() > sides["live"]["replica_seconds"].as_f64()
    })
    .await;
    let live = &observed["observed"]["live"];
    assert_eq!(live["controller"], json!(controller), "{observed}");
    assert_eq!(
        (live["replicas"].as_u64(), live["desired"].as_u64(), live["current"].as_u64()),
        (Some(3), Some(4), Some(3))
    );
    let comparison = &observed["observed"]["comparison"];
    let decided = observed["last"]["replicas"].as_u64().expect("replicas decided");
    assert_eq!(decided, 4, "from the 3 that run, limited by scale_up_limit_factor 50%: {observed}");
    assert_eq!(comparison["watermarkd"]["replicas"].as_u64(), Some(decided), "{observed}");
    assert_eq!(comparison["live"]["replicas"], 3, "{observed}");
    assert!(comparison["evaluations"].as_u64() >= Some(2), "{observed}");
    assert_eq!(comparison["largest_gap"].as_u64(), Some(decided - 3), "{observed}");
    assert_eq!(comparison["live"]["scale_events"], 0, "the HPA's count did not move: {observed}");
    // Its would-be scale starts no forbidden window: it would set 4 from the 3 that run, every
    // time, and its count changed once (3, before the data came, to 4).
    assert_eq!(comparison["watermarkd"]["scale_events"], 1, "{observed}");
    // Observing never writes, whatever it decides.
    stays_at(cluster, &ns, "web", 3, 2).await;

    let labels = [("wpa_name", "web"), ("controller", controller.as_str())];
    assert_eq!(daemon.sample("watermarkd_observed_live_replicas", &labels).await, Some(3.0));
    let live_side = [("wpa_name", "web"), ("side", "live")];
    assert!(daemon.sample("watermarkd_observed_above_band_seconds_total", &live_side).await > Some(0.0));
    assert!(daemon.sample("watermarkd_observed_largest_gap_replicas", &[("wpa_name", "web")]).await >= Some(1.0));

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["status", "--url", &format!("http://{}", daemon.listen), "web"])
        .output()
        .expect("watermarkd status");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains(&format!("beside {controller}: it runs 3, watermarkd would set")), "{text}");
    assert!(text.contains("(its status: desiredReplicas 4, currentReplicas 3)"), "{text}");
    let (code, page) = daemon.get("/ui/autoscaler/file%2Fweb").await.expect("the page");
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("<h2>Beside the live controller</h2>"), "{page}");
    assert!(page.contains(&format!("beside {controller}: it runs 3, watermarkd would set 4")), "{page}");
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}

/// A daemon that runs only a rules file (no CRD mode) still sees the WPAs of the cluster as
/// another controller's: a WPA on its target holds its writes, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_crd_mode_a_wpa_on_the_target_holds_the_writes() {
    let cluster = KubeCluster::shared();
    install_crd(cluster).await;
    let ns = cluster.unique_namespace("e2e-filewpa").await;
    cluster.create_deployment(&ns, "web", 2).await;
    cluster.set_workload_status("Deployment", &ns, "web", 2, 2).await;
    apply_wpa(cluster, &ns, "theirs", "web", json!({})).await;
    let exporter = Exporter::start("load 30\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    write(&config, &rules(&prometheus.url(), &ns, "max_replicas = 10\n"));
    let mut daemon = start_daemon(cluster, dir.path(), &ns).await;

    let held = detail(&daemon, "file/web", |d| d["last"]["proposal"].is_u64()).await;
    assert_eq!(held["last"]["claimed_by"], json!([format!("WatermarkPodAutoscaler/{ns}/theirs")]), "{held}");
    stays_at(cluster, &ns, "web", 2, 2).await;
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit; log:\n{}", daemon.log());
}
