//! Unit tests of compiling: each problem named at its field's origin, in a source's own words.

use super::*;
use crate::domain::rules::DatadogBackend;

fn at(field: &str) -> Origin {
    Origin::new(field.to_string(), None)
}

fn value<T>(field: &str, value: T) -> Field<T> {
    Field { given: Given::Value(value), origin: at(field) }
}

fn number(text: &str) -> Decimal {
    Decimal::parse(text).unwrap()
}

/// A metric whose fields are named `{at}.{key}`, as a WPA-like source would.
fn metric(at_: &str, low: Option<&str>, high: Option<&str>) -> Field<MetricDraft> {
    let field = |key: &str| format!("{at_}.{key}");
    let watermark = |key: &str, text: Option<&str>| match text {
        Some(text) => value(&field(key), number(text)),
        None => Field::absent(at(&field(key))),
    };
    let draft = MetricDraft {
        origin: at(at_),
        name: value(&field("metricName"), "requests".to_string()),
        query: value(&field("metricName"), "avg:requests{*}".to_string()),
        backend: value(at_, "dd".to_string()),
        reducer: Field::absent(at(&field("reducer"))),
        resource: Field::absent(at(&field("resource"))),
        selector: Field::absent(at(&field("selector"))),
        pod_aggregation: Field::absent(at(&field("podAggregation"))),
        readiness_delay: Field::absent(at(&field("readinessDelay"))),
        max_age: Field::absent(at(&field("maxAge"))),
        low_watermark: watermark("lowWatermark", low),
        high_watermark: watermark("highWatermark", high),
        activation: Field::absent(at(&field("activation"))),
    };
    Field { given: Given::Value(draft), origin: at(at_) }
}

/// An autoscaler named as a WPA names its fields, with `metrics`.
fn draft(metrics: Vec<Field<MetricDraft>>) -> AutoscalerDraft {
    let target = TargetDraft {
        api_version: Field::absent(at("spec.scaleTargetRef.apiVersion")),
        kind: value("spec.scaleTargetRef.kind", "Deployment".to_string()),
        namespace: value("metadata.namespace", "shop".to_string()),
        name: value("spec.scaleTargetRef.name", "web".to_string()),
    };
    let mut knobs = KnobsDraft::absent(|key| at(&format!("spec.{key}")));
    knobs.max_replicas = value("spec.maxReplicas", 10);
    AutoscalerDraft {
        label: Some("shop/web".into()),
        origin: at("spec"),
        name: value("metadata.name", "shop/web".to_string()),
        target: value("spec.scaleTargetRef", target),
        interval: Field::absent(at("spec")),
        shadow: Field::absent(at("metadata.annotations")),
        observe: Field::absent(at("metadata.annotations")),
        take_over: Field::absent(at("metadata.annotations")),
        knobs,
        behavior: Field::absent(at("spec")),
        metrics: value("spec.metrics", metrics),
        recommender: Field::absent(at("spec.recommender")),
        schedules: Field::absent(at("metadata.annotations")),
        paused_until: Field::absent(at("metadata.annotations")),
        fallback: Field::absent(at("metadata.annotations")),
        forecast: Field::absent(at("metadata.annotations")),
    }
}

fn datadog() -> BTreeMap<String, Option<Backend>> {
    let key = super::super::SecretSource::Env("K".into());
    let backend = DatadogBackend {
        site: "datadoghq.com".into(),
        url: None,
        api_key: key.clone(),
        app_key: key,
        window: std::time::Duration::from_secs(300),
        max_age: None,
        timeout: DEFAULT_TIMEOUT,
        max_in_flight: 4,
        bad_query_retry: std::time::Duration::from_secs(600),
        allow_insecure_http: false,
        namespace_budget_percent: 100,
        fold_queries: true,
    };
    BTreeMap::from([("dd".to_string(), Some(Backend::Datadog(backend)))])
}

/// Compiles `draft` as a running autoscaler: its problems as `field message`.
fn problems(draft: &AutoscalerDraft) -> (Vec<String>, Option<Autoscaler>) {
    let backends = datadog();
    let mut sink = Sink::default();
    let compiled = compile(draft, Require::Everything { backends: Some(&backends) }, &mut sink);
    let shown = sink.problems.iter().map(|p| format!("{} {}", p.field, p.message)).collect();
    (shown, compiled.into_autoscaler(draft))
}

#[test]
fn object_names_are_dns_subdomains_and_namespaces_dns_labels() {
    for valid in ["web", "web-1", "a.b-c.d", "0", &"a".repeat(253)] {
        assert_eq!(dns_subdomain_problem(valid, "Deployment"), None, "{valid}");
    }
    let long_label = "a".repeat(64);
    for invalid in ["WEB", "web_1", "-web", "web-", "web.", ".web", "a..b", "", &"a".repeat(254), "wéb"] {
        let problem = dns_subdomain_problem(invalid, "StatefulSet").unwrap_or_default();
        assert!(
            problem.contains("is not a valid StatefulSet name: a DNS subdomain (RFC 1123)"),
            "{invalid}: {problem}"
        );
    }
    assert_eq!(dns_label_problem("prod-1", "namespace"), None);
    for invalid in ["Prod", "a.b", &long_label, ""] {
        assert!(dns_label_problem(invalid, "namespace").is_some(), "{invalid}");
    }
    // Kubernetes limits a subdomain's length, not its labels'.
    assert_eq!(dns_subdomain_problem(&format!("{long_label}.b"), "Deployment"), None);
}

#[test]
fn a_valid_draft_compiles_to_its_autoscaler() {
    let (found, autoscaler) = problems(&draft(vec![metric("spec.metrics[0]", Some("1"), Some("2"))]));
    assert!(found.is_empty(), "{found:?}");
    let autoscaler = autoscaler.expect("an autoscaler");
    assert_eq!(&*autoscaler.target.api_version, "apps/v1");
    assert_eq!(autoscaler.metrics[0].query, "avg:requests{*}");
    assert_eq!(autoscaler.rule.max_replicas(), 10);
}

#[test]
fn a_problem_between_two_fields_names_the_other_as_its_source_does() {
    let mut inverted = draft(vec![metric("spec.metrics[0]", Some("3"), Some("2"))]);
    inverted.knobs.min_replicas = value("spec.minReplicas", 12);
    let (found, autoscaler) = problems(&inverted);
    assert_eq!(
        found,
        [
            "spec.minReplicas (12) must not exceed maxReplicas (10)",
            "spec.metrics[0].lowWatermark (3) must not exceed highWatermark (2)",
        ]
    );
    assert!(autoscaler.is_none());
    let (found, _) = problems(&draft(vec![metric("spec.metrics[0]", None, None)]));
    assert_eq!(found, ["spec.metrics[0].highWatermark at least one of lowWatermark and highWatermark is required"]);
}

#[test]
fn what_a_reader_could_not_read_is_not_said_again() {
    // The engine would take min_replicas as 1 and find it above 0; the reader said why
    // it could not read it, and that is all.
    let mut unreadable = draft(vec![metric("spec.metrics[0]", Some("1"), Some("2"))]);
    unreadable.knobs.min_replicas = Field { given: Given::Unreadable, origin: at("spec.minReplicas") };
    unreadable.knobs.max_replicas = value("spec.maxReplicas", 0);
    let (found, autoscaler) = problems(&unreadable);
    assert!(found.is_empty(), "{found:?}");
    // The engine still refuses the rule: only its words are not repeated.
    assert!(autoscaler.is_none());
    let broken = Field { given: Given::Unreadable, origin: at("spec.metrics[0]") };
    let (found, _) = problems(&draft(vec![broken]));
    assert!(found.is_empty(), "a metric said to be broken is not checked: {found:?}");
}

#[test]
fn a_watermark_given_alone_is_reported_once() {
    let (found, _) = problems(&draft(vec![metric("spec.metrics[0]", None, Some("0"))]));
    assert_eq!(found, ["spec.metrics[0].highWatermark (0) must be greater than 0"]);
}

#[test]
fn what_is_required_and_which_backends_exist_is_checked_only_for_a_running_autoscaler() {
    let mut partial = draft(vec![metric("spec.metrics[0]", Some("1"), Some("2"))]);
    partial.name = Field::absent(at("metadata.name"));
    partial.target = Field::absent(at("spec.scaleTargetRef"));
    if let Given::Value(metrics) = &mut partial.metrics.given {
        if let Given::Value(first) = &mut metrics[0].given {
            first.backend = value("spec.metrics[0]", "nope".to_string());
        }
    }
    let (found, _) = problems(&partial);
    assert_eq!(
        found,
        [
            "metadata.name is required",
            "spec.scaleTargetRef is required",
            "spec.metrics[0] (\"nope\") names no [backend.nope] table (defined: dd)",
        ]
    );
    let mut sink = Sink::default();
    let compiled = compile(&partial, Require::Rule, &mut sink);
    assert!(sink.problems.is_empty(), "{:?}", sink.problems);
    assert!(compiled.rule.is_some());
}
