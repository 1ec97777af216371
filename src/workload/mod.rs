//! Kubernetes workloads (the autoscalers' targets): read scale and readiness, write replicas.
//!
//! - [`connect`] builds a client from `--kubeconfig` / `KUBECONFIG` / in-cluster settings.
//! - [`Workloads`] keeps watch-backed caches of the referenced objects and serves
//!   [`Workloads::read`] from them; [`Workloads::scale`] patches `/scale` with the resourceVersion
//!   the decision was based on, so a concurrent change is a [`WorkloadError::Conflict`] rather
//!   than an overwrite.
//!
//! # How a target is read
//! The kind is resolved through discovery from `apiVersion` + `kind` (so custom resources work)
//! and must have a `/scale` subresource. Then:
//! - Built-in workloads (apps/v1 Deployment, StatefulSet, ReplicaSet; v1 ReplicationController):
//!   their `/scale` maps to fixed fields, read straight from the watched object. A read is a
//!   cache lookup; no request.
//! - Other kinds (custom resources): the `/scale` field paths live in the CRD, which discovery
//!   does not return (and reading CRDs would need more RBAC). So `/scale` is fetched once per
//!   change of the watched object, never per read.
//! - Ready replicas: the object's `status.readyReplicas` when it has one (built-in kinds
//!   always do; the API omits it at 0). Otherwise the pods matching the scale's label selector
//!   in the target's namespace are watched (one selector-scoped watch for that target only)
//!   and the Ready ones counted; without a selector, `ready_replicas` is `None`.
//!
//! See `watch.rs` for how the watches are shared and what happens on errors.
//!
//! # RBAC the daemon needs, per target namespace
//! `list` and `watch` on the target resource; `get` (custom kinds) and `patch` on its `/scale`;
//! `list` and `watch` on pods only for targets without `status.readyReplicas`.

mod error;
mod object;
mod watch;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::discovery::Scope;
use kube::core::GroupVersionKind;
use kube::{Client, Config};
use serde_json::json;
use tokio::sync::watch as channel;

pub use error::WorkloadError;

use crate::rules::TargetRef;
use error::Request;
pub use object::Marks;
use object::{kind_paths, split_api_version, KindPaths, ObjectInfo};
pub use watch::{backoff as watch_backoff, next as next_event, Retrying as RetryingWatch, WatchHealth};
use watch::{AbortOnDrop, GroupSpec, Groups, ObjState, PodState, PodWatch};

/// The field manager named in the managed fields of every write.
/// The field manager of scale writes; [`Marks::scaled_at`] reads its `managedFields` entry.
pub(crate) const FIELD_MANAGER: &str = "watermarkd";
/// The field manager of state annotation writes, separate so they do not move `scaled_at`.
const STATE_FIELD_MANAGER: &str = "watermarkd-state";
/// The annotation holding an autoscaler's persisted state on its target (rules-file mode).
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

/// Stamps `reading` with when its replica count was first seen, given the previous reading's
/// count and stamp.
fn stamp_spec_change(reading: &mut ScaleReading, previous: Option<(u32, Option<watermarkd_engine::Timestamp>)>) {
    reading.spec_changed_at = match previous {
        Some((spec, at)) if spec == reading.spec_replicas => at,
        Some(_) => Some(watermarkd_engine::Timestamp::from_system_time(std::time::SystemTime::now())),
        None => None,
    };
}

/// A resolved kind: how to reach it and how to read it.
#[derive(Debug)]
struct Resolved {
    resource: ApiResource,
    namespaced: bool,
    paths: KindPaths,
}

#[derive(Clone, Debug)]
enum TargetState {
    Starting,
    Failed(WorkloadError),
    Ready {
        reading: ScaleReading,
        /// Set when readiness comes from counting pods.
        pods: Option<channel::Receiver<PodState>>,
        resolved: Arc<Resolved>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
}

impl Key {
    fn of(target: &TargetRef) -> Self {
        Key {
            api_version: target.api_version.clone(),
            kind: target.kind.clone(),
            namespace: target.namespace.clone(),
            name: target.name.clone(),
        }
    }
}

fn describe(target: &TargetRef) -> String {
    format!("{} {}/{} ({})", target.kind, target.namespace, target.name, target.api_version)
}

struct Entry {
    refs: usize,
    state: Arc<channel::Sender<TargetState>>,
    _task: AbortOnDrop,
}

/// What the per-target tasks share. Holds no target entries, so dropping `Workloads` stops them.
struct Context {
    client: Client,
    groups: Arc<Groups>,
    health: Arc<WatchHealth>,
    /// Discovery results by (apiVersion, kind). Only kinds that resolved with a `/scale`.
    kinds: Mutex<HashMap<(String, String), Arc<Resolved>>>,
    /// Held while a kind is being discovered: ten thousand targets of one kind added at once
    /// make one discovery request, not ten thousand.
    resolving: tokio::sync::Mutex<()>,
}

struct Inner {
    context: Arc<Context>,
    entries: Mutex<HashMap<Key, Entry>>,
    sync_timeout: Duration,
}

/// The registry of watched targets. Cheap to clone; every clone shares the caches. Dropping
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
        let health = Arc::new(WatchHealth::default());
        let context = Arc::new(Context {
            groups: Groups::new(client.clone(), Arc::clone(&health)),
            health,
            client,
            kinds: Mutex::default(),
            resolving: tokio::sync::Mutex::new(()),
        });
        Workloads { inner: Arc::new(Inner { context, entries: Mutex::default(), sync_timeout }) }
    }

    /// Starts caching `target` (resolving its kind, then watching it). Idempotent and counted:
    /// each `watch` needs one `unwatch`. Never fails: problems (unknown kind, no `/scale`,
    /// forbidden, missing) are what `read` returns, and are retried in the background, so a
    /// target that gets fixed recovers by itself. Must be called inside a Tokio runtime.
    pub fn watch(&self, target: &TargetRef) {
        let mut entries = self.inner.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = entries.entry(Key::of(target)).or_insert_with(|| {
            let state = Arc::new(channel::Sender::new(TargetState::Starting));
            let task = tokio::spawn(run_target(Arc::clone(&self.inner.context), target.clone(), Arc::clone(&state)));
            Entry { refs: 0, state, _task: AbortOnDrop(task) }
        });
        entry.refs += 1;
    }

    /// Undoes one `watch`; the last one stops the target's watches.
    pub fn unwatch(&self, target: &TargetRef) {
        let mut entries = self.inner.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = Key::of(target);
        if let Some(entry) = entries.get_mut(&key) {
            entry.refs -= 1;
            if entry.refs == 0 {
                entries.remove(&key);
            }
        }
    }

    /// Number of watched targets.
    pub fn len(&self) -> usize {
        self.inner.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of running workload watches: one per (resource, namespace) in use.
    pub fn workload_watches(&self) -> usize {
        self.inner.context.groups.len()
    }

    fn state_of(&self, target: &TargetRef) -> Result<Arc<channel::Sender<TargetState>>, WorkloadError> {
        let entries = self.inner.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(&Key::of(target))
            .map(|entry| Arc::clone(&entry.state))
            .ok_or_else(|| WorkloadError::NotWatched(describe(target)))
    }

    /// The health of every watch of the process: the targets' own, and any other that reports
    /// into it (the WPA watches).
    pub fn watch_health(&self) -> Arc<WatchHealth> {
        Arc::clone(&self.inner.context.health)
    }

    /// Whether every watched target has had its first answer (found, missing or failed).
    pub fn settled(&self) -> bool {
        let entries = self.inner.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.values().all(|entry| !matches!(*entry.state.borrow(), TargetState::Starting))
    }

    /// The target's scale from the cache. Waits (up to the sync timeout) only while a newly
    /// watched target has no answer yet; afterwards it never makes a request.
    pub async fn read(&self, target: &TargetRef) -> Result<ScaleReading, WorkloadError> {
        let deadline = tokio::time::Instant::now() + self.inner.sync_timeout;
        let no_answer = || {
            WorkloadError::Connection(format!(
                "no answer from the API server about {} within {:?}",
                describe(target),
                self.inner.sync_timeout
            ))
        };
        let mut receiver = self.state_of(target)?.subscribe();
        let settled = tokio::time::timeout_at(deadline, receiver.wait_for(|s| !matches!(s, TargetState::Starting)));
        let state = match settled.await {
            Ok(Ok(state)) => state.clone(),
            // The task ended: only when the registry is being dropped.
            Ok(Err(_)) => return Err(WorkloadError::NotWatched(describe(target))),
            Err(_) => return Err(no_answer()),
        };
        match state {
            TargetState::Starting => Err(no_answer()),
            TargetState::Failed(err) => Err(err),
            TargetState::Ready { reading, pods: None, .. } => Ok(reading),
            TargetState::Ready { mut reading, pods: Some(mut pods), .. } => {
                let counted = tokio::time::timeout_at(deadline, pods.wait_for(|s| !matches!(s, PodState::Starting)));
                match counted.await.map(|r| r.map(|s| s.clone())) {
                    Ok(Ok(PodState::Counted(ready))) => {
                        reading.ready_replicas = Some(ready);
                        Ok(reading)
                    }
                    Ok(Ok(PodState::Failed(err))) => Err(err),
                    Ok(Ok(PodState::Starting)) | Err(_) => Err(no_answer()),
                    // The pod watch was replaced (new selector) between the two looks.
                    Ok(Err(_)) => Err(WorkloadError::Connection(format!(
                        "the pod selector of {} changed while reading; read again",
                        describe(target)
                    ))),
                }
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
        let state = self.state_of(target)?;
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
        let resolved = resolved_kind(&state, target)?;
        let api = api_for(&self.inner.context.client, &resolved, &target.namespace);
        let resource = format!("{}/scale", resolved.resource.plural);
        let request = Request::for_target("patch", &resource, target);
        let patch = json!({
            "metadata": { "resourceVersion": from.resource_version },
            "spec": { "replicas": replicas },
        });
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() };
        match api.patch_scale(&target.name, &params, &Patch::Merge(&patch)).await {
            Ok(scale) => {
                // Serve the write to the next read even before its watch event arrives, but
                // only over the state it was based on (never over something newer).
                let written_version = scale.metadata.resource_version.unwrap_or_default();
                state.send_if_modified(|state| match state {
                    TargetState::Ready { reading, .. }
                        if reading.resource_version == from.resource_version && !written_version.is_empty() =>
                    {
                        if reading.spec_replicas != replicas {
                            reading.spec_changed_at =
                                Some(watermarkd_engine::Timestamp::from_system_time(std::time::SystemTime::now()));
                        }
                        reading.spec_replicas = replicas;
                        reading.resource_version = written_version.clone();
                        true
                    }
                    _ => false,
                });
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
}

impl Workloads {
    /// The object's resourceVersion as the API server has it now (a quorum read, not the
    /// cache): after a write whose outcome is unknown, it tells whether anything changed.
    /// A list of the one name, so that it needs no verb beyond the watch's.
    pub async fn current_version(&self, target: &TargetRef) -> Result<String, WorkloadError> {
        let resolved = resolved_kind(&*self.state_of(target)?, target)?;
        let api = api_for(&self.inner.context.client, &resolved, &target.namespace);
        let request = Request::for_target("list", &resolved.resource.plural, target);
        let params = ListParams::default().fields(&format!("metadata.name={}", target.name));
        let list = api.list_metadata(&params).await.map_err(|err| request.error(&err))?;
        match list.items.into_iter().next() {
            Some(object) => Ok(object.metadata.resource_version.unwrap_or_default()),
            None => Err(WorkloadError::NotFound {
                kind: target.kind.clone(),
                namespace: target.namespace.clone(),
                name: target.name.clone(),
            }),
        }
    }

    /// Writes `value` as the target's [`STATE_ANNOTATION`] with a merge patch that touches
    /// nothing else (no resourceVersion: the annotation is watermarkd's alone, and a workload
    /// controller's concurrent status update must not make it fail).
    pub async fn write_state(&self, target: &TargetRef, value: &str) -> Result<(), WorkloadError> {
        let resolved = resolved_kind(&*self.state_of(target)?, target)?;
        let api = api_for(&self.inner.context.client, &resolved, &target.namespace);
        let request = Request::for_target("patch", &resolved.resource.plural, target);
        let patch = json!({ "metadata": { "annotations": { STATE_ANNOTATION: value } } });
        let params = PatchParams { field_manager: Some(STATE_FIELD_MANAGER.to_string()), ..PatchParams::default() };
        api.patch(&target.name, &params, &Patch::Merge(&patch)).await.map(|_| ()).map_err(|err| request.error(&err))
    }
}

/// How to reach a target that has been read, or why it cannot be written.
fn resolved_kind(state: &channel::Sender<TargetState>, target: &TargetRef) -> Result<Arc<Resolved>, WorkloadError> {
    match &*state.borrow() {
        TargetState::Ready { resolved, .. } => Ok(Arc::clone(resolved)),
        TargetState::Failed(err) => Err(err.clone()),
        TargetState::Starting => Err(WorkloadError::Connection(format!("{} has not been read yet", describe(target)))),
    }
}

fn api_for(client: &Client, resolved: &Resolved, namespace: &str) -> Api<DynamicObject> {
    if resolved.namespaced {
        Api::namespaced_with(client.clone(), namespace, &resolved.resource)
    } else {
        Api::all_with(client.clone(), &resolved.resource)
    }
}

impl Context {
    /// Resolves the target's kind through discovery (cached once it resolved with a `/scale`).
    async fn resolve(&self, target: &TargetRef) -> Result<Arc<Resolved>, WorkloadError> {
        let key = (target.api_version.clone(), target.kind.clone());
        let cached = || self.kinds.lock().unwrap_or_else(PoisonError::into_inner).get(&key).cloned();
        if let Some(resolved) = cached() {
            return Ok(resolved);
        }
        let _resolving = self.resolving.lock().await;
        if let Some(resolved) = cached() {
            return Ok(resolved);
        }
        let (group, version) = split_api_version(&target.api_version);
        let gvk = GroupVersionKind::gvk(group, version, &target.kind);
        let unknown = |reason: String| WorkloadError::UnknownKind {
            api_version: target.api_version.clone(),
            kind: target.kind.clone(),
            reason,
        };
        let (resource, capabilities) = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok(found) => found,
            Err(kube::Error::Discovery(e)) => return Err(unknown(e.to_string())),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(unknown(format!("apiVersion {} is not served", target.api_version)))
            }
            Err(err) => {
                let request = Request {
                    verb: "get",
                    resource: "discovery",
                    api_version: &target.api_version,
                    namespace: &target.namespace,
                    kind: &target.kind,
                    name: &target.name,
                    collection: true,
                };
                return Err(request.error(&err));
            }
        };
        if !capabilities.subresources.iter().any(|(sub, _)| sub.plural == "scale") {
            return Err(WorkloadError::NoScaleSubresource {
                api_version: target.api_version.clone(),
                kind: target.kind.clone(),
            });
        }
        let resolved = Arc::new(Resolved {
            paths: kind_paths(group, &target.kind),
            namespaced: capabilities.scope == Scope::Namespaced,
            resource,
        });
        self.kinds.lock().unwrap_or_else(PoisonError::into_inner).insert(key, Arc::clone(&resolved));
        Ok(resolved)
    }

    fn forget(&self, target: &TargetRef) {
        let key = (target.api_version.clone(), target.kind.clone());
        self.kinds.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
    }
}

/// Retry delays after a target's own request failed (discovery, `/scale` of a custom kind):
/// 1 s doubling to 60 s. Watches retry by themselves with kube's backoff.
fn retry_delay(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(6)).min(Duration::from_secs(60))
}

/// Keeps one target's state: resolves its kind, follows its object in the shared watch, reads
/// `/scale` on changes for custom kinds and counts pods where needed.
async fn run_target(context: Arc<Context>, target: TargetRef, state: Arc<channel::Sender<TargetState>>) {
    let mut attempt = 0;
    // The replica count last published and when it was first seen (see
    // `ScaleReading::spec_changed_at`); kept across failures and re-resolutions.
    let mut last_spec: Option<(u32, Option<watermarkd_engine::Timestamp>)> = None;
    loop {
        // Boxed, here and for read_scale below: a kube request's future is large, and held
        // inline it would make every target's idle task that large (10,000 targets, 30 MB).
        let resolved = match Box::pin(context.resolve(&target)).await {
            Ok(resolved) => resolved,
            Err(err) => {
                tracing::warn!(workload = %describe(&target), error = %err, "cannot resolve the target's kind; retrying");
                state.send_replace(TargetState::Failed(err));
                tokio::time::sleep(retry_delay(attempt)).await;
                attempt += 1;
                continue;
            }
        };
        let spec = GroupSpec {
            resource: resolved.resource.clone(),
            namespaced: resolved.namespaced,
            namespace: target.namespace.clone(),
            paths: resolved.paths,
        };
        let (subscription, mut object) = context.groups.subscribe(&spec, &target.name);
        let mut pods: Option<PodWatch> = None;
        loop {
            // Set when a request of this task failed: try again after this long even if the
            // object does not change (RBAC fixed, API server back).
            let mut retry_after = None;
            let observed = object.borrow_and_update().clone();
            match observed {
                ObjState::Starting => {}
                ObjState::Failed(err) => {
                    let rediscover = matches!(err, WorkloadError::UnknownKind { .. });
                    state.send_replace(TargetState::Failed(err));
                    if rediscover {
                        // The resource type went away (a CRD deleted?): resolve it afresh.
                        break;
                    }
                }
                ObjState::Missing => {
                    pods = None;
                    state.send_replace(TargetState::Failed(WorkloadError::NotFound {
                        kind: target.kind.clone(),
                        namespace: target.namespace.clone(),
                        name: target.name.clone(),
                    }));
                }
                ObjState::Present(info) => {
                    let reading = match resolved.paths {
                        KindPaths::Builtin(_) => Ok(ScaleReading {
                            spec_replicas: info.spec_replicas,
                            status_replicas: info.status_replicas,
                            ready_replicas: info.ready_replicas,
                            selector: info.selector.clone(),
                            resource_version: info.resource_version.clone(),
                            marks: info.marks.clone(),
                            spec_changed_at: None,
                        }),
                        KindPaths::Custom => Box::pin(read_scale(&context.client, &resolved, &target, &info)).await,
                    };
                    match reading {
                        Ok(mut reading) => {
                            attempt = 0;
                            stamp_spec_change(&mut reading, last_spec);
                            last_spec = Some((reading.spec_replicas, reading.spec_changed_at));
                            let pod_state = match (&reading.ready_replicas, &reading.selector) {
                                (None, Some(selector)) => {
                                    if pods.as_ref().is_none_or(|p| p.selector != *selector) {
                                        pods = Some(PodWatch::start(
                                            context.client.clone(),
                                            &target.namespace,
                                            selector,
                                            Arc::clone(&context.health),
                                        ));
                                    }
                                    pods.as_ref().map(|p| p.state.clone())
                                }
                                _ => {
                                    pods = None;
                                    None
                                }
                            };
                            state.send_replace(TargetState::Ready {
                                reading,
                                pods: pod_state,
                                resolved: Arc::clone(&resolved),
                            });
                        }
                        Err(err) => {
                            tracing::warn!(workload = %describe(&target), error = %err, "cannot read /scale; retrying");
                            state.send_replace(TargetState::Failed(err));
                            retry_after = Some(retry_delay(attempt));
                            attempt += 1;
                        }
                    }
                }
            }
            let changed = match retry_after {
                Some(delay) => tokio::select! {
                    changed = object.changed() => changed,
                    () = tokio::time::sleep(delay) => Ok(()),
                },
                None => object.changed().await,
            };
            if changed.is_err() {
                // The group watch is gone: only when the registry is being dropped.
                return;
            }
        }
        drop(pods);
        drop(subscription);
        context.forget(&target);
        tokio::time::sleep(retry_delay(attempt)).await;
        attempt += 1;
    }
}

/// Reads `/scale` of a custom kind (once per change of the object) and combines it with the
/// object's own `status.readyReplicas`.
async fn read_scale(
    client: &Client,
    resolved: &Resolved,
    target: &TargetRef,
    info: &ObjectInfo,
) -> Result<ScaleReading, WorkloadError> {
    let api = api_for(client, resolved, &target.namespace);
    let resource = format!("{}/scale", resolved.resource.plural);
    let request = Request::for_target("get", &resource, target);
    let scale = api.get_scale(&target.name).await.map_err(|e| request.error(&e))?;
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let status = scale.status.unwrap_or_default();
    Ok(ScaleReading {
        spec_replicas: count(scale.spec.and_then(|s| s.replicas)),
        status_replicas: count(Some(status.replicas)),
        ready_replicas: info.ready_replicas,
        selector: status.selector.filter(|s| !s.is_empty()),
        resource_version: scale.metadata.resource_version.unwrap_or_default(),
        marks: info.marks.clone(),
        spec_changed_at: None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn a_replica_count_is_stamped_when_it_changes_and_keeps_its_stamp() {
        let reading = |spec| ScaleReading {
            spec_replicas: spec,
            status_replicas: spec,
            ready_replicas: Some(spec),
            selector: None,
            resource_version: "1".into(),
            marks: Marks::default(),
            spec_changed_at: None,
        };
        // The first reading's age is unknown.
        let mut first = reading(4);
        stamp_spec_change(&mut first, None);
        assert_eq!(first.spec_changed_at, None);
        let mut same = reading(4);
        stamp_spec_change(&mut same, Some((4, None)));
        assert_eq!(same.spec_changed_at, None);
        let before = watermarkd_engine::Timestamp::from_system_time(std::time::SystemTime::now());
        let mut changed = reading(6);
        stamp_spec_change(&mut changed, Some((4, None)));
        let stamp = changed.spec_changed_at.expect("stamped");
        assert!(stamp >= before);
        let mut later = reading(6);
        stamp_spec_change(&mut later, Some((6, Some(stamp))));
        assert_eq!(later.spec_changed_at, Some(stamp), "an unchanged count keeps when it was first seen");
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
