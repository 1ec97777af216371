//! A `WatermarkPodAutoscaler` -> the same `rules::Autoscaler` a rules file yields: the WPA is
//! read into the rules' typed draft of an autoscaler, every field named by its path in the
//! object (`spec.metrics[0].external.lowWatermark`), and `rules::compile` checks it exactly as it
//! checks a rules file's entry. What the rules file cannot express is decided here: the Datadog
//! controller's defaults where they differ from ours, the query the Cluster Agent would build,
//! `DatadogMetric` references, the `watermarkd.io/queries` annotation, Resource metrics (cpu
//! and memory from the metrics API), and what watermarkd does not support yet.

mod metrics;
mod recommender;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use watermarkd_engine::{Algorithm, ConvergeTowards, Decimal};

use super::query::{DatadogMetricQueries, DEFAULT_AGGREGATOR, DEFAULT_ROLLUP_SECONDS};
use super::recommender_policy::RecommenderPolicy;
use super::types::{Quantity, WatermarkPodAutoscaler, WatermarkPodAutoscalerSpec};
use crate::domain::rules::draft::{
    AutoscalerDraft, FallbackDraft, Field, ForecastDraft, Given, KnobsDraft, Origin, ScheduleDraft, TargetDraft,
};
use crate::domain::rules::reader::Table;
use crate::domain::rules::reader::{
    choose, nonempty, replica_count, seconds_at_most, whole_number_at_most, MAX_DURATION,
};
use crate::domain::rules::tree::{self, Kind};
use crate::domain::rules::{compile, parse_quantity, Autoscaler, Backend, Problem, Require, Sink, ALGORITHMS};
use crate::domain::rules::{parse_instant, read_fallback, read_forecast, read_schedule_list, TableScope};

/// The namespace of an object read from a file without one (`kubectl apply` would put it in
/// the context's namespace, `default` unless configured). Objects from the API always have one.
const DEFAULT_NAMESPACE: &str = "default";

/// How WPAs become autoscalers in this daemon.
#[derive(Clone, Debug)]
pub struct MappingOptions {
    /// The `[backend.NAME]` (a Datadog backend) External metrics are queried on unless the
    /// annotation names another: the account the Cluster Agent queried.
    pub default_backend: String,
    /// The Cluster Agent's `external_metrics.aggregator` (default `avg`).
    pub aggregator: String,
    /// The Cluster Agent's `external_metrics_provider.rollup` in seconds (default 30).
    pub rollup_seconds: u32,
    /// The declared backends, when known: every backend a WPA uses is checked against them.
    backends: Option<BTreeMap<String, Option<Backend>>>,
    /// The recommender URLs and TLS files a WPA may name (by default none).
    recommender_policy: RecommenderPolicy,
}

impl MappingOptions {
    pub fn new(default_backend: impl Into<String>) -> Self {
        MappingOptions {
            default_backend: default_backend.into(),
            aggregator: DEFAULT_AGGREGATOR.into(),
            rollup_seconds: DEFAULT_ROLLUP_SECONDS,
            backends: None,
            recommender_policy: RecommenderPolicy::default(),
        }
    }

    /// Lets WPAs use the recommenders and TLS files `policy` allows (the daemon's
    /// `recommender_allowed_urls` and `recommender_tls_dir`).
    pub fn with_recommender_policy(mut self, policy: RecommenderPolicy) -> Self {
        self.recommender_policy = policy;
        self
    }

    /// Checks every backend reference against these (the daemon's `[backend.NAME]` tables).
    pub fn with_backends(mut self, backends: &BTreeMap<String, Backend>) -> Self {
        self.backends = Some(backends.iter().map(|(name, b)| (name.clone(), Some(b.clone()))).collect());
        self
    }

    /// What is wrong with the options themselves, checked once when the daemon starts so that
    /// it is not reported again on every WPA.
    pub fn check(&self) -> Result<(), String> {
        if self.aggregator.is_empty() || !self.aggregator.chars().all(|c| c.is_ascii_lowercase()) {
            return Err(format!(
                "the aggregator ({:?}) must be a Datadog aggregator such as avg, max, min or sum",
                self.aggregator
            ));
        }
        if self.rollup_seconds == 0 {
            return Err("the rollup must be at least 1 second".into());
        }
        Ok(())
    }

    /// The default backend's configuration, when the backends are known and it is one of them.
    fn default_backend_type(&self) -> Option<&Backend> {
        self.backends.as_ref()?.get(&self.default_backend)?.as_ref()
    }

    /// Why the default backend cannot answer a query built from an External metric's name (the
    /// Cluster Agent's Datadog query), if it cannot. Only WPAs with such a metric need it: one
    /// whose every metric has a query in the `watermarkd.io/queries` annotation runs on any
    /// backend, so a Prometheus-only daemon may name its Prometheus backend here.
    pub fn default_backend_problem(&self) -> Option<String> {
        match self.backends.as_ref().map(|b| b.get(&self.default_backend)) {
            None => None,
            Some(Some(Some(backend))) if backend.answers_metric_name_queries() => None,
            Some(None) => Some(format!("the default backend {:?} names no [backend.{0}] table", self.default_backend)),
            Some(Some(_)) => Some(format!(
                "the default backend {:?} is not a datadog backend, and a query built from metricName is a Datadog \
                 query",
                self.default_backend
            )),
        }
    }
}

/// A WPA ready to run, and what of it has no effect in watermarkd (for a log line or event).
#[derive(Clone, Debug)]
pub struct MappedWpa {
    pub autoscaler: Autoscaler,
    pub notes: Vec<String>,
}

/// A part of a WPA that watermarkd does not support yet. A WPA with one is not run at all
/// (running it on its other metrics would scale on less than its author asked for); the daemon
/// says so in its status (`status::rejected_status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// `namespace/name` of the WPA.
    pub wpa: String,
    pub field: String,
    pub message: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WatermarkPodAutoscaler {}: {} {}", self.wpa, self.field, self.message)
    }
}

/// Why a WPA does not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapError {
    /// The spec is invalid: every problem, each naming the WPA (as the autoscaler
    /// `namespace/name`) and the field by its path in the object. Unsupported parts found on
    /// the way are listed too.
    Invalid { problems: Vec<Problem>, unsupported: Vec<Unsupported> },
    /// The spec is valid but uses something watermarkd does not support yet.
    Unsupported(Vec<Unsupported>),
    /// The WPA is valid, but another autoscaler already scales its target: the rules file's,
    /// or an older WPA. Two would fight over the replicas; this one waits until the other goes.
    TargetConflict {
        /// `namespace/name` of this WPA.
        wpa: String,
        /// The object both scale: `Deployment shop/web`.
        target: String,
        /// Who scales it: `WatermarkPodAutoscaler shop/web-a (the older one)`, or the rules
        /// file's autoscaler.
        holder: String,
    },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (problems, unsupported): (&[Problem], &[Unsupported]) = match self {
            MapError::Invalid { problems, unsupported } => (problems, unsupported),
            MapError::Unsupported(unsupported) => (&[], unsupported),
            MapError::TargetConflict { wpa, .. } => {
                return write!(
                    f,
                    "WatermarkPodAutoscaler {wpa}: not run: {}",
                    self.conflict_reason().unwrap_or_default()
                )
            }
        };
        let mut lines = problems
            .iter()
            .map(|p| {
                let wpa = p.autoscaler.as_deref().unwrap_or_default();
                let bare = Problem { autoscaler: None, ..p.clone() };
                format!("WatermarkPodAutoscaler {wpa}: {bare}")
            })
            .chain(unsupported.iter().map(ToString::to_string));
        if let Some(first) = lines.next() {
            f.write_str(&first)?;
        }
        for line in lines {
            write!(f, "\n{line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for MapError {}

impl MapError {
    /// Why a WPA in conflict does not run, without its own name (for its status).
    pub fn conflict_reason(&self) -> Option<String> {
        let MapError::TargetConflict { target, holder, .. } = self else { return None };
        Some(format!(
            "{target} is already scaled by {holder}; two autoscalers on one target would fight over its replicas. \
             This one runs once that one is gone (or delete this one, or mark it a shadow rule with the \
             {SHADOW_ANNOTATION}: \"true\" annotation)"
        ))
    }
}

/// `namespace/name`: how a WPA is named as an autoscaler, in problems, logs and metrics.
pub fn wpa_id(wpa: &WatermarkPodAutoscaler) -> String {
    let namespace = wpa.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
    format!("{namespace}/{}", wpa.metadata.name.as_deref().unwrap_or_default())
}

/// Maps a WPA to the autoscaler it describes, or says why it cannot run.
///
/// Every WPA metric becomes the rule's metric of the same index, so that the engine's
/// `metric[i]` is `spec.metrics[i]`.
pub fn map_wpa(
    wpa: &WatermarkPodAutoscaler,
    options: &MappingOptions,
    datadog_metrics: &dyn DatadogMetricQueries,
) -> Result<MappedWpa, MapError> {
    let id = wpa_id(wpa);
    let namespace = wpa.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
    let mut mapper = Mapper { id: id.clone(), sink: Sink::default(), unsupported: Vec::new() };
    let mut notes = Vec::new();
    if wpa.metadata.name.as_deref().is_none_or(str::is_empty) {
        mapper.problem("metadata.name", "is required");
    }
    let spec = &wpa.spec;
    // With a recommender the metrics are not read at all, as in the Datadog controller.
    let wpa_metrics = if spec.recommender.is_some() { &[][..] } else { &spec.metrics[..] };
    let annotations = wpa.metadata.annotations.as_ref();
    let pod_aggregation = mapper.resource_settings(spec, wpa_metrics, annotations, &mut notes);
    let shadow = mapper.flag(annotations, SHADOW_ANNOTATION);
    let observe = mapper.flag(annotations, OBSERVE_ANNOTATION);
    let take_over = mapper.flag(annotations, TAKE_OVER_ANNOTATION);
    let recommender = match &spec.recommender {
        Some(recommender) => {
            let (draft, said) = mapper.recommender(recommender, &options.recommender_policy);
            notes.extend(said);
            if !spec.metrics.is_empty() {
                notes.push(
                    "spec.metrics has no effect: with spec.recommender the replica count comes from the recommender, \
                     as in the Datadog controller"
                        .into(),
                );
            }
            Field { given: Given::Value(draft), origin: Origin::new("spec.recommender", None) }
        }
        None => Field::absent(Origin::new("spec.recommender", None)),
    };
    let metrics = mapper.metrics(wpa, wpa_metrics, options, datadog_metrics, pod_aggregation);
    let draft = AutoscalerDraft {
        label: Some(id.clone()),
        origin: Origin::new("spec", None),
        name: Field { given: Given::Value(id.clone()), origin: Origin::new("metadata.name", None) },
        target: mapper.target(spec, namespace),
        // A WPA is evaluated at the daemon's default interval, as the Datadog controller's
        // sync period.
        interval: Field::absent(Origin::new("spec", None)),
        shadow,
        observe,
        take_over,
        knobs: mapper.knobs(spec),
        behavior: Field::absent(Origin::new("spec", None)),
        metrics: match spec.recommender {
            None => Field { given: Given::Value(metrics), origin: Origin::new("spec.metrics", None) },
            Some(_) => Field::absent(Origin::new("spec.metrics", None)),
        },
        recommender,
        schedules: mapper.schedules(annotations),
        paused_until: mapper.paused_until(annotations),
        fallback: mapper.fallback(annotations),
        forecast: mapper.forecast(annotations),
    };
    let Mapper { mut sink, unsupported, .. } = mapper;
    let compiled = compile(&draft, Require::Everything { backends: options.backends.as_ref() }, &mut sink);
    let mut problems = sink.problems;
    problems.sort_by(|a, b| a.field.cmp(&b.field));
    match compiled.into_autoscaler(&draft) {
        _ if !problems.is_empty() => Err(MapError::Invalid { problems, unsupported }),
        _ if !unsupported.is_empty() => Err(MapError::Unsupported(unsupported)),
        Some(autoscaler) => Ok(MappedWpa { autoscaler, notes }),
        // Not reachable: compiling says why it yields no autoscaler.
        None => Err(MapError::Invalid {
            problems: vec![Problem {
                line: None,
                autoscaler: Some(id),
                field: String::new(),
                message: "is invalid".into(),
            }],
            unsupported,
        }),
    }
}

impl Mapper {
    /// What the Resource metrics take from the rest of the object: the pod aggregation of the
    /// annotation, which only they use, as `spec.readinessDelaySeconds` (a note says so when no
    /// metric can use it).
    fn resource_settings(
        &mut self,
        spec: &WatermarkPodAutoscalerSpec,
        metrics: &[super::types::MetricSpec],
        annotations: Option<&BTreeMap<String, String>>,
        notes: &mut Vec<String>,
    ) -> Option<String> {
        let has_resource_metric = metrics.iter().any(|m| m.type_ == "Resource");
        if let Some(delay) = spec.readiness_delay_seconds.filter(|_| !has_resource_metric) {
            // For External metrics the Datadog controller lists the target's pods and counts a
            // Pending pod as ready for this long after its readiness last changed. watermarkd
            // takes the ready count from the workload's status (its scale subresource), so there
            // the field has no effect; Resource metrics use it (which cpu samples count).
            notes.push(format!(
                "spec.readinessDelaySeconds ({delay}) has no effect without a Resource metric: watermarkd counts the \
                 ready replicas the workload reports instead of listing its pods"
            ));
        }
        let pod_aggregation = annotations.and_then(|a| a.get(POD_AGGREGATION_ANNOTATION)).cloned();
        if pod_aggregation.is_some() && !has_resource_metric {
            let why = if spec.recommender.is_some() {
                "applies to Resource metrics, and with spec.recommender this WPA's metrics are not read"
            } else {
                "applies to Resource metrics, and this WPA has none"
            };
            self.problem(&annotation_key_path(POD_AGGREGATION_ANNOTATION), why);
        }
        pod_aggregation
    }
}

/// The annotation that chooses how a WPA's Resource metrics combine their pods: `sum` (the
/// Datadog controller's way, the default) or `average` (per pod, as the HPA's `AverageValue`).
pub const POD_AGGREGATION_ANNOTATION: &str = "watermarkd.io/pod-aggregation";

/// The annotation that gives a WPA a schedule: a JSON list of windows with the keys of a rules
/// file's `[[autoscaler.schedule]]`.
pub const SCHEDULES_ANNOTATION: &str = "watermarkd.io/schedules";

impl Mapper {
    /// The `watermarkd.io/schedules` annotation, read as a rules file's windows are.
    fn schedules(&mut self, annotations: Option<&BTreeMap<String, String>>) -> Field<Vec<Field<ScheduleDraft>>> {
        let path = annotation_key_path(SCHEDULES_ANNOTATION);
        let Some(text) = annotations.and_then(|a| a.get(SCHEDULES_ANNOTATION)) else {
            return Field::absent(Origin::new(path, None));
        };
        let list = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(list @ serde_json::Value::Array(_)) => tree::from_json(&list),
            Ok(_) => {
                self.problem(&path, "must be a JSON list of windows, such as [{\"days\": [\"weekdays\"], \"start\": \"08:00\", \"end\": \"18:00\", \"min_replicas\": 10}]");
                return Field { given: Given::Unreadable, origin: Origin::new(path, None) };
            }
            Err(err) => {
                self.problem(&path, format!("is not valid JSON: {err}"));
                return Field { given: Given::Unreadable, origin: Origin::new(path, None) };
            }
        };
        let Kind::Array(nodes) = &list.kind else { return Field::absent(Origin::new(path, None)) };
        let parent =
            TableScope { autoscaler: Some(self.id.clone()), label: "metadata.annotations".into(), separator: "" };
        let key = format!("[{SCHEDULES_ANNOTATION:?}]");
        let windows = read_schedule_list(nodes, &parent, &key, &mut self.sink);
        Field { given: Given::Value(windows), origin: Origin::new(path, None) }
    }
}

/// The annotation that pauses a WPA until an instant: it decides and reports, writes nothing,
/// and resumes by itself then.
pub const PAUSED_UNTIL_ANNOTATION: &str = "watermarkd.io/paused-until";

impl Mapper {
    /// The `watermarkd.io/paused-until` annotation.
    fn paused_until(&mut self, annotations: Option<&BTreeMap<String, String>>) -> Field<watermarkd_engine::Timestamp> {
        let value = annotations.and_then(|a| a.get(PAUSED_UNTIL_ANNOTATION));
        self.field(annotation_key_path(PAUSED_UNTIL_ANNOTATION), value, |text| parse_instant(text))
    }
}

/// The annotation that declares a WPA's fallback: a JSON object with the keys of a rules file's
/// `[autoscaler.fallback]`.
pub const FALLBACK_ANNOTATION: &str = "watermarkd.io/fallback";

/// The annotation that gives a WPA a forecast: a JSON object with the keys of a rules file's
/// `[autoscaler.forecast]`.
pub const FORECAST_ANNOTATION: &str = "watermarkd.io/forecast";

impl Mapper {
    /// The `watermarkd.io/fallback` annotation, read as a rules file's table is.
    fn fallback(&mut self, annotations: Option<&BTreeMap<String, String>>) -> Field<FallbackDraft> {
        let example = "{\"after\": \"5m\", \"action\": \"replicas\", \"replicas\": 10}";
        self.object_annotation(annotations, FALLBACK_ANNOTATION, example, read_fallback)
    }

    /// The `watermarkd.io/forecast` annotation, read as a rules file's table is.
    fn forecast(&mut self, annotations: Option<&BTreeMap<String, String>>) -> Field<ForecastDraft> {
        let example = "{\"lead_time\": \"10m\", \"mode\": \"scale\"}";
        self.object_annotation(annotations, FORECAST_ANNOTATION, example, read_forecast)
    }

    /// An annotation holding one JSON object, read by `read` as a table of a rules file is,
    /// each problem named by its path in the annotation.
    fn object_annotation<T>(
        &mut self,
        annotations: Option<&BTreeMap<String, String>>,
        key: &str,
        example: &str,
        read: fn(&mut Table<'_>, &mut Sink) -> T,
    ) -> Field<T> {
        let path = annotation_key_path(key);
        let Some(text) = annotations.and_then(|a| a.get(key)) else { return Field::absent(Origin::new(path, None)) };
        let unreadable = |mapper: &mut Mapper, message: String| {
            mapper.problem(&path, message);
            Field { given: Given::Unreadable, origin: Origin::new(path.clone(), None) }
        };
        let object = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(object @ serde_json::Value::Object(_)) => tree::from_json(&object),
            Ok(_) => return unreadable(self, format!("must be a JSON object such as {example}")),
            Err(err) => return unreadable(self, format!("is not valid JSON: {err}")),
        };
        let scope = TableScope { autoscaler: Some(self.id.clone()), label: path.clone(), separator: "." };
        let Some(mut table) = Table::new(&object, scope, &mut self.sink) else {
            return Field { given: Given::Unreadable, origin: Origin::new(path, None) };
        };
        let draft = read(&mut table, &mut self.sink);
        Field { given: Given::Value(draft), origin: Origin::new(path, None) }
    }
}

/// The annotation that makes a WPA a shadow rule: `"true"`, and it is evaluated beside the
/// active WPA on the same target in its namespace, and never writes the scale or its status.
pub const SHADOW_ANNOTATION: &str = "watermarkd.io/shadow";
/// The annotation that makes a WPA observe only: `"true"`, and it is evaluated and reported
/// every interval and never writes the scale (the rules file's `observe = true`).
pub const OBSERVE_ANNOTATION: &str = "watermarkd.io/observe";
/// The annotation that lets a WPA write although another controller claims its target:
/// `"true"` (the rules file's `take_over = true`; docs/cutover.md).
pub const TAKE_OVER_ANNOTATION: &str = "watermarkd.io/take-over";

/// `metadata.annotations["KEY"]`, as problems name an annotation.
fn annotation_key_path(key: &str) -> String {
    format!("metadata.annotations[{key:?}]")
}

/// Builds the draft of one WPA, saying as it goes what it cannot read.
struct Mapper {
    id: String,
    sink: Sink,
    unsupported: Vec<Unsupported>,
}

impl Mapper {
    fn problem(&mut self, field: &str, message: impl Into<String>) {
        self.sink.problems.push(Problem {
            line: None,
            autoscaler: Some(self.id.clone()),
            field: field.to_string(),
            message: message.into(),
        });
    }

    fn unsupported(&mut self, field: &str, message: impl Into<String>) {
        self.unsupported.push(Unsupported { wpa: self.id.clone(), field: field.to_string(), message: message.into() });
    }

    /// `value` at `path` as a draft's field: read by `read`, which says why it cannot be.
    fn field<V, T>(
        &mut self,
        path: impl Into<Cow<'static, str>>,
        value: Option<V>,
        read: impl FnOnce(V) -> Result<T, String>,
    ) -> Field<T> {
        let origin = Origin::new(path, None);
        let Some(value) = value else { return Field::absent(origin) };
        match read(value) {
            Ok(value) => Field { given: Given::Value(value), origin },
            Err(message) => {
                self.problem(&origin.field(), message);
                Field { given: Given::Unreadable, origin }
            }
        }
    }

    /// A value at `path` that needs no reading.
    fn given<T>(path: impl Into<Cow<'static, str>>, value: Option<T>) -> Field<T> {
        let origin = Origin::new(path, None);
        match value {
            Some(value) => Field { given: Given::Value(value), origin },
            None => Field::absent(origin),
        }
    }

    fn text(&mut self, path: impl Into<Cow<'static, str>>, value: Option<&String>) -> Field<String> {
        self.field(path, value.cloned(), |text| nonempty(text).map_err(str::to_string))
    }

    fn replicas(&mut self, path: &'static str, value: Option<i64>) -> Field<u32> {
        self.field(path, value, |count| replica_count(i128::from(count)))
    }

    fn seconds(&mut self, path: &'static str, value: Option<i64>) -> Field<Duration> {
        self.field(path, value, |seconds| seconds_at_most(i128::from(seconds), MAX_DURATION))
    }

    fn quantity(&mut self, path: impl Into<Cow<'static, str>>, value: Option<&Quantity>) -> Field<Decimal> {
        self.field(path, value, quantity_value)
    }

    /// `scaleTargetRef` in the WPA's namespace; the Datadog CRD requires it, and so does
    /// compiling.
    fn target(&mut self, spec: &WatermarkPodAutoscalerSpec, namespace: &str) -> Field<TargetDraft> {
        let origin = Origin::new("spec.scaleTargetRef", None);
        let Some(reference) = &spec.scale_target_ref else { return Field::absent(origin) };
        // An empty apiVersion is Go's zero value for an omitted one; we default it to apps/v1
        // as the rules file does (the Datadog controller cannot resolve an empty one).
        let api_version = reference.api_version.as_ref().filter(|v| !v.is_empty());
        let target = TargetDraft {
            api_version: self.text("spec.scaleTargetRef.apiVersion", api_version),
            kind: self.text("spec.scaleTargetRef.kind", reference.kind.as_ref()),
            namespace: Self::given("metadata.namespace", Some(namespace.to_string())),
            name: self.text("spec.scaleTargetRef.name", reference.name.as_ref()),
        };
        Field { given: Given::Value(target), origin }
    }

    /// A `"true"`/`"false"` annotation: `watermarkd.io/shadow`, `observe` or `take-over`.
    fn flag(&mut self, annotations: Option<&BTreeMap<String, String>>, key: &str) -> Field<bool> {
        let path = annotation_key_path(key);
        let value = match annotations.and_then(|a| a.get(key)).map(String::as_str) {
            None | Some("false") => None,
            Some("true") => Some(true),
            Some(other) => {
                self.problem(&path, format!("must be \"true\" or \"false\", not {other:?}"));
                None
            }
        };
        Self::given(path, value)
    }

    /// The rule's scalar knobs. Absent fields stay absent so that the engine's defaults apply:
    /// they equal the Datadog controller's (`DefaultWatermarkPodAutoscaler`: minReplicas 1,
    /// modulo 1, algorithm absolute, tolerance 0.1, limit factors 50/20, forbidden windows
    /// 60s/300s; its 15s sync period is our default interval) except where noted.
    fn knobs(&mut self, spec: &WatermarkPodAutoscalerSpec) -> KnobsDraft {
        // What a WPA has no field for stays absent, named where a WPA would say it.
        let mut knobs = KnobsDraft::absent(|key| Origin::new(format!("spec.{key}"), None));
        if spec.min_replicas == Some(0) {
            // Scale to zero needs an activation per metric, which a WPA has no field for; the
            // Datadog CRD's minimum is 1, and a WPA keeps that meaning.
            self.problem(
                "spec.minReplicas",
                "(0) must be at least 1: a WatermarkPodAutoscaler does not scale to zero (a rules-file autoscaler \
                 can, with min_replicas = 0 and an activation per metric)",
            );
        }
        knobs.min_replicas = self.replicas("spec.minReplicas", spec.min_replicas.filter(|&min| min != 0));
        knobs.max_replicas = self.replicas("spec.maxReplicas", spec.max_replicas);
        // The Datadog controller defaults an empty algorithm (Go's zero value) to absolute.
        let algorithm = spec.algorithm.as_ref().filter(|a| !a.is_empty());
        knobs.algorithm = self.field("spec.algorithm", algorithm, |a| choose(a, Algorithm::parse, ALGORITHMS));
        // The Datadog controller treats a tolerance of 0 as unset and uses 10%, where the rules
        // file allows 0; a WPA keeps the behaviour it had.
        let tolerance = spec.tolerance.as_ref().filter(|t| !t.to_decimal().is_ok_and(|d| d.is_zero()));
        knobs.tolerance = self.quantity("spec.tolerance", tolerance);
        knobs.scale_up_limit_factor = self.quantity("spec.scaleUpLimitFactor", spec.scale_up_limit_factor.as_ref());
        knobs.scale_down_limit_factor =
            self.quantity("spec.scaleDownLimitFactor", spec.scale_down_limit_factor.as_ref());
        // 0 is Go's zero value for an omitted window, which the Datadog controller defaults.
        let window = |seconds: Option<i64>| seconds.filter(|&s| s != 0);
        knobs.upscale_forbidden_window =
            self.seconds("spec.upscaleForbiddenWindowSeconds", window(spec.upscale_forbidden_window_seconds));
        knobs.downscale_forbidden_window =
            self.seconds("spec.downscaleForbiddenWindowSeconds", window(spec.downscale_forbidden_window_seconds));
        knobs.upscale_delay_above_watermark =
            self.seconds("spec.upscaleDelayAboveWatermarkSeconds", spec.upscale_delay_above_watermark_seconds);
        knobs.downscale_delay_below_watermark =
            self.seconds("spec.downscaleDelayBelowWatermarkSeconds", spec.downscale_delay_below_watermark_seconds);
        knobs.replica_modulo = self.replicas("spec.replicaScalingAbsoluteModulo", spec.replica_scaling_absolute_modulo);
        knobs.tolerate_zero = Self::given("spec.tolerateZero", spec.tolerate_zero);
        knobs.min_available_replica_percentage =
            self.field("spec.minAvailableReplicaPercentage", spec.min_available_replica_percentage, |percent| {
                whole_number_at_most(i128::from(percent), u32::MAX, "")
            });
        knobs.dry_run = Self::given("spec.dryRun", spec.dry_run);
        // The Datadog controller silently disables convergence on an unknown value; like an
        // unknown algorithm, we report it instead.
        let converge = spec.converge_towards_watermark.as_deref().filter(|c| !c.is_empty());
        knobs.converge_towards_watermark = self.field("spec.convergeTowardsWatermark", converge, |c| match c {
            "highwatermark" => Ok(ConvergeTowards::High),
            "lowwatermark" => Ok(ConvergeTowards::Low),
            other => Err(format!("({other:?}) must be \"highwatermark\" or \"lowwatermark\"")),
        });
        knobs
    }
}

/// A quantity's exact value, refused in the words a rules file's number is.
fn quantity_value(quantity: &Quantity) -> Result<Decimal, String> {
    match quantity {
        Quantity::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Ok(Decimal::from_parts(i128::from(i), 0)),
            (None, Some(u)) => Ok(Decimal::from_parts(i128::from(u), 0)),
            (None, None) => {
                let f = n.as_f64().unwrap_or(f64::NAN);
                Decimal::from_f64(f).ok_or_else(|| format!("({f}) must be a finite number"))
            }
        },
        Quantity::String(s) => parse_quantity(s).map_err(|e| format!("must be a number or a quantity: {e}")),
    }
}

#[cfg(test)]
mod tests;
