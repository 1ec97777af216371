//! CRD mode: `datadoghq.com/v1alpha1` `WatermarkPodAutoscaler` objects, read unchanged, so that
//! people who run the Datadog controller today can switch to watermarkd with their objects as
//! they are (docs/crd.md).
//!
//! - `types`: the objects, as the Datadog CRD defines them (and `DatadogMetric`).
//! - `mapping`: a WPA -> the same `rules::Autoscaler` a rules file yields, through the same
//!   extraction and validation, with the WPA's field paths in every problem.
//! - `query`: the Datadog query the Cluster Agent would have built for an External metric.
//! - `annotation`: `watermarkd.io/queries`, a raw query and backend per metric.
//! - `recommender_policy`: which recommender URLs and TLS files a WPA may name.
//! - `status`: the status the Datadog controller would write, from an engine decision.
//! - `schema`: the CustomResourceDefinition `watermarkd crd` prints.

mod annotation;
mod mapping;
pub(crate) mod query;
mod recommender_policy;
mod schema;
mod status;
mod types;

pub use annotation::QUERIES_ANNOTATION;
pub use mapping::{
    map_wpa, MapError, MappingOptions, Unsupported, OBSERVE_ANNOTATION, SHADOW_ANNOTATION, TAKE_OVER_ANNOTATION,
};
pub(crate) use query::DatadogMetricIndex;
pub use query::NoDatadogMetrics;
pub use recommender_policy::{check_tls_dir, AllowedUrl, RecommenderPolicy, ALLOWED_URLS_SETTING, TLS_DIR_SETTING};
pub use schema::{crd_yaml, custom_resource_definition};
pub use status::{conditions, next_status, status_changed, with_ahead, with_claims, TARGET_CLAIMED};
pub(crate) use status::{
    rejected_status, set_condition, ABLE_TO_SCALE, ABOVE_HIGH_WATERMARK, BELOW_LOW_WATERMARK, TARGET_CONFLICT,
};
pub(crate) use types::{DatadogMetric, WatermarkPodAutoscalerStatus, API_VERSION, KIND};
pub use types::{Quantity, WatermarkPodAutoscaler, WatermarkPodAutoscalerSpec};
