//! CRD mode: `datadoghq.com/v1alpha1` `WatermarkPodAutoscaler` objects, read unchanged, so that
//! people who run the Datadog controller today can switch to watermarkd with their objects as
//! they are (docs/crd.md).
//!
//! - `types`: the objects, as the Datadog CRD defines them (and `DatadogMetric`).
//! - `mapping`: a WPA -> the same `rules::Autoscaler` a rules file yields, through the same
//!   extraction and validation, with the WPA's field paths in every problem.
//! - `query`: the Datadog query the Cluster Agent would have built for an External metric.
//! - `annotation`: `watermarkd.io/queries`, a raw query and backend per metric.
//! - `status`: the status the Datadog controller would write, from an engine decision.
//! - `schema`: the CustomResourceDefinition `watermarkd crd` prints.

mod annotation;
mod mapping;
mod query;
mod schema;
mod status;
mod types;

pub use annotation::QUERIES_ANNOTATION;
pub use mapping::{map_wpa, wpa_id, MapError, MappedWpa, MappingOptions, Unsupported};
pub use query::{
    datadog_query, metric_reference, tag_scope, DatadogMetricIndex, DatadogMetricQueries, MetricReference,
    NoDatadogMetrics, DEFAULT_AGGREGATOR, DEFAULT_ROLLUP_SECONDS,
};
pub use schema::{crd_yaml, custom_resource_definition, CrdError};
pub use status::{
    next_status, rejected_status, set_condition, status_changed, ScaleWrite, ABLE_TO_SCALE, ABOVE_HIGH_WATERMARK,
    BELOW_LOW_WATERMARK, DRY_RUN, SCALING_ACTIVE, SCALING_LIMITED,
};
pub use types::{
    Condition, ContainerResourceMetricStatus, CrossVersionObjectReference, DatadogMetric, DatadogMetricSpec,
    ExternalMetricSource, ExternalMetricStatus, MetricSpec, MetricStatus, ObjectMetricStatus, PodsMetricStatus,
    Quantity, RecommenderSpec, RecommenderTlsConfig, ResourceMetricSource, ResourceMetricStatus,
    WatermarkPodAutoscaler, WatermarkPodAutoscalerSpec, WatermarkPodAutoscalerStatus, API_VERSION, GROUP, KIND, PLURAL,
    SHORT_NAME, VERSION,
};
