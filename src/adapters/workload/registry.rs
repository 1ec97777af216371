//! The store registry: which watch-backed stores exist and who uses them.
//!
//! One workload store per (kind as the targets name it, namespace) and one pod store per
//! (namespace, label selector), each kept by its own task and shared by every target that
//! needs it; [`Registry`] holds them with the per-target bookkeeping ([`WatchedTarget`]), and
//! releases a store when its last user goes away. `Workloads::watch` and `Workloads::unwatch`
//! are here because they are what adds and removes those users. Kept apart from the reads and
//! writes so that what a store costs and when it stops is in one place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::Resource;
use tokio::sync::watch as channel;

use super::cache::{Overlay, ScaleCache};
use super::compact::{compact, ReadyPod, StoredWorkload, WireWorkload};
use super::discovery::{api_for, Resolved, StoreKey};
use super::error::Request;
use super::object::pod_is_ready;
use super::watch::{follow, publish, AbortOnDrop, StoreStatus, MAX_RETRY_DELAY};
use super::{describe, now, retry_delay, Context, WatchHealth, WorkloadError, Workloads};
use crate::domain::rules::TargetRef;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PodKey {
    namespace: Arc<str>,
    selector: String,
}

/// A workload store as its readers see it.
pub(super) struct WorkloadStore {
    reader: Store<StoredWorkload>,
    pub(super) status: channel::Receiver<StoreStatus>,
    /// How to reach the kind, once discovery has answered.
    resolved: Mutex<Option<Arc<Resolved>>>,
}

impl WorkloadStore {
    pub(super) fn resolved(&self) -> Option<Arc<Resolved>> {
        self.resolved.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(super) fn get(&self, name: &str) -> Option<Arc<StoredWorkload>> {
        self.reader.get(&ObjectRef::new(name))
    }
}

struct StoreEntry {
    store: Arc<WorkloadStore>,
    /// The watched targets of this kind and namespace, by name.
    targets: HashMap<Arc<str>, WatchedTarget>,
    _task: AbortOnDrop,
}

/// What is kept per watched target. The caches exist only where they are used.
#[derive(Default)]
pub(super) struct WatchedTarget {
    /// `watch` calls not yet undone.
    refs: u32,
    /// Set for a target that joined a running store: the store may not have seen its object's
    /// creation yet, so the first time the object is missing the API server is asked (the
    /// old per-name watch listed again for every new name; this asks only on a miss).
    pub(super) unconfirmed: bool,
    /// Custom kinds: the last `/scale` reading.
    pub(super) scale: Option<Box<ScaleCache>>,
    /// Our last scale write, until the store shows it.
    pub(super) overlay: Option<Box<Overlay>>,
    /// The selector of the pod store this target counts ready pods with.
    pods: Option<Box<str>>,
}

pub(super) struct PodStore {
    pub(super) reader: Store<ReadyPod>,
    pub(super) status: channel::Receiver<StoreStatus>,
}

struct PodEntry {
    store: Arc<PodStore>,
    /// Watched targets counting with this selector.
    users: usize,
    _task: AbortOnDrop,
}

/// How to reach a target's kind, or why it cannot be written.
pub(super) fn resolved_kind(store: &WorkloadStore, target: &TargetRef) -> Result<Arc<Resolved>, WorkloadError> {
    let not_read = || WorkloadError::Connection(format!("{} has not been read yet", describe(target)));
    match &*store.status.borrow() {
        StoreStatus::Synced => store.resolved().ok_or_else(not_read),
        StoreStatus::Failed(err) => Err(err.clone()),
        StoreStatus::Starting => Err(not_read()),
    }
}

#[derive(Default)]
pub(super) struct Registry {
    stores: HashMap<StoreKey, StoreEntry>,
    pods: HashMap<PodKey, PodEntry>,
}

impl Registry {
    pub(super) fn target_mut(&mut self, target: &TargetRef) -> Option<&mut WatchedTarget> {
        self.stores.get_mut(&StoreKey::of(target))?.targets.get_mut(&*target.name)
    }

    fn release_pods(&mut self, namespace: &str, selector: &str) {
        let key = PodKey { namespace: namespace.into(), selector: selector.to_string() };
        if let Some(entry) = self.pods.get_mut(&key) {
            entry.users -= 1;
            if entry.users == 0 {
                self.pods.remove(&key);
            }
        }
    }

    /// Stops `target` counting pods, if it did.
    pub(super) fn drop_pods_of(&mut self, target: &TargetRef) {
        if let Some(selector) = self.target_mut(target).and_then(|t| t.pods.take()) {
            self.release_pods(&target.namespace, &selector);
        }
    }
}

impl Workloads {
    pub(super) fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts following `target`: the first target of its kind and namespace starts that
    /// store (resolving the kind, then watching). Idempotent and counted: each `watch` needs
    /// one `unwatch`. Never fails: problems (unknown kind, no `/scale`, forbidden, missing)
    /// are what `read` returns, and are retried in the background, so a target that gets fixed
    /// recovers by itself. Must be called inside a Tokio runtime.
    pub fn watch(&self, target: &TargetRef) {
        let mut registry = self.registry();
        let key = StoreKey::of(target);
        let (entry, joined) = match registry.stores.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => (entry.into_mut(), true),
            std::collections::hash_map::Entry::Vacant(vacant) => {
                let entry = start_workload_store(&self.inner.context, vacant.key().clone());
                (vacant.insert(entry), false)
            }
        };
        let target = entry
            .targets
            .entry(Arc::clone(&target.name))
            .or_insert_with(|| WatchedTarget { unconfirmed: joined, ..WatchedTarget::default() });
        target.refs += 1;
    }

    /// Undoes one `watch`; the last one forgets the target, and the last target of a store
    /// (or of a pod selector) stops it.
    pub fn unwatch(&self, target: &TargetRef) {
        let mut registry = self.registry();
        let key = StoreKey::of(target);
        let Some(entry) = registry.stores.get_mut(&key) else { return };
        let Some(watched) = entry.targets.get_mut(&*target.name) else { return };
        watched.refs -= 1;
        if watched.refs > 0 {
            return;
        }
        let removed = entry.targets.remove(&*target.name);
        if entry.targets.is_empty() {
            registry.stores.remove(&key);
        }
        if let Some(selector) = removed.and_then(|t| t.pods) {
            registry.release_pods(&target.namespace, &selector);
        }
    }

    /// Number of watched targets.
    pub fn len(&self) -> usize {
        self.registry().stores.values().map(|entry| entry.targets.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.registry().stores.is_empty()
    }

    /// Number of running workload stores (watches): one per (kind, namespace) in use.
    pub(crate) fn workload_watches(&self) -> usize {
        self.registry().stores.len()
    }

    /// The health of every watch of the process: the stores' own, and any other that reports
    /// into it (the WPA watches).
    pub fn watch_health(&self) -> Arc<WatchHealth> {
        Arc::clone(&self.inner.context.health)
    }

    /// Whether every store has had its first answer (listed or failed).
    pub fn settled(&self) -> bool {
        let registry = self.registry();
        registry.stores.values().all(|entry| !matches!(*entry.store.status.borrow(), StoreStatus::Starting))
    }

    pub(super) fn store_of(&self, target: &TargetRef) -> Result<Arc<WorkloadStore>, WorkloadError> {
        let registry = self.registry();
        registry
            .stores
            .get(&StoreKey::of(target))
            .filter(|entry| entry.targets.contains_key(&*target.name))
            .map(|entry| Arc::clone(&entry.store))
            .ok_or_else(|| WorkloadError::NotWatched(describe(target)))
    }
}

/// The pod store `target` counts with for `selector`, started if it is the first user;
/// moves the target off the store of its previous selector.
pub(super) fn pod_store(
    registry: &mut Registry,
    context: &Arc<Context>,
    target: &TargetRef,
    selector: &str,
) -> Arc<PodStore> {
    let key = PodKey { namespace: target.namespace.clone(), selector: selector.to_string() };
    let previous = registry.target_mut(target).and_then(|watched| {
        if watched.pods.as_deref() == Some(selector) {
            None
        } else {
            Some(watched.pods.replace(selector.into()))
        }
    });
    match previous {
        // Already counting with this selector.
        None => {
            if let Some(entry) = registry.pods.get(&key) {
                return Arc::clone(&entry.store);
            }
        }
        Some(old) => {
            if let Some(old) = old {
                registry.release_pods(&target.namespace, &old);
            }
        }
    }
    let entry = registry.pods.entry(key).or_insert_with_key(|key| start_pod_store(context, key.clone()));
    entry.users += 1;
    Arc::clone(&entry.store)
}

fn start_workload_store(context: &Arc<Context>, key: StoreKey) -> StoreEntry {
    let (reader, writer) = reflector::store();
    let (sender, status) = channel::channel(StoreStatus::Starting);
    let store = Arc::new(WorkloadStore { reader, status, resolved: Mutex::default() });
    let task = tokio::spawn(run_workload_store(Arc::clone(context), key, Arc::clone(&store), writer, sender));
    StoreEntry { store, targets: HashMap::new(), _task: AbortOnDrop(task) }
}

/// Keeps one workload store: resolves the kind, then watches every object of it in the
/// namespace; resolves again if the kind stops being served.
async fn run_workload_store(
    context: Arc<Context>,
    key: StoreKey,
    store: Arc<WorkloadStore>,
    mut writer: Writer<StoredWorkload>,
    status: channel::Sender<StoreStatus>,
) {
    let mut attempt = 0;
    loop {
        // Boxed: a kube request's future is large.
        let resolved = match Box::pin(context.resolve(&key)).await {
            Ok(resolved) => resolved,
            Err(err) => {
                tracing::warn!(
                    kind = %key.kind,
                    api_version = %key.api_version,
                    namespace = %key.namespace,
                    error = %err,
                    "cannot resolve the kind; retrying"
                );
                publish(&status, StoreStatus::Failed(err));
                tokio::time::sleep(retry_delay(attempt)).await;
                attempt += 1;
                continue;
            }
        };
        *store.resolved.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&resolved));
        let api: Api<WireWorkload> = api_for(&context.client, &resolved, &key.namespace);
        let request = Request {
            verb: "list",
            resource: &resolved.resource.plural,
            api_version: &resolved.resource.api_version,
            namespace: &key.namespace,
            kind: &resolved.resource.kind,
            name: "",
            collection: true,
        };
        let paths = resolved.paths;
        let stream = Box::pin(watcher::watcher(api, watcher::Config::default()));
        let stamp = |object: WireWorkload, reader: &Store<StoredWorkload>| {
            let previous = object.meta().name.as_deref().and_then(|name| reader.get(&ObjectRef::new(name)));
            compact(paths, object, previous.as_deref(), now())
        };
        let stopped = follow(stream, &mut writer, stamp, &status, &context.health, request).await;
        if stopped.listed {
            attempt = 0;
        }
        // The resource type went away (a CRD deleted?): resolve it afresh.
        tracing::warn!(kind = %key.kind, namespace = %key.namespace, error = %stopped.error, "resolving the kind again");
        context.forget(&key);
        tokio::time::sleep(retry_delay(attempt)).await;
        attempt += 1;
    }
}

fn start_pod_store(context: &Arc<Context>, key: PodKey) -> PodEntry {
    let (reader, writer) = reflector::store();
    let (sender, status) = channel::channel(StoreStatus::Starting);
    let store = Arc::new(PodStore { reader, status });
    let task = tokio::spawn(run_pod_store(Arc::clone(context), key, writer, sender));
    PodEntry { store, users: 0, _task: AbortOnDrop(task) }
}

/// Keeps one pod store: the pods of one selector in one namespace, as name and ready flag.
async fn run_pod_store(
    context: Arc<Context>,
    key: PodKey,
    mut writer: Writer<ReadyPod>,
    status: channel::Sender<StoreStatus>,
) {
    let api: Api<Pod> = Api::namespaced(context.client.clone(), &key.namespace);
    let request = Request {
        verb: "list",
        resource: "pods",
        api_version: "v1",
        namespace: &key.namespace,
        kind: "Pod",
        name: "",
        collection: true,
    };
    let reduce = |pod: Pod, _: &Store<ReadyPod>| {
        let ready = pod_is_ready(&pod);
        Some(ReadyPod { name: pod.metadata.name?.into_boxed_str(), ready })
    };
    loop {
        let config = watcher::Config::default().labels(&key.selector);
        let stream = Box::pin(watcher::watcher(api.clone(), config));
        // Returns only if pods were not served, which an API server always does.
        follow(stream, &mut writer, reduce, &status, &context.health, request).await;
        tokio::time::sleep(MAX_RETRY_DELAY).await;
    }
}
