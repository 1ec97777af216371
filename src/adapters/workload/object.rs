//! Pure parts of reading a workload: where its replica counts live, label selectors as
//! strings, and which pods count as ready. No I/O, so everything here has unit tests.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

/// `apps/v1` -> (`apps`, `v1`); `v1` -> (``, `v1`) (the core group).
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// How the replica counts of a kind are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KindPaths {
    /// A built-in workload whose `/scale` maps to fixed fields: `spec.replicas`,
    /// `status.replicas`, `status.readyReplicas` (omitted by the API when 0) and `spec.selector`
    /// in the given shape. Read straight from the watched object: no request per change.
    Builtin(SelectorShape),
    /// Anything else (custom resources, aggregated APIs): the `/scale` paths are declared in a
    /// CRD that discovery does not return, so `/scale` itself is read once per change of the
    /// object. Ready replicas come from `status.readyReplicas` when the object has it.
    Custom,
}

/// The shape of a built-in workload's `spec.selector`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SelectorShape {
    /// A `LabelSelector` (`matchLabels` / `matchExpressions`): apps/v1 workloads.
    LabelSelector,
    /// A plain label map: ReplicationController.
    Map,
}

pub(crate) fn kind_paths(group: &str, kind: &str) -> KindPaths {
    match (group, kind) {
        ("apps", "Deployment" | "StatefulSet" | "ReplicaSet") => KindPaths::Builtin(SelectorShape::LabelSelector),
        ("", "ReplicationController") => KindPaths::Builtin(SelectorShape::Map),
        _ => KindPaths::Custom,
    }
}

/// A `LabelSelector` in the string syntax `/scale` uses (`status.selector`) and list calls
/// accept: requirements sorted by key, values sorted, as the API server formats them.
/// `None` when the value is not a selector.
pub(crate) fn format_label_selector(selector: &Value) -> Option<String> {
    let object = selector.as_object()?;
    let mut requirements: Vec<(String, String)> = Vec::new();
    if let Some(labels) = object.get("matchLabels").and_then(Value::as_object) {
        for (key, value) in labels {
            requirements.push((key.clone(), format!("{key}={}", value.as_str()?)));
        }
    }
    if let Some(expressions) = object.get("matchExpressions").and_then(Value::as_array) {
        for expression in expressions {
            let key = expression.get("key")?.as_str()?;
            let mut values: Vec<&str> = expression
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            values.sort_unstable();
            let text = match expression.get("operator")?.as_str()? {
                "In" => format!("{key} in ({})", values.join(",")),
                "NotIn" => format!("{key} notin ({})", values.join(",")),
                "Exists" => key.to_string(),
                "DoesNotExist" => format!("!{key}"),
                _ => return None,
            };
            requirements.push((key.to_string(), text));
        }
    }
    requirements.sort();
    Some(requirements.into_iter().map(|(_, text)| text).collect::<Vec<_>>().join(","))
}

/// A plain label map (`{app: web}`) as `app=web`, keys sorted.
pub(crate) fn format_match_labels(labels: &Value) -> Option<String> {
    let labels = labels.as_object()?;
    let mut pairs = Vec::with_capacity(labels.len());
    for (key, value) in labels {
        pairs.push(format!("{key}={}", value.as_str()?));
    }
    pairs.sort();
    Some(pairs.join(","))
}

/// Whether a pod counts as a ready replica: its Ready condition is True, it is not being
/// deleted and it has not finished (the ReplicaSet controller's notion of an active pod).
pub(crate) fn pod_is_ready(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(status) = &pod.status else { return false };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn api_versions_split_into_group_and_version() {
        assert_eq!(split_api_version("apps/v1"), ("apps", "v1"));
        assert_eq!(split_api_version("v1"), ("", "v1"));
        assert_eq!(split_api_version("example.com/v1alpha1"), ("example.com", "v1alpha1"));
    }

    #[test]
    fn builtin_kinds_have_known_paths_and_the_rest_are_custom() {
        assert_eq!(kind_paths("apps", "Deployment"), KindPaths::Builtin(SelectorShape::LabelSelector));
        assert_eq!(kind_paths("apps", "StatefulSet"), KindPaths::Builtin(SelectorShape::LabelSelector));
        assert_eq!(kind_paths("apps", "ReplicaSet"), KindPaths::Builtin(SelectorShape::LabelSelector));
        assert_eq!(kind_paths("", "ReplicationController"), KindPaths::Builtin(SelectorShape::Map));
        assert_eq!(kind_paths("example.com", "Deployment"), KindPaths::Custom);
        assert_eq!(kind_paths("apps", "DaemonSet"), KindPaths::Custom);
    }

    #[test]
    fn label_selectors_format_like_the_api_server() {
        let selector = json!({
            "matchLabels": { "app": "web" },
            "matchExpressions": [
                { "key": "zone", "operator": "In", "values": ["b", "a"] },
                { "key": "canary", "operator": "DoesNotExist" },
                { "key": "env", "operator": "NotIn", "values": ["dev"] },
                { "key": "owner", "operator": "Exists" },
            ],
        });
        assert_eq!(
            format_label_selector(&selector).as_deref(),
            Some("app=web,!canary,env notin (dev),owner,zone in (a,b)")
        );
        assert_eq!(format_label_selector(&json!({})).as_deref(), Some(""));
        assert_eq!(format_label_selector(&json!("app=web")), None);
        let bad = json!({ "matchExpressions": [{ "key": "a", "operator": "Near" }] });
        assert_eq!(format_label_selector(&bad), None);
    }

    fn pod(phase: &str, ready: Option<&str>, deleting: bool) -> Pod {
        let mut value = json!({ "metadata": { "name": "p" }, "status": { "phase": phase } });
        if let Some(ready) = ready {
            value["status"]["conditions"] =
                json!([{ "type": "PodScheduled", "status": "True" }, { "type": "Ready", "status": ready }]);
        }
        if deleting {
            value["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        serde_json::from_value(value).expect("a pod")
    }

    #[test]
    fn only_running_ready_pods_that_are_not_being_deleted_count() {
        assert!(pod_is_ready(&pod("Running", Some("True"), false)));
        assert!(!pod_is_ready(&pod("Running", Some("False"), false)));
        assert!(!pod_is_ready(&pod("Running", None, false)));
        assert!(!pod_is_ready(&pod("Running", Some("True"), true)));
        assert!(!pod_is_ready(&pod("Succeeded", Some("True"), false)));
        assert!(!pod_is_ready(&pod("Failed", Some("True"), false)));
        let no_status: Pod = serde_json::from_value(json!({ "metadata": { "name": "p" } })).expect("a pod");
        assert!(!pod_is_ready(&no_status));
    }
}
