//! A WPA's metrics as drafts: External metrics with the query the Cluster Agent would build
//! (or the `watermarkd.io/queries` annotation's), Resource metrics with their selector and the
//! pod aggregation of the `watermarkd.io/pod-aggregation` annotation.

use std::collections::BTreeMap;

use super::super::annotation::{annotation_path, read_overrides, QueryOverride, QUERIES_ANNOTATION};
use super::super::query::{datadog_query, metric_reference, tag_scope, DatadogMetricQueries, MetricReference};
use super::super::types::{ExternalMetricSource, MetricSpec, ResourceMetricSource, WatermarkPodAutoscaler};
use super::{annotation_key_path, Mapper, MappingOptions, POD_AGGREGATION_ANNOTATION};
use crate::domain::rules::draft::{Field, Given, MetricDraft, Origin};
use crate::domain::rules::reader::{choose, seconds_at_most, MAX_DURATION};
use crate::domain::rules::selector::{selector_text, Expression};
use crate::domain::rules::{PodAggregation, ResourceName, POD_AGGREGATIONS, RESOURCES};

impl Mapper {
    /// Every metric in `metrics` (the WPA's, or none with a recommender), at the same index.
    pub(super) fn metrics(
        &mut self,
        wpa: &WatermarkPodAutoscaler,
        metrics: &[MetricSpec],
        options: &MappingOptions,
        datadog_metrics: &dyn DatadogMetricQueries,
        pod_aggregation: Option<String>,
    ) -> Vec<Field<MetricDraft>> {
        let overrides = read_overrides(wpa.metadata.annotations.as_ref(), metrics);
        for (field, message) in overrides.problems {
            self.problem(&field, message);
        }
        let names = metric_names(metrics);
        let context = ResourceContext { readiness_delay_seconds: wpa.spec.readiness_delay_seconds, pod_aggregation };
        let mut drafts = Vec::with_capacity(metrics.len());
        for (index, metric) in metrics.iter().enumerate() {
            let at = format!("spec.metrics[{index}]");
            let name = names.get(index).map(String::as_str).unwrap_or_default();
            let draft = match metric.type_.as_str() {
                "External" => match &metric.external {
                    Some(external) => {
                        let query = overrides.by_metric.get(&index);
                        Some(self.external(&at, name, external, query, options, datadog_metrics))
                    }
                    None => {
                        self.problem(&format!("{at}.external"), "is required when type is External");
                        None
                    }
                },
                "Resource" => match &metric.resource {
                    Some(resource) => Some(self.resource(&at, name, resource, &context)),
                    None => {
                        self.problem(&format!("{at}.resource"), "is required when type is Resource");
                        None
                    }
                },
                other => {
                    self.problem(&format!("{at}.type"), format!("({other:?}) must be \"External\" or \"Resource\""));
                    None
                }
            };
            // A metric that is not one is said above, and nothing more of it: its index stays.
            let given = draft.map_or(Given::Unreadable, Given::Value);
            drafts.push(Field { given, origin: Origin::new(at, None) });
        }
        drafts
    }

    /// A metric with every field absent, each named under `at`.
    fn empty_metric(at: &str) -> MetricDraft {
        fn absent<T>(at: &str, key: &str) -> Field<T> {
            Field::absent(Origin::new(format!("{at}.{key}"), None))
        }
        MetricDraft {
            origin: Origin::new(at.to_string(), None),
            name: absent(at, "name"),
            query: absent(at, "query"),
            backend: absent(at, "backend"),
            reducer: absent(at, "reducer"),
            resource: absent(at, "resource"),
            selector: absent(at, "selector"),
            pod_aggregation: absent(at, "podAggregation"),
            readiness_delay: absent(at, "readinessDelay"),
            max_age: absent(at, "maxAge"),
            low_watermark: absent(at, "lowWatermark"),
            high_watermark: absent(at, "highWatermark"),
            activation: absent(at, "activation"),
        }
    }

    /// An External metric: the query the annotation gives, or the one the Cluster Agent would
    /// build.
    fn external(
        &mut self,
        at: &str,
        name: &str,
        external: &ExternalMetricSource,
        query_override: Option<&QueryOverride>,
        options: &MappingOptions,
        datadog_metrics: &dyn DatadogMetricQueries,
    ) -> MetricDraft {
        let mut draft = Self::empty_metric(at);
        draft.name = self.text(format!("{at}.external.metricName"), Some(&name.to_string()));
        match query_override {
            Some(query_override) => {
                draft.query = query_override.query.clone();
                draft.reducer = query_override.reducer.clone();
                draft.max_age = query_override.max_age.clone();
                draft.backend = match query_override.backend.given {
                    Given::Absent => Mapper::given(
                        annotation_path(&format!("[{}]", query_override.entry)),
                        Some(options.default_backend.clone()),
                    ),
                    _ => query_override.backend.clone(),
                };
            }
            None => {
                // A default backend that does not exist is reported by compiling, as for any
                // metric; one of another type would take the Datadog query without complaint.
                if let (Some(problem), Some(_)) = (options.default_backend_problem(), options.default_backend_type()) {
                    self.problem(
                        &format!("{at}.external.metricName"),
                        format!(
                            "has no query in the {QUERIES_ANNOTATION} annotation, and {problem}: give this metric a \
                             query there, or set default_backend to a datadog backend"
                        ),
                    );
                }
                draft.query = self.built_query(at, external, options, datadog_metrics);
                draft.backend = Mapper::given(at.to_string(), Some(options.default_backend.clone()));
            }
        }
        draft.low_watermark = self.quantity(format!("{at}.external.lowWatermark"), external.low_watermark.as_ref());
        draft.high_watermark = self.quantity(format!("{at}.external.highWatermark"), external.high_watermark.as_ref());
        draft
    }

    /// The query the Cluster Agent would use: built from the metric name and labels, or a
    /// `DatadogMetric`'s.
    fn built_query(
        &mut self,
        at: &str,
        external: &ExternalMetricSource,
        options: &MappingOptions,
        datadog_metrics: &dyn DatadogMetricQueries,
    ) -> Field<String> {
        let field = format!("{at}.external.metricName");
        let name = &external.metric_name;
        let query = match metric_reference(name) {
            MetricReference::DatadogMetric { namespace, name: object } => {
                let query = datadog_metrics.datadog_metric_query(&namespace, &object);
                if query.is_none() {
                    self.problem(
                        &field,
                        format!(
                            "({name:?}) refers to the DatadogMetric {namespace}/{object}, which does not exist or has \
                             no spec.query"
                        ),
                    );
                }
                query
            }
            MetricReference::MalformedDatadogMetric => {
                self.problem(
                    &field,
                    format!(
                        "({name:?}) must be datadogmetric@<namespace>:<name>, each a lowercase Kubernetes name, to \
                         refer to a DatadogMetric"
                    ),
                );
                None
            }
            MetricReference::Metric => self.selector_query(at, external, options),
        };
        // A query that could not be made is said above, and not also called missing.
        let given = query.map_or(Given::Unreadable, Given::Value);
        Field { given, origin: Origin::new(field, None) }
    }

    fn selector_query(
        &mut self,
        at: &str,
        external: &ExternalMetricSource,
        options: &MappingOptions,
    ) -> Option<String> {
        let Some(selector) = &external.metric_selector else {
            // The Datadog controller rejects this too ("Missing Labels"): querying a metric over
            // every tag is rarely meant, so it must be asked for with `metricSelector: {}`.
            self.problem(
                &format!("{at}.external.metricSelector"),
                "is required (as the Datadog controller requires it): give matchLabels, or {} to query the metric \
                 over every tag ({*})",
            );
            return None;
        };
        if selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
            self.problem(
                &format!("{at}.external.metricSelector.matchExpressions"),
                "is not supported: the Cluster Agent builds a Datadog query from matchLabels only (tag:value \
                 filters); use matchLabels, or give the query in the watermarkd.io/queries annotation",
            );
            return None;
        }
        let labels = selector.match_labels.clone().unwrap_or_default();
        Some(datadog_query(&external.metric_name, &labels, &options.aggregator, options.rollup_seconds))
    }

    /// A Resource metric: the resource by name (cpu or memory), the selector as text, the WPA's
    /// readiness delay, and the pod aggregation of the annotation.
    fn resource(
        &mut self,
        at: &str,
        name: &str,
        resource: &ResourceMetricSource,
        context: &ResourceContext,
    ) -> MetricDraft {
        let mut draft = Self::empty_metric(at);
        let name_at = format!("{at}.resource.name");
        draft.name = self.text(name_at.clone(), Some(&name.to_string()));
        draft.resource =
            self.field(name_at, Some(resource.name.as_str()), |r| choose(r, ResourceName::parse, RESOURCES));
        let selector_at = format!("{at}.resource.metricSelector");
        let selector = match &resource.metric_selector {
            // The Datadog controller would list the PodMetrics of the whole namespace and sum
            // them: never what was meant.
            None => Err("is required: give the matchLabels of the target's pods (without one, every pod of the \
                         namespace would be summed)"
                .to_string()),
            Some(selector) => {
                let labels = selector.match_labels.clone().unwrap_or_default();
                let expressions: Vec<Expression> = selector
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|e| Expression {
                        key: e.key.clone(),
                        operator: e.operator.clone(),
                        values: e.values.clone().unwrap_or_default(),
                    })
                    .collect();
                selector_text(&labels, &expressions)
            }
        };
        draft.selector = self.field(selector_at, Some(selector), |selector| selector);
        draft.readiness_delay = self.field("spec.readinessDelaySeconds", context.readiness_delay_seconds, |seconds| {
            seconds_at_most(i128::from(seconds), MAX_DURATION)
        });
        draft.pod_aggregation = self.field(
            annotation_key_path(POD_AGGREGATION_ANNOTATION),
            context.pod_aggregation.as_deref(),
            |aggregation| choose(aggregation, PodAggregation::parse, POD_AGGREGATIONS),
        );
        draft.low_watermark = self.quantity(format!("{at}.resource.lowWatermark"), resource.low_watermark.as_ref());
        draft.high_watermark = self.quantity(format!("{at}.resource.highWatermark"), resource.high_watermark.as_ref());
        draft
    }
}

/// What every Resource metric of one WPA takes from the rest of the object.
struct ResourceContext {
    readiness_delay_seconds: Option<i64>,
    pod_aggregation: Option<String>,
}

/// The rule's name for each metric: its `metricName` (the Datadog controller's `metric_name`
/// label), with the tag scope added when several External metrics share one, so that names stay
/// unique. Resource metrics are named by their resource.
fn metric_names(metrics: &[MetricSpec]) -> Vec<String> {
    let external_name = |m: &MetricSpec| m.external.as_ref().map(|e| e.metric_name.clone());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for name in metrics.iter().filter(|m| m.type_ == "External").filter_map(external_name) {
        *counts.entry(name).or_default() += 1;
    }
    metrics
        .iter()
        .map(|m| match (m.type_.as_str(), &m.external, &m.resource) {
            ("External", Some(e), _) if counts.get(&e.metric_name).is_some_and(|&n| n > 1) => {
                let labels = e.metric_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
                format!("{}{{{}}}", e.metric_name, tag_scope(&labels))
            }
            ("External", Some(e), _) => e.metric_name.clone(),
            ("Resource", _, Some(r)) => r.name.clone(),
            _ => String::new(),
        })
        .collect()
}
