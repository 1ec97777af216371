//! `datadoghq.com/v1alpha1` objects as the Datadog CRD defines them: `WatermarkPodAutoscaler`
//! (spec and status) and the `DatadogMetric` an external metric may refer to.
//!
//! Deserialization is deliberately lenient. The apiserver already validated every object
//! against the CRD's schema, and a typed watcher fails its whole list on one object it cannot
//! read, so one odd object must not stop every autoscaler: every field is optional or defaulted
//! (an object without `spec` is valid under the Datadog CRD), integers are `i64` (the apiserver
//! does not enforce `format: int32`), quantities are strings or numbers, and unknown fields are
//! ignored. Whether a spec makes sense is decided later, by the same validation as the rules
//! file (`super::mapping`), which names every problem.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::core::object::HasStatus;
use serde::{Deserialize, Serialize};
use watermarkd_engine::{Decimal, Timestamp};

use crate::domain::rules::parse_quantity;

pub const GROUP: &str = "datadoghq.com";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "datadoghq.com/v1alpha1";
pub const KIND: &str = "WatermarkPodAutoscaler";
pub const PLURAL: &str = "watermarkpodautoscalers";
pub const SINGULAR: &str = "watermarkpodautoscaler";
pub const SHORT_NAME: &str = "wpa";

/// A Kubernetes quantity as written in an object: `"400m"`, `"1.5k"`, `50`. The Datadog CRD
/// declares these fields int-or-string; a float (`tolerance: 0.01`) is kept too, as the
/// Datadog controller's YAML examples use one.
#[derive(Clone, Debug)]
pub enum Quantity {
    Number(serde_json::Number),
    String(String),
}

impl Quantity {
    /// The exact value, or why the text is not a quantity.
    pub fn to_decimal(&self) -> Result<Decimal, String> {
        match self {
            Quantity::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Ok(Decimal::from_parts(i128::from(i), 0)),
                (None, Some(u), _) => Ok(Decimal::from_parts(i128::from(u), 0)),
                (None, None, Some(f)) => Decimal::from_f64(f).ok_or_else(|| format!("{f} is not a finite number")),
                (None, None, None) => Err(format!("{n} is not a number")),
            },
            Quantity::String(s) => parse_quantity(s).map_err(|e| e.to_string()),
        }
    }

    /// The same value as a JSON value (a number stays a number, text stays text), for the
    /// rules reader, which accepts both.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Quantity::Number(n) => serde_json::Value::Number(n.clone()),
            Quantity::String(s) => serde_json::Value::String(s.clone()),
        }
    }

    /// A value in thousandths, written in Kubernetes' canonical decimal form (`420m`, `3`,
    /// `1500`, `2k`), as `resource.NewMilliQuantity(m, DecimalSI).String()` does.
    pub fn from_milli(milli: i64) -> Quantity {
        Quantity::String(format_milli(milli))
    }
}

/// Semantic equality, as Kubernetes' `apiequality.Semantic` compares quantities: `"0.5"`,
/// `"500m"` and `0.5` are the same value. Text that is no quantity compares as text.
impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        match (self.to_decimal(), other.to_decimal()) {
            (Ok(a), Ok(b)) => a == b,
            _ => self.to_string() == other.to_string(),
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantity::Number(n) => write!(f, "{n}"),
            Quantity::String(s) => f.write_str(s),
        }
    }
}

impl From<&str> for Quantity {
    fn from(text: &str) -> Self {
        Quantity::String(text.to_string())
    }
}

impl Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Quantity::Number(n) => n.serialize(serializer),
            Quantity::String(s) => serializer.serialize_str(s),
        }
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes quantity (a string such as \"400m\" or a number)")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::Number(v.into()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity::Number(v.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                serde_json::Number::from_f64(v)
                    .map(Quantity::Number)
                    .ok_or_else(|| E::custom(format!("{v} is not a finite number")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity::String(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `m` thousandths in canonical DecimalSI form: the largest power-of-1000 suffix that keeps an
/// integer mantissa, and `m` only for values with a fractional part.
pub(crate) fn format_milli(milli: i64) -> String {
    if milli == 0 {
        return "0".into();
    }
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let mut value = milli / 1000;
    let mut suffix = "";
    // Each larger suffix is taken while the value stays a whole multiple of a thousand.
    for larger in ["k", "M", "G", "T", "P", "E"] {
        if value % 1000 != 0 {
            break;
        }
        value /= 1000;
        suffix = larger;
    }
    format!("{value}{suffix}")
}

/// What is scaled: a resource with a `/scale` subresource, in the WPA's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CrossVersionObjectReference {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `spec` of a `WatermarkPodAutoscaler`: every field the Datadog CRD defines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatermarkPodAutoscalerSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// `"highwatermark"` or `"lowwatermark"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub converge_towards_watermark: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downscale_delay_below_watermark_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downscale_forbidden_window_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_available_replica_percentage: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness_delay_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recommender: Option<RecommenderSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_scaling_absolute_modulo: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_limit_factor: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_target_ref: Option<CrossVersionObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_up_limit_factor: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerate_zero: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upscale_delay_above_watermark_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upscale_forbidden_window_seconds: Option<i64>,
}

/// One metric: `type` and the matching source (`External` or `Resource`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MetricSpec {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalMetricSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceMetricSource>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExternalMetricSource {
    pub metric_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_selector: Option<LabelSelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_watermark: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low_watermark: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceMetricSource {
    /// `cpu`, `memory`, ...
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_selector: Option<LabelSelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_watermark: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low_watermark: Option<Quantity>,
}

/// An external replica recommender service (`src/backend/recommender.rs`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecommenderSpec {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_type: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_watermark: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low_watermark: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<RecommenderTlsConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecommenderTlsConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

/// `status` as the Datadog controller writes it, so that `kubectl get wpa` columns and
/// dashboards built on it keep working. `currentReplicas` and `desiredReplicas` are required
/// by the CRD and always written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatermarkPodAutoscalerStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling_events_count: Option<i64>,
    pub current_replicas: i64,
    pub desired_replicas: i64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub current_metrics: Vec<MetricStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The type and status of the condition set last, for the `condition` printer columns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_condition_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_condition_state: Option<String>,
}

impl WatermarkPodAutoscalerStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// One condition, in the shape of `autoscaling/v2beta1` `HorizontalPodAutoscalerCondition`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Timestamp>,
}

/// One entry of `status.currentMetrics` (`autoscaling/v2beta1` `MetricStatus`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MetricStatus {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods: Option<PodsMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectMetricStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_resource: Option<ContainerResourceMetricStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExternalMetricStatus {
    pub metric_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_selector: Option<LabelSelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_value: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_average_value: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceMetricStatus {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_average_utilization: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_average_value: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodsMetricStatus {
    pub metric_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_average_value: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMetricStatus {
    pub metric_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<CrossVersionObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_value: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub average_value: Option<Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerResourceMetricStatus {
    pub name: String,
    pub container: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_average_utilization: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_average_value: Option<Quantity>,
}

/// A `datadoghq.com/v1alpha1` `WatermarkPodAutoscaler`. Written by hand rather than with
/// `#[derive(CustomResource)]` because the derive makes `spec` mandatory, and one object
/// without a spec (valid under the Datadog CRD) would then fail a whole typed list.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct WatermarkPodAutoscaler {
    pub metadata: ObjectMeta,
    pub spec: WatermarkPodAutoscalerSpec,
    pub status: Option<WatermarkPodAutoscalerStatus>,
}

impl WatermarkPodAutoscaler {
    pub fn new(name: &str, spec: WatermarkPodAutoscalerSpec) -> Self {
        let metadata = ObjectMeta { name: Some(name.to_string()), ..ObjectMeta::default() };
        WatermarkPodAutoscaler { metadata, spec, status: None }
    }
}

impl Serialize for WatermarkPodAutoscaler {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Repr<'a> {
            api_version: &'a str,
            kind: &'a str,
            metadata: &'a ObjectMeta,
            spec: &'a WatermarkPodAutoscalerSpec,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<&'a WatermarkPodAutoscalerStatus>,
        }
        Repr {
            api_version: API_VERSION,
            kind: KIND,
            metadata: &self.metadata,
            spec: &self.spec,
            status: self.status.as_ref(),
        }
        .serialize(serializer)
    }
}

/// `kube::Resource` for a namespaced datadoghq.com/v1alpha1 type with a `metadata` field.
/// Written out rather than derived: the derive makes `spec` mandatory, and the Datadog CRD
/// accepts objects without one, which would break every typed list or watch.
macro_rules! namespaced_datadog_resource {
    ($ty:ty, $kind:expr, $plural:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

namespaced_datadog_resource!(WatermarkPodAutoscaler, KIND, PLURAL);

impl HasStatus for WatermarkPodAutoscaler {
    type Status = WatermarkPodAutoscalerStatus;
    fn status(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn status_mut(&mut self) -> &mut Option<Self::Status> {
        &mut self.status
    }
}

/// `spec` of a `datadoghq.com/v1alpha1` `DatadogMetric` (the Datadog Operator's CRD): a raw
/// Datadog query that an external metric named `datadogmetric@<namespace>:<name>` stands for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DatadogMetricSpec {
    pub query: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_metric_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_window: Option<String>,
}

/// A `DatadogMetric`; its status (the Cluster Agent's last value) is of no use to watermarkd,
/// which queries Datadog itself, and is not read.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct DatadogMetric {
    pub metadata: ObjectMeta,
    pub spec: DatadogMetricSpec,
}

pub const DATADOG_METRIC_KIND: &str = "DatadogMetric";
pub const DATADOG_METRIC_PLURAL: &str = "datadogmetrics";

impl DatadogMetric {
    #[cfg(test)]
    pub fn new(namespace: &str, name: &str, query: &str) -> Self {
        let metadata = ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        };
        DatadogMetric { metadata, spec: DatadogMetricSpec { query: query.to_string(), ..DatadogMetricSpec::default() } }
    }
}

impl Serialize for DatadogMetric {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Repr<'a> {
            api_version: &'a str,
            kind: &'a str,
            metadata: &'a ObjectMeta,
            spec: &'a DatadogMetricSpec,
        }
        Repr { api_version: API_VERSION, kind: DATADOG_METRIC_KIND, metadata: &self.metadata, spec: &self.spec }
            .serialize(serializer)
    }
}

namespaced_datadog_resource!(DatadogMetric, DATADOG_METRIC_KIND, DATADOG_METRIC_PLURAL);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_strings_integers_and_floats() {
        let q: Vec<Quantity> = serde_json::from_str(r#"["400m", 50, 0.01, "1.5k"]"#).unwrap();
        let values: Vec<String> = q.iter().map(|q| q.to_decimal().unwrap().to_string()).collect();
        assert_eq!(values, ["0.4", "50", "0.01", "1500"]);
        assert_eq!(serde_json::to_string(&q).unwrap(), r#"["400m",50,0.01,"1.5k"]"#);
        assert!(Quantity::from("lots").to_decimal().is_err());
    }

    #[test]
    fn quantities_compare_by_value() {
        assert_eq!(Quantity::from("500m"), Quantity::from("0.5"));
        assert_eq!(Quantity::from("2k"), Quantity::Number(2000.into()));
        assert_ne!(Quantity::from("2k"), Quantity::from("2Ki"));
        assert_eq!(Quantity::from("x"), Quantity::from("x"));
        assert_ne!(Quantity::from("x"), Quantity::from("y"));
    }

    #[test]
    fn milli_values_are_written_in_canonical_form() {
        let cases = [
            (0, "0"),
            (420, "420m"),
            (1500, "1500m"),
            (3000, "3"),
            (1_500_000, "1500"),
            (2_000_000, "2k"),
            (-250, "-250m"),
            (900_000_000, "900k"),
            (5_000_000_000, "5M"),
        ];
        for (milli, text) in cases {
            assert_eq!(format_milli(milli), text, "{milli}");
            assert_eq!(Quantity::from_milli(milli).to_decimal().unwrap(), Decimal::from_parts(milli.into(), -3));
        }
    }

    #[test]
    fn an_object_without_spec_or_with_unknown_fields_still_reads() {
        let wpa: WatermarkPodAutoscaler = serde_json::from_value(serde_json::json!({
            "apiVersion": "datadoghq.com/v1alpha1",
            "kind": "WatermarkPodAutoscaler",
            "metadata": {"name": "a", "namespace": "b"},
            "somethingNew": true
        }))
        .unwrap();
        assert_eq!(wpa.spec, WatermarkPodAutoscalerSpec::default());
        let back = serde_json::to_value(&wpa).unwrap();
        assert_eq!(back["apiVersion"], "datadoghq.com/v1alpha1");
        assert_eq!(back["kind"], "WatermarkPodAutoscaler");
    }

    #[test]
    fn status_times_null_and_missing_are_absent() {
        let status: WatermarkPodAutoscalerStatus = serde_json::from_value(serde_json::json!({
            "currentReplicas": 3,
            "desiredReplicas": 4,
            "lastScaleTime": "2024-05-01T12:00:30Z",
            "conditions": [{"type": "AbleToScale", "status": "True", "lastTransitionTime": null}]
        }))
        .unwrap();
        assert_eq!(status.last_scale_time, Timestamp::parse_rfc3339("2024-05-01T12:00:30Z"));
        assert_eq!(status.conditions[0].last_transition_time, None);
        let back = serde_json::to_value(&status).unwrap();
        assert_eq!(back["lastScaleTime"], "2024-05-01T12:00:30Z");
    }
}
