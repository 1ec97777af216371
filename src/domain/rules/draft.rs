//! An autoscaler as a source wrote it, before it is checked: the one shape both readers
//! produce. The rules file's reader (`document`) and the WPA mapper (`crate::domain::crd`) each turn
//! their input into an [`AutoscalerDraft`]; `compile` checks the draft and builds the running
//! [`super::Autoscaler`]. Every field carries its [`Origin`], a line of the rules file or a path
//! in the WPA object, so that `compile` names each problem where its source wrote it, in the
//! source's own words, without knowing which source that was.
//!
//! A draft's values are typed (a count, a duration, an exact number): each reader has already
//! reported a value it could not read as that type, and marks it [`Given::Unreadable`] so that
//! nothing is said about it twice.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use watermarkd_engine::{Algorithm, ConvergeTowards, Decimal, PolicyKind, SelectPolicy, Timestamp};

use super::{PodAggregation, Reducer, ResourceName};
use crate::domain::schedule::{Cron, Zone};
use jiff::civil::Time;

/// Where a value was written, as problems name it.
///
/// Every field of every draft has one, so it is cheap: a rules file's field is its table's
/// shared prefix (`metric "latency": `) and its key, a literal; the whole name is only
/// written out when a problem names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    /// What precedes the key, shared by the fields of one table; `None` when `key` is the
    /// whole name.
    prefix: Option<Arc<str>>,
    key: Cow<'static, str>,
    /// 1-based line in the rules file: the key's, or its table's when the key is absent.
    pub line: Option<usize>,
}

impl Origin {
    /// The field named `field` as a whole: `max_replicas`, `spec.metrics[0].external.lowWatermark`.
    pub fn new(field: impl Into<Cow<'static, str>>, line: Option<usize>) -> Self {
        Origin { prefix: None, key: field.into(), line }
    }

    /// The field `key` of a table whose fields are named `{prefix}{key}`.
    pub fn within(prefix: Option<Arc<str>>, key: &'static str, line: Option<usize>) -> Self {
        Origin { prefix, key: Cow::Borrowed(key), line }
    }

    /// The field as its source spells it: `max_replicas`, `metric "latency": low_watermark`,
    /// `spec.metrics[0].external.lowWatermark`. For an absent field, where it would be written.
    pub fn field(&self) -> Cow<'_, str> {
        match &self.prefix {
            Some(prefix) => Cow::Owned(format!("{prefix}{}", self.key)),
            None => Cow::Borrowed(&self.key),
        }
    }

    /// The field's own key, as a message naming it beside another spells it (`max_replicas`,
    /// `maxReplicas`).
    pub fn key(&self) -> &str {
        match &self.prefix {
            Some(_) => &self.key,
            None => self.key.rsplit(['.', ' ']).next().unwrap_or(&self.key),
        }
    }
}

/// What a source said of one field.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum Given<T> {
    /// Not written: a default applies, or `compile` reports it missing.
    #[default]
    Absent,
    /// Written, but not readable as its type: the reader has said why.
    Unreadable,
    Value(T),
}

/// One field of a draft: its value and where it was (or would be) written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Field<T> {
    pub given: Given<T>,
    pub origin: Origin,
}

impl<T> Field<T> {
    pub fn absent(origin: Origin) -> Self {
        Field { given: Given::Absent, origin }
    }

    pub fn value(&self) -> Option<&T> {
        match &self.given {
            Given::Value(value) => Some(value),
            Given::Absent | Given::Unreadable => None,
        }
    }

    /// Written at all, readable or not.
    pub fn is_written(&self) -> bool {
        !matches!(self.given, Given::Absent)
    }

    pub fn is_unreadable(&self) -> bool {
        matches!(self.given, Given::Unreadable)
    }

    /// The value, or `None` when it is absent or unreadable: what the engine is given.
    pub fn cloned(&self) -> Option<T>
    where
        T: Clone,
    {
        self.value().cloned()
    }
}

/// One autoscaler, as written.
#[derive(Clone, Debug)]
pub(crate) struct AutoscalerDraft {
    /// How problems name the autoscaler: its name (a WPA's `namespace/name`), or `None` when it
    /// has no readable name and its fields' origins say which entry it is.
    pub label: Option<String>,
    /// The entry itself.
    pub origin: Origin,
    pub name: Field<String>,
    pub target: Field<TargetDraft>,
    pub interval: Field<Duration>,
    pub shadow: Field<bool>,
    /// Evaluates and reports every interval and never writes (`observe = true`).
    pub observe: Field<bool>,
    /// Writes even though another controller claims the target: the cut-over
    /// (`take_over = true`).
    pub take_over: Field<bool>,
    pub knobs: KnobsDraft,
    pub behavior: Field<BehaviorDraft>,
    /// Metric `i` here is the engine's `metric[i]`.
    pub metrics: Field<Vec<Field<MetricDraft>>>,
    pub recommender: Field<RecommenderDraft>,
    /// Windows that raise the floor; window `i` is named `schedule[i]` unless it has a name.
    pub schedules: Field<Vec<Field<ScheduleDraft>>>,
    /// Until when the autoscaler decides and reports without writing.
    pub paused_until: Field<Timestamp>,
    pub fallback: Field<FallbackDraft>,
    pub forecast: Field<ForecastDraft>,
}

/// A forecast of the autoscaler's own metric, as a floor ahead of demand.
#[derive(Clone, Debug)]
pub(crate) struct ForecastDraft {
    pub lead_time: Field<Duration>,
    /// `observe` or `scale`.
    pub mode: Field<String>,
    pub max_error: Field<Decimal>,
    pub max_factor: Field<Decimal>,
}

/// What to do once no metric has had a usable value for a while.
#[derive(Clone, Debug)]
pub(crate) struct FallbackDraft {
    pub after: Field<Duration>,
    pub recover_after: Field<Duration>,
    /// `hold`, `replicas` or `last_good`.
    pub action: Field<String>,
    pub replicas: Field<u32>,
    pub scale_down: Field<bool>,
}

/// One window of a schedule: weekly (`days`, `start`, `end`) or `cron` with a `duration`.
#[derive(Clone, Debug)]
pub(crate) struct ScheduleDraft {
    /// The window's table, by position.
    pub origin: Origin,
    pub name: Field<String>,
    pub time_zone: Field<Zone>,
    pub days: Field<[bool; 7]>,
    pub start: Field<Time>,
    pub end: Field<Time>,
    pub cron: Field<Cron>,
    pub duration: Field<Duration>,
    pub min_replicas: Field<u32>,
    pub max_replicas: Field<u32>,
    pub ramp_in: Field<Duration>,
    pub ramp_out: Field<Duration>,
}

/// What the autoscaler scales.
#[derive(Clone, Debug)]
pub(crate) struct TargetDraft {
    pub api_version: Field<String>,
    pub kind: Field<String>,
    pub namespace: Field<String>,
    pub name: Field<String>,
}

/// The rule's scalar settings, each the engine's field of the same name.
#[derive(Clone, Debug)]
pub(crate) struct KnobsDraft {
    pub min_replicas: Field<u32>,
    pub max_replicas: Field<u32>,
    pub algorithm: Field<Algorithm>,
    pub tolerance: Field<Decimal>,
    pub upscale_tolerance: Field<Decimal>,
    pub downscale_tolerance: Field<Decimal>,
    pub scale_up_limit_factor: Field<Decimal>,
    pub scale_down_limit_factor: Field<Decimal>,
    pub upscale_forbidden_window: Field<Duration>,
    pub downscale_forbidden_window: Field<Duration>,
    pub upscale_delay_above_watermark: Field<Duration>,
    pub downscale_delay_below_watermark: Field<Duration>,
    pub replica_modulo: Field<u32>,
    pub converge_towards_watermark: Field<ConvergeTowards>,
    pub tolerate_zero: Field<bool>,
    pub min_available_replica_percentage: Field<u32>,
    pub dry_run: Field<bool>,
    pub scale_to_zero_delay: Field<Duration>,
}

impl KnobsDraft {
    /// Every knob absent, each named by `origin(engine key)`.
    pub fn absent(origin: impl Fn(&'static str) -> Origin) -> Self {
        let origin = &origin;
        fn field<T>(origin: &dyn Fn(&'static str) -> Origin, key: &'static str) -> Field<T> {
            Field::absent(origin(key))
        }
        KnobsDraft {
            min_replicas: field(origin, "min_replicas"),
            max_replicas: field(origin, "max_replicas"),
            algorithm: field(origin, "algorithm"),
            tolerance: field(origin, "tolerance"),
            upscale_tolerance: field(origin, "upscale_tolerance"),
            downscale_tolerance: field(origin, "downscale_tolerance"),
            scale_up_limit_factor: field(origin, "scale_up_limit_factor"),
            scale_down_limit_factor: field(origin, "scale_down_limit_factor"),
            upscale_forbidden_window: field(origin, "upscale_forbidden_window"),
            downscale_forbidden_window: field(origin, "downscale_forbidden_window"),
            upscale_delay_above_watermark: field(origin, "upscale_delay_above_watermark"),
            downscale_delay_below_watermark: field(origin, "downscale_delay_below_watermark"),
            replica_modulo: field(origin, "replica_modulo"),
            converge_towards_watermark: field(origin, "converge_towards_watermark"),
            tolerate_zero: field(origin, "tolerate_zero"),
            min_available_replica_percentage: field(origin, "min_available_replica_percentage"),
            dry_run: field(origin, "dry_run"),
            scale_to_zero_delay: field(origin, "scale_to_zero_delay"),
        }
    }

    /// The knob the engine names `key`, to place the engine's problems.
    pub fn origin_of(&self, key: &str) -> Option<(&Origin, bool)> {
        fn at<T>(field: &Field<T>) -> Option<(&Origin, bool)> {
            Some((&field.origin, field.is_unreadable()))
        }
        match key {
            "min_replicas" => at(&self.min_replicas),
            "max_replicas" => at(&self.max_replicas),
            "algorithm" => at(&self.algorithm),
            "tolerance" => at(&self.tolerance),
            "upscale_tolerance" => at(&self.upscale_tolerance),
            "downscale_tolerance" => at(&self.downscale_tolerance),
            "scale_up_limit_factor" => at(&self.scale_up_limit_factor),
            "scale_down_limit_factor" => at(&self.scale_down_limit_factor),
            "upscale_forbidden_window" => at(&self.upscale_forbidden_window),
            "downscale_forbidden_window" => at(&self.downscale_forbidden_window),
            "upscale_delay_above_watermark" => at(&self.upscale_delay_above_watermark),
            "downscale_delay_below_watermark" => at(&self.downscale_delay_below_watermark),
            "replica_modulo" => at(&self.replica_modulo),
            "converge_towards_watermark" => at(&self.converge_towards_watermark),
            "tolerate_zero" => at(&self.tolerate_zero),
            "min_available_replica_percentage" => at(&self.min_available_replica_percentage),
            "dry_run" => at(&self.dry_run),
            "scale_to_zero_delay" => at(&self.scale_to_zero_delay),
            _ => None,
        }
    }
}

/// The HPA's `behavior`.
#[derive(Clone, Debug)]
pub(crate) struct BehaviorDraft {
    pub scale_up: Field<ScalingRulesDraft>,
    pub scale_down: Field<ScalingRulesDraft>,
}

#[derive(Clone, Debug)]
pub(crate) struct ScalingRulesDraft {
    pub tolerance: Field<Decimal>,
    pub stabilization_window: Field<Duration>,
    pub select_policy: Field<SelectPolicy>,
    pub policies: Field<Vec<Field<PolicyDraft>>>,
}

#[derive(Clone, Debug)]
pub(crate) struct PolicyDraft {
    pub kind: Field<PolicyKind>,
    pub value: Field<u32>,
    pub period: Field<Duration>,
}

/// One metric: a query on a backend, or a resource of the target's pods.
#[derive(Clone, Debug)]
pub(crate) struct MetricDraft {
    /// The metric's table, by position (`metric[1]`, `spec.metrics[1]`).
    pub origin: Origin,
    /// For a metric without a name of its own, where the name it takes (its query or
    /// resource) was written.
    pub name: Field<String>,
    pub query: Field<String>,
    pub backend: Field<String>,
    pub reducer: Field<Reducer>,
    pub resource: Field<ResourceName>,
    /// A label selector in the API server's text form, checked.
    pub selector: Field<String>,
    pub pod_aggregation: Field<PodAggregation>,
    pub readiness_delay: Field<Duration>,
    pub max_age: Field<Duration>,
    pub low_watermark: Field<Decimal>,
    pub high_watermark: Field<Decimal>,
    pub activation: Field<Decimal>,
}

/// A replica recommender that replaces the metrics.
#[derive(Clone, Debug)]
pub(crate) struct RecommenderDraft {
    /// The recommender's table: the rule's one metric stands for it.
    pub origin: Origin,
    pub url: Field<String>,
    pub target_type: Field<String>,
    pub settings: Field<BTreeMap<String, String>>,
    pub low_watermark: Field<Decimal>,
    pub high_watermark: Field<Decimal>,
    pub timeout: Field<Duration>,
    pub cluster_name: Field<String>,
    pub ca_file: Field<PathBuf>,
    pub client_cert_file: Field<PathBuf>,
    pub client_key_file: Field<PathBuf>,
    pub insecure_skip_verify: Field<bool>,
    pub server_name: Field<String>,
    /// Where every TLS file must resolve inside, when someone other than the operator named
    /// them (a WPA's files must lie in the daemon's `recommender_tls_dir`).
    pub tls_dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_names_its_own_key_in_its_source_words() {
        assert_eq!(Origin::new("max_replicas", Some(3)).key(), "max_replicas");
        assert_eq!(Origin::new("metric \"a.b\": high_watermark", None).key(), "high_watermark");
        assert_eq!(Origin::new("spec.metrics[0].external.highWatermark", None).key(), "highWatermark");
        assert_eq!(Origin::new("autoscaler[2].max_replicas", None).key(), "max_replicas");
        let within = Origin::within(Some(Arc::from("metric \"a.b\": ")), "low_watermark", Some(4));
        assert_eq!(
            (within.field(), within.key()),
            (Cow::Owned("metric \"a.b\": low_watermark".into()), "low_watermark")
        );
    }
}
