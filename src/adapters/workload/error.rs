//! Errors of the workload layer. Each concerns one autoscaler's target: the runtime reports it
//! for that autoscaler and keeps the others running.

use kube::runtime::watcher;

use super::object::split_api_version;

/// Why a target could not be read or scaled. `Clone` because the cache hands the same error to
/// every read until the cause goes away.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// The target object does not exist.
    #[error("{kind} {namespace}/{name} does not exist")]
    NotFound { kind: String, namespace: String, name: String },
    /// RBAC denied a request: which verb on which resource, so the missing rule is obvious.
    #[error("forbidden: cannot {verb} {resource} ({}) in namespace {namespace:?}: {message}", group_text(.api_group))]
    Forbidden { verb: String, resource: String, api_group: String, namespace: String, message: String },
    /// The kind exists but has no `/scale` subresource, so nothing can scale it.
    #[error("{kind} ({api_version}) has no /scale subresource, so it cannot be autoscaled")]
    NoScaleSubresource { api_version: String, kind: String },
    /// Discovery does not know the kind in that apiVersion (a typo, or a CRD not installed).
    #[error("the API server does not serve kind {kind} in {api_version}: {reason}")]
    UnknownKind { api_version: String, kind: String, reason: String },
    /// The object changed after the reading the decision was based on: re-read and decide
    /// again. Nothing was written.
    #[error("{kind} {namespace}/{name} changed since resourceVersion {resource_version}; not overwriting it")]
    Conflict { kind: String, namespace: String, name: String, resource_version: String },
    /// Any other answer from the API server.
    #[error("Kubernetes API error {code}: {message}")]
    Api { code: u16, message: String },
    /// The API server could not be reached, or failed before answering.
    #[error("cannot reach the Kubernetes API: {0}")]
    Connection(String),
    /// No answer within the time the request was given (`what` says which bound that was). A
    /// write may or may not have landed.
    #[error("cannot reach the Kubernetes API: no answer within {:.1}s ({what})", *.millis as f64 / 1000.0)]
    Timeout { millis: u64, what: &'static str },
    /// A scale write whose outcome was unknown is not settled yet: the API server cannot say
    /// what the object holds, or the watch does not show it yet. Deciding now could decide on
    /// an object the write has changed.
    #[error("the last scale write may or may not have landed: {0}")]
    Unsettled(String),
    /// No usable client configuration (kubeconfig missing or invalid, unknown context).
    #[error("Kubernetes client configuration: {0}")]
    Config(String),
    /// `read` or `scale` of a target that `Workloads::watch` was not called for (a caller bug).
    #[error("{0} is not watched (call Workloads::watch first)")]
    NotWatched(String),
}

impl WorkloadError {
    /// Whether a write that ended in this error may still have been applied: the API server
    /// failed or never answered, so the request may have reached etcd (or may yet).
    pub fn outcome_unknown(&self) -> bool {
        match self {
            WorkloadError::Connection(_) | WorkloadError::Timeout { .. } => true,
            WorkloadError::Api { code, .. } => *code >= 500,
            _ => false,
        }
    }
}

impl WorkloadError {
    /// No answer within `bound`.
    pub fn timeout(bound: std::time::Duration, what: &'static str) -> Self {
        WorkloadError::Timeout { millis: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX), what }
    }
}

fn group_text(group: &str) -> String {
    if group.is_empty() {
        "core API group".to_string()
    } else {
        format!("API group {group:?}")
    }
}

/// What a request was doing, to turn the API server's answer into the right `WorkloadError`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub verb: &'a str,
    /// As in an RBAC rule: `deployments`, `deployments/scale`, `pods`.
    pub resource: &'a str,
    /// The target's apiVersion (`apps/v1`); its group goes into Forbidden.
    pub api_version: &'a str,
    pub namespace: &'a str,
    /// The target, for NotFound and Conflict.
    pub kind: &'a str,
    pub name: &'a str,
    /// True for list and watch: a 404 then means the resource type is not served, not that an
    /// object is missing.
    pub collection: bool,
}

impl<'a> Request<'a> {
    /// A request about one target object (`resource` such as `deployments/scale`).
    pub fn for_target(verb: &'a str, resource: &'a str, target: &'a crate::domain::rules::TargetRef) -> Self {
        Request {
            verb,
            resource,
            api_version: &target.api_version,
            namespace: &target.namespace,
            kind: &target.kind,
            name: &target.name,
            collection: false,
        }
    }
}

impl Request<'_> {
    pub(crate) fn error(&self, err: &kube::Error) -> WorkloadError {
        match err {
            kube::Error::Api(status) => self.status_error(status.code, &status.message),
            other => WorkloadError::Connection(other.to_string()),
        }
    }

    pub(crate) fn status_error(&self, code: u16, message: &str) -> WorkloadError {
        match code {
            403 => WorkloadError::Forbidden {
                verb: self.verb.to_string(),
                resource: self.resource.to_string(),
                api_group: split_api_version(self.api_version).0.to_string(),
                namespace: self.namespace.to_string(),
                message: message.to_string(),
            },
            404 if self.collection => WorkloadError::UnknownKind {
                api_version: self.api_version.to_string(),
                kind: self.kind.to_string(),
                reason: format!("{} {} answered 404: {message}", self.verb, self.resource),
            },
            404 => WorkloadError::NotFound {
                kind: self.kind.to_string(),
                namespace: self.namespace.to_string(),
                name: self.name.to_string(),
            },
            // The version is filled in by the caller, which knows it.
            409 => WorkloadError::Conflict {
                kind: self.kind.to_string(),
                namespace: self.namespace.to_string(),
                name: self.name.to_string(),
                resource_version: String::new(),
            },
            _ => WorkloadError::Api { code, message: message.to_string() },
        }
    }

    /// A watcher's error: the initial list is a `list`, the rest are `watch`.
    pub(crate) fn watch_error(&self, err: &watcher::Error) -> WorkloadError {
        let as_verb = |verb| Request { verb, ..*self };
        match err {
            watcher::Error::InitialListFailed(e) => as_verb("list").error(e),
            watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => as_verb("watch").error(e),
            watcher::Error::WatchError(status) => as_verb("watch").status_error(status.code, &status.message),
            watcher::Error::NoResourceVersion => {
                WorkloadError::Api { code: 0, message: "the API server's list had no resourceVersion".to_string() }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(collection: bool) -> Request<'static> {
        Request {
            verb: "patch",
            resource: "deployments/scale",
            api_version: "apps/v1",
            namespace: "prod",
            kind: "Deployment",
            name: "web",
            collection,
        }
    }

    #[test]
    fn forbidden_names_the_verb_resource_group_and_namespace() {
        let err = request(false).status_error(403, "User \"x\" cannot patch resource");
        let text = err.to_string();
        assert!(matches!(&err, WorkloadError::Forbidden { verb, .. } if verb == "patch"), "{err:?}");
        assert!(text.contains("cannot patch deployments/scale (API group \"apps\") in namespace \"prod\""), "{text}");
        let core =
            Request { api_version: "v1", resource: "pods", verb: "list", ..request(true) }.status_error(403, "no");
        assert!(core.to_string().contains("cannot list pods (core API group)"), "{core}");
    }

    #[test]
    fn a_404_is_a_missing_object_or_an_unserved_kind() {
        assert_eq!(
            request(false).status_error(404, "gone"),
            WorkloadError::NotFound { kind: "Deployment".into(), namespace: "prod".into(), name: "web".into() }
        );
        assert!(matches!(request(true).status_error(404, "gone"), WorkloadError::UnknownKind { .. }));
    }

    #[test]
    fn conflicts_and_other_codes() {
        assert!(matches!(request(false).status_error(409, "changed"), WorkloadError::Conflict { .. }));
        assert_eq!(request(false).status_error(422, "bad"), WorkloadError::Api { code: 422, message: "bad".into() });
    }
}
