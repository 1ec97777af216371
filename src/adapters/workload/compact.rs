//! What the stores keep of each object, and how it is read off the wire.
//!
//! A store holds every object of its kind in its namespace, not only the referenced ones, so
//! the size of one stored object is multiplied by every Deployment of every watched namespace.
//! Watch events are therefore decoded into [`WireWorkload`], which skips everything but a few
//! fields while parsing (no `managedFields`, no pod template ever becomes a value), and reduced
//! to [`StoredWorkload`] before the store sees them. Both are plain structs: no `ObjectMeta`
//! (about 400 bytes even when empty) in the store.
//!
//! Custom resources may hold anything at the paths read here (`spec.replicas` a string,
//! `status` a list), so every field is read leniently: a value of the wrong shape reads as
//! absent rather than making the whole object undecodable, as a `serde_json::Value` lookup
//! would have.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, ObjectMeta};
use kube::runtime::reflector::Lookup;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use watermarkd_engine::Timestamp;

use super::object::{format_label_selector, format_match_labels, KindPaths, SelectorShape};
use crate::domain::state::Marks;

/// A workload object as the watcher decodes it. Only lives between the wire and the store.
/// `meta` holds name, namespace and resourceVersion only: the watcher resumes from the latter.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "RawWorkload")]
pub(crate) struct WireWorkload {
    meta: ObjectMeta,
    marks: Marks,
    spec_replicas: Option<u32>,
    status_replicas: Option<u32>,
    ready_replicas: Option<u32>,
    /// `spec.selector` as sent: its shape depends on the kind, known only to the store.
    selector: Option<serde_json::Value>,
}

impl kube::Resource for WireWorkload {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.kind)
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.group)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.version)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.api_version)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&dt.plural)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawWorkload {
    metadata: RawMeta,
    #[serde(deserialize_with = "object_or_default")]
    spec: RawSpec,
    #[serde(deserialize_with = "object_or_default")]
    status: RawStatus,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    #[serde(deserialize_with = "state_annotation")]
    annotations: Option<String>,
    #[serde(deserialize_with = "scaled_at")]
    managed_fields: Option<Timestamp>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct RawSpec {
    #[serde(deserialize_with = "lenient_u32")]
    replicas: Option<u32>,
    selector: Option<serde_json::Value>,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawStatus {
    #[serde(deserialize_with = "lenient_u32")]
    replicas: Option<u32>,
    #[serde(deserialize_with = "lenient_u32")]
    ready_replicas: Option<u32>,
}

impl From<RawWorkload> for WireWorkload {
    fn from(raw: RawWorkload) -> Self {
        WireWorkload {
            meta: ObjectMeta {
                name: raw.metadata.name,
                namespace: raw.metadata.namespace,
                resource_version: raw.metadata.resource_version,
                ..ObjectMeta::default()
            },
            marks: Marks { state_annotation: raw.metadata.annotations, scaled_at: raw.metadata.managed_fields },
            spec_replicas: raw.spec.replicas,
            status_replicas: raw.status.replicas,
            ready_replicas: raw.status.ready_replicas,
            selector: raw.spec.selector,
        }
    }
}

/// One object of a workload store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredWorkload {
    pub name: Box<str>,
    pub resource_version: Box<str>,
    /// Built-in kinds only (custom kinds read it from `/scale`).
    pub spec_replicas: u32,
    /// Built-in kinds only.
    pub status_replicas: u32,
    /// `status.readyReplicas`. Built-in kinds: 0 when absent (the API omits zero). Custom
    /// kinds: `None` when absent, which sends readiness to the pod count.
    pub ready_replicas: Option<u32>,
    /// Built-in kinds only: the selector in label-selector syntax.
    pub selector: Option<Box<str>>,
    pub marks: Marks,
    /// Built-in kinds: [`super::ScaleReading::spec_changed_at`], stamped when the event
    /// arrived. Custom kinds, whose replica count is known only once `/scale` is read: when
    /// this resourceVersion of the object arrived.
    pub seen: Option<Timestamp>,
}

/// A `Lookup` for a stored type keyed by its name alone: the store is per kind and namespace
/// (pods: per namespace and selector), so the key needs neither. `()` as the dynamic type (an
/// `ApiResource` would be five Strings cloned into every key), and no namespace,
/// resourceVersion or uid in the key (kept once, in the object, or not at all).
macro_rules! keyed_by_name {
    ($type:ty, $kind:literal, $version:literal, $plural:literal) => {
        impl Lookup for $type {
            type DynamicType = ();

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("")
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }

            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn name(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(&self.name))
            }

            fn namespace(&self) -> Option<Cow<'_, str>> {
                None
            }

            fn resource_version(&self) -> Option<Cow<'_, str>> {
                None
            }

            fn uid(&self) -> Option<Cow<'_, str>> {
                None
            }
        }
    };
}

keyed_by_name!(StoredWorkload, "", "", "");

/// When a replica count was first seen: kept while it stays the same, `at` when it changed,
/// `None` when there was nothing before it (its age is unknown). `previous` is the count and
/// stamp of the object as last known.
pub(crate) fn stamp_spec_change(
    spec: u32,
    previous: Option<(u32, Option<Timestamp>)>,
    at: Timestamp,
) -> Option<Timestamp> {
    match previous {
        Some((before, stamp)) if before == spec => stamp,
        Some(_) => Some(at),
        None => None,
    }
}

/// Reduces a decoded object to what the store keeps, stamping it against the version the
/// store holds now (`previous`) at `now`, the arrival of its event. `None` for an object
/// without a name, which the API server never sends and the store could not key.
pub(crate) fn compact(
    paths: KindPaths,
    wire: WireWorkload,
    previous: Option<&StoredWorkload>,
    now: Timestamp,
) -> Option<StoredWorkload> {
    let name = wire.meta.name?.into_boxed_str();
    let resource_version = wire.meta.resource_version.unwrap_or_default().into_boxed_str();
    Some(match paths {
        KindPaths::Builtin(shape) => {
            // The API defaults spec.replicas to 1, so absent only happens in hand-made data.
            let spec_replicas = wire.spec_replicas.unwrap_or(1);
            let selector = wire.selector.as_ref().and_then(|s| match shape {
                SelectorShape::LabelSelector => format_label_selector(s),
                SelectorShape::Map => format_match_labels(s),
            });
            StoredWorkload {
                name,
                resource_version,
                spec_replicas,
                status_replicas: wire.status_replicas.unwrap_or(0),
                ready_replicas: Some(wire.ready_replicas.unwrap_or(0)),
                selector: selector.map(String::into_boxed_str),
                marks: wire.marks,
                seen: stamp_spec_change(spec_replicas, previous.map(|p| (p.spec_replicas, p.seen)), now),
            }
        }
        KindPaths::Custom => {
            // A re-list sends every object again: the same version keeps its arrival time.
            let seen = match previous {
                Some(p) if p.resource_version == resource_version => p.seen,
                _ => Some(now),
            };
            StoredWorkload {
                name,
                resource_version,
                spec_replicas: 0,
                status_replicas: 0,
                ready_replicas: wire.ready_replicas,
                selector: None,
                marks: wire.marks,
                seen,
            }
        }
    })
}

/// One pod of a pod store: its name and whether it counts as ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadyPod {
    pub name: Box<str>,
    pub ready: bool,
}

keyed_by_name!(ReadyPod, "Pod", "v1", "pods");

/// Accepts every JSON value that is not a number or a map, answering `$default`.
macro_rules! answer_non_numbers {
    ($default:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($default)
        }
    };
}

/// Accepts every number, answering `$default`.
macro_rules! answer_numbers {
    ($default:expr) => {
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($default)
        }
    };
}

/// A non-negative integer that fits a `u32`, else `None` (negative, fractional, text, ...).
fn lenient_u32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    struct Count;
    impl<'de> Visitor<'de> for Count {
        type Value = Option<u32>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any value")
        }
        answer_non_numbers!(None);
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
            Ok(u32::try_from(n).ok())
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
            Ok(u32::try_from(n).ok())
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
    deserializer.deserialize_any(Count)
}

/// `T` from a JSON object; anything else (a custom resource's `status: "ok"`) reads as empty.
fn object_or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    struct Object<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for Object<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any value")
        }
        answer_non_numbers!(T::default());
        answer_numbers!(T::default());
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_any(Object(PhantomData))
}

/// Whether a map key is the given one, without allocating it.
struct KeyIs(&'static str);

impl<'de> DeserializeSeed<'de> for KeyIs {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// `metadata.annotations`, keeping only [`super::STATE_ANNOTATION`].
fn state_annotation<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    struct Annotations;
    impl<'de> Visitor<'de> for Annotations {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("annotations")
        }
        answer_non_numbers!(None);
        answer_numbers!(None);
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(ours) = map.next_key_seed(KeyIs(super::STATE_ANNOTATION))? {
                if ours {
                    found = map.next_value::<Option<String>>()?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    deserializer.deserialize_any(Annotations)
}

#[derive(Deserialize)]
struct ManagedEntry {
    #[serde(default)]
    manager: Option<String>,
    #[serde(default)]
    time: Option<Time>,
}

/// `metadata.managedFields`, reduced to [`Marks::scaled_at`]: the latest time recorded for
/// watermarkd's scale field manager, without decoding any `fieldsV1`.
fn scaled_at<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Timestamp>, D::Error> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Option<Timestamp>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("managed fields")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut latest: Option<Timestamp> = None;
            while let Some(entry) = seq.next_element::<ManagedEntry>()? {
                if entry.manager.as_deref() != Some(super::FIELD_MANAGER) {
                    continue;
                }
                if let Some(time) = entry.time {
                    let at = Timestamp::from_unix_millis(time.0.as_millisecond());
                    latest = latest.max(Some(at));
                }
            }
            Ok(latest)
        }
    }
    deserializer.deserialize_any(Entries)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn wire(value: serde_json::Value) -> WireWorkload {
        serde_json::from_value(value).expect("decodes")
    }

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    const LABELS: KindPaths = KindPaths::Builtin(SelectorShape::LabelSelector);

    /// A Deployment as the API server sends it, managedFields and pod template included.
    fn deployment() -> serde_json::Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "prod",
                "uid": "5c1e0f5e-0000-4000-8000-000000000000",
                "resourceVersion": "4242",
                "generation": 7,
                "labels": { "app": "web" },
                "annotations": {
                    "deployment.kubernetes.io/revision": "3",
                    "watermarkd.io/state": "{\"v\":1}",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}",
                },
                "managedFields": [
                    { "manager": "kubectl", "operation": "Update", "time": "2024-01-01T00:00:00Z",
                      "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:replicas": {} } } },
                    { "manager": "watermarkd", "operation": "Update", "subresource": "scale",
                      "time": "2024-01-02T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": {} } },
                    { "manager": "watermarkd", "operation": "Update", "time": "2024-01-03T00:00:05Z" },
                    { "manager": "watermarkd-state", "operation": "Update", "time": "2024-02-01T00:00:00Z" },
                ],
            },
            "spec": {
                "replicas": 5,
                "selector": { "matchLabels": { "tier": "web", "app": "billing" } },
                "template": {
                    "metadata": { "labels": { "app": "billing", "tier": "web" } },
                    "spec": { "containers": [{ "name": "c", "image": "nginx", "ports": [{ "containerPort": 80 }] }] },
                },
                "strategy": { "type": "RollingUpdate" },
            },
            "status": {
                "replicas": 4,
                "readyReplicas": 3,
                "conditions": [{ "type": "Available", "status": "True" }],
            },
        })
    }

    #[test]
    fn a_deployment_keeps_its_counts_selector_state_and_own_write_time_and_nothing_else() {
        let object = wire(deployment());
        assert_eq!(object.meta.name.as_deref(), Some("web"));
        assert_eq!(object.meta.resource_version.as_deref(), Some("4242"));
        assert_eq!(object.meta.uid, None, "only what the watcher needs");
        assert_eq!(object.meta.annotations, None);
        let stored = compact(LABELS, object, None, t(1)).expect("named");
        assert_eq!(
            stored,
            StoredWorkload {
                name: "web".into(),
                resource_version: "4242".into(),
                spec_replicas: 5,
                status_replicas: 4,
                ready_replicas: Some(3),
                selector: Some("app=billing,tier=web".into()),
                marks: Marks {
                    state_annotation: Some("{\"v\":1}".into()),
                    // The latest entry of the scale field manager, not the state manager's.
                    scaled_at: Some(t(1_704_240_005_000)),
                },
                seen: None,
            }
        );
    }

    #[test]
    fn statefulsets_and_replicasets_read_like_deployments() {
        for kind in ["StatefulSet", "ReplicaSet"] {
            let mut value = deployment();
            value["kind"] = json!(kind);
            value["spec"]["serviceName"] = json!("web");
            value["spec"]["selector"] =
                json!({ "matchExpressions": [{ "key": "app", "operator": "In", "values": ["b", "a"] }] });
            let stored = compact(LABELS, wire(value), None, t(1)).expect("named");
            assert_eq!(
                (stored.spec_replicas, stored.status_replicas, stored.ready_replicas),
                (5, 4, Some(3)),
                "{kind}"
            );
            assert_eq!(stored.selector.as_deref(), Some("app in (a,b)"), "{kind}");
        }
    }

    #[test]
    fn a_replication_controller_selector_is_a_plain_map() {
        let value = json!({
            "apiVersion": "v1", "kind": "ReplicationController",
            "metadata": { "name": "rc", "resourceVersion": "1" },
            "spec": { "replicas": 1, "selector": { "b": "2", "a": "1" }, "template": { "spec": {} } },
            "status": { "replicas": 1 },
        });
        let stored = compact(KindPaths::Builtin(SelectorShape::Map), wire(value), None, t(1)).expect("named");
        assert_eq!(stored.selector.as_deref(), Some("a=1,b=2"));
        assert_eq!(stored.ready_replicas, Some(0), "readyReplicas omitted at zero is zero");
    }

    #[test]
    fn builtin_missing_fields_mean_zero_and_a_defaulted_replica_count() {
        let stored = compact(LABELS, wire(json!({ "metadata": { "name": "x" } })), None, t(1)).expect("named");
        assert_eq!((stored.spec_replicas, stored.status_replicas, stored.ready_replicas), (1, 0, Some(0)));
        assert_eq!((stored.selector, stored.marks), (None, Marks::default()));
        assert_eq!(&*stored.resource_version, "");
    }

    #[test]
    fn a_custom_object_keeps_ready_replicas_only_when_present_and_odd_fields_read_as_absent() {
        let with = json!({
            "metadata": { "name": "w", "resourceVersion": "7" },
            "spec": { "size": 3, "replicas": "three", "selector": { "deep": [1, 2, { "x": null }] } },
            "status": { "readyReplicas": 2, "replicas": -1 },
        });
        let stored = compact(KindPaths::Custom, wire(with), None, t(9)).expect("named");
        assert_eq!(stored.ready_replicas, Some(2));
        assert_eq!((stored.spec_replicas, stored.selector.as_deref()), (0, None), "read from /scale instead");
        assert_eq!(stored.seen, Some(t(9)), "a custom object records when its version arrived");
        for odd in [json!("ok"), json!([1, 2]), json!(null), json!(5), json!({ "readyReplicas": 1.5 })] {
            let value = json!({ "metadata": { "name": "w" }, "spec": odd.clone(), "status": odd.clone() });
            let stored = compact(KindPaths::Custom, wire(value), None, t(9)).expect("named");
            assert_eq!(stored.ready_replicas, None, "{odd}");
        }
        let counts = json!({ "metadata": { "name": "w" }, "status": {
            "readyReplicas": 5_000_000_000_u64, "replicas": { "n": 3 } } });
        assert_eq!(wire(counts).ready_replicas, None);
        let nameless = wire(json!({ "metadata": {} }));
        assert_eq!(compact(KindPaths::Custom, nameless, None, t(9)), None);
    }

    #[test]
    fn a_replica_count_is_stamped_when_it_changes_and_keeps_its_stamp() {
        // The first reading's age is unknown.
        assert_eq!(stamp_spec_change(4, None, t(10)), None);
        assert_eq!(stamp_spec_change(4, Some((4, None)), t(10)), None);
        assert_eq!(stamp_spec_change(6, Some((4, None)), t(10)), Some(t(10)));
        assert_eq!(stamp_spec_change(6, Some((6, Some(t(10)))), t(20)), Some(t(10)), "kept while unchanged");
        assert_eq!(stamp_spec_change(4, Some((6, Some(t(10)))), t(30)), Some(t(30)));
    }

    #[test]
    fn events_are_stamped_against_the_version_the_store_holds() {
        let version = |rv: &str, replicas: u32| {
            wire(json!({ "metadata": { "name": "web", "resourceVersion": rv }, "spec": { "replicas": replicas } }))
        };
        let first = compact(LABELS, version("1", 2), None, t(100)).expect("named");
        assert_eq!(first.seen, None);
        let status_only = compact(LABELS, version("2", 2), Some(&first), t(200)).expect("named");
        assert_eq!(status_only.seen, None);
        let scaled = compact(LABELS, version("3", 5), Some(&status_only), t(300)).expect("named");
        assert_eq!(scaled.seen, Some(t(300)), "stamped when the event arrived");
        let relisted = compact(LABELS, version("3", 5), Some(&scaled), t(900)).expect("named");
        assert_eq!(relisted.seen, Some(t(300)), "a re-list keeps the stamp");

        let custom = |rv: &str| wire(json!({ "metadata": { "name": "w", "resourceVersion": rv } }));
        let arrived = compact(KindPaths::Custom, custom("1"), None, t(100)).expect("named");
        let again = compact(KindPaths::Custom, custom("1"), Some(&arrived), t(500)).expect("named");
        assert_eq!(again.seen, Some(t(100)), "the same version keeps its arrival time");
        let moved = compact(KindPaths::Custom, custom("2"), Some(&again), t(600)).expect("named");
        assert_eq!(moved.seen, Some(t(600)));
    }
}
