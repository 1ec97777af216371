//! Checks of Kubernetes manifests shared by tests/packaging.rs (deploy/) and tests/chart.rs
//! (the Helm chart): each object parsed as its Kubernetes type with nothing lost, RBAC rules
//! and `watermarkd::commands::rbac::PERMISSIONS` as sets of single grants, and a check, with
//! SelfSubjectAccessReviews on a real API server, that an identity may make exactly the table's
//! calls and none of the others that are tried.

#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::collections::BTreeSet;

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Api, PostParams};
use serde::de::DeserializeOwned;
use serde::Serialize;
use watermarkd::commands::rbac::Permission;

pub fn kind_of(value: &serde_yaml_ng::Value) -> String {
    value.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string()
}

/// Deserializes `value` as `T` and checks that nothing was lost on the way: k8s-openapi ignores
/// unknown fields, so a misspelt or misplaced field would otherwise pass unnoticed.
pub fn typed<T: DeserializeOwned + Serialize>(file: &str, value: &serde_yaml_ng::Value) -> T {
    let object: T = serde_yaml_ng::from_value(value.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let original = serde_json::to_value(value).unwrap_or_else(|e| panic!("{file}: {e}"));
    let round_trip = serde_json::to_value(&object).unwrap_or_else(|e| panic!("{file}: {e}"));
    if let Some(path) = first_difference(&original, &round_trip, String::new()) {
        let name = value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).unwrap_or_default();
        panic!("{file}: {} {name:?}: field {path} is not part of the type (misspelt or misplaced?)", kind_of(value));
    }
    object
}

/// The path of the first field of `original` that `round_trip` does not have with the same value.
pub fn first_difference(original: &serde_json::Value, round_trip: &serde_json::Value, path: String) -> Option<String> {
    use serde_json::Value;
    match (original, round_trip) {
        (Value::Object(a), Value::Object(b)) => a.iter().find_map(|(key, value)| match b.get(key) {
            Some(other) => first_difference(value, other, format!("{path}.{key}")),
            None => Some(format!("{path}.{key}")),
        }),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| first_difference(x, y, format!("{path}[{i}]")))
        }
        (a, b) if a == b => None,
        _ => Some(if path.is_empty() { ".".into() } else { path }),
    }
}

/// One granted (scope, group, resource, verb), `scope` true for the daemon's namespace only.
pub type Grant = (bool, String, String, String);

/// The grants of RBAC rules, all in one scope. Panics on what the daemon's RBAC never uses:
/// wildcards, resourceNames, nonResourceURLs, empty rules.
pub fn grants_of_rules(rules: &[PolicyRule], namespaced: bool, what: &str) -> Vec<Grant> {
    let mut grants = Vec::new();
    for rule in rules {
        assert!(rule.resource_names.is_none(), "{what}: resourceNames are not used");
        assert!(rule.non_resource_urls.is_none(), "{what}: nonResourceURLs are not used");
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        assert!(!groups.is_empty() && !resources.is_empty() && !rule.verbs.is_empty(), "{what}: an empty rule");
        for group in &groups {
            for resource in &resources {
                for verb in &rule.verbs {
                    for word in [group, resource, verb] {
                        assert!(!word.contains('*'), "{what}: no wildcards ({word:?})");
                    }
                    grants.push((namespaced, group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    grants
}

/// The grants of table entries.
pub fn grants_of_table<'a>(permissions: impl IntoIterator<Item = &'a Permission>) -> Vec<Grant> {
    let mut grants = Vec::new();
    for p in permissions {
        for resource in p.resources {
            for verb in p.verbs {
                grants.push((p.namespaced_to_daemon, p.api_group.into(), resource.to_string(), verb.to_string()));
            }
        }
    }
    grants
}

pub fn sorted_unique(grants: Vec<Grant>, what: &str) -> BTreeSet<Grant> {
    let set: BTreeSet<Grant> = grants.iter().cloned().collect();
    assert_eq!(set.len(), grants.len(), "{what} grants something twice");
    set
}

/// Panics, listing both differences, unless `granted` is `table`.
pub fn assert_same_grants(granted: &BTreeSet<Grant>, table: &BTreeSet<Grant>, what: &str) {
    let extra: Vec<_> = granted.difference(table).collect();
    let missing: Vec<_> = table.difference(granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{what} differs from watermarkd::commands::rbac::PERMISSIONS (namespaced, group, resource, verb):\n\
         granted but not in the table: {extra:?}\nin the table but not granted: {missing:?}"
    );
}

/// Whether the client's identity may `verb` `group`/`resource` (`name/subresource`) in
/// `namespace` (empty: all namespaces), as the API server decides it.
pub async fn may(client: &kube::Client, group: &str, resource: &str, verb: &str, namespace: &str) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, subresource)) => (resource, Some(subresource.to_string())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                verb: Some(verb.into()),
                namespace: Some(namespace.into()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await.unwrap_or_else(|e| panic!("access review: {e}"));
    answer.status.is_some_and(|s| s.allowed)
}

/// Resources the daemon never touches, tried with `get`. (ConfigMaps are in the table: those of
/// the daemon's own namespace hold the state, and `get` anywhere else is denied as `outside`.)
const NEVER: [(&str, &str); 6] =
    [("", "secrets"), ("", "services"), ("", "events"), ("", "pods/exec"), ("apps", "daemonsets"), ("", "nodes")];
const ALL_VERBS: [&str; 8] = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];

/// Everything `account` may do that it should not, and everything in `table` it may not do:
/// each cluster-wide grant in each of `namespaces` and across all of them, each grant of the
/// daemon's namespace in `daemon_namespace` and not in `outside`; and no other verb on the
/// table's resources and on `also_denied` (group, resource) pairs, nor `get` on resources the
/// daemon never touches, in `daemon_namespace`, any of `namespaces` or across all. Empty: exactly the table.
pub async fn access_problems(
    account: &kube::Client,
    table: &BTreeSet<Grant>,
    daemon_namespace: &str,
    namespaces: &[&str],
    outside: &str,
    also_denied: &[(&str, &str)],
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (namespaced, group, resource, verb) in table {
        let mut allowed_in: Vec<&str> = if *namespaced { vec![daemon_namespace] } else { namespaces.to_vec() };
        if !*namespaced {
            allowed_in.push("");
        }
        for namespace in allowed_in {
            if !may(account, group, resource, verb, namespace).await {
                wrong.push(format!("denied: {verb} {group}/{resource} in {namespace:?}"));
            }
        }
        if *namespaced && may(account, group, resource, verb, outside).await {
            wrong.push(format!("allowed outside {daemon_namespace}: {verb} {group}/{resource} in {outside:?}"));
        }
    }
    let mut resources: BTreeSet<(String, String)> = table.iter().map(|(_, g, r, _)| (g.clone(), r.clone())).collect();
    resources.extend(also_denied.iter().map(|(g, r)| (g.to_string(), r.to_string())));
    let mut attempts: Vec<(String, String, String)> = Vec::new();
    for (group, resource) in &resources {
        for verb in ALL_VERBS {
            if !table.iter().any(|(_, g, r, v)| g == group && r == resource && v == verb) {
                attempts.push((group.clone(), resource.clone(), verb.to_string()));
            }
        }
    }
    for (group, resource) in NEVER {
        attempts.push((group.into(), resource.into(), "get".into()));
    }
    let mut where_: Vec<&str> = vec![daemon_namespace, ""];
    where_.extend(namespaces.iter().copied().filter(|n| *n != daemon_namespace && !n.is_empty()));
    for (group, resource, verb) in &attempts {
        for namespace in &where_ {
            if may(account, group, resource, verb, namespace).await {
                wrong.push(format!("allowed: {verb} {group}/{resource} in {namespace:?}"));
            }
        }
    }
    wrong
}
