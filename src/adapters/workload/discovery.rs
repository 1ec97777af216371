//! Kind discovery: from a target's `apiVersion` + `kind` to the [`ApiResource`] to reach it,
//! whether it is namespaced, and how its `/scale` is read ([`KindPaths`]).
//!
//! A kind must have a `/scale` subresource to be a target. Discovery runs once per kind,
//! however many namespaces and targets use it (the results are cached in `Context`, and one
//! discovery runs at a time), and again after a store finds its kind no longer served. Kept
//! apart because the registry, the reads and the writes all reach the API through it.

use std::sync::{Arc, PoisonError};

use kube::api::{Api, ApiResource};
use kube::core::discovery::Scope;
use kube::core::GroupVersionKind;
use kube::{Client, Resource};

use super::error::Request;
use super::object::{kind_paths, split_api_version, KindPaths};
use super::{Context, WorkloadError};
use crate::domain::rules::TargetRef;

/// A workload store's identity: the kind as the targets name it, and the namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct StoreKey {
    pub(super) api_version: Arc<str>,
    pub(super) kind: Arc<str>,
    pub(super) namespace: Arc<str>,
}

impl StoreKey {
    pub(super) fn of(target: &TargetRef) -> Self {
        StoreKey {
            api_version: target.api_version.clone(),
            kind: target.kind.clone(),
            namespace: target.namespace.clone(),
        }
    }
}

/// A resolved kind: how to reach it and how to read it.
#[derive(Debug)]
pub(super) struct Resolved {
    pub(super) resource: ApiResource,
    namespaced: bool,
    pub(super) paths: KindPaths,
}

/// (apiVersion, kind), interned.
pub(super) type KindKey = (Arc<str>, Arc<str>);

pub(super) fn api_for<K>(client: &Client, resolved: &Resolved, namespace: &str) -> Api<K>
where
    K: Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    if resolved.namespaced {
        Api::namespaced_with(client.clone(), namespace, &resolved.resource)
    } else {
        Api::all_with(client.clone(), &resolved.resource)
    }
}

impl Context {
    /// Resolves a kind through discovery (cached once it resolved with a `/scale`).
    pub(super) async fn resolve(&self, key: &StoreKey) -> Result<Arc<Resolved>, WorkloadError> {
        let kind_key = (key.api_version.clone(), key.kind.clone());
        let cached = || self.kinds.lock().unwrap_or_else(PoisonError::into_inner).get(&kind_key).cloned();
        if let Some(resolved) = cached() {
            return Ok(resolved);
        }
        let _resolving = self.resolving.lock().await;
        if let Some(resolved) = cached() {
            return Ok(resolved);
        }
        let (group, version) = split_api_version(&key.api_version);
        let gvk = GroupVersionKind::gvk(group, version, &key.kind);
        let unknown = |reason: String| WorkloadError::UnknownKind {
            api_version: key.api_version.to_string(),
            kind: key.kind.to_string(),
            reason,
        };
        let (resource, capabilities) = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok(found) => found,
            Err(kube::Error::Discovery(e)) => return Err(unknown(e.to_string())),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(unknown(format!("apiVersion {} is not served", key.api_version)))
            }
            Err(err) => {
                let request = Request {
                    verb: "get",
                    resource: "discovery",
                    api_version: &key.api_version,
                    namespace: &key.namespace,
                    kind: &key.kind,
                    name: "",
                    collection: true,
                };
                return Err(request.error(&err));
            }
        };
        if !capabilities.subresources.iter().any(|(sub, _)| sub.plural == "scale") {
            return Err(WorkloadError::NoScaleSubresource {
                api_version: key.api_version.to_string(),
                kind: key.kind.to_string(),
            });
        }
        let resolved = Arc::new(Resolved {
            paths: kind_paths(group, &key.kind),
            namespaced: capabilities.scope == Scope::Namespaced,
            resource,
        });
        self.kinds.lock().unwrap_or_else(PoisonError::into_inner).insert(kind_key, Arc::clone(&resolved));
        Ok(resolved)
    }

    pub(super) fn forget(&self, key: &StoreKey) {
        let kind_key = (key.api_version.clone(), key.kind.clone());
        self.kinds.lock().unwrap_or_else(PoisonError::into_inner).remove(&kind_key);
    }
}
