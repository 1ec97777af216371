//! The Datadog query an External metric stands for, built exactly as the Datadog Cluster Agent
//! builds it (`buildDatadogQueryForExternalMetric` in datadog-agent), and the
//! `datadogmetric@<namespace>:<name>` references it resolves to a `DatadogMetric`'s query.

use std::collections::BTreeMap;

use super::types::DatadogMetric;

/// The Cluster Agent's `external_metrics.aggregator` default.
pub const DEFAULT_AGGREGATOR: &str = "avg";
/// The Cluster Agent's `external_metrics_provider.rollup` default, in seconds.
pub const DEFAULT_ROLLUP_SECONDS: u32 = 30;

const DATADOG_METRIC_PREFIX: &str = "datadogmetric@";

/// `<aggregator>:<metric>{<tags>}.rollup(<seconds>)`, the tags being `key:value` for each label,
/// sorted and comma-joined, or `*` when there are none.
///
/// The Cluster Agent sorts the joined `key:value` strings (Go's `sort.Strings`), not the keys;
/// the two orders differ only when one key is a prefix of another followed by a byte that sorts
/// before `:` (`a-b:1` sorts before `a:2`), and we sort the same way so that the query is
/// byte-for-byte the one the Cluster Agent sent.
pub fn datadog_query(metric_name: &str, labels: &BTreeMap<String, String>, aggregator: &str, rollup: u32) -> String {
    format!("{aggregator}:{metric_name}{{{}}}.rollup({rollup})", tag_scope(labels))
}

/// The part of a query between the braces: `k:v,...` sorted, or `*`.
pub fn tag_scope(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "*".into();
    }
    let mut tags: Vec<String> = labels.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    tags.sort();
    tags.join(",")
}

/// What an External metric's `metricName` refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricReference {
    /// A plain Datadog metric name: the query is built from it and the selector's labels.
    Metric,
    /// `datadogmetric@<namespace>:<name>`: the query is that `DatadogMetric`'s `spec.query`.
    DatadogMetric { namespace: String, name: String },
    /// Starts with `datadogmetric@` but is not `<namespace>:<name>` with Kubernetes names; the
    /// Cluster Agent rejects it too.
    MalformedDatadogMetric,
}

/// Reads `metricName` as the Cluster Agent does: case-insensitively (it lowercases the name
/// first), with namespace and name each a DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`).
pub fn metric_reference(metric_name: &str) -> MetricReference {
    let lower = metric_name.to_lowercase();
    let Some(rest) = lower.strip_prefix(DATADOG_METRIC_PREFIX) else { return MetricReference::Metric };
    match rest.split_once(':') {
        Some((namespace, name)) if is_dns_label(namespace) && is_dns_label(name) => {
            MetricReference::DatadogMetric { namespace: namespace.to_string(), name: name.to_string() }
        }
        _ => MetricReference::MalformedDatadogMetric,
    }
}

fn is_dns_label(text: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (text.chars().next(), text.chars().last()) {
        (Some(first), Some(last)) => alnum(first) && alnum(last) && text.chars().all(|c| alnum(c) || c == '-'),
        _ => false,
    }
}

/// Where the mapping finds the query of a `DatadogMetric`. The daemon's watcher keeps a
/// `DatadogMetricIndex` current; tests may pass a closure.
pub trait DatadogMetricQueries {
    /// `spec.query` of the `DatadogMetric` `namespace/name`, or `None` when there is no such
    /// object or its query is empty.
    fn datadog_metric_query(&self, namespace: &str, name: &str) -> Option<String>;
}

/// No `DatadogMetric` is known (a cluster without the Datadog Operator's CRD).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDatadogMetrics;

impl DatadogMetricQueries for NoDatadogMetrics {
    fn datadog_metric_query(&self, _: &str, _: &str) -> Option<String> {
        None
    }
}

impl<F: Fn(&str, &str) -> Option<String>> DatadogMetricQueries for F {
    fn datadog_metric_query(&self, namespace: &str, name: &str) -> Option<String> {
        self(namespace, name)
    }
}

/// The queries of known `DatadogMetric` objects by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatadogMetricIndex {
    queries: BTreeMap<(String, String), String>,
}

impl DatadogMetricIndex {
    pub fn from_objects<'a>(objects: impl IntoIterator<Item = &'a DatadogMetric>) -> Self {
        let mut index = DatadogMetricIndex::default();
        for object in objects {
            index.insert(object);
        }
        index
    }

    /// Adds or replaces one object (an object without a name or namespace is ignored: the
    /// apiserver never returns one).
    pub fn insert(&mut self, object: &DatadogMetric) {
        if let (Some(namespace), Some(name)) = (&object.metadata.namespace, &object.metadata.name) {
            self.queries.insert((namespace.clone(), name.clone()), object.spec.query.clone());
        }
    }

    #[cfg(test)]
    pub fn remove(&mut self, namespace: &str, name: &str) {
        self.queries.remove(&(namespace.to_string(), name.to_string()));
    }
}

impl DatadogMetricQueries for DatadogMetricIndex {
    fn datadog_metric_query(&self, namespace: &str, name: &str) -> Option<String> {
        self.queries.get(&(namespace.to_string(), name.to_string())).filter(|query| !query.trim().is_empty()).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn queries_are_built_as_the_cluster_agent_builds_them() {
        let selector =
            labels(&[("short_image", "billing-app"), ("kubernetes_cluster", "mycluster"), ("service", "billing")]);
        assert_eq!(
            datadog_query("custom.request_duration.max", &selector, "avg", 30),
            "avg:custom.request_duration.max{kubernetes_cluster:mycluster,service:billing,short_image:billing-app}.rollup(30)"
        );
        assert_eq!(
            datadog_query("nginx.net.request_per_s", &labels(&[]), "avg", 30),
            "avg:nginx.net.request_per_s{*}.rollup(30)"
        );
        assert_eq!(datadog_query("m", &labels(&[("a", "1")]), "max", 60), "max:m{a:1}.rollup(60)");
    }

    #[test]
    fn tags_sort_as_joined_strings_like_go_sort_strings() {
        // By key, "a" < "a-b"; as "k:v" strings, "a-b:2" < "a:1" because '-' < ':'.
        assert_eq!(tag_scope(&labels(&[("a", "1"), ("a-b", "2")])), "a-b:2,a:1");
        assert_eq!(tag_scope(&labels(&[("b", "1"), ("a", "2")])), "a:2,b:1");
    }

    #[test]
    fn datadog_metric_references_are_read_case_insensitively() {
        assert_eq!(
            metric_reference("datadogmetric@prod:billing-latency"),
            MetricReference::DatadogMetric { namespace: "prod".into(), name: "billing-latency".into() }
        );
        assert_eq!(
            metric_reference("DatadogMetric@Prod:Latency"),
            MetricReference::DatadogMetric { namespace: "prod".into(), name: "latency".into() }
        );
        assert_eq!(metric_reference("custom.request_duration.max"), MetricReference::Metric);
        for bad in [
            "datadogmetric@prod",
            "datadogmetric@:x",
            "datadogmetric@a:b:c",
            "datadogmetric@a:-b",
            "datadogmetric@a_b:c",
        ] {
            assert_eq!(metric_reference(bad), MetricReference::MalformedDatadogMetric, "{bad}");
        }
    }

    #[test]
    fn the_index_answers_by_namespace_and_name() {
        let mut index = DatadogMetricIndex::from_objects(&[
            DatadogMetric::new("prod", "latency", "max:trace.http.request.duration{service:billing}"),
            DatadogMetric::new("prod", "empty", " "),
        ]);
        assert_eq!(
            index.datadog_metric_query("prod", "latency").as_deref(),
            Some("max:trace.http.request.duration{service:billing}")
        );
        assert_eq!(index.datadog_metric_query("staging", "latency"), None);
        assert_eq!(index.datadog_metric_query("prod", "empty"), None);
        index.remove("prod", "latency");
        assert_eq!(index.datadog_metric_query("prod", "latency"), None);
        assert_eq!(NoDatadogMetrics.datadog_metric_query("prod", "latency"), None);
    }
}
