//! Kubernetes workloads (the autoscalers' targets): read scale and readiness, write replicas.
//!
//! - [`connect`] builds a client from `--kubeconfig` / `KUBECONFIG` / in-cluster settings.
//! - [`Workloads`] keeps watch-backed stores of the referenced kinds and serves
//!   [`Workloads::read`] from them; [`Workloads::scale`] patches `/scale` with the
//!   resourceVersion the decision was based on, so a concurrent change is a
//!   [`WorkloadError::Conflict`] rather than an overwrite.
//!
//! # How a target is read
//! The kind is resolved through discovery from `apiVersion` + `kind` (so custom resources work;
//! once per kind, however many targets) and must have a `/scale` subresource. Every object of
//! that kind in the target's namespace is kept in one store (kube's reflector store, with a
//! compact object: see `compact.rs`), shared by all targets of that kind and namespace; the
//! store runs while at least one of them is watched. Then:
//! - Built-in workloads (apps/v1 Deployment, StatefulSet, ReplicaSet; v1 ReplicationController):
//!   their `/scale` maps to fixed fields, read straight from the stored object. A read is a
//!   lookup; no request.
//! - Other kinds (custom resources): the `/scale` field paths live in the CRD, which discovery
//!   does not return (and reading CRDs would need more RBAC). So `/scale` is fetched when a read
//!   finds the stored object at a version it has not fetched `/scale` for, never again for the
//!   same version. A failed fetch is retried on a backoff (1 s doubling to 60 s; at once when
//!   the object changes); reads in between get its error.
//! - Ready replicas: the object's `status.readyReplicas` when it has one (built-in kinds
//!   always do; the API omits it at 0). Otherwise the pods matching the scale's label selector
//!   in the target's namespace are counted from a pod store for that selector, shared by the
//!   targets with the same selector; without a selector, `ready_replicas` is `None`.
//!
//! No task, channel or watch per target: a target is a few words in its store's entry, plus
//! small caches for custom kinds and right after a write. See `watch.rs` for the watches and
//! what happens on errors.
//!
//! # RBAC the daemon needs, per target namespace
//! `list` and `watch` on the target resource; `get` (custom kinds) and `patch` on its `/scale`;
//! `list` and `watch` on pods only for targets without `status.readyReplicas`.

mod compact;
mod error;
mod object;
mod watch;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::discovery::Scope;
use kube::core::GroupVersionKind;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Config, Resource};
use serde_json::json;
use tokio::sync::watch as channel;
use tokio::time::Instant;
use watermarkd_engine::Timestamp;

pub use error::WorkloadError;

use crate::rules::TargetRef;
use compact::{compact, stamp_spec_change, ReadyPod, StoredWorkload, WireWorkload};
use error::Request;
pub use object::Marks;
use object::{kind_paths, pod_is_ready, split_api_version, KindPaths};
pub use watch::{backoff as watch_backoff, next as next_event, Retrying as RetryingWatch, WatchHealth};
use watch::{follow, publish, AbortOnDrop, StoreStatus, MAX_RETRY_DELAY};

/// The field manager of scale writes; [`Marks::scaled_at`] reads its `managedFields` entry.
pub(crate) const FIELD_MANAGER: &str = "watermarkd";
/// The annotation where versions before the state ConfigMaps (`crate::state::configmap`) kept
/// a rules-file autoscaler's state on its target. Still read (the cache keeps it), never written.
pub const STATE_ANNOTATION: &str = "watermarkd.io/state";

/// Builds a client. Where the settings come from, first match wins:
/// 1. `kubeconfig` (`--kubeconfig`), with `context` (`--context`) or its current context;
/// 2. the `KUBECONFIG` variable, with `context`;
/// 3. in-cluster (the pod's service account) when `KUBERNETES_SERVICE_HOST` is set and no
///    `context` was asked for;
/// 4. `~/.kube/config`, with `context`.
///
/// The client makes each request once. kube's default retry layer answers a 429, 503 or 504
/// by waiting the `Retry-After` the API server asks for (10 s for a custom resource it is not
/// serving yet, as right after a restart) and retries up to 15 times, backing off up to
/// 1000 s: hidden waits that held the WPA watch for 10 s after an API server restart and could
/// hold a lease renewal past its deadline. Every caller retries on its own bounded schedule
/// instead (watches at most 5 s apart, evaluations at their interval, the Lease at its retry
/// period).
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, WorkloadError> {
    crate::backend::ensure_crypto_provider();
    let mut config = client_config(kubeconfig, context).await?;
    config.default_retry = false;
    Client::try_from(config).map_err(|e| WorkloadError::Config(e.to_string()))
}

async fn client_config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Config, WorkloadError> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..KubeConfigOptions::default() };
    let config = if let Some(path) = kubeconfig {
        let file =
            Kubeconfig::read_from(path).map_err(|e| WorkloadError::Config(format!("{}: {e}", path.display())))?;
        Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|e| WorkloadError::Config(format!("{}: {e}", path.display())))?
    } else if context.is_none()
        && std::env::var_os("KUBECONFIG").is_none()
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    {
        Config::incluster().map_err(|e| WorkloadError::Config(format!("in-cluster configuration: {e}")))?
    } else {
        Config::from_kubeconfig(&options).await.map_err(|e| WorkloadError::Config(format!("kubeconfig: {e}")))?
    };
    Ok(config)
}

/// The scale of a target as the cache last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleReading {
    /// Desired replicas (`/scale` `spec.replicas`).
    pub spec_replicas: u32,
    /// Current replicas (`/scale` `status.replicas`).
    pub status_replicas: u32,
    /// Ready replicas: `status.readyReplicas`, or ready pods counted through the selector, or
    /// `None` when neither is available.
    pub ready_replicas: Option<u32>,
    /// The label selector of the target's pods (`/scale` `status.selector`), if it has one.
    pub selector: Option<String>,
    /// The object's resourceVersion this reading is from. [`Workloads::scale`] sends it back.
    pub resource_version: String,
    /// watermarkd's persisted state and last scale write, from the object's metadata.
    pub marks: Marks,
    /// When this process first saw `spec_replicas` at its current value, if it saw another
    /// value before (`None` when the value came with the first reading: its age is unknown).
    /// A write can land long after it was sent (etcd stalled, then resumed), so this, not the
    /// write's own time, is when a change became visible.
    pub spec_changed_at: Option<watermarkd_engine::Timestamp>,
}

fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

/// A resolved kind: how to reach it and how to read it.
#[derive(Debug)]
struct Resolved {
    resource: ApiResource,
    namespaced: bool,
    paths: KindPaths,
}

/// A workload store's identity: the kind as the targets name it, and the namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct StoreKey {
    api_version: Arc<str>,
    kind: Arc<str>,
    namespace: Arc<str>,
}

impl StoreKey {
    fn of(target: &TargetRef) -> Self {
        StoreKey {
            api_version: target.api_version.clone(),
            kind: target.kind.clone(),
            namespace: target.namespace.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PodKey {
    namespace: Arc<str>,
    selector: String,
}

fn not_found(target: &TargetRef) -> WorkloadError {
    WorkloadError::NotFound {
        kind: target.kind.to_string(),
        namespace: target.namespace.to_string(),
        name: target.name.to_string(),
    }
}

fn describe(target: &TargetRef) -> String {
    format!("{} {}/{} ({})", target.kind, target.namespace, target.name, target.api_version)
}

/// A workload store as its readers see it.
struct WorkloadStore {
    reader: Store<StoredWorkload>,
    status: channel::Receiver<StoreStatus>,
    /// How to reach the kind, once discovery has answered.
    resolved: Mutex<Option<Arc<Resolved>>>,
}

impl WorkloadStore {
    fn resolved(&self) -> Option<Arc<Resolved>> {
        self.resolved.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn get(&self, name: &str) -> Option<Arc<StoredWorkload>> {
        self.reader.get(&ObjectRef::new(name))
    }
}

struct StoreEntry {
    store: Arc<WorkloadStore>,
    /// The watched targets of this kind and namespace, by name.
    targets: HashMap<Arc<str>, Target>,
    _task: AbortOnDrop,
}

/// What is kept per watched target. The caches exist only where they are used.
#[derive(Default)]
struct Target {
    /// `watch` calls not yet undone.
    refs: u32,
    /// Set for a target that joined a running store: the store may not have seen its object's
    /// creation yet, so the first time the object is missing the API server is asked (the
    /// old per-name watch listed again for every new name; this asks only on a miss).
    unconfirmed: bool,
    /// Custom kinds: the last `/scale` reading.
    scale: Option<Box<ScaleCache>>,
    /// Our last scale write, until the store shows it.
    overlay: Option<Box<Overlay>>,
    /// The selector of the pod store this target counts ready pods with.
    pods: Option<Box<str>>,
}

/// The last `/scale` read of a custom kind.
struct ScaleCache {
    /// The stored object's resourceVersion it was read for.
    version: Box<str>,
    outcome: Result<ScaleOf, Failure>,
    /// The replica count of the last good reading and when it was first seen, kept across
    /// versions and failures (see `ScaleReading::spec_changed_at`).
    last_spec: Option<(u32, Option<Timestamp>)>,
    /// Failed reads in a row.
    attempt: u32,
}

#[derive(Clone)]
struct ScaleOf {
    spec_replicas: u32,
    status_replicas: u32,
    selector: Option<String>,
    resource_version: String,
    spec_changed_at: Option<Timestamp>,
}

struct Failure {
    error: WorkloadError,
    retry_at: Instant,
}

/// A scale write served to reads before its watch event arrives, but only while the store
/// still holds the version the write was based on (never over something newer).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Overlay {
    based_on: Box<str>,
    written: String,
    replicas: u32,
    at: Timestamp,
}

impl Overlay {
    /// Applies the write to a reading of `object`; `false` when the object moved on, and the
    /// overlay is done with.
    fn apply(&self, object: &StoredWorkload, reading: &mut ScaleReading) -> bool {
        if object.resource_version != self.based_on {
            return false;
        }
        reading.spec_replicas = self.replicas;
        reading.resource_version = self.written.clone();
        reading.spec_changed_at = Some(self.at);
        true
    }
}

struct PodStore {
    reader: Store<ReadyPod>,
    status: channel::Receiver<StoreStatus>,
}

struct PodEntry {
    store: Arc<PodStore>,
    /// Watched targets counting with this selector.
    users: usize,
    _task: AbortOnDrop,
}

#[derive(Default)]
struct Registry {
    stores: HashMap<StoreKey, StoreEntry>,
    pods: HashMap<PodKey, PodEntry>,
}

impl Registry {
    fn target_mut(&mut self, target: &TargetRef) -> Option<&mut Target> {
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
    fn drop_pods_of(&mut self, target: &TargetRef) {
        if let Some(selector) = self.target_mut(target).and_then(|t| t.pods.take()) {
            self.release_pods(&target.namespace, &selector);
        }
    }
}

/// (apiVersion, kind), interned.
type KindKey = (Arc<str>, Arc<str>);

/// What the store tasks share. Holds no registry, so dropping `Workloads` stops them.
struct Context {
    client: Client,
    health: Arc<WatchHealth>,
    /// Discovery results by (apiVersion, kind). Only kinds that resolved with a `/scale`.
    kinds: Mutex<HashMap<KindKey, Arc<Resolved>>>,
    /// Held while a kind is being discovered: the stores of one kind in many namespaces make
    /// one discovery request, not one each.
    resolving: tokio::sync::Mutex<()>,
}

struct Inner {
    context: Arc<Context>,
    registry: Mutex<Registry>,
    sync_timeout: Duration,
}

/// The registry of watched targets. Cheap to clone; every clone shares the stores. Dropping
/// the last clone stops every watch.
#[derive(Clone)]
pub struct Workloads {
    inner: Arc<Inner>,
}

impl Workloads {
    /// How long `read` waits for a target's first answer from the API server by default.
    pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

    pub fn new(client: Client) -> Self {
        Self::with_sync_timeout(client, Self::DEFAULT_SYNC_TIMEOUT)
    }

    /// Like `new`, with how long `read` waits for a newly watched target's first state.
    pub fn with_sync_timeout(client: Client, sync_timeout: Duration) -> Self {
        let context = Arc::new(Context {
            client,
            health: Arc::new(WatchHealth::default()),
            kinds: Mutex::default(),
            resolving: tokio::sync::Mutex::new(()),
        });
        Workloads { inner: Arc::new(Inner { context, registry: Mutex::default(), sync_timeout }) }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
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
            .or_insert_with(|| Target { unconfirmed: joined, ..Target::default() });
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
    pub fn workload_watches(&self) -> usize {
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

    fn store_of(&self, target: &TargetRef) -> Result<Arc<WorkloadStore>, WorkloadError> {
        let registry = self.registry();
        registry
            .stores
            .get(&StoreKey::of(target))
            .filter(|entry| entry.targets.contains_key(&*target.name))
            .map(|entry| Arc::clone(&entry.store))
            .ok_or_else(|| WorkloadError::NotWatched(describe(target)))
    }

    fn no_answer(&self, target: &TargetRef) -> WorkloadError {
        WorkloadError::Connection(format!(
            "no answer from the API server about {} within {:?}",
            describe(target),
            self.inner.sync_timeout
        ))
    }

    /// The target's scale from the stores. Waits (up to the sync timeout) only while its
    /// store has not listed yet; afterwards it makes no request for built-in kinds, and for
    /// custom kinds only a `/scale` GET when the object changed since the last one.
    pub async fn read(&self, target: &TargetRef) -> Result<ScaleReading, WorkloadError> {
        let deadline = Instant::now() + self.inner.sync_timeout;
        let store = self.store_of(target)?;
        match wait_listed(&store.status, deadline).await {
            Waited::Listed => {}
            Waited::Failed(err) => return Err(err),
            Waited::TimedOut => return Err(self.no_answer(target)),
            Waited::Stopped => return Err(WorkloadError::NotWatched(describe(target))),
        }
        let resolved = store.resolved().ok_or_else(|| self.no_answer(target))?;
        let object = self.lookup(&store, &resolved, target, deadline).await?;
        let mut reading = match resolved.paths {
            KindPaths::Builtin(_) => ScaleReading {
                spec_replicas: object.spec_replicas,
                status_replicas: object.status_replicas,
                ready_replicas: object.ready_replicas,
                selector: object.selector.as_deref().map(str::to_string),
                resource_version: object.resource_version.to_string(),
                marks: object.marks.clone(),
                spec_changed_at: object.seen,
            },
            KindPaths::Custom => self.read_custom(&resolved, target, &object).await?,
        };
        let pods = {
            let mut registry = self.registry();
            let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
            watched.unconfirmed = false;
            if let Some(overlay) = &watched.overlay {
                if !overlay.apply(&object, &mut reading) {
                    watched.overlay = None;
                }
            }
            match (&reading.ready_replicas, &reading.selector) {
                (None, Some(selector)) => Some(pod_store(&mut registry, &self.inner.context, target, selector)),
                _ => {
                    registry.drop_pods_of(target);
                    None
                }
            }
        };
        if let Some(pods) = pods {
            match wait_listed(&pods.status, deadline).await {
                Waited::Listed => {}
                Waited::Failed(err) => return Err(err),
                Waited::TimedOut => return Err(self.no_answer(target)),
                // Its last user went away meanwhile (unwatched, or a new selector).
                Waited::Stopped => {
                    return Err(WorkloadError::Connection(format!(
                        "the pod selector of {} changed while reading; read again",
                        describe(target)
                    )))
                }
            }
            let ready = pods.reader.state().iter().filter(|pod| pod.ready).count();
            reading.ready_replicas = Some(u32::try_from(ready).unwrap_or(u32::MAX));
        }
        Ok(reading)
    }

    /// The target's object from its listed store. A miss is `NotFound`, except the first one
    /// of a target that joined a running store, which asks the API server whether the object
    /// exists and, if it does, waits (until `deadline`) for the store to show it.
    async fn lookup(
        &self,
        store: &WorkloadStore,
        resolved: &Resolved,
        target: &TargetRef,
        deadline: Instant,
    ) -> Result<Arc<StoredWorkload>, WorkloadError> {
        if let Some(object) = store.get(&target.name) {
            return Ok(object);
        }
        let unconfirmed = {
            let mut registry = self.registry();
            let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
            watched.overlay = None;
            let unconfirmed = watched.unconfirmed;
            if !unconfirmed {
                registry.drop_pods_of(target);
            }
            unconfirmed
        };
        if !unconfirmed {
            return Err(not_found(target));
        }
        if Box::pin(self.list_version(resolved, target)).await?.is_none() {
            let mut registry = self.registry();
            if let Some(watched) = registry.target_mut(target) {
                watched.unconfirmed = false;
            }
            registry.drop_pods_of(target);
            return Err(not_found(target));
        }
        loop {
            if let Some(object) = store.get(&target.name) {
                return Ok(object);
            }
            if Instant::now() >= deadline {
                return Err(self.no_answer(target));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A custom kind's reading: `/scale` as last read for this version of the object, or read
    /// now (once per version; after a failure, again when the backoff has passed).
    async fn read_custom(
        &self,
        resolved: &Resolved,
        target: &TargetRef,
        object: &StoredWorkload,
    ) -> Result<ScaleReading, WorkloadError> {
        let reading = |scale: ScaleOf| ScaleReading {
            spec_replicas: scale.spec_replicas,
            status_replicas: scale.status_replicas,
            ready_replicas: object.ready_replicas,
            selector: scale.selector,
            resource_version: scale.resource_version,
            marks: object.marks.clone(),
            spec_changed_at: scale.spec_changed_at,
        };
        let (last_spec, attempt) = {
            let mut registry = self.registry();
            let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
            match watched.scale.as_deref() {
                Some(cache) if cache.version == object.resource_version => match &cache.outcome {
                    Ok(scale) => return Ok(reading(scale.clone())),
                    Err(failure) if Instant::now() < failure.retry_at => return Err(failure.error.clone()),
                    Err(_) => (cache.last_spec, cache.attempt),
                },
                Some(cache) => (cache.last_spec, cache.attempt),
                None => (None, 0),
            }
        };
        // Boxed: a kube request's future is large.
        let fetched = Box::pin(get_scale(&self.inner.context.client, resolved, target)).await;
        let outcome = fetched.map(|mut scale| {
            // The arrival of the version whose /scale showed the change: the closest to when
            // the change became visible that a read-time fetch can tell.
            let at = object.seen.unwrap_or_else(now);
            scale.spec_changed_at = stamp_spec_change(scale.spec_replicas, last_spec, at);
            scale
        });
        let mut registry = self.registry();
        let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
        let version = object.resource_version.clone();
        match outcome {
            Ok(scale) => {
                let last_spec = Some((scale.spec_replicas, scale.spec_changed_at));
                watched.scale =
                    Some(Box::new(ScaleCache { version, outcome: Ok(scale.clone()), last_spec, attempt: 0 }));
                Ok(reading(scale))
            }
            Err(error) => {
                tracing::warn!(workload = %describe(target), error = %error, "cannot read /scale; retrying");
                let failure = Failure { error: error.clone(), retry_at: Instant::now() + retry_delay(attempt) };
                watched.scale =
                    Some(Box::new(ScaleCache { version, outcome: Err(failure), last_spec, attempt: attempt + 1 }));
                Err(error)
            }
        }
    }

    /// Sets the target's replicas to `replicas` with one merge patch of `/scale` carrying
    /// `from.resource_version`: if the object changed since `from` was read, the API server
    /// answers 409 and this returns [`WorkloadError::Conflict`] without writing anything. The
    /// caller then reads again and decides again. Any change counts, a status update by the
    /// workload's controller included (`/scale` shares the object's resourceVersion), so a
    /// caller should expect the odd conflict during rollouts and simply retry with a fresh
    /// reading. No request when `replicas` equals `from.spec_replicas`.
    pub async fn scale(&self, target: &TargetRef, from: &ScaleReading, replicas: u32) -> Result<(), WorkloadError> {
        let store = self.store_of(target)?;
        if replicas == from.spec_replicas {
            return Ok(());
        }
        if from.resource_version.is_empty() {
            // Without a version the patch would overwrite whatever is there.
            return Err(WorkloadError::Api {
                code: 0,
                message: "refusing to scale from a reading without a resourceVersion".to_string(),
            });
        }
        let resolved = resolved_kind(&store, target)?;
        let api: Api<DynamicObject> = api_for(&self.inner.context.client, &resolved, &target.namespace);
        let resource = format!("{}/scale", resolved.resource.plural);
        let request = Request::for_target("patch", &resource, target);
        let patch = json!({
            "metadata": { "resourceVersion": from.resource_version },
            "spec": { "replicas": replicas },
        });
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() };
        match api.patch_scale(&target.name, &params, &Patch::Merge(&patch)).await {
            Ok(scale) => {
                let written = scale.metadata.resource_version.unwrap_or_default();
                let based_on_current =
                    store.get(&target.name).is_some_and(|object| *object.resource_version == *from.resource_version);
                if based_on_current && !written.is_empty() {
                    if let Some(watched) = self.registry().target_mut(target) {
                        watched.overlay = Some(Box::new(Overlay {
                            based_on: from.resource_version.clone().into_boxed_str(),
                            written,
                            replicas,
                            at: now(),
                        }));
                    }
                }
                tracing::info!(workload = %describe(target), from = from.spec_replicas, to = replicas, "scaled");
                Ok(())
            }
            Err(err) => Err(match request.error(&err) {
                WorkloadError::Conflict { kind, namespace, name, .. } => {
                    WorkloadError::Conflict { kind, namespace, name, resource_version: from.resource_version.clone() }
                }
                other => other,
            }),
        }
    }

    /// The object's resourceVersion as the API server has it now (a quorum read, not the
    /// store): after a write whose outcome is unknown, it tells whether anything changed.
    /// A list of the one name, so that it needs no verb beyond the watch's.
    pub async fn current_version(&self, target: &TargetRef) -> Result<String, WorkloadError> {
        let resolved = resolved_kind(&*self.store_of(target)?, target)?;
        self.list_version(&resolved, target).await?.ok_or_else(|| not_found(target))
    }

    async fn list_version(&self, resolved: &Resolved, target: &TargetRef) -> Result<Option<String>, WorkloadError> {
        let api: Api<DynamicObject> = api_for(&self.inner.context.client, resolved, &target.namespace);
        let request = Request::for_target("list", &resolved.resource.plural, target);
        let params = ListParams::default().fields(&format!("metadata.name={}", target.name));
        let list = api.list_metadata(&params).await.map_err(|err| request.error(&err))?;
        Ok(list.items.into_iter().next().map(|object| object.metadata.resource_version.unwrap_or_default()))
    }
}

/// How a wait for a store's first list ended.
enum Waited {
    Listed,
    Failed(WorkloadError),
    TimedOut,
    /// The store was stopped meanwhile.
    Stopped,
}

async fn wait_listed(status: &channel::Receiver<StoreStatus>, deadline: Instant) -> Waited {
    let mut status = status.clone();
    let answered = tokio::time::timeout_at(deadline, status.wait_for(|s| !matches!(s, StoreStatus::Starting)))
        .await
        .map(|answer| answer.map(|current| current.clone()));
    match answered {
        Ok(Ok(StoreStatus::Synced)) => Waited::Listed,
        Ok(Ok(StoreStatus::Failed(err))) => Waited::Failed(err),
        Ok(Ok(StoreStatus::Starting)) | Err(_) => Waited::TimedOut,
        Ok(Err(_)) => Waited::Stopped,
    }
}

/// How to reach a target's kind, or why it cannot be written.
fn resolved_kind(store: &WorkloadStore, target: &TargetRef) -> Result<Arc<Resolved>, WorkloadError> {
    let not_read = || WorkloadError::Connection(format!("{} has not been read yet", describe(target)));
    match &*store.status.borrow() {
        StoreStatus::Synced => store.resolved().ok_or_else(not_read),
        StoreStatus::Failed(err) => Err(err.clone()),
        StoreStatus::Starting => Err(not_read()),
    }
}

fn api_for<K>(client: &Client, resolved: &Resolved, namespace: &str) -> Api<K>
where
    K: Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    if resolved.namespaced {
        Api::namespaced_with(client.clone(), namespace, &resolved.resource)
    } else {
        Api::all_with(client.clone(), &resolved.resource)
    }
}

/// Reads `/scale` of a custom kind.
async fn get_scale(client: &Client, resolved: &Resolved, target: &TargetRef) -> Result<ScaleOf, WorkloadError> {
    let api: Api<DynamicObject> = api_for(client, resolved, &target.namespace);
    let resource = format!("{}/scale", resolved.resource.plural);
    let request = Request::for_target("get", &resource, target);
    let scale = api.get_scale(&target.name).await.map_err(|e| request.error(&e))?;
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let status = scale.status.unwrap_or_default();
    Ok(ScaleOf {
        spec_replicas: count(scale.spec.and_then(|s| s.replicas)),
        status_replicas: count(Some(status.replicas)),
        selector: status.selector.filter(|s| !s.is_empty()),
        resource_version: scale.metadata.resource_version.unwrap_or_default(),
        spec_changed_at: None,
    })
}

/// The pod store `target` counts with for `selector`, started if it is the first user;
/// moves the target off the store of its previous selector.
fn pod_store(registry: &mut Registry, context: &Arc<Context>, target: &TargetRef, selector: &str) -> Arc<PodStore> {
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

impl Context {
    /// Resolves a kind through discovery (cached once it resolved with a `/scale`).
    async fn resolve(&self, key: &StoreKey) -> Result<Arc<Resolved>, WorkloadError> {
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

    fn forget(&self, key: &StoreKey) {
        let kind_key = (key.api_version.clone(), key.kind.clone());
        self.kinds.lock().unwrap_or_else(PoisonError::into_inner).remove(&kind_key);
    }
}

/// Retry delays after a request of a store or target failed (discovery, `/scale` of a custom
/// kind): 1 s doubling to 60 s. Watches retry on their own policy (`watch.rs`).
fn retry_delay(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(6)).min(Duration::from_secs(60))
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    fn stored(version: &str, spec: u32, seen: Option<Timestamp>) -> StoredWorkload {
        StoredWorkload {
            name: "web".into(),
            resource_version: version.into(),
            spec_replicas: spec,
            status_replicas: spec,
            ready_replicas: Some(spec),
            selector: Some("app=web".into()),
            marks: Marks::default(),
            seen,
        }
    }

    fn reading_of(object: &StoredWorkload) -> ScaleReading {
        ScaleReading {
            spec_replicas: object.spec_replicas,
            status_replicas: object.status_replicas,
            ready_replicas: object.ready_replicas,
            selector: object.selector.as_deref().map(str::to_string),
            resource_version: object.resource_version.to_string(),
            marks: object.marks.clone(),
            spec_changed_at: object.seen,
        }
    }

    #[test]
    fn our_write_is_served_only_while_the_store_holds_the_version_it_was_based_on() {
        let overlay = Overlay { based_on: "10".into(), written: "11".into(), replicas: 6, at: t(500) };
        let before = stored("10", 4, Some(t(100)));
        let mut reading = reading_of(&before);
        assert!(overlay.apply(&before, &mut reading));
        assert_eq!(
            (reading.spec_replicas, reading.resource_version.as_str(), reading.spec_changed_at),
            (6, "11", Some(t(500)))
        );
        assert_eq!(reading.status_replicas, 4, "only what the write changed");
        // The watch event of the write, or anything newer: the store's version wins.
        let after = stored("11", 6, Some(t(510)));
        let mut reading = reading_of(&after);
        assert!(!overlay.apply(&after, &mut reading));
        assert_eq!(reading, reading_of(&after));
        let other = stored("12", 9, Some(t(520)));
        let mut reading = reading_of(&other);
        assert!(!overlay.apply(&other, &mut reading));
        assert_eq!(reading.spec_replicas, 9);
    }

    #[test]
    fn a_failed_request_is_retried_after_one_second_doubling_to_a_minute() {
        let delays: Vec<u64> = (0..9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// A Deployment as a cluster holds it: managed fields, a pod template, conditions.
    fn deployment(i: usize) -> serde_json::Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": format!("web-{i}"), "namespace": "bench", "uid": format!("5c1e0f5e-0000-4000-8000-{i:012}"),
                "resourceVersion": format!("{}", 100_000 + i), "generation": 3,
                "labels": { "app": format!("web-{i}") },
                "annotations": { "deployment.kubernetes.io/revision": "1" },
                "managedFields": [
                    { "manager": "kubectl", "operation": "Update", "time": "2024-01-01T00:00:00Z",
                      "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:replicas": {}, "f:template": {} } } },
                    { "manager": "watermarkd", "operation": "Update", "subresource": "scale",
                      "time": "2024-01-02T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:replicas": {} } } },
                ],
            },
            "spec": {
                "replicas": 3,
                "selector": { "matchLabels": { "app": format!("web-{i}") } },
                "template": {
                    "metadata": { "labels": { "app": format!("web-{i}") } },
                    "spec": { "containers": [{ "name": "web", "image": "registry.k8s.io/pause:3.9",
                        "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } } }] },
                },
            },
            "status": { "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "availableReplicas": 3,
                "conditions": [{ "type": "Available", "status": "True", "reason": "MinimumReplicasAvailable" }] },
        })
    }

    const OBJECTS: usize = 10_000;

    /// The cost of one stored Deployment, measured as the heap a store of 10,000 keeps (the
    /// map, its keys, the objects), and what `ObjectRef`, the key, costs inline.
    #[test]
    fn a_stored_deployment_costs_a_few_hundred_bytes() {
        let wire: Vec<String> = (0..OBJECTS).map(|i| deployment(i).to_string()).collect();
        let paths = KindPaths::Builtin(object::SelectorShape::LabelSelector);
        let (bytes, allocations, store) = heap::retained(|| {
            let (reader, mut writer) = reflector::store::<StoredWorkload>();
            for text in &wire {
                let object: WireWorkload = serde_json::from_str(text).expect("decodes");
                let name = object.meta().name.clone().expect("named");
                let previous = reader.get(&ObjectRef::new(&name));
                let stored = compact(paths, object, previous.as_deref(), t(1)).expect("named");
                writer.apply_watcher_event(&watcher::Event::Apply(stored));
            }
            (reader, writer)
        });
        assert_eq!(store.0.len(), OBJECTS);
        let per_object = bytes / OBJECTS as isize;
        let whole: DynamicObject = serde_json::from_str(&wire[0]).expect("decodes");
        let (whole_bytes, _, whole) = heap::retained(|| Arc::new(whole.clone()));
        drop(whole);
        println!(
            "per stored Deployment: {per_object} bytes in {:.1} allocations (StoredWorkload {} B inline, \
             ObjectRef key {} B inline; with an ApiResource dynamic type it would be {} B plus five Strings); \
             one DynamicObject of the same Deployment: {whole_bytes} bytes",
            allocations as f64 / OBJECTS as f64,
            std::mem::size_of::<StoredWorkload>(),
            std::mem::size_of::<ObjectRef<StoredWorkload>>(),
            std::mem::size_of::<ObjectRef<DynamicObject>>(),
        );
        assert!(per_object < 400, "{per_object} bytes per stored object");
    }

    /// The cost of one watched target: 10,000 targets of one kind in one namespace, through
    /// the public API (one store, its task, and the targets' entries).
    #[tokio::test(flavor = "current_thread")]
    async fn a_watched_target_costs_well_under_two_hundred_bytes() {
        let config = Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = Client::try_from(config).expect("a client");
        let targets: Vec<TargetRef> = (0..OBJECTS)
            .map(|i| TargetRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "bench".into(),
                name: format!("web-{i}").into(),
            })
            .collect();
        let workloads = Workloads::new(client);
        let (bytes, allocations, ()) = heap::retained(|| targets.iter().for_each(|target| workloads.watch(target)));
        assert_eq!((workloads.len(), workloads.workload_watches()), (OBJECTS, 1));
        let per_target = bytes / OBJECTS as isize;
        println!(
            "per watched target: {per_target} bytes in {:.2} allocations (one store and its task included)",
            allocations as f64 / OBJECTS as f64
        );
        assert!(per_target < 200, "{per_target} bytes per target");
        let (freed, _, ()) = heap::retained(|| targets.iter().for_each(|target| workloads.unwatch(target)));
        assert!(workloads.is_empty());
        assert!(freed <= -bytes * 9 / 10, "unwatch gives it back: {freed} of {bytes}");
    }

    /// An API server that answers every request as kube-apiserver answers one for a custom
    /// resource it does not serve yet: 503 with `Retry-After: 10`.
    async fn unavailable_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut chunk).await {
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            buffer.drain(..end + 4);
                            counted.fetch_add(1, Ordering::SeqCst);
                            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server is currently unable to handle the request","reason":"ServiceUnavailable","code":503}"#;
                            let answer = format!(
                                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 10\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if socket.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, requests)
    }

    #[tokio::test]
    async fn a_503_with_retry_after_is_returned_at_once_not_waited_out_inside_the_client() {
        let (url, requests) = unavailable_server().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{ "name": "c", "cluster": { "server": url } }],
            "users": [{ "name": "u", "user": { "token": "t" } }],
            "contexts": [{ "name": "c", "context": { "cluster": "c", "user": "u" } }],
            "current-context": "c",
        });
        std::fs::write(&path, kubeconfig.to_string()).expect("write kubeconfig");
        let client = connect(Some(&path), None).await.expect("a client");
        let api: Api<DynamicObject> =
            Api::all_with(client, &ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()));
        let answer = tokio::time::timeout(Duration::from_secs(5), api.list(&kube::api::ListParams::default())).await;
        let Ok(result) = answer else { panic!("no answer within 5 s: the client waited out the Retry-After") };
        assert!(matches!(result, Err(kube::Error::Api(ref status)) if status.code == 503), "{result:?}");
        assert_eq!(requests.load(Ordering::SeqCst), 1, "one request, no hidden retries");
    }
}

/// Heap accounting for the memory tests: every allocation of the test binary goes through
/// here, and the bytes requested and freed on the current thread are summed while a thread
/// counts (so tests running beside it on other threads do not disturb its numbers).
#[cfg(test)]
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        static COUNTING: Cell<bool> = const { Cell::new(false) };
        static NET: Cell<isize> = const { Cell::new(0) };
        static ALLOCATIONS: Cell<isize> = const { Cell::new(0) };
    }

    fn add(bytes: isize, allocations: isize) {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            let _ = NET.try_with(|net| net.set(net.get() + bytes));
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + allocations));
        }
    }

    // SAFETY: every call is passed on to the system allocator unchanged; the counters are
    // const-initialised thread-locals without destructors, which never allocate.
    #[expect(unsafe_code, reason = "a global allocator is an unsafe trait; counting is how the test measures memory")]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as the caller promised for `layout`.
            let pointer = unsafe { System.alloc(layout) };
            if !pointer.is_null() {
                add(layout.size() as isize, 1);
            }
            pointer
        }

        unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
            // SAFETY: `pointer` came from `alloc` with this `layout`.
            unsafe { System.dealloc(pointer, layout) };
            add(-(layout.size() as isize), -1);
        }
    }

    #[global_allocator]
    static COUNTING_ALLOCATOR: Counting = Counting;

    /// Bytes and allocations still held from what `f` allocated on this thread, and `f`'s result.
    pub(super) fn retained<T>(f: impl FnOnce() -> T) -> (isize, isize, T) {
        let before = (NET.with(Cell::get), ALLOCATIONS.with(Cell::get));
        COUNTING.with(|c| c.set(true));
        let value = f();
        COUNTING.with(|c| c.set(false));
        (NET.with(Cell::get) - before.0, ALLOCATIONS.with(Cell::get) - before.1, value)
    }
}
