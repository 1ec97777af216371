//! `watermarkd import` as a person runs it: the real binary on the manifests of
//! tests/fixtures/import (shaped as the upstream projects' documentation writes them), the
//! rules it writes read back by `watermarkd check`, its errors, prometheus-adapter's queries
//! against a real Prometheus, and the objects of a real kube-apiserver.

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
#[path = "support/prometheus_server.rs"]
mod prometheus_server;
#[path = "support/raw_http.rs"]
mod raw_http;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use prometheus_server::{Exporter, PrometheusServer};

const BIN: &str = env!("CARGO_BIN_EXE_watermarkd");

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import").join(name).display().to_string()
}

fn import(args: &[&str]) -> Output {
    Command::new(BIN).arg("import").args(args).output().expect("run watermarkd import")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The rules an import must write: exit 0, and the text.
fn imported(args: &[&str]) -> String {
    let out = import(args);
    assert!(out.status.success(), "import {args:?} exited {}:\n{}", out.status, text(&out.stderr));
    text(&out.stdout)
}

fn write_temp(dir: &tempfile::TempDir, name: &str, content: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path
}

/// `watermarkd check` on `rules`: it must accept them.
fn check_accepts(rules: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write_temp(&dir, "imported.toml", rules);
    let out = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    assert!(out.status.success(), "check refused what import wrote:\n{}\n{rules}", text(&out.stdout));
    text(&out.stdout)
}

fn adapter_args() -> Vec<String> {
    vec![
        fixture("shop-web.yaml"),
        "--adapter-config".into(),
        fixture("prometheus-adapter.yaml"),
        "--prometheus-url".into(),
        "http://prometheus.monitoring:9090".into(),
    ]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn every_corpus_manifest_imports_into_rules_check_accepts() {
    let corpus: Vec<Vec<String>> = vec![
        adapter_args(),
        vec![
            fixture("datadog-hpa.yaml"),
            "--datadog-cluster-agent".into(),
            "--datadog-site".into(),
            "datadoghq.eu".into(),
        ],
        vec![fixture("keda.yaml")],
        vec![fixture("wpa.yaml")],
    ];
    for args in &corpus {
        let rules = imported(&strs(args));
        let autoscalers = rules.matches("\n[[autoscaler]]\n").count();
        assert!(autoscalers > 0, "{args:?} wrote no autoscaler:\n{rules}");
        assert_eq!(rules.matches("\nobserve = true\n").count(), autoscalers, "each one observes:\n{rules}");
        let summary = check_accepts(&rules);
        assert!(summary.contains(&format!("ok, {autoscalers} autoscaler")), "{summary}");

        let mut active = strs(args);
        active.push("--active");
        let rules = imported(&active);
        assert!(!rules.contains("observe"), "--active writes no observe:\n{rules}");
        check_accepts(&rules);
    }
}

#[test]
fn an_hpa_on_prometheus_adapter_becomes_the_queries_the_adapter_runs() {
    let rules = imported(&strs(&adapter_args()));
    for line in [
        "# From HorizontalPodAutoscaler shop/web (",
        "shop-web.yaml#3).",
        "target = { api_version = 'apps/v1', kind = 'Deployment', namespace = 'shop', name = 'web' }",
        "min_replicas = 3",
        "max_replicas = 40",
        // An External AverageValue is a total: the autoscaler shares its values.
        "algorithm = 'average'",
        "tolerance = 0.1",
        // behavior as written, each direction's.
        "stabilization_window = '600s'",
        "select_policy = 'min'",
        "policies = [{ type = 'percent', value = 10, period = '60s' }, { type = 'pods', value = 2, period = '60s' }]",
        "policies = [{ type = 'percent', value = 100, period = '30s' }, { type = 'pods', value = 6, period = '30s' }]",
        // 70% of the 400m + 100m the pod requests.
        "selector = 'app.kubernetes.io/name=web'",
        "high_watermark = 0.350",
        "pod_aggregation = 'sum'",
        // The walkthrough's rate rule, for the Deployment's pods.
        r#"query = 'sum(sum(rate(http_requests_total{namespace="shop",pod=~"web-[a-z0-9]+-[a-z0-9]+"}[2m])) by (pod))'"#,
        // The ingress rule, for the described Ingress, by its override labels.
        r#"query = 'sum(rate(nginx_ingress_controller_requests{exported_namespace="shop",ingress="web"}[2m])) by (ingress)'"#,
        // The external rule: the selector, then the namespace; summed as the HPA sums.
        r#"query = 'sum(rabbitmq_queue_messages_ready{queue="orders",namespace="shop"}) by (queue)'"#,
        "reducer = 'sum'",
        "[backend.prometheus]",
        "url = 'http://prometheus.monitoring:9090'",
        // The v2beta2 HPA on a StatefulSet: per replica, the pods' average.
        "name = 'shop/checkout'",
        r#"query = 'avg(sum(rate(http_requests_total{namespace="shop",pod=~"checkout-[0-9]+"}[2m])) by (pod))'"#,
        "high_watermark = '500m'",
        "stabilization_window = '300s'  # the HPA's default",
    ] {
        assert!(rules.contains(line), "no {line:?} in:\n{rules}");
    }
    // What was assumed where it depends on the pods at run time.
    assert!(rules.contains("stands for them"), "{rules}");
}

#[test]
fn datadog_cluster_agent_metrics_become_datadog_queries() {
    let rules = imported(&[&fixture("datadog-hpa.yaml"), "--datadog-cluster-agent"]);
    for line in [
        "query = 'avg:trace.http.request.duration.by.service.95p{service:payments,env:prod}'",
        "high_watermark = '250m'",
        "query = 'avg:nginx.net.request_per_s{kube_container_name:nginx,kube_namespace:edge}.rollup(30)'",
        "api_key_env = 'DD_API_KEY'",
        "site = 'datadoghq.com'",
    ] {
        assert!(rules.contains(line), "no {line:?} in:\n{rules}");
    }
    // Without being told who serves it, a plain External metric is not guessed.
    let out = import(&[&fixture("datadog-hpa.yaml")]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("datadog-hpa.yaml#3: HorizontalPodAutoscaler edge/nginx: spec.metrics[0]:"), "{err}");
    assert!(err.contains("--datadog-cluster-agent"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn keda_scaled_objects_keep_zero_activation_cron_fallback_and_auth_sources() {
    let rules = imported(&[&fixture("keda.yaml")]);
    for line in [
        "name = 'jobs/worker'",
        "min_replicas = 0  # KEDA scales this one to zero",
        "scale_to_zero_delay = '600s'",
        "activation = 5",
        "high_watermark = 20",
        "cron = '0 8 * * 1-5'",
        "duration = '630m'",
        "time_zone = 'Europe/Paris'",
        "min_replicas = 4  # the floor while it is open",
        "bearer_token_env = 'PROMETHEUS_READER_TOKEN'",
        "name = 'jobs/api'",
        "min_replicas = 3",
        "api_key_env = 'DATADOG_SECRETS_API_KEY'",
        "window = '120s'",
        "query = 'sum:trace.http.request.hits{service:api,env:prod}.as_rate()'",
        "high_watermark = 0.60",
        "[autoscaler.fallback]",
        "after = '120s'",
        "replicas = 10",
        "policies = [{ type = 'percent', value = 20, period = '60s' }]",
    ] {
        assert!(rules.contains(line), "no {line:?} in:\n{rules}");
    }
    // Never a secret's value: only where it comes from.
    assert!(rules.contains("key \"token\" of Secret jobs/prometheus-reader"), "{rules}");
}

#[test]
fn a_wpa_is_written_as_crd_mode_reads_it() {
    let rules = imported(&[&fixture("wpa.yaml")]);
    for line in [
        "name = 'store/checkout'",
        "tolerance = 0.01",
        "scale_down_limit_factor = 30",
        "downscale_delay_below_watermark = '120s'",
        "query = 'avg:custom.request_duration.max{service:checkout}.rollup(30)'",
        "high_watermark = 0.4",
        "low_watermark = 0.15",
    ] {
        assert!(rules.contains(line), "no {line:?} in:\n{rules}");
    }
}

/// Bad input: exit 1, nothing on standard output, an error naming the file, document and field.
fn refused(args: &[&str], wanted: &[&str]) {
    let out = import(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} wrote rules:\n{}", text(&out.stdout));
    for part in wanted {
        assert!(err.contains(part), "{args:?}: no {part:?} in:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_an_error_naming_the_file_document_and_field() {
    refused(&[&fixture("not-yaml.yaml")], &["error: ", "not-yaml.yaml#2: is not YAML"]);
    refused(
        &[&fixture("unknown-kind.yaml")],
        &["unknown-kind.yaml#1: HorizontalPodAutoscalr shop/web: kind: HorizontalPodAutoscalr (autoscaling/v2) is a kind"],
    );
    refused(
        &[&fixture("missing-field.yaml")],
        &[
            "missing-field.yaml#1: HorizontalPodAutoscaler shop/web: spec.maxReplicas: is required",
            "spec.metrics[0].external.target.averageValue: is required with type AverageValue",
        ],
    );
    // A metricsQuery the adapter itself does not parse.
    refused(
        &[
            &fixture("shop-web.yaml"),
            "--adapter-config",
            &fixture("bad-adapter.yaml"),
            "--prometheus-url",
            "http://p:9090",
        ],
        &["bad-adapter.yaml#1: prometheus-adapter configuration: rules[1].metricsQuery:", "not closed by >>"],
    );
    // A document that is a list of words, and a file that does not exist.
    let dir = tempfile::tempdir().unwrap();
    let words = write_temp(&dir, "words.yaml", "just some words\n");
    refused(&[words.to_str().unwrap()], &["words.yaml#1: is text, not a Kubernetes object"]);
    let out = import(&["/nonexistent/hpa.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/hpa.yaml"), "{}", text(&out.stderr));
}

#[test]
fn what_cannot_be_carried_over_exits_1_and_partial_writes_the_rest() {
    let out = import(&[&fixture("kafka.yaml")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("not carried over: ")
            && err.contains("kafka.yaml#1: ScaledObject streams/consumer: spec.triggers[0].type:"),
        "{err}"
    );
    assert!(err.contains("--partial"), "{err}");

    let out = import(&[&fixture("kafka.yaml"), "--partial"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rules = text(&out.stdout);
    assert!(rules.contains("name = 'streams/indexer'"), "{rules}");
    assert!(!rules.contains("streams/consumer"), "{rules}");
    assert!(text(&out.stderr).contains("spec.triggers[0].type"), "still listed with --partial");
    check_accepts(&rules);

    // A Utilization without the Deployment's manifest: its requests are unknown.
    let dir = tempfile::tempdir().unwrap();
    let hpa = std::fs::read_to_string(fixture("shop-web.yaml")).unwrap();
    let only_hpa: Vec<&str> = hpa.split("\n---\n").filter(|d| d.contains("kind: HorizontalPodAutoscaler")).collect();
    let path = write_temp(&dir, "hpa-only.yaml", &only_hpa.join("\n---\n"));
    let out = import(&[
        path.to_str().unwrap(),
        "--adapter-config",
        &fixture("prometheus-adapter.yaml"),
        "--prometheus-url",
        "http://p:9090",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("hpa-only.yaml#1: HorizontalPodAutoscaler shop/web: spec.metrics[0]: needs the pods"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn standard_input_takes_json_and_list_objects() {
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [{
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "api" },
            "spec": {
                "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "api" },
                "maxReplicas": 5,
                "metrics": [{ "type": "External", "external": {
                    "metric": { "name": "datadogmetric@team:api-rps" },
                    "target": { "type": "AverageValue", "averageValue": "150" } } }]
            }
        }, {
            "apiVersion": "datadoghq.com/v1alpha1",
            "kind": "DatadogMetric",
            "metadata": { "name": "api-rps", "namespace": "team" },
            "spec": { "query": "sum:nginx.requests{service:api}.as_rate()" }
        }]
    });
    let mut child = Command::new(BIN)
        .args(["import", "-", "-n", "team"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(list.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rules = text(&out.stdout);
    assert!(rules.contains("From HorizontalPodAutoscaler team/api (-#1 items[0])"), "{rules}");
    assert!(rules.contains("metadata.namespace is not set: team assumed"), "{rules}");
    assert!(rules.contains("query = 'sum:nginx.requests{service:api}.as_rate()'"), "{rules}");
    check_accepts(&rules);
}

// ---------------------------------------------------------------------------------------------
// A real Prometheus: the value of the imported query is the value the adapter served the HPA.

/// `%`-encodes a query for a URL.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The values of an instant query, asked of Prometheus itself, one per series.
async fn prometheus_values(server: &PrometheusServer, query: &str) -> Vec<f64> {
    let url = server.url();
    let address = url.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
    let stream = raw_http::connect_from("127.0.0.1", address).await;
    let answer = raw_http::ask(stream, &format!("/api/v1/query?query={}", encode(query))).await;
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    json["data"]["result"]
        .as_array()
        .map(|series| series.iter().map(|s| s["value"][1].as_str().unwrap().parse::<f64>().unwrap()).collect())
        .unwrap_or_default()
}

/// The `value X` lines of `watermarkd query`, in order.
fn queried_values(rules: &Path) -> Vec<f64> {
    let out = Command::new(BIN).args(["query", "--rules"]).arg(rules).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "query failed:\n{stdout}{}", text(&out.stderr));
    stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("value "))
        .map(|l| l.split_whitespace().next().unwrap().parse::<f64>().unwrap())
        .collect()
}

const ADAPTER_CONFIG: &str = r#"
rules:
- seriesQuery: '{__name__=~"^wm_import_.*",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
      pod: {resource: "pod"}
  name:
    matches: "^wm_import_(.*)$"
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{__name__="wm_import_queue_ready",queue!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
"#;

const HPAS: &str = r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 10
  metrics:
  - type: Pods
    pods:
      metric: {name: inflight_requests}
      target: {type: AverageValue, averageValue: "10"}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: orders, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: orders}
  maxReplicas: 10
  metrics:
  - type: External
    external:
      metric:
        name: wm_import_queue_ready
        selector: {matchLabels: {queue: orders}}
      target: {type: AverageValue, averageValue: "50"}
"#;

const SERIES: &str = "\
wm_import_inflight_requests{namespace=\"shop\",pod=\"web-7d9f8c6b5-abcde\"} 12
wm_import_inflight_requests{namespace=\"shop\",pod=\"web-7d9f8c6b5-fghij\"} 18
wm_import_inflight_requests{namespace=\"shop\",pod=\"webhook-6c7d8f-zzzzz\"} 50
wm_import_inflight_requests{namespace=\"other\",pod=\"web-7d9f8c6b5-qqqqq\"} 100
wm_import_queue_ready{namespace=\"shop\",queue=\"orders\"} 250
wm_import_queue_ready{namespace=\"shop\",queue=\"refunds\"} 7
wm_import_queue_ready{namespace=\"other\",queue=\"orders\"} 999
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_queries_read_what_prometheus_adapter_served_the_hpa() {
    let exporter = Exporter::start(SERIES).await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().unwrap();
    let adapter = write_temp(&dir, "adapter.yaml", ADAPTER_CONFIG);
    let hpas = write_temp(&dir, "hpas.yaml", HPAS);

    // The adapter's queries, expanded here by its documented rules for the HPAs' objects: the
    // pods of shop/web are named (the HPA asks for them by name), the external metric gets the
    // selector's label and the namespace's.
    let pods_query =
        r#"sum(wm_import_inflight_requests{namespace="shop",pod=~"web-7d9f8c6b5-abcde|web-7d9f8c6b5-fghij"}) by (pod)"#;
    let external_query = r#"sum(wm_import_queue_ready{queue="orders",namespace="shop"}) by (queue)"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (per_pod, external) = loop {
        let per_pod = prometheus_values(&server, pods_query).await;
        let external = prometheus_values(&server, external_query).await;
        if per_pod.len() == 2 && external.len() == 1 {
            break (per_pod, external);
        }
        assert!(Instant::now() < deadline, "Prometheus has not scraped the series: {}", server.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // What the HPA saw: the average of the pods' values (12 and 18), and the sum of the
    // external series.
    let hpa_pods_value = per_pod.iter().sum::<f64>() / per_pod.len() as f64;
    let hpa_external_value: f64 = external.iter().sum();
    assert_eq!((hpa_pods_value, hpa_external_value), (15.0, 250.0));

    let out = import(&[
        hpas.to_str().unwrap(),
        "--adapter-config",
        adapter.to_str().unwrap(),
        "--prometheus-url",
        &server.url(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rules = text(&out.stdout);
    let path = write_temp(&dir, "imported.toml", &rules);
    assert_eq!(queried_values(&path), [hpa_pods_value, hpa_external_value], "{rules}");
}

// ---------------------------------------------------------------------------------------------
// A real kube-apiserver: the live objects of a namespace.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_hpa_is_imported_from_the_cluster() {
    let cluster = kube_cluster::KubeCluster::shared();
    let namespace = cluster.unique_namespace("import").await;
    cluster.create_deployment(&namespace, "web", 2).await;
    // kube-apiserver 1.20 serves HPAs as autoscaling/v2beta2 (v2 came with 1.23): import asks
    // for v2 and falls back.
    let gvk = GroupVersionKind::gvk("autoscaling", "v2beta2", "HorizontalPodAutoscaler");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "horizontalpodautoscalers");
    let hpas: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &namespace, &resource);
    let hpa: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "autoscaling/v2beta2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": { "name": "web" },
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" },
            "minReplicas": 2,
            "maxReplicas": 7,
            "metrics": [{ "type": "Resource", "resource": { "name": "cpu",
                "target": { "type": "AverageValue", "averageValue": "300m" } } }],
            "behavior": { "scaleDown": { "stabilizationWindowSeconds": 60 } }
        }
    }))
    .unwrap();
    hpas.create(&PostParams::default(), &hpa).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, kube_cluster::ADMIN_TOKEN);
    let out = import(&["--kubeconfig", kubeconfig.to_str().unwrap(), "-n", &namespace]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rules = text(&out.stdout);
    for line in [
        format!("# From HorizontalPodAutoscaler {namespace}/web (the cluster)."),
        format!("target = {{ api_version = 'apps/v1', kind = 'Deployment', namespace = '{namespace}', name = 'web' }}"),
        "min_replicas = 2  # spec.minReplicas (default 1)".into(),
        "max_replicas = 7".into(),
        // The selector is the Deployment's, listed beside the HPA.
        "selector = 'app=web'".into(),
        "pod_aggregation = 'average'".into(),
        "high_watermark = '300m'".into(),
        "stabilization_window = '60s'".into(),
        "observe = true".into(),
    ] {
        assert!(rules.contains(&line), "no {line:?} in:\n{rules}");
    }
    check_accepts(&rules);
}
