//! Unit tests of the mapping: what a WPA yields, and each problem, named by the WPA's path.

use std::time::Duration;

use watermarkd_engine::{Algorithm, ConvergeTowards, Decimal, Velocity};

use super::super::query::NoDatadogMetrics;
use super::super::recommender_policy::AllowedUrl;
use super::*;
use crate::domain::rules::{parse_rules, Reducer};

mod recommender;

fn d(text: &str) -> Decimal {
    Decimal::parse(text).unwrap()
}

fn wpa(yaml: &str) -> WatermarkPodAutoscaler {
    serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

/// A complete, valid WPA; tests change one thing at a time with `with`.
const BASE: &str = r#"
apiVersion: datadoghq.com/v1alpha1
kind: WatermarkPodAutoscaler
metadata:
  name: billing
  namespace: prod
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: billing}
  minReplicas: 4
  maxReplicas: 9
  metrics:
  - type: External
    external:
      metricName: custom.request_duration.max
      metricSelector: {matchLabels: {service: billing}}
      highWatermark: 400m
      lowWatermark: 150m
"#;

/// The recommenders of these tests are allowed, with their TLS files in /etc.
fn options() -> MappingOptions {
    let allowed = ["https://reco.example", "http://reco", "https://reco"].map(|url| AllowedUrl::parse(url).unwrap());
    MappingOptions::new("dd").with_recommender_policy(RecommenderPolicy::new(allowed.to_vec(), Some("/etc".into())))
}

fn map(yaml: &str) -> Result<MappedWpa, MapError> {
    map_wpa(&wpa(yaml), &options(), &NoDatadogMetrics)
}

fn mapped(yaml: &str) -> MappedWpa {
    map(yaml).unwrap_or_else(|e| panic!("{e}"))
}

/// The problems of an invalid WPA, each as `field message`.
fn problems_with(yaml: &str, options: &MappingOptions, metrics: &dyn DatadogMetricQueries) -> Vec<String> {
    match map_wpa(&wpa(yaml), options, metrics) {
        Err(MapError::Invalid { problems, .. }) => {
            for p in &problems {
                assert_eq!(p.autoscaler.as_deref(), Some("prod/billing"), "{p}");
                assert_eq!(p.line, None);
            }
            problems.iter().map(|p| Problem { autoscaler: None, ..p.clone() }.to_string()).collect()
        }
        other => panic!("expected problems, got {other:?}"),
    }
}

fn problems(yaml: &str) -> Vec<String> {
    problems_with(yaml, &options(), &NoDatadogMetrics)
}

/// BASE with its spec changed: each `(key, Some(yaml))` sets `spec.key` to that YAML value,
/// each `(key, None)` removes it.
fn with(changes: &[(&str, Option<&str>)]) -> String {
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(BASE).unwrap();
    let spec = doc.get_mut("spec").unwrap().as_mapping_mut().unwrap();
    for (key, value) in changes {
        match value {
            Some(value) => {
                spec.insert((*key).into(), serde_yaml_ng::from_str(value).unwrap());
            }
            None => {
                spec.remove(*key);
            }
        }
    }
    serde_yaml_ng::to_string(&doc).unwrap()
}

fn with_metrics(metrics: &str) -> String {
    with(&[("metrics", Some(metrics))])
}

fn with_annotation(yaml: &str, value: &str) -> String {
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let metadata = doc.get_mut("metadata").unwrap().as_mapping_mut().unwrap();
    let annotations: serde_yaml_ng::Mapping = [(QUERIES.into(), value.into())].into_iter().collect();
    metadata.insert("annotations".into(), annotations.into());
    serde_yaml_ng::to_string(&doc).unwrap()
}

const QUERIES: &str = "watermarkd.io/queries";

#[test]
fn a_complete_wpa_becomes_an_autoscaler() {
    let MappedWpa { autoscaler, notes } = mapped(BASE);
    assert!(notes.is_empty());
    assert_eq!(&*autoscaler.name, "prod/billing");
    assert_eq!(&*autoscaler.target.kind, "Deployment");
    assert_eq!(&*autoscaler.target.namespace, "prod");
    assert_eq!(&*autoscaler.target.name, "billing");
    assert_eq!(&*autoscaler.target.api_version, "apps/v1");
    assert_eq!(autoscaler.interval_set, None);
    assert_eq!(autoscaler.metrics.len(), 1);
    let metric = &autoscaler.metrics[0];
    assert_eq!(metric.name, "custom.request_duration.max");
    assert_eq!(metric.backend, "dd");
    assert_eq!(metric.query, "avg:custom.request_duration.max{service:billing}.rollup(30)");
    assert_eq!(metric.reducer, None);
    let rule = &autoscaler.rule;
    assert_eq!((rule.min_replicas(), rule.max_replicas()), (4, 9));
    assert_eq!(rule.metrics()[0].name, "custom.request_duration.max");
    assert_eq!(rule.metrics()[0].high_watermark, d("0.4"));
    assert_eq!(rule.metrics()[0].low_watermark, d("0.15"));
    // Every other knob has the Datadog controller's default.
    assert_eq!(rule.algorithm(), Algorithm::Absolute);
    assert_eq!(rule.upscale_tolerance(), &d("0.1"));
    let Velocity::Watermark(v) = rule.velocity() else { panic!("{:?}", rule.velocity()) };
    assert_eq!((v.scale_up_limit_factor.clone(), v.scale_down_limit_factor.clone()), (d("50"), d("20")));
    assert_eq!(v.upscale_forbidden_window, Duration::from_secs(60));
    assert_eq!(v.downscale_forbidden_window, Duration::from_secs(300));
    assert_eq!(rule.replica_modulo(), 1);
    assert_eq!(rule.converge_towards_watermark(), None);
    assert!(!rule.tolerate_zero() && !rule.dry_run());
}

#[test]
fn every_field_maps_onto_the_rule() {
    let yaml = with(&[
        ("algorithm", Some("average")),
        ("tolerance", Some("\"50m\"")),
        ("scaleUpLimitFactor", Some("\"25\"")),
        ("scaleDownLimitFactor", Some("7.5")),
        ("upscaleForbiddenWindowSeconds", Some("30")),
        ("downscaleForbiddenWindowSeconds", Some("90")),
        ("upscaleDelayAboveWatermarkSeconds", Some("20")),
        ("downscaleDelayBelowWatermarkSeconds", Some("40")),
        ("replicaScalingAbsoluteModulo", Some("2")),
        ("convergeTowardsWatermark", Some("lowwatermark")),
        ("tolerateZero", Some("true")),
        ("minAvailableReplicaPercentage", Some("50")),
        ("dryRun", Some("true")),
        ("readinessDelaySeconds", Some("10")),
    ]);
    let MappedWpa { autoscaler, notes } = mapped(&yaml);
    let rule = &autoscaler.rule;
    assert_eq!(rule.algorithm(), Algorithm::Average);
    assert_eq!(rule.upscale_tolerance(), &d("0.05"));
    let Velocity::Watermark(v) = rule.velocity() else { panic!() };
    assert_eq!((v.scale_up_limit_factor.clone(), v.scale_down_limit_factor.clone()), (d("25"), d("7.5")));
    assert_eq!(
        (v.upscale_forbidden_window, v.downscale_forbidden_window),
        (Duration::from_secs(30), Duration::from_secs(90))
    );
    assert_eq!(rule.upscale_delay_above_watermark(), Duration::from_secs(20));
    assert_eq!(rule.downscale_delay_below_watermark(), Duration::from_secs(40));
    assert_eq!(rule.replica_modulo(), 2);
    assert_eq!(rule.converge_towards_watermark(), Some(ConvergeTowards::Low));
    assert!(rule.tolerate_zero() && rule.dry_run());
    assert_eq!(rule.min_available_replica_percentage(), 50);
    assert_eq!(
        notes,
        ["spec.readinessDelaySeconds (10) has no effect without a Resource metric: watermarkd counts the ready \
          replicas the workload reports instead of listing its pods"]
    );
}

#[test]
fn the_datadog_controllers_zero_values_mean_its_defaults() {
    // Go cannot tell 0 from absent for these, and the Datadog controller defaults them; a
    // tolerance of 0 is 10% there too, although the rules file allows 0.
    let yaml = with(&[
        ("tolerance", Some("0")),
        ("upscaleForbiddenWindowSeconds", Some("0")),
        ("downscaleForbiddenWindowSeconds", Some("0")),
        ("algorithm", Some("\"\"")),
        ("convergeTowardsWatermark", Some("\"\"")),
    ]);
    let rule = mapped(&yaml).autoscaler.rule;
    assert_eq!(rule.upscale_tolerance(), &d("0.1"));
    let Velocity::Watermark(v) = rule.velocity() else { panic!() };
    assert_eq!(
        (v.upscale_forbidden_window, v.downscale_forbidden_window),
        (Duration::from_secs(60), Duration::from_secs(300))
    );
    assert_eq!(rule.algorithm(), Algorithm::Absolute);
    assert_eq!(rule.converge_towards_watermark(), None);
    assert_eq!(mapped(&with(&[("tolerance", Some("\"0m\""))])).autoscaler.rule.upscale_tolerance(), &d("0.1"));
}

#[test]
fn converge_towards_watermark_reads_the_datadog_words() {
    let converge =
        |v: &str| mapped(&with(&[("convergeTowardsWatermark", Some(v))])).autoscaler.rule.converge_towards_watermark();
    assert_eq!(converge("highwatermark"), Some(ConvergeTowards::High));
    assert_eq!(converge("lowwatermark"), Some(ConvergeTowards::Low));
    assert_eq!(
        problems(&with(&[("convergeTowardsWatermark", Some("high"))])),
        ["spec.convergeTowardsWatermark (\"high\") must be \"highwatermark\" or \"lowwatermark\""]
    );
}

#[test]
fn the_namespace_defaults_and_the_api_version_too() {
    let yaml = BASE.replace("  namespace: prod\n", "").replace("apiVersion: apps/v1, ", "");
    let autoscaler = mapped(&yaml).autoscaler;
    assert_eq!(&*autoscaler.name, "default/billing");
    assert_eq!(&*autoscaler.target.namespace, "default");
    assert_eq!(&*autoscaler.target.api_version, "apps/v1");
    let yaml = BASE.replace("apiVersion: apps/v1, kind: Deployment", "apiVersion: argoproj.io/v1alpha1, kind: Rollout");
    let target = mapped(&yaml).autoscaler.target;
    assert_eq!((&*target.api_version, &*target.kind), ("argoproj.io/v1alpha1", "Rollout"));
}

#[test]
fn replica_problems_name_the_wpa_fields() {
    assert_eq!(problems(&with(&[("maxReplicas", None)])), ["spec.maxReplicas is required"]);
    assert_eq!(
        problems(&with(&[("minReplicas", Some("12"))])),
        ["spec.minReplicas (12) must not exceed maxReplicas (9)"]
    );
    assert_eq!(
        problems(&with(&[("minReplicas", Some("-1"))])),
        ["spec.minReplicas (-1) must be a whole number from 0 to 2147483647 (the largest replica count Kubernetes takes)"]
    );
    assert_eq!(
        problems(&with(&[("minReplicas", None), ("maxReplicas", Some("0"))])),
        ["spec.minReplicas (1) must not exceed maxReplicas (0)"]
    );
    assert_eq!(
        problems(&with(&[("minReplicas", Some("0"))])),
        ["spec.minReplicas (0) must be at least 1: a WatermarkPodAutoscaler does not scale to zero (a rules-file \
             autoscaler can, with min_replicas = 0 and an activation per metric)"]
    );
    assert_eq!(
        problems(&with(&[("replicaScalingAbsoluteModulo", Some("0")), ("minAvailableReplicaPercentage", Some("101"))])),
        [
            "spec.minAvailableReplicaPercentage (101) must be from 0 to 100",
            "spec.replicaScalingAbsoluteModulo must be at least 1"
        ]
    );
}

#[test]
fn quantity_problems_name_the_wpa_fields() {
    assert_eq!(
        problems(&with(&[("tolerance", Some("\"1.5\""))])),
        ["spec.tolerance (1.5) must be a fraction from 0 (inclusive) to 1 (exclusive), e.g. 0.1 for 10%"]
    );
    assert_eq!(
        problems(&with(&[("scaleDownLimitFactor", Some("100")), ("scaleUpLimitFactor", Some("\"-5\""))])),
        [
            "spec.scaleDownLimitFactor (100) must be a percentage from 0 (inclusive) to 100 (exclusive)",
            "spec.scaleUpLimitFactor (-5) must not be negative",
        ]
    );
    let found = problems(&with(&[("tolerance", Some("\"ten\""))]));
    assert_eq!(found.len(), 1);
    assert!(found[0].starts_with("spec.tolerance must be a number or a quantity: "), "{found:?}");
    assert_eq!(
        problems(&with(&[("algorithm", Some("averaged"))])),
        ["spec.algorithm (\"averaged\") must be \"absolute\" or \"average\""]
    );
    assert_eq!(
        problems(&with(&[("upscaleForbiddenWindowSeconds", Some("-5"))])),
        ["spec.upscaleForbiddenWindowSeconds (-5) must be a duration such as \"30s\" or a positive number of seconds"]
    );
}

#[test]
fn watermark_problems_name_the_metric_fields() {
    let metric = |high: &str, low: &str| {
        format!(
            "[{{type: External, external: {{metricName: m, metricSelector: {{}}{}{}}}}}]",
            if high.is_empty() { String::new() } else { format!(", highWatermark: {high}") },
            if low.is_empty() { String::new() } else { format!(", lowWatermark: {low}") },
        )
    };
    assert_eq!(
        problems(&with_metrics(&metric("100m", "150m"))),
        ["spec.metrics[0].external.lowWatermark (0.15) must not exceed highWatermark (0.1)"]
    );
    assert_eq!(
        problems(&with_metrics(&metric("", ""))),
        ["spec.metrics[0].external.highWatermark at least one of lowWatermark and highWatermark is required"]
            .map(|p| p.replace("highWatermark at", "highWatermark: at"))
    );
    assert_eq!(
        problems(&with_metrics(&metric("0", ""))),
        ["spec.metrics[0].external.highWatermark (0) must be greater than 0"]
    );
    let found = problems(&with_metrics(&metric("\"1x\"", "")));
    assert!(found[0].starts_with("spec.metrics[0].external.highWatermark must be a number or a quantity"), "{found:?}");
    // A lone watermark serves as both, as the Datadog controller's fillMissingWatermark does.
    let rule = mapped(&with_metrics(&metric("400m", ""))).autoscaler.rule;
    assert_eq!(
        (rule.metrics()[0].low_watermark.clone(), rule.metrics()[0].high_watermark.clone()),
        (d("0.4"), d("0.4"))
    );
}

#[test]
fn structural_problems_name_the_wpa_fields() {
    assert_eq!(problems(&with(&[("scaleTargetRef", None)])), ["spec.scaleTargetRef is required"]);
    assert_eq!(
        problems(&with(&[("scaleTargetRef", Some("{kind: \"\", name: billing}"))])),
        ["spec.scaleTargetRef.kind must not be empty"]
    );
    assert_eq!(
        problems(&with(&[("scaleTargetRef", Some("{kind: Deployment}"))])),
        ["spec.scaleTargetRef.name is required"]
    );
    assert_eq!(problems(&with(&[("metrics", None)])), ["spec.metrics: at least one metric is required"]);
    assert_eq!(
        problems(&with_metrics("[{type: Pods}, {type: External}, {type: Resource}]")),
        [
            "spec.metrics[0].type (\"Pods\") must be \"External\" or \"Resource\"",
            "spec.metrics[1].external is required when type is External",
            "spec.metrics[2].resource is required when type is Resource",
        ]
    );
    let nameless = BASE.replace("  name: billing\n  namespace", "  namespace");
    match map(&nameless) {
        Err(MapError::Invalid { problems, .. }) => {
            assert_eq!(problems.len(), 1);
            assert_eq!(problems[0].to_string(), "autoscaler \"prod/\": metadata.name is required");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = with(&[
        ("maxReplicas", None),
        ("tolerance", Some("\"2\"")),
        ("scaleTargetRef", None),
        ("metrics", Some("[{type: External, external: {metricName: a, metricSelector: {matchExpressions: [{key: k, operator: Exists}]}, highWatermark: 1, lowWatermark: 2}}]")),
    ]);
    assert_eq!(
        problems(&yaml),
        [
            "spec.maxReplicas is required",
            "spec.metrics[0].external.lowWatermark (2) must not exceed highWatermark (1)",
            "spec.metrics[0].external.metricSelector.matchExpressions is not supported: the Cluster Agent builds a \
             Datadog query from matchLabels only (tag:value filters); use matchLabels, or give the query in the \
             watermarkd.io/queries annotation",
            "spec.scaleTargetRef is required",
            "spec.tolerance (2) must be a fraction from 0 (inclusive) to 1 (exclusive), e.g. 0.1 for 10%",
        ]
    );
}

#[test]
fn queries_are_built_from_labels_or_taken_from_datadog_metrics() {
    let query = |metrics: &str, lookup: &dyn DatadogMetricQueries| {
        map_wpa(&wpa(&with_metrics(metrics)), &options(), lookup).unwrap().autoscaler.metrics[0].query.clone()
    };
    assert_eq!(
        query(
            "[{type: External, external: {metricName: q.depth, metricSelector: {}, highWatermark: 10}}]",
            &NoDatadogMetrics
        ),
        "avg:q.depth{*}.rollup(30)"
    );
    assert_eq!(
        query(
            "[{type: External, external: {metricName: q.depth, metricSelector: {matchLabels: {zone: b, app: q}}, highWatermark: 10}}]",
            &NoDatadogMetrics
        ),
        "avg:q.depth{app:q,zone:b}.rollup(30)"
    );
    let lookup = |namespace: &str, name: &str| {
        (namespace == "prod" && name == "latency")
            .then(|| "max:trace.http.request.duration{service:billing}".to_string())
    };
    assert_eq!(
        query("[{type: External, external: {metricName: datadogmetric@prod:latency, highWatermark: 1}}]", &lookup),
        "max:trace.http.request.duration{service:billing}"
    );
    let mut custom = options();
    custom.aggregator = "max".into();
    custom.rollup_seconds = 60;
    let autoscaler = map_wpa(&wpa(BASE), &custom, &NoDatadogMetrics).unwrap().autoscaler;
    assert_eq!(autoscaler.metrics[0].query, "max:custom.request_duration.max{service:billing}.rollup(60)");
}

#[test]
fn query_problems_name_the_metric() {
    let lookup = |_: &str, _: &str| None;
    assert_eq!(
        problems_with(
            &with_metrics("[{type: External, external: {metricName: datadogmetric@prod:latency, highWatermark: 1}}]"),
            &options(),
            &lookup
        ),
        ["spec.metrics[0].external.metricName (\"datadogmetric@prod:latency\") refers to the DatadogMetric prod/latency, \
          which does not exist or has no spec.query"]
    );
    assert_eq!(
        problems(&with_metrics("[{type: External, external: {metricName: datadogmetric@prod/latency, highWatermark: 1}}]")),
        ["spec.metrics[0].external.metricName (\"datadogmetric@prod/latency\") must be datadogmetric@<namespace>:<name>, \
          each a lowercase Kubernetes name, to refer to a DatadogMetric"]
    );
    assert_eq!(
        problems(&with_metrics("[{type: External, external: {metricName: q.depth, highWatermark: 1}}]")),
        ["spec.metrics[0].external.metricSelector is required (as the Datadog controller requires it): give \
          matchLabels, or {} to query the metric over every tag ({*})"]
    );
    assert_eq!(
        problems(&with_metrics(
            "[{type: External, external: {metricName: \"\", metricSelector: {}, highWatermark: 1}}]"
        )),
        ["spec.metrics[0].external.metricName must not be empty"]
    );
}

#[test]
fn metrics_sharing_a_name_are_told_apart_by_their_tags() {
    let yaml = with_metrics(
        "[{type: External, external: {metricName: q.depth, metricSelector: {matchLabels: {q: a}}, highWatermark: 10}},
          {type: External, external: {metricName: q.depth, metricSelector: {matchLabels: {q: b}}, highWatermark: 10}},
          {type: External, external: {metricName: latency, metricSelector: {}, highWatermark: 1}}]",
    );
    let names: Vec<String> = mapped(&yaml).autoscaler.metrics.iter().map(|m| m.name.clone()).collect();
    assert_eq!(names, ["q.depth{q:a}", "q.depth{q:b}", "latency"]);
    let twice = with_metrics(
        "[{type: External, external: {metricName: q.depth, metricSelector: {}, highWatermark: 10}},
          {type: External, external: {metricName: q.depth, metricSelector: {}, highWatermark: 10}}]",
    );
    assert_eq!(
        problems(&twice),
        ["spec.metrics[1].external.metricName is already used by another metric of this autoscaler; metric names must be unique"]
    );
}

#[test]
fn the_annotation_gives_a_query_and_backend() {
    let yaml = with_annotation(
        BASE,
        r#"[{"metricName": "custom.request_duration.max", "backend": "prom", "query": "max(rate(x[1m]))", "reducer": "max", "maxAge": "2m"}]"#,
    );
    let autoscaler = mapped(&yaml).autoscaler;
    let metric = &autoscaler.metrics[0];
    assert_eq!((metric.backend.as_str(), metric.query.as_str()), ("prom", "max(rate(x[1m]))"));
    assert_eq!(metric.reducer, Some(Reducer::Max));
    assert_eq!(metric.name, "custom.request_duration.max");
    assert_eq!(autoscaler.rule.metrics()[0].max_age, Some(Duration::from_secs(120)));
    // Without a backend, the default Datadog backend; the selector no longer matters.
    let yaml = with_annotation(
        &with_metrics("[{type: External, external: {metricName: whatever, highWatermark: 1}}]"),
        r#"[{"metric": 0, "query": "sum:trace.hits{env:prod}.as_rate()"}]"#,
    );
    let metric = &mapped(&yaml).autoscaler.metrics[0];
    assert_eq!((metric.backend.as_str(), metric.query.as_str()), ("dd", "sum:trace.hits{env:prod}.as_rate()"));
}

#[test]
fn annotation_values_are_checked_like_a_rules_file_metric() {
    let a = "metadata.annotations[\"watermarkd.io/queries\"]";
    assert_eq!(
        problems(&with_annotation(BASE, r#"[{"metric": 0, "backend": "prom"}]"#)),
        [format!("{a}[0].query is required")]
    );
    assert_eq!(
        problems(&with_annotation(BASE, r#"[{"metric": 0, "query": 5, "maxAge": "soon", "reducer": "median"}]"#)),
        [
            format!("{a}[0].maxAge (\"soon\") must be a duration such as \"30s\", \"5m\", \"1m30s\" or a whole number of seconds: expected number at 0"),
            format!("{a}[0].query must be a string, not an integer (5)"),
            format!("{a}[0].reducer (\"median\") must be \"max\", \"min\", \"sum\" or \"avg\""),
        ]
    );
    assert_eq!(
        problems(&with_annotation(BASE, "nope")),
        [format!("{a} is not valid JSON: expected ident at line 1 column 2")]
    );
}

#[test]
fn backends_are_checked_when_known() {
    let rules = parse_rules(
        r#"
        [backend.dd]
        type = "datadog"
        api_key_env = "A"
        app_key_env = "B"
        [backend.prom]
        type = "prometheus"
        url = "http://127.0.0.1:9090"
        "#,
        "rules.toml",
    )
    .unwrap();
    let known = MappingOptions::new("dd").with_backends(&rules.backends);
    assert_eq!(known.check(), Ok(()));
    let a = "metadata.annotations[\"watermarkd.io/queries\"]";
    let run = |annotation: &str| problems_with(&with_annotation(BASE, annotation), &known, &NoDatadogMetrics);
    assert_eq!(
        run(r#"[{"metric": 0, "backend": "thanos", "query": "q"}]"#),
        [format!("{a}[0].backend (\"thanos\") names no [backend.thanos] table (defined: dd, prom)")]
    );
    let found = run(r#"[{"metric": 0, "query": "max:x{*}", "reducer": "max"}]"#);
    assert!(found[0].starts_with(&format!("{a}[0].reducer only applies to prometheus backends")), "{found:?}");
    let ok = map_wpa(
        &wpa(&with_annotation(BASE, r#"[{"metric": 0, "backend": "prom", "query": "up"}]"#)),
        &known,
        &NoDatadogMetrics,
    );
    assert_eq!(ok.unwrap().autoscaler.metrics[0].backend, "prom");
    // A Prometheus query in the annotation is PromQL, checked as a rules file's is.
    assert_eq!(
        run(r#"[{"metric": 0, "backend": "prom", "query": "sum(rate(x{a=\"b\"[1m])"}]"#),
        [format!(
            "{a}[0].query is not valid PromQL: the '[' at character 17 is inside the label matchers that '{{' opened \
             at character 11: is a '}}' missing?"
        )]
    );
    // A Datadog query is not PromQL, and is not read as such.
    let datadog = map_wpa(
        &wpa(&with_annotation(BASE, r#"[{"metric": 0, "query": "sum:x{a:b}.rollup(max, 60"}]"#)),
        &known,
        &NoDatadogMetrics,
    );
    assert!(datadog.is_ok(), "{datadog:?}");

    // A default backend that cannot answer a built Datadog query fails only the WPAs that need
    // one; a WPA whose metrics all have an annotated query runs on it.
    let nope = MappingOptions::new("nope").with_backends(&rules.backends);
    assert_eq!(nope.check(), Ok(()), "not a problem of the daemon as a whole");
    assert_eq!(
        nope.default_backend_problem().as_deref(),
        Some("the default backend \"nope\" names no [backend.nope] table")
    );
    assert_eq!(
        problems_with(BASE, &nope, &NoDatadogMetrics),
        ["spec.metrics[0] (\"nope\") names no [backend.nope] table (defined: dd, prom)"]
    );
    let prom = MappingOptions::new("prom").with_backends(&rules.backends);
    assert_eq!(prom.check(), Ok(()));
    let problem = "the default backend \"prom\" is not a datadog backend, and a query built from metricName is a \
                   Datadog query";
    assert_eq!(prom.default_backend_problem().as_deref(), Some(problem));
    assert_eq!(
        problems_with(BASE, &prom, &NoDatadogMetrics),
        [format!(
            "spec.metrics[0].external.metricName has no query in the watermarkd.io/queries annotation, and \
             {problem}: give this metric a query there, or set default_backend to a datadog backend"
        )]
    );
    let annotated =
        map_wpa(&wpa(&with_annotation(BASE, r#"[{"metric": 0, "query": "up"}]"#)), &prom, &NoDatadogMetrics);
    assert_eq!(annotated.unwrap().autoscaler.metrics[0].backend, "prom");
    assert_eq!(known.default_backend_problem(), None);
    let mut bad = MappingOptions::new("dd");
    bad.rollup_seconds = 0;
    assert!(bad.check().is_err());
    bad = MappingOptions::new("dd");
    bad.aggregator = "p99".into();
    assert!(bad.check().is_err());
    assert_eq!(MappingOptions::new("anything").check(), Ok(()), "unknown backends are not checked");
}

#[test]
fn a_resource_metric_maps_onto_a_rules_file_resource_metric() {
    let yaml = with(&[
        (
            "metrics",
            Some(
                "[{type: Resource, resource: {name: cpu, highWatermark: 500m, lowWatermark: 200m, metricSelector: \
                 {matchLabels: {app: billing}, matchExpressions: [{key: track, operator: NotIn, values: [canary]}]}}}, \
                 {type: Resource, resource: {name: memory, highWatermark: 300Mi, metricSelector: {matchLabels: {app: billing}}}}]",
            ),
        ),
        ("readinessDelaySeconds", Some("20")),
    ]);
    let MappedWpa { autoscaler, notes } = mapped(&yaml);
    assert!(notes.is_empty(), "the readiness delay has an effect now: {notes:?}");
    let cpu = &autoscaler.metrics[0];
    assert_eq!((cpu.name.as_str(), cpu.backend.as_str()), ("cpu", crate::domain::rules::RESOURCE_BACKEND));
    assert_eq!(
        cpu.resource,
        Some(crate::domain::rules::ResourceSource {
            resource: crate::domain::rules::ResourceName::Cpu,
            selector: "app=billing,track notin (canary)".into(),
            aggregation: crate::domain::rules::PodAggregation::Sum,
            readiness_delay: Duration::from_secs(20),
            max_age: crate::domain::rules::RESOURCE_MAX_AGE,
        })
    );
    assert_eq!(autoscaler.rule.metrics()[0].high_watermark, d("0.5"));
    assert_eq!(autoscaler.metrics[1].name, "memory");
    assert_eq!(autoscaler.rule.metrics()[1].low_watermark, d("314572800"), "one watermark serves as both");

    // The per-pod average, by annotation.
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let metadata = doc.get_mut("metadata").unwrap().as_mapping_mut().unwrap();
    let annotations: serde_yaml_ng::Mapping =
        [(POD_AGGREGATION_ANNOTATION.into(), "average".into())].into_iter().collect();
    metadata.insert("annotations".into(), annotations.into());
    let averaged = serde_yaml_ng::to_string(&doc).unwrap();
    let autoscaler = mapped(&averaged).autoscaler;
    assert!(autoscaler
        .metrics
        .iter()
        .all(|m| m.resource.as_ref().unwrap().aggregation == crate::domain::rules::PodAggregation::Average));
    // ... which the average algorithm would divide again.
    let both = averaged.replace("maxReplicas: 9", "maxReplicas: 9\n  algorithm: average");
    let found = problems(&both);
    assert!(
        found[0].starts_with(
            "metadata.annotations[\"watermarkd.io/pod-aggregation\"] (\"average\") cannot go with algorithm = \"average\""
        ),
        "{found:?}"
    );
    let wrong = averaged.replace("pod-aggregation: average", "pod-aggregation: median");
    assert_eq!(
        problems(&wrong),
        [
            "metadata.annotations[\"watermarkd.io/pod-aggregation\"] (\"median\") must be \"sum\" or \"average\"",
            "metadata.annotations[\"watermarkd.io/pod-aggregation\"] (\"median\") must be \"sum\" or \"average\"",
        ]
    );
}

#[test]
fn a_resource_metric_names_its_problems_by_the_wpa_path() {
    let found = problems(&with_metrics(
        "[{type: Resource, resource: {name: gpu, highWatermark: 1, metricSelector: {matchLabels: {app: x}}}}, \
         {type: Resource, resource: {name: cpu, highWatermark: 1}}, \
         {type: Resource, resource: {name: memory, highWatermark: 10, lowWatermark: 50, metricSelector: {matchExpressions: [{key: a, operator: Gt, values: ['1']}]}}}]",
    ));
    assert_eq!(
        found,
        [
            "spec.metrics[0].resource.name (\"gpu\") must be \"cpu\" or \"memory\"",
            "spec.metrics[1].resource.metricSelector is required: give the matchLabels of the target's pods (without \
             one, every pod of the namespace would be summed)",
            "spec.metrics[2].resource.lowWatermark (50) must not exceed highWatermark (10)",
            "spec.metrics[2].resource.metricSelector: matchExpressions[0]: operator \"Gt\" must be In, NotIn, Exists or \
             DoesNotExist",
        ]
    );
    // The annotation without a Resource metric to apply to.
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(BASE).unwrap();
    let metadata = doc.get_mut("metadata").unwrap().as_mapping_mut().unwrap();
    let annotations: serde_yaml_ng::Mapping =
        [(POD_AGGREGATION_ANNOTATION.into(), "average".into())].into_iter().collect();
    metadata.insert("annotations".into(), annotations.into());
    assert_eq!(
        problems(&serde_yaml_ng::to_string(&doc).unwrap()),
        ["metadata.annotations[\"watermarkd.io/pod-aggregation\"]: applies to Resource metrics, and this WPA has none"]
    );
}

#[test]
fn map_errors_display_one_line_each() {
    let err = map(&with(&[("maxReplicas", None), ("scaleTargetRef", None)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "WatermarkPodAutoscaler prod/billing: spec.maxReplicas is required\n\
         WatermarkPodAutoscaler prod/billing: spec.scaleTargetRef is required"
    );
}

#[test]
fn durations_and_replica_counts_are_bounded_under_their_wpa_names() {
    let huge = "9223372036854775807";
    for (key, value, expected) in [
        (
            "downscaleForbiddenWindowSeconds",
            huge,
            format!("spec.downscaleForbiddenWindowSeconds ({huge}) must be at most 1day (86400s)"),
        ),
        (
            "upscaleForbiddenWindowSeconds",
            "86401",
            "spec.upscaleForbiddenWindowSeconds (86401) must be at most 1day (86400s)".into(),
        ),
        (
            "upscaleDelayAboveWatermarkSeconds",
            huge,
            format!("spec.upscaleDelayAboveWatermarkSeconds ({huge}) must be at most"),
        ),
        (
            "downscaleDelayBelowWatermarkSeconds",
            huge,
            format!("spec.downscaleDelayBelowWatermarkSeconds ({huge}) must be at most"),
        ),
        (
            "maxReplicas",
            "2147483648",
            "spec.maxReplicas (2147483648) must be a whole number from 0 to 2147483647 (the largest replica count \
             Kubernetes takes)"
                .into(),
        ),
        ("replicaScalingAbsoluteModulo", "2147483648", "spec.replicaScalingAbsoluteModulo (2147483648) must be".into()),
    ] {
        let problems = problems(&with(&[(key, Some(value))]));
        assert_eq!(problems.len(), 1, "{key}: {problems:?}");
        assert!(problems[0].starts_with(&expected), "{key}: {problems:?}");
    }
    let at_bound =
        mapped(&with(&[("maxReplicas", Some("2147483647")), ("downscaleForbiddenWindowSeconds", Some("86400"))]));
    assert_eq!(at_bound.autoscaler.rule.max_replicas(), 2_147_483_647);
}

/// BASE with `annotations` (YAML) under its metadata.
fn annotated(annotations: &str) -> String {
    BASE.replace("  namespace: prod\n", &format!("  namespace: prod\n  annotations:\n{annotations}"))
}

#[test]
fn the_schedules_annotation_reads_as_a_rules_file_schedule() {
    let yaml = annotated(
        r#"    watermarkd.io/schedules: '[{"name": "office", "time_zone": "Europe/Paris", "days": ["weekdays"], "start": "08:00", "end": "18:00", "min_replicas": 6}]'
"#,
    );
    let autoscaler = mapped(&yaml).autoscaler;
    let [office] = &autoscaler.schedules[..] else { panic!("{:?}", autoscaler.schedules) };
    assert_eq!(
        (office.name.as_str(), office.min_replicas, office.time_zone.name.as_str()),
        ("office", 6, "Europe/Paris")
    );

    let wrong = annotated(
        r#"    watermarkd.io/schedules: '[{"days": ["weekdays"], "start": "08:00", "end": "18:00", "min_replicas": 12}, {"cron": "0 7 * *"}]'
"#,
    );
    let at = "metadata.annotations[\"watermarkd.io/schedules\"]";
    assert_eq!(
        problems(&wrong),
        [
            format!("{at}[0].min_replicas (12) must not exceed maxReplicas (9)"),
            format!(
                "{at}[1].cron (\"0 7 * *\") must have five fields (minute hour day-of-month month day-of-week), such \
                 as \"0 8 * * 1-5\", or be one of @yearly, @annually, @monthly, @weekly, @daily, @midnight and @hourly"
            ),
            format!("{at}[1].duration is required"),
            format!("{at}[1].min_replicas is required"),
        ]
    );
    assert_eq!(
        problems(&annotated("    watermarkd.io/schedules: '{\"days\": []}'\n")),
        [format!(
            "{at} must be a JSON list of windows, such as [{{\"days\": [\"weekdays\"], \"start\": \"08:00\", \"end\": \
             \"18:00\", \"min_replicas\": 10}}]"
        )]
    );
}

#[test]
fn the_paused_until_annotation_pauses_a_wpa_until_an_instant() {
    let paused = mapped(&annotated("    watermarkd.io/paused-until: \"2026-12-01T18:00:00Z\"\n")).autoscaler;
    assert_eq!(paused.paused_until.map(|t| t.unix_millis()), Some(1_796_148_000_000));
    assert_eq!(
        problems(&annotated("    watermarkd.io/paused-until: \"tomorrow\"\n")),
        ["metadata.annotations[\"watermarkd.io/paused-until\"] (\"tomorrow\") must be an instant such as \
          \"2026-12-01T18:00:00Z\" (RFC 3339, with its offset)"]
    );
}

#[test]
fn the_fallback_annotation_reads_as_a_rules_file_fallback() {
    use crate::domain::fallback::FallbackAction;
    let declared = mapped(&annotated("    watermarkd.io/fallback: '{\"after\": \"2m\", \"action\": \"last_good\"}'\n"));
    let fallback = declared.autoscaler.fallback.as_deref().expect("a fallback");
    assert_eq!((fallback.after, fallback.action), (Duration::from_secs(120), FallbackAction::LastGood));
    let at = "metadata.annotations[\"watermarkd.io/fallback\"]";
    assert_eq!(
        problems(&annotated("    watermarkd.io/fallback: '{\"action\": \"panic\", \"when\": 1}'\n")),
        [
            format!("{at}.action (\"panic\") must be \"hold\", \"replicas\" or \"last_good\""),
            format!("{at}.when is not a known key (known keys: after, recover_after, action, replicas, scale_down)"),
        ]
    );
}

#[test]
fn the_forecast_annotation_reads_as_a_rules_file_forecast() {
    use crate::domain::forecast::ForecastMode;
    let declared = mapped(&annotated("    watermarkd.io/forecast: '{\"lead_time\": \"10m\", \"mode\": \"scale\"}'\n"));
    let forecast = declared.autoscaler.forecast.as_deref().expect("a forecast");
    assert_eq!((forecast.lead_time, forecast.mode), (Duration::from_secs(600), ForecastMode::Scale));
    assert_eq!(
        problems(&annotated("    watermarkd.io/forecast: '[]'\n")),
        ["metadata.annotations[\"watermarkd.io/forecast\"] must be a JSON object such as {\"lead_time\": \"10m\", \"mode\": \"scale\"}"]
    );
}

/// REVIEW-4 T4-16, for a WPA: where its fields (or watermarkd's annotations) can say the same
/// nonsense as a rules file, they are refused the same way, under the WPA's own paths.
#[test]
fn settings_that_do_nothing_or_mislead_are_refused_in_a_wpa_too() {
    let upper = BASE.replace("kind: Deployment, name: billing", "kind: Deployment, name: Billing");
    assert_eq!(
        problems(&upper),
        ["spec.scaleTargetRef.name (\"Billing\") is not a valid Deployment name: a DNS subdomain (RFC 1123) of \
          lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"]
    );
    let never = annotated(
        r#"    watermarkd.io/schedules: '[{"cron": "0 0 30 feb *", "duration": "1h", "min_replicas": 5}, {"cron": "0 8 * * *", "duration": "1h", "min_replicas": 2, "max_replicas": 3}]'
"#,
    );
    let at = "metadata.annotations[\"watermarkd.io/schedules\"]";
    assert_eq!(
        problems(&never),
        [
            format!("{at}[0].cron (\"0 0 30 feb *\") never fires: February has no day 30"),
            format!(
                "{at}[1].max_replicas (3) must not be below minReplicas (4): the rule never goes below its own floor, \
                 so this cap would do nothing"
            ),
        ]
    );
    let at = "metadata.annotations[\"watermarkd.io/fallback\"]";
    assert_eq!(
        problems(&annotated(
            "    watermarkd.io/fallback: '{\"action\": \"replicas\", \"replicas\": 2, \"scale_down\": true, \"after\": \"5s\"}'\n"
        )),
        [
            format!(
                "{at}.after (5s) must be at least the default interval (15s) with scale_down = true: shorter, one or \
                 two failed reads in a row scale down to the count"
            ),
            format!("{at}.replicas (2) must not be below minReplicas (4): the fallback would run 4"),
        ]
    );
    assert_eq!(
        problems(&annotated("    watermarkd.io/paused-until: \"9999-12-31T23:59:59Z\"\n")),
        ["metadata.annotations[\"watermarkd.io/paused-until\"] (\"9999-12-31T23:59:59Z\") is past the latest instant \
          watermarkd supports (9999-12-30T22:00:00Z)"]
    );
}

#[test]
fn the_observe_and_take_over_annotations_read_as_the_rules_file_s() {
    let observing = mapped(&annotated("    watermarkd.io/observe: \"true\"\n")).autoscaler;
    assert!(observing.observe && !observing.take_over);
    let taking = mapped(&annotated("    watermarkd.io/take-over: \"true\"\n")).autoscaler;
    assert!(taking.take_over && !taking.observe);
    assert_eq!(
        problems(&annotated("    watermarkd.io/take-over: \"yes\"\n")),
        ["metadata.annotations[\"watermarkd.io/take-over\"] must be \"true\" or \"false\", not \"yes\""]
    );
    let both = problems(&annotated("    watermarkd.io/observe: \"true\"\n    watermarkd.io/take-over: \"true\"\n"));
    assert_eq!(both.len(), 1, "{both:?}");
    assert!(
        both[0].starts_with("metadata.annotations[\"watermarkd.io/take-over\"] cannot be combined with observe"),
        "{both:?}"
    );
}
