//! CRD mode: the Datadog project's WatermarkPodAutoscaler fixtures parse and map onto the same
//! rules a rules file gives, `deploy/crd.yaml` is what `watermarkd crd` prints, and our CRD
//! accepts and rejects exactly what the Datadog CRD does, compared structurally and on a real
//! kube-apiserver (started by the test; scripts/install-test-deps installs it).

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

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube_cluster::KubeCluster;
use serde_json::{json, Value};
use watermarkd::domain::crd::{
    custom_resource_definition, map_wpa, next_status, status_changed, AllowedUrl, MapError, MappingOptions,
    NoDatadogMetrics, RecommenderPolicy, WatermarkPodAutoscaler,
};
use watermarkd::domain::outcome::ScaleWrite;
use watermarkd::domain::rules::load_rules;
use watermarkd_engine::{decide, Action, ConvergeTowards, Decimal, Reading, State, Target, Timestamp};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/wpa");
const DATADOG_CRD: &str = "datadoghq.com_watermarkpodautoscalers.yaml";
/// Every object in the fixtures directory (everything but the CRD and the README).
const OBJECTS: [&str; 5] = [
    "billing-complete.yaml",
    "datadoghq_v1alpha1_watermarkpodautoscaler.yaml",
    "external-type.yaml",
    "recommender.yaml",
    "resource-type.yaml",
];

fn fixture(name: &str) -> String {
    let path = Path::new(FIXTURES).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn wpa(name: &str) -> WatermarkPodAutoscaler {
    serde_yaml_ng::from_str(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The Datadog recommender sample's URL is allowed, as an operator running it would allow it.
fn options() -> MappingOptions {
    let allowed = AllowedUrl::parse("http://recommender:8080").unwrap();
    MappingOptions::new("dd").with_recommender_policy(RecommenderPolicy::new(vec![allowed], None))
}

#[test]
fn every_fixture_object_reads_and_maps_or_says_why_not() {
    for name in OBJECTS {
        let object = wpa(name);
        // The recommender sample has no metrics: the recommender is its one source.
        let sources = object.spec.metrics.len() + usize::from(object.spec.recommender.is_some());
        assert_eq!(sources, 1, "{name}");
        let outcome = map_wpa(&object, &options(), &NoDatadogMetrics);
        match name {
            "external-type.yaml" => assert!(matches!(outcome, Err(MapError::Invalid { .. })), "{name}: {outcome:?}"),
            _ => assert!(outcome.is_ok(), "{name}: {outcome:?}"),
        }
    }
}

/// The README example, made complete, is config/datadog-latency.toml's billing autoscaler:
/// the same rule, target and interval. What differs is what the two documents say differently:
/// the query (the Cluster Agent's form of the WPA's metric), the metric's name (the rules
/// file calls it "latency"), its max_age (only the rules file sets one) and the namespace.
#[test]
fn billing_complete_is_the_rules_files_billing_autoscaler() {
    let rules = load_rules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/datadog-latency.toml")).unwrap();
    let from_file = rules.autoscaler("billing").unwrap();
    let from_wpa = map_wpa(&wpa("billing-complete.yaml"), &options(), &NoDatadogMetrics).unwrap();
    assert!(from_wpa.notes.is_empty(), "{:?}", from_wpa.notes);
    let from_wpa = from_wpa.autoscaler;

    let without_metric_identity = |rule: &watermarkd_engine::Rule| {
        let mut value = serde_json::to_value(rule).unwrap();
        for metric in value["metrics"].as_array_mut().unwrap() {
            let metric = metric.as_object_mut().unwrap();
            metric.remove("name");
            metric.remove("max_age");
        }
        value
    };
    assert_eq!(without_metric_identity(&from_wpa.rule), without_metric_identity(&from_file.rule));
    // A WPA has no interval: it runs at the daemon's default, which is the 15s the file sets.
    assert_eq!(from_wpa.interval_set, None);
    assert_eq!(from_wpa.interval(watermarkd::domain::rules::DEFAULT_INTERVAL), from_file.interval(Duration::ZERO));
    assert_eq!(
        (&from_wpa.target.api_version, &from_wpa.target.kind, &from_wpa.target.name),
        (&from_file.target.api_version, &from_file.target.kind, &from_file.target.name)
    );
    assert_eq!((&*from_wpa.name, &*from_wpa.target.namespace), ("default/billing", "default"));
    assert_eq!(from_wpa.metrics[0].backend, from_file.metrics[0].backend);
    assert_eq!(
        from_wpa.metrics[0].query,
        "avg:custom.request_duration.max{kubernetes_cluster:mycluster,service:billing,short_image:billing-app}.rollup(30)"
    );
    assert_eq!(from_file.metrics[0].query, "max:custom.request_duration.max{service:billing}");
}

#[test]
fn the_datadog_sample_maps_with_its_convergence_and_tolerance() {
    let mapped =
        map_wpa(&wpa("datadoghq_v1alpha1_watermarkpodautoscaler.yaml"), &options(), &NoDatadogMetrics).unwrap();
    let autoscaler = &mapped.autoscaler;
    assert_eq!(&*autoscaler.name, "default/example-watermarkpodautoscaler");
    assert_eq!(
        (&*autoscaler.target.api_version, &*autoscaler.target.kind, &*autoscaler.target.name),
        ("apps/v1", "Deployment", "alpine")
    );
    let rule = &autoscaler.rule;
    assert_eq!(rule.converge_towards_watermark(), Some(ConvergeTowards::High));
    assert_eq!(rule.upscale_tolerance(), &Decimal::parse("0.01").unwrap(), "tolerance \"10m\"");
    assert_eq!(rule.downscale_tolerance(), &Decimal::parse("0.01").unwrap(), "tolerance \"10m\"");
    assert_eq!((rule.min_replicas(), rule.max_replicas()), (1, 5));
    assert_eq!(rule.metrics()[0].high_watermark, Decimal::parse("900000").unwrap());
    assert_eq!(rule.metrics()[0].low_watermark, Decimal::parse("500000").unwrap());
    assert_eq!(
        autoscaler.metrics[0].query,
        "avg:container.memory.usage{cluster_name:mycluster,kube_deployment:alpine}.rollup(30)"
    );
    assert_eq!(
        mapped.notes,
        ["spec.readinessDelaySeconds (10) has no effect without a Resource metric: watermarkd counts the ready \
          replicas the workload reports instead of listing its pods"]
    );
}

#[test]
fn the_resource_example_maps_onto_a_memory_metric() {
    let mapped = map_wpa(&wpa("resource-type.yaml"), &options(), &NoDatadogMetrics).unwrap_or_else(|e| panic!("{e}"));
    let metric = &mapped.autoscaler.metrics[0];
    assert_eq!(metric.name, "memory");
    let resource = metric.resource.as_ref().expect("a resource metric");
    assert_eq!((resource.resource.as_str(), resource.selector.as_str()), ("memory", "app=nginx"));
    assert_eq!(resource.aggregation, watermarkd::domain::rules::PodAggregation::Sum, "the Datadog controller's sum");
    let rule = &mapped.autoscaler.rule.metrics()[0];
    assert_eq!((rule.low_watermark.to_f64(), rule.high_watermark.to_f64()), (52428800.0, 314572800.0));
}

#[test]
fn the_readme_example_without_a_target_names_the_missing_field() {
    match map_wpa(&wpa("external-type.yaml"), &options(), &NoDatadogMetrics) {
        Err(err @ MapError::Invalid { .. }) => assert_eq!(
            err.to_string(),
            "WatermarkPodAutoscaler default/example-external-watermarkpodautoscaler: spec.scaleTargetRef is required"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn deploy_crd_yaml_is_what_watermarkd_crd_prints() {
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd")).arg("crd").output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crd.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(printed == committed, "deploy/crd.yaml is stale: regenerate it with `cargo run -- crd > deploy/crd.yaml`");
    // And it reads back as the CRD the library builds.
    let parsed: CustomResourceDefinition = serde_yaml_ng::from_str(&committed).unwrap();
    assert_eq!(parsed, custom_resource_definition());
}

/// Every difference between two JSON documents, ignoring `description`s; numbers compare by
/// value (`minimum: 1` and `minimum: 1.0` are the same bound).
fn differences(theirs: &Value, ours: &Value, path: &str, found: &mut Vec<String>) {
    match (theirs, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).filter(|k| *k != "description").collect();
            for key in keys {
                let at = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => differences(x, y, &at, found),
                    (Some(_), None) => found.push(format!("{at}: only in the Datadog CRD")),
                    (None, Some(_)) => found.push(format!("{at}: only in ours")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                found.push(format!("{path}: {} items in the Datadog CRD, {} in ours", a.len(), b.len()));
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}[{i}]"), found);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => found.push(format!("{path}: {a} in the Datadog CRD, {b} in ours")),
    }
}

#[test]
fn our_crd_is_the_datadog_crd_but_for_descriptions() {
    let theirs: Value = serde_yaml_ng::from_str(&fixture(DATADOG_CRD)).unwrap();
    let ours = serde_json::to_value(custom_resource_definition()).unwrap();
    let mut found = Vec::new();
    // Names, scope, versions with their printer columns, subresources and the whole
    // openAPIV3Schema: types, required, formats, minimum/maximum, patterns, anyOf, defaults,
    // enums and x-kubernetes-* markers.
    differences(&theirs["spec"], &ours["spec"], "spec", &mut found);
    differences(&theirs["metadata"]["name"], &ours["metadata"]["name"], "metadata.name", &mut found);
    differences(&theirs["apiVersion"], &ours["apiVersion"], "apiVersion", &mut found);
    assert!(found.is_empty(), "differences:\n  {}", found.join("\n  "));

    // The comparison itself notices a difference, so that an empty list means something.
    let mut changed = ours.clone();
    changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["maxReplicas"]
        ["minimum"] = json!(0);
    let mut found = Vec::new();
    differences(&theirs["spec"], &changed["spec"], "spec", &mut found);
    assert_eq!(
        found,
        ["spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.maxReplicas.minimum: 1 in the Datadog CRD, 0 in ours"]
    );
}

fn wpa_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("datadoghq.com", "v1alpha1", "WatermarkPodAutoscaler"),
        "watermarkpodautoscalers",
    )
}

/// The objects sent to both CRDs: every fixture object, and hand-made ones at the edges of
/// the schema. `(label, object)`.
fn objects_to_try() -> Vec<(String, Value)> {
    let mut objects: Vec<(String, Value)> =
        OBJECTS.iter().map(|name| (name.to_string(), serde_yaml_ng::from_str(&fixture(name)).unwrap())).collect();
    // billing-complete.yaml with its tolerance written as a quantity: as a float (0.01) it is
    // rejected by both CRDs (int-or-string), which would make every variant rejected too.
    let mut base: Value = serde_yaml_ng::from_str(&fixture("billing-complete.yaml")).unwrap();
    base["spec"]["tolerance"] = json!("10m");
    let variant = |label: &str, change: &dyn Fn(&mut Value)| {
        let mut object = base.clone();
        change(&mut object);
        (label.to_string(), object)
    };
    let set = |path: &'static str, value: Value| {
        move |object: &mut Value| {
            let mut target = &mut object["spec"];
            for key in path.split('.') {
                target = match key.parse::<usize>() {
                    Ok(i) => &mut target[i],
                    Err(_) => &mut target[key],
                };
            }
            *target = value.clone();
        }
    };
    let remove = |key: &'static str| {
        move |object: &mut Value| {
            object["spec"].as_object_mut().unwrap().remove(key);
        }
    };
    objects.extend([
        variant("billing-complete with a quantity tolerance", &|_: &mut Value| {}),
        variant("integer tolerance 0", &set("tolerance", json!(0))),
        variant("float tolerance", &set("tolerance", json!(0.01))),
        variant("without maxReplicas", &remove("maxReplicas")),
        variant("without metrics", &remove("metrics")),
        variant("without spec", &|o: &mut Value| {
            o.as_object_mut().unwrap().remove("spec");
        }),
        variant("negative minReplicas", &set("minReplicas", json!(-1))),
        variant("minReplicas 0", &set("minReplicas", json!(0))),
        variant("maxReplicas a string", &set("maxReplicas", json!("five"))),
        variant("maxReplicas a float", &set("maxReplicas", json!(4.5))),
        variant("dryRun a string", &set("dryRun", json!("yes"))),
        variant("minAvailableReplicaPercentage 101", &set("minAvailableReplicaPercentage", json!(101))),
        variant("negative minAvailableReplicaPercentage", &set("minAvailableReplicaPercentage", json!(-5))),
        variant("upscaleForbiddenWindowSeconds 0", &set("upscaleForbiddenWindowSeconds", json!(0))),
        variant("upscaleDelayAboveWatermarkSeconds 0", &set("upscaleDelayAboveWatermarkSeconds", json!(0))),
        variant("upscaleDelayAboveWatermarkSeconds -1", &set("upscaleDelayAboveWatermarkSeconds", json!(-1))),
        variant("modulo 0", &set("replicaScalingAbsoluteModulo", json!(0))),
        variant("readinessDelaySeconds 0", &set("readinessDelaySeconds", json!(0))),
        variant("scaleUpLimitFactor not a quantity", &set("scaleUpLimitFactor", json!("fifty"))),
        variant("scaleUpLimitFactor a boolean", &set("scaleUpLimitFactor", json!(true))),
        variant("scaleDownLimitFactor negative quantity", &set("scaleDownLimitFactor", json!("-30"))),
        variant("highWatermark in binary units", &set("metrics.0.external.highWatermark", json!("1Gi"))),
        variant("highWatermark with an exponent", &set("metrics.0.external.highWatermark", json!("4e-1"))),
        variant("highWatermark not a quantity", &set("metrics.0.external.highWatermark", json!("400 ms"))),
        variant("metric without type", &|o: &mut Value| {
            o["spec"]["metrics"][0].as_object_mut().unwrap().remove("type");
        }),
        variant("metric type Pods", &set("metrics.0.type", json!("Pods"))),
        variant("external without metricName", &|o: &mut Value| {
            o["spec"]["metrics"][0]["external"].as_object_mut().unwrap().remove("metricName");
        }),
        variant("matchLabels value a number", &set("metrics.0.external.metricSelector.matchLabels.service", json!(1))),
        variant(
            "matchExpressions without operator",
            &set("metrics.0.external.metricSelector.matchExpressions", json!([{"key": "a"}])),
        ),
        variant(
            "resource without name",
            &set("metrics.0", json!({"type": "Resource", "resource": {"highWatermark": 1}})),
        ),
        variant("scaleTargetRef without name", &set("scaleTargetRef", json!({"kind": "Deployment"}))),
        variant("scaleTargetRef without kind", &set("scaleTargetRef", json!({"name": "billing"}))),
        variant("recommender without url", &set("recommender", json!({"targetType": "cpu"}))),
        variant(
            "recommender TLS version",
            &set("recommender", json!({"url": "http://r", "tlsConfig": {"minVersion": "TLS14"}})),
        ),
        variant("recommender settings", &set("recommender", json!({"url": "http://r", "settings": {"a": "b"}}))),
        variant("convergeTowardsWatermark anything", &set("convergeTowardsWatermark", json!("sideways"))),
        variant("unknown spec field", &set("readinessDelay", json!(10))),
    ]);
    objects
}

/// Creates each object (in `namespace`, named after its position) and deletes it again:
/// `Ok(())` when the apiserver accepted it, `Err(message)` when it rejected it.
async fn try_objects(client: &kube::Client, namespace: &str, objects: &[(String, Value)]) -> Vec<Result<(), String>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &wpa_resource());
    let mut outcomes = Vec::new();
    for (i, (_, object)) in objects.iter().enumerate() {
        let mut object = object.clone();
        let name = format!("case-{i}");
        object["metadata"] = json!({"name": name, "namespace": namespace});
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                api.delete(&name, &DeleteParams::default()).await.unwrap();
                outcomes.push(Ok(()));
            }
            Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {
                outcomes.push(Err(status.message))
            }
            Err(other) => panic!("create {name}: {other}"),
        }
    }
    outcomes
}

async fn delete_crd(cluster: &KubeCluster, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client());
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while api.get_opt(name).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "CRD {name} still there after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each object goes to a real apiserver under the Datadog CRD, then under ours: the outcome
/// (accepted or rejected) must be the same for every one. Then, under ours, a WPA is read
/// through the typed API, mapped, decided on, and its status written through the status
/// subresource in the Datadog controller's shape.
#[tokio::test]
async fn the_apiserver_accepts_and_rejects_the_same_objects_under_both_crds() {
    let cluster = KubeCluster::shared();
    let namespace = cluster.unique_namespace("wpa").await;
    let objects = objects_to_try();
    let datadog: CustomResourceDefinition = serde_yaml_ng::from_str(&fixture(DATADOG_CRD)).unwrap();
    let name = datadog.metadata.name.clone().unwrap();

    cluster.create_crd(&datadog).await;
    let under_datadog = try_objects(&cluster.client(), &namespace, &objects).await;
    delete_crd(cluster, &name).await;
    cluster.create_crd(&custom_resource_definition()).await;
    let under_ours = try_objects(&cluster.client(), &namespace, &objects).await;

    let mut mismatches = Vec::new();
    let mut report = Vec::new();
    for (((label, _), theirs), ours) in objects.iter().zip(&under_datadog).zip(&under_ours) {
        report.push(match theirs {
            Ok(()) => format!("{label}: accepted"),
            Err(message) => format!("{label}: rejected: {message}"),
        });
        if theirs.is_ok() != ours.is_ok() {
            mismatches.push(format!("{label}: Datadog CRD {theirs:?}, ours {ours:?}"));
        }
    }
    assert!(mismatches.is_empty(), "different outcomes:\n  {}", mismatches.join("\n  "));
    eprintln!("outcomes (the same under both CRDs):\n  {}", report.join("\n  "));

    // The cases whose outcome the Datadog CRD fixes, so that a harness that accepted (or
    // rejected) everything could not pass the comparison above.
    let outcome = |label: &str| {
        let i = objects.iter().position(|(l, _)| l == label).unwrap_or_else(|| panic!("no case {label}"));
        under_ours[i].is_ok()
    };
    for accepted in [
        "datadoghq_v1alpha1_watermarkpodautoscaler.yaml",
        "billing-complete with a quantity tolerance",
        "integer tolerance 0",
        "without maxReplicas",
        "without spec",
        "highWatermark in binary units",
        "metric type Pods",
        "recommender settings",
        "unknown spec field",
    ] {
        assert!(outcome(accepted), "{accepted} should be accepted");
    }
    for rejected in [
        // Their `tolerance: 0.01` is a float, which an int-or-string field does not take.
        "billing-complete.yaml",
        "resource-type.yaml",
        "recommender.yaml",
        "float tolerance",
        // No scaleTargetRef (and the float).
        "external-type.yaml",
        "negative minReplicas",
        "maxReplicas a string",
        "maxReplicas a float",
        "minAvailableReplicaPercentage 101",
        "scaleUpLimitFactor a boolean",
        "highWatermark not a quantity",
        "metric without type",
        "scaleTargetRef without name",
        "recommender without url",
        "recommender TLS version",
    ] {
        assert!(!outcome(rejected), "{rejected} should be rejected");
    }

    status_through_the_status_subresource(cluster, &namespace).await;
}

/// Under our CRD: create a WPA with the typed API, map it, decide, and write the status the
/// Datadog controller would; it must pass the CRD's status schema and read back unchanged.
async fn status_through_the_status_subresource(cluster: &KubeCluster, namespace: &str) {
    let api: Api<WatermarkPodAutoscaler> = Api::namespaced(cluster.client(), namespace);
    let mut object = wpa("datadoghq_v1alpha1_watermarkpodautoscaler.yaml");
    object.metadata.namespace = Some(namespace.to_string());
    // The sample's tolerance is the string "10m"; billing-complete's 0.01 is a float, which
    // neither CRD accepts as int-or-string.
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    let listed = api.list(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].spec, object.spec);

    let mapped = map_wpa(&created, &options(), &NoDatadogMetrics).unwrap();
    assert_eq!(&*mapped.autoscaler.name, format!("{namespace}/example-watermarkpodautoscaler"));
    let now = Timestamp::from_unix_millis(1_714_564_800_000);
    let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
    let reading = Reading::Value { value: 1_200_000.0, at: now };
    let decision = decide(&mapped.autoscaler.rule, target, &[reading], &State::default(), now);
    assert_eq!(decision.action, Action::ScaleUp);
    let status = next_status(created.status.as_ref(), &created.spec, &decision, &ScaleWrite::Succeeded, now);
    assert!(status_changed(created.status.as_ref(), &status));

    let patch = json!({ "status": status });
    let written = api
        .patch_status("example-watermarkpodautoscaler", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("the status does not fit the CRD: {e}"));
    assert!(!status_changed(written.status.as_ref(), &status), "{:#?}\n{status:#?}", written.status);
    let read = api.get("example-watermarkpodautoscaler").await.unwrap();
    assert_eq!(read.status.as_ref(), Some(&status));
    let value = &read.status.as_ref().unwrap().current_metrics[0].external.as_ref().unwrap().current_value;
    assert_eq!(value.as_ref().map(ToString::to_string).as_deref(), Some("1200k"));
}
