//! Where a rules-file autoscaler's state is kept: one ConfigMap per target, in the daemon's own
//! namespace (the Lease's), so that the daemon needs no write access to the workloads it
//! scales beyond their `/scale`.
//!
//! The ConfigMap is named after a hash of the target's identity (API group, kind, namespace,
//! name: `watermarkd-state-` and 16 hex digits) and carries the identity in full
//! (`data.target`), so a hash collision, however unlikely, reads as "no state" and never as
//! another target's. `data.state` is the same JSON as the `watermarkd.io/state` annotation that
//! earlier versions wrote on the target (see [`super::encode_annotation`]); that annotation is
//! still read when a target has no ConfigMap yet, so an upgrade keeps the windows.
//!
//! The names and contents are pure functions here; [`StateConfigMaps`] is the thin async edge
//! that reads one with a GET and writes one with a server-side apply (which creates it too).
//! At most [`IN_FLIGHT`] of those run at once: every autoscaler reads its state when the daemon
//! starts or a leadership begins, and 10,000 GETs at once would open a connection to the API
//! server each (about a hundred were measured, kept open afterwards, 60 kB of memory each).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use tokio::sync::Semaphore;

use crate::domain::rules::TargetRef;

/// The field manager of the state ConfigMaps' writes.
const FIELD_MANAGER: &str = "watermarkd-state";
/// Every state ConfigMap's name starts with this.
pub const NAME_PREFIX: &str = "watermarkd-state-";
/// The label that marks a ConfigMap as a target's state; its value is always `state`, so
/// `kubectl get configmaps -l watermarkd.io/role=state` lists them all.
pub const ROLE_LABEL: &str = "watermarkd.io/role";
/// `data` key: the target's identity, as [`target_key`] writes it.
pub const TARGET_KEY: &str = "target";
/// `data` key: the state, as [`super::encode_annotation`] writes it.
pub const STATE_KEY: &str = "state";
/// How long a read of a state ConfigMap may take before the evaluation gives up for this turn.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How many reads and writes of state ConfigMaps may be under way at once. A GET takes a few
/// milliseconds, so 10,000 of them still take seconds, not minutes.
pub const IN_FLIGHT: usize = 8;

/// The target's identity in words: `Deployment.apps prod/web`; `Kind ns/name` for the core
/// group. The API version is left out: `apps/v1` and `apps/v1beta2` reach the same object.
pub fn target_key(target: &TargetRef) -> String {
    let (group, kind, namespace, name) = target.identity();
    if group.is_empty() {
        format!("{kind} {namespace}/{name}")
    } else {
        format!("{kind}.{group} {namespace}/{name}")
    }
}

/// The name of the target's state ConfigMap: [`NAME_PREFIX`] and the FNV-1a hash of
/// [`target_key`], fixed across versions and platforms (unlike std's hasher, whose algorithm
/// may change) so that an upgraded daemon finds what the previous one wrote.
pub fn object_name(target: &TargetRef) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let hash = target_key(target).bytes().fold(OFFSET, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME));
    format!("{NAME_PREFIX}{hash:016x}")
}

/// The whole ConfigMap for `target` holding `state`, as applied.
pub fn object_for(target: &TargetRef, namespace: &str, state: &str) -> ConfigMap {
    let labels = [
        ("app.kubernetes.io/managed-by".to_string(), "watermarkd".to_string()),
        (ROLE_LABEL.to_string(), "state".to_string()),
    ];
    let data = [(TARGET_KEY.to_string(), target_key(target)), (STATE_KEY.to_string(), state.to_string())];
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(object_name(target)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels.into_iter().collect()),
            ..ObjectMeta::default()
        },
        data: Some(data.into_iter().collect()),
        ..ConfigMap::default()
    }
}

/// What a state ConfigMap, as read, holds for `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The state text (still to be decoded).
    State(String),
    /// No ConfigMap, or one without a state.
    Absent,
    /// A ConfigMap of this name about another target (a hash collision) or without one.
    OtherTarget(Option<String>),
}

/// What `configmap` holds for `target`.
pub fn stored_in(configmap: &ConfigMap, target: &TargetRef) -> Stored {
    let data = configmap.data.as_ref();
    let about = data.and_then(|d| d.get(TARGET_KEY));
    if about.map(String::as_str) != Some(target_key(target).as_str()) {
        return Stored::OtherTarget(about.cloned());
    }
    match data.and_then(|d| d.get(STATE_KEY)) {
        Some(state) => Stored::State(state.clone()),
        None => Stored::Absent,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateObjectError {
    #[error(
        "state ConfigMap {namespace}/{name}: the API server refused to {verb} it (forbidden): \
         grant {verb} on configmaps in namespace {namespace}"
    )]
    Forbidden { namespace: String, name: String, verb: &'static str },
    #[error(
        "namespace {namespace:?} does not exist, so no autoscaler's state (its forbidden windows) is kept: \
         create it (kubectl create namespace {namespace}) or set --lease-namespace to one that exists"
    )]
    NamespaceMissing { namespace: String },
    #[error("state ConfigMap {namespace}/{name}: cannot {verb} it: {cause}")]
    Api { namespace: String, name: String, verb: &'static str, cause: String },
    #[error("state ConfigMap {namespace}/{name}: no answer from the API server within {seconds:.1}s")]
    Timeout { namespace: String, name: String, seconds: f64 },
}

/// Reads and writes the state ConfigMaps in one namespace.
#[derive(Clone)]
pub struct StateConfigMaps {
    api: Api<ConfigMap>,
    namespace: String,
    /// [`IN_FLIGHT`] permits, shared by the clones.
    permits: Arc<Semaphore>,
    /// Whether the last answer said the namespace does not exist.
    namespace_missing: Arc<AtomicBool>,
}

impl StateConfigMaps {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        StateConfigMaps {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            permits: Arc::new(Semaphore::new(IN_FLIGHT)),
            namespace_missing: Arc::default(),
        }
    }

    /// Why no state can be kept now, when the namespace does not exist: what `/readyz` says.
    pub fn problem(&self) -> Option<String> {
        self.namespace_missing
            .load(Ordering::Acquire)
            .then(|| StateObjectError::NamespaceMissing { namespace: self.namespace.clone() }.to_string())
    }

    /// Whether this failure was already reported: the namespace is still missing, as the last
    /// answer said. A missing namespace is logged once, not at every evaluation; any other
    /// failure every time.
    pub fn known(&self, err: &StateObjectError) -> bool {
        match err {
            StateObjectError::NamespaceMissing { .. } => self.namespace_missing.swap(true, Ordering::AcqRel),
            _ => false,
        }
    }

    /// A read or write went through: the namespace exists.
    fn succeeded(&self) {
        self.namespace_missing.store(false, Ordering::Release);
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn error(&self, name: &str, verb: &'static str, source: kube::Error) -> StateObjectError {
        let (namespace, name) = (self.namespace.clone(), name.to_string());
        match &source {
            kube::Error::Api(status) if status.code == 403 => StateObjectError::Forbidden { namespace, name, verb },
            kube::Error::Api(status)
                if status.code == 404 && status.details.as_ref().is_some_and(|d| d.kind == "namespaces") =>
            {
                StateObjectError::NamespaceMissing { namespace }
            }
            // The API server's message and code, not the whole Status in Debug form.
            kube::Error::Api(status) => {
                let cause = format!("{} ({} {})", status.message, status.code, status.reason);
                StateObjectError::Api { namespace, name, verb, cause }
            }
            other => StateObjectError::Api { namespace, name, verb, cause: other.to_string() },
        }
    }

    /// What the target's ConfigMap holds, within [`READ_TIMEOUT`] once its turn comes (the
    /// wait for a permit is not the API server's slowness, so it does not count).
    pub async fn read(&self, target: &TargetRef) -> Result<Stored, StateObjectError> {
        let name = object_name(target);
        let _permit = self.permits.acquire().await;
        let answer = tokio::time::timeout(READ_TIMEOUT, self.api.get_opt(&name)).await.map_err(|_| {
            StateObjectError::Timeout {
                namespace: self.namespace.clone(),
                name: name.clone(),
                seconds: READ_TIMEOUT.as_secs_f64(),
            }
        })?;
        match answer {
            Ok(Some(configmap)) => {
                // It exists, so its namespace does. (A missing one is not told by a read: the
                // API server answers a GET in a namespace that does not exist as "not found".)
                self.succeeded();
                Ok(stored_in(&configmap, target))
            }
            Ok(None) => Ok(Stored::Absent),
            Err(err) => Err(self.error(&name, "get", err)),
        }
    }

    /// Whether a state ConfigMap could be written here now, without writing one: a dry-run
    /// apply, which the API server checks as a real one (the namespace, the permissions) and
    /// then forgets. The daemon asks at its start, so a missing namespace is said at once, not
    /// only at the first scale.
    pub async fn probe(&self) -> Result<(), StateObjectError> {
        let target = TargetRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: self.namespace.as_str().into(),
            name: "watermarkd-probe".into(),
        };
        self.apply(&target, "{}", PatchParams::apply(FIELD_MANAGER).force().dry_run()).await
    }

    /// Writes `state` as the target's ConfigMap, creating it when missing (a forced
    /// server-side apply: the object is watermarkd's alone).
    pub async fn write(&self, target: &TargetRef, state: &str) -> Result<(), StateObjectError> {
        self.apply(target, state, PatchParams::apply(FIELD_MANAGER).force()).await
    }

    /// Applies the target's ConfigMap holding `state` with `params` (a dry run or not); a
    /// success says the namespace exists.
    async fn apply(&self, target: &TargetRef, state: &str, params: PatchParams) -> Result<(), StateObjectError> {
        let object = object_for(target, &self.namespace, state);
        let name = object_name(target);
        let _permit = self.permits.acquire().await;
        self.api.patch(&name, &params, &Patch::Apply(&object)).await.map_err(|err| self.error(&name, "patch", err))?;
        self.succeeded();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(api_version: &str, kind: &str, namespace: &str, name: &str) -> TargetRef {
        TargetRef { api_version: api_version.into(), kind: kind.into(), namespace: namespace.into(), name: name.into() }
    }

    #[test]
    fn the_name_is_fixed_and_a_valid_configmap_name() {
        let web = target("apps/v1", "Deployment", "prod", "web");
        // Pinned: an upgraded daemon must find what the previous version wrote.
        assert_eq!(target_key(&web), "Deployment.apps prod/web");
        assert_eq!(object_name(&web), object_name(&target("apps/v1beta2", "Deployment", "prod", "web")));
        let name = object_name(&web);
        assert_eq!(name, "watermarkd-state-154919d01bf7c5c8");
        assert!(name.len() <= 63 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    }

    #[test]
    fn each_part_of_the_identity_changes_the_name() {
        let base = object_name(&target("apps/v1", "Deployment", "prod", "web"));
        for other in [
            target("apps/v1", "StatefulSet", "prod", "web"),
            target("apps/v1", "Deployment", "staging", "web"),
            target("apps/v1", "Deployment", "prod", "web2"),
            target("argoproj.io/v1alpha1", "Deployment", "prod", "web"),
            // The separators cannot be shifted to give the same text.
            target("apps/v1", "Deployment", "prod/web", ""),
        ] {
            assert_ne!(object_name(&other), base, "{other:?}");
        }
        assert_eq!(target_key(&target("v1", "ReplicationController", "prod", "web")), "ReplicationController prod/web");
    }

    #[test]
    fn a_configmap_about_another_target_holds_nothing_for_this_one() {
        let web = target("apps/v1", "Deployment", "prod", "web");
        let db = target("apps/v1", "StatefulSet", "prod", "db");
        let written = object_for(&web, "watermarkd", "{\"v\":2}");
        assert_eq!(written.metadata.name.as_deref(), Some(object_name(&web).as_str()));
        assert_eq!(stored_in(&written, &web), Stored::State("{\"v\":2}".into()));
        assert_eq!(stored_in(&written, &db), Stored::OtherTarget(Some("Deployment.apps prod/web".into())));
        assert_eq!(stored_in(&ConfigMap::default(), &web), Stored::OtherTarget(None));
        let mut no_state = written.clone();
        no_state.data.as_mut().map(|d| d.remove(STATE_KEY));
        assert_eq!(stored_in(&no_state, &web), Stored::Absent);
    }
}
